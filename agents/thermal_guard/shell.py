"""I/O shell of the thermal guard: Prometheus in, Kubernetes node patches and events out, metrics on the side.

Everything that decides lives in :mod:`agents.thermal_guard.decide`; this module only translates. A
failed Prometheus query skips the whole cycle (no decision on no data, clocks untouched); a failed patch
is counted and retried naturally on the next cycle because the node still looks the same.
"""

from __future__ import annotations

import json
import logging
import math
import time
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge

from agents.thermal_guard.decide import (
    Action,
    Decision,
    GuardState,
    NodeStatus,
    NodeView,
    Taint,
    decide,
    reason_label_value,
)
from agents.thermal_guard.settings import ThermalSettings

log = logging.getLogger("thermal-guard")

EVENT_NAMESPACE = "default"
"""Node events live in ``default``, where ``kubectl describe node`` looks for them."""


class QueryError(RuntimeError):
    """Prometheus did not answer with a usable vector."""


class Temperatures(Protocol):
    def hottest_gpu_per_node(self) -> dict[str, float]: ...


class NodeApi(Protocol):
    """The three calls the guard makes; the RBAC grants exactly these (plus watch for future use)."""

    def list_nodes(self, label_selector: str) -> list[dict[str, Any]]: ...

    def patch_node(self, name: str, body: dict[str, Any]) -> None: ...

    def create_event(self, namespace: str, body: dict[str, Any]) -> None: ...


class PrometheusTemperatures:
    """``GET /api/v1/query`` for the hottest GPU per node."""

    def __init__(self, settings: ThermalSettings, timeout_seconds: float = 10.0) -> None:
        self.settings = settings
        self.timeout_seconds = timeout_seconds

    def hottest_gpu_per_node(self) -> dict[str, float]:
        url = (
            self.settings.prometheus_url.rstrip("/")
            + "/api/v1/query?"
            + urllib.parse.urlencode({"query": self.settings.query()})
        )
        try:
            with urllib.request.urlopen(url, timeout=self.timeout_seconds) as response:
                payload = json.load(response)
        except (OSError, ValueError) as exc:
            raise QueryError(f"query {url} failed: {exc}") from exc
        return parse_vector(payload, self.settings.node_label)


def parse_vector(payload: Mapping[str, Any], node_label: str) -> dict[str, float]:
    """Turn a Prometheus instant-vector answer into ``{node: °C}``; NaN and unlabelled samples are dropped."""
    if payload.get("status") != "success":
        raise QueryError(f"prometheus answered {payload.get('status')!r}: {payload.get('error', '')}")
    data = payload.get("data") or {}
    if data.get("resultType") != "vector":
        raise QueryError(f"expected a vector, got {data.get('resultType')!r}")
    out: dict[str, float] = {}
    for item in data.get("result", []):
        node = item.get("metric", {}).get(node_label)
        try:
            value = float(item["value"][1])
        except (KeyError, IndexError, TypeError, ValueError):
            continue
        if node and not math.isnan(value):
            out[node] = value
    return out


def node_view(settings: ThermalSettings, node: Mapping[str, Any]) -> NodeView:
    metadata = node.get("metadata") or {}
    labels = metadata.get("labels") or {}
    annotations = metadata.get("annotations") or {}
    taints = (node.get("spec") or {}).get("taints") or []
    return NodeView(
        name=metadata["name"],
        tainted=any(t.get("key") == settings.taint_key for t in taints),
        marked=settings.reason_label in labels,
        release_requested=settings.release_key in labels or settings.release_key in annotations,
    )


def iso(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def taint_patch(settings: ThermalSettings, node: Mapping[str, Any], action: Taint) -> dict[str, Any]:
    """Strategic-merge patch adding our taint and marks.

    ``spec.taints`` has no merge key, so the whole list is sent: the node's other taints are kept as
    read, and ``resourceVersion`` makes the API server refuse the patch if someone changed the node in
    between (the next cycle retries on fresh data).
    """
    metadata = node.get("metadata") or {}
    taints = [t for t in (node.get("spec") or {}).get("taints") or [] if t.get("key") != settings.taint_key]
    taints.append({"key": settings.taint_key, "value": settings.taint_value, "effect": "NoSchedule"})
    return {
        "metadata": {
            "resourceVersion": metadata.get("resourceVersion"),
            "labels": {settings.reason_label: reason_label_value(settings, action.celsius)},
            "annotations": {
                settings.since_annotation: iso(action.since),
                settings.detail_annotation: (
                    f"hottest GPU {action.celsius:g} C >= {settings.threshold_celsius:g} C since "
                    f"{iso(action.since)} (hold {settings.hold_seconds} s); release by setting "
                    f"{settings.release_key}"
                ),
            },
        },
        "spec": {"taints": taints},
    }


def release_patch(settings: ThermalSettings, node: Mapping[str, Any]) -> dict[str, Any]:
    """Strategic-merge patch removing our taint, our marks and the operator's release marker."""
    metadata = node.get("metadata") or {}
    taints = [t for t in (node.get("spec") or {}).get("taints") or [] if t.get("key") != settings.taint_key]
    return {
        "metadata": {
            "resourceVersion": metadata.get("resourceVersion"),
            "labels": {settings.reason_label: None, settings.release_key: None},
            "annotations": {
                settings.since_annotation: None,
                settings.detail_annotation: None,
                settings.release_key: None,
            },
        },
        "spec": {"taints": taints},
    }


def event(node: Mapping[str, Any], reason: str, message: str, now: float) -> dict[str, Any]:
    metadata = node.get("metadata") or {}
    name = metadata["name"]
    stamp = iso(now)
    return {
        "metadata": {"generateName": f"{name}.thermal-guard.", "namespace": EVENT_NAMESPACE},
        "involvedObject": {"kind": "Node", "name": name, "uid": metadata.get("uid", name), "apiVersion": "v1"},
        "reason": reason,
        "message": message,
        "type": "Warning" if reason == "ThermalTaint" else "Normal",
        "source": {"component": "thermal-guard"},
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
    }


class GuardMetrics:
    """The guard's own series, in a registry of its own (no process metrics of the container)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.tainted = Gauge(
            "thermal_guard_node_tainted",
            "1 while the node carries the thermal taint.",
            ["node"],
            registry=self.registry,
        )
        self.temperature = Gauge(
            "thermal_guard_node_gpu_temperature_celsius",
            "Hottest GPU of the node at the last cycle.",
            ["node"],
            registry=self.registry,
        )
        self.nodes = Gauge("thermal_guard_nodes", "Watched nodes by status.", ["status"], registry=self.registry)
        self.actions = Counter(
            "thermal_guard_actions", "Taints and releases applied.", ["action"], registry=self.registry
        )
        self.errors = Counter("thermal_guard_errors", "Failed steps of a cycle.", ["stage"], registry=self.registry)
        self.unmatched = Gauge(
            "thermal_guard_unmatched_hosts",
            "Hosts with GPU temperatures that match no watched node (check node_label).",
            registry=self.registry,
        )
        self.last_cycle = Gauge(
            "thermal_guard_last_cycle_timestamp_seconds", "End of the last completed cycle.", registry=self.registry
        )
        self.threshold = Gauge("thermal_guard_threshold_celsius", "Configured threshold.", registry=self.registry)
        for name in ("taint", "release"):
            self.actions.labels(name)
        for stage in ("query", "list", "patch", "event"):
            self.errors.labels(stage)


class Guard:
    """Runs cycles: query, list, decide, apply."""

    def __init__(
        self,
        settings: ThermalSettings,
        temperatures: Temperatures,
        nodes: NodeApi,
        metrics: GuardMetrics | None = None,
    ) -> None:
        self.settings = settings
        self.temperatures = temperatures
        self.nodes = nodes
        self.metrics = metrics or GuardMetrics()
        self.metrics.threshold.set(settings.threshold_celsius)
        self.state = GuardState()

    def cycle(self, now: float | None = None) -> Decision | None:
        """One pass; returns the decision, or ``None`` when inputs were unavailable."""
        now = time.time() if now is None else now
        try:
            temps = self.temperatures.hottest_gpu_per_node()
        except QueryError as exc:
            self.metrics.errors.labels("query").inc()
            log.warning("skipping cycle: %s", exc)
            return None
        try:
            raw_nodes = self.nodes.list_nodes(self.settings.node_selector)
        except Exception as exc:  # the client raises many types; any of them means "no node list"
            self.metrics.errors.labels("list").inc()
            log.warning("skipping cycle: listing nodes failed: %s", exc)
            return None
        by_name = {n["metadata"]["name"]: n for n in raw_nodes}
        views = {name: node_view(self.settings, n) for name, n in by_name.items()}
        decision = decide(self.settings, temps, views, self.state, now)
        self.state = decision.state
        self._apply(decision.actions, by_name, now)
        self._publish(decision, temps, views)
        self.metrics.last_cycle.set(now)
        return decision

    def _apply(self, actions: Sequence[Action], nodes: Mapping[str, Mapping[str, Any]], now: float) -> None:
        for action in actions:
            node = nodes[action.node]
            if isinstance(action, Taint):
                body = taint_patch(self.settings, node, action)
                kind, reason = "taint", "ThermalTaint"
                message = (
                    f"GPU at {action.celsius:g} C >= {self.settings.threshold_celsius:g} C since "
                    f"{iso(action.since)}: tainted {self.settings.taint_key}={self.settings.taint_value}:NoSchedule. "
                    f"Replace or repair, then set {self.settings.release_key}."
                )
            else:
                body = release_patch(self.settings, node)
                kind, reason = "release", "ThermalRelease"
                message = f"Released by {self.settings.release_key} (or taint removed by hand)."
            try:
                self.nodes.patch_node(action.node, body)
            except Exception as exc:  # conflict, forbidden, network: retried next cycle on fresh data
                self.metrics.errors.labels("patch").inc()
                log.warning("%s of node %s failed: %s", kind, action.node, exc)
                if isinstance(action, Taint):
                    # Keep the clock so the retry taints at once instead of waiting a new hold.
                    hot = dict(self.state.hot_since)
                    hot[action.node] = action.since
                    self.state = GuardState(hot)
                continue
            self.metrics.actions.labels(kind).inc()
            log.info("%s node %s: %s", kind, action.node, message)
            try:
                self.nodes.create_event(EVENT_NAMESPACE, event(node, reason, message, now))
            except Exception as exc:  # an event is a courtesy; the patch is what matters
                self.metrics.errors.labels("event").inc()
                log.warning("event for node %s failed: %s", action.node, exc)

    def _publish(self, decision: Decision, temps: Mapping[str, float], views: Mapping[str, NodeView]) -> None:
        counts = dict.fromkeys(NodeStatus, 0)
        self.metrics.tainted.clear()
        self.metrics.temperature.clear()
        for name, status in decision.status.items():
            counts[status] += 1
            self.metrics.tainted.labels(name).set(1 if status is NodeStatus.TAINTED else 0)
            if name in temps:
                self.metrics.temperature.labels(name).set(temps[name])
        for status, count in counts.items():
            self.metrics.nodes.labels(status.value).set(count)
        self.metrics.unmatched.set(len(set(temps) - set(views)))


class KubeNodeApi:
    """:class:`NodeApi` on the official kubernetes client: in-cluster identity, or a kubeconfig file
    (the local control plane runs the guard as a process)."""

    def __init__(self, kubeconfig: str | None = None) -> None:
        from kubernetes import client, config

        # The client's annotations are partial (dict bodies are accepted at runtime but typed as models),
        # so it is held as Any behind this small typed surface.
        loader: Any = config
        if kubeconfig:
            loader.load_kube_config(config_file=kubeconfig)
        else:
            loader.load_incluster_config()
        self._api: Any = client.CoreV1Api()
        self._serialize: Any = client.ApiClient().sanitize_for_serialization

    def list_nodes(self, label_selector: str) -> list[dict[str, Any]]:
        result = self._api.list_node(label_selector=label_selector)
        items: list[dict[str, Any]] = self._serialize(result).get("items", [])
        return items

    def patch_node(self, name: str, body: dict[str, Any]) -> None:
        self._api.patch_node(name, body)

    def create_event(self, namespace: str, body: dict[str, Any]) -> None:
        self._api.create_namespaced_event(namespace, body)
