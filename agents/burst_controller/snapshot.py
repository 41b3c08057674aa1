"""What the burst controller decides on: the cluster's aggregates (`Snapshot`), its own state between two
decisions (`BurstState`), and what a decision returns (`Decision`, `Action`). Data only, no I/O."""

from __future__ import annotations

import enum
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field


class Mode(enum.StrEnum):
    """Cluster-wide burst mode: OPEN = inference may land on virtual nodes (no burst taint)."""

    OPEN = "open"
    CLOSED = "closed"


class ActionKind(enum.StrEnum):
    OPEN_NODE = "open_node"
    CLOSE_NODE = "close_node"
    SET_DELETION_COST = "set_deletion_cost"
    SET_STANDBY = "set_standby"  # scale a service's standby Deployment to `replicas`
    UNGATE = "ungate"  # lift the handover scheduling gate from a training pod
    TAINT_PROVIDER = "taint_provider"  # add the provider's own taint to its node when it lacks it (never removed)
    SET_WARM = "set_warm"  # scale a service's warm-pool placeholder Deployment to `replicas`
    SET_RETURN = "set_return"  # scale a service's on-prem return Deployment (the bridge) to `replicas`
    EVICT = "evict"  # evict a replica (Eviction API): one moved home, or one on a node cleared for training
    RESERVE_NODE = "reserve_node"  # put the reservation taint (value `pool`, NoSchedule) on an on-prem node
    RELEASE_NODE = "release_node"  # take the reservation taint off an on-prem node


@dataclass(frozen=True)
class Action:
    """One change to apply. CLOSE_NODE always means the NoSchedule burst taint (never NoExecute)."""

    kind: ActionKind
    node: str = ""
    namespace: str = ""
    pod: str = ""
    deletion_cost: int = 0
    service: str = ""
    replicas: int = 0
    pool: str = ""


@dataclass(frozen=True)
class VirtualNode:
    """What the core needs to know about one virtual-kubelet node."""

    name: str
    provider: str = ""
    # Effect of our burst taint on the node, or None when absent (= open).
    taint_effect: str | None = None
    # GPUs requested by live pods bound to this node: they must fit on-prem before we close.
    gpus_in_use: int = 0
    changed_at: float | None = None
    # The node lacks its provider's own taint (something created it before its virtual kubelet did).
    provider_taint_missing: bool = False

    @property
    def closed(self) -> bool:
        return self.taint_effect is not None


@dataclass(frozen=True)
class PodRef:
    namespace: str
    name: str


@dataclass(frozen=True)
class PoolGpus:
    """One on-prem pool's share of the totals: free GPUs on its nodes, GPUs of training pods pending for it.

    `free_nodes` (free GPUs on a node -> how many schedulable nodes have that many; empty when unknown) and
    `unplaced_pods` (GPUs per unplaced training pod -> how many) let the handover tell whether waiting
    training fits the free GPUs node by node: 16 free GPUs spread 2 per node hold no 8-GPU worker.
    """

    free: int = 0
    pending_training: int = 0
    free_nodes: Mapping[int, int] = field(default_factory=dict)
    unplaced_pods: Mapping[int, int] = field(default_factory=dict)
    #: Free GPUs per leaf switch of the pool's topology (empty without one): where the handover clears first.
    free_by_leaf: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class NodeRoom:
    """An on-prem node holding main replicas of handover services: what evicting them frees there."""

    name: str
    #: Free GPUs now, those of replicas already leaving counted free.
    free: int
    #: The main replicas on it (ready or starting), with the GPUs each holds.
    replicas: tuple[tuple[PodRef, int], ...] = ()
    #: Its leaf switch ("" when its pool declares no topology).
    leaf: str = ""

    @property
    def room(self) -> int:
        """GPUs free once its replicas are gone."""
        return self.free + sum(gpus for _, gpus in self.replicas)


@dataclass(frozen=True)
class ServiceReplicas:
    """One inference service's pods as the handover sees them (main = the HPA's Deployment)."""

    min_replicas: int
    main_live: int = 0  # not terminal, not being deleted, scheduled or not
    main_ready: int = 0
    main_ready_external: int = 0
    main_ready_onprem: Mapping[str, int] = field(default_factory=dict)  # per on-prem pool ("" = no pool)
    # Main pods bound to an on-prem node of the pool and not Ready yet: a gang that reclaims the pool takes
    # them as surely as the Ready ones (they are often on the very GPUs training just freed).
    main_starting_onprem: Mapping[str, int] = field(default_factory=dict)
    standby_live: int = 0
    standby_ready: int = 0
    # GPUs one main replica requests: how many replicas a reclaimed GPU count can hold (1 = the upper bound).
    gpus_per_replica: int = 1
    # Placeholders of the warm pool (its Deployment's pods, any state): what `plan_warm` scales.
    warm_live: int = 0
    # Main pods being deleted (deletionTimestamp set, not gone): a move `plan_return` already made.
    main_leaving: int = 0
    # The on-prem return Deployment's pods (the bridge `plan_return` scales): live and Ready.
    return_live: int = 0
    return_ready: int = 0
    return_pending: int = 0  # of those, not bound to a node yet: their GPUs are not taken from the free ones yet
    # Standby pods the scheduler found no room for (unbound, PodScheduled=False/Unschedulable).
    standby_unschedulable: int = 0


@dataclass(frozen=True)
class InfeasibleGang:
    """Training that can never be placed: larger than its pool, or a pod larger than every node there.

    It holds nothing open and keeps no standby up; the shell reports it (metric and Event).
    """

    namespace: str
    name: str
    pool: str  # "" = any on-prem pool
    gpus: int
    reason: str
    pods: tuple[PodRef, ...] = ()


@dataclass(frozen=True)
class Snapshot:
    """Aggregates of the cluster at one instant; built in O(virtual nodes + pools) by the incremental view.

    `onprem_free_gpus` and `pending_training_gpus` are cluster-wide totals; `pools` breaks down the part
    of each that belongs to a known pool (nodes labelled with a pool; training pods whose required
    affinity names one pool). Whatever `pools` does not cover counts cluster-wide.
    """

    synced: bool
    observed_at: float | None
    onprem_allocatable_gpus: int
    onprem_free_gpus: int
    pending_inference_gpus: int = 0
    pending_training_gpus: int = 0
    virtual_nodes: Mapping[str, VirtualNode] = field(default_factory=dict)
    pods_needing_cost: tuple[PodRef, ...] = ()
    # The cost each of those pods should carry (its provider's, `BurstSettings.deletion_cost_for`); a pod not
    # listed takes external_deletion_cost.
    deletion_costs: Mapping[PodRef, int] = field(default_factory=dict)
    pools: Mapping[str, PoolGpus] = field(default_factory=dict)
    services: Mapping[str, ServiceReplicas] = field(default_factory=dict)
    # GPUs of training pods not bound to a node yet (gated, pending, or being placed by a reclaim), per pool
    # ("" = not confined to one pool); the pods behind the handover gate.
    unplaced_training: Mapping[str, int] = field(default_factory=dict)
    gated_pods: tuple[PodRef, ...] = ()
    # When each gated pod was created (epoch seconds, the API server's clock), so each waits its own timeout.
    gated_at: Mapping[PodRef, float] = field(default_factory=dict)
    # The pool each gated pod is confined to ("" = any); a pod missing here waits for every service at risk.
    gated_pool: Mapping[PodRef, str] = field(default_factory=dict)
    # GPUs of standby replicas on virtual nodes: they are scaled away, never sent home, so closing needs
    # no on-prem room for them.
    standby_external_gpus: int = 0
    # On-prem GPU nodes listed, eligible or not: 0 means the view has not seen any (blind), while listed
    # nodes with no allocatable GPUs mean every one is hot, cordoned or NotReady (the burst is needed).
    onprem_gpu_nodes: int = 0
    # Free GPUs node by node over every pool, and training confined to no pool, for the handover's fit test;
    # None when unknown (then the GPU count decides).
    poolless: PoolGpus | None = None
    # Training left out of every count above because it can never fit.
    infeasible: tuple[InfeasibleGang, ...] = ()
    # Per handover service, its ready main pods on virtual nodes, lowest pod-deletion-cost (dearest provider)
    # first: the ones the make-before-break return evicts first. Filled only while the return is on.
    external_replicas: Mapping[str, tuple[PodRef, ...]] = field(default_factory=dict)
    # Per pool with unplaced training, its nodes holding main replicas of handover services: where the handover
    # makes room for released training the scheduler leaves waiting (`plan_clear`).
    clearable: Mapping[str, tuple[NodeRoom, ...]] = field(default_factory=dict)
    # On-prem nodes carrying the handover's reservation taint -> the pool its value names (`plan_clear`).
    reserved: Mapping[str, str] = field(default_factory=dict)

    @property
    def external_gpus_in_use(self) -> int:
        return sum(v.gpus_in_use for v in self.virtual_nodes.values())


def effective_free_gpus(snapshot: Snapshot, inference_pools: Collection[str] = ()) -> int:
    """Free on-prem GPUs that inference can count on once pending training has taken what it needs.

    Per pool: max(0, free − pending training), because a gang pending for pool A can only take pool A's
    GPUs; idle GPUs in pool B stay available to inference however large A's backlog is (and A's backlog
    cannot drive B below zero). GPUs and pending pods that belong to no known pool are netted cluster-wide.
    With `inference_pools` (the pools inference is confined to) only those pools' room counts, and no GPUs of
    nodes outside every pool: an idle training pool is no room for a service that may not run there. Training
    confined to no pool may still land in them, so it is netted in full. With no pool breakdown and no
    confinement this is exactly free − pending training. O(pools).
    """
    free_rest = snapshot.onprem_free_gpus
    pending_rest = snapshot.pending_training_gpus
    total = 0
    for name, pool in snapshot.pools.items():
        free_rest -= pool.free
        pending_rest -= pool.pending_training
        if not inference_pools or name in inference_pools:
            total += max(0, pool.free - pool.pending_training)
    return total + (0 if inference_pools else free_rest) - pending_rest


@dataclass(frozen=True)
class StandbyRoom:
    """A service's standby as large as the providers hold: the scheduler found no room for its other pods while
    `placed` were bound (and ready), seen first at `since`."""

    placed: int
    since: float


@dataclass(frozen=True)
class BurstState:
    """Controller memory between decisions; recomputable from the cluster (see `state_from_snapshot`)."""

    mode: Mode
    changed_at: float | None = None
    low_since: float | None = None  # free on-prem GPUs below the open threshold since
    pending_since: float | None = None  # inference GPU pods pending since
    close_since: float | None = None  # close condition true since
    gated_since: float | None = None  # training pods behind the handover gate since (the oldest first sight)
    last_now: float | None = None
    # When this controller first saw each gated pod, on its own clock (shifted with it when it steps back).
    gated_seen: Mapping[PodRef, float] = field(default_factory=dict)
    # Per handover service, where its main replica count changed ((time, count), oldest first), back to the
    # last change before the ramp window: what `expected_ramp` reads (`track_replicas` keeps it).
    replicas_seen: Mapping[str, tuple[tuple[float, int], ...]] = field(default_factory=dict)
    # Per pool: since when released training there has waited unplaced where it does not fit the free GPUs.
    stalled_since: Mapping[str, float] = field(default_factory=dict)
    # Per service: the standby the providers held when the scheduler found no room for the rest (`StandbyRoom`).
    standby_room: Mapping[str, StandbyRoom] = field(default_factory=dict)
    # Per reserved node: since when this controller has seen it reserved (its own clock; a node reserved before
    # it led counts from its first sight).
    reserved_since: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Decision:
    actions: tuple[Action, ...]
    state: BurstState
    reasons: tuple[str, ...]
    flipped: Mode | None = None  # the mode entered by this decision, if any
    effective_free_gpus: int | None = None  # free on-prem GPUs minus pending training demand, per pool
    close_needs_gpus: int | None = None  # free GPUs the close condition requires right now
    standby: Mapping[str, int] = field(default_factory=dict)  # standby replicas wanted per service
    ramp: Mapping[str, int] = field(default_factory=dict)  # replicas the standby adds for the expected ramp
    warm: Mapping[str, int] = field(default_factory=dict)  # warm-pool placeholders wanted per service
    home: Mapping[str, int] = field(default_factory=dict)  # on-prem return (bridge) pods wanted per service
