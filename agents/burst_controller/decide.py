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

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from agents.burst_controller.contract import BurstSettings
from agents.burst_controller.plans import (
    ClearPlan,
    ReturnPlan,
    StandbyPlan,
    displaced_gpus,
    expected_ramp,
    plan_clear,
    plan_return,
    plan_standby,
    plan_warm,
    standby_room,
    track_replicas,
)
from agents.burst_controller.snapshot import (
    Action,
    ActionKind,
    BurstState,
    Decision,
    InfeasibleGang,
    Mode,
    NodeRoom,
    PodRef,
    PoolGpus,
    ServiceReplicas,
    Snapshot,
    StandbyRoom,
    VirtualNode,
    effective_free_gpus,
)

#: The core's public face (`__init__`'s list): its own steps, and the types and plans it re-exports from
#: `snapshot` (data) and `plans` (make-before-break sizing).
__all__ = [
    "Action",
    "ActionKind",
    "BurstState",
    "Decision",
    "GateStep",
    "InfeasibleGang",
    "Mode",
    "ModeStep",
    "NodeRoom",
    "PodRef",
    "PoolGpus",
    "ReturnPlan",
    "ServiceReplicas",
    "Snapshot",
    "StandbyPlan",
    "StandbyRoom",
    "VirtualNode",
    "actions",
    "decide",
    "displaced_gpus",
    "effective_free_gpus",
    "expected_ramp",
    "gate_release",
    "guards",
    "inconsistency",
    "next_mode",
    "plan_return",
    "plan_standby",
    "plan_warm",
    "settle_clock",
    "standby_room",
    "state_from_snapshot",
    "track_replicas",
]


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
    window = settings.handover.ramp_window_seconds
    seen = (track_replicas(state.replicas_seen, snapshot.services, now, window)
            if settings.handover.ramp_seconds > 0 or settings.warm_pool_ramp_seconds > 0 else {})
    ramp = {name: r for name, points in seen.items()
            if (r := expected_ramp(points, now, window, settings.handover.ramp_seconds))}
    room = standby_room(snapshot.services, state.standby_room, now, settings.handover.standby_retry_seconds)
    step = next_mode(snapshot, state, now, settings, may_flip, ramp, room)
    reasons.extend(step.reasons)
    closing = step.close_since is not None and now - step.close_since >= settings.close_hold_seconds
    plan = plan_standby(snapshot, returning=step.mode is Mode.CLOSED or closing, cover=settings.handover.cover,
                        sizing=settings.handover.sizing, return_batch=settings.handover.return_batch, ramp=ramp,
                        room=room)
    gate = gate_release(snapshot, state, now, settings, plan)
    reasons.extend(gate.reasons)
    clear = plan_clear(snapshot, state.stalled_since, state.reserved_since, now,
                       settings.handover.clear_after_seconds, settings.handover.reserve_seconds)
    reasons.extend(clear.reasons)
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
        stalled_since=clear.stalled_since,
        standby_room=room,
        reserved_since=clear.reserved_since,
    )
    return Decision(
        actions(snapshot, step, plan, gate.released, settings, warm, home, clear),
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
            stalled_since={pool: t - back for pool, t in state.stalled_since.items()},
            standby_room={name: replace(r, since=r.since - back) for name, r in state.standby_room.items()},
            reserved_since={node: t - back for node, t in state.reserved_since.items()},
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
              ramp: Mapping[str, int] | None = None, room: Mapping[str, StandbyRoom] | None = None) -> ModeStep:
    """Hysteresis: open after scarcity (or pending inference) held; close after plenty held and standby ready
    (sized with `ramp`, the expected ramp per service, and `room`, what the providers hold, as the standby step
    sizes it)."""
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
            home = plan_standby(snapshot, returning=True, cover=settings.handover.cover,
                                sizing=settings.handover.sizing, return_batch=settings.handover.return_batch,
                                ramp=ramp, room=room)
            waited = now - close_since - settings.close_hold_seconds
            if home.covered or waited >= settings.handover.timeout_seconds:
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
    timeout = settings.handover.timeout_seconds
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
        reasons.append(f"handover: nothing left at risk for {covered_count} training pods (standby ready, as "
                       "large as the providers hold, or nothing displaced); released")
    if timed_out:
        reasons.append(f"handover: standby not ready after {timeout:.0f}s ({plan.describe()}); training "
                       f"outranks inference, {timed_out} training pods released")
    return GateStep(tuple(released), seen, tuple(reasons))


def nodes_by_price(nodes: Sequence[VirtualNode], settings: BurstSettings, dearest: bool = False) -> list[VirtualNode]:
    """The virtual nodes in the order a burst fills their providers (components/provider_rank.py): the cheapest
    provider's replicas carry the highest pod-deletion-cost, so the costs rank the providers (``dearest``: the
    dearest first); equal ones by name.

    Opening in this order matters: the taints come off one write after another, and a replica the scheduler
    places between two writes goes to whichever node is open (the burst e2e caught replicas on the dearer
    provider when the leader changed between the two)."""
    sign = 1 if dearest else -1
    return sorted(nodes, key=lambda v: (sign * settings.deletion_cost_for(v.provider), v.name))


def actions(
    snapshot: Snapshot, step: ModeStep, plan: StandbyPlan, released: tuple[PodRef, ...], settings: BurstSettings,
    warm: Mapping[str, int] | None = None, home: ReturnPlan | None = None, clearing: ClearPlan | None = None,
) -> tuple[Action, ...]:
    """The changes that make the cluster match the decision, in a stable order. O(virtual nodes + services)."""
    nodes = sorted(snapshot.virtual_nodes.values(), key=lambda v: v.name)
    # First: a virtual node without its provider's taint takes any pod, training included.
    out = [Action(ActionKind.TAINT_PROVIDER, node=node.name) for node in nodes if node.provider_taint_missing]
    if step.mode is Mode.OPEN:
        # Cheapest provider first: while the others are still closed every replica scheduled meanwhile goes there.
        out += [Action(ActionKind.OPEN_NODE, node=node.name) for node in nodes_by_price(nodes, settings) if node.closed]
    elif not step.close_blocked:
        # Dearest first: no replica lands on a dearer provider while a cheaper one is still open.
        out += [Action(ActionKind.CLOSE_NODE, node=node.name) for node in nodes_by_price(nodes, settings, dearest=True)
                if node.taint_effect != "NoSchedule"]
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
    if clearing is not None:
        # The reservations first: the clearing's evictions are of nodes already reserved (`plan_clear`).
        out.extend(Action(ActionKind.RESERVE_NODE, node=node, pool=pool)
                   for node, pool in sorted(clearing.reserve.items()))
        out.extend(Action(ActionKind.RELEASE_NODE, node=node) for node in clearing.release)
        out.extend(Action(ActionKind.EVICT, namespace=r.namespace, pod=r.name) for r in clearing.evictions)
    out.extend(
        Action(ActionKind.SET_DELETION_COST, namespace=ref.namespace, pod=ref.name,
               deletion_cost=snapshot.deletion_costs.get(ref, settings.external_deletion_cost))
        for ref in snapshot.pods_needing_cost[: settings.max_cost_patches_per_cycle]
    )
    return tuple(out)
