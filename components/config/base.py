"""Building blocks every section of the stack schema shares: the base model, constrained types, node
ranges and :class:`Problem`, the unit a cross-field check reports."""

from __future__ import annotations

import ipaddress
import json
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Annotated, Any, get_args

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator
from pydantic.alias_generators import to_camel
from pydantic.fields import FieldInfo

from agents.kit.settings import DNS_LABEL as DNS_LABEL
from agents.kit.settings import DnsLabel as DnsLabel
from agents.node_names import NODE_RANGE, expand_node_names

PROJECT = "gpu-cluster"

DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
_IMAGE_PINNED = re.compile(r"^[^\s:@]+(:[\w][\w.-]{0,127})?(@sha256:[0-9a-f]{64})?$")


def _dns_subdomain(value: str) -> str:
    if not DNS_SUBDOMAIN.match(value):
        raise ValueError("must be a DNS-1123 subdomain (lowercase letters, digits, '-' and '.', at most 253 chars)")
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


#: Names of most Kubernetes objects (ConfigMaps, Secrets…).
DnsSubdomain = Annotated[str, AfterValidator(_dns_subdomain)]
PinnedImage = Annotated[str, AfterValidator(_pinned_image)]
LabelPrefix = Annotated[str, AfterValidator(_label_prefix)]
NonEmptyStr = Annotated[str, Field(min_length=1)]
PositiveInt = Annotated[int, Field(gt=0)]
NonNegativeInt = Annotated[int, Field(ge=0)]


class ConfigModel(BaseModel):
    """Base: camelCase keys as in the stack file, unknown keys rejected, immutable; the docstring under each
    field is its description in the schema, the configuration reference and editors' hover text."""

    model_config = ConfigDict(
        extra="forbid", alias_generator=to_camel, populate_by_name=True, frozen=True, strict=False,
        use_attribute_docstrings=True,
    )

    @model_validator(mode="before")
    @classmethod
    def _deployable_values(cls, data: Any) -> Any:
        """Booleans used as numbers and numbers Kubernetes cannot hold become :class:`Refused` markers, which
        fail the field's own validation so the error keeps the key path; the loader shows the reason."""
        if not isinstance(data, dict):
            return data
        return {key: refuse_value(cls, key, value) for key, value in data.items()}

    @classmethod
    def spell(cls, name: str) -> str:
        """A field's name as the stack file writes it (the rules a section shares with its agent name keys so)."""
        return to_camel(name)


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


# --- Checks of what Kubernetes (or the engine) would refuse only at apply time -----------------------------

INT32_MAX = 2**31 - 1
#: Upper bounds on timing knobs by unit suffix of the field name: a week, as seconds, milliseconds, minutes.
TIMING_LIMITS = {"_seconds": 7 * 86400, "_ms": 7 * 86400 * 1000, "_minutes": 7 * 1440}

DNS_1035 = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_LABEL_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
_QUANTITY = re.compile(r"^(?P<num>\d+(\.\d*)?|\.\d+)(?P<suffix>m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei|[eE]\d+)?$")
#: Namespaces the platform must never use for its own workloads.
RESERVED_NAMESPACES = frozenset({"kube-system", "kube-public", "kube-node-lease", "default"})
_CRON_RANGES = ((0, 59), (0, 23), (1, 31), (1, 12), (0, 7))
_CRON_NAMES: tuple[dict[str, int], ...] = ({}, {}, {}, {m: i + 1 for i, m in enumerate(
    ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"))},
    {d: i for i, d in enumerate(("sun", "mon", "tue", "wed", "thu", "fri", "sat"))})


def _cron_value(text: str, field: int) -> int:
    lo, hi = _CRON_RANGES[field]
    names: dict[str, int] = _CRON_NAMES[field]
    value = names.get(text.lower()) if not text.isdigit() else int(text)
    if value is None or not lo <= value <= hi:
        raise ValueError(f"'{text}' is out of range {lo}-{hi} for cron field {field + 1}")
    return value


def check_cron(value: str) -> str:
    """A five-field cron expression as the CronJob controller parses it (numbers, names, ranges, steps, lists)."""
    fields = value.split()
    if len(fields) != 5:
        raise ValueError("must be a five-field cron expression such as '*/2 * * * *'")
    for index, text in enumerate(fields):
        for part in text.split(","):
            base, _, step = part.partition("/")
            if step and (not step.isdigit() or int(step) == 0):
                raise ValueError(f"step '{step}' in cron field {index + 1} must be a positive number")
            if base in ("*", "?"):
                continue
            lo_text, _, hi_text = base.partition("-")
            lo = _cron_value(lo_text, index)
            if hi_text and _cron_value(hi_text, index) < lo:
                raise ValueError(f"range '{base}' in cron field {index + 1} runs backwards")
    return value


def check_quantity(value: str) -> str:
    """A positive Kubernetes quantity such as '500m', '8', '64Gi' (the API server refuses the pod otherwise)."""
    match = _QUANTITY.match(value)
    if not match:
        raise ValueError("must be a Kubernetes quantity such as '8', '500m' or '64Gi' "
                         "(no spaces; 'G' or 'Gi', not 'GB')")
    if float(match["num"]) == 0:
        raise ValueError("must be greater than zero")
    return value


_SUFFIX_FACTOR = {"": 1.0, "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18,
                  "Ki": 2.0**10, "Mi": 2.0**20, "Gi": 2.0**30, "Ti": 2.0**40, "Pi": 2.0**50, "Ei": 2.0**60}


def quantity_value(value: str) -> float:
    """A Kubernetes quantity as a number: bytes for memory, cores for CPU ('128Mi' → 134217728, '500m' → 0.5)."""
    match = _QUANTITY.match(check_quantity(value))
    assert match is not None  # check_quantity refused anything else
    suffix = match["suffix"] or ""
    if suffix[:1] in ("e", "E") and suffix[1:].isdigit():
        return float(match["num"]) * 10.0 ** int(suffix[1:])
    return float(match["num"]) * _SUFFIX_FACTOR[suffix]


def check_absolute_path(value: str) -> str:
    """A container mount path: absolute, not '/', without '..' or ':' (the kubelet refuses those)."""
    if not value.startswith("/") or value.rstrip("/") == "":
        raise ValueError("must be an absolute path below '/', such as '/checkpoints'")
    if ".." in value.split("/") or ":" in value:
        raise ValueError("must not contain '..' or ':'")
    return value


def check_label_value(value: str) -> str:
    if len(value) > 63 or not _LABEL_VALUE.match(value):
        raise ValueError("must be a valid label value (at most 63 letters, digits, '-', '_' or '.', "
                         "beginning and ending with a letter or digit)")
    return value


def check_label_key(key: str) -> str:
    """A qualified name: an optional DNS-subdomain prefix and '/', then a name of at most 63 characters."""
    prefix, _, name = key.rpartition("/")
    if (prefix and (len(prefix) > 253 or not DNS_SUBDOMAIN.match(prefix))) or not _LABEL_NAME.match(name):
        raise ValueError(f"label key '{key}' is not a qualified name such as 'release' or 'example.com/team'")
    return key


def check_cidr(value: str, version: int | None = None) -> str:
    """A network in CIDR notation as the API server and the CNI read it: ``address/prefix``, the prefix within the
    address's length and no host bits set. A regular expression passes ``10.64.0.0/33``; the stdlib parser is the
    rule here, and every CIDR key of the stack takes this one check."""
    example = "10.64.0.0/12"
    address, slash, prefix = value.partition("/")
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        raise ValueError(f"is not a network in CIDR notation such as '{example}': '{address}' is not an IP "
                         "address") from None
    if version is not None and ip.version != version:
        raise ValueError(f"must be an IPv{version} network such as '{example}'")
    if isinstance(ip, ipaddress.IPv6Address) and ip.scope_id is not None:
        raise ValueError("must not carry an IPv6 zone ('%…'): a network is not bound to an interface")
    if not (slash and 0 < len(prefix) <= 3 and prefix.isascii() and prefix.isdigit()) \
            or prefix != str(int(prefix)):
        raise ValueError(f"must end in a prefix length in plain digits, such as '{example}'")
    if int(prefix) > ip.max_prefixlen:
        raise ValueError(f"prefix length /{prefix} is beyond /{ip.max_prefixlen}, the longest an IPv{ip.version} "
                         "network has")
    network = ipaddress.ip_network(value, strict=False)
    if network.network_address != ip:
        raise ValueError(f"has host bits set: the network is '{network}'")
    return value


def _labels(value: dict[str, str]) -> dict[str, str]:
    for key, item in value.items():
        check_label_key(key)
        try:
            check_label_value(item)
        except ValueError as error:
            raise ValueError(f"label '{key}': {error}") from None
    return value


def check_extended_resource(value: str) -> str:
    """An extended resource name: ``<domain>/<name>``, the domain outside kubernetes.io (reserved)."""
    domain, _, name = value.partition("/")
    if not name or not DNS_SUBDOMAIN.match(domain) or "." not in domain or not _LABEL_NAME.match(name):
        raise ValueError("must be an extended resource name such as 'nvidia.com/gpu'")
    if domain == "kubernetes.io" or domain.endswith(".kubernetes.io"):
        raise ValueError("the kubernetes.io domain is reserved; name the device plugin's domain, e.g. 'nvidia.com/gpu'")
    return value


def _dns_1035(value: str, room: int) -> str:
    """A name that also becomes a Service or pod host name (starts with a letter), with ``room`` for suffixes."""
    if not DNS_1035.match(value):
        raise ValueError("must start with a lowercase letter and hold only lowercase letters, digits and '-'")
    if len(value) > 63 - room:
        raise ValueError(f"must be at most {63 - room} characters (derived object names add up to {room})")
    return value


def _short_label(value: str, room: int) -> str:
    if len(value) > 63 - room:
        raise ValueError(f"must be at most {63 - room} characters (derived names and labels add {room})")
    return value


def short_label(room: int) -> AfterValidator:
    """A DNS label that leaves ``room`` characters for the prefix or suffix of the names derived from it."""
    return AfterValidator(lambda value: _short_label(value, room))


def url_without_credentials(value: str, pointer: str) -> str:
    """Refuse ``scheme://user:password@host``: the password would land in the stack file and in state."""
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(value)
        _ = parts.port
    except ValueError as error:
        raise ValueError(f"is not a valid URL: {error}") from None
    if parts.password is not None:
        raise ValueError(f"embeds a password; remove 'user:password@' and put the credentials in {pointer}")
    return value


def _no_credentials(value: str) -> str:
    return url_without_credentials(
        value, "a secret config key (`pulumi config set --secret <key> <value>`)")


Quantity = Annotated[str, AfterValidator(check_quantity)]
AbsolutePath = Annotated[str, AfterValidator(check_absolute_path)]
LabelValue = Annotated[str, AfterValidator(check_label_value)]
Labels = Annotated[dict[str, str], AfterValidator(_labels)]
ExtendedResource = Annotated[str, AfterValidator(check_extended_resource)]
CronSchedule = Annotated[str, AfterValidator(check_cron)]
PlainUrl = Annotated[str, AfterValidator(_no_credentials)]
#: A network in CIDR notation (IPv4 or IPv6), e.g. ``10.64.0.0/12``.
Cidr = Annotated[str, AfterValidator(check_cidr)]
#: An IPv4 network in CIDR notation, where the consumer (Liqo's IPAM) takes IPv4 only.
Ipv4Cidr = Annotated[str, AfterValidator(lambda value: check_cidr(value, 4))]


def dns_1035(room: int) -> AfterValidator:
    return AfterValidator(lambda value: _dns_1035(value, room))


def _bool_allowed(annotation: Any) -> bool:
    if annotation is bool or annotation is Any:
        return True
    return any(_bool_allowed(arg) for arg in get_args(annotation))


@dataclass(frozen=True)
class Refused:
    """A raw value refused before its field is validated; the loader reports ``reason`` at the field's path."""

    reason: str
    value: Any


_INTEGER_TEXT = re.compile(r"^[+-]?\d+$")


def _numeric(annotation: Any) -> bool:
    if annotation in (int, float):
        return True
    return any(_numeric(arg) for arg in get_args(annotation))


def number_problem(value: Any, field: str, bool_allowed: bool, numeric: bool = True) -> str | None:
    """Why ``value`` cannot go in ``field``: a boolean where a number belongs, a number beyond int32 (what
    Kubernetes' integer fields hold), not finite, or past the timing bound of its unit; None when fine."""
    if isinstance(value, bool):
        return None if bool_allowed else "must be a number or text, not a boolean"
    if isinstance(value, str) and numeric and _INTEGER_TEXT.match(value.strip()) and len(value) < 400:
        value = int(value)
    if not isinstance(value, int | float):
        return None
    if isinstance(value, float) and not math.isfinite(value):
        return "must be a finite number"
    if abs(value) > INT32_MAX:
        return f"is beyond what Kubernetes can hold (at most {INT32_MAX})"
    for suffix, limit in TIMING_LIMITS.items():
        if field.endswith(suffix) and value > limit:
            return f"must be at most {limit} (one week); a larger value is a typo that disables the timer"
    return None


def refuse_value(cls: type[BaseModel], key: Any, value: Any) -> Any:
    """``value`` as given, or a :class:`Refused` marker (also for list entries) when it cannot be deployed."""
    field = cls.model_fields.get(key) if isinstance(key, str) else None
    name = key if isinstance(key, str) else ""
    if field is None:
        field = next((f for n, f in cls.model_fields.items() if f.alias == key), None)
    if field is None:
        return value
    allowed, numeric = _bool_allowed(field.annotation), _numeric(field.annotation)
    snake = next(n for n, f in cls.model_fields.items() if f is field) or name
    if isinstance(value, list):
        return [Refused(why, item) if (why := number_problem(item, snake, allowed, numeric)) else item
                for item in value]
    why = number_problem(value, snake, allowed, numeric)
    return Refused(why, value) if why else value


class ContainerRequests(ConfigModel):
    """What the scheduler reserves for one container on its node; the memory is its limit too (no OOM surprises).
    A system node's room is the sum of these: a pod that does not fit preempts the lowest class there."""

    cpu: Quantity
    """CPU request (`500m`, `2`)."""
    memory: Quantity
    """Memory request and limit (`256Mi`, `1Gi`)."""
