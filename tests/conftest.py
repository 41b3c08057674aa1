"""Shared fixtures: run the real program on the mock runtime per stack, and config helpers."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from xdist.scheduler import LoadScopeScheduling

from components.mockrt import RunResult, run_program, stack_config

# Hypothesis judges inputs, not seconds: its per-example deadline and its "generation too slow" check are timings,
# which a loaded 2-core build machine fails at random (speed is `make bench`'s to measure, never a test's).
settings.register_profile("project", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("project")

#: The tests that bring real nodes up, or snapshot and restore this host's sysctls and iptables (node id
#: prefixes). One set of real nodes runs per host and each holds the host lock, so on two workers one would
#: idle on the lock, and a worker that judged the host while the other's cluster ran would skip. One unit of work.
REAL_HOST_TESTS = (
    "tests/test_e2e_realnodes.py::",
    "tests/test_e2e_stack_in_pods.py::",
    "tests/test_realnodes.py::test_restore_puts_sysctls_and_iptables_back_as_the_snapshot_found_them",
)
#: The other modules whose module fixture starts a local cluster: each is one unit of work, so its cluster starts
#: once and its tests run in file order (a watch kept over every scenario is read by the last test).
CLUSTER_MODULES = (
    "tests/test_e2e.py::",
    "tests/test_e2e_apiproxy.py::",
    "tests/test_e2e_provider_rank.py::",
    "tests/test_e2e_researcher.py::",
    "tests/test_localcluster.py::",
    "tests/test_scale_cluster.py::",
)


class ClusterScheduling(LoadScopeScheduling):
    """xdist's ``load`` (every test its own unit of work), except that `REAL_HOST_TESTS` are one unit and each of
    `CLUSTER_MODULES` is one. (``--dist loadgroup`` would take a mark, but on pytest 9 it no longer sees it: it
    renames ``item._nodeid``, which node ids are no longer read from.)"""

    def _split_scope(self, nodeid: str) -> str:
        if nodeid.startswith(REAL_HOST_TESTS):
            return "real-host"
        module = nodeid.partition("::")[0] + "::"
        return module if module in CLUSTER_MODULES else nodeid


@pytest.hookimpl(optionalhook=True)  # xdist's hook: absent with -p no:xdist
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> LoadScopeScheduling | None:
    return ClusterScheduling(config, log) if config.getvalue("dist") == "load" else None


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
