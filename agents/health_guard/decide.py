"""Pure decision core of the health guard: readings, nodes and the previous state in; actions and the new
state out. No clock, no I/O: the shell and the decision tables in the tests feed it.

The policy, and why:

* **Reading a signal.** A node whose exporter has not reported within ``stale_after_seconds`` (or never)
  is *unknown* for that exporter's signals: never unhealthy (a broken exporter must not drain the fleet)
  and never healthy (no release on no evidence). With the exporter fresh, a signal without a sample reads
  *clear*: count and increase queries return nothing when nothing happened.
* **Quarantine.** A signal at or above its threshold continuously for its hold marks the node with the
  signal's class; the worst class wins. Any non-firing reading restarts the hold, as Prometheus' ``for``.
* **Guard rails.** Candidates are taken worst first, then longest firing, then by name. A candidate that
  would exceed a limit (nodes quarantined now, distinct nodes quarantined in the last hour, the same two as
  a share of the node's pool) is not quarantined and *trips the breaker*: from then on no node is
  quarantined until a person resets it, however much later. Drains and releases go on.
* **While quarantined.** Every cycle the node's pods are drained again (idempotent: only what is still
  there is evicted); a degraded node that turns fatal is escalated (not rate-limited: no new node).
* **Release.** Every signal that quarantined the node reads clear, and nothing else fires or sits between
  clear and threshold (temperature hysteresis), for ``probation_seconds`` without a break; a break restarts
  probation (a flapping node stays out). ``fatal`` needs the repair mark as well, and so does a node
  quarantined ``flap_limit`` times within the flap window.
* **People win.** A node labelled opt-out is left alone. If an operator removes the taint by hand, the guard
  removes its own marks and ignores the signals that were firing on that node until they have read clear
  once. That decision is kept on the node (an annotation), so a restart or a new leader honours it too.
* **Switch faults.** Many nodes under one leaf switch whose InfiniBand signals go bad together are one fault,
  the switch's (:mod:`agents.health_guard.switches`, judged first): the leaf is fenced as one unit, and its nodes
  are not judged on InfiniBand signals meanwhile, so none is drained for it and the rails never count it.
* **No reading is no evidence.** A NaN reading is *unknown*, like a stale one: it neither quarantines nor
  counts toward a release.
* **Clocks in memory.** Holds and probation restart when the guard restarts or the lease changes hands:
  both mean "observed without a break", and a new leader cannot vouch for what nobody observed in the gap.
  Starting over costs at most one hold (quarantine later) or one probation (release later), never a wrong
  release; the node's history (rate limit, flap count) is on the node and survives.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from agents.health_guard.contract import SEVERITY, HealthClass, HealthSettings, Signal
from agents.health_guard.switches import (
    FENCED,
    LeafNode,
    SwitchAction,
    Switches,
    SwitchMarks,
    SwitchStatus,
    judge,
)

HOUR = 3600.0


class Reading(enum.StrEnum):
    FIRING = "firing"
    BETWEEN = "between"
    """Below the threshold, not yet below the clear level (hysteresis)."""
    CLEAR = "clear"
    UNKNOWN = "unknown"


class NodeStatus(enum.StrEnum):
    HEALTHY = "healthy"
    UNKNOWN = "unknown"
    PENDING = "pending"
    SUPPRESSED = "suppressed"
    QUARANTINED = "quarantined"
    PROBATION = "probation"
    AWAITING_REPAIR = "awaiting-repair"
    OPTED_OUT = "opted-out"
    SWITCH_FAULT = "switch-fault"
    """Fenced with its leaf (its switch is at fault), and not quarantined on its own."""


@dataclass(frozen=True)
class NodeView:
    """What the guard sees of a Kubernetes node (the shell reads it from labels, annotations, taints)."""

    name: str
    pool: str = ""
    quarantined: HealthClass | None = None
    """Value of our taint, if the node carries it."""
    marked: bool = False
    """Our class label is on the node (we quarantined it, or left marks behind)."""
    reasons: tuple[str, ...] = ()
    condition_false: bool = False
    """``GpuHealthy=False`` is set (the condition can be lost if a status patch failed)."""
    repaired: bool = False
    opted_out: bool = False
    history: tuple[float, ...] = ()
    """Epoch seconds of its recent quarantines, from its annotation."""
    overridden: frozenset[str] = frozenset()
    """Signals an operator overrode on this node (its annotation), ignored until each reads clear once."""
    switch: SwitchMarks = field(default_factory=SwitchMarks)
    """Its leaf switch, and the marks of a switch fault on it."""


@dataclass(frozen=True)
class Observations:
    readings: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    """Signal name → node → value."""
    last_seen: Mapping[str, Mapping[str, float]] = field(default_factory=dict)
    """Exporter name → node → epoch seconds of its newest sample."""
    failed: frozenset[str] = frozenset()
    """Signals whose query failed this cycle: unknown everywhere."""


@dataclass(frozen=True)
class GuardState:
    firing_since: Mapping[tuple[str, str], float] = field(default_factory=dict)
    """(node, signal) → since when the signal has fired without a break."""
    healthy_since: Mapping[str, float] = field(default_factory=dict)
    """Quarantined node → since when it has been healthy without a break (probation clock)."""
    overridden: Mapping[str, frozenset[str]] = field(default_factory=dict)
    """Node → signals ignored since an operator removed the taint by hand, until they read clear."""
    switch_healthy_since: Mapping[str, float] = field(default_factory=dict)
    """Faulted leaf → since when it has looked healthy without a break (its probation clock)."""
    switch_releasing: frozenset[str] = frozenset()
    """Leaves released whose marks may still be on some nodes (a patch failed): unfenced again, not re-judged."""


@dataclass(frozen=True)
class Quarantine:
    node: str
    health_class: HealthClass
    reasons: tuple[str, ...]
    history: tuple[float, ...]
    """The node's history including this quarantine (written back to the node)."""
    escalation: bool = False


@dataclass(frozen=True)
class Drain:
    """Evict training pods from the node (and inference, for fatal) — whatever is still there."""

    node: str
    health_class: HealthClass


@dataclass(frozen=True)
class MarkCondition:
    """Re-assert ``GpuHealthy=False`` on a quarantined node that lost it."""

    node: str
    health_class: HealthClass
    reasons: tuple[str, ...]


@dataclass(frozen=True)
class Release:
    node: str
    health_class: HealthClass | None
    why: str


@dataclass(frozen=True)
class RecordOverride:
    """Write the node's overridden signals (empty: remove the annotation) so the decision outlives this process."""

    node: str
    signals: frozenset[str]


@dataclass(frozen=True)
class Suppress:
    node: str
    health_class: HealthClass
    reasons: tuple[str, ...]
    limit: str


@dataclass(frozen=True)
class TripBreaker:
    reason: str


Action = Quarantine | Drain | MarkCondition | Release | RecordOverride | Suppress | TripBreaker | SwitchAction


@dataclass(frozen=True)
class Decision:
    actions: tuple[Action, ...]
    state: GuardState
    status: Mapping[str, NodeStatus]
    readings: Mapping[str, Mapping[str, Reading]]
    """Node → signal → reading, for the metrics."""
    breaker_tripped: bool
    switches: Mapping[str, SwitchStatus] = field(default_factory=dict)
    """Leaf → status, for the leaves that are suspect or fenced."""


def read(settings: HealthSettings, obs: Observations, signal: Signal, node: str, now: float) -> Reading:
    seen = obs.last_seen.get(signal.exporter, {}).get(node)
    if signal.name in obs.failed or seen is None or now - seen > settings.stale_after_seconds:
        return Reading.UNKNOWN
    value = obs.readings.get(signal.name, {}).get(node)
    if value is None:
        return Reading.CLEAR  # a fresh exporter and no sample: count and increase queries say nothing happened
    if math.isnan(value):
        return Reading.UNKNOWN  # a sample without a value: no evidence either way
    if value >= signal.threshold:
        return Reading.FIRING
    return Reading.BETWEEN if value >= signal.clear else Reading.CLEAR


def pool_allowance(percent: float, size: int) -> int:
    """Nodes a percentage of a pool allows: rounded down, but at least one unless the percentage is 0."""
    if percent <= 0 or size <= 0:
        return 0
    return max(1, math.floor(percent * size / 100 + 1e-9))


@dataclass(frozen=True)
class _Candidate:
    node: NodeView
    health_class: HealthClass
    reasons: tuple[str, ...]
    since: float


def decide(
    settings: HealthSettings,
    obs: Observations,
    nodes: Mapping[str, NodeView],
    state: GuardState,
    now: float,
    breaker: str | None = None,
) -> Decision:
    """One guard cycle. ``breaker`` is the tripped breaker's note as persisted (``None``: not tripped)."""
    actions: list[Action] = []
    firing_since: dict[tuple[str, str], float] = {}
    healthy_since: dict[str, float] = {}
    overridden: dict[str, frozenset[str]] = {}
    status: dict[str, NodeStatus] = {}
    readings: dict[str, dict[str, Reading]] = {}
    candidates: list[_Candidate] = []
    quarantined_now: dict[str, int] = {}  # pool → nodes
    total_now = 0

    fabric = settings.fabric_signals
    judged: dict[str, tuple[frozenset[str], list[tuple[Signal, float]]]] = {}  # node → (ignored, held)
    for name in sorted(nodes):
        node = nodes[name]
        r = {s.name: read(settings, obs, s, name, now) for s in settings.signals}
        readings[name] = r
        if node.opted_out:
            status[name] = NodeStatus.OPTED_OUT
            if node.quarantined is not None:
                total_now += 1
                quarantined_now[node.pool] = quarantined_now.get(node.pool, 0) + 1
            continue
        prior = state.overridden.get(name, frozenset()) | node.overridden
        ignored = frozenset(s for s in prior if r.get(s) is not Reading.CLEAR)
        held: list[tuple[Signal, float]] = []
        for s in settings.signals:
            if r[s.name] is Reading.FIRING and s.name not in ignored:
                since = state.firing_since.get((name, s.name), now)
                firing_since[(name, s.name)] = since
                if now - since >= s.hold_seconds:
                    held.append((s, since))
        judged[name] = (ignored, held)

    switches = _switches(settings, nodes, readings, judged, state, now)
    actions += switches.actions
    for name, (ignored, held) in judged.items():
        node = nodes[name]
        r = readings[name]
        extra = switches.overrides.get(name, frozenset())
        if extra:  # the leaf's taint was removed by hand: what fires now is ignored here until it reads clear
            ignored |= extra
            for signal in extra:
                firing_since.pop((name, signal), None)
        if name in switches.excluded:  # its switch's fault, not the node's
            held = [(s, t) for s, t in held if s.name not in fabric]
        held = [(s, t) for s, t in held if s.name not in ignored]
        if ignored:
            overridden[name] = ignored
        worst = max((SEVERITY[s.health_class] for s, _ in held), default=0)
        active = [(s, t) for s, t in held if SEVERITY[s.health_class] == worst]

        if node.quarantined is None and node.marked:
            actions.append(Release(name, None, "our taint was removed by hand"))
            # The operator decided: what fires now is ignored on this node until it reads clear once.
            overridden[name] = frozenset(s.name for s, _ in held) | ignored
            for s, _ in held:
                firing_since.pop((name, s.name), None)
            if overridden[name] != node.overridden:
                actions.append(RecordOverride(name, overridden[name]))
            status[name] = NodeStatus.HEALTHY
            continue
        if ignored != node.overridden:
            actions.append(RecordOverride(name, ignored))

        if node.quarantined is not None:
            total_now += 1
            quarantined_now[node.pool] = quarantined_now.get(node.pool, 0) + 1
            cls = node.quarantined
            reasons = node.reasons
            if active and SEVERITY[active[0][0].health_class] > SEVERITY[cls]:
                cls = active[0][0].health_class
                reasons = tuple(sorted({*reasons, *(s.name for s, _ in active)}))
                actions.append(Quarantine(name, cls, reasons, node.history, escalation=True))
            elif not node.condition_false:
                actions.append(MarkCondition(name, cls, reasons))
            actions.append(Drain(name, cls))
            status[name] = _probation(settings, node, cls, reasons, r, state, healthy_since, now, actions)
            continue

        if active:
            since = min(t for _, t in active)
            candidates.append(_Candidate(node, active[0][0].health_class, tuple(sorted(s.name for s, _ in active)),
                                         since))
        elif any(v is Reading.FIRING for k, v in r.items() if k not in ignored):
            status[name] = NodeStatus.PENDING
        elif r and all(v is Reading.UNKNOWN for v in r.values()):
            status[name] = NodeStatus.UNKNOWN
        else:
            status[name] = NodeStatus.HEALTHY

    tripped = breaker is not None
    if candidates:
        tripped = _admit(settings, nodes, candidates, quarantined_now, total_now, tripped, breaker, now,
                         actions, status)
    for name in switches.fenced:
        if status.get(name) in (NodeStatus.HEALTHY, NodeStatus.PENDING, NodeStatus.UNKNOWN):
            status[name] = NodeStatus.SWITCH_FAULT
    return Decision(
        tuple(actions),
        GuardState(firing_since, healthy_since, overridden, switches.healthy_since, switches.releasing),
        status,
        readings,
        tripped,
        switches.leaves,
    )


def _switches(
    settings: HealthSettings,
    nodes: Mapping[str, NodeView],
    readings: Mapping[str, Mapping[str, Reading]],
    judged: Mapping[str, tuple[frozenset[str], list[tuple[Signal, float]]]],
    state: GuardState,
    now: float,
) -> Switches:
    """The leaves' judgement, from the nodes under a leaf or carrying our marks (opted-out nodes are left alone)."""
    fabric = settings.fabric_signals
    leaf_nodes: dict[str, LeafNode] = {}
    for name, (ignored, held) in judged.items():
        marks = nodes[name].switch
        if not (marks.leaf or marks.any):
            continue
        r = readings[name]
        leaf_nodes[name] = LeafNode(
            name, marks,
            firing=frozenset(s for s in fabric if r[s] is Reading.FIRING and s not in ignored),
            held=frozenset(s.name for s, _ in held if s.name in fabric),
            clear=all(r[s] is Reading.CLEAR or s in ignored for s in fabric),
            own_quarantine=nodes[name].quarantined is not None,
        )
    return judge(settings, leaf_nodes, state.switch_healthy_since, now, state.switch_releasing)


def fenced_leaves(decision: Decision) -> list[str]:
    """The leaves whose nodes carry the switch-fault taint after this decision (for the metrics)."""
    return sorted(leaf for leaf, status in decision.switches.items() if status in FENCED)


def _probation(
    settings: HealthSettings,
    node: NodeView,
    cls: HealthClass,
    reasons: Sequence[str],
    r: Mapping[str, Reading],
    state: GuardState,
    healthy_since: dict[str, float],
    now: float,
    actions: list[Action],
) -> NodeStatus:
    known = [x for x in reasons if x in r] or [s.name for s in settings.signals if s.health_class is cls]
    healthy = all(r[x] is Reading.CLEAR for x in known) and not any(
        v in (Reading.FIRING, Reading.BETWEEN) for v in r.values()
    )
    if not healthy:
        return NodeStatus.QUARANTINED
    since = state.healthy_since.get(node.name, now)
    if now - since < settings.probation_seconds:
        healthy_since[node.name] = since
        return NodeStatus.PROBATION
    recent = [t for t in node.history if now - t <= settings.flap_window_seconds]
    flapping = len(recent) >= settings.flap_limit
    if (cls is HealthClass.FATAL or flapping) and not node.repaired:
        healthy_since[node.name] = since
        return NodeStatus.AWAITING_REPAIR
    why = f"healthy for {settings.probation_seconds}s"
    if cls is HealthClass.FATAL or flapping:
        why += " and marked repaired"
    actions.append(Release(node.name, cls, why))
    return NodeStatus.HEALTHY


def _admit(
    settings: HealthSettings,
    nodes: Mapping[str, NodeView],
    candidates: list[_Candidate],
    quarantined_now: dict[str, int],
    total_now: int,
    tripped: bool,
    breaker: str | None,
    now: float,
    actions: list[Action],
    status: dict[str, NodeStatus],
) -> bool:
    """Quarantine candidates worst first while every limit holds; the first refusal trips the breaker."""
    pool_size: dict[str, int] = {}
    for n in nodes.values():
        pool_size[n.pool] = pool_size.get(n.pool, 0) + 1
    hour_nodes: dict[str, set[str]] = {}
    for n in nodes.values():
        if any(0 <= now - t < HOUR for t in n.history):
            hour_nodes.setdefault(n.pool, set()).add(n.name)
    candidates.sort(key=lambda c: (-SEVERITY[c.health_class], c.since, c.node.name))
    for c in candidates:
        n = c.node
        if tripped:
            actions.append(Suppress(n.name, c.health_class, c.reasons,
                                    f"the breaker is tripped ({breaker or 'this cycle'}); a person must reset it"))
            status[n.name] = NodeStatus.SUPPRESSED
            continue
        in_hour = {x for names in hour_nodes.values() for x in names}
        pool_hour = hour_nodes.get(n.pool, set())
        limit = _exceeded(settings, total_now, len(in_hour | {n.name}), quarantined_now.get(n.pool, 0),
                          len(pool_hour | {n.name}), pool_size.get(n.pool, 0), n.pool)
        if limit:
            actions.append(Suppress(n.name, c.health_class, c.reasons, limit))
            actions.append(TripBreaker(f"{n.name} ({c.health_class}: {', '.join(c.reasons)}) refused: {limit}"))
            status[n.name] = NodeStatus.SUPPRESSED
            tripped = True
            continue
        history = (*[t for t in n.history if now - t <= settings.flap_window_seconds], now)
        actions.append(Quarantine(n.name, c.health_class, c.reasons, history))
        actions.append(Drain(n.name, c.health_class))
        status[n.name] = NodeStatus.QUARANTINED
        total_now += 1
        quarantined_now[n.pool] = quarantined_now.get(n.pool, 0) + 1
        hour_nodes.setdefault(n.pool, set()).add(n.name)
    return tripped


def _exceeded(
    settings: HealthSettings, total: int, hour: int, pool_total: int, pool_hour: int, pool_size: int, pool: str
) -> str | None:
    """The first limit one more quarantine would exceed, as a sentence; ``None`` if all hold."""
    if total + 1 > settings.max_nodes_quarantined:
        return f"{total} nodes already quarantined, max_nodes_quarantined is {settings.max_nodes_quarantined}"
    if hour > settings.max_nodes_per_hour:
        return f"would be node {hour} quarantined within an hour, max_nodes_per_hour is {settings.max_nodes_per_hour}"
    allowed = pool_allowance(settings.max_pool_percent_quarantined, pool_size)
    if pool_total + 1 > allowed:
        return (f"pool {pool or '-'} has {pool_total} of {pool_size} nodes quarantined, "
                f"max_pool_percent_quarantined {settings.max_pool_percent_quarantined:g} % allows {allowed}")
    allowed = pool_allowance(settings.max_pool_percent_per_hour, pool_size)
    if pool_hour > allowed:
        return (f"would be node {pool_hour} of pool {pool or '-'} ({pool_size} nodes) within an hour, "
                f"max_pool_percent_per_hour {settings.max_pool_percent_per_hour:g} % allows {allowed}")
    return None
