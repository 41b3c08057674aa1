"""The burst controller's I/O shell against a small fake Kubernetes API served over HTTP on 127.0.0.1.

The fake keeps objects with resourceVersions, a watch history that can be compacted (410 Gone), merge
patches with optimistic concurrency (409 on a stale resourceVersion), Leases, Events, and a queue of
injected faults (status codes, slow answers).
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

import pytest
from kubernetes import client

from agents.burst_controller import shell as shell_mod
from agents.burst_controller.decide import Mode
from agents.burst_controller.fixtures import gpu_pod, onprem_node, virtual_node
from agents.burst_controller.settings import BurstSettings
from agents.burst_controller.shell import NODES, PODS, BurstShell

S = BurstSettings(
    open_below_free_gpus=1,
    close_at_free_gpus=8,
    open_hold_seconds=0,
    close_hold_seconds=0,
    pending_grace_seconds=0,
    request_timeout_seconds=0.5,
    backoff_base_seconds=0.5,
    backoff_max_seconds=4,
    watch_timeout_seconds=5,
    stale_after_seconds=60,
    lease_duration_seconds=15,
    renew_deadline_seconds=10,
)
VK_TAINT = {"key": "virtual-kubelet.io/provider", "value": "gpucloud", "effect": "NoSchedule"}
BURST_TAINT = {"key": "gpucluster.io/burst", "value": "closed", "effect": "NoSchedule"}


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


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


class Clock:
    """A settable clock standing in for both wall and monotonic time."""

    def __init__(self, t: float = 1_700_000_000.0) -> None:
        self.t = t
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)


@pytest.fixture
def api() -> Iterator[tuple[FakeApi, str]]:
    fake = FakeApi()
    server = ThreadingHTTPServer(("127.0.0.1", 0), fake.handler())
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield fake, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def make_shell(url: str, clock: Clock, identity: str = "a", settings: BurstSettings = S) -> BurstShell:
    config = client.Configuration()
    config.host = url
    config.retries = False  # our own backoff decides; urllib3 must not retry behind our back
    return BurstShell(
        settings, client.ApiClient(config), identity=identity, clock=clock, monotonic=clock, sleep=clock.sleep
    )


def exhausted_cluster(fake: FakeApi) -> None:
    fake.put(NODES, onprem_node("n1", 8))
    fake.put(NODES, virtual_node("vk-a"))
    fake.put(NODES, virtual_node("vk-b", "othercloud"))
    fake.put(PODS, gpu_pod("train-0", 8, node="n1", workload="training", namespace="train"))


def metric(sh: BurstShell, name: str, **labels: str) -> float | None:
    return sh.metrics.registry.get_sample_value(name, labels)


def lead_and_sync(sh: BurstShell) -> None:
    assert sh.elector.step()
    assert sh.relist(NODES) and sh.relist(PODS)


def test_opens_virtual_nodes_keeping_provider_taint(api: tuple[FakeApi, str]) -> None:
    fake, url = api
    exhausted_cluster(fake)
    clock = Clock()
    sh = make_shell(url, clock)
    lead_and_sync(sh)
    decision = sh.reconcile()
    assert decision is not None and decision.flipped is Mode.OPEN
    for name in ("vk-a", "vk-b"):
        node = fake.node(name)
        assert node["spec"]["taints"][0]["key"] == "virtual-kubelet.io/provider"
        assert [t["key"] for t in node["spec"]["taints"]] == ["virtual-kubelet.io/provider"]
        assert node["metadata"]["annotations"]["gpucluster.io/burst-changed-at"] == "2023-11-14T22:13:20.000000Z"
    assert [(e["reason"], e["involvedObject"]["name"], e["metadata"]["namespace"]) for e in fake.events] == [
        ("BurstOpened", "vk-a", "default"),
        ("BurstOpened", "vk-b", "default"),
    ]
    assert metric(sh, "gpucluster_burst_flips_total", direction="open") == 1
    assert metric(sh, "gpucluster_burst_virtual_node_open", node="vk-b", provider="othercloud") == 1
    assert metric(sh, "gpucluster_burst_onprem_free_gpus") == 0
    assert metric(sh, "gpucluster_burst_cluster_visible") == 1
    assert metric(sh, "gpucluster_burst_leader") == 1
    # The patch response already updated the view: nothing left to do, no second patch.
    patches = [r for r in fake.requests if r[0] == "PATCH"]
    assert sh.reconcile() is not None
    assert [r for r in fake.requests if r[0] == "PATCH"] == patches


def test_close_sets_noschedule_and_marks_external_pods(api: tuple[FakeApi, str]) -> None:
    fake, url = api
    fake.put(NODES, onprem_node("n1", 8))
    fake.put(NODES, onprem_node("n2", 8))
    fake.put(NODES, virtual_node("vk-a", burst_effect=None, changed_at="2023-11-14T00:00:00Z"))
    fake.put(NODES, virtual_node("vk-b", burst_effect="NoExecute", changed_at="2023-11-14T00:00:00Z"))
    fake.put(PODS, gpu_pod("inf-0", 1, node="vk-a"))
    clock = Clock()
    sh = make_shell(url, clock)
    lead_and_sync(sh)
    decision = sh.reconcile()
    assert decision is not None and decision.flipped is Mode.CLOSED
    assert fake.node("vk-a")["spec"]["taints"] == [VK_TAINT, BURST_TAINT]
    assert fake.node("vk-b")["spec"]["taints"] == [VK_TAINT, BURST_TAINT]  # NoExecute replaced
    pod = fake.objects[PODS]["serving/inf-0"]
    assert pod["metadata"]["annotations"]["controller.kubernetes.io/pod-deletion-cost"] == "-100"
    assert metric(sh, "gpucluster_burst_actions_total", kind="set_deletion_cost") == 1
    assert metric(sh, "gpucluster_burst_flips_total", direction="closed") == 1


def test_patch_conflict_rereads_and_keeps_concurrent_taint(api: tuple[FakeApi, str]) -> None:
    fake, url = api
    exhausted_cluster(fake)
    clock = Clock()
    sh = make_shell(url, clock)
    lead_and_sync(sh)
    # Someone cordons-by-taint vk-a after our list: our first patch carries a stale resourceVersion.
    node = fake.node("vk-a")
    maintenance = {"key": "example.com/maintenance", "effect": "NoSchedule"}
    node["spec"]["taints"].append(maintenance)
    fake.put(NODES, node)
    sh.reconcile()
    assert fake.node("vk-a")["spec"]["taints"] == [VK_TAINT, maintenance]
    assert metric(sh, "gpucluster_burst_errors_total", kind="conflict") == 1
    gets = [r for r in fake.requests if r == ("GET", "/api/v1/nodes/vk-a")]
    assert len(gets) == 1


def test_server_errors_back_off_then_succeed(api: tuple[FakeApi, str]) -> None:
    fake, url = api
    exhausted_cluster(fake)
    clock = Clock()
    sh = make_shell(url, clock)
    lead_and_sync(sh)
    fake.fault("PATCH", "/nodes/vk-a$", 500)
    fake.fault("PATCH", "/nodes/vk-a$", 503)
    sh.reconcile()
    assert clock.sleeps == [0.5, 1.0]
    assert metric(sh, "gpucluster_burst_errors_total", kind="server_error") == 2
    assert fake.node("vk-a")["spec"]["taints"] == [VK_TAINT]


def test_persistent_server_errors_give_up_and_retry_next_decision(api: tuple[FakeApi, str]) -> None:
    fake, url = api
    exhausted_cluster(fake)
    clock = Clock()
    sh = make_shell(url, clock)
    lead_and_sync(sh)
    for _ in range(S.api_retry_attempts):
        fake.fault("PATCH", "/nodes/vk-a$", 502)
    sh.reconcile()
    assert clock.sleeps == [0.5, 1.0, 2.0, 4.0, 4.0]
    assert fake.node("vk-a")["spec"]["taints"] == [VK_TAINT, BURST_TAINT]
    assert [t["key"] for t in fake.node("vk-b")["spec"]["taints"]] == ["virtual-kubelet.io/provider"]
    clock.t += 5
    sh.reconcile()  # the mode stays open, so the mismatch is acted on again
    assert fake.node("vk-a")["spec"]["taints"] == [VK_TAINT]
    assert metric(sh, "gpucluster_burst_flips_total", direction="open") == 1


def test_timeout_is_retried(api: tuple[FakeApi, str]) -> None:
    fake, url = api
    exhausted_cluster(fake)
    clock = Clock()
    sh = make_shell(url, clock)
    lead_and_sync(sh)
    fake.fault("PATCH", "/nodes/vk-a$", ("delay", 1.5))
    sh.reconcile()
    assert metric(sh, "gpucluster_burst_errors_total", kind="timeout") == 1
    assert clock.sleeps == [0.5]
    assert fake.node("vk-a")["spec"]["taints"] == [VK_TAINT]


def test_watch_streams_events_from_resource_version(api: tuple[FakeApi, str]) -> None:
    fake, url = api
    exhausted_cluster(fake)
    clock = Clock()
    sh = make_shell(url, clock)
    lead_and_sync(sh)
    fake.put(NODES, onprem_node("n2", 8), "ADDED")
    fake.put(PODS, gpu_pod("train-1", 4, node="n2", workload="training", namespace="train"), "ADDED")
    clock.t += 30
    sh.watch_once(NODES)
    sh.watch_once(PODS)
    snapshot = sh.view.snapshot()
    assert (snapshot.onprem_allocatable_gpus, snapshot.onprem_free_gpus) == (16, 4)
    assert snapshot.observed_at == clock.t
    assert sh.cursors[PODS].resource_version == str(fake.rv)
    lists = [r for r in fake.requests if r[0] == "GET" and r[1] in ("/api/v1/nodes", "/api/v1/pods")]
    assert len(lists) == 4  # two lists, two watches: no re-list


def test_watch_410_relists(api: tuple[FakeApi, str]) -> None:
    fake, url = api
    exhausted_cluster(fake)
    clock = Clock()
    sh = make_shell(url, clock)
    lead_and_sync(sh)
    fake.delete(PODS, "train/train-0")
    fake.compact()
    sh.watch_once(PODS)
    assert metric(sh, "gpucluster_burst_errors_total", kind="watch_gone") == 1
    assert sh.cursors[PODS].needs_list
    assert not sh.view.snapshot().synced
    assert sh.reconcile() is None  # unsynced: no decision, no patch
    sh.watch_once(PODS)  # re-lists first
    assert sh.view.snapshot().synced
    assert sh.view.snapshot().onprem_free_gpus == 8
    assert metric(sh, "gpucluster_burst_cluster_visible") == 1


def test_paged_list(api: tuple[FakeApi, str], monkeypatch: pytest.MonkeyPatch) -> None:
    fake, url = api
    exhausted_cluster(fake)
    for i in range(5):
        fake.put(PODS, gpu_pod(f"inf-{i}", 1, node="vk-a"))
    monkeypatch.setattr(shell_mod, "LIST_PAGE", 2)
    sh = make_shell(url, Clock())
    assert sh.relist(PODS)
    assert sh.view.pod_count == 6
    assert len([r for r in fake.requests if r == ("GET", "/api/v1/pods")]) == 3


def test_blind_controller_leaves_taints(api: tuple[FakeApi, str]) -> None:
    fake, url = api
    exhausted_cluster(fake)
    clock = Clock()
    sh = make_shell(url, clock)
    assert sh.elector.step()
    fake.fault("GET", "^/api/v1/nodes$", 500)
    assert not sh.relist(NODES)
    assert sh.relist(PODS)
    assert metric(sh, "gpucluster_burst_cluster_visible") == 1
    assert sh.reconcile() is None
    assert metric(sh, "gpucluster_burst_errors_total", kind="list_server_error") == 1
    assert [r for r in fake.requests if r[0] == "PATCH"] == []
    # Listed once, then the API goes dark: once the data is stale nothing changes either.
    assert sh.relist(NODES)
    fake.fault("GET", "^/api/v1/nodes$", 503)
    sh.cursors[NODES].needs_list = True
    sh.watch_once(NODES)
    assert metric(sh, "gpucluster_burst_cluster_visible") == 0
    assert not sh.view.snapshot().synced
    clock.t += 61
    assert sh.reconcile() is None
    assert [r for r in fake.requests if r[0] == "PATCH"] == []


def test_unreachable_api(api: tuple[FakeApi, str]) -> None:
    sh = make_shell("http://127.0.0.1:9", Clock())  # discard port: connection refused
    assert not sh.relist(NODES)
    assert not sh.elector.step()
    assert metric(sh, "gpucluster_burst_errors_total", kind="list_unreachable") == 1
    assert metric(sh, "gpucluster_burst_cluster_visible") == 0


def test_leader_handover(api: tuple[FakeApi, str]) -> None:
    fake, url = api
    exhausted_cluster(fake)
    clock_a, clock_b = Clock(), Clock()
    a = make_shell(url, clock_a, identity="a")
    b = make_shell(url, clock_b, identity="b")
    assert a.elector.step()
    assert not b.elector.step()
    for sh in (a, b):
        assert sh.relist(NODES) and sh.relist(PODS)
    assert b.reconcile() is None  # the follower never acts
    assert metric(b, "gpucluster_burst_onprem_free_gpus") == 0
    assert metric(b, "gpucluster_burst_virtual_node_open", node="vk-a", provider="gpucloud") == 0
    assert [r for r in fake.requests if r[0] == "PATCH"] == []
    lease = fake.objects["leases"]["gpu-burst/burst-controller"]
    assert lease["spec"]["holderIdentity"] == "a"
    # a renews within the lease; b keeps waiting
    clock_a.t += 5
    clock_b.t += 5
    assert a.elector.step()
    clock_b.t += 10
    assert not b.elector.step()  # the record changed 10 s ago on b's clock: still alive
    # a stops renewing (hung or partitioned): after the renew deadline it stops acting by itself ...
    clock_a.t += 10
    assert not a.elector.is_leader
    assert a.reconcile() is None
    # ... and b takes over once the record it last saw has been unchanged for the lease duration.
    clock_b.t += 14
    assert not b.elector.step()
    clock_b.t += 1
    assert b.elector.step()
    lease = fake.objects["leases"]["gpu-burst/burst-controller"]
    assert (lease["spec"]["holderIdentity"], lease["spec"]["leaseTransitions"]) == ("b", 1)
    decision = b.reconcile()
    assert decision is not None and decision.flipped is Mode.OPEN
    assert fake.node("vk-a")["spec"]["taints"] == [VK_TAINT]
    # a comes back: the lease is b's and fresh, so a stays a follower.
    clock_a.t += 1
    assert not a.elector.step()


def test_released_lease_is_taken_at_once(api: tuple[FakeApi, str]) -> None:
    fake, url = api
    clock = Clock()
    a = make_shell(url, clock, identity="a")
    b = make_shell(url, clock, identity="b")
    assert a.elector.step()
    assert not b.elector.step()
    a.elector.release()
    assert not a.elector.is_leader
    assert b.elector.step()
    assert fake.objects["leases"]["gpu-burst/burst-controller"]["spec"]["holderIdentity"] == "b"


def test_restart_keeps_cluster_state(api: tuple[FakeApi, str]) -> None:
    fake, url = api
    exhausted_cluster(fake)
    clock = Clock()
    a = make_shell(url, clock, identity="a")
    lead_and_sync(a)
    a.reconcile()
    patches = len([r for r in fake.requests if r[0] == "PATCH"])
    # A new process: state comes back from the taints and annotations, and nothing is patched.
    fresh = make_shell(url, clock, identity="a")
    lead_and_sync(fresh)
    decision = fresh.reconcile()
    assert decision is not None and decision.state.mode is Mode.OPEN
    assert decision.state.changed_at == clock.t
    assert len([r for r in fake.requests if r[0] == "PATCH"]) == patches


def test_run_loop_opens_nodes(api: tuple[FakeApi, str]) -> None:
    fake, url = api
    exhausted_cluster(fake)
    config = client.Configuration()
    config.host = url
    config.retries = False
    settings = BurstSettings.from_mapping(
        {"open_hold_seconds": 0, "tick_seconds": 0.05, "retry_period_seconds": 0.05, "watch_timeout_seconds": 1}
    )
    sh = BurstShell(settings, client.ApiClient(config), identity="runner")
    stop = threading.Event()
    thread = threading.Thread(target=sh.run, args=(stop,), daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and fake.node("vk-b")["spec"]["taints"] != [
        {"key": "virtual-kubelet.io/provider", "value": "othercloud", "effect": "NoSchedule"}
    ]:
        time.sleep(0.05)
    stop.set()
    thread.join(timeout=20)
    assert not thread.is_alive()
    assert fake.node("vk-a")["spec"]["taints"] == [VK_TAINT]
    assert fake.objects["leases"]["gpu-burst/burst-controller"]["spec"].get("holderIdentity") is None


def test_handover_scales_standby_then_lifts_only_our_gate(api: tuple[FakeApi, str]) -> None:
    fake, url = api
    settings = BurstSettings(**{**json.loads(S.to_json()), "handover_services": {"svc": 2}, "close_at_free_gpus": 4,
                                "open_below_free_gpus": 1})
    fake.put(NODES, onprem_node("n1", 8, pool="a"))
    fake.put(NODES, virtual_node("vk-a"))
    for i in range(2):
        fake.put(PODS, gpu_pod(f"svc-{i}", node="n1", service="svc", namespace="inference"))
    worker = gpu_pod("gang-0", 8, workload="training", namespace="training", pool="a", gated=True)
    worker["spec"]["schedulingGates"].append({"name": "example.com/quota"})
    fake.put(PODS, worker)
    scale = {"kind": "Scale", "metadata": {"name": "svc-standby", "namespace": "inference"}, "spec": {"replicas": 0}}
    fake.put("scales", scale)
    clock = Clock()
    sh = make_shell(url, clock, settings=settings)
    lead_and_sync(sh)

    first = sh.reconcile()
    assert first is not None and first.standby == {"svc": 2}
    assert fake.objects["scales"]["inference/svc-standby"]["spec"]["replicas"] == 2
    assert [g["name"] for g in fake.objects[PODS]["training/gang-0"]["spec"]["schedulingGates"]] == [
        "gpucluster.io/handover", "example.com/quota"]
    assert metric(sh, "gpucluster_burst_standby_replicas", service="svc") == 2
    assert metric(sh, "gpucluster_burst_gated_training_pods") == 1
    # The same wish again (pods not up yet) is not written twice.
    scale_patches = [r for r in fake.requests if r[0] == "PATCH" and r[1].endswith("/scale")]
    sh.reconcile()
    assert [r for r in fake.requests if r[0] == "PATCH" and r[1].endswith("/scale")] == scale_patches

    # The standby is ready on the virtual node: the gang is released, other gates stay.
    for i in range(2):
        sh.view.apply_pod("ADDED", gpu_pod(f"svc-standby-{i}", node="vk-a", service="svc", standby=True,
                                           namespace="inference"))
    decision = sh.reconcile()
    assert decision is not None and any(a.kind.value == "ungate" for a in decision.actions)
    assert fake.objects[PODS]["training/gang-0"]["spec"]["schedulingGates"] == [{"name": "example.com/quota"}]
    assert metric(sh, "gpucluster_burst_actions_total", kind="ungate") == 1
    assert metric(sh, "gpucluster_burst_gated_training_pods") == 0


def test_missing_standby_deployment_is_reported_not_fatal(api: tuple[FakeApi, str]) -> None:
    fake, url = api
    settings = BurstSettings(**{**json.loads(S.to_json()), "handover_services": {"svc": 1}})
    fake.put(NODES, onprem_node("n1", 8, pool="a"))
    fake.put(NODES, virtual_node("vk-a"))
    fake.put(PODS, gpu_pod("svc-0", node="n1", service="svc", namespace="inference"))
    fake.put(PODS, gpu_pod("gang-0", 8, workload="training", namespace="training", pool="a", gated=True))
    sh = make_shell(url, Clock(), settings=settings)
    lead_and_sync(sh)
    decision = sh.reconcile()
    assert decision is not None and decision.standby == {"svc": 1}
    assert metric(sh, "gpucluster_burst_actions_total", kind="set_standby") is None
    assert fake.objects[PODS]["training/gang-0"]["spec"]["schedulingGates"]  # still waiting (until the timeout)
