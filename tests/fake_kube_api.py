"""The kit's in-memory API (`fakes.kube_api.MemoryApi`) served over HTTP on 127.0.0.1, for the suites
that test the real client (`agents.kit.port.HttpPort`) of every agent.

Paths are routed to the same verbs the port has, so the HTTP-level tests and the in-memory ones see one
store with one set of semantics (resourceVersions, conflicts, evictions, scale). On top: a watch served from
the store's history that can be compacted (410 Gone), and a queue of injected faults per method and path (a
status code, a delay, or an answer that never comes).
"""

from __future__ import annotations

import contextlib
import json
import re
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, unquote, urlparse

from agents.kit.errors import ApiError
from agents.kit.port import DEPLOYMENTS, EVENTS, LEASES, NODES, PODS, VOLCANO_JOBS, Resource
from fakes.kube_api import MemoryApi, field_matches, matches

RESOURCES = {(r.group, r.plural): r for r in (NODES, PODS, EVENTS, LEASES, DEPLOYMENTS, VOLCANO_JOBS)}
PATH = re.compile(r"/(?:api/(?P<core>v1)|apis/(?P<group>[^/]+)/(?P<version>[^/]+))"
                  r"(?:/namespaces/(?P<ns>[^/]+))?/(?P<plural>[^/]+)(?:/(?P<name>[^/]+)(?:/(?P<sub>[^/]+))?)?")
STATUS_OF = {"conflict": 409, "gone": 410, "not_found": 404, "forbidden": 403, "invalid": 422, "throttled": 429,
             "server_error": 500}


class FakeApi(MemoryApi):
    """The in-memory API plus what only HTTP has: injected faults, a compactable watch, the request log."""

    def __init__(self) -> None:
        super().__init__()
        self.compacted = 0
        self.faults: list[tuple[str, str, Any]] = []  # (method, path regex, status code, ("delay", s) or "hang")
        self.requests: list[tuple[str, str]] = []  # (method, path)
        self.content_types: list[tuple[str, str, str]] = []  # (method, path, Content-Type)
        self.released = threading.Event()  # set to let hanging requests end
        #: How long a watch stays open for new events (0: it ends after the history, as before).
        self.watch_hold_seconds = 0.0
        self.in_flight = 0
        self.max_in_flight = 0  # the most requests the server held at once

    def node(self, name: str) -> dict[str, Any]:
        return self.objects["nodes"][name]

    def compact(self) -> None:
        with self.lock:
            self.compacted = self.rv

    def fault(self, method: str, path: str, what: Any) -> None:
        self.faults.append((method, path, what))

    def take_fault(self, method: str, path: str) -> Any:
        with self.lock:
            for i, (m, p, what) in enumerate(self.faults):
                if m == method and re.search(p, path):
                    del self.faults[i]
                    return what
        return None

    def handler(self) -> type[BaseHTTPRequestHandler]:
        api = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def send_json(self, code: int, body: Any) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def status(self, code: int, reason: str) -> None:
                self.send_json(code, {"kind": "Status", "status": "Failure", "code": code, "reason": reason})

            def body(self) -> Any:
                length = int(self.headers.get("Content-Length", "0"))
                return json.loads(self.rfile.read(length)) if length else None

            def handle_any(self, method: str) -> None:
                url = urlparse(self.path)
                query = {k: v[0] for k, v in parse_qs(url.query).items()}
                api.requests.append((method, url.path))
                api.content_types.append((method, url.path, self.headers.get("Content-Type", "")))
                with api.lock:
                    api.in_flight += 1
                    api.max_in_flight = max(api.max_in_flight, api.in_flight)
                try:
                    self.handle_counted(method, url, query)
                finally:
                    with api.lock:
                        api.in_flight -= 1

            def handle_counted(self, method: str, url: Any, query: dict[str, str]) -> None:
                fault = api.take_fault(method, url.path)
                body = self.body() if method in ("PATCH", "PUT", "POST") else None
                if fault == "hang":
                    api.released.wait(120)
                    return
                if isinstance(fault, tuple) and fault[0] == "delay":
                    time.sleep(fault[1])
                elif isinstance(fault, int):
                    self.status(fault, "Injected")
                    return
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                    self.route(method, url.path, query, body)

            def route(self, method: str, path: str, query: dict[str, str], body: Any) -> None:
                m = PATH.fullmatch(path)
                resource = RESOURCES.get(("" if m and m["core"] else (m["group"] if m else ""),
                                          m["plural"] if m else ""))
                if m is None or resource is None:
                    self.status(404, "NotFound")
                    return
                ns, name, sub = m["ns"], unquote(m["name"]) if m["name"] else None, m["sub"]
                try:
                    if method == "GET" and name is None and query.get("watch") == "true":
                        self.watch(resource, int(query.get("resourceVersion") or 0), ns, query.get("labelSelector"),
                                   min(float(query.get("timeoutSeconds") or 0), api.watch_hold_seconds),
                                   query.get("fieldSelector"))
                        return
                    if method == "GET" and name is None:
                        answer = api.list(resource, ns, label_selector=query.get("labelSelector"),
                                          field_selector=query.get("fieldSelector"),
                                          limit=int(query.get("limit") or 0) or None,
                                          continue_token=query.get("continue"))
                    elif method == "GET":
                        answer = api.get(resource, name or "", ns)
                    elif method == "POST":
                        answer = api.create(resource, body or {}, ns, name, sub)
                    elif method == "PATCH":
                        answer = api.patch(resource, name or "", body or {}, ns,
                                           self.headers.get("Content-Type", ""), sub)
                    elif method == "PUT":
                        answer = api.replace(resource, name or "", body or {}, ns)
                    else:
                        self.status(405, "MethodNotAllowed")
                        return
                except ApiError as exc:
                    self.status(exc.status or STATUS_OF.get(exc.kind, 500), exc.kind)
                    return
                self.send_json(201 if method == "POST" else 200, answer)

            def watch(self, resource: Resource, since: int, ns: str | None, selector: str | None,
                      hold: float, fields: str | None = None) -> None:
                """Every event after ``since``, then, for up to ``hold`` seconds, each new one as it happens."""
                with api.lock:
                    api.calls.append((f"watch:{resource.plural}", str(since), api.clock()))
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.end_headers()  # HTTP/1.0: the stream ends when the connection closes
                with api.lock:
                    if since < api.compacted:
                        status = {"kind": "Status", "code": 410, "reason": "Expired", "message": "too old"}
                        self.wfile.write(json.dumps({"type": "ERROR", "object": status}).encode() + b"\n")
                        return
                until = time.monotonic() + hold
                while True:
                    with api.lock:
                        events = [(rv, t, o) for rv, k, t, o in api.history if k == resource.plural and rv > since
                                  and (not ns or o["metadata"].get("namespace") == ns)
                                  and matches(o["metadata"].get("labels") or {}, selector)
                                  and field_matches(o, fields)]
                    for rv, etype, obj in events:
                        self.wfile.write(json.dumps({"type": etype, "object": obj}).encode() + b"\n")
                        since = rv
                    self.wfile.flush()
                    if time.monotonic() >= until or api.released.is_set():
                        return
                    time.sleep(0.02)

            def do_GET(self) -> None:
                self.handle_any("GET")

            def do_PATCH(self) -> None:
                self.handle_any("PATCH")

            def do_PUT(self) -> None:
                self.handle_any("PUT")

            def do_POST(self) -> None:
                self.handle_any("POST")

        return Handler


@contextlib.contextmanager
def serve(fake: FakeApi) -> Iterator[str]:
    """Serve `fake` on a free local port for the duration of the block; yields its base URL."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), fake.handler())
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        fake.released.set()
        server.shutdown()
        server.server_close()


def http_port(url: str, request_timeout_seconds: float = 5.0, connections: int = 16) -> Any:
    """The real port (`HttpPort`) on a fake served at `url`."""
    from kubernetes import client

    from agents.kit.port import HttpPort

    conf = client.Configuration()
    conf.host = url
    return HttpPort.on(conf, request_timeout_seconds, connections=connections)
