"""A watch gone silent ends after ``WATCH_SILENCE_SECONDS``, not after its own timeout, and ends as at that timeout
(the informer watches again from its resourceVersion on a new connection, without a re-list): a black-holed watch (a
hung proxy, a half-open connection) was read for five minutes of a stale view, and a quiet kind the API server does
not bookmark must not be re-listed for its quiet. A request that never answers is still a timeout; a live watch,
kept talking by the API server's bookmarks, is read to its end however long that is (the real client over HTTP)."""

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


def test_a_silent_watch_ends_after_the_silence_bound_as_at_its_own_timeout(server: Server) -> None:
    server.silence = 30.0
    started = time.monotonic()
    events = list(port_on(server, 1.0).watch(NODES, "", 300))
    assert [e["type"] for e in events] == ["ADDED"]  # then the end, not an error
    assert time.monotonic() - started < 10  # the silence (1 s) and the request timeout, not 300 s


def test_a_silent_watch_is_watched_again_from_its_resource_version_without_a_relist(server: Server) -> None:
    from agents.kit.informer import Informer, Store, WatchEnd

    server.silence = 30.0
    port = port_on(server, 1.0)
    store = Store()
    store.replace([])
    informer = Informer(port, NODES, store, watch_timeout_seconds=300)
    informer.resource_version, informer.needs_list = "5", False
    errors: list[str] = []
    informer.on_error = errors.append
    assert informer.watch_once() == WatchEnd.OK
    assert informer.resource_version == "7" and not informer.needs_list and store.synced and errors == []
    assert store.get("gpu-01") is not None


def test_a_request_that_never_answers_is_still_a_timeout() -> None:
    import socket

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)  # accepts the connection, never answers
    try:
        from kubernetes import client

        conf = client.Configuration()
        conf.host = f"http://127.0.0.1:{listener.getsockname()[1]}"
        port = HttpPort.on(conf, 0.5)
        port.watch_silence = 1.0
        with pytest.raises(ApiError) as err:
            next(port.watch(NODES, "", 300))
        assert err.value.kind == "timeout"
    finally:
        listener.close()


def test_a_watch_kept_talking_by_bookmarks_is_read_past_the_silence_bound(server: Server) -> None:
    server.bookmarks = (6, 0.5)  # three seconds of bookmarks, each gap under the one-second bound
    events = list(port_on(server, 1.0).watch(NODES, "", 300))
    assert [e["type"] for e in events] == ["ADDED"] + ["BOOKMARK"] * 6


def test_the_bound_sits_above_the_api_servers_bookmark_period_and_below_the_watch_timeout() -> None:
    """A bookmark comes about every minute on a quiet watch (at most 120 s after the start, measured); the agents'
    watches last 300 s."""
    assert 120 < WATCH_SILENCE_SECONDS < 300
