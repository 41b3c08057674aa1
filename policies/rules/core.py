"""What every rule sees and how rules register: the inputs, the stack context, the registry, evaluation.

A rule is a pure function over a :class:`Resource` (``@rule``) or over the whole stack (``@stack_rule``),
plus a :class:`RuleContext` built from the stack config. The decorator registers it in :data:`RULES`
next to its check, so a rule's name, level, description and reason sit where its logic is.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pulumi_policy import EnforcementLevel

from agents.defaults import DEFAULT_GPU_RESOURCE, DEFAULT_LABEL_PREFIX
from agents.health_guard.thermal import THERMAL_LIMIT_CELSIUS
from components.config import ClusterConfig, Descheduler, Observability, Priorities, Scheduling, Training
from components.guardrail_rules import Names
from components.naming import ONPREM, STANDBY, VK_PROVIDER_TAINT, Keys
from components.training_spec import SUPERVISOR_COMMAND
from policies.rules.allow_lists import PrivilegedAgent, RbacException, privileged_agents, rbac_exceptions
from training_runtime.settings import CHECKPOINT_DIR

MANDATORY, ADVISORY = EnforcementLevel.MANDATORY, EnforcementLevel.ADVISORY


@dataclass(frozen=True)
class Options:
    """The resource options a rule may read. ``retain_on_delete`` is None where the engine hides it."""

    protect: bool = False
    retain_on_delete: bool | None = None


@dataclass(frozen=True)
class Resource:
    """One registered resource as the rules see it (plain dicts and lists, unknowns as None)."""

    type: str
    props: Mapping[str, Any]
    urn: str = ""
    name: str = ""
    options: Options = field(default_factory=Options)

    @property
    def kind(self) -> str:
        kind = self.props.get("kind")
        if isinstance(kind, str) and kind:
            return kind
        token = self.type.rsplit(":", 1)[-1]
        return token.removesuffix("Patch")

    @property
    def api_version(self) -> str:
        version = self.props.get("apiVersion")
        if isinstance(version, str) and version:
            return version
        parts = self.type.split(":")
        if len(parts) == 3 and parts[0] == "kubernetes":
            return parts[1].removeprefix("core/")
        return ""

    @property
    def group(self) -> str:
        return self.api_version.rsplit("/", 1)[0] if "/" in self.api_version else ""

    @property
    def metadata(self) -> Mapping[str, Any]:
        return as_map(self.props.get("metadata"))

    @property
    def object_name(self) -> str:
        return str(self.metadata.get("name") or self.name)

    @property
    def namespace(self) -> str:
        return str(self.metadata.get("namespace") or "")

    @property
    def labels(self) -> Mapping[str, Any]:
        return as_map(self.metadata.get("labels"))

    @property
    def label(self) -> str:
        """How tables and messages name the resource."""
        ns = f"{self.namespace}/" if self.namespace else ""
        return f"{self.kind} {ns}{self.object_name}"


@dataclass(frozen=True)
class RuleContext:
    """The stack-config values the rules need; one per stack."""

    label_prefix: str = DEFAULT_LABEL_PREFIX
    gpu_resource: str = DEFAULT_GPU_RESOURCE
    scheduler_name: str = "volcano"
    tiers: Mapping[str, int] = field(default_factory=dict)
    training_class: str = "gpu-training"
    inference_class: str = "gpu-inference"
    thermal_limit_celsius: float = THERMAL_LIMIT_CELSIUS
    max_evictions_per_node: int = 4
    max_evictions_per_namespace: int = 8
    max_evictions_total: int = 16
    virtual_nodes: frozenset[str] = frozenset()
    #: Namespaces of users' training and inference pods (judged by namespace Pod Security admission).
    workload_namespaces: frozenset[str] = frozenset({"training", "inference"})
    #: The inference namespace: the only one the descheduler's return may evict in.
    inference_namespace: str = "inference"
    #: Pod identities (namespace, service account) allowed named privileges (policies.rules.allow_lists).
    privileged: tuple[PrivilegedAgent, ...] = privileged_agents("gpu-telemetry")
    #: Roles and bindings allowed named grants beyond the RBAC rules, each with its reason.
    rbac_exceptions: tuple[RbacException, ...] = ()
    #: StorageClasses and pre-provisioned volumes that hold checkpoints: a claim on one is a checkpoint claim.
    checkpoint_classes: frozenset[str] = frozenset()
    checkpoint_volumes: frozenset[str] = frozenset()
    #: Volcano queues: inference must stay reclaimable, training never.
    inference_queue: str = "inference"
    training_queues: frozenset[str] = frozenset({"training"})
    #: The descheduler's return plugin: the minimum pod age, and whether the preferred-affinity plugin is on.
    min_pod_age_seconds: int = 300
    prefer_onprem_affinity: bool = False
    #: True where secret values show as the placeholder (mock runtime); False under the real engine.
    secrets_marked: bool = True
    #: Plain (non-secret) string values of the stack file; a credential equal to one came from plain config.
    plain_config_values: frozenset[str] = frozenset()
    #: The scheduling gate training pods start behind, or None where the stack runs no handover.
    handover_gate: str | None = None
    #: Checkpoint claims (object names) and their filesystems' write GB/s, plus the checkpoint size and one
    #: client link: what a training pod's termination grace must hold (one emergency checkpoint).
    checkpoint_write_gbps: Mapping[str, float] = field(default_factory=dict)
    checkpoint_size_tb: float = 1.0
    client_link_gbps: float = 50.0
    #: Whether the stack restarts crashed gangs in place (``training.restartInPlace.enabled``).
    restart_in_place: bool = False

    @property
    def keys(self) -> Keys:
        return Keys(self.label_prefix)

    @property
    def guardrail_names(self) -> Names:
        """The names the guardrail table's texts speak of (components.guardrail_rules), as this stack has them."""
        keys = self.keys
        return Names(scheduler=self.scheduler_name, priority_class=self.training_class, location_key=keys.location,
                     onprem=ONPREM, provider_taint=VK_PROVIDER_TAINT, burst_taint=keys.burst_taint,
                     gate=self.handover_gate or keys.handover_gate, role_key=keys.role, standby=STANDBY,
                     supervisor=" ".join(SUPERVISOR_COMMAND), checkpoint_env=CHECKPOINT_DIR)

    @classmethod
    def from_config(
        cls, cfg: ClusterConfig, *, secrets_marked: bool = True, plain_config_values: Iterable[str] = ()
    ) -> RuleContext:
        return cls(
            label_prefix=cfg.label_prefix,
            gpu_resource=cfg.gpu_resource,
            scheduler_name=cfg.scheduling.scheduler_name,
            tiers={t.name: t.value for t in cfg.priorities.tiers().values()},
            training_class=cfg.priorities.training.name,
            inference_class=cfg.priorities.inference.name,
            thermal_limit_celsius=cfg.observability.thermal_threshold_celsius,
            max_evictions_per_node=cfg.descheduler.max_pods_per_node,
            max_evictions_per_namespace=cfg.descheduler.max_pods_per_namespace,
            max_evictions_total=cfg.descheduler.max_pods_total,
            virtual_nodes=frozenset(p.node_name for p in cfg.providers),
            workload_namespaces=frozenset({cfg.training_namespace, cfg.inference_namespace}),
            inference_namespace=cfg.inference_namespace,
            privileged=privileged_agents(cfg.telemetry_namespace, cfg.pod_resources_dir),
            rbac_exceptions=rbac_exceptions(p.name for p in cfg.providers),
            checkpoint_classes=frozenset(f.object_name for f in cfg.checkpoint.filesystems if f.dynamic),
            checkpoint_volumes=frozenset(f.object_name for f in cfg.checkpoint.filesystems if not f.dynamic),
            inference_queue=cfg.scheduling.inference_queue.name,
            training_queues=frozenset(cfg.scheduling.training_queue_names(p.name for p in cfg.pools).values()),
            min_pod_age_seconds=cfg.descheduler.min_pod_age_seconds,
            prefer_onprem_affinity=cfg.descheduler.prefer_onprem_affinity,
            secrets_marked=secrets_marked,
            plain_config_values=frozenset(plain_config_values),
            # As the training template and the admission policy decide it: only Volcano honours the gate.
            handover_gate=(Keys(cfg.label_prefix).handover_gate
                           if cfg.handover_active and cfg.scheduling.engine.value == "volcano" else None),
            checkpoint_write_gbps={f.object_name: f.write_gbps for f in cfg.checkpoint.filesystems},
            checkpoint_size_tb=cfg.checkpoint.budget.size_tb,
            client_link_gbps=cfg.checkpoint.budget.client_link_gbps,
            restart_in_place=cfg.training.restart_in_place.enabled,
        )

    @classmethod
    def defaults(cls) -> RuleContext:
        """The schema defaults, for a pack started without stack config (e.g. ``pulumi policy publish``)."""
        priorities, descheduler, observability, scheduling = Priorities(), Descheduler(), Observability(), Scheduling()
        return cls(
            inference_queue=scheduling.inference_queue.name,
            training_queues=frozenset({scheduling.training_queue.name}),
            min_pod_age_seconds=descheduler.min_pod_age_seconds,
            tiers={t.name: t.value for t in priorities.tiers().values()},
            training_class=priorities.training.name,
            inference_class=priorities.inference.name,
            thermal_limit_celsius=observability.thermal_threshold_celsius,
            max_evictions_per_node=descheduler.max_pods_per_node,
            max_evictions_per_namespace=descheduler.max_pods_per_namespace,
            max_evictions_total=descheduler.max_pods_total,
            restart_in_place=Training().restart_in_place.enabled,
        )


ResourceCheck = Callable[[Resource, RuleContext], list[str]]


StackCheck = Callable[[Sequence[Resource], RuleContext], list[tuple[Resource, str]]]


@dataclass(frozen=True)
class Rule:
    """One rule: exactly one of ``check`` (per resource) or ``stack_check`` (whole stack)."""

    name: str
    description: str
    level: EnforcementLevel
    why_level: str
    check: ResourceCheck | None = None
    stack_check: StackCheck | None = None

    @property
    def mandatory(self) -> bool:
        return self.level is EnforcementLevel.MANDATORY


@dataclass(frozen=True)
class Violation:
    rule: str
    level: EnforcementLevel
    urn: str
    resource: str
    message: str


def as_map(value: Any) -> Mapping[str, Any]:
    """A mapping, or empty where the value is missing, unknown or of another type (rules never raise on shape)."""
    return value if isinstance(value, Mapping) else {}


def as_seq(value: Any) -> list[Any]:
    """A list, or empty where the value is missing, unknown, a string or of another type."""
    if isinstance(value, Sequence) and not isinstance(value, str | bytes):
        return list(value)
    return []


def quantity(value: Any) -> float | None:
    """A plain number (``"2"``, ``4``); None for anything else, including unknowns."""
    try:
        return float(str(value))
    except ValueError:
        return None


def strings(value: Any, path: str = "") -> Iterable[tuple[str, str]]:
    """Every string inside a value, with its dotted path (``env[0].value``)."""
    if isinstance(value, str):
        yield path, value
    elif isinstance(value, Mapping):
        for k, v in value.items():
            yield from strings(v, f"{path}.{k}" if path else str(k))
    elif isinstance(value, Sequence) and not isinstance(value, bytes):
        for i, v in enumerate(value):
            yield from strings(v, f"{path}[{i}]")


# --------------------------------------------------------------------------- the registry

#: The rule areas, one module of :mod:`policies.rules` each, in the order :data:`RULES` lists them.
AREAS = ("scheduling", "burst", "storage", "observability", "security")

#: Every registered rule: mandatory rules first, then advisory ones; within a level by area (:data:`AREAS`),
#: and within an area top to bottom (registration order). Import order does not matter.
RULES: list[Rule] = []
_ORDER: dict[str, tuple[int, int, int]] = {}


def register(new: Rule, module: str) -> Rule:
    """Add a rule defined in ``module`` to :data:`RULES`; a second rule of the same name is a programming error."""
    if (new.check is None) == (new.stack_check is None):
        raise ValueError(f"policy rule {new.name!r} needs exactly one of a resource check and a stack check")
    if new.name in _ORDER:
        raise ValueError(f"policy rule {new.name!r} is registered twice")
    area = module.rsplit(".", 1)[-1]
    if area not in AREAS:
        raise ValueError(f"policy rule {new.name!r} is defined in {module}, not in one of the areas {AREAS} "
                         "(policies/rules/<area>.py); add the module to policies.rules.core.AREAS")
    _ORDER[new.name] = (0 if new.mandatory else 1, AREAS.index(area), len(_ORDER))
    RULES.append(new)
    RULES.sort(key=lambda r: _ORDER[r.name])
    return new


def rule(
    name: str, description: str, level: EnforcementLevel, why_level: str
) -> Callable[[ResourceCheck], ResourceCheck]:
    """Register the decorated function as the per-resource check of rule ``name``."""

    def decorate(check: ResourceCheck) -> ResourceCheck:
        register(Rule(name, description, level, why_level, check=check), check.__module__)
        return check

    return decorate


def stack_rule(
    name: str, description: str, level: EnforcementLevel, why_level: str
) -> Callable[[StackCheck], StackCheck]:
    """Register the decorated function as the whole-stack check of rule ``name``."""

    def decorate(check: StackCheck) -> StackCheck:
        register(Rule(name, description, level, why_level, stack_check=check), check.__module__)
        return check

    return decorate


def evaluate(resources: Sequence[Resource], ctx: RuleContext, rules: Sequence[Rule] = RULES) -> list[Violation]:
    """Every rule over every resource (and the stack), in rule order."""
    found: list[Violation] = []
    for rule in rules:
        if rule.check is not None:
            for res in resources:
                found += [Violation(rule.name, rule.level, res.urn, res.label, m) for m in rule.check(res, ctx)]
        if rule.stack_check is not None:
            found += [
                Violation(rule.name, rule.level, res.urn, res.label, m) for res, m in rule.stack_check(resources, ctx)
            ]
    return found
