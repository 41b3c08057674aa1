"""Make-before-break plans of the burst controller, pure: the standby that covers the replicas a gang (or the
return home) takes away, the warm pool, the return bridge, and the demand ramp they are sized with.

`decide.actions` turns these plans into actions; the simulator and the tests call them directly.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from agents.burst_controller.contract import BurstSettings, Cover, Sizing
from agents.burst_controller.snapshot import NodeRoom, PodRef, PoolGpus, ServiceReplicas, Snapshot, StandbyRoom


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
                want += expected_ramp(seen.get(name, ()), now, settings.handover.ramp_window_seconds, ahead)
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
    #: Services whose standby is as large as the providers can hold: the scheduler found no room for its other
    #: pods and every one it placed is ready; waiting for the rest of the target would wait for nothing.
    full: frozenset[str] = frozenset()

    def _done(self, service: str) -> bool:
        return self.ready[service] >= self.targets[service] or service in self.full

    @property
    def covered(self) -> bool:
        return all(self._done(s) for s in self.targets)

    @property
    def gang_covered(self) -> bool:
        """Every gated gang may start: the standby of every service any of them displaces is ready."""
        return self.gang_covered_for(None)

    def gang_covered_for(self, pool: str | None) -> bool:
        """Training for `pool` may start: the standbys of the services it displaces are ready (others do not
        count). `None` (pool unknown) waits for every service any waiting training displaces."""
        services = self.gang_services if pool is None else self.pool_services.get(pool, frozenset())
        return all(self._done(s) for s in services)

    def describe(self) -> str:
        parts = [f"{s} standby {self.ready[s]}/{n} ready, {self.at_risk[s]} at risk"
                 + (f" + {self.ramp[s]} for the ramp" if self.ramp.get(s) else "")
                 + (" (the providers hold no more)" if s in self.full else "")
                 for s, n in self.targets.items()]
        return ", ".join(parts) or "nothing at risk"


def standby_room(services: Mapping[str, ServiceReplicas], seen: Mapping[str, StandbyRoom], now: float,
                 retry_s: float) -> dict[str, StandbyRoom]:
    """Per service, the standby size the providers hold, while it is known: the scheduler found no room for the
    standby's other pods and every placed one is ready (no warm placeholder anywhere, whose GPUs a standby pod would
    preempt: there "no room" is not final). Kept `retry_s` from its first sight, so the standby, cut to what was
    placed, asks for its whole size again after that long (room may have come); dropped for a service no longer
    listed. Why it is kept at all: once cut, the standby has no unplaced pod left to say "no room" again. O(services).
    """
    warm = any(s.warm_live for s in services.values())
    out: dict[str, StandbyRoom] = {}
    for name, svc in services.items():
        placed = svc.standby_live - svc.standby_unschedulable
        known = seen.get(name)
        if known is not None and known.since <= now < known.since + retry_s:
            out[name] = known
        if not warm and svc.standby_unschedulable > 0 and svc.standby_ready >= placed:
            out[name] = StandbyRoom(placed, out[name].since if name in out else now)
    return out


def plan_standby(snapshot: Snapshot, returning: bool, cover: Cover, sizing: Sizing = Sizing.POOL,
                 return_batch: int = 0, ramp: Mapping[str, int] | None = None,
                 room: Mapping[str, StandbyRoom] | None = None) -> StandbyPlan:
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
    A standby the providers cannot hold whole (`room`, from `standby_room`) counts as done (`StandbyPlan.full`): the
    gate and the close wait for what can be made, not for a target larger than the providers (the prod stack at
    maxReplicas asks 512 GPUs of standby of 384). While the service's external replicas are to come home it also
    asks for no more than they hold: the PDB counts its unplaced pods as expected and would allow the descheduler no
    eviction (the return's deadlock, found at scale). Elsewhere its unplaced pods stay, so it grows the moment room
    appears.

    `ramp` (service -> replicas, `expected_ramp`) raises the goal of a service under CURRENT cover while a
    gang would take its on-prem replicas or its standby is up: the standby then also holds the rise the
    service is expected to see before a replica started now is ready, so what the gang takes at the moment
    it takes it, and the demand that grows meanwhile, are both covered. MINIMUM keeps the floor only.
    """
    ramp = ramp or {}
    room = room or {}
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
    full: set[str] = set()
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
        target = max(0, min(goal - (svc.main_ready - ready_risk - external), cap))
        held = room.get(name)
        if held is not None and target > held.placed:
            full.add(name)
            if external:
                # Its replicas outside are to come home through the PDB, which counts unplaced standby pods as
                # expected and would allow no eviction: ask only for what the providers placed.
                target = held.placed
        targets[name] = target
        at_risk[name] = risk
        ready[name] = svc.standby_ready
        if extra:
            ramps[name] = extra
    return StandbyPlan(targets, at_risk, ready, frozenset(gang), {p: frozenset(v) for p, v in by_pool.items()},
                       ramps, frozenset(full))



@dataclass(frozen=True)
class ClearPlan:
    """Nodes the handover reserves and clears for released training the scheduler leaves waiting."""

    evictions: tuple[PodRef, ...] = ()
    #: Per pool: since when its released training has waited unplaced (kept in the state).
    stalled_since: Mapping[str, float] = field(default_factory=dict)
    reasons: tuple[str, ...] = ()
    #: Nodes to reserve -> the pool (the reservation taint's value); their replicas are evicted once it is on.
    reserve: Mapping[str, str] = field(default_factory=dict)
    #: Reserved nodes whose reservation comes off.
    release: tuple[str, ...] = ()
    #: Per node reserved now or about to be: since when (kept in the state).
    reserved_since: Mapping[str, float] = field(default_factory=dict)


def plan_clear(snapshot: Snapshot, stalled_since: Mapping[str, float], reserved_since: Mapping[str, float],
               now: float, after_s: float, hold_s: float) -> ClearPlan:
    """Make room for released training that does not fit its pool's free GPUs node by node and has waited
    ``after_s`` unplaced: reserve, then empty, the fewest nodes that hold its pods once empty: in a pool with a
    topology the nodes of the leaves with the most free GPUs first (the gang, placed by its leaves, spans the
    fewest), then the nodes with the fewest replica GPUs (what is displaced anyway is at risk, and the standby
    already covers it).

    Why: Volcano 1.14.1 places such a gang neither by `allocate` (it discards a gang it cannot place whole) nor by
    `reclaim` (it places a task only onto a node holding pods it may reclaim), when it needs both empty nodes and
    nodes inference holds; it would wait for good. Training still behind the gate is the handover's to wait for,
    not this; ``after_s`` leaves the scheduler time to reclaim where it can. 0 turns it off (and gives back every
    reservation).

    Make before break, for the gang: a node is evicted only once it carries the reservation (a later decision sees
    it), which inference does not tolerate, so an evicted replica's replacement cannot bind to the GPUs just freed
    (at the prod size each one did, before Volcano's next session could place the gang). A reservation is kept while
    its pool's training waits unplaced, even once it fits (that is when the scheduler places it), and given back
    when the training is placed, or after ``hold_s``: then the stall restarts, so training the scheduler holds back
    for another reason idles no GPUs for good. O(pools × pod sizes × nodes with replicas there + reserved nodes)."""
    first_seen = {node: reserved_since.get(node, now) for node in snapshot.reserved}
    if after_s <= 0:
        return ClearPlan(release=tuple(sorted(snapshot.reserved)), reserved_since=first_seen)
    held_by_pool: dict[str, set[str]] = {}
    for node, pool in snapshot.reserved.items():
        held_by_pool.setdefault(pool, set()).add(node)
    gated = {snapshot.gated_pool.get(ref) for ref in snapshot.gated_pods}
    since: dict[str, float] = {}
    keep: set[str] = set()
    reserve: dict[str, str] = {}
    evictions: list[PodRef] = []
    reasons: list[str] = []
    for pool, gpus in sorted(snapshot.unplaced_training.items()):
        room = snapshot.pools.get(pool)
        held = held_by_pool.get(pool, set())
        if not pool or gpus <= 0 or pool in gated or gated & {None, ""} or room is None:
            continue
        fits = _fits_free(gpus, room)
        if fits and not held:
            continue
        first = since[pool] = stalled_since.get(pool, now)
        if held and now - min(first_seen[n] for n in held) >= hold_s:
            since[pool] = now
            reasons.append(f"handover: training released for pool {pool} still unplaced after {hold_s:.0f}s of "
                           f"reservation; {len(held)} nodes given back, clearing again after {after_s:.0f}s")
            continue
        keep |= held
        if fits or now - first < after_s or not room.unplaced_pods:
            continue
        left, _ = _place_on_free(room.unplaced_pods, room.free_nodes)
        # Reserved nodes first, so a clearing under way keeps its nodes as their replicas leave; then the leaves with
        # the most free GPUs (where the waiting training's placeable part already is, so it spans the fewest).
        leaf_free = room.free_by_leaf
        nodes = sorted(snapshot.clearable.get(pool, ()),
                       key=lambda n: (n.name not in held, -leaf_free.get(n.leaf, 0), n.room - n.free, n.name))
        chosen: list[NodeRoom] = []
        taken: set[str] = set()
        for size in sorted(left, reverse=True):  # each size takes the first nodes with room, in that order
            fitting = [n for n in nodes if n.room >= size and n.name not in taken][: left[size]]
            taken.update(n.name for n in fitting)
            chosen += fitting
        keep |= taken
        ready = [n for n in chosen if n.name in held]
        refs = [ref for node in ready for ref, _ in node.replicas]
        reserve.update({n.name: pool for n in chosen if n.name not in held})
        if len(ready) < len(chosen):
            reasons.append(f"handover: training released for pool {pool} unplaced for {now - first:.0f}s where it "
                           f"does not fit the free GPUs; reserving {len(chosen) - len(ready)} nodes before clearing")
        if refs:
            evictions += refs
            reasons.append(f"handover: training released for pool {pool} unplaced for {now - first:.0f}s where it "
                           f"does not fit the free GPUs; evicting {len(refs)} replicas from reserved "
                           f"{', '.join(n.name for n in ready[:5])}{' …' if len(ready) > 5 else ''}")
    release = tuple(sorted(node for node in snapshot.reserved if node not in keep))
    # A reservation being released keeps its first sight until it is seen gone: a release the API refused cannot
    # restart its hold.
    seen = {**first_seen, **{node: first_seen.get(node, now) for node in reserve}}
    return ClearPlan(tuple(evictions), since, tuple(reasons), reserve, release, seen)
