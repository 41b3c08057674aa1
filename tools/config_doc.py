"""Generate the configuration reference (docs/configuration.md) from the stack schema itself.

``python -m tools.config_doc`` rewrites the file; ``--check`` exits non-zero when the committed file
differs from the schema, which ``make test`` runs so the reference cannot drift.
"""

from __future__ import annotations

import argparse
import json
import sys
import types
import typing
from enum import Enum
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from components.config import PROJECT, ClusterConfig

DOC = Path(__file__).resolve().parent.parent / "docs" / "configuration.md"
#: JSON Schema of a ``Pulumi.<stack>.yaml``, for editors (yaml-language-server: ``# yaml-language-server:
#: $schema=docs/stack-config.schema.json``).
SCHEMA = DOC.parent / "stack-config.schema.json"


def stack_schema() -> dict[str, Any]:
    """The stack file's schema: ``config:`` holds ``gpu-cluster:<key>`` entries validated by the config
    models, the providers' ``kubernetes:``/``pulumi:`` keys, and credentials as ``secure:`` values; a key under
    any other namespace (a misspelling) is refused, as the stack loader refuses it."""
    model = ClusterConfig.model_json_schema(by_alias=True, ref_template="#/$defs/{model}")
    secret = {"type": "object", "properties": {"secure": {"type": "string"}}, "required": ["secure"],
              "additionalProperties": False}
    config = {
        "type": "object",
        "properties": {f"{PROJECT}:{key}": value for key, value in model["properties"].items()},
        "required": [f"{PROJECT}:{key}" for key in model.get("required", [])],
        "patternProperties": {"^(kubernetes|pulumi):": {}},
        "additionalProperties": secret,
    }
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": f"Pulumi.<stack>.yaml of the {PROJECT} project",
        "type": "object",
        "properties": {"config": config, "environment": {"type": "array", "items": {"type": "string"}},
                       "secretsprovider": {"type": "string"}, "encryptedkey": {"type": "string"}},
        "$defs": model.get("$defs", {}),
    }


def schema_text() -> str:
    return json.dumps(stack_schema(), indent=2, sort_keys=True) + "\n"


def _type_name(annotation: Any) -> str:
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _type_name(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType):
        return " \\| ".join(_type_name(a) for a in typing.get_args(annotation))
    if origin is list:
        return f"list[{_type_name(typing.get_args(annotation)[0])}]"
    if origin is dict:
        key, value = typing.get_args(annotation)
        return f"map[{_type_name(key)}, {_type_name(value)}]"
    if origin is typing.Literal:
        return " \\| ".join(f"`{_yaml(a)}`" for a in typing.get_args(annotation))
    if isinstance(annotation, type) and issubclass(annotation, Enum):
        return " \\| ".join(f"`{m.value}`" for m in annotation)
    if annotation is type(None):
        return "null"
    name = getattr(annotation, "__name__", str(annotation))
    return _YAML_TYPES.get(name, name)


#: Python's type names as a stack file's author knows them.
_YAML_TYPES = {"str": "string", "int": "integer", "float": "number", "bool": "boolean", "dict": "map"}


def _nested_model(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        inner = _nested_model(arg)
        if inner is not None:
            return inner
    return None


def _union_members(annotation: Any) -> list[type[BaseModel]]:
    """The models of a tagged union (possibly inside list/Annotated); empty for anything else."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        members = [a for a in typing.get_args(annotation) if isinstance(a, type) and issubclass(a, BaseModel)]
        return members if len(members) > 1 else []
    for arg in typing.get_args(annotation) if origin in (list, typing.Annotated) else ():
        members = _union_members(arg)
        if members:
            return members
    return []


def _tag_field(members: list[type[BaseModel]]) -> str:
    """The field every member declares as a one-value Literal: the key that chooses the member."""
    return next(name for name, field in members[0].model_fields.items()
                if typing.get_origin(field.annotation) is typing.Literal)


def union_rows(members: list[type[BaseModel]], path: str) -> list[tuple[str, str, str]]:
    """The choosing key with its values, the keys every member shares, then each member's own keys."""
    tag = _tag_field(members)
    field = members[0].model_fields[tag]
    tags = [typing.get_args(m.model_fields[tag].annotation)[0] for m in members]
    out = [(f"{path}.{field.alias or tag}", " \\| ".join(f"`{t}`" for t in tags), "**required**")]
    per_member = {t: [r for r in rows(m, path) if r[0] != out[0][0]] for t, m in zip(tags, members, strict=True)}
    shared = [r for r in per_member[tags[0]] if all(r in member_rows for member_rows in per_member.values())]
    out += shared
    for t in tags:
        out += [(p, f"{kind} ({field.alias or tag} `{t}`)", default)
                for p, kind, default in per_member[t] if (p, kind, default) not in shared]
    return out


def _yaml(value: Any) -> str:
    """A value as the stack file spells it (``true``, ``null``, ``[0.0.0.0/0]``, ``current``)."""
    if isinstance(value, BaseModel):
        value = value.model_dump(mode="json", by_alias=True)
    elif isinstance(value, Enum):
        value = value.value
    text = yaml.safe_dump(value, default_flow_style=True, width=10_000, sort_keys=False).strip()
    return text.removesuffix("\n...").removesuffix(" ...").strip()


def _default(field: FieldInfo) -> str:
    if field.is_required():
        return "**required**"
    if field.default_factory is not None:
        value = field.default_factory()  # type: ignore[call-arg]
        return "see below" if isinstance(value, BaseModel) else f"`{_yaml(value)}`"
    value = field.default
    if value is PydanticUndefined:
        return ""
    if isinstance(value, BaseModel):
        return "see below"
    return f"`{_yaml(value)}`"


#: Bound metadata (annotated_types) → how the reference states it.
_BOUNDS = (("ge", "≥"), ("gt", ">"), ("le", "≤"), ("lt", "<"), ("min_length", "length ≥"),
           ("max_length", "length ≤"))


def _bounds(field: FieldInfo) -> str:
    """The field's numeric and length bounds, e.g. ``1 ≤ … ≤ 5`` (from the schema's own constraints)."""
    found: dict[str, Any] = {}
    for meta in _constraints(field.annotation, field.metadata):
        for name, _ in _BOUNDS:
            value = getattr(meta, name, None)
            if value is not None:
                found[name] = value
    return ", ".join(f"{sign} {found[name]}" for name, sign in _BOUNDS if name in found)


def _constraints(annotation: Any, metadata: list[Any]) -> list[Any]:
    out = list(metadata)
    if typing.get_origin(annotation) is typing.Annotated:
        out += list(typing.get_args(annotation)[1:])
    return out


def rows(model: type[BaseModel], prefix: str) -> list[tuple[str, str, str]]:
    out: list[tuple[str, str, str]] = []
    for name, field in model.model_fields.items():
        key = field.alias or name
        path = f"{prefix}.{key}" if prefix else key
        nested = _nested_model(field.annotation)
        list_suffix = "[]" if typing.get_origin(field.annotation) is list else ""
        kind = _type_name(field.annotation)
        bounds = _bounds(field)
        out.append((path + list_suffix, f"{kind} ({bounds})" if bounds else kind, _default(field)))
        members = _union_members(field.annotation)
        if members:
            out += union_rows(members, path + list_suffix)
        elif nested is not None:
            out += rows(nested, path + list_suffix)
    return out


def render() -> str:
    lines = [
        "# Configuration reference",
        "",
        "Generated from `components/config/` by `python -m tools.config_doc`; do not edit by hand.",
        f"Every top-level key is set in `Pulumi.<stack>.yaml` under the `{PROJECT}:` namespace, e.g.",
        f"`{PROJECT}:burst: {{openBelowFreeGpus: 16}}`. Unknown keys, and keys under any namespace but",
        f"`{PROJECT}:`, `kubernetes:` and `pulumi:`, are errors. Editors validate stack files against",
        "[stack-config.schema.json](stack-config.schema.json) (generated with this page).",
        "",
        "| key | type | default |",
        "|---|---|---|",
    ]
    lines += [f"| `{path}` | {kind} | {default} |" for path, kind, default in rows(ClusterConfig, "")]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args(argv)
    outputs = {DOC: render(), SCHEMA: schema_text()}
    if args.check:
        stale = [path for path, text in outputs.items() if not path.exists() or path.read_text() != text]
        for path in stale:
            print(f"{path.relative_to(DOC.parent.parent)} is out of date: run `python -m tools.config_doc`")
        return 1 if stale else 0
    DOC.parent.mkdir(exist_ok=True)
    for path, text in outputs.items():
        path.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
