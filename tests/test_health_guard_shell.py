"""The health guard's shell: against a fake port (taints, condition, events, evictions, restart safety,
metrics), against an HTTP-level fake API server through the real kubernetes client (content types,
Eviction API, PDB refusals, leases, leader handover), and its Prometheus parser on arbitrary input."""

from __future__ import annotations

import json
import math
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agents.health_guard.contract import CONDITION_TYPE, HealthSettings, parse_settings
from agents.health_guard.decide import Decision, NodeStatus
from agents.health_guard.nodes import node_view
from agents.health_guard.prometheus import QueryError, parse_vector
from agents.health_guard.shell import Guard
from agents.kit.errors import ApiError
from agents.kit.lease import LeaseElector
from agents.kit.port import LEASES, PODS, VOLCANO_JOBS
from agents.kit.port import NODES as NODES_RES
from fakes.kube_api import MemoryApi
from tests.fake_kube_api import FakeApi, http_port, serve

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
    return {"metadata": {"name": name, "uid": f"uid-{name}",
                         "labels": {f"{P}/pool": pool, f"{P}/location": "onprem"}, "annotations": {}},
            "spec": {"taints": [{"key": f"{P}/pool", "value": pool, "effect": "NoSchedule"}]},
            "status": {"conditions": [{"type": "Ready", "status": "True"}]}}


def k8s_pod(name: str, node: str, workload: str, job: str | None = None, ns: str = "training") -> dict[str, Any]:
    labels = {f"{P}/workload": workload}
    if job:
        labels["volcano.sh/job-name"] = job
    return {"metadata": {"name": name, "namespace": ns, "labels": labels, "uid": f"uid-{ns}-{name}"},
            "spec": {"nodeName": node, "containers": [{"name": "main", "image": "registry.example/x:1"}]},
            "status": {"phase": "Running"}}


class Views(MemoryApi):
    """The views these tests assert on, over the kit's in-memory store."""

    @property
    def nodes(self) -> dict[str, dict[str, Any]]:
        return self.objects["nodes"]

    @property
    def pods(self) -> list[dict[str, Any]]:
        return list(self.objects.get("pods", {}).values())

    @property
    def evicted_names(self) -> list[str]:
        return [key.split("/", 1)[1] for key in self.evicted]

    def lease(self, name: str = "health-guard") -> dict[str, Any]:
        return self.objects["leases"][f"gpu-system/{name}"]

    def taints(self, name: str) -> list[tuple[str, str, str]]:
        return [(t["key"], t.get("value", ""), t["effect"]) for t in self.nodes[name]["spec"]["taints"]]

    def condition(self, name: str) -> dict[str, Any] | None:
        return next((c for c in self.nodes[name]["status"]["conditions"] if c["type"] == CONDITION_TYPE), None)

    def edit_node(self, name: str, edit: Callable[[dict[str, Any]], None]) -> None:
        """A change by someone else (a person, kubectl): a new resourceVersion, as on the API server."""
        node = json.loads(json.dumps(self.nodes[name]))
        edit(node)
        self.put(NODES_RES, node)


class Cluster(Views):
    """The kit's in-memory API with four GPU nodes."""

    def __init__(self) -> None:
        super().__init__()
        for n in NODES:
            self.put(NODES_RES, k8s_node(n))


class HttpCluster(Views, FakeApi):
    """The same, served over HTTP (``tests.fake_kube_api``)."""


def turn(guard: Guard, now: float, mono: float) -> Decision | None:
    """One cycle at wall time ``now`` and monotonic time ``mono``."""
    guard.clock = lambda: now
    guard.monotonic = lambda: mono
    return guard.cycle()


def elector(port: Any, identity: str, duration: int, clock: list[float], name: str = "health-guard",
            namespace: str = "gpu-system") -> LeaseElector:
    """A second replica's elector on its own monotonic clock (``clock[0]``)."""
    return LeaseElector(port, namespace, name, identity, lease_duration_seconds=duration,
                        renew_deadline_seconds=duration * 2 / 3, request_timeout_seconds=duration / 5,
                        monotonic=lambda: clock[0], wall=lambda: T0 + clock[0])


@pytest.fixture
def world() -> tuple[FakePrometheus, Cluster, Guard]:
    prom, port = FakePrometheus(), Cluster()
    for i, n in enumerate(NODES):
        port.put(PODS, k8s_pod(f"gang-{i}", n, "training", job="gang"))
        port.put(PODS, k8s_pod(f"infer-{i}", n, "inference", ns="inference"))
    return prom, port, Guard(SETTINGS, prom, port, identity="me")


def sample(guard: Guard, name: str, labels: dict[str, str] | None = None) -> float:
    value = guard.metrics.registry.get_sample_value(name, labels or {})
    return 0.0 if value is None else value


def test_fatal_and_degraded_quarantine_evict_condition_event(world) -> None:
    prom, port, guard = world
    prom.xid = {"gpu-01": 1}
    prom.temps["gpu-02"] = 80.0
    turn(guard, T0, 0)
    prom.seen = T0 + 120
    turn(guard, T0 + 120, 120)
    assert port.taints("gpu-01")[-1] == (f"{P}/gpu-health", "fatal", "NoSchedule")
    assert port.taints("gpu-02")[-1] == (f"{P}/gpu-health", "degraded", "NoSchedule")
    assert port.taints("gpu-01")[0] == (f"{P}/pool", "a", "NoSchedule")  # the pool taint is kept
    assert all(effect == "NoSchedule" for n in NODES for _, _, effect in port.taints(n))
    cond = port.condition("gpu-01")
    assert cond is not None and cond["status"] == "False" and cond["reason"] == "GpuFatal"
    assert "xid-fatal" in cond["message"] and f"{P}/gpu-repaired" in cond["message"]
    # Training leaves both; inference leaves only the fatal node.
    assert sorted(port.evicted_names) == ["gang-0", "gang-1", "infer-0"]
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
    port.put(PODS, k8s_pod("stray-0", "gpu-01", "training", job="stray", ns="research"))
    prom.xid = {"gpu-01": 1}
    turn(guard, T0, 0)
    prom.seen = T0 + 120
    turn(guard, T0 + 120, 120)
    assert sorted(port.evicted_names) == ["gang-0", "infer-0"]
    assert any(p["metadata"]["name"] == "stray-0" for p in port.pods)


def test_pdb_protected_inference_is_retried_until_the_budget_allows(world) -> None:
    prom, port, guard = world
    port.pdb_blocked = {"infer-0"}
    prom.xid = {"gpu-01": 1}
    turn(guard, T0, 0)
    assert "infer-0" not in port.evicted_names and "gang-0" in port.evicted_names
    assert sample(guard, "gpucluster_health_evictions_total", {"workload": "inference", "result": "blocked"}) == 1
    port.pdb_blocked = set()  # a replacement became ready elsewhere
    turn(guard, T0 + 1, 1)
    assert "infer-0" in port.evicted_names


def test_idempotent_and_restart_safe(world) -> None:
    prom, port, guard = world
    prom.xid = {"gpu-01": 1}
    turn(guard, T0, 0)
    taints, events = port.taints("gpu-01"), len(port.events)
    turn(guard, T0 + 1, 1)
    # A new guard process (no memory) over the same cluster: nothing is applied twice.
    fresh = Guard(SETTINGS, prom, port, identity="me")
    decision = turn(fresh, T0 + 2, 2)
    assert decision is not None and decision.status["gpu-01"] is NodeStatus.QUARANTINED
    assert port.taints("gpu-01") == taints and len(port.events) == events
    # The rate-limit history survived the restart: it is on the node.
    assert port.nodes["gpu-01"]["metadata"]["annotations"][f"{P}/gpu-health-history"] == f"{T0:.0f}"


def test_a_taint_removed_by_hand_stays_removed_across_a_restart_while_the_fault_goes_on(world) -> None:
    prom, port, guard = world
    prom.xid = {"gpu-01": 1}
    turn(guard, T0, 0)
    assert (f"{P}/gpu-health", "fatal", "NoSchedule") in port.taints("gpu-01")
    # An operator takes the node back by hand; XID 79 still shows.
    port.edit_node("gpu-01", lambda n: n["spec"].update(taints=[]))
    turn(guard, T0 + 1, 1)
    assert port.nodes["gpu-01"]["metadata"]["annotations"][f"{P}/gpu-health-overridden"] == "xid-fatal"
    # A new process (a restart, or the standby after a handover): the person's decision holds.
    fresh = Guard(SETTINGS, prom, port, identity="me")
    for t in range(2, 6):
        turn(fresh, T0 + t, t)
    assert port.taints("gpu-01") == []
    # The fault clears once: the override goes; when it comes back it is a new fault.
    prom.xid = {}
    turn(fresh, T0 + 10, 10)
    assert f"{P}/gpu-health-overridden" not in port.nodes["gpu-01"]["metadata"]["annotations"]
    prom.xid = {"gpu-01": 1}
    turn(fresh, T0 + 11, 11)
    assert (f"{P}/gpu-health", "fatal", "NoSchedule") in port.taints("gpu-01")


def test_application_crashes_count_as_gang_restarts_and_the_guards_are_not_counted_twice(world) -> None:
    prom, port, guard = world
    gang = {"metadata": {"name": "gang", "namespace": "training"}, "status": {"retryCount": 0}}
    port.put(VOLCANO_JOBS, gang)
    turn(guard, T0, 0)  # baseline
    gang["status"]["retryCount"] = 1  # a worker crashed: Volcano restarted the gang
    port.put(VOLCANO_JOBS, gang)
    turn(guard, T0 + 1, 1)
    app = {"namespace": "training", "job": "gang", "pool": "", "node": "", "cause": "application"}
    assert sample(guard, "gpucluster_health_gang_restarts_total", app) == 1
    # The guard restarts it (XID 79 on gpu-01); Volcano's retry of that is the guard's, counted once.
    prom.xid = {"gpu-01": 1}
    turn(guard, T0 + 2, 2)
    by_guard = {"namespace": "training", "job": "gang", "pool": "a", "node": "gpu-01", "cause": "guard"}
    assert sample(guard, "gpucluster_health_gang_restarts_total", by_guard) == 1
    gang["status"]["retryCount"] = 2
    port.put(VOLCANO_JOBS, gang)
    turn(guard, T0 + 3, 3)
    assert sample(guard, "gpucluster_health_gang_restarts_total", app) == 1


def test_lost_condition_is_reasserted(world) -> None:
    prom, port, guard = world
    port.fail_always("patch:nodes/status", ApiError("forbidden", "status patch refused", 403))
    prom.xid = {"gpu-01": 1}
    turn(guard, T0, 0)
    assert port.condition("gpu-01") is None and sample(guard, "gpucluster_health_errors_total",
                                                       {"stage": "status"}) == 1
    port.fail_always("patch:nodes/status", None)
    turn(guard, T0 + 1, 1)
    cond = port.condition("gpu-01")
    assert cond is not None and cond["status"] == "False"


def test_suppression_trips_the_breaker_on_the_lease_until_a_person_resets_it(world) -> None:
    prom, port, guard = world
    prom.xid = {"gpu-01": 1, "gpu-02": 1, "gpu-03": 1}
    turn(guard, T0, 0)
    assert [n for n in NODES if f"{P}/gpu-health" in port.nodes[n]["metadata"]["labels"]] == ["gpu-01", "gpu-02"]
    note = port.lease()["metadata"]["annotations"][f"{P}/gpu-health-breaker"]
    assert "gpu-03" in note and "max_nodes_quarantined is 2" in note
    assert sample(guard, "gpucluster_health_breaker_tripped") == 1
    assert sample(guard, "gpucluster_health_suppressed_total", {"pool": "a"}) == 1
    assert [e["reason"] for e in port.events if e["involvedObject"]["name"] == "gpu-03"] == ["GpuHealthSuppressed"]
    turn(guard, T0 + 1, 1)
    assert sample(guard, "gpucluster_health_breaker_tripped") == 1
    assert len([e for e in port.events if e["reason"] == "GpuHealthSuppressed"]) == 1  # announced once
    # The operator resets it: `kubectl annotate lease health-guard gpucluster.io/gpu-health-breaker-`.
    del port.lease()["metadata"]["annotations"][f"{P}/gpu-health-breaker"]  # kubectl writes a new version
    port.put(LEASES, port.lease())
    turn(guard, T0 + 2, 2)
    assert sample(guard, "gpucluster_health_breaker_tripped") == 1  # gpu-03 still over the limit: trips again


def test_release_after_probation_and_repair_mark(world) -> None:
    prom, port, guard = world
    prom.xid = {"gpu-01": 1}
    prom.temps["gpu-02"] = 80.0
    turn(guard, T0, 0)
    prom.seen = T0 + 120
    turn(guard, T0 + 120, 120)
    prom.xid, prom.temps["gpu-02"] = {}, 60.0
    for t in (130, 165):
        prom.seen = T0 + t
        turn(guard, T0 + t, t)
    assert port.taints("gpu-02") == [(f"{P}/pool", "a", "NoSchedule")]
    assert port.condition("gpu-02")["status"] == "True"
    assert f"{P}/gpu-health" not in port.nodes["gpu-02"]["metadata"]["labels"]
    assert port.taints("gpu-01")[-1][1] == "fatal"  # fatal waits for the repair mark
    port.edit_node("gpu-01", lambda n: n["metadata"]["labels"].update({f"{P}/gpu-repaired": "alice"}))
    prom.seen = T0 + 170
    turn(guard, T0 + 170, 170)
    assert port.taints("gpu-01") == [(f"{P}/pool", "a", "NoSchedule")]
    assert f"{P}/gpu-repaired" not in port.nodes["gpu-01"]["metadata"]["labels"]  # consumed
    assert sample(guard, "gpucluster_health_releases_total", {"class": "fatal"}) == 1


def test_prometheus_down_decides_nothing(world) -> None:
    prom, port, guard = world
    prom.down = True
    decision = turn(guard, T0, 0)
    assert decision is not None and set(decision.status.values()) == {NodeStatus.UNKNOWN}
    assert port.evicted_names == [] and sample(guard, "gpucluster_health_errors_total", {"stage": "query"}) > 0


def _storm_guard() -> tuple[Cluster, FakePrometheus, Guard]:
    port, prom = Cluster(), FakePrometheus()
    for i, n in enumerate(NODES):
        port.put(PODS, k8s_pod(f"gang-{i}", n, "training", job="gang"))
    prom.xid = dict.fromkeys(NODES, 1)
    guard = Guard(SETTINGS.model_copy(update={"max_nodes_per_hour": 10, "max_nodes_quarantined": 10}), prom, port,
                  identity="me")
    return port, prom, guard


def test_in_a_storm_every_nodes_taint_goes_before_any_nodes_condition_event_or_drain() -> None:
    """The taint keeps new pods off a bad node; a storm's last nodes must not wait for the first nodes' drains."""
    port, _, guard = _storm_guard()
    port.fail("patch:nodes", ApiError("conflict", "gpu-?", 409))  # one node's taint refused in the first round
    turn(guard, T0, 0)
    writes = [(call, target) for call, target, _ in port.calls if call.split(":")[0] in ("patch", "create")
              and not call.endswith("leases")]
    taints = [i for i, (call, _) in enumerate(writes) if call == "patch:nodes"]
    others = [i for i, (call, _) in enumerate(writes) if call != "patch:nodes"]
    assert len(taints) == len(NODES) and others and max(taints) < min(others)
    tainted = [n for n in NODES if (f"{P}/gpu-health", "fatal", "NoSchedule") in port.taints(n)]
    assert len(tainted) == len(NODES) - 1  # the refused one is the next cycle's, not announced in this one
    announced = {target.split("/")[-1] for call, target in writes if call == "patch:nodes/status"}
    assert announced == set(tainted)
    assert sorted(port.evicted_names) == sorted(f"gang-{NODES.index(n)}" for n in tainted)
    turn(guard, T0 + 5, 5)
    assert all((f"{P}/gpu-health", "fatal", "NoSchedule") in port.taints(n) for n in NODES)


def test_a_lease_lost_between_the_taints_and_their_follow_ups_keeps_each_quarantines_count() -> None:
    """The next cycle sees the nodes quarantined already and never counts them: what is counted for a quarantine
    goes with its taint. What needs the Lease (conditions, Events, drains) waits for it, said once."""
    port, prom, guard = _storm_guard()
    faults, prom.xid = prom.xid, {}
    turn(guard, T0 - 60, 0)  # the guard leads; no fault yet
    prom.xid = faults
    port.calls.clear()
    real, asked = guard.elector.can_write, [0]

    def can_write() -> bool:  # the Lease goes stale right after the taint round (one write per node)
        asked[0] += 1
        return asked[0] <= len(NODES) and real()

    guard.elector.can_write = can_write  # type: ignore[method-assign]
    turn(guard, T0, 1)
    assert all((f"{P}/gpu-health", "fatal", "NoSchedule") in port.taints(n) for n in NODES)
    assert sum(sample(guard, "gpucluster_health_taints_applied_total", {"class": "fatal", "pool": pool})
               for pool in {"a", "b"}) == len(NODES)
    writes = {call for call, _, _ in port.calls if call.split(":")[0] in ("patch", "create")}
    assert writes <= {"patch:nodes", "patch:leases", "update:leases"}, writes  # no condition, Event or eviction
    assert port.evicted_names == []
    assert sample(guard, "gpucluster_health_errors_total", {"stage": "fenced"}) == 1  # once, not once per node
    guard.elector.can_write = real  # type: ignore[method-assign]
    turn(guard, T0 + 5, 5)
    assert sum(sample(guard, "gpucluster_health_taints_applied_total", {"class": "fatal", "pool": pool})
               for pool in {"a", "b"}) == len(NODES)  # not counted again
    assert sorted(port.evicted_names) == [f"gang-{i}" for i in range(len(NODES))]  # the drains, once it may


def test_a_taint_later_in_a_nodes_actions_still_goes_in_the_first_round_on_the_fresh_resource_version() -> None:
    """A node whose actions start with something else (its override record) still gets its taint before any
    node's condition, Event or drain, and its later writes carry the resourceVersion its earlier ones left."""
    from agents.health_guard.contract import HealthClass
    from agents.health_guard.decide import Drain, Quarantine, RecordOverride

    port, prom, guard = _storm_guard()
    prom.xid = {}
    turn(guard, T0 - 60, 0)  # the guard leads; nothing to do
    port.calls.clear()
    nodes = {n["metadata"]["name"]: n for n in port.list(NODES_RES)["items"]}
    views = {name: node_view(guard.settings, n) for name, n in nodes.items()}
    fatal = HealthClass.FATAL
    actions = [RecordOverride("gpu-01", frozenset({"thermal"})), Quarantine("gpu-01", fatal, ("xid-fatal",), (T0,)),
               Drain("gpu-01", fatal), Quarantine("gpu-02", fatal, ("xid-fatal",), (T0,)), Drain("gpu-02", fatal)]
    guard._act(actions, nodes, views, T0, lambda: False)
    writes = [(call, target.split("/")[-1]) for call, target, _ in port.calls
              if call.split(":")[0] in ("patch", "create") and not call.endswith("leases")]
    first_other = min(i for i, (call, _) in enumerate(writes) if call != "patch:nodes")
    assert [node for call, node in writes[:first_other]].count("gpu-02") == 1  # gpu-02's taint: first round
    assert "gpu-01" in [node for _, node in writes[:first_other]]  # and gpu-01's, ahead of its override record
    assert all((f"{P}/gpu-health", "fatal", "NoSchedule") in port.taints(n) for n in ("gpu-01", "gpu-02"))
    assert port.nodes["gpu-01"]["metadata"]["annotations"][f"{P}/gpu-health-overridden"] == "thermal"
    assert sorted(port.evicted_names) == ["gang-0", "gang-1"]  # no write refused for a stale resourceVersion
    assert sample(guard, "gpucluster_health_errors_total", {"stage": "patch"}) == 0


def test_a_node_unfenced_from_one_leaf_and_fenced_by_another_ends_the_cycle_fenced() -> None:
    """A taint is hoisted into the first round only up to the node's first action that takes a taint off: a node
    re-cabled to another fenced leaf is unfenced from the old one, then fenced by the new, in that order."""
    from agents.health_guard.contract import HealthClass
    from agents.health_guard.decide import Quarantine
    from agents.health_guard.switches import SwitchFence, SwitchUnfence

    port, prom, guard = _storm_guard()
    prom.xid = {}
    turn(guard, T0 - 60, 0)
    fence = f"{P}/switch-fault"
    port.edit_node("gpu-01", lambda n: n["spec"].setdefault("taints", []).append(
        {"key": fence, "value": "leaf-a", "effect": "NoSchedule"}))
    nodes = {n["metadata"]["name"]: n for n in port.list(NODES_RES)["items"]}
    views = {name: node_view(guard.settings, n) for name, n in nodes.items()}
    fatal = HealthClass.FATAL
    actions = [SwitchUnfence("gpu-01", "leaf-a", "re-cabled"),
               SwitchFence("gpu-01", "leaf-b", fatal, ("ib-port-down",), declared=True),
               Quarantine("gpu-02", fatal, ("xid-fatal",), (T0,))]
    guard._act(actions, nodes, views, T0, lambda: False)
    assert [t for t in port.taints("gpu-01") if t[0] == fence] == [(fence, "leaf-b", "NoSchedule")]
    assert (f"{P}/gpu-health", "fatal", "NoSchedule") in port.taints("gpu-02")


def test_every_query_of_a_cycle_is_timed_by_name_answered_or_not(world) -> None:
    prom, _, guard = world
    turn(guard, T0, 0)
    names = [*(f"freshness:{e}" for e in SETTINGS.exporters), *(s.name for s in SETTINGS.signals)]
    count = "gpucluster_health_query_seconds_count"
    assert [sample(guard, count, {"query": n}) for n in names] == [1.0] * len(names)
    prom.down = True
    turn(guard, T0 + 10, 10)
    assert [sample(guard, count, {"query": n}) for n in names] == [2.0] * len(names)
    assert sample(guard, count, {"query": "xid-fatal"}) == 2.0 and sample(guard, count, {"query": "other"}) == 0.0


def test_leader_handover_on_a_stale_lease() -> None:
    port, clock = Cluster(), [0.0]
    a, b = elector(port, "a", 10, clock), elector(port, "b", 10, clock)
    assert a.step() is True
    assert b.step() is False  # a holds it
    clock[0] = 5
    assert a.step() is True
    assert b.step() is False  # renewed: b's clock restarts
    clock[0] = 14.9
    assert b.step() is False  # unchanged for 9.9 s on b's clock: not yet
    assert not a.can_write()  # a, not renewed for 9.9 s, may no longer start a write
    clock[0] = 15.1
    assert b.step() is True  # a stopped renewing more than 10 s ago
    assert port.lease()["spec"]["holderIdentity"] == "b"
    assert port.lease()["spec"]["leaseTransitions"] == 1
    clock[0] = 16
    assert a.step() is False and not a.is_leader  # a sees b's record and stands down


def test_follower_does_not_act(world) -> None:
    prom, port, guard = world
    elector(port, "other", 30, [0.0]).step()
    prom.xid = {"gpu-01": 1}
    assert turn(guard, T0, 0) is None
    assert port.evicted_names == [] and sample(guard, "gpucluster_health_leader") == 0


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


@pytest.fixture
def api() -> Iterator[tuple[HttpCluster, str]]:
    fake = HttpCluster()
    for n in NODES:
        fake.put(NODES_RES, k8s_node(n))
    fake.put(PODS, k8s_pod("gang-0", "gpu-01", "training", job="gang"))
    fake.put(PODS, k8s_pod("infer-0", "gpu-01", "inference", ns="inference"))
    with serve(fake) as url:
        yield fake, url


def test_real_client_over_http_quarantines_and_evicts(api) -> None:
    fake, url = api
    prom = FakePrometheus()
    prom.xid = {"gpu-01": 1}
    fake.pdb_blocked = {"inference/infer-0"}
    guard = Guard(SETTINGS, prom, http_port(url), identity="me")
    decision = turn(guard, T0, 0)
    assert decision is not None and decision.status["gpu-01"] is NodeStatus.QUARANTINED
    assert fake.taints("gpu-01")[-1] == (f"{P}/gpu-health", "fatal", "NoSchedule")
    assert fake.condition("gpu-01")["reason"] == "GpuFatal"
    assert fake.evicted_names == ["gang-0"]  # the PDB refused infer-0 with 429: retried later
    assert sample(guard, "gpucluster_health_evictions_total", {"workload": "inference", "result": "blocked"}) == 1
    patches = {(path, ctype) for method, path, ctype in fake.content_types if method == "PATCH"}
    assert patches == {("/api/v1/nodes/gpu-01", "application/strategic-merge-patch+json"),
                       ("/api/v1/nodes/gpu-01/status", "application/strategic-merge-patch+json")}
    posts = [path for method, path in fake.requests if method == "POST"]
    assert "/api/v1/namespaces/training/pods/gang-0/eviction" in posts
    assert "/api/v1/namespaces/default/events" in posts
    assert "/apis/coordination.k8s.io/v1/namespaces/gpu-system/leases" in posts
    assert fake.lease()["spec"]["holderIdentity"] == "me"


def test_real_client_leader_handover_over_http(api) -> None:
    fake, url = api
    clock = [0.0]
    a, b = elector(http_port(url), "a", 6, clock), elector(http_port(url), "b", 6, clock)
    assert a.step() and not b.step()
    clock[0] = 5
    assert not b.step()
    clock[0] = 6.5
    assert b.step()  # a stopped renewing
    assert fake.lease()["spec"]["holderIdentity"] == "b"
    assert [m for m, p in fake.requests if p.endswith("/leases/health-guard") and m == "PUT"]


# --------------------------------------------------------------------------- fencing, timeouts, handover


def test_a_leader_frozen_past_its_lease_writes_nothing_when_it_wakes(world) -> None:
    """The acceptance scenario: the lease changes hands right after the leader's election step, before the
    standby has acted. The same scenario on the shell before the kit: the woken leader sent 5 writes (taint
    patch, condition, Event, 2 evictions), all applied; now it sends none, and the standby acts once. The woken
    cycle is past its deadline (the renew deadline) before it decides, so it ends there."""
    prom, port, guard = world
    standby = Guard(SETTINGS, prom, port, identity="standby")
    prom.xid = {"gpu-01": 1}
    mono = [0.0]
    real_query = prom.query_raw
    before_wake: list[int] = []

    def frozen_then_woken(promql: str) -> Any:
        if mono[0] == 0.0:  # right after the leader renewed: SIGSTOP for 45 s; the standby takes the lease
            standby.clock, standby.monotonic = (lambda: T0), (lambda: 0.0)
            assert standby.elector.step() is False  # it sees the leader's fresh record
            mono[0] = 45.0
            standby.clock, standby.monotonic = (lambda: T0 + 45), (lambda: 45.0)
            assert standby.elector.step() is True  # unchanged for 45 s on its clock: it leads
            before_wake.append(len(port.writes()))
        return real_query(promql)

    prom.query_raw = frozen_then_woken  # type: ignore[method-assign]
    guard.clock, guard.monotonic = (lambda: T0 + mono[0]), (lambda: mono[0])
    assert guard.cycle() is None  # woken 45 s later: past its deadline, it decides nothing
    assert port.writes()[before_wake[0]:] == []  # the woken leader wrote nothing
    assert sample(guard, "gpucluster_health_errors_total", {"stage": "deadline"}) == 1
    prom.query_raw = real_query  # type: ignore[method-assign]
    assert turn(standby, T0 + 46, 46) is not None
    assert port.taints("gpu-01")[-1] == (f"{P}/gpu-health", "fatal", "NoSchedule")
    assert sorted(port.evicted_names) == ["gang-0", "infer-0"]  # the standby's evictions, once
    assert [c for c in port.writes() if c[0] == "patch:nodes"] == [("patch:nodes", "gpu-01", 0.0)]


def test_a_late_eviction_never_hits_the_pod_that_replaced_it(world) -> None:
    """Volcano restarts the gang under the same pod names; an eviction decided on the old pod carries its UID
    and the API server refuses it for the new one."""
    prom, port, guard = world
    prom.xid = {"gpu-01": 1}
    real_list = port.list

    def list_then_replace(resource: Any, *args: Any, **kwargs: Any) -> dict[str, Any]:
        answer = real_list(resource, *args, **kwargs)
        if resource == PODS and kwargs.get("field_selector") == "spec.nodeName=gpu-01":
            port.remove(PODS, "training/gang-0")
            new = k8s_pod("gang-0", "gpu-01", "training", job="gang")
            new["metadata"]["uid"] = "uid-the-new-one"
            port.put(PODS, new)
        return answer

    port.list = list_then_replace  # type: ignore[method-assign]
    turn(guard, T0, 0)
    assert port.objects["pods"]["training/gang-0"]["metadata"]["uid"] == "uid-the-new-one"
    assert "gang-0" not in port.evicted_names
    assert sample(guard, "gpucluster_health_evictions_total", {"workload": "training", "result": "replaced"}) == 1


def test_a_call_that_never_answers_gives_up_within_its_timeout_and_the_next_cycle_acts(api) -> None:
    fake, url = api
    prom = FakePrometheus()
    prom.xid = {"gpu-01": 1}
    settings = SETTINGS.model_copy(update={"request_timeout_seconds": 0.5})
    guard = Guard(settings, prom, http_port(url, settings.request_timeout_seconds), identity="me")
    fake.fault("GET", "^/api/v1/nodes$", "hang")
    done: list[Decision | None] = []
    worker = threading.Thread(target=lambda: done.append(turn(guard, T0, 0)), daemon=True)
    worker.start()
    worker.join(timeout=10)  # far beyond the 0.5 s timeout; without one the call would wait for the server
    assert not worker.is_alive() and done == [None]
    assert sample(guard, "gpucluster_health_errors_total", {"stage": "list"}) == 1
    assert turn(guard, T0 + 1, 1) is not None
    assert fake.taints("gpu-01")[-1] == (f"{P}/gpu-health", "fatal", "NoSchedule")


def test_on_sigterm_the_guard_releases_its_lease_and_the_standby_takes_over_at_once(world) -> None:
    _, port, guard = world
    stop = threading.Event()
    runner = threading.Thread(target=guard.run, args=(stop,), daemon=True)
    runner.start()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and guard.last_pass() is None:
        time.sleep(0.01)
    assert port.lease()["spec"]["holderIdentity"] == "me"
    stop.set()  # what the SIGTERM handler does
    runner.join(timeout=10)
    assert not runner.is_alive()
    assert port.lease()["spec"]["holderIdentity"] is None
    assert elector(port, "standby", 30, [0.0]).step()  # no wait for the lease to expire


def test_a_stop_during_the_queries_ends_the_cycle_before_it_decides(world) -> None:
    """SIGTERM while Prometheus is slow: the guard asks no further query and writes nothing, so it reaches
    its release within one query's timeout, not after a whole cycle of them."""
    prom, port, guard = world
    prom.xid = {"gpu-01": 1}
    stop = threading.Event()
    asked: list[str] = []
    answer = prom.query_raw

    def slow_then_stopped(promql: str) -> Any:
        asked.append(promql)
        stop.set()  # the signal arrives while this query is in flight
        return answer(promql)

    prom.query_raw = slow_then_stopped  # type: ignore[method-assign]
    assert guard.cycle(stop) is None
    assert len(asked) == 1
    assert [call for call, _, _ in port.writes() if call != "create:leases"] == []  # the election's own only
    assert port.taints("gpu-01") == [(f"{P}/pool", "a", "NoSchedule")]


def test_a_stop_during_the_actions_leaves_the_rest_to_the_next_leader(world) -> None:
    prom, _, guard = world
    prom.xid = {"gpu-01": 1, "gpu-02": 1}
    stop = threading.Event()
    applied: list[Any] = []
    apply = guard._apply

    def apply_then_stopped(action: Any, *args: Any) -> None:
        applied.append(action)
        apply(action, *args)
        stop.set()

    guard._apply = apply_then_stopped  # type: ignore[method-assign]
    decision = guard.cycle(stop)
    assert decision is not None and len(decision.actions) > 1
    # Nodes run side by side: each node's batch may have begun before the stop, none goes past its first action.
    assert 0 < len(applied) <= len({a.node for a in decision.actions}) < len(decision.actions)
