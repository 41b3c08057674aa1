"""Invariants a run must keep, judged afterwards from what the API server recorded (pure).

The input is the audit log's requests (:func:`tools.localcluster.rbac_usage.parse_audit`), so the e2e tests and a
long faulted run check with the same code. Agents send ``<agent>/<identity>`` as their User-Agent, which tells the
replicas of one ServiceAccount apart.

Fencing (docs/agents.md): no replica of an agent writes while another holds its Lease, and none writes after a
renewal refused with 409 until it holds the Lease again. Holders are read from the Lease's own writes: a replica
writes its Lease only naming itself (an acquisition or a renewal) or nobody (its release, its last write), so the
last successful write of the Lease before a request names who held it. A write of the Lease by anyone else (a
person, a replica with a skewed clock outside the agent) hands it to someone who is not a replica; a delete to
nobody.

The health guard's quarantines are judged from samples of every node's taint against the GPU faults served
(:func:`quarantine_violations`): one fault, one quarantine; never released while the fault persists.
"""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from tools.localcluster.rbac_usage import Request

WRITE_VERBS = frozenset({"create", "update", "patch", "delete", "deletecollection"})
LEASE_GROUP = "coordination.k8s.io"


@dataclass(frozen=True)
class Violation:
    invariant: str
    #: When the offending request was received (epoch seconds).
    at: float
    detail: str


def _succeeded(r: Request) -> bool:
    return 200 <= r.code < 300


def _describe(r: Request) -> str:
    return f"{r.user_agent or r.user}: {r.describe()}"


def fencing_violations(requests: Iterable[Request], *, agent: str, namespace: str, lease: str) -> list[Violation]:
    """Writes by a replica of ``agent`` while another held its Lease ``namespace/lease``, and writes after a refused
    renewal; in the order they were received."""
    prefix = f"{agent}/"
    ordered = sorted(enumerate(requests), key=lambda pair: (pair[1].received, pair[0]))
    holder: str | None = None
    refused: set[str] = set()
    out: list[Violation] = []
    for _, r in ordered:
        if r.verb not in WRITE_VERBS:
            continue
        mine = r.user_agent.startswith(prefix)
        is_lease = (r.group == LEASE_GROUP and r.resource == "leases" and r.namespace == namespace
                    and (r.name == lease or (r.verb == "create" and not r.name)))
        if is_lease:
            if not _succeeded(r):
                if mine and r.code == 409:
                    refused.add(r.user_agent)
            elif r.verb in ("delete", "deletecollection"):
                holder = None
            elif mine:
                holder = r.user_agent
                refused.discard(r.user_agent)
            else:
                holder = f"{r.user_agent or r.user} (not a replica of {agent})"
            continue
        if not mine or not _succeeded(r):
            continue
        if r.user_agent in refused:
            out.append(Violation("write-after-refused-renewal", r.received,
                                 f"{_describe(r)} after its renewal of {namespace}/{lease} was refused (409)"))
        elif holder is not None and holder != r.user_agent:
            out.append(Violation("write-while-another-held-the-lease", r.received,
                                 f"{_describe(r)} while {holder} held {namespace}/{lease}"))
    return out


def repeated_evictions(requests: Iterable[Request], *, agent: str, since: float = 0.0,
                       faults: Iterable[float] = ()) -> list[Violation]:
    """Pods evicted more than once by ``agent`` (any replica) from ``since`` within one fault's window: one fault,
    one eviction per pod. A pod that comes back under the same name (a gang's pod replaced after its node's fault)
    is a new pod, and the audit log names pods, not their UIDs: so the count starts over at each of ``faults``
    (the times faults that lead to evictions began), and only a name evicted twice between two of them is one pod
    evicted twice."""
    starts = sorted(t for t in faults if t >= since)
    evicted = Counter((bisect.bisect_right(starts, r.received), r.namespace, r.name) for r in requests
                      if r.received >= since and r.verb == "create" and r.resource == "pods/eviction"
                      and r.user_agent.startswith(f"{agent}/") and _succeeded(r))
    return [Violation("one-eviction-per-pod", starts[window - 1] if window else since,
                      f"{agent} evicted {ns}/{name} {count} times"
                      + (f" after the fault at {starts[window - 1]:.0f}" if window else ""))
            for (window, ns, name), count in sorted(evicted.items()) if count > 1]


@dataclass(frozen=True)
class TaintFlip:
    """A node's burst taint seen changing between two samples: absent at ``before`` and present at ``after``
    (``tainted``: the burst closed there) or the other way round (it opened); the flip happened in between."""

    node: str
    before: float
    after: float
    tainted: bool


def taint_flips(samples: Iterable[tuple[float, str, bool]]) -> list[TaintFlip]:
    """Each node's flips from ``(at, node, tainted)`` samples in time order (a node's first sample is no flip)."""
    last: dict[str, tuple[float, bool]] = {}
    flips: list[TaintFlip] = []
    for at, node, tainted in samples:
        seen = last.get(node)
        if seen is not None and seen[1] != tainted:
            flips.append(TaintFlip(node, seen[0], at, tainted))
        last[node] = (at, tainted)
    return flips


def burst_flip_violations(flips: Iterable[TaintFlip], *, open_after_close_s: float, close_after_open_s: float,
                          slack_s: float = 1.0) -> list[Violation]:
    """Flips closer together than the controller's hysteresis allows. The burst opens (its taint leaves a node)
    only after a shortage that began after the last close has lasted ``open_after_close_s`` (the open hold, or the
    shorter pending grace), and closes only after plenty has lasted ``close_after_open_s`` since it opened; a new
    leader starts its holds over, which only lengthens them. Between two flips the longest the interval can have
    been runs from the sample before the first to the sample after the second, so a gap in the samples (an API
    server restarting) never makes a violation; ``slack_s`` covers the clocks' resolution."""
    by_node: dict[str, TaintFlip] = {}
    out: list[Violation] = []
    for flip in sorted(flips, key=lambda f: (f.after, f.node)):
        prev = by_node.get(flip.node)
        by_node[flip.node] = flip
        if prev is None or prev.tainted == flip.tainted:
            continue
        longest = flip.after - prev.before
        hold = close_after_open_s if flip.tainted else open_after_close_s
        if longest < hold - slack_s:
            what = "closed" if flip.tainted else "opened"
            out.append(Violation("burst-taint-hysteresis", flip.after,
                                 f"{flip.node}: the burst {what} at most {longest:.1f}s after it "
                                 f"{'opened' if flip.tainted else 'closed'} (hold {hold:g}s)"))
    return out


@dataclass(frozen=True)
class GpuFault:
    """A fault a node's GPU exporter served from ``start`` until ``clear`` (epoch seconds); ``seen``: when Prometheus
    first answered with it (None: never, so the guard cannot have known of it either)."""

    node: str
    start: float
    clear: float
    seen: float | None = None


def unquarantined_faults(samples: Iterable[tuple[float, str, bool]], faults: Sequence[GpuFault], *,
                         within_s: float, breaker: Iterable[tuple[float, bool]] = (),
                         slack_s: float = 1.0) -> list[Violation]:
    """GPU faults the health guard never answered: a fault Prometheus showed at ``seen`` must have its node tainted
    (quarantined) in some sample from the fault's start up to ``seen + within_s`` (a node already quarantined counts
    as answered). ``within_s`` is what the guard may take once the reading is queryable: its longest signal hold, one
    poll, and one cycle's deadline. A fault never seen is the soak's problem, not the guard's (named in the report
    apart); the taint is looked for up to the node's first sample at or after the bound, and a node with no sample
    that late is skipped, so a gap in the samples never makes a violation; so is a
    fault while the guard's breaker was seen tripped (``breaker``: (epoch seconds, tripped) samples), which holds
    every quarantine past the rails until a person resets it. O(samples × faults)."""
    by_node: dict[str, list[tuple[float, bool]]] = {}
    for at, node, tainted in samples:
        by_node.setdefault(node, []).append((at, tainted))
    tripped = [at for at, on in breaker if on]
    out: list[Violation] = []
    for fault in faults:
        if fault.seen is None:
            continue
        due = fault.seen + within_s + slack_s
        if any(fault.start <= at <= due for at in tripped):
            continue
        # Up to the first sample at or after the bound: a taint put on before it shows there, so a gap in the
        # samples never makes a violation; no sample that late (the soak ended, the API server away) judges nothing.
        window: list[bool] = []
        for at, tainted in by_node.get(fault.node, ()):
            if at >= fault.start:
                window.append(tainted)
                if at >= due:
                    break
        else:
            continue
        if not any(window):
            out.append(Violation("fault-not-quarantined", due,
                                 f"{fault.node}: the GPU fault served from {fault.start:.0f}, queryable from "
                                 f"{fault.seen:.0f}, left it untainted {within_s:g}s after"))
    return out


def quarantine_violations(flips: Iterable[TaintFlip], faults: Sequence[GpuFault], *, probation_s: float,
                          slack_s: float = 1.0) -> list[Violation]:
    """The health guard's quarantine taint, judged from its flips on every node against the faults served:

    - one fault, one quarantine: each quarantine (the taint appearing) answers a fault on its node that began
      before it was seen and that no earlier quarantine answered — a second one for the same fault is
      ``more-than-one-quarantine-per-fault``, one on a node no fault was served on ``quarantine-without-a-fault``;
    - never released while its fault persists: a release seen (``after``) before the answered fault's clear plus
      the probation is ``released-before-clear-and-probation`` (the release happened at or before it was seen, so
      a gap in the samples never makes a violation; ``slack_s`` covers the clocks' resolution).
    """
    answered: set[GpuFault] = set()
    current: dict[str, GpuFault] = {}  # node -> the fault its quarantine answered
    out: list[Violation] = []
    for flip in sorted(flips, key=lambda f: (f.after, f.node)):
        mine = [f for f in faults if f.node == flip.node and f.start <= flip.after]
        if flip.tainted:
            fresh = [f for f in mine if f not in answered]
            if fresh:
                fault = max(fresh, key=lambda f: f.start)
                answered.add(fault)
                current[flip.node] = fault
            elif mine:
                out.append(Violation("more-than-one-quarantine-per-fault", flip.after,
                                     f"{flip.node} quarantined again by {flip.after:.0f} for the fault served from "
                                     f"{max(f.start for f in mine):.0f}"))
            else:
                out.append(Violation("quarantine-without-a-fault", flip.after,
                                     f"{flip.node} quarantined by {flip.after:.0f} with no fault served there"))
        else:
            released = current.pop(flip.node, None)
            if released is None:
                continue
            due = released.clear + probation_s
            if flip.after < due - slack_s:
                out.append(Violation("released-before-clear-and-probation", flip.after,
                                     f"{flip.node} released by {flip.after:.0f}, {due - flip.after:.0f}s before its "
                                     f"fault's clear ({released.clear:.0f}) plus the {probation_s:g}s probation"))
    return out
