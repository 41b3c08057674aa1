"""The burst controller's contract with the rest of the project: names, bounds, the settings type and defaults.

No I/O and nothing outside the standard library: the deploying component, the stack config's validators, the
simulator and the controller itself all read their names and numbers from here, so they cannot drift apart.
Reading the settings file is `settings.load_file`'s job. Label and annotation keys are derived from the
stack's label prefix in one place (`BurstKeys`); the defaults are the reviewed values of the stack config's
`burst` section.

Every knob has a default that encodes the design (NoSchedule-only taint, asymmetric hysteresis); a bad value
fails at start with an error that names the key and the file, never later at runtime.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from agents import node_taints

POD_DELETION_COST_ANNOTATION = "controller.kubernetes.io/pod-deletion-cost"
"""Upstream annotation the ReplicaSet controller reads to choose which pods go first on scale-down."""

GANG_ANNOTATION = "scheduling.k8s.io/group-name"
"""PodGroup of a pod, set by Volcano's job controller (and by our kube-batch template): one gang per value."""

VK_PROVIDER_TAINT = "virtual-kubelet.io/provider"
"""virtual-kubelet's own default taint: the provider's, never ours to manage."""

DEFAULT_LABEL_PREFIX = "gpucluster.io"

# Bounds the stack config checks at preview time and the agent checks again at start.
WATCH_TIMEOUT_SECONDS = 60
"""Server-side timeout of one watch request; staleness must exceed it or a quiet cluster reads as blind."""
MAX_TICK_SECONDS = 60.0
"""Longest decision period: hold timers and the handover timeout are only as precise as the tick."""
MAX_STALE_AFTER_SECONDS = 900
"""Longest the controller may act on data it has not heard confirmed: beyond this it is acting blind."""


class Cover(enum.StrEnum):
    """How much of a service the handover's standby replaces."""

    CURRENT = "current"  # every replica at risk, up to the current replica count: capacity survives
    MINIMUM = "minimum"  # only up to minReplicas: the floor survives, at fewer external GPUs


class Sizing(enum.StrEnum):
    """Which on-prem replicas waiting training puts at risk (what the handover's standby replaces)."""

    POOL = "pool"  # every ready replica in a pool where the training does not fit the free GPUs
    DISPLACED = "displaced"  # only as many as sit on the GPUs the training lacks, node by node


@dataclass(frozen=True)
class BurstKeys:
    """Every label, taint, annotation and gate name under the stack's prefix, derived once."""

    prefix: str

    @property
    def pool(self) -> str:
        return f"{self.prefix}/pool"

    @property
    def location(self) -> str:
        return f"{self.prefix}/location"

    @property
    def provider(self) -> str:
        return f"{self.prefix}/provider"

    @property
    def workload(self) -> str:
        return f"{self.prefix}/workload"

    @property
    def service(self) -> str:
        return f"{self.prefix}/service"

    @property
    def role(self) -> str:
        return f"{self.prefix}/role"

    @property
    def burst_taint(self) -> str:
        return f"{self.prefix}/burst"

    @property
    def thermal_taint(self) -> str:
        return f"{self.prefix}/thermal"

    @property
    def health_taint(self) -> str:
        """The health guard's quarantine taint (fatal or degraded): training tolerates neither."""
        return node_taints.health_taint_key(self.prefix)

    @property
    def changed_at_annotation(self) -> str:
        return f"{self.prefix}/burst-changed-at"

    @property
    def handover_gate(self) -> str:
        return f"{self.prefix}/handover"


#: Value of the role label on a service's warm-pool placeholders: the view counts them apart from its replicas.
WARM_ROLE = "warm"


def warm_deployment(service: str) -> str:
    """Name of a service's warm-pool placeholder Deployment (the component and the controller agree on it)."""
    return f"{service}-warm"


#: Value of the role label on a service's make-before-break return pods (its on-prem `<service>-return`).
RETURN_ROLE = "return"


def return_deployment(service: str) -> str:
    """Name of a service's on-prem return Deployment (the component and the controller agree on it)."""
    return f"{service}-return"


def standby_deployment(service: str) -> str:
    """Name of a service's standby Deployment (the deploying component and the controller agree on it)."""
    return f"{service}-standby"


class SettingsError(ValueError):
    """A settings value is missing, unknown or out of range; the message names the key."""


@dataclass(frozen=True)
class BurstSettings:
    """All tunables of the controller; thresholds are GPU counts, durations are seconds.

    Defaults equal the stack config's `burst` defaults (open below 8, close at 32, resync 30 s): those are
    the reviewed values; the config's own defaults and bounds are read from here.
    """

    label_prefix: str = DEFAULT_LABEL_PREFIX
    # Empty means "<label_prefix>/burst"; resolved in __post_init__ so the key follows the prefix.
    taint_key: str = ""
    taint_value: str = "closed"
    gpu_resource: str = "nvidia.com/gpu"
    # Hysteresis band: open below `open_below_free_gpus`, close at `close_at_free_gpus` + GPUs in use
    # externally. The gap between the two is what keeps the taint from flapping.
    open_below_free_gpus: int = 8
    close_at_free_gpus: int = 32
    open_hold_seconds: float = 60.0
    close_hold_seconds: float = 600.0
    # An inference pod unschedulable this long opens the burst. Short: the scheduler marks a pod Unschedulable
    # only after a full cycle (and a preemption attempt), and opening is only a taint removed (no GPU is
    # bought until a pod lands); every second here adds to a cold external start (bench_families: 30 s -> 5 s
    # moves availability on every family and no taint flip).
    pending_grace_seconds: float = 5.0
    external_deletion_cost: int = -100
    # Provider name -> the pod-deletion-cost of replicas on its virtual node, lower for a dearer provider, so a
    # scale-down removes the dearest external replicas first; a provider not listed takes external_deletion_cost.
    provider_deletion_costs: dict[str, int] = field(default_factory=dict)
    max_cost_patches_per_cycle: int = 50
    resync_seconds: float = 30.0
    tick_seconds: float = 5.0
    stale_after_seconds: float = 120.0
    watch_timeout_seconds: int = WATCH_TIMEOUT_SECONDS
    namespace: str = "gpu-burst"
    lease_name: str = "burst-controller"
    lease_duration_seconds: float = 15.0
    renew_deadline_seconds: float = 10.0
    retry_period_seconds: float = 2.0
    request_timeout_seconds: float = 10.0
    api_retry_attempts: int = 5
    backoff_base_seconds: float = 0.5
    backoff_max_seconds: float = 10.0
    # An action that failed (after its immediate retries) is not tried again before this delay, doubled per
    # further failure up to the max, with jitter: a patch the API refuses for good cannot hammer it.
    action_backoff_base_seconds: float = 2.0
    action_backoff_max_seconds: float = 300.0
    # Make-before-break handover: inference service -> minReplicas. Training pods carry the handover
    # scheduling gate; the controller scales each service's standby Deployment on virtual nodes until the
    # replicas a gang (or the return home) is about to take away are covered, and only then lifts the gate
    # or closes the burst. Empty: no standby is managed and gated pods are released at once.
    handover_services: dict[str, int] = field(default_factory=dict)
    # Training outranks inference: a gate is lifted after this long even if the standby is not ready.
    handover_timeout_seconds: float = 300.0
    # Provider name -> its own taint as "key=value". A virtual kubelet taints its node only when it creates
    # it; a node that something else created first (the stack's label patch can) would be open to every pod.
    # The controller adds a missing provider taint (NoSchedule) and never removes or changes one.
    provider_taints: dict[str, str] = field(default_factory=dict)
    handover_cover: Cover = Cover.CURRENT
    # POOL sizes the standby to every ready replica in the pool a waiting gang does not fit, DISPLACED to the
    # replicas on the GPUs it lacks (node by node, at most that many per service). Measured at 4,096 GPUs × 30
    # days (bench/sim, synthetic and GenTD26): DISPLACED saves 0.6-2.0 % of external GPU·h but loses 0.002
    # points of availability (the whole-pool standby also serves traffic while it waits): POOL stays default.
    handover_sizing: Sizing = Sizing.POOL
    # While returning home, at most this many external replicas per service count as at risk (the ones the
    # descheduler moves at once); 0 = all of them. A cap of 8 saves 0.2-1.2 % of external GPU·h and loses up to
    # 0.003 points of availability (measured as above), so 0 stays the default.
    handover_return_batch: int = 0
    # The standby also covers the demand ramp expected while it starts: the rise of each service's replica
    # count over the last `handover_ramp_window_seconds`, carried `handover_ramp_seconds` ahead (the external
    # start, 180 s in the simulator), at most the current count. 0 (default): the standby replaces what the
    # gang takes and no more. Measured on the demand families (bench/bench_families.py, 4,096 GPUs × 7 days)
    # 180 s narrows steep ramps' gap by 0.014 points but widens decays' by 0.035 (the standby takes external
    # room the HPA's own scale-ups need) for 3-18 % more standby GPU·h, so it stays off.
    handover_ramp_seconds: float = 0.0
    handover_ramp_window_seconds: float = 300.0
    # Warm external capacity: while the burst is open, each handover service keeps placeholder replicas on
    # virtual nodes (its `<service>-warm` Deployment: the service's image started and asleep, the lowest
    # inference priority, so any replica preempts it) and a replica landing on one starts warm, in seconds,
    # instead of a cold external start of minutes (llm-d: 4 s warm against 85 s cold; a cold 10-20 GB pull
    # takes 7-10 min). The pool is `warm_pool_share` of the service's replicas (rounded up) plus the rise the
    # forecast expects over `warm_pool_ramp_seconds` (`expected_ramp` on the replica count over
    # `handover_ramp_window_seconds`), at most the current count; 0 and 0 (default): no warm pool. What each
    # size costs and serves is in bench/report.md (bench_families): on the demand families (4,096 GPUs x 7
    # days) a share of 0.25 gains 0.01-0.05 availability points for 10-25 % more external GPU·h, 0.1 about
    # half of that, the ramp alone almost nothing; no family reaches the 0.02-point target by it, and every
    # size moves external GPU·h further from 1.3x the oracle, so it stays off.
    warm_pool_share: float = 0.0
    warm_pool_ramp_seconds: float = 0.0
    # Make-before-break return: while external replicas of a handover service are ready and on-prem has room
    # that training does not need (effective free GPUs above `open_below_free_gpus`), the controller scales the
    # service's on-prem `<service>-return` Deployment (selected by the Service and the PDB, not by the HPA),
    # waits until those pods are Ready, then evicts as many external replicas, the dearest provider's first;
    # their replacements land on-prem beside the bridge, which goes once they are Ready. At most
    # ceil(`return_surge_share` x replicas) bridge pods per service: the surge the HPA tolerates (its 10 %
    # tolerance, under its 300 s scale-down window). 0 (default): no bridge, the descheduler's return only.
    # Measured (4,096 GPUs x 7 days, share 0.1): external GPU·h -6 % (diurnal), -11 % (steep ramps), -18 % (flash
    # crowds), the GPU·h waiting on open virtual nodes while on-prem has room -56 to -61 %, but availability
    # +0.004 points on diurnal and -0.009 / -0.022 on steep ramps / flash crowds (the room the moved replicas
    # take is what the next ramp's scale-ups needed, so those start cold externally): it stays off.
    return_surge_share: float = 0.0
    inference_namespace: str = "inference"
    # The on-prem pools inference may run in (the pools its services are confined to); empty = every pool, and
    # GPUs on nodes of no pool. Free GPUs elsewhere are no room for inference, so they cannot keep the burst shut.
    inference_pools: tuple[str, ...] = ()
    # Derived names, filled from label_prefix.
    pool_label: str = field(default="", init=False)
    location_label: str = field(default="", init=False)
    provider_label: str = field(default="", init=False)
    workload_label: str = field(default="", init=False)
    thermal_taint_key: str = field(default="", init=False)
    health_taint_key: str = field(default="", init=False)
    changed_at_annotation: str = field(default="", init=False)
    service_label: str = field(default="", init=False)
    role_label: str = field(default="", init=False)
    handover_gate: str = field(default="", init=False)

    def __post_init__(self) -> None:
        keys = BurstKeys(self.label_prefix)
        derived = {
            "pool_label": keys.pool,
            "location_label": keys.location,
            "provider_label": keys.provider,
            "workload_label": keys.workload,
            "thermal_taint_key": keys.thermal_taint,
            "health_taint_key": keys.health_taint,
            "changed_at_annotation": keys.changed_at_annotation,
            "service_label": keys.service,
            "role_label": keys.role,
            "handover_gate": keys.handover_gate,
        }
        for name, value in derived.items():
            object.__setattr__(self, name, value)
        if not self.taint_key:
            object.__setattr__(self, "taint_key", keys.burst_taint)
        for name, kind in (("handover_cover", Cover), ("handover_sizing", Sizing)):
            value = getattr(self, name)
            if isinstance(value, str) and not isinstance(value, kind):
                try:
                    object.__setattr__(self, name, kind(value))
                except ValueError:
                    allowed = " or ".join(repr(c.value) for c in kind)
                    raise SettingsError(f"{name}: must be {allowed}, got {value!r}") from None
        self._validate()

    @property
    def keys(self) -> BurstKeys:
        return BurstKeys(self.label_prefix)

    @property
    def return_bridge(self) -> bool:
        """Whether the controller runs the make-before-break return (and the stack deploys `<service>-return`)."""
        return bool(self.handover_services) and self.return_surge_share > 0

    @property
    def warm_pool(self) -> bool:
        """Whether the controller keeps a warm pool (and the stack deploys the `<service>-warm` Deployments)."""
        return bool(self.handover_services) and (self.warm_pool_share > 0 or self.warm_pool_ramp_seconds > 0)

    def deletion_cost_for(self, provider: str) -> int:
        """The pod-deletion-cost of an external replica on `provider`'s virtual node."""
        return self.provider_deletion_costs.get(provider, self.external_deletion_cost)

    def _validate(self) -> None:
        if not self.label_prefix or "/" in self.label_prefix:
            raise SettingsError(f"label_prefix: must be a DNS prefix without '/', got {self.label_prefix!r}")
        if "/" not in self.taint_key:
            raise SettingsError(f"taint_key: must look like '<prefix>/<name>', got {self.taint_key!r}")
        if self.taint_key.startswith("virtual-kubelet.io/"):
            raise SettingsError("taint_key: the provider's own taint is not ours to manage")
        for provider, taint in self.provider_taints.items():
            key, sep, _ = taint.partition("=")
            if not sep or not key or "/" not in key:
                raise SettingsError(f"provider_taints.{provider}: must be '<prefix>/<name>=<value>', got {taint!r}")
            if key == self.taint_key:
                raise SettingsError(f"provider_taints.{provider}: {key!r} is the burst taint, not a provider's")
        for name in ("open_below_free_gpus", "close_at_free_gpus", "max_cost_patches_per_cycle",
                     "handover_return_batch"):
            if getattr(self, name) < 0:
                raise SettingsError(f"{name}: must be >= 0, got {getattr(self, name)}")
        if not 0.0 <= self.warm_pool_share <= 1.0:
            raise SettingsError(f"warm_pool_share: must be between 0 and 1 (a share of the replicas), got "
                                f"{self.warm_pool_share:g}")
        if not 0.0 <= self.return_surge_share <= 1.0:
            raise SettingsError(f"return_surge_share: must be between 0 and 1 (a share of the replicas), got "
                                f"{self.return_surge_share:g}")
        if self.close_at_free_gpus <= self.open_below_free_gpus:
            raise SettingsError(
                f"close_at_free_gpus: must exceed open_below_free_gpus ({self.open_below_free_gpus}) "
                f"or the taint flaps, got {self.close_at_free_gpus}"
            )
        holds = (
            "open_hold_seconds",
            "close_hold_seconds",
            "pending_grace_seconds",
            "backoff_base_seconds",
            "handover_timeout_seconds",
            "handover_ramp_seconds",
            "handover_ramp_window_seconds",
            "warm_pool_ramp_seconds",
            "action_backoff_base_seconds",
        )
        for name in holds:
            if getattr(self, name) < 0:
                raise SettingsError(f"{name}: must be >= 0, got {getattr(self, name)}")
        for name in (
            "resync_seconds",
            "tick_seconds",
            "stale_after_seconds",
            "watch_timeout_seconds",
            "lease_duration_seconds",
            "renew_deadline_seconds",
            "retry_period_seconds",
            "request_timeout_seconds",
            "api_retry_attempts",
            "backoff_max_seconds",
            "action_backoff_max_seconds",
        ):
            if getattr(self, name) <= 0:
                raise SettingsError(f"{name}: must be > 0, got {getattr(self, name)}")
        if self.tick_seconds > MAX_TICK_SECONDS:
            raise SettingsError(f"tick_seconds: must be at most {MAX_TICK_SECONDS:g}, got {self.tick_seconds:g}")
        if self.stale_after_seconds > MAX_STALE_AFTER_SECONDS:
            raise SettingsError(
                f"stale_after_seconds: must be at most {MAX_STALE_AFTER_SECONDS}, got {self.stale_after_seconds:g}"
            )
        if self.tick_seconds >= self.stale_after_seconds:
            raise SettingsError(
                f"tick_seconds: must be below stale_after_seconds ({self.stale_after_seconds:g}), otherwise "
                f"every decision sees data older than the limit, got {self.tick_seconds:g}"
            )
        if self.renew_deadline_seconds >= self.lease_duration_seconds:
            raise SettingsError(
                "renew_deadline_seconds: must be below lease_duration_seconds "
                f"({self.lease_duration_seconds:g}) so a leader steps down before another can take over"
            )
        if self.watch_timeout_seconds >= self.stale_after_seconds:
            raise SettingsError(
                f"stale_after_seconds: must exceed watch_timeout_seconds ({self.watch_timeout_seconds}), otherwise "
                f"a quiet cluster looks stale, got {self.stale_after_seconds:g}"
            )
        if not -(2**31) <= self.external_deletion_cost <= 2**31 - 1:
            raise SettingsError("external_deletion_cost: must fit in int32 (the annotation's range)")
        if self.external_deletion_cost >= 0:
            raise SettingsError(
                f"external_deletion_cost: must be negative so HPA scale-down removes external replicas before "
                f"on-prem ones (unannotated pods count as 0), got {self.external_deletion_cost}")
        for provider, cost in self.provider_deletion_costs.items():
            if not provider or isinstance(cost, bool) or not isinstance(cost, int) or not -(2**31) <= cost < 2**31:
                raise SettingsError(
                    f"provider_deletion_costs: {provider!r} must map to an int32 pod-deletion-cost, got {cost!r}")
        for service, minimum in self.handover_services.items():
            if not service or isinstance(minimum, bool) or not isinstance(minimum, int) or minimum < 1:
                raise SettingsError(
                    f"handover_services: {service!r} must map to a minReplicas >= 1, got {minimum!r}"
                )
        for index, pool in enumerate(self.inference_pools):
            if not pool or pool in self.inference_pools[:index]:
                raise SettingsError(f"inference_pools[{index}]: must be a distinct pool name, got {pool!r}")
        for name in (
            "namespace",
            "lease_name",
            "gpu_resource",
            "taint_value",
            "inference_namespace",
        ):
            if not getattr(self, name):
                raise SettingsError(f"{name}: must not be empty")

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], source: str = "settings") -> BurstSettings:
        """Build settings from a plain mapping (a parsed ConfigMap); unknown keys are errors, not ignored."""
        fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
        kwargs: dict[str, Any] = {}
        for key, value in data.items():
            if key not in fields:
                allowed = ", ".join(sorted(fields))
                raise SettingsError(f"{source}: unknown key {key!r}; allowed keys: {allowed}")
            kwargs[key] = _coerce(key, fields[key].type, value, source)
        try:
            return cls(**kwargs)
        except SettingsError as exc:
            raise SettingsError(f"{source}: {exc}") from None

    def to_mapping(self) -> dict[str, Any]:
        """The init fields as plain values, the shape `from_mapping` accepts."""
        return {
            f.name: (str(v) if isinstance(v := getattr(self, f.name), Cover | Sizing) else v)
            for f in dataclasses.fields(self)
            if f.init
        }

    def to_json(self) -> str:
        """Serialise the init fields (used by the deploying component for the ConfigMap)."""
        return json.dumps(self.to_mapping())


def _coerce(key: str, type_name: Any, value: Any, source: str) -> Any:
    """Accept the value types a ConfigMap realistically carries; reject bools posing as numbers."""
    kind = str(type_name)
    if kind == "dict[str, int]":
        if not isinstance(value, Mapping):
            raise SettingsError(f"{source}: key {key!r} must be a mapping of names to integers, got {value!r}")
        return {str(k): _coerce(f"{key}.{k}", "int", v, source) for k, v in value.items()}
    if kind == "tuple[str, ...]":
        if isinstance(value, str | bytes) or not isinstance(value, list | tuple):
            raise SettingsError(f"{source}: key {key!r} must be a list of names, got {value!r}")
        return tuple(_coerce(f"{key}[{i}]", "str", v, source) for i, v in enumerate(value))
    if kind == "dict[str, str]":
        if not isinstance(value, Mapping):
            raise SettingsError(f"{source}: key {key!r} must be a mapping of names to strings, got {value!r}")
        return {str(k): _coerce(f"{key}.{k}", "str", v, source) for k, v in value.items()}
    enums: dict[str, type[Cover] | type[Sizing]] = {"Cover": Cover, "Sizing": Sizing}
    if kind in enums:
        try:
            return enums[kind](value)
        except ValueError:
            allowed = " or ".join(repr(c.value) for c in enums[kind])
            raise SettingsError(f"{source}: key {key!r} must be {allowed}, got {value!r}") from None
    if kind == "int":
        if isinstance(value, bool) or not isinstance(value, int | str):
            raise SettingsError(f"{source}: key {key!r} must be an integer, got {value!r}")
        try:
            return int(value)
        except ValueError:
            raise SettingsError(f"{source}: key {key!r} must be an integer, got {value!r}") from None
    if kind == "float":
        if isinstance(value, bool) or not isinstance(value, int | float | str):
            raise SettingsError(f"{source}: key {key!r} must be a number of seconds, got {value!r}")
        try:
            number = float(value)
        except ValueError:
            raise SettingsError(f"{source}: key {key!r} must be a number of seconds, got {value!r}") from None
        if not math.isfinite(number):
            raise SettingsError(f"{source}: key {key!r} must be finite, got {value!r}")
        return number
    if not isinstance(value, str):
        raise SettingsError(f"{source}: key {key!r} must be a string, got {value!r}")
    return value
