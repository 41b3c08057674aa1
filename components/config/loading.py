"""Loading: the engine's flat ``project:key`` map → a validated :class:`ClusterConfig`, or one
:class:`ConfigError` listing every problem with its key path, the bad value and what was expected."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Mapping
from typing import Any

from pulumi import RunError
from pydantic import ValidationError

from components.config.base import PROJECT, Problem
from components.config.cluster import ClusterConfig, cross_check


class ConfigError(RunError):
    """A stack configuration that cannot be deployed; the message lists every problem found."""

    def __init__(self, stack_file: str, problems: list[Problem]) -> None:
        self.stack_file = stack_file
        self.problems = problems
        lines = "\n".join(f"  - {p.render()}" for p in problems)
        super().__init__(f"invalid stack configuration in {stack_file}:\n{lines}")


def _path(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


def _expected(error: Mapping[str, Any]) -> str:
    kind = error["type"]
    if kind == "extra_forbidden":
        return "unknown key; check the spelling against the configuration reference in README.md"
    if kind == "missing":
        return "required key is missing"
    message = str(error["msg"])
    return message.removeprefix("Value error, ")


def problems_from_validation(error: ValidationError) -> list[Problem]:
    problems = []
    for item in error.errors():
        loc = tuple(part for part in item["loc"] if not (isinstance(part, str) and part.startswith("function-")))
        value = None if item["type"] in ("missing",) else item.get("input")
        if isinstance(value, dict | list) and item["type"] != "extra_forbidden":
            value = None
        problems.append(Problem(_path(loc) or "(stack)", _expected(item), value))
    return problems


def parse_config(raw: Mapping[str, Any], stack_file: str) -> ClusterConfig:
    """Validate a ``{key: value}`` mapping (keys without the project prefix) into a ClusterConfig."""
    try:
        cfg = ClusterConfig.model_validate(dict(raw))
    except ValidationError as error:
        raise ConfigError(stack_file, problems_from_validation(error)) from None
    problems = cross_check(cfg)
    if problems:
        raise ConfigError(stack_file, problems)
    return cfg


def raw_from_pulumi_config(config: Mapping[str, Any], project: str = PROJECT) -> dict[str, Any]:
    """Select this project's keys from the engine's flat ``project:key`` map and decode JSON values."""
    raw: dict[str, Any] = {}
    prefix = f"{project}:"
    for key, value in config.items():
        if not key.startswith(prefix):
            continue
        name = key[len(prefix):]
        # The engine passes every value as a string; structured values arrive as JSON. Scalars stay
        # strings and pydantic converts them ("8" -> 8), so "1.34" is never read as a float.
        if isinstance(value, str) and value.lstrip().startswith(("{", "[")):
            with contextlib.suppress(json.JSONDecodeError):
                value = json.loads(value)
        raw[name] = value
    return raw

