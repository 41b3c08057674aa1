"""Building blocks every section of the stack schema shares: the base model, constrained types, node
ranges and :class:`Problem`, the unit a cross-field check reports."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Annotated, Any, get_args

from pydantic import AfterValidator, BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel
from pydantic.fields import FieldInfo

PROJECT = "gpu-cluster"

DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
NODE_RANGE = re.compile(r"^(?P<prefix>[a-z0-9.-]*)\[(?P<lo>\d+)-(?P<hi>\d+)\](?P<suffix>[a-z0-9.-]*)$")
_IMAGE_PINNED = re.compile(r"^[^\s:@]+(:[\w][\w.-]{0,127})?(@sha256:[0-9a-f]{64})?$")


def _dns_label(value: str) -> str:
    if not DNS_LABEL.match(value):
        raise ValueError("must be a DNS-1123 label (lowercase letters, digits and '-', at most 63 chars)")
    return value


def _label_prefix(value: str) -> str:
    if not DNS_SUBDOMAIN.match(value) or "." not in value:
        raise ValueError("must be a DNS subdomain such as 'gpucluster.io'")
    return value


def _pinned_image(value: str) -> str:
    last = value.rsplit("/", 1)[-1]
    if not _IMAGE_PINNED.match(value) or (":" not in last and "@sha256:" not in value):
        raise ValueError("must be pinned by tag or digest, e.g. 'registry/name:1.2.3' or 'name@sha256:…'")
    if last.endswith(":latest"):
        raise ValueError("must not use the 'latest' tag; pin a version or digest")
    return value


DnsLabel = Annotated[str, AfterValidator(_dns_label)]
PinnedImage = Annotated[str, AfterValidator(_pinned_image)]
LabelPrefix = Annotated[str, AfterValidator(_label_prefix)]
NonEmptyStr = Annotated[str, Field(min_length=1)]
PositiveInt = Annotated[int, Field(gt=0)]
NonNegativeInt = Annotated[int, Field(ge=0)]


class ConfigModel(BaseModel):
    """Base: camelCase keys as in the stack file, unknown keys rejected, immutable."""

    model_config = ConfigDict(
        extra="forbid", alias_generator=to_camel, populate_by_name=True, frozen=True, strict=False
    )


def expand_node_names(patterns: Iterable[str]) -> list[str]:
    """Expand ``gpu-[001-004]``-style ranges (zero padding kept) into node names."""
    names: list[str] = []
    for pattern in patterns:
        match = NODE_RANGE.match(pattern)
        if not match:
            names.append(pattern)
            continue
        lo_text, hi_text = match["lo"], match["hi"]
        lo, hi = int(lo_text), int(hi_text)
        if lo > hi:
            raise ValueError(f"range '{pattern}' runs backwards ({lo} > {hi})")
        width = len(lo_text) if lo_text.startswith("0") else 0
        names.extend(f"{match['prefix']}{i:0{width}d}{match['suffix']}" for i in range(lo, hi + 1))
    return names


def _node_patterns(value: list[str]) -> list[str]:
    if not value:
        raise ValueError("must list at least one node name or range")
    for pattern in value:
        if "[" in pattern and not NODE_RANGE.match(pattern):
            raise ValueError(f"'{pattern}' is not a node name or a range like 'gpu-[001-256]'")
        for name in expand_node_names([pattern]):
            if not DNS_SUBDOMAIN.match(name):
                raise ValueError(f"node name '{name}' is not a valid DNS subdomain")
    return value


NodePatterns = Annotated[list[str], AfterValidator(_node_patterns)]

@dataclass(frozen=True)
class Problem:
    """One configuration problem: where, what was found, what was expected."""

    path: str
    message: str
    value: Any = None

    def render(self) -> str:
        shown = "" if self.value is None else f" (got {json.dumps(self.value, default=str)})"
        return f"{self.path}: {self.message}{shown}"


def unique_names(items: Iterable[tuple[int, str]], path: str, what: str) -> list[Problem]:
    """One problem per repeated ``name`` in the list at ``path`` (``what`` names the kind of entry)."""
    seen: dict[str, int] = {}
    problems = []
    for index, name in items:
        if name in seen:
            problems.append(
                Problem(f"{path}[{index}].name", f"duplicate {what} name; first used at index {seen[name]}", name)
            )
        else:
            seen[name] = index
    return problems


@dataclass(frozen=True)
class TaggedUnion:
    """A list entry whose model is chosen by one key (``backend: nfs``, ``kind: liqo``)."""

    #: The choosing key as written in the stack file.
    key: str
    #: Its value → the model for that value.
    members: dict[str, type[BaseModel]]

    def owners(self, key: str) -> list[str]:
        """The values of the choosing key whose model takes ``key`` (camelCase)."""
        return [tag for tag, model in self.members.items()
                if any((field.alias or name) == key for name, field in model.model_fields.items())]


#: Every tagged union of the schema, so the loader can say which member a misplaced key belongs to.
TAGGED_UNIONS: list[TaggedUnion] = []


def register_union(annotation: Any) -> TaggedUnion:
    """Record an ``Annotated[A | B, Field(discriminator=...)]`` alias for the loader's messages."""
    union, *metadata = get_args(annotation)
    field = next(m for m in metadata if isinstance(m, FieldInfo))
    assert isinstance(field.discriminator, str)
    name = field.discriminator
    members = {get_args(model.model_fields[name].annotation)[0]: model for model in get_args(union)}
    tagged = TaggedUnion(key=to_camel(name), members=members)
    TAGGED_UNIONS.append(tagged)
    return tagged
