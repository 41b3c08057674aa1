"""The guard's one input: Prometheus instant vectors, per node. A failed query makes its signal *unknown*
(neither unhealthy nor healthy), never clear."""

from __future__ import annotations

import json
import math
import urllib.parse
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import urllib3

from agents.health_guard.contract import HealthSettings
from agents.health_guard.decide import Observations


class QueryError(RuntimeError):
    """Prometheus did not answer with a usable vector."""


class Prometheus(Protocol):
    def query_raw(self, promql: str) -> Any: ...


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
    """``GET /api/v1/query``; one node label per query, over kept-alive connections.

    A cycle sends a dozen queries every few seconds; a connection per query also meant a name lookup per query, so
    a flaky cluster DNS (the local real-node network after a guard pod moved) left most signals unknown. Pooled
    connections look the name up when they open, and a failed connection is dropped and opened afresh.
    """

    def __init__(self, url: str, timeout_seconds: float = 10.0, pool: urllib3.PoolManager | None = None) -> None:
        self.url = url.rstrip("/")
        self.timeout_seconds = timeout_seconds
        self.pool = pool or urllib3.PoolManager(num_pools=1, maxsize=2, retries=False)

    def query_raw(self, promql: str) -> Any:
        url = f"{self.url}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
        try:
            response = self.pool.request("GET", url, timeout=urllib3.Timeout(total=self.timeout_seconds),
                                         preload_content=True)
            if response.status >= 500:  # Prometheus answers a bad query with 4xx and its own error JSON
                raise QueryError(f"query {promql!r} failed: HTTP {response.status}")
            return json.loads(response.data)
        except (urllib3.exceptions.HTTPError, OSError, ValueError) as exc:
            raise QueryError(f"query {promql!r} failed: {exc}") from exc


def observe(settings: HealthSettings, prometheus: Prometheus,
            stopped: Callable[[], bool] = lambda: False) -> tuple[Observations, list[str]]:
    """Every signal and freshness query, one after the other; a failed query leaves its signal unknown. Returns the
    errors.

    One after the other on purpose: side by side, a guard in its pod resolved the Prometheus service's name in
    eight threads at once, and those lookups kept failing ("Temporary failure in name resolution") on the
    local cluster's pod network (docs/scale.md). ``stopped`` is asked before each query: a guard told to stop ends
    its observation there (the rest stays unknown) instead of waiting out every query's timeout while its pod's
    grace period runs.
    """
    errors: list[str] = []
    last_seen: dict[str, dict[str, float]] = {}
    for name, exporter in settings.exporters.items():
        if stopped():
            break
        try:
            last_seen[name] = parse_vector(prometheus.query_raw(exporter.freshness_query), exporter.node_label)
        except QueryError as exc:
            errors.append(f"freshness of {name}: {exc}")
    readings: dict[str, dict[str, float]] = {}
    failed: set[str] = set()
    for signal in settings.signals:
        if stopped():
            failed.add(signal.name)
            continue
        label = settings.exporters[signal.exporter].node_label
        try:
            readings[signal.name] = parse_vector(prometheus.query_raw(signal.query), label)
        except QueryError as exc:
            failed.add(signal.name)
            errors.append(f"signal {signal.name}: {exc}")
    return Observations(readings, last_seen, frozenset(failed)), errors
