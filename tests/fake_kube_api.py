"""A small fake Kubernetes API served over HTTP on 127.0.0.1, for the suites that test the real client.

It keeps objects with resourceVersions, a watch history that can be compacted (410 Gone), merge patches with
optimistic concurrency (409 on a stale resourceVersion), the scale subresource, Leases, Events, and a queue of
injected faults (status codes, slow answers). Shell behaviour beyond the client is tested against
`agents.burst_controller.fixtures.MemoryApi`, without HTTP.
"""

from __future__ import annotations

import contextlib
import copy
import json
import re
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse

from agents.burst_controller.fixtures import merge_patch
from agents.burst_controller.shell import NODES, PODS


class FakeApi:
    """In-memory API objects plus the HTTP handler that serves them."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.rv = 100
        self.objects: dict[str, dict[str, dict[str, Any]]] = {NODES: {}, PODS: {}, "leases": {}, "scales": {}}
        self.history: list[tuple[int, str, str, dict[str, Any]]] = []
        self.compacted = 0
        self.events: list[dict[str, Any]] = []
        self.faults: list[tuple[str, str, Any]] = []  # (method, path regex, status code or ("delay", s))
        self.requests: list[tuple[str, str]] = []

    # -- object store ----------------------------------------------------------------------------

    @staticmethod
    def key(kind: str, obj: dict[str, Any]) -> str:
        meta = obj["metadata"]
        return f"{meta.get('namespace', '')}/{meta['name']}" if kind != NODES else meta["name"]

    def put(self, kind: str, obj: dict[str, Any], etype: str = "MODIFIED") -> dict[str, Any]:
        with self.lock:
            self.rv += 1
            obj = copy.deepcopy(obj)
            obj["metadata"]["resourceVersion"] = str(self.rv)
            self.objects[kind][self.key(kind, obj)] = obj
            if kind in (NODES, PODS):
                self.history.append((self.rv, kind, etype, copy.deepcopy(obj)))
            return obj

    def delete(self, kind: str, key: str) -> None:
        with self.lock:
            obj = self.objects[kind].pop(key)
            self.rv += 1
            self.history.append((self.rv, kind, "DELETED", obj))

    def compact(self) -> None:
        with self.lock:
            self.compacted = self.rv

    def node(self, name: str) -> dict[str, Any]:
        return self.objects[NODES][name]

    def fault(self, method: str, path: str, what: Any) -> None:
        self.faults.append((method, path, what))

    def take_fault(self, method: str, path: str) -> Any:
        with self.lock:
            for i, (m, p, what) in enumerate(self.faults):
                if m == method and re.search(p, path):
                    del self.faults[i]
                    return what
        return None

    # -- HTTP ------------------------------------------------------------------------------------

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
                fault = api.take_fault(method, url.path)
                if isinstance(fault, tuple) and fault[0] == "delay":
                    time.sleep(fault[1])
                elif isinstance(fault, int):
                    if method in ("PATCH", "PUT", "POST"):
                        self.body()
                    self.status(fault, "Injected")
                    return
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                    self.route(method, url.path, query)

            def route(self, method: str, path: str, query: dict[str, str]) -> None:
                if path in ("/api/v1/nodes", "/api/v1/pods") and method == "GET":
                    kind = NODES if path.endswith("nodes") else PODS
                    if query.get("watch") == "true":
                        self.watch(kind, int(query.get("resourceVersion") or 0))
                    else:
                        self.list(kind, int(query.get("limit") or 0), int(query.get("continue") or 0))
                    return
                if m := re.fullmatch(r"/api/v1/nodes/([^/]+)", path):
                    self.obj(method, NODES, m.group(1))
                    return
                if m := re.fullmatch(r"/api/v1/namespaces/([^/]+)/pods/([^/]+)", path):
                    self.obj(method, PODS, f"{m.group(1)}/{m.group(2)}")
                    return
                if m := re.fullmatch(r"/apis/apps/v1/namespaces/([^/]+)/deployments/([^/]+)/scale", path):
                    self.scale(method, f"{m.group(1)}/{m.group(2)}")
                    return
                if m := re.fullmatch(r"/api/v1/namespaces/([^/]+)/events", path):
                    event = self.body()
                    event["metadata"]["namespace"] = m.group(1)
                    api.events.append(event)
                    self.send_json(201, event)
                    return
                if m := re.fullmatch(r"/apis/coordination.k8s.io/v1/namespaces/([^/]+)/leases(?:/([^/]+))?", path):
                    self.lease(method, m.group(1), m.group(2))
                    return
                self.status(404, "NotFound")

            def list(self, kind: str, limit: int, offset: int) -> None:
                with api.lock:
                    items = list(api.objects[kind].values())
                    rv = api.rv
                page = items[offset : offset + limit] if limit else items
                meta: dict[str, Any] = {"resourceVersion": str(rv)}
                if limit and offset + limit < len(items):
                    meta["continue"] = str(offset + limit)
                self.send_json(200, {"kind": "List", "metadata": meta, "items": page})

            def watch(self, kind: str, since: int) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.end_headers()  # HTTP/1.0: the stream ends when the connection closes
                with api.lock:
                    gone = since < api.compacted
                    events = [(t, o) for rv, k, t, o in api.history if k == kind and rv > since]
                if gone:
                    status = {"kind": "Status", "code": 410, "reason": "Expired", "message": "too old"}
                    self.wfile.write(json.dumps({"type": "ERROR", "object": status}).encode() + b"\n")
                    return
                for etype, obj in events:
                    self.wfile.write(json.dumps({"type": etype, "object": obj}).encode() + b"\n")

            def obj(self, method: str, kind: str, key: str) -> None:
                with api.lock:
                    current = copy.deepcopy(api.objects[kind].get(key))
                if current is None:
                    if method == "PATCH":
                        self.body()
                    self.status(404, "NotFound")
                    return
                if method == "GET":
                    self.send_json(200, current)
                    return
                patch = self.body()
                if self.headers["Content-Type"] == "application/strategic-merge-patch+json":
                    # Only what the controller sends: delete one scheduling gate by its merge key.
                    doomed = {g["name"] for g in patch["spec"]["schedulingGates"] if g.get("$patch") == "delete"}
                    gates = [g for g in current["spec"].get("schedulingGates", []) if g["name"] not in doomed]
                    current["spec"]["schedulingGates"] = gates
                    self.send_json(200, api.put(kind, current))
                    return
                assert self.headers["Content-Type"] == "application/merge-patch+json"
                want_rv = (patch.get("metadata") or {}).get("resourceVersion")
                if want_rv is not None and want_rv != current["metadata"]["resourceVersion"]:
                    self.status(409, "Conflict")
                    return
                self.send_json(200, api.put(kind, merge_patch(current, patch)))

            def scale(self, method: str, key: str) -> None:
                current = api.objects["scales"].get(key)
                if current is None:
                    if method == "PATCH":
                        self.body()
                    self.status(404, "NotFound")
                    return
                if method == "PATCH":
                    assert self.headers["Content-Type"] == "application/merge-patch+json"
                    current = api.put("scales", merge_patch(current, self.body()))
                self.send_json(200, current)

            def lease(self, method: str, namespace: str, name: str | None) -> None:
                if method == "POST":
                    body = self.body()
                    key = f"{namespace}/{body['metadata']['name']}"
                    if key in api.objects["leases"]:
                        self.status(409, "AlreadyExists")
                        return
                    self.send_json(201, api.put("leases", body))
                    return
                key = f"{namespace}/{name}"
                current = api.objects["leases"].get(key)
                if current is None:
                    if method == "PUT":
                        self.body()
                    self.status(404, "NotFound")
                    return
                if method == "GET":
                    self.send_json(200, current)
                    return
                body = self.body()
                if body["metadata"].get("resourceVersion") != current["metadata"]["resourceVersion"]:
                    self.status(409, "Conflict")
                    return
                body["metadata"]["namespace"] = namespace
                self.send_json(200, api.put("leases", body))

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
        server.shutdown()
        server.server_close()
