"""One way for an agent's settings to be a model: pydantic, camelCase aliases (the stack's spelling) beside the
snake_case names (the ConfigMap's), unknown keys refused, immutable, and errors that name the key and the file.

A capability's settings class derives from :class:`SettingsModel`; the stack's section for that capability
derives from the same class, so a key, its type, its bounds, its default and its description are written once
and read by the program, the simulator and the agent alike. :func:`settings_error` turns pydantic's errors into
the house phrasing (``source: key: must be >= 0, got -1``) so a platform engineer reading a crash-looping
pod's log sees the key as the ConfigMap spells it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Annotated, Any, Self, get_args, get_origin

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, ValidationError
from pydantic.alias_generators import to_camel
from pydantic.fields import FieldInfo

DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


def _dns_label(value: str) -> str:
    if not DNS_LABEL.match(value):
        raise ValueError("must be a DNS-1123 label (lowercase letters, digits and '-', at most 63 chars)")
    return value


def _not_a_bool(value: Any) -> Any:
    """YAML's ``true`` is an int to Python; as a count or a duration it is always a mistake."""
    if isinstance(value, bool):
        raise ValueError(f"must be a number, got {value!r}")
    return value


def _share(value: float) -> float:
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"must be between 0 and 1 (a share of the replicas), got {value:g}")
    return value


DnsLabel = Annotated[str, AfterValidator(_dns_label)]
#: A number that refuses booleans (pydantic's lax mode takes ``true`` as 1).
Number = BeforeValidator(_not_a_bool)
#: A share of something, 0..1 inclusive.
Share = Annotated[float, Number, AfterValidator(_share)]


class SettingsModel(BaseModel):
    """Base of every capability's settings: the stack section and the agent's ConfigMap are this one model."""

    model_config = ConfigDict(
        extra="forbid", alias_generator=to_camel, populate_by_name=True, frozen=True, allow_inf_nan=False,
        use_attribute_docstrings=True,
    )

    @classmethod
    def spell(cls, name: str) -> str:
        """A field's name as this model's readers write it: snake_case in an agent's ConfigMap."""
        return name

    def replace(self, **changes: Any) -> Self:
        """A validated copy with ``changes`` (``model_copy`` would skip every check)."""
        return type(self).parse({**self.model_dump(), **changes}, source="")

    @classmethod
    def parse(cls, data: Mapping[str, Any], source: str = "settings") -> Self:
        """The model from a plain mapping (a parsed ConfigMap); every problem reported, each with its key."""
        try:
            return cls.model_validate(dict(data))
        except ValidationError as exc:
            raise settings_error(cls, exc, source) from None


class SettingsError(ValueError):
    """A settings value is missing, unknown or out of range; the message names the key (and the file)."""


def _field(model: type[BaseModel], loc: tuple[int | str, ...]) -> FieldInfo | None:
    head = str(loc[0]) if loc else ""
    return model.model_fields.get(head) or next((f for f in model.model_fields.values() if f.alias == head), None)


def _plain(annotation: Any) -> Any:
    """``Annotated[int, ...]`` → ``int``."""
    return get_args(annotation)[0] if get_origin(annotation) is Annotated else annotation


def _kind(model: type[BaseModel], loc: tuple[int | str, ...]) -> str:
    """What the value at ``loc`` must be, in words, from the field's type."""
    field = _field(model, loc)
    annotation = _plain(field.annotation) if field is not None else None
    args = tuple(_plain(a) for a in get_args(annotation))
    if len(loc) > 1 and args:  # an entry of a mapping or a list: its value type
        annotation = args[-1] if args[-1] is not Ellipsis else args[0]
    words = {int: "an integer", float: "a number of seconds" if str(loc[0]).endswith(("_seconds", "Seconds"))
             else "a number", str: "a string", bool: "true or false"}
    if annotation in words:
        return words[annotation]
    origin = get_origin(annotation)
    if origin is dict:
        return f"a mapping of names to {'integers' if args[-1] is int else 'strings'}"
    if origin in (tuple, list):
        return "a list of names"
    return "a valid value"


def _number(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


_TYPE_ERRORS = {"int_type", "int_parsing", "int_from_float", "float_type", "float_parsing", "string_type",
                "dict_type", "tuple_type", "list_type", "bool_type", "bool_parsing"}
_BOUNDS = {"greater_than_equal": (">=", "ge"), "greater_than": (">", "gt"), "less_than_equal": ("at most", "le"),
           "less_than": ("below", "lt")}


def _key(model: type[BaseModel], loc: tuple[int | str, ...]) -> str:
    """``('inferencePools', 1)`` → ``inference_pools[1]`` in the model's own spelling."""
    parts: list[str] = []
    for part in loc:
        if isinstance(part, int):
            parts.append(f"[{part}]")
        elif parts:
            parts.append(f".{part}")
        else:
            field = _field(model, loc)
            name = next((n for n, f in model.model_fields.items() if f is field), str(part))
            spell = getattr(model, "spell", None)
            parts.append(spell(name) if callable(spell) else name)
    return "".join(parts)


def describe(model: type[BaseModel], error: Mapping[str, Any]) -> str:
    """One pydantic error in the house phrasing."""
    loc = tuple(error["loc"])
    key, kind, given, ctx = _key(model, loc), error["type"], error.get("input"), error.get("ctx") or {}
    if kind == "extra_forbidden":
        allowed = ", ".join(sorted(model.model_fields))
        return f"unknown key {key!r}; allowed keys: {allowed}"
    if kind in _TYPE_ERRORS or (kind == "value_error" and isinstance(given, bool)):
        return f"key {key!r} must be {_kind(model, loc)}, got {given!r}"
    if kind == "enum":
        return f"key {key!r} must be {ctx.get('expected', '')}, got {given!r}"
    if kind == "finite_number":
        return f"key {key!r} must be finite, got {given!r}"
    if kind == "string_too_short":
        return f"{key}: must not be empty"
    if kind in _BOUNDS:
        word, name = _BOUNDS[kind]
        field = _field(model, loc)
        shown = float(given) if field is not None and field.annotation is float and isinstance(given, int) else given
        return f"{key}: must be {word} {_number(ctx[name])}, got {shown}"
    message = str(error.get("msg", "")).removeprefix("Value error, ")
    return f"{key}: {message}" if key else message


def settings_error(model: type[BaseModel], exc: ValidationError, source: str) -> SettingsError:
    """Every error of ``exc`` in one message, each prefixed with ``source`` when there is one."""
    prefix = f"{source}: " if source else ""
    return SettingsError("; ".join(prefix + describe(model, e) for e in exc.errors()))
