"""What the scale runs measure, as pure functions over what they observed (tested by tables and properties).

- :class:`GangTimes`: when each pod of a gang was first seen, bound and Running (from a watch);
- :class:`Generations`: a gang's pods by UID across a whole-gang restart (the same names come back);
- :func:`percentiles`: p50/p90/p99 of repeated runs (nearest rank, so every figure is a measured one);
- :func:`parse_histogram` / :func:`histogram_quantile`: the API server's own latency histograms, as
  Prometheus reads them (linear within a bucket);
- :func:`requests_by_agent`: requests per second per agent from the API server's audit events.
"""

from __future__ import annotations

import math
import re
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from prometheus_client.parser import text_string_to_metric_families


@dataclass
class PodTimes:
    seen: float
    #: When the pod had no scheduling gate left (the handover gate lifted, or none to begin with).
    ungated: float | None = None
    bound: float | None = None
    running: float | None = None
    deleted: float | None = None
    #: The node it was bound to.
    node: str | None = None


#: The stages a gang's pods go through, in order, and the summary key of each (when the last pod reached it).
STAGES = (("seen", "all_created_s"), ("ungated", "all_ungated_s"), ("bound", "all_bound_s"),
          ("running", "all_running_s"))


@dataclass
class GangTimes:
    """Per-pod first times (seconds since ``start``, a monotonic clock) of a gang, fed by a pod watch."""

    start: float
    pods: dict[str, PodTimes] = field(default_factory=dict)

    def see(self, name: str, bound: bool, phase: str | None, now: float, deleted: bool = False,
            gated: bool = False, node: str | None = None) -> None:
        t = now - self.start
        pod = self.pods.setdefault(name, PodTimes(seen=t))
        if node:
            pod.node = node
        if not gated and pod.ungated is None:
            pod.ungated = t
        if bound and pod.bound is None:
            pod.bound = t
        if phase == "Running" and pod.running is None:
            pod.running = t
        if deleted and pod.deleted is None:
            pod.deleted = t

    def running(self) -> int:
        return sum(p.running is not None and p.deleted is None for p in self.pods.values())

    def bound(self) -> int:
        return sum(p.bound is not None and p.deleted is None for p in self.pods.values())

    def nodes(self) -> list[str]:
        """The nodes the gang's live pods are bound to."""
        return [p.node for p in self.pods.values() if p.node and p.deleted is None]

    def alive(self) -> int:
        return sum(p.deleted is None for p in self.pods.values())

    def summary(self, expected: int) -> dict[str, float]:
        """Seconds from the start until all ``expected`` pods existed, were bound and were Running.

        A figure is taken over the first ``expected`` pods only when that many reached the stage; fewer is an
        error naming the stage, so a partial gang is never reported as a finished one.
        """
        out: dict[str, float] = {}
        for stage, key in STAGES:
            times = sorted(t for p in self.pods.values() if (t := getattr(p, stage)) is not None)
            if len(times) < expected:
                raise ValueError(f"{len(times)} of {expected} pods reached '{stage}'")
            out[key] = round(times[expected - 1], 2)
            if stage == "bound":
                out["first_bound_s"] = round(times[0], 2)
        return out


@dataclass
class Generations:
    """A gang's pods by UID, so a restart that recreates them under the same names is told apart: the first
    generation is what was alive at :meth:`mark`; the next is every pod seen that was not."""

    nodes: dict[str, str] = field(default_factory=dict)
    seen: set[str] = field(default_factory=set)
    running: set[str] = field(default_factory=set)
    leaving: set[str] = field(default_factory=set)
    deleted: set[str] = field(default_factory=set)
    first: frozenset[str] = frozenset()

    def see(self, uid: str, node: str | None, phase: str | None, deleted: bool = False, leaving: bool = False
            ) -> None:
        """One watch event: the pod's node (bound), phase, whether it is marked for deletion or gone."""
        self.seen.add(uid)
        if node:
            self.nodes[uid] = node
        if leaving or deleted:
            self.leaving.add(uid)
        if deleted:
            self.deleted.add(uid)
        elif phase == "Running":
            self.running.add(uid)

    def alive_running(self) -> set[str]:
        return self.running - self.deleted

    def mark(self) -> frozenset[str]:
        """The pods Running now are the first generation."""
        self.first = frozenset(self.alive_running())
        return self.first

    def first_leaving(self) -> bool:
        """Every pod of the first generation is marked for deletion (the restart's decision is carried out)."""
        return bool(self.first) and self.first <= self.leaving

    def first_gone(self) -> bool:
        return bool(self.first) and self.first <= self.deleted

    def _next(self, of: set[str]) -> int:
        return len((of & self.seen) - self.first - self.deleted)

    def next_bound(self) -> int:
        return self._next(set(self.nodes))

    def next_running(self) -> int:
        return self._next(self.running)


def percentiles(values: Sequence[float], qs: Sequence[int] = (50, 90, 99)) -> dict[str, float]:
    """Nearest-rank percentiles (``p50``…), with ``min``, ``max`` and ``n``; every value is one observed."""
    if not values:
        raise ValueError("no values to take percentiles of")
    ordered = sorted(values)
    out: dict[str, float] = {"n": len(ordered), "min": ordered[0], "max": ordered[-1]}
    for q in qs:
        if not 0 < q <= 100:
            raise ValueError(f"percentile {q} is outside (0, 100]")
        rank = max(1, math.ceil(q / 100 * len(ordered)))
        out[f"p{q}"] = ordered[rank - 1]
    return out


def parse_histograms(text: str, name: str, match: Mapping[str, Iterable[str]] | None = None,
                     by: Sequence[str] = ()) -> dict[tuple[str, ...], dict[float, float]]:
    """Cumulative bucket counts (``le`` -> count) of histogram ``name`` per value of the labels ``by`` (a label a
    series lacks reads as ''), summed over the series whose labels are in ``match`` (label -> allowed values). Text
    that is not the Prometheus exposition format is an error."""
    allowed = {k: set(v) for k, v in (match or {}).items()}
    groups: dict[tuple[str, ...], dict[float, float]] = {}
    try:
        families = list(text_string_to_metric_families(text))
    except (ValueError, TypeError, IndexError) as exc:
        raise ValueError(f"not Prometheus text exposition: {exc}") from None
    for family in families:
        if family.name != name:
            continue
        for sample in family.samples:
            if sample.name != f"{name}_bucket":
                continue
            if any(sample.labels.get(k) not in v for k, v in allowed.items()):
                continue
            buckets = groups.setdefault(tuple(sample.labels.get(k, "") for k in by), {})
            le = float(sample.labels["le"])
            buckets[le] = buckets.get(le, 0.0) + float(sample.value)
    return groups


def parse_histogram(text: str, name: str, match: Mapping[str, Iterable[str]] | None = None) -> dict[float, float]:
    """:func:`parse_histograms` summed over every series into one histogram."""
    return parse_histograms(text, name, match).get((), {})


def histogram_quantile(q: float, buckets: Mapping[float, float]) -> float | None:
    """Prometheus's ``histogram_quantile`` over cumulative buckets: None without observations; the largest
    finite bound when the rank falls in the +Inf bucket."""
    if not 0 <= q <= 1:
        raise ValueError(f"quantile {q} is outside [0, 1]")
    ordered = sorted(buckets.items())
    if not ordered or ordered[-1][1] <= 0:
        return None
    if not math.isinf(ordered[-1][0]):
        raise ValueError("histogram has no +Inf bucket")
    total = ordered[-1][1]
    rank = q * total
    lower_bound, lower_count = 0.0, 0.0
    for bound, count in ordered:
        if count >= rank:
            if math.isinf(bound):
                return lower_bound
            if count == lower_count:
                return bound
            # Clamped: lower + (bound - lower) * 1.0 is not always ``bound`` in floating point.
            return min(bound, lower_bound + (bound - lower_bound) * (rank - lower_count) / (count - lower_count))
        lower_bound, lower_count = bound, count
    return lower_bound


_AGENT = re.compile(r"^([A-Za-z0-9._-]+)")


def agent_of(user_agent: str | None, username: str | None = None) -> str:
    """A request's agent: the program name of its user agent (``vc-scheduler/v1.14 (linux/amd64) …`` ->
    ``vc-scheduler``); a generic client library's name is qualified by the user that sent it."""
    match = _AGENT.match(user_agent or "")
    name = match.group(1) if match else "unknown"
    if name in ("OpenAPI-Generator", "Go-http-client", "python-requests", "unknown") and username:
        return f"{name} ({username})"
    return name


def _epoch(timestamp: str) -> float:
    return datetime.fromisoformat(timestamp.replace("Z", "+00:00")).timestamp()


MUTATING = frozenset({"create", "update", "patch", "delete", "deletecollection"})


def requests_by_agent(events: Iterable[Mapping[str, Any]], since: float, until: float) -> dict[str, dict[str, float]]:
    """Per agent: requests per second (all, and mutating) received in ``[since, until)`` (epoch seconds).

    Events without a receive time, or from outside the window, are not counted; a window of no length is an
    error (a rate over nothing is not zero).
    """
    if until <= since:
        raise ValueError(f"empty window: {since} .. {until}")
    counts: dict[str, list[int]] = {}
    for event in events:
        stamp = event.get("requestReceivedTimestamp")
        if not isinstance(stamp, str):
            continue
        try:
            t = _epoch(stamp)
        except ValueError:
            continue
        if not since <= t < until:
            continue
        user = event.get("user") if isinstance(event.get("user"), Mapping) else {}
        agent = agent_of(event.get("userAgent"), (user or {}).get("username"))
        total = counts.setdefault(agent, [0, 0])
        total[0] += 1
        total[1] += event.get("verb") in MUTATING
    span = until - since
    return {agent: {"requests_per_s": round(n / span, 2), "mutating_per_s": round(m / span, 2), "requests": n}
            for agent, (n, m) in sorted(counts.items(), key=lambda kv: -kv[1][0])}


def writes_of(events: Iterable[Mapping[str, Any]], agent: str, resource: str, since: float, until: float,
              verbs: Collection[str] = ("patch", "delete")) -> dict[str, float]:
    """One agent's writes to ``resource`` received in ``[since, until)``: how many, the p50 of their latency (from
    receipt to the response's end) and the most in flight at once, from audit events at ``ResponseComplete``.

    A writer whose most-in-flight is 1 made them one after another, so its time is their count times their
    latency: what bounds, for example, Volcano's job controller killing a gang (an out-of-sync patch, then a
    delete, pod after pod: ``verbs``; its creates of the next generation go side by side and are not the kill's).
    No write in the window is an error, not a zero.
    """
    spans: list[tuple[float, float]] = []
    for event in events:
        if event.get("stage") != "ResponseComplete" or event.get("verb") not in verbs:
            continue
        ref, user = event.get("objectRef"), event.get("user")
        ref, user = (ref if isinstance(ref, Mapping) else {}), (user if isinstance(user, Mapping) else {})
        if ref.get("resource") != resource or ref.get("subresource"):
            continue
        if agent_of(event.get("userAgent"), user.get("username")) != agent:
            continue
        try:
            start, end = _epoch(str(event["requestReceivedTimestamp"])), _epoch(str(event["stageTimestamp"]))
        except (KeyError, ValueError):
            continue
        if since <= start < until:
            spans.append((start, max(start, end)))
    if not spans:
        raise ValueError(f"no {resource} write by {agent} between {since} and {until}")
    # At one instant a call that ends leaves before one that starts (back to back is not at once), but a call of
    # no length ends only after it started.
    edges = sorted([(s, 1, 1) for s, _ in spans] + [(e, 0 if e > s else 2, -1) for s, e in spans])
    most = now = 0
    for _, _, step in edges:
        now += step
        most = max(most, now)
    return {"calls": len(spans), "p50_s": round(percentiles([e - s for s, e in spans], (50,))["p50"], 3),
            "most_in_flight": most}
