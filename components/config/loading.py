"""Loading: the engine's flat ``project:key`` map → a validated :class:`ClusterConfig`, or one
:class:`ConfigError` listing every problem with its key path, the bad value and what was expected."""

from __future__ import annotations

import contextlib
import difflib
import json
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError
from pydantic.alias_generators import to_camel

from components.config.base import PROJECT, TAGGED_UNIONS, Problem, Refused, TaggedUnion
from components.config.cluster import ClusterConfig, cross_check


class ConfigError(Exception):
    """A stack configuration that cannot be deployed; the message lists every problem found.

    A plain exception, so the models load without the Pulumi SDK (the researcher CLI reads them); the program
    turns it into Pulumi's ``RunError`` (:func:`components.stack.load_stack_config`), which prints no traceback.
    """

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
    refused = item.get("input")
    if isinstance(refused, Refused):
        return Problem(_path(loc) or "(stack)", refused.reason, refused.value)
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
    """One problem per key path and message (a union field reports each member's failure alike)."""
    unique: dict[tuple[str, str, str], Problem] = {}
    for item in error.errors():
        problem = _problem(item)
        unique.setdefault((problem.path, problem.message, repr(problem.value)), problem)
    return list(unique.values())


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


#: Config namespaces a stack may hold besides the project's own: the kubernetes provider's and the engine's.
OTHER_NAMESPACES = ("kubernetes", "pulumi")


def foreign_keys(keys: Iterable[str], project: str = PROJECT) -> list[Problem]:
    """Keys under a namespace nothing reads (``gpu-clustr:burst``): the engine would pass them and the stack
    would ignore them in silence. Each problem names the nearest key that is read."""
    fields = sorted(to_camel(name) for name in ClusterConfig.model_fields)
    problems: list[Problem] = []
    for key in keys:
        namespace, sep, name = key.partition(":")
        if not sep or namespace == project or namespace in OTHER_NAMESPACES:
            continue
        nearest = difflib.get_close_matches(name, fields, n=1, cutoff=0.6)
        hint = f"'{project}:{nearest[0]}'" if nearest else f"a key under '{project}:'"
        problems.append(Problem(key, f"unknown config namespace '{namespace}': nothing reads this key, so it "
                                     f"would have no effect; did you mean {hint}? (namespaces read: "
                                     f"'{project}', {', '.join(repr(n) for n in OTHER_NAMESPACES)})"))
    return problems


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



class StackLoader(yaml.SafeLoader):
    """Safe YAML that refuses duplicate keys (plain YAML keeps the last one silently)."""


def _mapping(loader: StackLoader, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
    seen: dict[Any, int] = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=True)
        try:
            first = seen.get(key)
        except TypeError:
            raise yaml.constructor.ConstructorError(
                None, None, "a key must be text", key_node.start_mark) from None
        if first is not None:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key '{key}' (first on line {first})", key_node.start_mark)
        seen[key] = key_node.start_mark.line + 1
    return dict(loader.construct_mapping(node, deep=deep))


StackLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping)


def yaml_position(error: yaml.YAMLError) -> str:
    """Where a YAML error is, as people read it: ``line L, column C`` (1-based), or ``(file)``."""
    mark = getattr(error, "problem_mark", None)
    return f"line {mark.line + 1}, column {mark.column + 1}" if mark is not None else "(file)"


def read_stack_file(path: Path, project: str = PROJECT) -> tuple[dict[str, Any], set[str]]:
    """``Pulumi.<stack>.yaml`` as the engine's flat ``project:key`` map (``secure:`` values as a placeholder)
    and the secret keys; a file the engine could not read raises :class:`ConfigError` with its line.

    A stack whose file imports Pulumi ESC environments (``environment:``) gets the credentials it names
    but does not hold from them; here those keys are secret placeholders too."""
    name = path.name
    try:
        data = yaml.load(path.read_text(encoding="utf-8"), Loader=StackLoader)
    except UnicodeDecodeError as error:
        raise ConfigError(name, [Problem("(file)", f"is not UTF-8 text ({error.reason} at byte {error.start})")]) \
            from None
    except yaml.YAMLError as error:
        problem = getattr(error, "problem", None) or str(error)
        raise ConfigError(name, [Problem(yaml_position(error), f"not valid YAML: {problem}")]) from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(name, [Problem("(file)", f"must be a mapping with a 'config:' key, not a {_kind(data)}")])
    section = data.get("config") or {}
    if not isinstance(section, dict):
        raise ConfigError(name, [Problem("config", f"must be a mapping of keys to values, not a {_kind(section)}")])
    config: dict[str, Any] = {}
    secrets: set[str] = set()
    problems: list[Problem] = []
    for key, value in section.items():
        if not isinstance(key, str):
            problems.append(Problem("config", "every key must be text such as 'gpu-cluster:pools'", key))
            continue
        full = key if ":" in key else f"{project}:{key}"
        if isinstance(value, dict) and "secure" in value:
            if set(value) != {"secure"} or not isinstance(value["secure"], str):
                problems.append(Problem(key, "a secret must be `secure: <ciphertext>` as `pulumi config set "
                                             "--secret` writes it"))
                continue
            config[full] = SECRET_PLACEHOLDER
            secrets.add(full)
        else:
            config[full] = value
    environments = data.get("environment")
    if environments is not None:
        if not (isinstance(environments, list) and environments
                and all(isinstance(e, str) and ESC_NAME.fullmatch(e) for e in environments)):
            problems.append(Problem("environment", "must be a list of Pulumi ESC environment names such as "
                                                   "'gpu-cluster/prod-credentials' (optionally '@<version>')",
                                    environments))
        else:
            # Credentials the stack names but does not hold come from the ESC environments at deploy time
            # (their pulumiConfig values, secrets kept secret); offline they stand as secret placeholders.
            for key in credential_refs(section):
                full = key if ":" in key else f"{project}:{key}"
                if full not in config:
                    config[full] = SECRET_PLACEHOLDER
                    secrets.add(full)
    problems += foreign_keys(config, project)
    if problems:
        raise ConfigError(name, problems)
    return config, secrets


#: The project's directory, where its stack files live.
PROJECT_ROOT = Path(__file__).resolve().parents[2]


def stack_path(stack: str, root: Path = PROJECT_ROOT) -> Path:
    """``Pulumi.<stack>.yaml`` in ``root``; a missing one is an error naming the file and the directory."""
    path = root / f"Pulumi.{stack}.yaml"
    if not path.exists():
        raise FileNotFoundError(f"no stack file {path.name} in {root}")
    return path


def plain_values(path: Path, project: str = PROJECT) -> dict[str, Any]:
    """The stack file's plain keys without the project prefix, read by :func:`read_stack_file` (duplicates, YAML
    errors and foreign keys refused with their line). Secrets are left out: their consumers read them from the
    engine. The one reading of a stack file that the program's tools, the local cluster, the policy pack and the
    simulator share."""
    config, secrets = read_stack_file(path, project)
    prefix = f"{project}:"
    return {k[len(prefix):]: v for k, v in config.items() if k.startswith(prefix) and k not in secrets}


def load_stack(path: Path, overrides: Mapping[str, Any] | None = None) -> ClusterConfig:
    """``Pulumi.<stack>.yaml`` validated as ``pulumi up`` validates it (every cross-field check), with ``overrides``
    (keys without the project prefix) laid over its plain values first."""
    return parse_config({**plain_values(path), **(overrides or {})}, path.name)


#: An ESC environment reference in a stack file: ``env``, ``project/env`` or ``org/project/env``, with an
#: optional ``@version`` (a revision number or tag).
ESC_NAME = re.compile(r"[A-Za-z0-9_.-]+(/[A-Za-z0-9_.-]+){0,2}(@[A-Za-z0-9_.-]+)?")


def credential_refs(value: Any) -> list[str]:
    """Config keys named by any ``*CredentialsSecret``/``credentialsSecret`` field inside ``value``."""
    found: list[str] = []
    if isinstance(value, dict):
        for key, item in value.items():
            if isinstance(key, str) and key.lower().endswith("credentialssecret") and isinstance(item, str):
                found.append(item)
            else:
                found += credential_refs(item)
    elif isinstance(value, list):
        for item in value:
            found += credential_refs(item)
    return found


def _kind(value: Any) -> str:
    return {list: "list", str: "text", int: "number", float: "number", bool: "boolean"}.get(type(value), "value")


#: What a secret value stands for wherever the program runs without the engine's decryption.
SECRET_PLACEHOLDER = "[secret]"

#: The stack file keys that are schema keys (``pools``, ``burst``…), never credentials.
SCHEMA_KEYS = frozenset(field.alias or to_camel(name) for name, field in ClusterConfig.model_fields.items())


def secret_schema_problems(secret_names: set[str]) -> list[Problem]:
    """A schema key stored with ``--secret`` is refused: the program would otherwise read its defaults."""
    return [Problem(key, "is a schema key stored as a Pulumi secret, so the program would not read it and use "
                         f"defaults; `pulumi config rm {key}` and set it again without --secret (only credentials "
                         "are secrets)")
            for key in sorted(secret_names & SCHEMA_KEYS)]
