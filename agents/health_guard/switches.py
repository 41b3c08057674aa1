"""Switch faults, judged per leaf switch before :mod:`agents.health_guard.decide` judges nodes one by one. Pure.

Why: a leaf switch that flaps reads as every node under it losing its InfiniBand ports at once. Node by node the
guard either drained the whole leaf through its rails (a quarantine and a gang eviction each) or tripped its breaker
on the first node past a limit and then did nothing. Seen as one fault, the leaf's nodes are kept out of new
placement together, nothing is evicted (a gang whose collective crosses the dead switch crashes and restarts on its
own, and the taint sends it elsewhere), and the rails and the breaker never count it.

The rule (the InfiniBand signals are those read from the ``ib`` exporter, :attr:`HealthSettings.fabric_signals`):

* **Bad.** A node is bad for its leaf while one of its InfiniBand signals fires (an operator's override aside).
  The leaf needs ``need(size) = max(2, min(switch_fault_min_nodes, ceil(switch_fault_leaf_percent % of size)))``
  bad nodes; one node's bad port is never its switch's.
* **Suspect.** ``need`` nodes are bad but fewer have held their signal for its hold: none of the leaf's nodes is
  quarantined for an InfiniBand signal meanwhile (the one whose hold ends first must not be drained for what is
  the switch's). Their holds go on counting; other signals are judged as always.
* **Fault.** ``need`` nodes have held an InfiniBand signal: one decision for the leaf (:class:`SwitchFault`), and
  every node under it gets ``<prefix>/switch-fault=<leaf>:NoSchedule`` (:class:`SwitchFence`). While the taint is
  on any node of the leaf, none of its nodes is judged on InfiniBand signals. The class is the worst of the
  signals' (a port down: fatal; error bursts: degraded).
* **Release.** Fewer than ``need`` of the leaf's nodes (those quarantined on their own aside) have an InfiniBand
  signal that is not clear (firing, or unknown: no reading is no evidence), for ``probation_seconds`` without a
  break; a fatal switch fault also needs the switch's repair mark on any node of the leaf. What is left firing
  after that is those nodes' own fault, judged node by node from then on.
* **People win.** Our taint removed by hand from every node of the leaf releases it; the InfiniBand signals firing
  then are ignored on those nodes until each reads clear once (the node override of :mod:`decide`).
* **A release is finished.** Unfencing a leaf is one patch per node, and one may fail (a conflict with the node-pool
  agent's write): the leaf is remembered as releasing and the rest are unfenced next cycle, rather than the leaf
  read back as at fault (probation over again, its repair mark already consumed on the nodes that were unfenced).
"""

from __future__ import annotations

import enum
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from agents.health_guard.contract import SEVERITY, HealthClass, HealthSettings


class SwitchStatus(enum.StrEnum):
    SUSPECT = "suspect"
    FAULT = "fault"
    PROBATION = "probation"
    AWAITING_REPAIR = "awaiting-repair"


FENCED = frozenset({SwitchStatus.FAULT, SwitchStatus.PROBATION, SwitchStatus.AWAITING_REPAIR})
"""The states in which the leaf's nodes carry the switch-fault taint."""


@dataclass(frozen=True)
class SwitchMarks:
    """A node's leaf and the switch-fault marks on it (the shell reads them from labels, annotations, taints)."""

    leaf: str = ""
    spine: str = ""
    fault: str | None = None
    """The value (a leaf) of our switch-fault taint, if the node carries it."""
    marked: str | None = None
    """The value of our switch-fault label: with no taint on any node of that leaf, a person removed it."""
    reasons: tuple[str, ...] = ()
    condition_false: bool = False
    repaired: bool = False
    """The switch's repair mark is on this node."""

    @property
    def any(self) -> bool:
        return bool(self.fault or self.marked or self.reasons or self.condition_false or self.repaired)


@dataclass(frozen=True)
class LeafNode:
    """One node as its leaf's judgement needs it (built by :func:`agents.health_guard.decide.decide`)."""

    name: str
    marks: SwitchMarks
    firing: frozenset[str] = frozenset()
    """InfiniBand signals firing now (those an operator overrode aside)."""
    held: frozenset[str] = frozenset()
    """Of those, the ones firing for at least their hold."""
    clear: bool = True
    """Every InfiniBand signal reads clear (not firing, not unknown)."""
    own_quarantine: bool = False
    """Quarantined on its own (the health taint): its readings are its business, not its switch's."""


@dataclass(frozen=True)
class SwitchFence:
    """Put (or keep) one node of a faulted leaf out of new placement: our taint, label, reasons, condition."""

    node: str
    leaf: str
    health_class: HealthClass
    reasons: tuple[str, ...]
    declared: bool = False
    """Part of this cycle's declaration: a repair mark left from before is removed, so it cannot release this."""


@dataclass(frozen=True)
class SwitchUnfence:
    node: str
    leaf: str
    why: str


@dataclass(frozen=True)
class SwitchFault:
    """The one switch-level decision: the leaf's switch is at fault (its Event, its log line)."""

    leaf: str
    spine: str
    health_class: HealthClass
    reasons: tuple[str, ...]
    bad: tuple[str, ...]
    """Its nodes whose InfiniBand signals held (the Event is on the first)."""
    size: int


@dataclass(frozen=True)
class SwitchRelease:
    leaf: str
    why: str
    nodes: tuple[str, ...]
    """The nodes it is released on (the Event is on the first)."""


SwitchAction = SwitchFence | SwitchUnfence | SwitchFault | SwitchRelease


@dataclass(frozen=True)
class Switches:
    """Every leaf's judgement in one cycle."""

    actions: tuple[SwitchAction, ...] = ()
    leaves: Mapping[str, SwitchStatus] = field(default_factory=dict)
    """Leaf → status, for the leaves that are suspect or fenced."""
    excluded: frozenset[str] = frozenset()
    """Nodes not judged on InfiniBand signals this cycle: their leaf is suspect or at fault."""
    fenced: frozenset[str] = frozenset()
    """Nodes of a leaf at fault (a node status of their own)."""
    overrides: Mapping[str, frozenset[str]] = field(default_factory=dict)
    """Node → InfiniBand signals to ignore until each reads clear once: the leaf's taint was removed by hand."""
    healthy_since: Mapping[str, float] = field(default_factory=dict)
    """Faulted leaf → since when it has looked healthy without a break (probation clock)."""
    releasing: frozenset[str] = frozenset()
    """Leaves released whose marks may still be on some nodes."""


def need(settings: HealthSettings, size: int) -> int:
    """Bad nodes that make a leaf of ``size`` nodes a switch fault (module docstring)."""
    share = math.ceil(settings.switch_fault_leaf_percent * size / 100 - 1e-9)
    return max(2, min(settings.switch_fault_min_nodes, share))


def worst(settings: HealthSettings, reasons: Iterable[str]) -> HealthClass:
    """The worst class of ``reasons``; fatal for none or an unknown signal (the strict reading)."""
    classes = {s.name: s.health_class for s in settings.signals}
    found = [classes.get(r, HealthClass.FATAL) for r in reasons]
    return max(found, key=lambda c: SEVERITY[c], default=HealthClass.FATAL)


def judge(settings: HealthSettings, nodes: Mapping[str, LeafNode], healthy_since: Mapping[str, float],
          now: float, releasing: frozenset[str] = frozenset()) -> Switches:
    """Every leaf named by a node's leaf label or by our marks, in name order; ``healthy_since`` and ``releasing``
    are the previous cycle's."""
    members: dict[str, list[LeafNode]] = {}
    carrying: dict[str, list[LeafNode]] = {}
    marked: dict[str, list[LeafNode]] = {}
    for n in sorted(nodes.values(), key=lambda n: n.name):
        if n.marks.leaf:
            members.setdefault(n.marks.leaf, []).append(n)
        if n.marks.fault:
            carrying.setdefault(n.marks.fault, []).append(n)
        if n.marks.marked:
            marked.setdefault(n.marks.marked, []).append(n)
    out = _Out()
    for leaf in sorted(set(members) | set(carrying) | set(marked)):
        under = members.get(leaf, [])
        ours = carrying.get(leaf, []) + marked.get(leaf, [])
        if leaf in releasing and ours:
            out.releasing.add(leaf)
            out.excluded |= {n.name for n in under}
            touched = {n.name: n for n in [*ours, *(n for n in under if n.marks.any)]}
            out.actions += [SwitchUnfence(name, leaf, "finishing the release") for name in sorted(touched)]
        elif leaf in carrying:
            _at_fault(settings, leaf, under, carrying[leaf] + marked.get(leaf, []), healthy_since, now, out)
        elif leaf in marked:
            _by_hand(leaf, under, marked[leaf], out)
        else:
            _judge_new(settings, leaf, under, out)
    return Switches(tuple(out.actions), out.leaves, frozenset(out.excluded), frozenset(out.fenced), out.overrides,
                    out.healthy_since, frozenset(out.releasing))


@dataclass
class _Out:
    actions: list[SwitchAction] = field(default_factory=list)
    leaves: dict[str, SwitchStatus] = field(default_factory=dict)
    excluded: set[str] = field(default_factory=set)
    fenced: set[str] = field(default_factory=set)
    overrides: dict[str, frozenset[str]] = field(default_factory=dict)
    healthy_since: dict[str, float] = field(default_factory=dict)
    releasing: set[str] = field(default_factory=set)


def _signals(held: list[LeafNode]) -> set[str]:
    return {s for n in held for s in n.held}


def _judge_new(settings: HealthSettings, leaf: str, under: list[LeafNode], out: _Out) -> None:
    threshold = need(settings, len(under))
    held = [n for n in under if n.held]
    if len(held) >= threshold:
        reasons = tuple(sorted(_signals(held)))
        cls = worst(settings, reasons)
        spine = next((n.marks.spine for n in under if n.marks.spine), "")
        out.actions.append(SwitchFault(leaf, spine, cls, reasons, tuple(n.name for n in held), len(under)))
        out.actions += [SwitchFence(n.name, leaf, cls, reasons, declared=True) for n in under]
        out.leaves[leaf] = SwitchStatus.FAULT
        out.excluded |= {n.name for n in under}
        out.fenced |= {n.name for n in under}
    elif sum(1 for n in under if n.firing) >= threshold:
        out.leaves[leaf] = SwitchStatus.SUSPECT
        out.excluded |= {n.name for n in under}
    if leaf not in out.leaves:  # a condition left behind by a release whose status write failed
        out.actions += [SwitchUnfence(n.name, leaf, "a stale condition") for n in under if n.marks.condition_false]


def _at_fault(settings: HealthSettings, leaf: str, under: list[LeafNode], ours: list[LeafNode],
              healthy_since: Mapping[str, float], now: float, out: _Out) -> None:
    threshold = need(settings, len(under))
    names = {n.name for n in under}
    strays = {n.name: n for n in ours if n.name not in names}  # our marks for this leaf, on a node now elsewhere
    out.actions += [SwitchUnfence(name, leaf, f"no longer under leaf {leaf}") for name in sorted(strays)]
    recorded = {r for n in ours if n.name in names for r in n.marks.reasons}
    held = [n for n in under if n.held]
    worse = _signals(held) if len(held) >= threshold else set()
    reasons = tuple(sorted(recorded | worse))
    cls = worst(settings, reasons)
    out.excluded |= names
    unclear = [n for n in under if not n.own_quarantine and not n.clear]
    status = SwitchStatus.FAULT
    if len(unclear) < threshold:
        since = healthy_since.get(leaf, now)
        status = SwitchStatus.PROBATION if now - since < settings.probation_seconds else SwitchStatus.AWAITING_REPAIR
        repaired = any(n.marks.repaired for n in under)
        if status is SwitchStatus.AWAITING_REPAIR and (cls is not HealthClass.FATAL or repaired):
            why = (f"fewer than {threshold} of its {len(under)} nodes' InfiniBand signals not clear for "
                   f"{settings.probation_seconds}s" + (" and marked repaired" if cls is HealthClass.FATAL else ""))
            _release(leaf, [n for n in under if n.marks.any], why, out)
            return
        out.healthy_since[leaf] = since
    out.leaves[leaf] = status
    out.fenced |= names
    out.actions += [SwitchFence(n.name, leaf, cls, reasons) for n in under
                    if (n.marks.fault, n.marks.marked, n.marks.reasons, n.marks.condition_false)
                    != (leaf, leaf, reasons, True)]


def _by_hand(leaf: str, under: list[LeafNode], marked: list[LeafNode], out: _Out) -> None:
    """Our taint is gone from every node of the leaf, our label is not: a person took the leaf back."""
    for n in under:
        if n.firing:
            out.overrides[n.name] = n.firing
            out.excluded.add(n.name)
    touched = {n.name: n for n in [*marked, *(n for n in under if n.marks.any)]}
    _release(leaf, [touched[name] for name in sorted(touched)], "our taint was removed by hand", out)


def _release(leaf: str, nodes: list[LeafNode], why: str, out: _Out) -> None:
    out.releasing.add(leaf)
    out.actions.append(SwitchRelease(leaf, why, tuple(n.name for n in nodes)))
    out.actions += [SwitchUnfence(n.name, leaf, why) for n in nodes]
