"""Generate the configuration reference (docs/configuration.md) from the stack schema itself.

``python -m tools.config_doc`` rewrites the file; ``--check`` exits non-zero when the committed file
differs from the schema, which ``make test`` runs so the reference cannot drift. Each field's description is
the docstring under it in ``components/config/``; the reference and the JSON Schema both carry it.

The reference is one section per top-level key and one list entry per field: the key path, type and default
on the first line, the description under it. A fourth table column would wrap a sentence of a hundred and more
characters into a narrow cell for each of the ~300 fields and make every source line a diff hazard.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import types
import typing
from enum import Enum
from pathlib import Path
from typing import Any, NamedTuple

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
    model = _unwrapped(ClusterConfig.model_json_schema(by_alias=True, ref_template="#/$defs/{model}"))
    secret = {"type": "object", "properties": {"secure": {"type": "string"}}, "required": ["secure"],
              "additionalProperties": False,
              "description": "A credential as `pulumi config set --secret` writes it (the ciphertext)."}
    config = {
        "type": "object",
        "description": f"`{PROJECT}:<key>` entries (this schema), the providers' `kubernetes:` and `pulumi:` "
                       "keys, and credentials as `secure:` values.",
        "properties": {f"{PROJECT}:{key}": value for key, value in model["properties"].items()},
        "required": [f"{PROJECT}:{key}" for key in model.get("required", [])],
        "patternProperties": {"^(kubernetes|pulumi):": {}},
        "additionalProperties": secret,
    }
    environment = {"type": "array", "items": {"type": "string"},
                   "description": "Pulumi ESC environments the stack imports its credentials from."}
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": f"Pulumi.<stack>.yaml of the {PROJECT} project",
        "type": "object",
        "properties": {"config": config, "environment": environment,
                       "secretsprovider": {"type": "string", "description": "The stack's secrets provider."},
                       "encryptedkey": {"type": "string",
                                        "description": "The stack's data key, encrypted by its secrets provider."}},
        "$defs": model.get("$defs", {}),
    }


#: Schema keys whose values are data (a default, a constant), not schema: their text is left as it is.
_DATA_KEYS = frozenset({"default", "const", "enum", "examples"})


def _unwrapped(schema: Any) -> Any:
    """``schema`` with every description's source line breaks joined (blank-line paragraphs kept), so an
    editor's hover shows the text as one paragraph, not as the docstring's line lengths."""
    if isinstance(schema, list):
        return [_unwrapped(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key == "description" and isinstance(value, str):
            out[key] = "\n\n".join(" ".join(paragraph.split()) for paragraph in value.split("\n\n"))
        else:
            out[key] = value if key in _DATA_KEYS else _unwrapped(value)
    return out


def schema_text() -> str:
    return json.dumps(stack_schema(), indent=2, sort_keys=True) + "\n"


def _type_name(annotation: Any) -> str:
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _type_name(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType):
        return " | ".join(_type_name(a) for a in typing.get_args(annotation))
    if origin is list:
        return f"list[{_type_name(typing.get_args(annotation)[0])}]"
    if origin is dict:
        key, value = typing.get_args(annotation)
        return f"map[{_type_name(key)}, {_type_name(value)}]"
    if origin is typing.Literal:
        return " | ".join(f"`{_yaml(a)}`" for a in typing.get_args(annotation))
    if isinstance(annotation, type) and issubclass(annotation, Enum):
        return " | ".join(f"`{m.value}`" for m in annotation)
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


class Row(NamedTuple):
    """One field of the reference: where it sits, its type (and bounds), its default, what it does."""

    path: str
    kind: str
    default: str
    description: str


def _description(field: FieldInfo) -> str:
    """The field's docstring as one line (the schema test guarantees every field has one)."""
    return " ".join((field.description or "").split())


def union_rows(members: list[type[BaseModel]], path: str) -> list[Row]:
    """The choosing key with its values, the keys every member shares, then each member's own keys."""
    tag = _tag_field(members)
    field = members[0].model_fields[tag]
    tags = [typing.get_args(m.model_fields[tag].annotation)[0] for m in members]
    # Each member describes its own value of the key ("`nfs`: an NFS export…"): together, the choices.
    choices = " ".join(_description(m.model_fields[tag]) for m in members)
    out = [Row(f"{path}.{field.alias or tag}", " | ".join(f"`{t}`" for t in tags), "**required**", choices)]
    per_member = {t: [r for r in rows(m, path) if r.path != out[0].path] for t, m in zip(tags, members, strict=True)}
    shared = [r for r in per_member[tags[0]] if all(r in member_rows for member_rows in per_member.values())]
    out += shared
    for t in tags:
        out += [r._replace(kind=f"{r.kind} ({field.alias or tag} `{t}`)") for r in per_member[t] if r not in shared]
    return out


def _yaml(value: Any) -> str:
    """A value as the stack file spells it (``true``, ``null``, ``[0.0.0.0/0]``, ``current``)."""
    if isinstance(value, BaseModel):
        value = value.model_dump(mode="json", by_alias=True)
    elif isinstance(value, Enum):
        value = value.value
    text = yaml.safe_dump(value, default_flow_style=True, width=10_000, sort_keys=False).strip()
    return text.removesuffix("\n...").removesuffix(" ...").strip()


_UNSET: Any = object()


def _default_value(field: FieldInfo) -> Any:
    """The field's own default (``PydanticUndefined`` when it has none)."""
    if field.default_factory is not None:
        return field.default_factory()  # type: ignore[call-arg]
    return field.default


def _spelled(value: Any) -> str:
    if value is PydanticUndefined:
        return ""
    return "see below" if isinstance(value, BaseModel) else f"`{_yaml(value)}`"


def _default(field: FieldInfo, inherited: Any = _UNSET) -> str:
    """The default as a reader meets it. Under a section whose default is a whole object, the value of that
    object (what applies when the section is left out) can differ from the field's own default (what applies
    when the section is written without the key): both are said then."""
    own = "**required**" if field.is_required() else _spelled(_default_value(field))
    if inherited is _UNSET:
        return own
    left_out = _spelled(inherited)
    if left_out == own:
        return own
    if field.is_required():
        return f"{left_out} when the section is left out; required when it is written"
    return f"{left_out} when the section is left out, {own or 'none'} when it is written without this key"


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


def rows(model: type[BaseModel], prefix: str, instance: BaseModel | None = None) -> list[Row]:
    """The rows of ``model``'s fields under ``prefix``; ``instance`` is the section's default object, if any."""
    out: list[Row] = []
    for name, field in model.model_fields.items():
        key = field.alias or name
        path = f"{prefix}.{key}" if prefix else key
        nested = _nested_model(field.annotation)
        list_suffix = "[]" if typing.get_origin(field.annotation) is list else ""
        kind = _type_name(field.annotation)
        bounds = _bounds(field)
        inherited = getattr(instance, name) if instance is not None else _UNSET
        out.append(Row(path + list_suffix, f"{kind} ({bounds})" if bounds else kind, _default(field, inherited),
                       _description(field)))
        members = _union_members(field.annotation)
        if members:
            out += union_rows(members, path + list_suffix)
        elif nested is not None:
            value = inherited if inherited is not _UNSET else (
                None if field.is_required() else _default_value(field))
            out += rows(nested, path + list_suffix, value if isinstance(value, BaseModel) else None)
    return out


#: The heading of the top-level keys that hold a plain value rather than a section of their own.
CLUSTER_WIDE = "Cluster-wide keys"


def sections(all_rows: list[Row]) -> list[tuple[str, list[Row]]]:
    """The rows by top-level key: one section per key with keys below it, the plain keys together."""
    grouped: list[tuple[str, list[Row]]] = []
    for row in all_rows:
        top = row.path.split(".", 1)[0].removesuffix("[]")
        if grouped and grouped[-1][0] == top:
            grouped[-1][1].append(row)
        else:
            grouped.append((top, [row]))
    out: list[tuple[str, list[Row]]] = []
    for top, group in grouped:
        if len(group) > 1:
            out.append((top, group))
        elif out and out[-1][0] == CLUSTER_WIDE:
            out[-1][1].extend(group)
        else:
            out.append((CLUSTER_WIDE, list(group)))
    return out


def _anchor(title: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^a-z0-9 -]", "", title.lower()).replace(" ", "-")


def entry(row: Row) -> list[str]:
    """One field as a list item: key path, type and default on the first line, the description under it."""
    head = [f"`{row.path}`", row.kind]
    if row.default == "**required**":
        head.append(row.default)
    elif row.default and row.default != "see below":
        head.append(f"default {row.default}")
    return [f"- {' · '.join(head)}\\", f"  {row.description}"]


def render() -> str:
    lines = [
        "# Configuration reference",
        "",
        "Generated from `components/config/` by `python -m tools.config_doc`; do not edit by hand.",
        f"Every top-level key is set in `Pulumi.<stack>.yaml` under the `{PROJECT}:` namespace, e.g.",
        f"`{PROJECT}:burst: {{openBelowFreeGpus: 16}}`. Unknown keys, and keys under any namespace but",
        f"`{PROJECT}:`, `kubernetes:` and `pulumi:`, are errors. Editors validate stack files against",
        "[stack-config.schema.json](stack-config.schema.json) (generated with this page) and show the",
        "descriptions below on hover.",
        "",
        "Each entry is a key path (`[]`: an item of a list), its type with bounds and its default, then what the",
        "key does. A type followed by a choice, such as (backend `nfs`), marks a key that only the list items",
        "with that choice take.",
        "",
    ]
    grouped = sections(rows(ClusterConfig, ""))
    lines.append("Sections: " + " · ".join(f"[{title}](#{_anchor(title)})" for title, _ in grouped) + ".")
    for title, section_rows in grouped:
        lines += ["", f"## {title}", ""]
        for row in section_rows:
            lines += entry(row)
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
