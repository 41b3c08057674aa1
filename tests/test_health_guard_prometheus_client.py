"""The guard's Prometheus client over a real HTTP server: connections are kept alive (one name lookup per
connection, not per query), a dropped connection is opened afresh, and every failure is a QueryError."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from agents.health_guard.contract import HealthSettings
from agents.health_guard.prometheus import PrometheusMetrics, QueryError, observe

VECTOR = {"status": "success", "data": {"resultType": "vector", "result": [
    {"metric": {"Hostname": "gpu-1"}, "value": [0, "78"]}]}}


class Server(ThreadingHTTPServer):
    connections = 0
    status = 200
    body: Any = VECTOR
    close_after = False
    delay = 0.0


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: Server

    def setup(self) -> None:
        super().setup()
        self.server.connections += 1

    def do_GET(self) -> None:
        time.sleep(self.server.delay)
        body = self.server.body
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        self.send_response(self.server.status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        if self.server.close_after:
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def server() -> Iterator[Server]:
    srv = Server(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield srv
    srv.shutdown()
    srv.server_close()


def client(server: Server) -> PrometheusMetrics:
    return PrometheusMetrics(f"http://127.0.0.1:{server.server_address[1]}/", timeout_seconds=5)


def test_queries_share_one_kept_alive_connection(server: Server) -> None:
    prom = client(server)
    for _ in range(12):  # one guard cycle's worth
        assert prom.query_raw("DCGM_FI_DEV_GPU_TEMP") == VECTOR
    assert server.connections == 1


def test_a_closed_connection_is_opened_afresh(server: Server) -> None:
    server.close_after = True
    prom = client(server)
    assert prom.query_raw("up") == VECTOR
    assert prom.query_raw("up") == VECTOR
    assert server.connections == 2


@pytest.mark.parametrize(("status", "body", "message"), [
    (503, {"status": "error"}, "HTTP 503"),
    (200, b"<html>a proxy's error page</html>", "failed"),
])
def test_failures_are_query_errors(server: Server, status: int, body: Any, message: str) -> None:
    server.status, server.body = status, body
    with pytest.raises(QueryError, match=message):
        client(server).query_raw("up")


def test_a_prometheus_error_answer_is_read_for_the_parser_to_refuse(server: Server) -> None:
    """4xx with Prometheus' own error JSON (a bad query) comes back as read; parse_vector names the error."""
    server.status, server.body = 400, {"status": "error", "error": "parse error"}
    assert client(server).query_raw("up(") == {"status": "error", "error": "parse error"}


def test_nothing_listening_is_a_query_error() -> None:
    prom = PrometheusMetrics("http://127.0.0.1:9/", timeout_seconds=1)
    with pytest.raises(QueryError, match="failed"):
        prom.query_raw("up")


def test_a_cycle_side_by_side_opens_no_more_connections_than_it_sends_queries_at_once(server: Server) -> None:
    """The queries go four at a time over four kept-alive connections, cycle after cycle: never more connections
    (each is a name lookup in a pod) than the bound, however many queries a cycle sends."""
    server.delay = 0.05
    settings = HealthSettings(query_concurrency=4)
    prom = PrometheusMetrics(f"http://127.0.0.1:{server.server_address[1]}/", timeout_seconds=5, connections=4)
    for _ in range(3):
        obs, errors = observe(settings, prom)
        assert errors == [] and not obs.failed
    assert 1 < server.connections <= 4
