"""The pure decision core: cluster aggregates + previous state + clock in, actions + new state out.

No I/O, no wall clock, no randomness: the shell, the tests and the simulator all call `decide` the same way.

One cluster-wide mode (open/closed) applies to every virtual node. The trigger, on-prem scarcity, is global,
and which provider a pod lands on is already decided by the scheduler (preferred affinity) and by the
pod-deletion-cost; opening only some providers would add a second placement policy that fights the first.
Per-node reconciliation still happens: a virtual node whose taint disagrees with the mode (new node,
hand edit, a NoExecute variant) is brought back in line.

`decide` runs four named steps: `guards` (is the view trustworthy, is the clock sane), `next_mode` (hysteresis
and holds), `gate_release` (which gated training pods may start) and `actions` (what makes the cluster match).

Make-before-break handover: training pods are created behind a scheduling gate, and inference replicas
that a gang is about to reclaim (or that the descheduler is about to move home) count as at risk. Each
service's standby Deployment, pinned to virtual nodes, is scaled to cover its at-risk replicas; only when
the standby is ready does the core lift the gate (or close the burst), so ready replicas never drop below
the service's minimum. A timeout bounds the wait: training outranks inference. The standby is sized at
every decision from what the gang would take right then, plus the demand ramp expected while the standby
starts (`expected_ramp`: the recent rise of the service's replica count, carried forward over the external
start), so a gang admitted in a quiet minute and released in a ramp still leaves the service covered.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field, replace

from agents.burst_controller.contract import BurstSettings, Cover, Sizing


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
    EVICT = "evict"  # evict an external replica (Eviction API) whose on-prem cover is Ready


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


def track_replicas(
    seen: Mapping[str, tuple[tuple[float, int], ...]], services: Mapping[str, ServiceReplicas], now: float,
    window: float,
) -> dict[str, tuple[tuple[float, int], ...]]:
    """Each service's replica-count history with this instant added: a point only where the count changed,
    and only back to the last point at or before `now - window` (what the count was when the window opened).

    Pruning at any later instant gives the same history whether or not decisions ran in between, so a
    skipped call with unchanged inputs changes nothing. Services no longer listed are dropped.
    O(services + points).
    """
    out: dict[str, tuple[tuple[float, int], ...]] = {}
    for name, svc in services.items():
        points = seen.get(name, ())
        if not points or points[-1][1] != svc.main_live:
            points = (*points, (now, svc.main_live))
        start = 0
        while start + 1 < len(points) and points[start + 1][0] <= now - window:
            start += 1
        out[name] = points[start:]
    return out


def expected_ramp(points: tuple[tuple[float, int], ...], now: float, window: float, ahead: float) -> int:
    """Replicas the service is expected to add over the next `ahead` seconds: its rise over the last
    `window` seconds (from the count when the window opened, or the oldest known), carried forward at the
    same rate, rounded up, at most the current count (a ramp is not assumed to more than double it).
    A falling or flat count expects nothing. Pure; O(points).
    """
    if not points or window <= 0 or ahead <= 0:
        return 0
    current = points[-1][1]
    base = points[0][1]
    for t, n in points:
        if t > now - window:
            break
        base = n
    rise = current - base
    if rise <= 0:
        return 0
    return min(current, math.ceil(rise * ahead / window - 1e-9))


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


def _without_holds(state: BurstState, **changes: float | None) -> BurstState:
    """The state with the hysteresis holds restarted (gate waits are kept: they bound training's wait)."""
    return replace(state, low_since=None, pending_since=None, close_since=None, **changes)  # type: ignore[arg-type]


def decide(snapshot: Snapshot, state: BurstState, now: float, settings: BurstSettings) -> Decision:
    """Decide the burst mode and the per-node/per-pod actions that make the cluster match it."""
    state, reasons, may_flip = settle_clock(state, now)
    blind = guards(snapshot, state, now, settings)
    if blind is not None:
        return Decision((), _without_holds(state, last_now=now), (*reasons, blind))
    gap = 0.0 if state.last_now is None else now - state.last_now
    if gap > settings.stale_after_seconds:
        # We were not looking in between; a condition is only "sustained" if we saw it sustained.
        state = _without_holds(state)
        reasons.append(f"no decision for {gap:.0f}s: holds restart")
    window = settings.handover_ramp_window_seconds
    seen = (track_replicas(state.replicas_seen, snapshot.services, now, window)
            if settings.handover_ramp_seconds > 0 or settings.warm_pool_ramp_seconds > 0 else {})
    ramp = {name: r for name, points in seen.items()
            if (r := expected_ramp(points, now, window, settings.handover_ramp_seconds))}
    step = next_mode(snapshot, state, now, settings, may_flip, ramp)
    reasons.extend(step.reasons)
    closing = step.close_since is not None and now - step.close_since >= settings.close_hold_seconds
    plan = plan_standby(snapshot, returning=step.mode is Mode.CLOSED or closing, cover=settings.handover_cover,
                        sizing=settings.handover_sizing, return_batch=settings.handover_return_batch, ramp=ramp)
    gate = gate_release(snapshot, state, now, settings, plan)
    reasons.extend(gate.reasons)
    warm = plan_warm(snapshot.services, step.mode is Mode.OPEN, seen, now, settings)
    home = plan_return(snapshot, step.effective_free, settings)
    new_state = BurstState(
        mode=step.mode,
        changed_at=step.changed_at,
        low_since=step.low_since,
        pending_since=step.pending_since,
        close_since=step.close_since,
        gated_since=min(gate.seen.values()) if gate.seen else None,
        last_now=now,
        gated_seen=gate.seen,
        replicas_seen=seen,
    )
    return Decision(
        actions(snapshot, step, plan, gate.released, settings, warm, home),
        new_state,
        tuple(reasons),
        step.flipped,
        step.effective_free,
        step.close_needs,
        dict(plan.targets),
        dict(plan.ramp),
        warm,
        dict(home.targets),
    )


def settle_clock(state: BurstState, now: float) -> tuple[BurstState, list[str], bool]:
    """Bound clock skew so that it can never freeze the controller.

    A clock stepped back moves every timestamp the controller keeps back with it: gated training keeps the wait
    it has served (it is released at its timeout on the new clock), while the hysteresis holds restart and
    this one decision flips nothing. A last flip stamped ahead of this clock (a previous leader's fast clock)
    counts as now. Returns the settled state, reasons, and whether this decision may flip.
    """
    reasons: list[str] = []
    may_flip = True
    if state.last_now is not None and now < state.last_now:
        back = state.last_now - now
        state = replace(
            _without_holds(state, last_now=now),
            gated_seen={ref: t - back for ref, t in state.gated_seen.items()},
            gated_since=None if state.gated_since is None else state.gated_since - back,
            replicas_seen={name: tuple((t - back, n) for t, n in points)
                           for name, points in state.replicas_seen.items()},
        )
        reasons.append(f"clock moved back {back:.1f}s: no flip, holds restart")
        may_flip = False
    if state.changed_at is not None and state.changed_at > now:
        reasons.append(f"last flip stamped {state.changed_at - now:.0f}s ahead of this clock: counted from now")
        state = replace(state, changed_at=now)
    return state, reasons, may_flip


def guards(snapshot: Snapshot, state: BurstState, now: float, settings: BurstSettings) -> str | None:
    """Why the view cannot be trusted to act on right now, or None when it can."""
    if not snapshot.synced or snapshot.observed_at is None:
        return "cluster not listed yet: taints left as they are"
    age = now - snapshot.observed_at
    if age > settings.stale_after_seconds:
        return f"cluster data {age:.0f}s old: taints left as they are"
    if snapshot.onprem_allocatable_gpus <= 0 and snapshot.onprem_gpu_nodes <= 0:
        return "no on-prem GPU node listed: taints left as they are"
    return None


def inconsistency(snapshot: Snapshot, close_needs: int) -> str | None:
    """What makes the inputs impossible, or None. Defence in depth: a bad view must never close the burst."""
    s = snapshot
    if (  # the common case, cheaply: every count sane
        0 <= s.onprem_free_gpus <= s.onprem_allocatable_gpus
        and min(s.pending_inference_gpus, s.pending_training_gpus, s.standby_external_gpus, close_needs) >= 0
        and all(v.gpus_in_use >= 0 for v in s.virtual_nodes.values())
        and all(p.free >= 0 and p.pending_training >= 0 for p in s.pools.values())
    ):
        return None
    problems = []
    if snapshot.onprem_free_gpus > snapshot.onprem_allocatable_gpus:
        problems.append(f"free {snapshot.onprem_free_gpus} > allocatable {snapshot.onprem_allocatable_gpus}")
    counts = {
        "allocatable": snapshot.onprem_allocatable_gpus,
        "free": snapshot.onprem_free_gpus,
        "pending inference": snapshot.pending_inference_gpus,
        "pending training": snapshot.pending_training_gpus,
        "standby external": snapshot.standby_external_gpus,
    }
    problems += [f"{name} {n} < 0" for name, n in counts.items() if n < 0]
    problems += [f"{v.name} in use {v.gpus_in_use} < 0" for v in snapshot.virtual_nodes.values() if v.gpus_in_use < 0]
    problems += [
        f"pool {name} free {p.free} / pending {p.pending_training} < 0"
        for name, p in snapshot.pools.items()
        if p.free < 0 or p.pending_training < 0
    ]
    if close_needs < 0:
        problems.append(f"close needs {close_needs} GPUs")
    return "; ".join(problems) or None


@dataclass(slots=True)
class ModeStep:
    """The outcome of `next_mode`: the mode, its hold timers, and what the close condition measured."""

    mode: Mode
    changed_at: float | None
    flipped: Mode | None
    low_since: float | None
    pending_since: float | None
    close_since: float | None
    effective_free: int
    close_needs: int
    close_blocked: bool  # inputs are inconsistent: nothing may be closed
    reasons: tuple[str, ...]


def next_mode(snapshot: Snapshot, state: BurstState, now: float, settings: BurstSettings, may_flip: bool,
              ramp: Mapping[str, int] | None = None) -> ModeStep:
    """Hysteresis: open after scarcity (or pending inference) held; close after plenty held and standby ready
    (sized with `ramp`, the expected ramp per service, as the standby step sizes it)."""
    reasons: list[str] = []
    effective_free = effective_free_gpus(snapshot, settings.inference_pools)
    external = snapshot.external_gpus_in_use - snapshot.standby_external_gpus
    close_needs = settings.close_at_free_gpus + external
    bad = inconsistency(snapshot, close_needs)
    if bad is not None:
        reasons.append(f"inputs inconsistent ({bad}): no close")
    low = effective_free < settings.open_below_free_gpus
    pending = snapshot.pending_inference_gpus > 0
    low_since = _hold(state.low_since, low, now)
    pending_since = _hold(state.pending_since, pending, now)
    mode = state.mode
    flipped: Mode | None = None
    close_since: float | None = None

    if not may_flip:
        pass
    elif mode is Mode.CLOSED:
        if low_since is not None and now - low_since >= settings.open_hold_seconds:
            flipped = Mode.OPEN
            reasons.append(
                f"open: {effective_free} effective free on-prem GPUs < {settings.open_below_free_gpus} "
                f"for {now - low_since:.0f}s"
            )
        elif pending_since is not None and now - pending_since >= settings.pending_grace_seconds:
            flipped = Mode.OPEN
            waited = now - pending_since
            reasons.append(f"open: {snapshot.pending_inference_gpus} inference GPUs pending for {waited:.0f}s")
    else:
        can_close = bad is None and not pending and effective_free >= close_needs
        close_since = _hold(state.close_since, can_close, now)
        if close_since is not None and now - close_since >= settings.close_hold_seconds:
            # Closing sends external replicas home: the standby covers them first (make before break), with the
            # same cover the standby was scaled with.
            home = plan_standby(snapshot, returning=True, cover=settings.handover_cover,
                                sizing=settings.handover_sizing, return_batch=settings.handover_return_batch,
                                ramp=ramp)
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

    changed_at = state.changed_at
    if flipped is not None:
        mode, changed_at = flipped, now
        low_since = pending_since = close_since = None
    return ModeStep(mode, changed_at, flipped, low_since, pending_since, close_since, effective_free, close_needs,
                    bad is not None, tuple(reasons))


@dataclass(slots=True)
class GateStep:
    released: tuple[PodRef, ...]
    seen: Mapping[PodRef, float]
    reasons: tuple[str, ...]


_NOTHING_GATED = GateStep((), {}, ())


def gate_release(
    snapshot: Snapshot, state: BurstState, now: float, settings: BurstSettings, plan: StandbyPlan
) -> GateStep:
    """Which gated training pods may start: each as soon as the standbys of the services *its* pool displaces
    are ready (a pod that displaces nobody, or can never fit, at once), and any at its own timeout.

    A pod's wait counts from its creation (API server clock) or from when this controller first saw it,
    whichever is earlier; a creation stamp ahead of this clock is skew and is ignored. O(gated pods).
    """
    if not snapshot.gated_pods:
        return _NOTHING_GATED
    timeout = settings.handover_timeout_seconds
    hopeless = {ref for gang in snapshot.infeasible for ref in gang.pods}
    covered_pools: dict[str | None, bool] = {}
    released: list[PodRef] = []
    seen: dict[PodRef, float] = {}
    covered_count = timed_out = 0
    for ref in snapshot.gated_pods:
        first = state.gated_seen.get(ref, now)
        created = snapshot.gated_at.get(ref)
        start = min(first, created) if created is not None and created <= now else first
        pool = snapshot.gated_pool.get(ref)
        if pool not in covered_pools:
            covered_pools[pool] = plan.gang_covered_for(pool)
        # Kept while the pod is gated, released or not: a release whose patch failed keeps its served wait.
        seen[ref] = first
        if ref in hopeless or covered_pools[pool]:
            released.append(ref)
            covered_count += 1
        elif now - start >= timeout:
            released.append(ref)
            timed_out += 1
    reasons = []
    if covered_count:
        reasons.append(f"handover: nothing left at risk for {covered_count} training pods (standby ready or "
                       "nothing displaced); released")
    if timed_out:
        reasons.append(f"handover: standby not ready after {timeout:.0f}s ({plan.describe()}); training "
                       f"outranks inference, {timed_out} training pods released")
    return GateStep(tuple(released), seen, tuple(reasons))


def actions(
    snapshot: Snapshot, step: ModeStep, plan: StandbyPlan, released: tuple[PodRef, ...], settings: BurstSettings,
    warm: Mapping[str, int] | None = None, home: ReturnPlan | None = None,
) -> tuple[Action, ...]:
    """The changes that make the cluster match the decision, in a stable order. O(virtual nodes + services)."""
    nodes = sorted(snapshot.virtual_nodes.values(), key=lambda v: v.name)
    # First: a virtual node without its provider's taint takes any pod, training included.
    out = [Action(ActionKind.TAINT_PROVIDER, node=node.name) for node in nodes if node.provider_taint_missing]
    for node in nodes:
        if step.mode is Mode.OPEN and node.closed:
            out.append(Action(ActionKind.OPEN_NODE, node=node.name))
        elif step.mode is Mode.CLOSED and node.taint_effect != "NoSchedule" and not step.close_blocked:
            out.append(Action(ActionKind.CLOSE_NODE, node=node.name))
    for service, replicas in sorted(plan.targets.items()):
        if replicas != snapshot.services[service].standby_live:
            out.append(Action(ActionKind.SET_STANDBY, service=service, replicas=replicas))
    for service, replicas in sorted((warm or {}).items()):
        if replicas != snapshot.services[service].warm_live:
            out.append(Action(ActionKind.SET_WARM, service=service, replicas=replicas))
    if home is not None:
        for service, replicas in sorted(home.targets.items()):
            if replicas != snapshot.services[service].return_live:
                out.append(Action(ActionKind.SET_RETURN, service=service, replicas=replicas))
        out.extend(Action(ActionKind.EVICT, namespace=r.namespace, pod=r.name, service=service)
                   for service, refs in sorted(home.evictions.items()) for r in refs)
    out.extend(Action(ActionKind.UNGATE, namespace=r.namespace, pod=r.name) for r in released)
    out.extend(
        Action(ActionKind.SET_DELETION_COST, namespace=ref.namespace, pod=ref.name,
               deletion_cost=snapshot.deletion_costs.get(ref, settings.external_deletion_cost))
        for ref in snapshot.pods_needing_cost[: settings.max_cost_patches_per_cycle]
    )
    return tuple(out)


def plan_warm(services: Mapping[str, ServiceReplicas], open_: bool,
              seen: Mapping[str, tuple[tuple[float, int], ...]], now: float, settings: BurstSettings) -> dict[str, int]:
    """Warm-pool placeholders wanted per handover service: while the burst is open,
    ceil(`warm_pool_share` x replicas) plus the rise `expected_ramp` forecasts over `warm_pool_ramp_seconds`,
    at most the service's replicas (replicas = max(minReplicas, main pods)); 0 while closed (nothing lands
    on a closed virtual node, so a warm slot there serves nobody). A service is listed when it wants
    placeholders or still has some. Pure; O(services x points).
    """
    share, ahead = settings.warm_pool_share, settings.warm_pool_ramp_seconds
    on = open_ and (share > 0 or ahead > 0)
    out: dict[str, int] = {}
    for name, svc in services.items():
        want = 0
        if on:
            base = max(svc.min_replicas, svc.main_live)
            want = math.ceil(share * base - 1e-9)
            if ahead > 0:
                want += expected_ramp(seen.get(name, ()), now, settings.handover_ramp_window_seconds, ahead)
            want = min(want, base)
        if want or svc.warm_live:
            out[name] = want
    return out


@dataclass(frozen=True)
class ReturnPlan:
    """The make-before-break return's step: bridge pods wanted and external replicas to evict, per service."""

    targets: Mapping[str, int] = field(default_factory=dict)
    evictions: Mapping[str, tuple[PodRef, ...]] = field(default_factory=dict)


_NO_RETURN = ReturnPlan()


def plan_return(snapshot: Snapshot, effective_free: int, settings: BurstSettings) -> ReturnPlan:
    """Make-before-break return of external replicas: start the on-prem replacement, then evict.

    Why a separate Deployment (`<service>-return`, on-prem only, selected by the Service and the PDB but not
    by the HPA's scale target) rather than scaling the main Deployment: the HPA owns the main Deployment's
    replicas and writes them back at its next sync, so a surge there would be undone within seconds, and
    the not-ready new pods would be the first its ReplicaSet deletes. The bridge is ours alone; the HPA
    never sees it as a replica, and its few pods (at most `return_surge_share` of the service, within the
    HPA's tolerance) serve traffic for the minute a move takes, under its scale-down stabilization window.

    Per service, from what the cluster shows and nothing remembered, so a restart or a new leader computes
    the same step and never repeats a move already made:

    - in flight = main pods not Ready (replacements starting) + main pods being deleted (evictions made);
      that many bridge pods are kept, so no move ever lacks its cover;
    - once nothing is in flight, a Ready bridge pod covers one eviction, of the dearest provider's replicas
      first (`Snapshot.external_replicas`), when the replacement still finds on-prem room: moves are serial
      per service, as a PDB of maxUnavailable 1 (which counts the bridge among its pods) admits them;
    - new bridge pods are added for external replicas left, each needing room for itself and for the
      replacement of the replica it frees (2 x GPUs per replica), up to the cap.

    Room is the effective free on-prem GPUs (training's pending demand netted, per pool) above
    `open_below_free_gpus`, so a return never takes what training waits for nor drives a closed burst open;
    a bridge pod bound to a node holds its GPUs already (they are not free), one still unbound takes them
    from the room first, so a bridge does not shrink the moment it lands (no flapping).
    Once nothing is external and nothing in flight, the bridge goes to 0. Off (share 0): a bridge still up is
    scaled to 0 and nothing is evicted. Pure; O(services + evictions).
    """
    share = settings.return_surge_share
    if share <= 0:
        return ReturnPlan({n: 0 for n, svc in snapshot.services.items() if svc.return_live}) if any(
            svc.return_live for svc in snapshot.services.values()) else _NO_RETURN
    room = effective_free - settings.open_below_free_gpus
    targets: dict[str, int] = {}
    evictions: dict[str, tuple[PodRef, ...]] = {}
    for name in sorted(snapshot.services):
        svc = snapshot.services[name]
        g = max(1, svc.gpus_per_replica)
        external = svc.main_ready_external
        if not external and not svc.return_live:
            continue
        room -= svc.return_pending * g
        in_flight = max(0, svc.main_live - svc.main_ready) + svc.main_leaving
        refs = snapshot.external_replicas.get(name, ())
        # One move at a time per service, and only once every earlier one is done: the PDB (maxUnavailable,
        # counting the bridge among its expected pods) admits an eviction only while the others are Ready, so
        # a second one would be refused and retried; one at a time also bounds what a stale view can repeat.
        spend = 1 if (external and refs and not in_flight and svc.return_ready and room >= g) else 0
        room -= spend * g
        keep = min(svc.return_live, in_flight + spend)
        spare = svc.return_live - keep
        left = external - spend
        fund = max(0, min(spare, left, room // g if room > 0 else 0))
        room -= fund * g
        new = max(0, min(left - fund, room // (2 * g) if room > 0 else 0))
        room -= new * 2 * g
        cap = math.ceil(share * max(svc.min_replicas, svc.main_live) - 1e-9)
        targets[name] = keep + min(max(0, cap - keep), fund + new)
        if spend:
            evictions[name] = tuple(refs[:spend])
    return ReturnPlan(targets, evictions)


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
    left, _ = _place_on_free(pool.unplaced_pods, pool.free_nodes)
    return not left


def _place_on_free(pods: Mapping[int, int], free_nodes: Mapping[int, int]) -> tuple[dict[int, int], dict[int, int]]:
    """Best fit of pods (GPUs per pod -> count) onto free node buckets (free GPUs -> nodes), largest pods first.

    Returns the pods left unplaced and the buckets that remain. O(sizes × buckets).
    """
    nodes = dict(free_nodes)
    unplaced: dict[int, int] = {}
    for size in sorted(pods, reverse=True):
        left = pods[size]
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
            unplaced[size] = left
    return unplaced, nodes


def displaced_gpus(unplaced_gpus: int, pool: PoolGpus | None) -> int:
    """GPUs of other pods that waiting training must reclaim in a pool: what it lacks on the free GPUs.

    With the node breakdown: after the best fit onto free GPUs, each pod still unplaced takes the node with
    the most free GPUs left (the fewest to reclaim: the gang scheduler's choice too) and displaces the rest
    of its size; once no partly free node is left, its whole size. Without it, by GPU count alone.
    O(sizes × buckets).
    """
    if unplaced_gpus <= 0:
        return 0
    if pool is None:
        return unplaced_gpus
    if not pool.unplaced_pods or not pool.free_nodes:
        return max(0, unplaced_gpus - pool.free)
    left, nodes = _place_on_free(pool.unplaced_pods, pool.free_nodes)
    displaced = 0
    for size in sorted(left, reverse=True):
        count = left[size]
        for free in sorted((f for f in nodes if 0 < f < size and nodes[f] > 0), reverse=True):
            take = min(count, nodes[free])
            nodes[free] -= take
            displaced += take * (size - free)
            count -= take
            if not count:
                break
        displaced += count * size
    return displaced


@dataclass(frozen=True)
class StandbyPlan:
    """Standby replicas wanted per service and whether the ready ones cover what is at risk."""

    targets: Mapping[str, int]
    at_risk: Mapping[str, int]
    ready: Mapping[str, int]
    #: Services with on-prem replicas a waiting gang will reclaim.
    gang_services: frozenset[str] = frozenset()
    #: The same per pool of the waiting training ("" = training confined to no pool).
    pool_services: Mapping[str, frozenset[str]] = field(default_factory=dict)
    #: The part of each target that covers the expected ramp (services that have it).
    ramp: Mapping[str, int] = field(default_factory=dict)

    @property
    def covered(self) -> bool:
        return all(self.ready[s] >= n for s, n in self.targets.items())

    @property
    def gang_covered(self) -> bool:
        """Every gated gang may start: the standby of every service any of them displaces is ready."""
        return self.gang_covered_for(None)

    def gang_covered_for(self, pool: str | None) -> bool:
        """Training for `pool` may start: the standbys of the services it displaces are ready (others do not
        count). `None` (pool unknown) waits for every service any waiting training displaces."""
        services = self.gang_services if pool is None else self.pool_services.get(pool, frozenset())
        return all(self.ready[s] >= self.targets[s] for s in services)

    def describe(self) -> str:
        parts = [f"{s} standby {self.ready[s]}/{n} ready, {self.at_risk[s]} at risk"
                 + (f" + {self.ramp[s]} for the ramp" if self.ramp.get(s) else "") for s, n in self.targets.items()]
        return ", ".join(parts) or "nothing at risk"


def plan_standby(snapshot: Snapshot, returning: bool, cover: Cover, sizing: Sizing = Sizing.POOL,
                 return_batch: int = 0, ramp: Mapping[str, int] | None = None) -> StandbyPlan:
    """Standby per service = replicas at risk that the rest cannot cover.

    `cover` CURRENT replaces every replica at risk up to the service's current replica count (capacity is
    kept through the handover); MINIMUM only up to minReplicas (the floor is kept, at less external cost).
    No default: the mode step and the standby step must agree on it, so each caller names it.
    `sizing` POOL puts every ready replica of a risky pool at risk; DISPLACED only as many as the GPUs the
    training lacks there can hold (`displaced_gpus` / GPUs per replica, per service: an upper bound, since
    which services sit on the reclaimed nodes is not known). `return_batch` > 0 caps the external replicas
    at risk while returning (those moving home at once).

    On-prem replicas, Ready or still starting on the pool's nodes, are at risk in a pool where unplaced
    training (gated, or released and not bound yet) does not fit the free GPUs node by node: a gang will
    reclaim them, and a gate that waited only for the Ready ones' services would release it onto replicas
    that just started on the GPUs training freed. Training confined to no pool puts every
    pool at risk when it does not fit the free GPUs of all pools node by node. With `returning`, external
    replicas are at risk too (the descheduler moves them home).
    Once started, a standby stays until the main Deployment is ready at its goal again, so it bridges the
    time replacements of reclaimed replicas take to start elsewhere. Goal = max(minReplicas, main pods).

    `ramp` (service -> replicas, `expected_ramp`) raises the goal of a service under CURRENT cover while a
    gang would take its on-prem replicas or its standby is up: the standby then also holds the rise the
    service is expected to see before a replica started now is ready, so what the gang takes at the moment
    it takes it, and the demand that grows meanwhile, are both covered. MINIMUM keeps the floor only.
    """
    ramp = ramp or {}
    unplaced = snapshot.unplaced_training
    anywhere = unplaced.get("", 0)
    if snapshot.poolless is None:
        all_pools = anywhere > snapshot.onprem_free_gpus
    else:
        all_pools = anywhere > 0 and not _fits_free(anywhere, snapshot.poolless)
    risky_pools = {p for p, gpus in unplaced.items() if p and not _fits_free(gpus, snapshot.pools.get(p))}
    displaced: dict[str, int] = {}
    if sizing is Sizing.DISPLACED:
        displaced = {p: displaced_gpus(unplaced[p], snapshot.pools.get(p)) for p in risky_pools}
        if all_pools:
            displaced[""] = (displaced_gpus(anywhere, snapshot.poolless) if snapshot.poolless is not None
                             else max(0, anywhere - snapshot.onprem_free_gpus))
    targets: dict[str, int] = {}
    at_risk: dict[str, int] = {}
    ready: dict[str, int] = {}
    ramps: dict[str, int] = {}
    gang: set[str] = set()
    by_pool: dict[str, set[str]] = {}
    for name, svc in snapshot.services.items():
        # Every main pod on a reclaimed pool's nodes is at risk, Ready or still starting; only the Ready ones
        # reduce the standby (the goal already counts the starting ones as not serving).
        onprem = dict(svc.main_ready_onprem)
        for pool, n in svc.main_starting_onprem.items():
            onprem[pool] = onprem.get(pool, 0) + n
        onprem_risk = ready_risk = 0
        for pool, n in onprem.items():
            if n and (all_pools or pool in risky_pools):
                onprem_risk += n
                ready_risk += svc.main_ready_onprem.get(pool, 0)
                if pool in risky_pools:
                    by_pool.setdefault(pool, set()).add(name)
                if all_pools:
                    by_pool.setdefault("", set()).add(name)
        if onprem_risk:
            gang.add(name)
        if sizing is Sizing.DISPLACED and onprem_risk:
            per = max(1, svc.gpus_per_replica)
            bound = sum(min(n, -(-displaced[p] // per)) for p, n in onprem.items() if n and p in risky_pools)
            if all_pools:
                bound += -(-displaced[""] // per)
            onprem_risk = min(onprem_risk, bound)
            ready_risk = min(ready_risk, bound)
        external = svc.main_ready_external if returning else 0
        if return_batch:
            external = min(external, return_batch)
        risk = onprem_risk + external
        if risk == 0 and svc.standby_live == 0:
            continue
        extra = ramp.get(name, 0) if cover is Cover.CURRENT and (onprem_risk or svc.standby_live) else 0
        goal = max(svc.min_replicas, svc.main_live) + extra
        cap = goal if cover is Cover.CURRENT else svc.min_replicas
        targets[name] = max(0, min(goal - (svc.main_ready - ready_risk - external), cap))
        at_risk[name] = risk
        ready[name] = svc.standby_ready
        if extra:
            ramps[name] = extra
    return StandbyPlan(targets, at_risk, ready, frozenset(gang), {p: frozenset(v) for p, v in by_pool.items()},
                       ramps)
