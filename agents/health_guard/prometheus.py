"""The guard's one input: Prometheus instant vectors, per node. A failed query makes its signal *unknown*
(neither unhealthy nor healthy), never clear."""

from __future__ import annotations

import json
import math
import time
import urllib.parse
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
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

    def __init__(self, url: str, timeout_seconds: float = 10.0, pool: urllib3.PoolManager | None = None,
                 connections: int = 2) -> None:
        self.url = url.rstrip("/")
        self.timeout_seconds = timeout_seconds
        # ``block``: never more connections than the queries sent at once, so never more name lookups.
        self.pool = pool or urllib3.PoolManager(num_pools=1, maxsize=connections, block=True, retries=False)

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


def observe(settings: HealthSettings, prometheus: Prometheus, stopped: Callable[[], bool] = lambda: False,
            timed: Callable[[str, float], None] = lambda query, seconds: None) -> tuple[Observations, list[str]]:
    """Every freshness and signal query, ``settings.query_concurrency`` at a time; a failed query leaves its signal
    unknown. Returns the errors, in the queries' order.

    Side by side because at 2,048 nodes the dozen queries, one after the other, were a second of every cycle, and
    the cycle's length is most of the time from a fault in Prometheus to its taint (docs/scale.md). Bounded, and
    over the client's kept-alive connections (as many as the bound), so the Prometheus service's name is looked up
    once per connection, not once per query: eight lookups at once kept failing on the local cluster's pod network.
    ``stopped`` is asked before each query: a guard told to stop ends its observation there (the queries not yet
    sent stay unknown) instead of waiting out every query's timeout while its pod's grace period runs. ``timed``
    hears each query's name (a signal's, or ``freshness:<exporter>``) and its seconds, answered or not: an operator
    needs to know which query holds the cycle.
    """
    asks: list[tuple[str, str, str]] = [
        *((f"freshness:{name}", e.freshness_query, e.node_label) for name, e in settings.exporters.items()),
        *((s.name, s.query, settings.exporters[s.exporter].node_label) for s in settings.signals)]

    def ask(item: tuple[str, str, str]) -> dict[str, float] | QueryError | None:
        name, promql, label = item
        if stopped():
            return None
        started = time.perf_counter()
        try:
            return parse_vector(prometheus.query_raw(promql), label)
        except QueryError as exc:
            return exc
        finally:
            timed(name, time.perf_counter() - started)

    if settings.query_concurrency > 1:
        with ThreadPoolExecutor(settings.query_concurrency, thread_name_prefix="query") as pool:
            answers = list(pool.map(ask, asks))
    else:
        answers = [ask(item) for item in asks]
    errors: list[str] = []
    last_seen: dict[str, dict[str, float]] = {}
    readings: dict[str, dict[str, float]] = {}
    failed: set[str] = set()
    for (name, _, _), answer in zip(asks, answers, strict=True):
        freshness = name.startswith("freshness:")
        if isinstance(answer, dict):
            (last_seen if freshness else readings)[name.removeprefix("freshness:")] = answer
            continue
        if not freshness:
            failed.add(name)  # not asked (stopped) or failed: unknown, never clear
        if isinstance(answer, QueryError):
            errors.append(f"freshness of {name.removeprefix('freshness:')}: {answer}" if freshness
                          else f"signal {name}: {answer}")
    return Observations(readings, last_seen, frozenset(failed)), errors
