"""Prometheus text-format rendering and the ``/metrics`` HTTP server of the exporter.

Why not ``prometheus_client.generate_latest`` and ``start_http_server``: they validate and escape every
label of every sample. With 8 HCAs and full mlx5 hw_counters a scrape has ~470 samples but only 8 distinct
label sets, and that per-sample work made a scrape about 3x slower than node_exporter's on the same tree
(``make bench``). :func:`render` escapes each distinct label set once per scrape and otherwise writes the
same text format 0.0.4; a test parses both outputs and requires them to be identical. The metric model
(families, samples, the custom collector) stays prometheus_client's.

Why not ``http.server``: its threading server starts a thread per connection and never times an idle
one out, so open sockets alone can exhaust the pod's memory. :class:`MetricsServer` bounds both.
"""

from __future__ import annotations

import contextlib
import selectors
import socket
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from prometheus_client.core import Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from agents.liveness import judge

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# prometheus_client's float formatter (Go-style, "+Inf"/"NaN") for the rare non-integral value; bound to a
# typed name because the library leaves it unannotated.
_format_float: Callable[[float], str] = floatToGoString


def _format_value(value: float) -> str:
    """Integral values (every counter, state and most rates) as plain integers, as node_exporter writes
    them; converting the float back to int is exact, so nothing is rounded."""
    if isinstance(value, int) or value.is_integer():
        return str(int(value))
    return _format_float(value)


def _escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def _escape_value(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def render(metrics: Iterable[Metric]) -> bytes:
    """Text exposition format 0.0.4 of ``metrics``; families without samples still get HELP/TYPE lines,
    as prometheus_client writes them."""
    out: list[str] = []
    label_text: dict[tuple[tuple[str, str], ...], str] = {}
    for metric in metrics:
        kind = metric.type
        name = metric.name
        if kind == "counter":
            name += "_total"
        elif kind == "info":
            name += "_info"
            kind = "gauge"
        elif kind not in ("gauge", "untyped"):
            raise ValueError(f"{metric.name}: metric type {kind} is not rendered by this exporter")
        out.append(f"# HELP {name} {_escape_help(metric.documentation)}\n# TYPE {name} {kind}\n")
        for sample in metric.samples:
            key = tuple(sample.labels.items())
            labels = label_text.get(key)
            if labels is None:
                inner = ",".join(f'{k}="{_escape_value(v)}"' for k, v in sorted(key))
                labels = label_text[key] = "{" + inner + "}" if inner else ""
            out.append(f"{sample.name}{labels} {_format_value(sample.value)}\n")
    return "".join(out).encode("utf-8")


@dataclass(frozen=True)
class ServerLimits:
    """Bounds that keep the server's memory flat whatever its clients do.

    The metrics port is open to every scraper (and to whatever else can reach it). A thread per
    connection, as ``ThreadingHTTPServer`` has, lets a few thousand idle sockets cost a thread stack
    each and push the pod past its memory limit. Here one thread multiplexes every connection: an idle
    one costs a socket, at most ``max_connections`` of them (the oldest is closed to admit a new one, so
    a scraper always gets in), each for at most ``idle_timeout_seconds``. A complete request is answered
    on that thread (scrapes are serialised by the collector's lock anyway, and a hand-off per scrape
    costs latency under the pod's CPU limit). A response its client does not take at once waits in
    memory, for at most ``max_pending_writes`` clients (oldest dropped first) and ``send_timeout_seconds``.
    """

    max_connections: int = 256
    idle_timeout_seconds: float = 10.0
    max_request_bytes: int = 8192
    max_pending_writes: int = 8
    send_timeout_seconds: float = 10.0
    send_buffer_bytes: int | None = None
    """SO_SNDBUF of accepted connections; ``None`` leaves it to the kernel's autotuning."""


@dataclass
class ServerStats:
    """What the limits did, for tests and the benchmark (not exported: it describes the exporter's
    clients, not the node)."""

    accepted: int = 0
    served: int = 0
    evicted: int = 0
    timed_out: int = 0
    oversized: int = 0
    slow_readers: int = 0
    dropped_slow: int = 0


_STATUS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed", 503: "Service Unavailable"}


def _response(status: int, content_type: str, body: bytes, head: bool = False) -> bytes:
    header = (
        f"HTTP/1.1 {status} {_STATUS[status]}\r\nServer: ib-exporter\r\nContent-Type: {content_type}\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    return header.encode("ascii") + (b"" if head else body)


_TEXT = "text/plain; charset=utf-8"


#: Liveness: the selector loop turns at least every half second; a minute without a turn is a wedged server.
LIVEZ_MAX_AGE_SECONDS = 60.0


def respond(collector: Collector, request: bytes,
            alive: Callable[[], tuple[bool, str]] | None = None) -> bytes:
    """The whole HTTP response to one request (its head up to the blank line); pure but for the scrape.

    ``/livez`` answers from ``alive`` (the server's loop heartbeat); ``/healthz`` stays "serving"."""
    line = request.split(b"\r\n", 1)[0].split(b"\n", 1)[0]
    parts = line.split()
    if len(parts) != 3 or not parts[2].startswith(b"HTTP/"):
        return _response(400, _TEXT, b"bad request\n")
    method, target = parts[0], parts[1].split(b"?", 1)[0]
    if method not in (b"GET", b"HEAD"):
        return _response(405, _TEXT, b"method not allowed\n")
    head = method == b"HEAD"
    if target == b"/metrics":
        return _response(200, CONTENT_TYPE, render(collector.collect()), head)
    if target == b"/livez":
        ok, why = alive() if alive is not None else (True, "serving")
        return _response(200 if ok else 503, _TEXT, f"{why}\n".encode(), head)
    if target in (b"/", b"/healthz"):
        return _response(200, _TEXT, b"ib-exporter: see /metrics\n", head)
    return _response(404, _TEXT, b"not found\n", head)


class MetricsServer:
    """``/metrics`` over HTTP/1.1 with one request per connection, within :class:`ServerLimits`."""

    def __init__(self, collector: Collector, host: str, port: int, limits: ServerLimits | None = None) -> None:
        self.collector = collector
        self.limits = limits or ServerLimits()
        self.stats = ServerStats()
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._listener = socket.socket(family, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind((host, port))
        self._listener.listen(128)
        self._listener.setblocking(False)
        self.address: tuple[str, int] = self._listener.getsockname()[:2]
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._listener, selectors.EVENT_READ)
        # Both in arrival order (dicts keep insertion order): the first entry is the oldest, and with
        # one timeout per kind, also the first to expire.
        self._idle: dict[socket.socket, tuple[float, bytearray]] = {}
        self._writing: dict[socket.socket, tuple[float, memoryview]] = {}
        self._stop = threading.Event()
        #: Monotonic time of the selector loop's last turn: the heartbeat behind ``/livez``.
        self.started = self.last_turn = time.monotonic()
        self.thread = threading.Thread(target=self._loop, name="ib-exporter-http", daemon=True)

    def start(self) -> MetricsServer:
        self.thread.start()
        return self

    def shutdown(self) -> None:
        """Stop accepting and close every connection; a scrape in progress finishes first."""
        self._stop.set()
        self.thread.join(timeout=10)

    def alive(self) -> tuple[bool, str]:
        return judge(self.last_turn, self.started, time.monotonic(), LIVEZ_MAX_AGE_SECONDS)

    def open_connections(self) -> int:
        return len(self._idle) + len(self._writing)

    def _loop(self) -> None:
        try:
            while not self._stop.is_set():
                ready = self._selector.select(timeout=0.5)
                # Established connections first, then new ones: a scraper whose request has arrived is
                # never the one evicted to make room.
                for key, _ in sorted(ready, key=lambda item: item[0].fileobj is self._listener):
                    conn = key.fileobj
                    if conn is self._listener:
                        self._accept()
                    elif isinstance(conn, socket.socket) and conn in self._writing:
                        self._flush(conn)
                    elif isinstance(conn, socket.socket):
                        self._receive(conn)
                self._expire(time.monotonic())
                self.last_turn = time.monotonic()
        finally:
            for conn in [*self._idle, *self._writing]:
                self._close(conn)
            self._selector.close()
            self._listener.close()

    def _accept(self) -> None:
        for _ in range(64):  # bounded per round so that requests already buffered keep being served
            try:
                conn, _ = self._listener.accept()
            except OSError:  # EAGAIN: backlog empty; EMFILE and friends: leave it for the next round
                return
            self.stats.accepted += 1
            while len(self._idle) >= self.limits.max_connections:
                self._close(next(iter(self._idle)))
                self.stats.evicted += 1
            conn.setblocking(False)
            if self.limits.send_buffer_bytes is not None:
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, self.limits.send_buffer_bytes)
            self._idle[conn] = (time.monotonic() + self.limits.idle_timeout_seconds, bytearray())
            self._selector.register(conn, selectors.EVENT_READ)
            self._receive(conn)  # a scraper sends its request with the connect: often it is already here

    def _receive(self, conn: socket.socket) -> None:
        entry = self._idle.get(conn)
        if entry is None:
            return
        try:
            chunk = conn.recv(4096)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            chunk = b""
        if not chunk:
            self._close(conn)
            return
        buffer = entry[1]
        buffer += chunk
        if b"\r\n\r\n" in buffer or b"\n\n" in buffer:
            del self._idle[conn]
            self._answer(conn, respond(self.collector, bytes(buffer), self.alive))
        elif len(buffer) > self.limits.max_request_bytes:
            self.stats.oversized += 1
            self._close(conn)

    def _answer(self, conn: socket.socket, response: bytes) -> None:
        try:
            sent = conn.send(response)
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError:
            self._close(conn)
            return
        if sent == len(response):
            self.stats.served += 1
            self._close(conn)
            return
        self.stats.slow_readers += 1
        while len(self._writing) >= self.limits.max_pending_writes:
            self._close(next(iter(self._writing)))
            self.stats.dropped_slow += 1
        deadline = time.monotonic() + self.limits.send_timeout_seconds
        self._writing[conn] = (deadline, memoryview(response)[sent:])
        self._selector.modify(conn, selectors.EVENT_WRITE)

    def _flush(self, conn: socket.socket) -> None:
        deadline, rest = self._writing[conn]
        try:
            sent = conn.send(rest)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._close(conn)
            return
        if sent == len(rest):
            self.stats.served += 1
            self._close(conn)
        else:
            self._writing[conn] = (deadline, rest[sent:])

    def _expire(self, now: float) -> None:
        for pending in (self._idle, self._writing):
            for conn, (deadline, _) in list(pending.items()):
                if deadline > now:
                    break  # arrival order is deadline order
                self.stats.timed_out += 1
                self._close(conn)

    def _close(self, conn: socket.socket) -> None:
        self._idle.pop(conn, None)
        self._writing.pop(conn, None)
        with contextlib.suppress(KeyError, ValueError):  # not registered (any more)
            self._selector.unregister(conn)
        conn.close()


def serve(
    collector: Collector, host: str, port: int, limits: ServerLimits | None = None
) -> tuple[MetricsServer, threading.Thread]:
    """Start serving ``/metrics`` in a daemon thread; the caller stops it with ``server.shutdown()``."""
    server = MetricsServer(collector, host, port, limits).start()
    return server, server.thread
