"""The burst controller's contract with the rest of the project: names, bounds, the settings type and defaults.

No I/O: the stack's `burst` section (`BurstTunables`, which the stack config embeds as it is), the deploying
component, the simulator and the controller itself (`BurstSettings`: the tunables plus what the stack derives)
read their names, bounds and defaults from here, so they cannot drift apart. Reading the settings file is
`cli.load_file`'s job. Label and annotation keys are derived from the stack's label prefix in one place
(`BurstKeys`).

Every knob has a default that encodes the design (NoSchedule-only taint, asymmetric hysteresis); a bad value
fails at preview (the stack validates the same model) and again at start, with an error that names the key and
the file, never later at runtime.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Annotated, Any, Self

from pydantic import AfterValidator, BeforeValidator, Field, ValidationError, model_validator

from agents import node_taints
from agents.defaults import DEFAULT_GPU_RESOURCE
from agents.defaults import DEFAULT_LABEL_PREFIX as DEFAULT_LABEL_PREFIX
from agents.kit.settings import DnsLabel, Number, SettingsModel, Share, settings_error
from agents.kit.settings import SettingsError as SettingsError

POD_DELETION_COST_ANNOTATION = "controller.kubernetes.io/pod-deletion-cost"
"""Upstream annotation the ReplicaSet controller reads to choose which pods go first on scale-down."""

GANG_ANNOTATION = "scheduling.k8s.io/group-name"
"""PodGroup of a pod, set by Volcano's job controller (and by our kube-batch template): one gang per value."""

VK_PROVIDER_TAINT = "virtual-kubelet.io/provider"
"""virtual-kubelet's own default taint: the provider's, never ours to manage."""


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
    def switch_fault_taint(self) -> str:
        """The health guard's fence on a leaf whose switch is at fault: no training lands there either."""
        return node_taints.switch_fault_taint_key(self.prefix)

    @property
    def spare_taint(self) -> str:
        """A pool's warm spare (the node-pool agent's taint): inference tolerates it, training does not."""
        return node_taints.spare_taint_key(self.prefix)

    @property
    def leaf(self) -> str:
        """A GPU node's leaf switch (the node-pool agent writes it from the pool's topology)."""
        return node_taints.leaf_label_key(self.prefix)

    @property
    def spine(self) -> str:
        """The spine switch above a GPU node's leaf."""
        return node_taints.spine_label_key(self.prefix)

    @property
    def reserved_taint(self) -> str:
        """The handover's reservation of a node it cleared for waiting training: training tolerates it."""
        return node_taints.reserved_taint_key(self.prefix)

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


Seconds = Annotated[float, Number, Field(ge=0)]
PositiveSeconds = Annotated[float, Number, Field(gt=0)]
Count = Annotated[int, Number, Field(ge=0)]


def _external_cost(value: int) -> int:
    if value >= 0:
        raise ValueError(
            f"must be negative so HPA scale-down removes external replicas before on-prem ones (unannotated pods "
            f"count as 0), got {value}")
    return value


class HandoverTunables(SettingsModel):
    """Make before break, as the stack's `burst.handover` sets it (that section is this model plus `enabled`):
    training pods wait behind a scheduling gate until a standby on virtual nodes covers the inference replicas
    they are about to take away."""

    timeout_seconds: Seconds = 300.0
    """Longest a gang waits at the gate, and a close waits for the standby, before going ahead without it
    (seconds): training outranks inference."""
    cover: Cover = Cover.CURRENT
    """`current`: the standby replaces every replica at risk, up to the service's current count (capacity
    survives the handover); `minimum`: only up to minReplicas (the floor survives, on fewer external GPUs)."""
    sizing: Sizing = Sizing.POOL
    """`pool`: a waiting gang puts at risk every ready replica of its pool; `displaced`: only the replicas on
    the GPUs it lacks (node by node, at most that many per service). Measured at 4,096 GPUs × 30 days (bench/sim,
    synthetic and GenTD26): `displaced` saves 0.6-2.0 % of external GPU·h but loses 0.002 points of availability
    (the whole-pool standby also serves traffic while it waits), so `pool` stays the default."""
    return_batch: Count = 0
    """External replicas per service the standby covers while they return home (those the descheduler moves
    at once, e.g. its `maxPodsPerNamespace`); 0: every external replica. A cap of 8 saves 0.2-1.2 % of external
    GPU·h and loses up to 0.003 points of availability (measured as above), so 0 stays the default."""
    ramp_seconds: Seconds = 0.0
    """The standby also covers the demand ramp expected while it starts: the rise of each service's replica
    count over the last `rampWindowSeconds`, carried this far ahead (the external start, 180 s in the simulator),
    at most the current count. 0 (default): the standby replaces what the gang takes and no more. On the demand
    families (bench/bench_families.py, 4,096 GPUs × 7 days) 180 s narrows steep ramps' gap by 0.014 points but
    widens decays' by 0.035 (the standby takes external room the HPA's own scale-ups need) for 3-18 % more
    standby GPU·h, so it stays off."""
    ramp_window_seconds: Seconds = 300.0
    """How far back the demand ramp is read (seconds)."""
    clear_after_seconds: Seconds = 0.0
    """Released training still unplaced this long in a pool where it does not fit the free GPUs node by node: the
    controller evicts the replicas on the fewest nodes that make room for it (the Eviction API: the PDBs decide).
    Volcano 1.14.1 places a gang that needs both empty nodes and nodes inference holds neither by `allocate` (it
    discards a gang it cannot place whole) nor by `reclaim` (it places only onto nodes with pods it may reclaim), so
    without this such a gang waits for good (docs/scheduling.md). 0 (default) turns it off: on the prod stack's
    size it gained nothing, since each evicted replica's replacement was bound to the GPUs its eviction freed before
    Volcano's next session could place the gang whole (the burst run at scale: hundreds of evictions in ten minutes,
    the gang never running, docs/burst.md). Each node it clears is reserved first (`reserveSeconds`)."""
    reserve_seconds: PositiveSeconds = 600.0
    """A node the clearing chooses carries the reservation taint `<labelPrefix>/reserved=<pool>:NoSchedule`
    (training tolerates it, inference does not) before any replica on it is evicted, so the replacements cannot
    take back the GPUs the evictions free; it comes off once the pool's released training is placed, and after this
    long at most (seconds): then the pool's nodes are given back and the clearing waits `clearAfterSeconds` again,
    so training the scheduler will not place for another reason (its queue's quota) cannot idle GPUs for good."""
    standby_retry_seconds: PositiveSeconds = 120.0
    """Once the scheduler finds no room on the providers for a standby's other pods (every placed one ready), while
    the service's external replicas are to come home, the standby asks for only the pods it placed, for this long,
    then for its whole size again. Unplaced standby pods count as expected in the service's PodDisruptionBudget, so
    while they exist it allows no disruption: the return home would wait for good (found by the burst run at
    scale). With nothing to bring home the unplaced pods stay, so the standby grows the moment room appears."""

    def tunables(self) -> dict[str, Any]:
        """The values of this class's own keys (the stack's section holds `enabled` too)."""
        return {name: getattr(self, name) for name in HandoverTunables.model_fields}


class BurstTunables(SettingsModel):
    """What the stack's `burst` section sets for the controller: thresholds are GPU counts, durations seconds.

    The stack config's section derives from this class, so these keys, bounds, defaults and descriptions are
    the stack's too; the defaults are the reviewed values (open below 8, close at 32, resync 30 s).
    """

    taint_value: DnsLabel = "closed"
    """Value of the burst taint `<labelPrefix>/burst=<value>:NoSchedule` that the controller keeps on every
    virtual node while the burst is closed."""
    open_below_free_gpus: Count = 8
    """Open the burst when the effective free on-prem GPUs (per pool, free minus what pending training needs; only
    the pools the inference services may run in) stay below this for `openHoldSeconds`."""
    close_at_free_gpus: Annotated[int, Number, Field(gt=0)] = 32
    """Close the burst when the effective free on-prem GPUs reach this plus the GPUs inference uses externally,
    for `closeHoldSeconds`; above `openBelowFreeGpus`, so the taint does not flap."""
    open_hold_seconds: Seconds = 60.0
    """How long the shortage must last before the burst opens (seconds)."""
    close_hold_seconds: Seconds = 600.0
    """How long the plenty must last before the burst closes and external replicas go home (seconds)."""
    pending_grace_seconds: Seconds = 5.0
    """Inference GPUs pending this long open the burst whatever the free count (seconds). Short: the scheduler
    marks a pod Unschedulable only after a full cycle (and a preemption attempt), and opening only removes a
    taint (no GPU is bought until a pod lands); every second here adds to a cold external start."""
    external_deletion_cost: Annotated[int, Number, Field(ge=-(2**31)), AfterValidator(_external_cost)] = -100
    """`pod-deletion-cost` the controller gives inference replicas on virtual nodes: negative, so an HPA
    scale-down removes them before on-prem ones; with priced providers the dearer ones get less."""
    resync_seconds: PositiveSeconds = 30.0
    """How often the controller lists everything again, repairing what a missed watch event left wrong
    (seconds)."""
    stale_after_seconds: Annotated[float, Number, Field(gt=0, le=MAX_STALE_AFTER_SECONDS)] = 120.0
    """With cluster data older than this (seconds) the controller leaves the taints as they are; a longer gap
    between two decisions restarts the holds."""
    tick_seconds: Annotated[float, Number, Field(gt=0, le=MAX_TICK_SECONDS)] = 5.0
    """How often the controller decides (seconds); hold timers and the handover timeout are as precise as
    this."""
    warm_pool_share: Share = 0.0
    """Warm external capacity: while the burst is open, each handover service keeps this share of its replicas
    (rounded up) as placeholders on virtual nodes (its `<service>-warm` Deployment, the lowest priority), so a
    scale-up landing on one starts warm in seconds instead of a cold external start of minutes. At every
    service's maxReplicas it must fit on the GPUs of the providers it may run on. 0: none; what each size costs
    and serves is in bench/report.md."""
    warm_pool_ramp_seconds: Seconds = 0.0
    """The warm pool also holds the rise each service's replica count is expected to make over this many
    seconds (its rise over the last 5 minutes carried forward), at most its current count; 0: share alone."""
    return_surge_share: Share = 0.0
    """Make-before-break return: external replicas come home while the burst is open once on-prem has room
    training does not need; each handover service's on-prem `<service>-return` Deployment (at most this share
    of its replicas, rounded up: the surge the HPA tolerates) starts the replacements first, the controller
    evicts an external replica only for a Ready one. 0: no bridge, the descheduler's return after the close;
    what it moves is in bench/report.md."""

    @model_validator(mode="after")
    def _hysteresis_and_timing(self) -> Self:
        """The rules between the tunables, spelled as the reader of this model spells its keys."""
        k = self.spell
        if self.close_at_free_gpus <= self.open_below_free_gpus:
            raise ValueError(
                f"{k('close_at_free_gpus')}: must exceed {k('open_below_free_gpus')} ({self.open_below_free_gpus}) "
                f"or the taint flaps, got {self.close_at_free_gpus}")
        if self.tick_seconds >= self.stale_after_seconds:
            raise ValueError(
                f"{k('tick_seconds')}: must be below {k('stale_after_seconds')} ({self.stale_after_seconds:g}), "
                f"otherwise every decision sees data older than the limit, got {self.tick_seconds:g}")
        watch = getattr(self, "watch_timeout_seconds", WATCH_TIMEOUT_SECONDS)
        if watch >= self.stale_after_seconds:
            raise ValueError(
                f"{k('stale_after_seconds')}: must exceed {k('watch_timeout_seconds')} ({watch}), otherwise a quiet "
                f"cluster looks stale, got {self.stale_after_seconds:g}")
        return self

    def tunables(self) -> dict[str, Any]:
        """The values of this class's own keys (a stack section holds more: its deployment's)."""
        return {name: getattr(self, name) for name in BurstTunables.model_fields}


def _deletion_costs(value: Any) -> Any:
    if isinstance(value, Mapping):
        for provider, cost in value.items():
            if not provider or isinstance(cost, bool) or not isinstance(cost, int) or not -(2**31) <= cost < 2**31:
                raise ValueError(f"{provider!r} must map to an int32 pod-deletion-cost, got {cost!r}")
    return value


def _handover_services(value: dict[str, int]) -> dict[str, int]:
    for service, minimum in value.items():
        if not service or minimum < 1:
            raise ValueError(f"{service!r} must map to a minReplicas >= 1, got {minimum!r}")
    return value


def _label_prefix(value: str) -> str:
    if not value or "/" in value:
        raise ValueError(f"must be a DNS prefix without '/', got {value!r}")
    return value


NonEmpty = Annotated[str, Field(min_length=1)]


class BurstSettings(BurstTunables):
    """All settings of the controller: the stack's tunables plus what the stack derives for it (names, the
    providers' taints and prices, the handover services) and the agent's own timings."""

    label_prefix: Annotated[str, AfterValidator(_label_prefix)] = DEFAULT_LABEL_PREFIX
    # Empty means "<label_prefix>/burst", so the key follows the prefix.
    taint_key: str = ""
    gpu_resource: NonEmpty = DEFAULT_GPU_RESOURCE
    # Provider name -> the pod-deletion-cost of replicas on its virtual node, lower for a dearer provider, so a
    # scale-down removes the dearest external replicas first; a provider not listed takes external_deletion_cost.
    provider_deletion_costs: Annotated[dict[str, int], BeforeValidator(_deletion_costs)] = Field(default_factory=dict)
    max_cost_patches_per_cycle: Count = 50
    watch_timeout_seconds: Annotated[int, Number, Field(gt=0)] = WATCH_TIMEOUT_SECONDS
    namespace: NonEmpty = "gpu-burst"
    lease_name: NonEmpty = "burst-controller"
    lease_duration_seconds: PositiveSeconds = 15.0
    renew_deadline_seconds: PositiveSeconds = 10.0
    retry_period_seconds: PositiveSeconds = 2.0
    request_timeout_seconds: PositiveSeconds = 10.0
    api_retry_attempts: Annotated[int, Number, Field(gt=0)] = 5
    backoff_base_seconds: Seconds = 0.5
    backoff_max_seconds: PositiveSeconds = 10.0
    # An action that failed (after its immediate retries) is not tried again before this delay, doubled per
    # further failure up to the max, with jitter: a patch the API refuses for good cannot hammer it.
    action_backoff_base_seconds: Seconds = 2.0
    action_backoff_max_seconds: PositiveSeconds = 300.0
    # Make-before-break handover: inference service -> minReplicas. Training pods carry the handover
    # scheduling gate; the controller scales each service's standby Deployment on virtual nodes until the
    # replicas a gang (or the return home) is about to take away are covered, and only then lifts the gate
    # or closes the burst. Empty: no standby is managed and gated pods are released at once.
    handover_services: Annotated[dict[str, Annotated[int, Number]], AfterValidator(_handover_services)] = Field(
        default_factory=dict)
    # Provider name -> its own taint as "key=value". A virtual kubelet taints its node only when it creates
    # it; a node that something else created first (the stack's label patch can) would be open to every pod.
    # The controller adds a missing provider taint (NoSchedule) and never removes or changes one.
    provider_taints: dict[str, str] = Field(default_factory=dict)
    handover: HandoverTunables = Field(default_factory=lambda: HandoverTunables())
    inference_namespace: NonEmpty = "inference"
    # The on-prem pools inference may run in (the pools its services are confined to); empty = every pool, and
    # GPUs on nodes of no pool. Free GPUs elsewhere are no room for inference, so they cannot keep the burst shut.
    inference_pools: tuple[str, ...] = ()

    def __init__(self, **data: Any) -> None:
        """Direct construction (tests, the simulator) fails as a ConfigMap does: a `SettingsError` naming the key.
        (Only on the agent's model: pydantic calls a custom ``__init__`` for nested models too.)"""
        try:
            super().__init__(**data)
        except ValidationError as exc:
            raise settings_error(type(self), exc, "") from None

    @model_validator(mode="before")
    @classmethod
    def _default_taint_key(cls, data: Any) -> Any:
        """An empty taint key follows the label prefix: ``<label_prefix>/burst``."""
        if isinstance(data, dict) and not (data.get("taint_key") or data.get("taintKey")):
            prefix = data.get("label_prefix", data.get("labelPrefix", DEFAULT_LABEL_PREFIX))
            data = {k: v for k, v in data.items() if k != "taintKey"}
            data["taint_key"] = f"{prefix}/burst" if isinstance(prefix, str) else ""
        return data

    @model_validator(mode="after")
    def _agent_rules(self) -> Self:
        if "/" not in self.taint_key:
            raise ValueError(f"taint_key: must look like '<prefix>/<name>', got {self.taint_key!r}")
        if self.taint_key.startswith(f"{VK_PROVIDER_TAINT.split('/')[0]}/"):
            raise ValueError("taint_key: the provider's own taint is not ours to manage")
        for provider, taint in self.provider_taints.items():
            key, sep, _ = taint.partition("=")
            if not sep or not key or "/" not in key:
                raise ValueError(f"provider_taints.{provider}: must be '<prefix>/<name>=<value>', got {taint!r}")
            if key == self.taint_key:
                raise ValueError(f"provider_taints.{provider}: {self.taint_key!r} is the burst taint, not a provider's")
        for index, pool in enumerate(self.inference_pools):
            if not pool or pool in self.inference_pools[:index]:
                raise ValueError(f"inference_pools[{index}]: must be a distinct pool name, got {pool!r}")
        if self.renew_deadline_seconds >= self.lease_duration_seconds:
            raise ValueError(
                "renew_deadline_seconds: must be below lease_duration_seconds "
                f"({self.lease_duration_seconds:g}) so a leader steps down before another can take over")
        return self

    @classmethod
    def deployed(cls, tunables: BurstTunables, source: str, **derived: Any) -> BurstSettings:
        """The settings the stack deploys: its section's tunables as they are, plus what it derives."""
        return cls.parse({**tunables.tunables(), **derived}, source=source)

    @cached_property
    def keys(self) -> BurstKeys:
        return BurstKeys(self.label_prefix)

    @cached_property
    def pool_label(self) -> str:
        return self.keys.pool

    @cached_property
    def location_label(self) -> str:
        return self.keys.location

    @cached_property
    def provider_label(self) -> str:
        return self.keys.provider

    @cached_property
    def workload_label(self) -> str:
        return self.keys.workload

    @cached_property
    def thermal_taint_key(self) -> str:
        return self.keys.thermal_taint

    @cached_property
    def health_taint_key(self) -> str:
        return self.keys.health_taint

    @cached_property
    def switch_fault_taint_key(self) -> str:
        return self.keys.switch_fault_taint

    @cached_property
    def spare_taint_key(self) -> str:
        return self.keys.spare_taint

    @cached_property
    def reserved_taint_key(self) -> str:
        return self.keys.reserved_taint

    @cached_property
    def leaf_label(self) -> str:
        return self.keys.leaf

    @cached_property
    def changed_at_annotation(self) -> str:
        return self.keys.changed_at_annotation

    @cached_property
    def service_label(self) -> str:
        return self.keys.service

    @cached_property
    def role_label(self) -> str:
        return self.keys.role

    @cached_property
    def handover_gate(self) -> str:
        return self.keys.handover_gate

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

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], source: str = "settings") -> BurstSettings:
        """Build settings from a plain mapping (a parsed ConfigMap); unknown keys are errors, not ignored."""
        return cls.parse(data, source=source)

    def to_mapping(self) -> dict[str, Any]:
        """Every key as a plain value, the shape `from_mapping` accepts."""
        return self.model_dump(mode="json")

    def to_json(self) -> str:
        """Serialise the settings (used by the deploying component for the ConfigMap)."""
        return json.dumps(self.to_mapping())
