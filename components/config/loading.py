"""Loading: the engine's flat ``project:key`` map → a validated :class:`ClusterConfig`, or one
:class:`ConfigError` listing every problem with its key path, the bad value and what was expected."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Mapping
from typing import Any

from pulumi import RunError
from pydantic import ValidationError
from pydantic.alias_generators import to_camel

from components.config.base import PROJECT, TAGGED_UNIONS, Problem, TaggedUnion
from components.config.cluster import ClusterConfig, cross_check


class ConfigError(RunError):
    """A stack configuration that cannot be deployed; the message lists every problem found."""

    def __init__(self, stack_file: str, problems: list[Problem]) -> None:
        self.stack_file = stack_file
        self.problems = problems
        lines = "\n".join(f"  - {p.render()}" for p in problems)
        super().__init__(f"invalid stack configuration in {stack_file}:\n{lines}")


#: Where an unknown key is checked against (generated from this package by ``tools/config_doc.py``).
REFERENCE = "docs/configuration.md"


def _path(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


def _untag(loc: tuple[int | str, ...]) -> tuple[tuple[int | str, ...], tuple[TaggedUnion, str] | None]:
    """Drop the member tag pydantic puts after a tagged union's list index; return it with its union."""
    kept: list[int | str] = []
    chosen: tuple[TaggedUnion, str] | None = None
    for part in loc:
        union = next((u for u in TAGGED_UNIONS if part in u.members), None)
        if union is not None and kept and isinstance(kept[-1], int) and chosen is None:
            chosen = (union, str(part))
            continue
        kept.append(part)
    return tuple(kept), chosen


def _union_of(error: Mapping[str, Any]) -> TaggedUnion | None:
    name = str(error.get("ctx", {}).get("discriminator", "")).strip("'")
    return next((u for u in TAGGED_UNIONS if u.key == to_camel(name)), None)


def _one_of(tags: list[str]) -> str:
    quoted = [f"'{tag}'" for tag in tags]
    return quoted[0] if len(quoted) == 1 else f"{', '.join(quoted[:-1])} or {quoted[-1]}"


def _problem(item: Mapping[str, Any]) -> Problem:
    """One pydantic error as a Problem: the stack file's key path, what was expected, the bad value."""
    kind = item["type"]
    loc, chosen = _untag(tuple(p for p in item["loc"] if not (isinstance(p, str) and p.startswith("function-"))))
    value = None if kind == "missing" else item.get("input")
    if isinstance(value, dict | list) and kind != "extra_forbidden":
        value = None
    message = str(item["msg"]).removeprefix("Value error, ")
    union = _union_of(item) if kind in ("union_tag_not_found", "union_tag_invalid") else None
    if union is not None:
        # The choosing key itself is missing or names no model.
        loc, value = (*loc, union.key), item.get("ctx", {}).get("tag")
        message = f"Input should be {_one_of(list(union.members))}"
        if kind == "union_tag_not_found":
            message = f"required key is missing; {message[0].lower()}{message[1:]}"
    elif kind == "extra_forbidden":
        message = f"unknown key; check the spelling against the configuration reference in {REFERENCE}"
        if chosen is not None:
            tagged, tag = chosen
            owners = tagged.owners(str(loc[-1]))
            if owners:
                message = f"applies only to {tagged.key} {_one_of(owners)}, not '{tag}'"
    elif kind == "missing":
        message = "required key is missing"
        if chosen is not None:
            message += f" ({chosen[0].key} '{chosen[1]}' needs it)"
    return Problem(_path(loc) or "(stack)", message, value)


def problems_from_validation(error: ValidationError) -> list[Problem]:
    return [_problem(item) for item in error.errors()]


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

