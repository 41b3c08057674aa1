"""The API objects the burst controller's view reads, as it reads them: a node's role and GPUs, a pod's GPUs,
pool, service and gang, and the records the view keeps per object. Pure functions over the API's own JSON."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, TypeVar

from agents.burst_controller.contract import VK_PROVIDER_TAINT, BurstSettings
from agents.burst_controller.snapshot import NodeRoom, PodRef, ServiceReplicas

ONPREM = "onprem"
VIRTUAL = "virtual"
OTHER = "other"  # CPU-only or unlabelled nodes: no part in the decision
MISSING = "missing"  # placeholder for a node that pods name but the node list does not have (yet)

# Taints the node lifecycle controller and `kubectl cordon` set: GPUs behind them are not schedulable.
UNSCHEDULABLE_TAINTS = frozenset(
    {"node.kubernetes.io/unschedulable", "node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"}
)
BLOCKING_EFFECTS = frozenset({"NoSchedule", "NoExecute"})
TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})

Obj = Mapping[str, Any]
K = TypeVar("K", str, int)


def parse_gpus(value: Any) -> int:
    """Quantity of an extended resource; GPUs are whole numbers, anything unparsable counts as none."""
    if value is None or isinstance(value, bool):
        return 0
    if isinstance(value, int):
        return max(value, 0)
    try:
        return max(int(str(value)), 0)
    except ValueError:
        try:
            number = float(str(value))
        except ValueError:
            return 0
        return max(math.ceil(number), 0) if math.isfinite(number) else 0


def parse_timestamp(value: Any) -> float | None:
    """Epoch seconds from the changed-at annotation (RFC 3339 or plain seconds); None when unreadable."""
    if not isinstance(value, str) or not value:
        return None
    try:
        return float(value)
    except ValueError:
        pass
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def burst_effect(effects: list[str]) -> str | None:
    """The effect the core sees for our taint on a node: None when absent, "NoSchedule" only when that is the one
    copy; otherwise the first other effect, so that any extra copy (NoExecute next to NoSchedule, in any order)
    reads as a mismatch and the node is rewritten to the single NoSchedule copy."""
    if not effects:
        return None
    if effects == ["NoSchedule"]:
        return "NoSchedule"
    # Only NoSchedule copies, more than one (the API refuses duplicates, a bad view must not hide them).
    return next((e for e in effects if e != "NoSchedule"), "NoSchedule (duplicated)")


def pod_gpus(pod: Obj, gpu_resource: str) -> int:
    """GPUs a pod holds: sum over app containers, or the largest init container if that is bigger."""
    spec = pod.get("spec") or {}

    def container_gpus(c: Obj) -> int:
        res = c.get("resources") or {}
        requests = res.get("requests") or {}
        limits = res.get("limits") or {}
        return parse_gpus(requests.get(gpu_resource, limits.get(gpu_resource)))

    app = sum(container_gpus(c) for c in spec.get("containers") or ())
    init = max((container_gpus(c) for c in spec.get("initContainers") or ()), default=0)
    return max(app, init)


def pod_pool(pod: Obj, pool_label: str) -> str:
    """The one pool a pod is confined to, or "" when it may land in more than one (or any).

    A nodeSelector on the pool label decides; otherwise every required nodeSelectorTerm (terms are ORed)
    must pin the label to the same single value with `In`. O(size of the pod's affinity), not of the cluster.
    """
    spec = pod.get("spec") or {}
    selected = (spec.get("nodeSelector") or {}).get(pool_label)
    if selected:
        return str(selected)
    node_affinity = (spec.get("affinity") or {}).get("nodeAffinity") or {}
    required = node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution") or {}
    found = ""
    for term in required.get("nodeSelectorTerms") or ():
        pinned = ""
        for expr in (term or {}).get("matchExpressions") or ():
            values = expr.get("values") or []
            if expr.get("key") == pool_label and expr.get("operator") == "In" and len(values) == 1:
                pinned = str(values[0])
        if not pinned or (found and pinned != found):
            return ""
        found = pinned
    return found


@dataclass(slots=True)
class NodeEntry:
    name: str
    kind: str = MISSING
    pool: str = ""
    leaf: str = ""  # its leaf switch (the pool's topology label), "" when the pool declares none
    allocatable: int = 0
    eligible: bool = False
    requested: int = 0
    provider: str = ""
    taint_effect: str | None = None
    changed_at: float | None = None
    taints: list[dict[str, Any]] = field(default_factory=list)
    provider_taint_missing: bool = False
    resource_version: str = ""
    pods: set[str] = field(default_factory=set)
    reserved: str | None = None  # the handover's reservation on an on-prem node: the pool it names

    def forget(self) -> None:
        """The node went away: only its pods stay (parked on it until they go too)."""
        self.kind, self.allocatable, self.eligible, self.taints = MISSING, 0, False, []
        self.pool, self.leaf, self.reserved = "", "", None

    def onprem_alloc(self) -> int:
        return self.allocatable if self.kind == ONPREM and self.eligible else 0

    def onprem_free(self) -> int:
        return max(self.allocatable - self.requested, 0) if self.kind == ONPREM and self.eligible else 0


@dataclass(slots=True, frozen=True)
class PodEntry:
    key: str
    namespace: str
    name: str
    node: str
    gpus: int
    workload: str
    pool: str  # the one pool a pending training pod is confined to; "" = any (counted cluster-wide)
    live: bool
    unschedulable: bool
    deleting: bool
    cost: str | None  # the pod-deletion-cost annotation as found
    gated: bool = False  # a training pod behind the handover scheduling gate
    created: float | None = None  # creationTimestamp of a gated pod (its handover timeout counts from it)
    service: str = ""  # the handover service this inference pod belongs to ("" = none we track)
    standby: bool = False
    ready: bool = False
    gang: str = ""  # "<namespace>/<PodGroup>" of unplaced training (its own key when it names none)
    warm: bool = False  # a warm-pool placeholder (role=warm): counted for its service and nothing else
    home: bool = False  # a pod of the service's on-prem return bridge (role=return)

    @property
    def waiting(self) -> bool:
        """Training demand not placed yet: unschedulable, or held at the handover gate."""
        return (self.unschedulable or self.gated) and self.gpus > 0


@dataclass(slots=True)
class ServiceCounts:
    """Running sums for one handover service; updated by pod contributions like the GPU totals."""

    main_live: int = 0
    main_ready: int = 0
    main_ready_external: int = 0
    main_ready_onprem: dict[str, int] = field(default_factory=dict)
    main_starting_onprem: dict[str, int] = field(default_factory=dict)  # bound on-prem, not Ready yet
    standby_live: int = 0
    standby_ready: int = 0
    standby_unschedulable: int = 0
    warm_live: int = 0  # the warm pool's placeholders
    main_leaving: int = 0  # main pods being deleted (an eviction the return already made)
    return_live: int = 0  # the return bridge's pods
    return_ready: int = 0
    return_pending: int = 0  # bridge pods not bound to a node yet
    # Ready main pods on virtual nodes: pod key -> (ref, its deletion cost), for the return's evictions.
    external: dict[str, tuple[PodRef, int]] = field(default_factory=dict)

    def replicas(self, min_replicas: int) -> ServiceReplicas:
        """The core's view of the service (`snapshot.ServiceReplicas`)."""
        return ServiceReplicas(
            min_replicas=min_replicas, main_live=self.main_live, main_ready=self.main_ready,
            main_ready_external=self.main_ready_external, main_ready_onprem=dict(self.main_ready_onprem),
            main_starting_onprem=dict(self.main_starting_onprem), standby_live=self.standby_live,
            standby_ready=self.standby_ready, gpus_per_replica=max(self.gpus, default=1) or 1,
            warm_live=self.warm_live, main_leaving=self.main_leaving, return_live=self.return_live,
            return_ready=self.return_ready, return_pending=self.return_pending,
            standby_unschedulable=self.standby_unschedulable)
    # Live main pods per GPU request: the largest is what one replica reclaims (the handover's sizing).
    gpus: dict[int, int] = field(default_factory=dict)


@dataclass(slots=True)
class GangEntry:
    """Running sums of one gang's unplaced pods, to tell whether it can ever fit its pool."""

    namespace: str
    name: str
    pool: str
    waiting: int = 0  # GPUs counted in pending training
    unplaced: int = 0  # GPUs counted in unplaced training
    sizes: dict[int, int] = field(default_factory=dict)  # GPUs per unplaced pod -> pods
    pods: set[PodRef] = field(default_factory=set)


@dataclass(frozen=True)
class NodeRecord:
    """What the shell needs to patch a node without a read first: its taints and resourceVersion."""

    name: str
    taints: tuple[dict[str, Any], ...]
    resource_version: str
    provider: str = ""


def add_count(counter: dict[K, int], key: K, delta: int) -> None:
    """Add to a sparse counter, dropping keys that reach zero (so equal sums give equal snapshots)."""
    left = counter.get(key, 0) + delta
    if left:
        counter[key] = left
    else:
        counter.pop(key, None)


def name_of(obj: Obj) -> str:
    return str((obj.get("metadata") or {}).get("name", ""))


@dataclass(slots=True)
class NodeReplicas:
    """Main replicas of handover services on on-prem nodes (node -> pod key -> (ref, GPUs)), and the GPUs of those
    being deleted there (free soon): what the handover may clear for training the scheduler leaves waiting."""

    on: dict[str, dict[str, tuple[PodRef, int]]] = field(default_factory=dict)
    leaving: dict[str, int] = field(default_factory=dict)

    def count(self, node: str, key: str, ref: PodRef, gpus: int, sign: int) -> None:
        replicas = self.on.setdefault(node, {})
        if sign > 0:
            replicas[key] = (ref, gpus)
            return
        replicas.pop(key, None)
        if not replicas:
            del self.on[node]

    def nodes(self) -> list[str]:
        """Nodes with replicas, or with replicas leaving (a node being cleared still makes its room)."""
        return [*self.on, *(n for n, gpus in self.leaving.items() if gpus > 0 and n not in self.on)]

    def rooms(self, nodes: Mapping[str, tuple[str, int, str]]) -> dict[str, tuple[NodeRoom, ...]]:
        """Per pool, a room for each of ``nodes`` (node -> (pool, free GPUs, leaf)), by name."""
        out: dict[str, list[NodeRoom]] = {}
        for node in sorted(nodes):
            pool, free, leaf = nodes[node]
            replicas = tuple(sorted(self.on.get(node, {}).values(), key=lambda r: r[0].name))
            out.setdefault(pool, []).append(NodeRoom(node, free + self.leaving.get(node, 0), replicas, leaf))
        return {pool: tuple(rooms) for pool, rooms in out.items()}


def read_node(s: BurstSettings, rec: NodeEntry, node: Obj) -> None:
    """Read one node's role, pool, leaf, GPUs, schedulability, taints and the handover's reservation into ``rec``."""
    meta = node.get("metadata") or {}
    labels = meta.get("labels") or {}
    spec = node.get("spec") or {}
    status = node.get("status") or {}
    taints = [t for t in spec.get("taints") or () if isinstance(t, dict)]
    allocatable = parse_gpus((status.get("allocatable") or {}).get(s.gpu_resource))
    provider = labels.get(s.provider_label, "")
    location = labels.get(s.location_label)
    is_virtual = (
        location == "external"
        or bool(provider)
        or labels.get("type") == "virtual-kubelet"
        or any(t.get("key") == VK_PROVIDER_TAINT for t in taints)
    )
    if is_virtual:
        rec.kind = VIRTUAL
        rec.provider = provider or next(
            (str(t.get("value", "")) for t in taints if t.get("key") == VK_PROVIDER_TAINT), ""
        )
    elif location == ONPREM or allocatable > 0:
        rec.kind = ONPREM
    else:
        rec.kind = OTHER
    rec.allocatable = allocatable
    rec.pool = str(labels.get(s.pool_label, "")) if rec.kind == ONPREM else ""
    rec.leaf = str(labels.get(s.leaf_label, "")) if rec.kind == ONPREM else ""
    # The health guard's quarantine (fatal or degraded), its switch-fault fence and a warm spare's taint keep
    # training off the node, so its GPUs are no on-prem headroom; inference may still run on a degraded node or
    # a spare, but needs no count for it: inference that fits there schedules there and never shows as pending.
    blocking_keys = (s.thermal_taint_key, s.health_taint_key, s.switch_fault_taint_key, s.spare_taint_key)
    blocked = any(
        t.get("effect") in BLOCKING_EFFECTS
        and (t.get("key") in blocking_keys or t.get("key") in UNSCHEDULABLE_TAINTS)
        for t in taints
    )
    not_ready = any(
        c.get("type") == "Ready" and c.get("status") != "True" for c in status.get("conditions") or ()
    )
    rec.eligible = not spec.get("unschedulable", False) and not blocked and not not_ready
    rec.taint_effect = burst_effect([str(t.get("effect")) for t in taints if t.get("key") == s.taint_key])
    rec.changed_at = parse_timestamp((meta.get("annotations") or {}).get(s.changed_at_annotation))
    rec.taints = taints
    wanted = s.provider_taints.get(rec.provider) if rec.kind == VIRTUAL else None
    rec.provider_taint_missing = wanted is not None and not any(
        f"{t.get('key')}={t.get('value', '')}" == wanted for t in taints
    )
    rec.resource_version = str(meta.get("resourceVersion", ""))
    rec.reserved = next((str(t.get("value", "")) for t in taints if t.get("key") == s.reserved_taint_key),
                        None) if rec.kind == ONPREM else None
