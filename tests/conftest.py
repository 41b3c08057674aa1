"""Shared fixtures: run the real program on the mock runtime per stack, and config helpers."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

from tools.mockrt import RunResult, run_program, stack_config

# Hypothesis judges inputs, not seconds: its per-example deadline and its "generation too slow" check are timings,
# which a loaded 2-core build machine fails at random (speed is `make bench`'s to measure, never a test's).
settings.register_profile("project", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("project")


def raw_stack(stack: str) -> tuple[dict[str, Any], set[str]]:
    """A stack file's config as a mutable mapping (keys with the project prefix) plus its secret keys."""
    config, secrets = stack_config(stack)
    return copy.deepcopy(config), secrets


@pytest.fixture(scope="session")
def prod() -> RunResult:
    return run_program("prod")


@pytest.fixture(scope="session")
def local() -> RunResult:
    return run_program("local")


StackRunner = Callable[..., RunResult]


@pytest.fixture
def run_stack() -> StackRunner:
    """Run a stack with edits: ``run_stack("local", lambda cfg: cfg[...].update(...))``."""

    def _run(stack: str, edit: Callable[[dict[str, Any]], None] | None = None,
             secrets: set[str] | None = None) -> RunResult:
        config, secret_keys = raw_stack(stack)
        if edit is not None:
            edit(config)
        return run_program(stack, config, secret_keys if secrets is None else secrets)

    return _run
