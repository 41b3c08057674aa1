"""Liveness for the platform's agents: ``/livez`` answers from a heartbeat of the agent's own loop.

Readiness and liveness ask different questions. Readiness is "can this process serve" (its metrics port
answers); liveness is "is its control loop still turning". A loop stuck in a call without a timeout still
answers its metrics port, so a liveness probe on ``/metrics`` would never restart it, and the same probe for
both means a replica that stops being ready is also killed. Here the loop records a beat (or exposes the
monotonic time of its last pass) and ``/livez`` fails once that beat is older than the agent's limit.

:func:`judge` is the pure decision; :func:`start_http_server` serves it beside the Prometheus registry on
the agent's one metrics port (``/livez`` and ``/readyz``; every other path is the registry, as before).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app

LIVEZ = "/livez"
READYZ = "/readyz"


def judge(last_beat: float | None, started: float, now: float, max_age_seconds: float) -> tuple[bool, str]:
    """Whether the loop is alive at ``now`` (monotonic seconds), and why.

    Before the first beat the process start counts as one, so a loop gets ``max_age_seconds`` to make its
    first pass (the probe's own initial delay is then not needed to cover a slow start).
    """
    if max_age_seconds <= 0:
        raise ValueError(f"max_age_seconds must be positive, got {max_age_seconds}")
    reference = started if last_beat is None else last_beat
    age = now - reference
    what = "since start, no pass yet" if last_beat is None else "since the last pass"
    if age > max_age_seconds:
        return False, f"stale: {age:.0f}s {what} (limit {max_age_seconds:g}s)"
    return True, f"ok: {age:.0f}s {what} (limit {max_age_seconds:g}s)"


class Heartbeat:
    """The time of the loop's last pass on a monotonic clock; ``beat()`` once per pass."""

    def __init__(self, max_age_seconds: float, clock: Callable[[], float] = time.monotonic,
                 source: Callable[[], float | None] | None = None) -> None:
        if max_age_seconds <= 0:
            raise ValueError(f"max_age_seconds must be positive, got {max_age_seconds}")
        self.max_age_seconds = max_age_seconds
        self.clock = clock
        self.started = clock()
        self._last: float | None = None
        #: Where the loop already keeps the time of its last pass (read instead of ``beat()``).
        self._source = source

    def beat(self) -> None:
        self._last = self.clock()

    @property
    def last(self) -> float | None:
        return self._source() if self._source is not None else self._last

    def alive(self) -> tuple[bool, str]:
        return judge(self.last, self.started, self.clock(), self.max_age_seconds)


def health_app(registry: CollectorRegistry, heartbeat: Heartbeat,
               ready: Callable[[], bool] | None = None) -> Callable[..., Iterable[bytes]]:
    """A WSGI app: ``/livez`` from the heartbeat, ``/readyz`` from ``ready`` (default: serving), else metrics."""
    metrics = make_wsgi_app(registry)

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        if path in (LIVEZ, READYZ):
            ok, why = heartbeat.alive() if path == LIVEZ else (ready() if ready else True, "serving")
            status = "200 OK" if ok else "503 Service Unavailable"
            start_response(status, [("Content-Type", "text/plain; charset=utf-8")])
            return [f"{why}\n".encode()]
        return metrics(environ, start_response)  # type: ignore[no-any-return]

    return app


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """Probes every few seconds would flood the agent's log."""


def start_http_server(port: int, registry: CollectorRegistry, heartbeat: Heartbeat, addr: str = "0.0.0.0",
                      ready: Callable[[], bool] | None = None) -> WSGIServer:
    """Serve metrics, ``/livez`` and ``/readyz`` on ``port`` from a daemon thread (as prometheus_client's
    ``start_http_server`` serves metrics alone)."""
    server = make_server(addr, port, health_app(registry, heartbeat, ready), _Server, handler_class=_Quiet)
    threading.Thread(target=server.serve_forever, name="metrics-http", daemon=True).start()
    return server
