"""I/O shell of the health guard: Prometheus in; taints, conditions, events and evictions out; metrics aside.

Everything that decides lives in :mod:`agents.health_guard.decide`. The Kubernetes side goes through the
small :class:`ClusterPort` (the tests drive a fake of it, and an HTTP-level fake API server drives the real
adapter). Failures never widen what the guard does: a failed Prometheus query makes that signal *unknown*
(neither unhealthy nor healthy); a failed node list skips the cycle; a failed patch is retried on the next
cycle because the node still looks the same; an eviction refused by a PodDisruptionBudget is retried every
cycle while the node stays quarantined.
"""

from __future__ import annotations

import json
import logging
import math
import time
import urllib.parse
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from agents.health_guard.contract import (
    APP,
    CONDITION_TYPE,
    EVENT_NAMESPACE,
    OPT_OUT_VALUE,
    TAINT_EFFECT,
    HealthClass,
    HealthSettings,
    Names,
)
from agents.health_guard.decide import (
    Action,
    Decision,
    Drain,
    GuardState,
    MarkCondition,
    NodeStatus,
    NodeView,
    Observations,
    Quarantine,
    Reading,
    RecordOverride,
    Release,
    Suppress,
    TripBreaker,
    decide,
)
from agents.health_guard.restarts import GangJob, Ledger, account, gang_job, guard_caused

log = logging.getLogger(APP)

TRAINING = "training"
INFERENCE = "inference"
GANG_LABEL = "volcano.sh/job-name"
VOLCANO_GROUP, VOLCANO_VERSION = "batch.volcano.sh", "v1alpha1"


class QueryError(RuntimeError):
    """Prometheus did not answer with a usable vector."""


class Conflict(RuntimeError):
    """The object changed since it was read (HTTP 409); re-read and retry."""


class EvictionBlocked(RuntimeError):
    """A PodDisruptionBudget refused the eviction (HTTP 429); retried next cycle."""


class NotFound(RuntimeError):
    """The object is gone (HTTP 404)."""


class ClusterPort(Protocol):
    """Every Kubernetes call the guard makes; the RBAC grants exactly these."""

    def list_nodes(self, label_selector: str) -> list[dict[str, Any]]: ...

    def patch_node(self, name: str, body: dict[str, Any]) -> None: ...

    def patch_node_status(self, name: str, body: dict[str, Any]) -> None: ...

    def list_pods_on_node(self, node: str) -> list[dict[str, Any]]: ...

    def evict_pod(self, namespace: str, name: str) -> None: ...

    def create_event(self, namespace: str, body: dict[str, Any]) -> None: ...

    def read_lease(self, namespace: str, name: str) -> dict[str, Any] | None: ...

    def create_lease(self, namespace: str, body: dict[str, Any]) -> None: ...

    def replace_lease(self, namespace: str, name: str, body: dict[str, Any]) -> None: ...

    def list_gang_jobs(self, namespace: str) -> list[dict[str, Any]]: ...


class Prometheus(Protocol):
    def query_raw(self, promql: str) -> Any: ...


# --------------------------------------------------------------------------- Prometheus


def parse_vector(payload: Any, node_label: str) -> dict[str, float]:
    """Turn a Prometheus instant-vector answer into ``{node: value}``; unlabelled samples dropped.

    Several samples for one node keep the largest (the worst reading wins). NaN is kept only for a node
    with no other value: the decision reads it as unknown, never as clear (dropping it would read "no
    sample", which a fresh exporter means clear, and release a hot node on no reading at all).
    """
    if not isinstance(payload, Mapping) or payload.get("status") != "success":
        status = payload.get("status") if isinstance(payload, Mapping) else type(payload).__name__
        error = payload.get("error", "") if isinstance(payload, Mapping) else ""
        raise QueryError(f"prometheus answered {status!r}: {error}")
    data = payload.get("data")
    if not isinstance(data, Mapping) or data.get("resultType") != "vector":
        kind = data.get("resultType") if isinstance(data, Mapping) else None
        raise QueryError(f"expected a vector, got {kind!r}")
    out: dict[str, float] = {}
    result = data.get("result")
    for item in result if isinstance(result, list) else []:
        if not isinstance(item, Mapping):
            continue
        metric = item.get("metric")
        node = metric.get(node_label) if isinstance(metric, Mapping) else None
        try:
            value = float(item["value"][1])
        except (KeyError, IndexError, TypeError, ValueError):
            continue
        if not isinstance(node, str) or not node:
            continue
        known = out.get(node)
        if known is None or math.isnan(known):
            out[node] = value
        elif not math.isnan(value):
            out[node] = max(value, known)
    return out


class PrometheusMetrics:
    """``GET /api/v1/query``; one node label per query."""

    def __init__(self, url: str, timeout_seconds: float = 10.0) -> None:
        self.url = url.rstrip("/")
        self.timeout_seconds = timeout_seconds

    def query_raw(self, promql: str) -> Any:
        url = f"{self.url}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
        try:
            with urllib.request.urlopen(url, timeout=self.timeout_seconds) as response:
                return json.load(response)
        except (OSError, ValueError) as exc:
            raise QueryError(f"query {promql!r} failed: {exc}") from exc


def observe(settings: HealthSettings, prometheus: Prometheus) -> tuple[Observations, list[str]]:
    """Every signal and freshness query; a failed query leaves its signal unknown. Returns the errors."""
    errors: list[str] = []
    last_seen: dict[str, dict[str, float]] = {}
    for name, exporter in settings.exporters.items():
        try:
            last_seen[name] = parse_vector(prometheus.query_raw(exporter.freshness_query), exporter.node_label)
        except QueryError as exc:
            errors.append(f"freshness of {name}: {exc}")
    readings: dict[str, dict[str, float]] = {}
    failed: set[str] = set()
    for signal in settings.signals:
        label = settings.exporters[signal.exporter].node_label
        try:
            readings[signal.name] = parse_vector(prometheus.query_raw(signal.query), label)
        except QueryError as exc:
            failed.add(signal.name)
            errors.append(f"signal {signal.name}: {exc}")
    return Observations(readings, last_seen, frozenset(failed)), errors


# --------------------------------------------------------------------------- node translation


def iso(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_history(text: str | None) -> tuple[float, ...]:
    """The history annotation (comma-separated epoch seconds); anything unreadable is skipped."""
    out: list[float] = []
    for part in (text or "").split(","):
        try:
            value = float(part)
        except ValueError:
            continue
        if math.isfinite(value) and value > 0:
            out.append(value)
    return tuple(sorted(out))


def node_view(settings: HealthSettings, node: Mapping[str, Any]) -> NodeView:
    names = settings.names
    metadata = node.get("metadata") or {}
    labels = metadata.get("labels") or {}
    annotations = metadata.get("annotations") or {}
    taint = next((t for t in (node.get("spec") or {}).get("taints") or [] if t.get("key") == names.taint), None)
    quarantined: HealthClass | None = None
    if taint is not None:
        try:
            quarantined = HealthClass(taint.get("value"))
        except ValueError:
            quarantined = HealthClass.FATAL  # a value we did not write: the strict reading
    conditions = (node.get("status") or {}).get("conditions") or []
    return NodeView(
        name=metadata["name"],
        pool=str(labels.get(names.pool, "")),
        quarantined=quarantined,
        marked=names.taint in labels,
        reasons=tuple(r for r in str(annotations.get(names.reasons, "")).split(",") if r),
        condition_false=any(c.get("type") == CONDITION_TYPE and c.get("status") == "False" for c in conditions),
        repaired=names.repaired in labels or names.repaired in annotations,
        opted_out=labels.get(names.opt_out) == OPT_OUT_VALUE,
        history=parse_history(annotations.get(names.history)),
        overridden=frozenset(x for x in str(annotations.get(names.overridden, "")).split(",") if x),
    )


def _other_taints(names: Names, node: Mapping[str, Any]) -> list[dict[str, Any]]:
    return [t for t in (node.get("spec") or {}).get("taints") or [] if t.get("key") != names.taint]


def quarantine_patch(settings: HealthSettings, node: Mapping[str, Any], action: Quarantine, now: float
                     ) -> dict[str, Any]:
    """Strategic-merge patch: our taint (NoSchedule, never NoExecute), class label, why and history.

    ``spec.taints`` has no merge key, so the whole list is sent with ``resourceVersion``: the API server
    refuses it if someone changed the node in between, and the next cycle retries on fresh data. A repair
    mark left from an earlier repair is removed, so it cannot release this new fault.
    """
    names = settings.names
    metadata = node.get("metadata") or {}
    taints = [*_other_taints(names, node), {"key": names.taint, "value": str(action.health_class),
                                             "effect": TAINT_EFFECT}]
    since = (metadata.get("annotations") or {}).get(names.since) if action.escalation else None
    return {
        "metadata": {
            "resourceVersion": metadata.get("resourceVersion"),
            "labels": {names.taint: str(action.health_class), names.repaired: None},
            "annotations": {
                names.since: since or iso(now),
                names.reasons: ",".join(action.reasons),
                names.detail: detail(settings, action.health_class, action.reasons),
                names.history: ",".join(f"{t:.0f}" for t in action.history),
                names.repaired: None,
            },
        },
        "spec": {"taints": taints},
    }


def release_patch(settings: HealthSettings, node: Mapping[str, Any]) -> dict[str, Any]:
    """Removes our taint, label, reasons and the repair mark; the history stays (rate limit, flap count)."""
    names = settings.names
    metadata = node.get("metadata") or {}
    return {
        "metadata": {
            "resourceVersion": metadata.get("resourceVersion"),
            "labels": {names.taint: None, names.repaired: None},
            "annotations": {names.since: None, names.reasons: None, names.detail: None, names.repaired: None},
        },
        "spec": {"taints": _other_taints(names, node)},
    }


def condition_patch(healthy: bool, reason: str, message: str, now: float) -> dict[str, Any]:
    """``GpuHealthy`` on ``nodes/status``; strategic merge keys conditions by type, so others are kept."""
    stamp = iso(now)
    return {"status": {"conditions": [{
        "type": CONDITION_TYPE, "status": "True" if healthy else "False", "reason": reason, "message": message,
        "lastHeartbeatTime": stamp, "lastTransitionTime": stamp,
    }]}}


def detail(settings: HealthSettings, cls: HealthClass, reasons: tuple[str, ...]) -> str:
    names = settings.names
    how = (f"label or annotate {names.repaired}=<who> after the repair; released after "
           f"{settings.probation_seconds}s healthy") if cls is HealthClass.FATAL else (
        f"released after {settings.probation_seconds}s healthy")
    return f"{cls}: {', '.join(reasons)}; {how}"


def event(node: Mapping[str, Any], reason: str, message: str, warning: bool, now: float) -> dict[str, Any]:
    metadata = node.get("metadata") or {}
    name = metadata["name"]
    stamp = iso(now)
    return {
        "metadata": {"generateName": f"{name}.{APP}.", "namespace": EVENT_NAMESPACE},
        "involvedObject": {"kind": "Node", "name": name, "uid": metadata.get("uid", name), "apiVersion": "v1"},
        "reason": reason,
        "message": message[:1000],
        "type": "Warning" if warning else "Normal",
        "source": {"component": APP},
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
    }


def evictable(settings: HealthSettings, pod: Mapping[str, Any], cls: HealthClass) -> bool:
    """Training always; inference too when the node is fatal; only in the eviction namespaces (where the guard's
    Roles are). DaemonSet pods and pods already leaving never."""
    metadata = pod.get("metadata") or {}
    if metadata.get("namespace") not in settings.eviction_namespaces:
        return False
    if metadata.get("deletionTimestamp") or (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
        return False
    if any(o.get("kind") == "DaemonSet" for o in metadata.get("ownerReferences") or []):
        return False
    workload = (metadata.get("labels") or {}).get(settings.names.workload)
    if workload == TRAINING:
        return True
    return workload == INFERENCE and cls is HealthClass.FATAL and settings.evict_inference_on_fatal


# --------------------------------------------------------------------------- leader election


@dataclass
class LeaseElector:
    """Leader election on a ``coordination.k8s.io/v1`` Lease, one :meth:`step` per cycle.

    Expiry is judged by how long the record has stayed unchanged on *our* monotonic clock (as client-go
    does), so skewed wall clocks cannot steal a live lease. The Lease also carries the breaker annotation.
    """

    port: ClusterPort
    namespace: str
    name: str
    identity: str
    duration_seconds: int
    leader: bool = False
    lease: dict[str, Any] | None = None
    _observed: tuple[str, str] | None = None
    _observed_at: float = 0.0

    def _body(self, current: dict[str, Any] | None, now: float) -> dict[str, Any]:
        metadata = dict((current or {}).get("metadata") or {})
        spec = dict((current or {}).get("spec") or {})
        stamp = datetime.fromtimestamp(now, tz=UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        if spec.get("holderIdentity") != self.identity:
            spec["leaseTransitions"] = int(spec.get("leaseTransitions") or 0) + (1 if current else 0)
            spec["acquireTime"] = stamp
        spec.update(holderIdentity=self.identity, leaseDurationSeconds=self.duration_seconds, renewTime=stamp)
        metadata.setdefault("name", self.name)
        metadata.setdefault("namespace", self.namespace)
        return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": metadata, "spec": spec}

    def step(self, now: float, mono: float) -> bool:
        try:
            current = self.port.read_lease(self.namespace, self.name)
            if current is None:
                body = self._body(None, now)
                self.port.create_lease(self.namespace, body)
                self.lease, self.leader = body, True
                return True
            self.lease = current
            spec = current.get("spec") or {}
            holder = str(spec.get("holderIdentity") or "")
            record = (holder, str(spec.get("renewTime") or ""))
            if record != self._observed:
                self._observed, self._observed_at = record, mono
            expired = mono - self._observed_at > float(spec.get("leaseDurationSeconds") or self.duration_seconds)
            if holder in ("", self.identity) or expired:
                body = self._body(current, now)
                self.port.replace_lease(self.namespace, self.name, body)
                self.lease, self.leader = body, True
                self._observed, self._observed_at = (self.identity, body["spec"]["renewTime"]), mono
            else:
                self.leader = False
        except Exception as exc:  # conflict, network: not the leader until a renewal succeeds
            log.warning("lease %s/%s: %s", self.namespace, self.name, exc)
            self.leader = False
        return self.leader

    def annotation(self, key: str) -> str | None:
        value = ((self.lease or {}).get("metadata") or {}).get("annotations", {}) or {}
        note = value.get(key)
        return str(note) if note is not None else None

    def annotate(self, key: str, value: str) -> None:
        """Write an annotation on the Lease (read-modify-replace; a conflict raises and is retried)."""
        current = self.port.read_lease(self.namespace, self.name)
        if current is None:
            raise NotFound(f"lease {self.namespace}/{self.name}")
        metadata = dict(current.get("metadata") or {})
        metadata["annotations"] = {**(metadata.get("annotations") or {}), key: value}
        body = {**current, "metadata": metadata}
        self.port.replace_lease(self.namespace, self.name, body)
        self.lease = body


# --------------------------------------------------------------------------- metrics


class GuardMetrics:
    """The guard's series, in a registry of its own."""

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry(auto_describe=True)
        p = "gpucluster_health_"
        self.leader = Gauge(f"{p}leader", "1 while this replica holds the lease.", registry=r)
        self.events = Counter(f"{p}signal_events", "Signals seen starting to fire, per signal and class.",
                              ["signal", "class"], registry=r)
        self.firing = Gauge(f"{p}signal_firing", "Nodes on which the signal fires now.", ["signal"], registry=r)
        self.unknown = Gauge(f"{p}signal_unknown_nodes", "Nodes the signal cannot judge (stale or missing).",
                             ["signal"], registry=r)
        self.quarantined = Gauge(f"{p}nodes_quarantined", "Nodes carrying the health taint, per class and pool.",
                                 ["class", "pool"], registry=r)
        self.pool_share = Gauge(f"{p}pool_quarantined_ratio", "Share of the pool's nodes quarantined.", ["pool"],
                                registry=r)
        self.node_quarantined = Gauge(f"{p}node_quarantined", "1 while the node is quarantined.",
                                      ["node", "class"], registry=r)
        self.nodes = Gauge(f"{p}nodes", "Watched nodes by status.", ["status"], registry=r)
        self.taints = Counter(f"{p}taints_applied", "Health taints applied (escalations included).",
                              ["class", "pool"], registry=r)
        self.releases = Counter(f"{p}releases", "Nodes released.", ["class"], registry=r)
        self.suppressed = Counter(f"{p}suppressed", "Quarantines refused by the rate limit or the breaker.",
                                  ["pool"], registry=r)
        self.breaker = Gauge(f"{p}breaker_tripped", "1 while the rate-limit breaker is tripped (a person resets it).",
                             registry=r)
        self.evictions = Counter(f"{p}evictions", "Eviction attempts by workload and result.",
                                 ["workload", "result"], registry=r)
        self.gang_restarts = Counter(
            f"{p}gang_restarts", "Gang restarts: cause=guard (an eviction from a quarantined node, with the node) or "
            "cause=application (Volcano's retry after a failed pod).", ["namespace", "job", "pool", "node", "cause"],
            registry=r)
        self.between_failures = Histogram(
            f"{p}seconds_between_failures", "Seconds between consecutive quarantines in a pool.", ["pool"],
            buckets=(300, 900, 1800, 3600, 3 * 3600, 6 * 3600, 12 * 3600, 86400, 3 * 86400, 7 * 86400),
            registry=r)
        self.errors = Counter(f"{p}errors", "Failed steps of a cycle.", ["stage"], registry=r)
        self.last_cycle = Gauge(f"{p}last_cycle_timestamp_seconds", "End of the last completed cycle.", registry=r)
        for stage in ("query", "list", "patch", "status", "event", "evict", "lease"):
            self.errors.labels(stage)
        self.breaker.set(0)


# --------------------------------------------------------------------------- the loop


@dataclass
class Guard:
    """Runs cycles: elect, observe, list, decide, apply, publish."""

    settings: HealthSettings
    prometheus: Prometheus
    port: ClusterPort
    identity: str = APP
    metrics: GuardMetrics = field(default_factory=GuardMetrics)
    state: GuardState = field(default_factory=GuardState)
    elector: LeaseElector | None = None
    _restarted: set[tuple[str, str, str, str]] = field(default_factory=set)
    _ledger: Ledger = field(default_factory=Ledger)
    _announced: set[str] = field(default_factory=set)
    _firing: set[tuple[str, str]] = field(default_factory=set)

    def __post_init__(self) -> None:
        if self.elector is None:
            s = self.settings
            self.elector = LeaseElector(self.port, s.namespace, s.lease_name, self.identity, s.lease_duration_seconds)

    def cycle(self, now: float | None = None, mono: float | None = None) -> Decision | None:
        """One pass; the decision, or ``None`` when not leading or the inputs were unavailable."""
        now = time.time() if now is None else now
        mono = time.monotonic() if mono is None else mono
        assert self.elector is not None
        leading = self.elector.step(now, mono)
        self.metrics.leader.set(1 if leading else 0)
        if not leading:
            return None
        obs, errors = observe(self.settings, self.prometheus)
        for message in errors:
            self.metrics.errors.labels("query").inc()
            log.warning("%s", message)
        try:
            raw = self.port.list_nodes(self.settings.node_selector)
        except Exception as exc:  # any client error means "no node list": decide nothing
            self.metrics.errors.labels("list").inc()
            log.warning("skipping cycle: listing nodes failed: %s", exc)
            return None
        by_name = {n["metadata"]["name"]: n for n in raw}
        views = {name: node_view(self.settings, n) for name, n in by_name.items()}
        breaker = self.elector.annotation(self.settings.names.breaker)
        decision = decide(self.settings, obs, views, self.state, now, breaker)
        self.state = decision.state
        for action in decision.actions:
            self._apply(action, by_name, views, now)
        self._count_application_restarts()
        self._publish(decision, views)
        self.metrics.last_cycle.set(now)
        return decision

    # ---------------------------------------------------------------- actions

    def _apply(self, action: Action, nodes: Mapping[str, dict[str, Any]], views: Mapping[str, NodeView],
               now: float) -> None:
        s = self.settings
        if isinstance(action, TripBreaker):
            self._trip(action, now)
            return
        node = nodes[action.node]
        view = views[action.node]
        if isinstance(action, Quarantine):
            if self._patch(action.node, quarantine_patch(s, node, action, now), "quarantine"):
                cls = action.health_class
                self.metrics.taints.labels(str(cls), view.pool).inc()
                if not action.escalation:
                    self._between_failures(view, views, now)
                message = (f"GPU health {cls} ({', '.join(action.reasons)}): tainted {s.names.taint}={cls}:"
                           f"{TAINT_EFFECT}; training is evicted" + (", inference too" if cls is HealthClass.FATAL
                                                                    else ", inference may stay")
                           + f". {detail(s, cls, action.reasons)}.")
                self._condition(action.node, False, f"Gpu{cls.capitalize()}", message, now)
                self._event(node, "GpuHealthQuarantine", message, True, now)
                log.info("quarantined node %s: %s", action.node, message)
        elif isinstance(action, MarkCondition):
            self._condition(action.node, False, f"Gpu{action.health_class.capitalize()}",
                            detail(s, action.health_class, action.reasons), now)
        elif isinstance(action, Drain):
            self._drain(action, node, view)
        elif isinstance(action, Release):
            if self._patch(action.node, release_patch(s, node), "release"):
                self.metrics.releases.labels(str(action.health_class or "manual")).inc()
                self._condition(action.node, True, "Released", f"released: {action.why}", now)
                self._event(node, "GpuHealthRelease", f"released: {action.why}", False, now)
                log.info("released node %s: %s", action.node, action.why)
        elif isinstance(action, RecordOverride):
            value = ",".join(sorted(action.signals)) or None
            self._patch(action.node, {"metadata": {"annotations": {s.names.overridden: value}}}, "override")
        elif isinstance(action, Suppress):
            self.metrics.suppressed.labels(view.pool).inc()
            if action.node not in self._announced:
                self._announced.add(action.node)
                message = (f"GPU health {action.health_class} ({', '.join(action.reasons)}) but NOT quarantined: "
                           f"{action.limit}. A person decides: see the guard's breaker on Lease "
                           f"{s.namespace}/{s.lease_name}.")
                self._event(node, "GpuHealthSuppressed", message, True, now)
                log.warning("suppressed node %s: %s", action.node, action.limit)

    def _trip(self, action: TripBreaker, now: float) -> None:
        assert self.elector is not None
        note = f"{iso(now)} {action.reason}"
        try:
            self.elector.annotate(self.settings.names.breaker, note)
            log.error("breaker tripped: %s; no node is quarantined until the annotation %s is removed from "
                      "Lease %s/%s", action.reason, self.settings.names.breaker, self.settings.namespace,
                      self.settings.lease_name)
        except Exception as exc:  # stays tripped in this cycle's decision; retried when it recurs
            self.metrics.errors.labels("lease").inc()
            log.warning("recording the tripped breaker failed: %s", exc)

    def _patch(self, name: str, body: dict[str, Any], what: str) -> bool:
        try:
            self.port.patch_node(name, body)
            return True
        except Exception as exc:  # conflict, forbidden, network: retried next cycle on fresh data
            self.metrics.errors.labels("patch").inc()
            log.warning("%s of node %s failed: %s", what, name, exc)
            return False

    def _condition(self, name: str, healthy: bool, reason: str, message: str, now: float) -> None:
        try:
            self.port.patch_node_status(name, condition_patch(healthy, reason, message, now))
        except Exception as exc:  # re-asserted next cycle (MarkCondition) while the node stays quarantined
            self.metrics.errors.labels("status").inc()
            log.warning("condition on node %s failed: %s", name, exc)

    def _event(self, node: Mapping[str, Any], reason: str, message: str, warning: bool, now: float) -> None:
        try:
            self.port.create_event(EVENT_NAMESPACE, event(node, reason, message, warning, now))
        except Exception as exc:  # an event is a courtesy; the patch is what matters
            self.metrics.errors.labels("event").inc()
            log.warning("event for node %s failed: %s", node.get("metadata", {}).get("name"), exc)

    def _drain(self, action: Drain, node: Mapping[str, Any], view: NodeView) -> None:
        try:
            pods = self.port.list_pods_on_node(action.node)
        except Exception as exc:
            self.metrics.errors.labels("evict").inc()
            log.warning("listing pods on %s failed: %s", action.node, exc)
            return
        since = str(((node.get("metadata") or {}).get("annotations") or {}).get(self.settings.names.since, ""))
        for pod in pods:
            if not evictable(self.settings, pod, action.health_class):
                continue
            metadata = pod["metadata"]
            labels = metadata.get("labels") or {}
            workload = str(labels.get(self.settings.names.workload))
            try:
                self.port.evict_pod(metadata["namespace"], metadata["name"])
                result = "evicted"
            except EvictionBlocked:
                result = "blocked"
            except NotFound:
                result = "gone"
            except Exception as exc:
                self.metrics.errors.labels("evict").inc()
                log.warning("evicting %s/%s failed: %s", metadata["namespace"], metadata["name"], exc)
                result = "error"
            self.metrics.evictions.labels(workload, result).inc()
            if result != "evicted":
                continue
            log.info("evicted %s pod %s/%s from %s node %s", workload, metadata["namespace"], metadata["name"],
                     action.health_class, action.node)
            job = labels.get(GANG_LABEL)
            key = (action.node, since, str(metadata["namespace"]), str(job))
            if job and key not in self._restarted:
                self._restarted.add(key)
                self.metrics.gang_restarts.labels(metadata["namespace"], job, view.pool, action.node, "guard").inc()
                self._ledger = guard_caused(self._ledger, (str(metadata["namespace"]), str(job)))

    def _count_application_restarts(self) -> None:
        """Volcano's retries the guard did not cause: application crashes, counted without a node."""
        jobs: list[GangJob] = []
        for namespace in self.settings.training_namespaces:
            try:
                raw = self.port.list_gang_jobs(namespace)
            except Exception as exc:  # the next cycle counts what this one missed
                self.metrics.errors.labels("list").inc()
                log.warning("listing gang jobs in %s failed: %s", namespace, exc)
                return
            jobs += [j for j in (gang_job(r, self.settings.names.pool) for r in raw) if j is not None]
        self._ledger, restarts = account(self._ledger, jobs)
        for job, count in restarts.items():
            self.metrics.gang_restarts.labels(job.namespace, job.name, job.pool, "", "application").inc(count)

    def _between_failures(self, view: NodeView, views: Mapping[str, NodeView], now: float) -> None:
        earlier = [t for v in views.values() if v.pool == view.pool for t in v.history if t < now - 1]
        if earlier:
            self.metrics.between_failures.labels(view.pool).observe(now - max(earlier))

    # ---------------------------------------------------------------- metrics

    def _publish(self, decision: Decision, views: Mapping[str, NodeView]) -> None:
        m = self.metrics
        m.breaker.set(1 if decision.breaker_tripped else 0)
        counts = dict.fromkeys(NodeStatus, 0)
        for status in decision.status.values():
            counts[status] += 1
        for status, count in counts.items():
            m.nodes.labels(status.value).set(count)
        classes: dict[str, HealthClass] = {}
        for v in views.values():
            if v.quarantined is not None:
                classes[v.name] = v.quarantined
        for a in decision.actions:
            if isinstance(a, Quarantine):
                classes[a.node] = a.health_class
            elif isinstance(a, Release):
                classes.pop(a.node, None)
        m.node_quarantined.clear()
        m.quarantined.clear()
        pools: dict[str, int] = {}
        per: dict[tuple[str, str], int] = {}
        for v in views.values():
            pools[v.pool] = pools.get(v.pool, 0) + 1
        for name, cls in classes.items():
            m.node_quarantined.labels(name, str(cls)).set(1)
            key = (str(cls), views[name].pool)
            per[key] = per.get(key, 0) + 1
        for cls in HealthClass:
            for pool in pools:
                m.quarantined.labels(str(cls), pool).set(per.get((str(cls), pool), 0))
        for pool, size in pools.items():
            out = sum(1 for name in classes if views[name].pool == pool)
            m.pool_share.labels(pool).set(out / size if size else 0)
        for signal in self.settings.signals:
            firing = [n for n, r in decision.readings.items() if r.get(signal.name) is Reading.FIRING]
            m.firing.labels(signal.name).set(len(firing))
            m.unknown.labels(signal.name).set(
                sum(1 for r in decision.readings.values() if r.get(signal.name) is Reading.UNKNOWN))
            for n in firing:
                if (n, signal.name) not in self._firing:
                    m.events.labels(signal.name, str(signal.health_class)).inc()
            self._firing = {k for k in self._firing if k[1] != signal.name} | {(n, signal.name) for n in firing}


# --------------------------------------------------------------------------- the real adapter


def _status(exc: Exception) -> int:
    return int(getattr(exc, "status", 0) or 0)


class KubePort:
    """:class:`ClusterPort` on the official kubernetes client: in-cluster identity or a kubeconfig file."""

    _SMP = "application/strategic-merge-patch+json"

    def __init__(self, kubeconfig: str | None = None, api_client: Any = None) -> None:
        from kubernetes import client, config

        loader: Any = config
        if api_client is None:
            if kubeconfig:
                loader.load_kube_config(config_file=kubeconfig)
            else:
                loader.load_incluster_config()
            api_client = client.ApiClient()
        self._core: Any = client.CoreV1Api(api_client)
        self._coord: Any = client.CoordinationV1Api(api_client)
        self._custom: Any = client.CustomObjectsApi(api_client)
        self._serialize: Any = api_client.sanitize_for_serialization

    def _call(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except Exception as exc:
            code = _status(exc)
            if code == 409:
                raise Conflict(str(exc)) from exc
            if code == 429:
                raise EvictionBlocked(str(exc)) from exc
            if code == 404:
                raise NotFound(str(exc)) from exc
            raise

    def list_nodes(self, label_selector: str) -> list[dict[str, Any]]:
        result = self._call(self._core.list_node, label_selector=label_selector)
        items: list[dict[str, Any]] = self._serialize(result).get("items", [])
        return items

    def patch_node(self, name: str, body: dict[str, Any]) -> None:
        self._call(self._core.patch_node, name, body, _content_type=self._SMP)

    def patch_node_status(self, name: str, body: dict[str, Any]) -> None:
        self._call(self._core.patch_node_status, name, body, _content_type=self._SMP)

    def list_pods_on_node(self, node: str) -> list[dict[str, Any]]:
        result = self._call(self._core.list_pod_for_all_namespaces, field_selector=f"spec.nodeName={node}")
        items: list[dict[str, Any]] = self._serialize(result).get("items", [])
        return items

    def evict_pod(self, namespace: str, name: str) -> None:
        body = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": name, "namespace": namespace}}
        self._call(self._core.create_namespaced_pod_eviction, name, namespace, body)

    def create_event(self, namespace: str, body: dict[str, Any]) -> None:
        self._call(self._core.create_namespaced_event, namespace, body)

    def read_lease(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            lease: dict[str, Any] = self._serialize(self._call(self._coord.read_namespaced_lease, name, namespace))
            return lease
        except NotFound:
            return None

    def create_lease(self, namespace: str, body: dict[str, Any]) -> None:
        self._call(self._coord.create_namespaced_lease, namespace, body)

    def replace_lease(self, namespace: str, name: str, body: dict[str, Any]) -> None:
        self._call(self._coord.replace_namespaced_lease, name, namespace, body)

    def list_gang_jobs(self, namespace: str) -> list[dict[str, Any]]:
        result = self._call(self._custom.list_namespaced_custom_object, VOLCANO_GROUP, VOLCANO_VERSION, namespace,
                            "jobs")
        items: list[dict[str, Any]] = (result or {}).get("items", [])
        return items
