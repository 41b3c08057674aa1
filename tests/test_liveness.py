"""Agents' liveness: ``/livez`` follows a heartbeat of the agent's own loop; readiness stays "can serve"."""

from __future__ import annotations

import urllib.error
import urllib.request
from typing import Any
from wsgiref.util import setup_testing_defaults

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Counter

from agents import liveness
from agents.ib_exporter.exposition import LIVEZ_MAX_AGE_SECONDS, MetricsServer, respond

times = st.floats(min_value=0, max_value=1e9, allow_nan=False)
ages = st.floats(min_value=0.001, max_value=1e6, allow_nan=False)


@given(started=times, beat=st.none() | times, elapsed=st.floats(min_value=0, max_value=1e7), limit=ages)
def test_alive_exactly_while_the_last_beat_is_within_the_limit(started: float, beat: float | None,
                                                               elapsed: float, limit: float) -> None:
    reference = started if beat is None else beat
    now = reference + elapsed
    ok, why = liveness.judge(beat, started, now, limit)
    assert ok == (now - reference <= limit)
    assert why.startswith("ok" if ok else "stale") and f"limit {limit:g}s" in why


def test_a_loop_gets_the_limit_for_its_first_pass() -> None:
    assert liveness.judge(None, 100.0, 159.0, 60.0) == (True, "ok: 59s since start, no pass yet (limit 60s)")
    assert liveness.judge(None, 100.0, 161.0, 60.0)[0] is False
    with pytest.raises(ValueError, match="max_age_seconds"):
        liveness.judge(None, 0.0, 0.0, 0.0)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def call(app: Any, path: str) -> tuple[str, bytes]:
    environ: dict[str, Any] = {"PATH_INFO": path}
    setup_testing_defaults(environ)
    seen: list[str] = []
    body = b"".join(app(environ, lambda status, headers: seen.append(status)))
    return seen[0], body


def test_livez_fails_when_the_loop_stops_while_metrics_and_readyz_keep_answering() -> None:
    clock = Clock()
    registry = CollectorRegistry()
    Counter("loop_passes", "passes", registry=registry).inc()
    heartbeat = liveness.Heartbeat(60.0, clock=clock)
    app = liveness.health_app(registry, heartbeat)
    heartbeat.beat()
    clock.now += 30
    assert call(app, "/livez")[0] == "200 OK"
    clock.now += 31  # the loop is stuck: no beat for 61 s
    status, body = call(app, "/livez")
    assert status == "503 Service Unavailable" and body.startswith(b"stale: 61s since the last pass")
    assert call(app, "/readyz")[0] == "200 OK"
    status, body = call(app, "/metrics")
    assert status.startswith("200") and b"loop_passes_total 1.0" in body
    heartbeat.beat()
    assert call(app, "/livez")[0] == "200 OK"


def test_heartbeat_reads_the_loops_own_clock_when_given_a_source() -> None:
    """The burst controller's shell keeps the monotonic time of its last reconcile: that is the beat."""
    clock = Clock()
    last: list[float | None] = [None]
    heartbeat = liveness.Heartbeat(60.0, clock=clock, source=lambda: last[0])
    clock.now += 61
    assert heartbeat.alive()[0] is False
    last[0] = clock.now - 5
    assert heartbeat.alive() == (True, "ok: 5s since the last pass (limit 60s)")


def test_readyz_follows_the_ready_callable() -> None:
    app = liveness.health_app(CollectorRegistry(), liveness.Heartbeat(60.0), ready=lambda: False)
    assert call(app, "/readyz")[0] == "503 Service Unavailable"


def test_the_served_endpoints_over_http() -> None:
    heartbeat = liveness.Heartbeat(60.0)
    server = liveness.start_http_server(0, CollectorRegistry(), heartbeat, addr="127.0.0.1")
    try:
        port = server.server_address[1]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/livez", timeout=5) as reply:
            assert reply.status == 200
        heartbeat.started -= 120  # no pass in two minutes
        with pytest.raises(urllib.error.HTTPError) as failed:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/livez", timeout=5)
        assert failed.value.code == 503
    finally:
        server.shutdown()
        server.server_close()


def test_ib_exporter_livez_follows_its_selector_loop() -> None:
    class NoCollector:
        def collect(self) -> list[Any]:
            return []

    request = b"GET /livez HTTP/1.1\r\nHost: x\r\n\r\n"
    assert respond(NoCollector(), request).startswith(b"HTTP/1.1 200")
    assert respond(NoCollector(), request, lambda: (False, "stale")).startswith(
        b"HTTP/1.1 503")
    server = MetricsServer(NoCollector(), "127.0.0.1", 0)
    try:
        assert server.alive()[0] is True
        server.last_turn -= LIVEZ_MAX_AGE_SECONDS + 1  # the loop has not turned for over a minute
        assert server.alive()[0] is False
        # /healthz (readiness) is unchanged: "serving".
        assert respond(NoCollector(), b"GET /healthz HTTP/1.1\r\n\r\n").startswith(b"HTTP/1.1 200")
    finally:
        server._listener.close()
