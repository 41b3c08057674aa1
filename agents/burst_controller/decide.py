"""The pure decision core: cluster aggregates + previous state + clock in, actions + new state out.

No I/O, no wall clock, no randomness: the shell, the tests and the simulator all call `decide` the same way.

One cluster-wide mode (open/closed) applies to every virtual node. The trigger, on-prem scarcity, is global,
and which provider a pod lands on is already decided by the scheduler (preferred affinity) and by the
pod-deletion-cost; opening only some providers would add a second placement policy that fights the first.
Per-node reconciliation still happens: a virtual node whose taint disagrees with the mode (new node,
hand edit, a NoExecute variant) is brought back in line.

Make-before-break handover: training pods are created behind a scheduling gate, and inference replicas
that a gang is about to reclaim (or that the descheduler is about to move home) count as at risk. Each
service's standby Deployment, pinned to virtual nodes, is scaled to cover its at-risk replicas; only when
the standby is ready does the core lift the gate (or close the burst), so ready replicas never drop below
the service's minimum. A timeout bounds the wait: training outranks inference.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from agents.burst_controller.settings import BurstSettings


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


@dataclass(frozen=True)
class ServiceReplicas:
    """One inference service's pods as the handover sees them (main = the HPA's Deployment)."""

    min_replicas: int
    main_live: int = 0  # not terminal, not being deleted, scheduled or not
    main_ready: int = 0
    main_ready_external: int = 0
    main_ready_onprem: Mapping[str, int] = field(default_factory=dict)  # per on-prem pool ("" = no pool)
    standby_live: int = 0
    standby_ready: int = 0


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
    pools: Mapping[str, PoolGpus] = field(default_factory=dict)
    services: Mapping[str, ServiceReplicas] = field(default_factory=dict)
    # GPUs of training pods not bound to a node yet (gated, pending, or being placed by a reclaim), per pool
    # ("" = not confined to one pool); the pods behind the handover gate.
    unplaced_training: Mapping[str, int] = field(default_factory=dict)
    gated_pods: tuple[PodRef, ...] = ()
    # When each gated pod was created (epoch seconds), so each waits its own timeout; pods missing here
    # share the controller's one timer (BurstState.gated_since).
    gated_at: Mapping[PodRef, float] = field(default_factory=dict)
    # GPUs of standby replicas on virtual nodes: they are scaled away, never sent home, so closing needs
    # no on-prem room for them.
    standby_external_gpus: int = 0

    @property
    def external_gpus_in_use(self) -> int:
        return sum(v.gpus_in_use for v in self.virtual_nodes.values())


def effective_free_gpus(snapshot: Snapshot) -> int:
    """Free on-prem GPUs that inference can count on once pending training has taken what it needs.

    Per pool: max(0, free − pending training), because a gang pending for pool A can only take pool A's
    GPUs; idle GPUs in pool B stay available to inference however large A's backlog is (and A's backlog
    cannot drive B below zero). GPUs and pending pods that belong to no known pool are netted cluster-wide,
    as before. With no pool breakdown this is exactly free − pending training. O(pools).
    """
    free_rest = snapshot.onprem_free_gpus
    pending_rest = snapshot.pending_training_gpus
    total = 0
    for pool in snapshot.pools.values():
        free_rest -= pool.free
        pending_rest -= pool.pending_training
        total += max(0, pool.free - pool.pending_training)
    return total + free_rest - pending_rest


@dataclass(frozen=True)
class BurstState:
    """Controller memory between decisions; recomputable from the cluster (see `state_from_snapshot`)."""

    mode: Mode
    changed_at: float | None = None
    low_since: float | None = None  # free on-prem GPUs below the open threshold since
    pending_since: float | None = None  # inference GPU pods pending since
    close_since: float | None = None  # close condition true since
    gated_since: float | None = None  # training pods behind the handover gate since
    last_now: float | None = None


@dataclass(frozen=True)
class Decision:
    actions: tuple[Action, ...]
    state: BurstState
    reasons: tuple[str, ...]
    flipped: Mode | None = None  # the mode entered by this decision, if any
    effective_free_gpus: int | None = None  # free on-prem GPUs minus pending training demand, per pool
    close_needs_gpus: int | None = None  # free GPUs the close condition requires right now
    standby: Mapping[str, int] = field(default_factory=dict)  # standby replicas wanted per service


def state_from_snapshot(snapshot: Snapshot, now: float) -> BurstState:
    """Recover the mode from the taints in the cluster, so a restart changes nothing by itself.

    Nodes we have managed before (they carry our changed-at annotation) decide; a fleet we never touched
    counts as open unless every node is already tainted. Hold timers start over: a restart is a hold.
    """
    nodes = list(snapshot.virtual_nodes.values())
    managed = [v for v in nodes if v.changed_at is not None] or nodes
    mode = Mode.OPEN if any(not v.closed for v in managed) else Mode.CLOSED
    in_mode = [v for v in managed if v.closed == (mode is Mode.CLOSED)]
    stamps = [v.changed_at for v in in_mode if v.changed_at is not None]
    return BurstState(mode=mode, changed_at=max(stamps) if stamps else None, last_now=now)


def _hold(since: float | None, active: bool, now: float) -> float | None:
    if not active:
        return None
    return now if since is None else since


def decide(snapshot: Snapshot, state: BurstState, now: float, settings: BurstSettings) -> Decision:
    """Decide the burst mode and the per-node/per-pod actions that make the cluster match it."""
    blind = replace(state, low_since=None, pending_since=None, close_since=None, gated_since=None, last_now=now)
    if state.last_now is not None and now < state.last_now:
        return Decision((), blind, (f"clock moved back {state.last_now - now:.1f}s: no flip, holds restart",))
    if state.changed_at is not None and now < state.changed_at:
        return Decision((), blind, ("clock is before the last flip: no flip, holds restart",))
    if not snapshot.synced or snapshot.observed_at is None:
        return Decision((), blind, ("cluster not listed yet: taints left as they are",))
    age = now - snapshot.observed_at
    if age > settings.stale_after_seconds:
        return Decision((), blind, (f"cluster data {age:.0f}s old: taints left as they are",))
    if snapshot.onprem_allocatable_gpus <= 0:
        return Decision((), blind, ("no on-prem GPU capacity visible: taints left as they are",))

    reasons: list[str] = []
    gap = 0.0 if state.last_now is None else now - state.last_now
    if gap > settings.stale_after_seconds:
        # We were not looking in between; a condition is only "sustained" if we saw it sustained.
        state = replace(state, low_since=None, pending_since=None, close_since=None, gated_since=None)
        reasons.append(f"no decision for {gap:.0f}s: holds restart")

    effective_free = effective_free_gpus(snapshot)
    external = snapshot.external_gpus_in_use - snapshot.standby_external_gpus
    close_needs = settings.close_at_free_gpus + external
    low = effective_free < settings.open_below_free_gpus
    pending = snapshot.pending_inference_gpus > 0
    low_since = _hold(state.low_since, low, now)
    pending_since = _hold(state.pending_since, pending, now)
    mode = state.mode
    changed_at = state.changed_at
    flipped: Mode | None = None
    close_since: float | None = None

    if mode is Mode.CLOSED:
        if low_since is not None and now - low_since >= settings.open_hold_seconds:
            flipped = Mode.OPEN
            reasons.append(
                f"open: {effective_free} effective free on-prem GPUs < {settings.open_below_free_gpus} "
                f"for {now - low_since:.0f}s"
            )
        elif pending_since is not None and now - pending_since >= settings.pending_grace_seconds:
            flipped = Mode.OPEN
            waited = now - pending_since
            pending_gpus = snapshot.pending_inference_gpus
            reasons.append(f"open: {pending_gpus} inference GPUs pending for {waited:.0f}s")
    else:
        can_close = not pending and effective_free >= close_needs
        close_since = _hold(state.close_since, can_close, now)
        if close_since is not None and now - close_since >= settings.close_hold_seconds:
            # Closing sends external replicas home: the standby covers them first (make before break).
            home = plan_standby(snapshot, returning=True)
            waited = now - close_since - settings.close_hold_seconds
            if home.covered or waited >= settings.handover_timeout_seconds:
                flipped = Mode.CLOSED
                reasons.append(
                    f"close: {effective_free} effective free on-prem GPUs >= {settings.close_at_free_gpus} "
                    f"+ {external} in use externally for {now - close_since:.0f}s"
                    + ("" if home.covered else f"; standby not ready after {waited:.0f}s, closing anyway")
                )
                close_since = None
            else:
                reasons.append(f"close waits for the standby: {home.describe()}")

    if flipped is not None:
        mode = flipped
        changed_at = now
        low_since = pending_since = close_since = None

    # Replicas at risk: on-prem ones a gated gang will reclaim, and (closed, or about to close) external
    # ones the descheduler will move home.
    closing = close_since is not None and now - close_since >= settings.close_hold_seconds
    plan = plan_standby(snapshot, returning=mode is Mode.CLOSED or closing, cover=settings.handover_cover)
    gated_since = _hold(state.gated_since, bool(snapshot.gated_pods), now)
    released: tuple[PodRef, ...] = ()
    if gated_since is not None:
        if plan.gang_covered:
            released = snapshot.gated_pods
            reasons.append(f"handover: standby covers the replicas the gang displaces; {len(released)} "
                           "training pods released")
        else:
            timeout = settings.handover_timeout_seconds
            released = tuple(r for r in snapshot.gated_pods if now - snapshot.gated_at.get(r, gated_since) >= timeout)
            if released:
                reasons.append(f"handover: standby not ready after {timeout:.0f}s ({plan.describe()}); training "
                               f"outranks inference, {len(released)} training pods released")
    ungate = len(released) == len(snapshot.gated_pods) > 0

    actions: list[Action] = []
    for node in sorted(snapshot.virtual_nodes.values(), key=lambda v: v.name):
        if mode is Mode.OPEN and node.closed:
            actions.append(Action(ActionKind.OPEN_NODE, node=node.name))
        elif mode is Mode.CLOSED and node.taint_effect != "NoSchedule":
            actions.append(Action(ActionKind.CLOSE_NODE, node=node.name))
    for service, replicas in sorted(plan.targets.items()):
        if replicas != snapshot.services[service].standby_live:
            actions.append(Action(ActionKind.SET_STANDBY, service=service, replicas=replicas))
    actions.extend(Action(ActionKind.UNGATE, namespace=r.namespace, pod=r.name) for r in released)
    for ref in snapshot.pods_needing_cost[: settings.max_cost_patches_per_cycle]:
        actions.append(
            Action(
                ActionKind.SET_DELETION_COST,
                namespace=ref.namespace,
                pod=ref.name,
                deletion_cost=settings.external_deletion_cost,
            )
        )
    new_state = BurstState(
        mode=mode,
        changed_at=changed_at,
        low_since=low_since,
        pending_since=pending_since,
        close_since=close_since,
        gated_since=None if ungate else gated_since,
        last_now=now,
    )
    return Decision(
        tuple(actions), new_state, tuple(reasons), flipped, effective_free, close_needs, dict(plan.targets)
    )


def _fits_free(unplaced_gpus: int, pool: PoolGpus | None) -> bool:
    """Whether a pool's unplaced training fits its free GPUs without displacing anyone.

    With the node breakdown: largest pods first, each into the fullest node that still holds it (best fit),
    in batches per (pod size, node bucket), so the cost is O(sizes × buckets), not O(pods). Without it,
    by GPU count alone.
    """
    if pool is None:
        return unplaced_gpus <= 0
    if not pool.unplaced_pods or not pool.free_nodes:
        return unplaced_gpus <= pool.free
    nodes = dict(pool.free_nodes)
    for size in sorted(pool.unplaced_pods, reverse=True):
        left = pool.unplaced_pods[size]
        if size <= 0:
            continue
        for free in sorted(f for f in nodes if f >= size):
            if not left:
                break
            count = nodes.get(free, 0)
            per_node = free // size
            if not count or not per_node:
                continue
            placed = min(left, count * per_node)
            full, rest = divmod(placed, per_node)
            used = full + (1 if rest else 0)
            nodes[free] = count - used
            if full:
                leftover = free - per_node * size
                nodes[leftover] = nodes.get(leftover, 0) + full
            if rest:
                leftover = free - rest * size
                nodes[leftover] = nodes.get(leftover, 0) + 1
            left -= placed
        if left:
            return False
    return True


@dataclass(frozen=True)
class StandbyPlan:
    """Standby replicas wanted per service and whether the ready ones cover what is at risk."""

    targets: Mapping[str, int]
    at_risk: Mapping[str, int]
    ready: Mapping[str, int]
    #: Services with on-prem replicas a waiting gang will reclaim.
    gang_services: frozenset[str] = frozenset()

    @property
    def covered(self) -> bool:
        return all(self.ready[s] >= n for s, n in self.targets.items())

    @property
    def gang_covered(self) -> bool:
        """The gated gang may start: the standby of every service it displaces is ready (others do not count)."""
        return all(self.ready[s] >= self.targets[s] for s in self.gang_services)

    def describe(self) -> str:
        parts = [f"{s} standby {self.ready[s]}/{n} ready, {self.at_risk[s]} at risk" for s, n in self.targets.items()]
        return ", ".join(parts) or "nothing at risk"


def plan_standby(snapshot: Snapshot, returning: bool, cover: str = "current") -> StandbyPlan:
    """Standby per service = replicas at risk that the rest cannot cover.

    `cover` "current" replaces every replica at risk up to the service's current replica count (capacity is
    kept through the handover); "minimum" only up to minReplicas (the floor is kept, at less external cost).

    On-prem replicas are at risk in a pool where unplaced training (gated, or released and not bound yet)
    wants more GPUs than are free: a gang will reclaim them. With `returning`, external replicas are at
    risk too (the descheduler moves them home).
    Once started, a standby stays until the main Deployment is ready at its goal again, so it bridges the
    time replacements of reclaimed replicas take to start elsewhere. Goal = max(minReplicas, main pods).
    """
    unplaced = snapshot.unplaced_training
    all_pools = unplaced.get("", 0) > snapshot.onprem_free_gpus
    risky_pools = {p for p, gpus in unplaced.items() if p and not _fits_free(gpus, snapshot.pools.get(p))}
    targets: dict[str, int] = {}
    at_risk: dict[str, int] = {}
    ready: dict[str, int] = {}
    gang: set[str] = set()
    for name, svc in snapshot.services.items():
        onprem_risk = sum(n for pool, n in svc.main_ready_onprem.items() if all_pools or pool in risky_pools)
        if onprem_risk:
            gang.add(name)
        risk = onprem_risk + (svc.main_ready_external if returning else 0)
        if risk == 0 and svc.standby_live == 0:
            continue
        goal = max(svc.min_replicas, svc.main_live)
        cap = goal if cover == "current" else svc.min_replicas
        targets[name] = max(0, min(goal - (svc.main_ready - risk), cap))
        at_risk[name] = risk
        ready[name] = svc.standby_ready
    return StandbyPlan(targets, at_risk, ready, frozenset(gang))
