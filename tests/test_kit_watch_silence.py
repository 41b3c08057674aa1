"""A watch gone silent ends as a timeout after ``WATCH_SILENCE_SECONDS``, not after its own timeout: a black-holed
watch (a hung proxy, a half-open connection) was read for five minutes of a stale view. A live watch, kept talking
by the API server's bookmarks, is read to its end however long that is (tools: the real client over HTTP)."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from agents.kit.errors import ApiError
from agents.kit.port import NODES, WATCH_SILENCE_SECONDS, HttpPort

NODE = {"type": "ADDED", "object": {"kind": "Node", "metadata": {"name": "gpu-01", "resourceVersion": "7"}}}
BOOKMARK = {"type": "BOOKMARK", "object": {"kind": "Node", "metadata": {"resourceVersion": "8"}}}


class Server(ThreadingHTTPServer):
    daemon_threads = True
    #: After the first event: (bookmarks to send, seconds between them), then the silence before the end.
    bookmarks = (0, 0.0)
    silence = 0.0


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: Server

    def _chunk(self, event: dict[str, Any]) -> None:
        data = json.dumps(event).encode() + b"\n"
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self._chunk(NODE)
        count, every = self.server.bookmarks
        for _ in range(count):
            time.sleep(every)
            self._chunk(BOOKMARK)
        time.sleep(self.server.silence)
        with contextlib.suppress(OSError):  # the client gave up on the silence
            self.wfile.write(b"0\r\n\r\n")

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def server() -> Iterator[Server]:
    srv = Server(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield srv
    srv.shutdown()
    srv.server_close()


def port_on(server: Server, silence: float) -> HttpPort:
    from kubernetes import client

    conf = client.Configuration()
    conf.host = f"http://127.0.0.1:{server.server_address[1]}"
    port = HttpPort.on(conf, 0.5)
    port.watch_silence = silence
    return port


def test_a_silent_watch_ends_as_a_timeout_after_the_silence_bound_not_its_own_timeout(server: Server) -> None:
    server.silence = 30.0
    started = time.monotonic()
    events = port_on(server, 1.0).watch(NODES, "", 300)
    assert next(events)["type"] == "ADDED"
    with pytest.raises(ApiError) as err:
        next(events)
    assert err.value.kind == "timeout"
    assert time.monotonic() - started < 10  # the silence (1 s) and the request timeout, not 300 s


def test_a_watch_kept_talking_by_bookmarks_is_read_past_the_silence_bound(server: Server) -> None:
    server.bookmarks = (6, 0.5)  # three seconds of bookmarks, each gap under the one-second bound
    events = list(port_on(server, 1.0).watch(NODES, "", 300))
    assert [e["type"] for e in events] == ["ADDED"] + ["BOOKMARK"] * 6


def test_the_bound_sits_above_the_api_servers_bookmark_period_and_below_the_watch_timeout() -> None:
    """A bookmark comes about every minute on a quiet watch (at most 120 s after the start, measured); the agents'
    watches last 300 s."""
    assert 120 < WATCH_SILENCE_SECONDS < 300
