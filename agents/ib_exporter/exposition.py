"""Prometheus text-format rendering and the ``/metrics`` HTTP server of the exporter.

Why not ``prometheus_client.generate_latest`` and ``start_http_server``: they validate and escape every
label of every sample. With 8 HCAs and full mlx5 hw_counters a scrape has ~470 samples but only 8 distinct
label sets, and that per-sample work made a scrape about 3x slower than node_exporter's on the same tree
(``make bench``). :func:`render` escapes each distinct label set once per scrape and otherwise writes the
same text format 0.0.4; a test parses both outputs and requires them to be identical. The metric model
(families, samples, the custom collector) stays prometheus_client's.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client.core import Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

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


class _Handler(BaseHTTPRequestHandler):
    collector: Collector  # set on the per-server subclass
    server_version = "ib-exporter"

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if path == "/metrics":
            self._reply(200, CONTENT_TYPE, render(self.collector.collect()))
        elif path in ("/", "/healthz"):
            self._reply(200, "text/plain; charset=utf-8", b"ib-exporter: see /metrics\n")
        else:
            self._reply(404, "text/plain; charset=utf-8", b"not found\n")

    def _reply(self, status: int, content_type: str, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        """Silent: a log line per scrape every 15 s on every node is noise, not information."""


class _Server(ThreadingHTTPServer):
    daemon_threads = True


def serve(collector: Collector, host: str, port: int) -> tuple[ThreadingHTTPServer, threading.Thread]:
    """Start serving ``/metrics`` in a daemon thread; the caller stops it with ``server.shutdown()``."""
    handler = type("Handler", (_Handler,), {"collector": collector})
    server_class: type[_Server] = _Server
    if ":" in host:
        server_class = type("Server6", (_Server,), {"address_family": socket.AF_INET6})
    server = server_class((host, port), handler)
    thread = threading.Thread(target=server.serve_forever, name="ib-exporter-http", daemon=True)
    thread.start()
    return server, thread
