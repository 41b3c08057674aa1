"""The health guard's shell: against a fake port (taints, condition, events, evictions, restart safety,
metrics), against an HTTP-level fake API server through the real kubernetes client (content types,
Eviction API, PDB refusals, leases, leader handover), and its Prometheus parser on arbitrary input."""

from __future__ import annotations

import json
import math
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agents.health_guard.contract import CONDITION_TYPE, HealthSettings, parse_settings
from agents.health_guard.decide import NodeStatus
from agents.health_guard.shell import (
    EvictionBlocked,
    Guard,
    KubePort,
    LeaseElector,
    NotFound,
    QueryError,
    node_view,
    parse_vector,
)

P = "gpucluster.io"
T0 = 1_800_000_000.0
SETTINGS = HealthSettings(probation_seconds=30, max_nodes_per_hour=2, max_nodes_quarantined=2,
                          max_pool_percent_per_hour=100, max_pool_percent_quarantined=100)
NODES = ["gpu-01", "gpu-02", "gpu-03", "gpu-04"]


def vector(node_label: str, values: dict[str, float]) -> dict[str, Any]:
    return {"status": "success", "data": {"resultType": "vector", "result": [
        {"metric": {node_label: n, "gpu": "0"}, "value": [T0, str(v)]} for n, v in values.items()]}}


class FakePrometheus:
    """Answers the guard's queries from per-node values; `down` makes every query fail."""

    def __init__(self) -> None:
        self.temps = dict.fromkeys(NODES, 50.0)
        self.xid: dict[str, float] = {}
        self.seen = T0
        self.down = False

    def query_raw(self, promql: str) -> Any:
        if self.down:
            raise QueryError("connection refused")
        if "timestamp(DCGM_FI_DEV_GPU_TEMP)" in promql:
            return vector("Hostname", dict.fromkeys(self.temps, self.seen))
        if "timestamp(infiniband" in promql:
            return vector("node", {})
        if promql == SETTINGS.signal("gpu-temperature").query:
            return vector("Hostname", self.temps)
        if promql == SETTINGS.signal("xid-fatal").query:
            return vector("Hostname", self.xid)
        return vector("Hostname", {})


def k8s_node(name: str, pool: str = "a") -> dict[str, Any]:
    return {"metadata": {"name": name, "uid": f"uid-{name}", "resourceVersion": "1",
                         "labels": {f"{P}/pool": pool, f"{P}/location": "onprem"}, "annotations": {}},
            "spec": {"taints": [{"key": f"{P}/pool", "value": pool, "effect": "NoSchedule"}]},
            "status": {"conditions": [{"type": "Ready", "status": "True"}]}}


def k8s_pod(name: str, node: str, workload: str, job: str | None = None, ns: str = "training") -> dict[str, Any]:
    labels = {f"{P}/workload": workload}
    if job:
        labels["volcano.sh/job-name"] = job
    return {"metadata": {"name": name, "namespace": ns, "labels": labels},
            "spec": {"nodeName": node, "containers": [{"name": "main", "image": "registry.example/x:1"}]},
            "status": {"phase": "Running"}}


def merge(target: dict[str, Any], patch: dict[str, Any]) -> None:
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        elif isinstance(value, dict) and isinstance(target.get(key), dict):
            merge(target[key], value)
        else:
            target[key] = value


class FakePort:
    """In-memory cluster with the port's semantics (strategic merge of labels/annotations, conditions by type)."""

    def __init__(self) -> None:
        self.nodes = {n: k8s_node(n) for n in NODES}
        self.pods: list[dict[str, Any]] = []
        self.pdb_blocked: set[str] = set()
        self.events: list[dict[str, Any]] = []
        self.leases: dict[str, dict[str, Any]] = {}
        self.evicted: list[str] = []
        self.fail_status = False
        self.gang_jobs: list[dict[str, Any]] = []

    def list_nodes(self, label_selector: str) -> list[dict[str, Any]]:
        copy: list[dict[str, Any]] = json.loads(json.dumps(list(self.nodes.values())))
        return copy

    def patch_node(self, name: str, body: dict[str, Any]) -> None:
        node = self.nodes[name]
        meta = dict(body.get("metadata", {}))
        meta.pop("resourceVersion", None)
        merge(node["metadata"], meta)
        if "spec" in body:
            node["spec"]["taints"] = body["spec"]["taints"]
        node["metadata"]["resourceVersion"] = str(int(node["metadata"]["resourceVersion"]) + 1)

    def patch_node_status(self, name: str, body: dict[str, Any]) -> None:
        if self.fail_status:
            raise RuntimeError("status patch refused")
        conds = self.nodes[name]["status"]["conditions"]
        for c in body["status"]["conditions"]:
            conds[:] = [x for x in conds if x["type"] != c["type"]] + [c]

    def list_pods_on_node(self, node: str) -> list[dict[str, Any]]:
        return [p for p in self.pods if p["spec"]["nodeName"] == node]

    def evict_pod(self, namespace: str, name: str) -> None:
        if name in self.pdb_blocked:
            raise EvictionBlocked("Cannot evict pod as it would violate the pod's disruption budget.")
        before = len(self.pods)
        self.pods = [p for p in self.pods if p["metadata"]["name"] != name]
        if len(self.pods) == before:
            raise NotFound(name)
        self.evicted.append(name)

    def create_event(self, namespace: str, body: dict[str, Any]) -> None:
        self.events.append(body)

    def read_lease(self, namespace: str, name: str) -> dict[str, Any] | None:
        lease = self.leases.get(name)
        return json.loads(json.dumps(lease)) if lease else None

    def create_lease(self, namespace: str, body: dict[str, Any]) -> None:
        self.leases[body["metadata"]["name"]] = body

    def replace_lease(self, namespace: str, name: str, body: dict[str, Any]) -> None:
        self.leases[name] = body

    def list_gang_jobs(self, namespace: str) -> list[dict[str, Any]]:
        return [j for j in self.gang_jobs if j["metadata"]["namespace"] == namespace]

    # helpers for assertions
    def taints(self, name: str) -> list[tuple[str, str, str]]:
        return [(t["key"], t.get("value", ""), t["effect"]) for t in self.nodes[name]["spec"]["taints"]]

    def condition(self, name: str) -> dict[str, Any] | None:
        return next((c for c in self.nodes[name]["status"]["conditions"] if c["type"] == CONDITION_TYPE), None)


@pytest.fixture
def world() -> tuple[FakePrometheus, FakePort, Guard]:
    prom, port = FakePrometheus(), FakePort()
    port.pods = [k8s_pod(f"gang-{i}", n, "training", job="gang") for i, n in enumerate(NODES)]
    port.pods += [k8s_pod(f"infer-{i}", n, "inference", ns="inference") for i, n in enumerate(NODES)]
    return prom, port, Guard(SETTINGS, prom, port, identity="me")


def sample(guard: Guard, name: str, labels: dict[str, str] | None = None) -> float:
    value = guard.metrics.registry.get_sample_value(name, labels or {})
    return 0.0 if value is None else value


def test_fatal_and_degraded_quarantine_evict_condition_event(world) -> None:
    prom, port, guard = world
    prom.xid = {"gpu-01": 1}
    prom.temps["gpu-02"] = 80.0
    guard.cycle(T0, 0)
    prom.seen = T0 + 120
    guard.cycle(T0 + 120, 120)
    assert port.taints("gpu-01")[-1] == (f"{P}/gpu-health", "fatal", "NoSchedule")
    assert port.taints("gpu-02")[-1] == (f"{P}/gpu-health", "degraded", "NoSchedule")
    assert port.taints("gpu-01")[0] == (f"{P}/pool", "a", "NoSchedule")  # the pool taint is kept
    assert all(effect == "NoSchedule" for n in NODES for _, _, effect in port.taints(n))
    cond = port.condition("gpu-01")
    assert cond is not None and cond["status"] == "False" and cond["reason"] == "GpuFatal"
    assert "xid-fatal" in cond["message"] and f"{P}/gpu-repaired" in cond["message"]
    # Training leaves both; inference leaves only the fatal node.
    assert sorted(port.evicted) == ["gang-0", "gang-1", "infer-0"]
    assert {p["metadata"]["name"] for p in port.pods if p["spec"]["nodeName"] == "gpu-02"} == {"infer-1"}
    reasons = [(e["involvedObject"]["name"], e["reason"], e["type"]) for e in port.events]
    assert ("gpu-01", "GpuHealthQuarantine", "Warning") in reasons
    assert ("gpu-02", "GpuHealthQuarantine", "Warning") in reasons
    labels = port.nodes["gpu-01"]["metadata"]["labels"]
    assert labels[f"{P}/gpu-health"] == "fatal"
    assert sample(guard, "gpucluster_health_taints_applied_total", {"class": "fatal", "pool": "a"}) == 1
    assert sample(guard, "gpucluster_health_gang_restarts_total",
                  {"namespace": "training", "job": "gang", "pool": "a", "node": "gpu-01", "cause": "guard"}) == 1
    assert sample(guard, "gpucluster_health_nodes_quarantined", {"class": "degraded", "pool": "a"}) == 1
    assert sample(guard, "gpucluster_health_pool_quarantined_ratio", {"pool": "a"}) == 0.5
    assert sample(guard, "gpucluster_health_signal_events_total", {"signal": "xid-fatal", "class": "fatal"}) == 1


def test_only_pods_in_the_eviction_namespaces_are_evicted(world) -> None:
    """A pod labelled as training outside the namespaces the guard's Roles cover is left where it is."""
    prom, port, guard = world
    port.pods.append(k8s_pod("stray-0", "gpu-01", "training", job="stray", ns="research"))
    prom.xid = {"gpu-01": 1}
    guard.cycle(T0, 0)
    prom.seen = T0 + 120
    guard.cycle(T0 + 120, 120)
    assert sorted(port.evicted) == ["gang-0", "infer-0"]
    assert any(p["metadata"]["name"] == "stray-0" for p in port.pods)


def test_pdb_protected_inference_is_retried_until_the_budget_allows(world) -> None:
    prom, port, guard = world
    port.pdb_blocked = {"infer-0"}
    prom.xid = {"gpu-01": 1}
    guard.cycle(T0, 0)
    assert "infer-0" not in port.evicted and "gang-0" in port.evicted
    assert sample(guard, "gpucluster_health_evictions_total", {"workload": "inference", "result": "blocked"}) == 1
    port.pdb_blocked = set()  # a replacement became ready elsewhere
    guard.cycle(T0 + 1, 1)
    assert "infer-0" in port.evicted


def test_idempotent_and_restart_safe(world) -> None:
    prom, port, guard = world
    prom.xid = {"gpu-01": 1}
    guard.cycle(T0, 0)
    taints, events = port.taints("gpu-01"), len(port.events)
    guard.cycle(T0 + 1, 1)
    # A new guard process (no memory) over the same cluster: nothing is applied twice.
    fresh = Guard(SETTINGS, prom, port, identity="me")
    decision = fresh.cycle(T0 + 2, 2)
    assert decision is not None and decision.status["gpu-01"] is NodeStatus.QUARANTINED
    assert port.taints("gpu-01") == taints and len(port.events) == events
    # The rate-limit history survived the restart: it is on the node.
    assert port.nodes["gpu-01"]["metadata"]["annotations"][f"{P}/gpu-health-history"] == f"{T0:.0f}"


def test_a_taint_removed_by_hand_stays_removed_across_a_restart_while_the_fault_goes_on(world) -> None:
    prom, port, guard = world
    prom.xid = {"gpu-01": 1}
    guard.cycle(T0, 0)
    assert (f"{P}/gpu-health", "fatal", "NoSchedule") in port.taints("gpu-01")
    # An operator takes the node back by hand; XID 79 still shows.
    port.nodes["gpu-01"]["spec"]["taints"] = []
    guard.cycle(T0 + 1, 1)
    assert port.nodes["gpu-01"]["metadata"]["annotations"][f"{P}/gpu-health-overridden"] == "xid-fatal"
    # A new process (a restart, or the standby after a handover): the person's decision holds.
    fresh = Guard(SETTINGS, prom, port, identity="me")
    for t in range(2, 6):
        fresh.cycle(T0 + t, t)
    assert port.taints("gpu-01") == []
    # The fault clears once: the override goes; when it comes back it is a new fault.
    prom.xid = {}
    fresh.cycle(T0 + 10, 10)
    assert f"{P}/gpu-health-overridden" not in port.nodes["gpu-01"]["metadata"]["annotations"]
    prom.xid = {"gpu-01": 1}
    fresh.cycle(T0 + 11, 11)
    assert (f"{P}/gpu-health", "fatal", "NoSchedule") in port.taints("gpu-01")


def test_application_crashes_count_as_gang_restarts_and_the_guards_are_not_counted_twice(world) -> None:
    prom, port, guard = world
    gang = {"metadata": {"name": "gang", "namespace": "training"}, "status": {"retryCount": 0}}
    port.gang_jobs = [gang]
    guard.cycle(T0, 0)  # baseline
    gang["status"]["retryCount"] = 1  # a worker crashed: Volcano restarted the gang
    guard.cycle(T0 + 1, 1)
    app = {"namespace": "training", "job": "gang", "pool": "", "node": "", "cause": "application"}
    assert sample(guard, "gpucluster_health_gang_restarts_total", app) == 1
    # The guard restarts it (XID 79 on gpu-01); Volcano's retry of that is the guard's, counted once.
    prom.xid = {"gpu-01": 1}
    guard.cycle(T0 + 2, 2)
    by_guard = {"namespace": "training", "job": "gang", "pool": "a", "node": "gpu-01", "cause": "guard"}
    assert sample(guard, "gpucluster_health_gang_restarts_total", by_guard) == 1
    gang["status"]["retryCount"] = 2
    guard.cycle(T0 + 3, 3)
    assert sample(guard, "gpucluster_health_gang_restarts_total", app) == 1


def test_lost_condition_is_reasserted(world) -> None:
    prom, port, guard = world
    port.fail_status = True
    prom.xid = {"gpu-01": 1}
    guard.cycle(T0, 0)
    assert port.condition("gpu-01") is None and sample(guard, "gpucluster_health_errors_total",
                                                       {"stage": "status"}) == 1
    port.fail_status = False
    guard.cycle(T0 + 1, 1)
    cond = port.condition("gpu-01")
    assert cond is not None and cond["status"] == "False"


def test_suppression_trips_the_breaker_on_the_lease_until_a_person_resets_it(world) -> None:
    prom, port, guard = world
    prom.xid = {"gpu-01": 1, "gpu-02": 1, "gpu-03": 1}
    guard.cycle(T0, 0)
    assert [n for n in NODES if f"{P}/gpu-health" in port.nodes[n]["metadata"]["labels"]] == ["gpu-01", "gpu-02"]
    note = port.leases["health-guard"]["metadata"]["annotations"][f"{P}/gpu-health-breaker"]
    assert "gpu-03" in note and "max_nodes_quarantined is 2" in note
    assert sample(guard, "gpucluster_health_breaker_tripped") == 1
    assert sample(guard, "gpucluster_health_suppressed_total", {"pool": "a"}) == 1
    assert [e["reason"] for e in port.events if e["involvedObject"]["name"] == "gpu-03"] == ["GpuHealthSuppressed"]
    guard.cycle(T0 + 1, 1)
    assert sample(guard, "gpucluster_health_breaker_tripped") == 1
    assert len([e for e in port.events if e["reason"] == "GpuHealthSuppressed"]) == 1  # announced once
    # The operator resets it: `kubectl annotate lease health-guard gpucluster.io/gpu-health-breaker-`.
    del port.leases["health-guard"]["metadata"]["annotations"][f"{P}/gpu-health-breaker"]
    guard.cycle(T0 + 2, 2)
    assert sample(guard, "gpucluster_health_breaker_tripped") == 1  # gpu-03 still over the limit: trips again


def test_release_after_probation_and_repair_mark(world) -> None:
    prom, port, guard = world
    prom.xid = {"gpu-01": 1}
    prom.temps["gpu-02"] = 80.0
    guard.cycle(T0, 0)
    prom.seen = T0 + 120
    guard.cycle(T0 + 120, 120)
    prom.xid, prom.temps["gpu-02"] = {}, 60.0
    for t in (130, 165):
        prom.seen = T0 + t
        guard.cycle(T0 + t, t)
    assert port.taints("gpu-02") == [(f"{P}/pool", "a", "NoSchedule")]
    assert port.condition("gpu-02")["status"] == "True"
    assert f"{P}/gpu-health" not in port.nodes["gpu-02"]["metadata"]["labels"]
    assert port.taints("gpu-01")[-1][1] == "fatal"  # fatal waits for the repair mark
    port.nodes["gpu-01"]["metadata"]["labels"][f"{P}/gpu-repaired"] = "alice"
    prom.seen = T0 + 170
    guard.cycle(T0 + 170, 170)
    assert port.taints("gpu-01") == [(f"{P}/pool", "a", "NoSchedule")]
    assert f"{P}/gpu-repaired" not in port.nodes["gpu-01"]["metadata"]["labels"]  # consumed
    assert sample(guard, "gpucluster_health_releases_total", {"class": "fatal"}) == 1


def test_prometheus_down_decides_nothing(world) -> None:
    prom, port, guard = world
    prom.down = True
    decision = guard.cycle(T0, 0)
    assert decision is not None and set(decision.status.values()) == {NodeStatus.UNKNOWN}
    assert port.evicted == [] and sample(guard, "gpucluster_health_errors_total", {"stage": "query"}) > 0


def test_leader_handover_on_a_stale_lease() -> None:
    port = FakePort()
    a = LeaseElector(port, "sys", "health-guard", "a", 10)
    b = LeaseElector(port, "sys", "health-guard", "b", 10)
    assert a.step(T0, 0) is True
    assert b.step(T0, 0) is False  # a holds it
    assert a.step(T0 + 5, 5) is True
    assert b.step(T0 + 5, 5) is False  # renewed: b's clock restarts
    assert b.step(T0 + 14, 14.9) is False  # unchanged for 9.9 s on b's clock: not yet
    assert b.step(T0 + 15, 15.1) is True  # a stopped renewing more than 10 s ago
    assert port.leases["health-guard"]["spec"]["holderIdentity"] == "b"
    assert port.leases["health-guard"]["spec"]["leaseTransitions"] == 1
    assert a.step(T0 + 16, 16) is False  # a sees b's record and stands down


def test_follower_does_not_act(world) -> None:
    prom, port, guard = world
    LeaseElector(port, SETTINGS.namespace, SETTINGS.lease_name, "other", 30).step(T0, 0)
    prom.xid = {"gpu-01": 1}
    assert guard.cycle(T0, 0) is None
    assert port.evicted == [] and sample(guard, "gpucluster_health_leader") == 0


def test_node_view_reads_foreign_taint_value_as_fatal() -> None:
    node = k8s_node("gpu-01")
    node["spec"]["taints"].append({"key": f"{P}/gpu-health", "value": "weird", "effect": "NoSchedule"})
    assert node_view(SETTINGS, node).quarantined == "fatal"


# --------------------------------------------------------------------------- parsers on arbitrary input

json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
                           lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner,
                                                                                       max_size=3), max_leaves=12)


@given(json_values)
def test_parse_vector_never_crashes_on_arbitrary_json(payload) -> None:
    try:
        out = parse_vector(payload, "Hostname")
    except QueryError:
        return
    assert all(isinstance(k, str) and isinstance(v, float) for k, v in out.items())


@given(st.dictionaries(st.text(min_size=1, max_size=8), st.floats(allow_nan=True), max_size=5))
def test_parse_vector_keeps_every_labelled_reading_nan_included(values) -> None:
    """NaN is kept (the decision reads it as unknown); dropping it read as "no sample", which means clear."""
    out = parse_vector(vector("Hostname", values), "Hostname")
    assert out.keys() == values.keys()
    assert all(math.isnan(out[k]) if math.isnan(v) else out[k] == v for k, v in values.items())


@given(st.lists(st.tuples(st.sampled_from(["gpu-a", "gpu-b"]), st.floats(allow_nan=True, allow_infinity=False)),
                max_size=8))
def test_parse_vector_worst_known_value_wins_and_nan_only_when_nothing_else(samples) -> None:
    payload = {"status": "success", "data": {"resultType": "vector", "result": [
        {"metric": {"Hostname": node}, "value": [0, repr(value)]} for node, value in samples]}}
    out = parse_vector(payload, "Hostname")
    for node in {n for n, _ in samples}:
        known = [v for n, v in samples if n == node and not math.isnan(v)]
        assert (out[node] == max(known)) if known else math.isnan(out[node])


@given(st.dictionaries(st.sampled_from(["poll_seconds", "probation_seconds", "max_nodes_per_hour", "bogus"]),
                       json_values, max_size=3))
def test_settings_parser_accepts_or_names_the_key(raw) -> None:
    try:
        parse_settings(raw, source="cm.json")
    except ValueError as exc:
        assert str(exc).startswith("cm.json: ")
        assert any(key in str(exc) for key in raw)


def test_settings_errors_name_every_key() -> None:
    with pytest.raises(ValueError) as err:
        parse_settings({"poll_seconds": 0, "signals": [{"name": "x", "health_class": "sad", "exporter": "dcgm",
                                                        "query": "up", "threshold": 1}]}, source="cm.json")
    assert "cm.json: poll_seconds" in str(err.value) and "cm.json: signals.0.health_class" in str(err.value)


# --------------------------------------------------------------------------- HTTP-level fake API server


class FakeApiServer:
    """Just enough of the Kubernetes API for the real client: nodes, node status, pods, eviction, events, leases."""

    def __init__(self, port: FakePort) -> None:
        self.state = port
        self.requests: list[tuple[str, str, str]] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def _body(self) -> Any:
                length = int(self.headers.get("Content-Length") or 0)
                return json.loads(self.rfile.read(length) or b"{}")

            def _send(self, code: int, obj: Any) -> None:
                data = json.dumps(obj).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _route(self, method: str) -> None:
                url = urlparse(self.path)
                parts = url.path.strip("/").split("/")
                server.requests.append((method, url.path, self.headers.get("Content-Type", "")))
                s = server.state
                status = {"kind": "Status", "apiVersion": "v1"}
                if parts[:3] == ["api", "v1", "nodes"]:
                    if method == "GET":
                        return self._send(200, {"kind": "NodeList", "apiVersion": "v1", "items": s.list_nodes("")})
                    if parts[-1] == "status":
                        s.patch_node_status(parts[3], self._body())
                    else:
                        s.patch_node(parts[3], self._body())
                    return self._send(200, s.nodes[parts[3]])
                if parts[:3] == ["api", "v1", "pods"]:
                    node = parse_qs(url.query)["fieldSelector"][0].split("=", 1)[1]
                    return self._send(200, {"kind": "PodList", "apiVersion": "v1",
                                            "items": s.list_pods_on_node(node)})
                if parts[-1] == "eviction":
                    self._body()
                    try:
                        s.evict_pod(parts[3], parts[5])
                    except EvictionBlocked:
                        return self._send(429, {**status, "code": 429, "reason": "TooManyRequests"})
                    except NotFound:
                        return self._send(404, {**status, "code": 404, "reason": "NotFound"})
                    return self._send(201, {**status, "status": "Success"})
                if parts[-1] == "events":
                    body = self._body()
                    s.create_event(parts[3], body)
                    return self._send(201, body)
                if "leases" in parts:
                    ns, name = parts[4], parts[6] if len(parts) > 6 else None
                    if method == "GET":
                        lease = s.read_lease(ns, name or "")
                        return self._send(200, lease) if lease else self._send(404, {**status, "code": 404})
                    body = self._body()
                    if method == "POST":
                        s.create_lease(ns, body)
                    else:
                        s.replace_lease(ns, name or "", body)
                    return self._send(200, body)
                return self._send(404, {**status, "code": 404})

            def do_GET(self) -> None:
                self._route("GET")

            def do_PATCH(self) -> None:
                self._route("PATCH")

            def do_POST(self) -> None:
                self._route("POST")

            def do_PUT(self) -> None:
                self._route("PUT")

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def port_client(self) -> KubePort:
        from kubernetes import client

        conf = client.Configuration()
        conf.host = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        return KubePort(api_client=client.ApiClient(conf))


@pytest.fixture
def api() -> Iterator[FakeApiServer]:
    state = FakePort()
    state.pods = [k8s_pod("gang-0", "gpu-01", "training", job="gang"),
                  k8s_pod("infer-0", "gpu-01", "inference", ns="inference")]
    server = FakeApiServer(state)
    yield server
    server.httpd.shutdown()


def test_real_client_over_http_quarantines_and_evicts(api) -> None:
    prom = FakePrometheus()
    prom.xid = {"gpu-01": 1}
    api.state.pdb_blocked = {"infer-0"}
    guard = Guard(SETTINGS, prom, api.port_client(), identity="me")
    decision = guard.cycle(T0, 0)
    assert decision is not None and decision.status["gpu-01"] is NodeStatus.QUARANTINED
    assert api.state.taints("gpu-01")[-1] == (f"{P}/gpu-health", "fatal", "NoSchedule")
    assert api.state.condition("gpu-01")["reason"] == "GpuFatal"
    assert api.state.evicted == ["gang-0"]  # the PDB refused infer-0 with 429: retried later
    assert sample(guard, "gpucluster_health_evictions_total", {"workload": "inference", "result": "blocked"}) == 1
    patches = {(path, ctype) for method, path, ctype in api.requests if method == "PATCH"}
    assert patches == {("/api/v1/nodes/gpu-01", "application/strategic-merge-patch+json"),
                       ("/api/v1/nodes/gpu-01/status", "application/strategic-merge-patch+json")}
    posts = [path for method, path, _ in api.requests if method == "POST"]
    assert "/api/v1/namespaces/training/pods/gang-0/eviction" in posts
    assert "/api/v1/namespaces/default/events" in posts
    assert "/apis/coordination.k8s.io/v1/namespaces/gpu-system/leases" in posts
    assert api.state.leases["health-guard"]["spec"]["holderIdentity"] == "me"


def test_real_client_leader_handover_over_http(api) -> None:
    port_a, port_b = api.port_client(), api.port_client()
    a = LeaseElector(port_a, "gpu-system", "health-guard", "a", 5)
    b = LeaseElector(port_b, "gpu-system", "health-guard", "b", 5)
    assert a.step(T0, 0) and not b.step(T0, 0)
    assert not b.step(T0 + 5, 5)
    assert b.step(T0 + 6, 6)  # a stopped renewing
    assert api.state.leases["health-guard"]["spec"]["holderIdentity"] == "b"
    assert [m for m, p, _ in api.requests if p.endswith("/leases/health-guard") and m == "PUT"]
