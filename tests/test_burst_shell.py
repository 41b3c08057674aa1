"""The burst controller's shell through the real kubernetes client, against the fake API in `fake_kube_api`.

What belongs here is what only HTTP shows: paging, watch streams and 410, optimistic concurrency, status codes
and timeouts as the client raises them, Leases and Events as JSON, and the threaded run loop. The shell's own
rules (backoff, coalescing, the lease before every write, freshness) are tested in `test_burst_shell_port`.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator

import pytest

from agents.burst_controller.contract import BurstSettings
from agents.burst_controller.decide import Action, ActionKind, Mode
from agents.burst_controller.shell import NODES, PODS, BurstShell
from agents.kit.port import DEPLOYMENTS
from fakes.burst_objects import gpu_pod, onprem_node, virtual_node
from tests.fake_kube_api import FakeApi, http_port, serve

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
    with serve(fake) as url:
        yield fake, url


def make_shell(url: str, clock: Clock, identity: str = "a", settings: BurstSettings = S) -> BurstShell:
    return BurstShell(
        settings, http_port(url, settings.request_timeout_seconds), identity=identity, clock=clock,
        monotonic=clock, sleep=clock.sleep,
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
    pod = fake.objects["pods"]["inference/inf-0"]
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
    assert clock.sleeps == [0.5, 1.0, 2.0, 4.0]  # no sleep after the last attempt: it gives up at once
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
    assert sh.informers[PODS].resource_version == str(fake.rv)
    lists = [r for r in fake.requests if r[0] == "GET" and r[1] in ("/api/v1/nodes", "/api/v1/pods")]
    assert len(lists) == 4  # two lists, two watches: no re-list


def test_watch_410_relists(api: tuple[FakeApi, str]) -> None:
    fake, url = api
    exhausted_cluster(fake)
    clock = Clock()
    sh = make_shell(url, clock)
    lead_and_sync(sh)
    fake.remove(PODS, "train/train-0")
    fake.compact()
    sh.watch_once(PODS)
    assert metric(sh, "gpucluster_burst_errors_total", kind="watch_gone") == 1
    assert sh.informers[PODS].needs_list
    assert not sh.view.snapshot().synced
    assert sh.reconcile() is None  # unsynced: no decision, no patch
    sh.watch_once(PODS)  # re-lists first
    assert sh.view.snapshot().synced
    assert sh.view.snapshot().onprem_free_gpus == 8
    assert metric(sh, "gpucluster_burst_cluster_visible") == 1


def test_paged_list(api: tuple[FakeApi, str]) -> None:
    fake, url = api
    exhausted_cluster(fake)
    for i in range(5):
        fake.put(PODS, gpu_pod(f"inf-{i}", 1, node="vk-a"))
    sh = make_shell(url, Clock())
    sh.informers[PODS].page = 2
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
    sh.informers[NODES].needs_list = True
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
    settings = BurstSettings.from_mapping(
        {"open_hold_seconds": 0, "tick_seconds": 0.05, "retry_period_seconds": 0.05, "watch_timeout_seconds": 1}
    )
    sh = BurstShell(settings, http_port(url, settings.request_timeout_seconds), identity="runner")
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
    fake.put(DEPLOYMENTS, {"metadata": {"name": "svc-standby", "namespace": "inference"}, "spec": {"replicas": 0}})
    clock = Clock()
    sh = make_shell(url, clock, settings=settings)
    lead_and_sync(sh)

    first = sh.reconcile()
    assert first is not None and first.standby == {"svc": 2}
    assert fake.scales["inference/svc-standby"] == 2
    assert [g["name"] for g in fake.objects["pods"]["training/gang-0"]["spec"]["schedulingGates"]] == [
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
    assert fake.objects["pods"]["training/gang-0"]["spec"]["schedulingGates"] == [{"name": "example.com/quota"}]
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
    assert fake.objects["pods"]["training/gang-0"]["spec"]["schedulingGates"]  # still waiting (until the timeout)


def test_a_virtual_node_created_without_its_provider_taint_gets_it_back(api: tuple[FakeApi, str]) -> None:
    """Something created the node before its virtual kubelet did (the stack's label patch can): the provider
    taint is added as NoSchedule, every other taint kept, the annotation of our own taint left alone, and one
    Warning event says why; a node that has its provider taint (any effect) is never touched."""
    fake, url = api
    settings = S.replace(provider_taints={"gpucloud": "virtual-kubelet.io/provider=gpucloud",
                                                       "othercloud": "virtual-kubelet.io/provider=othercloud"})
    exhausted_cluster(fake)
    bare = virtual_node("vk-a", burst_effect="NoSchedule", settings=settings)
    bare["spec"]["taints"] = [t for t in bare["spec"]["taints"] if t["key"] != "virtual-kubelet.io/provider"]
    bare["spec"]["taints"].append({"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"})
    fake.put(NODES, bare)
    liqo_like = virtual_node("vk-b", "othercloud", burst_effect="NoSchedule", settings=settings)
    liqo_like["spec"]["taints"][0]["effect"] = "NoExecute"  # present with another effect: not ours to change
    fake.put(NODES, liqo_like)
    sh = make_shell(url, Clock(), settings=settings)
    lead_and_sync(sh)
    assert sh.reconcile() is not None
    taints = fake.node("vk-a")["spec"]["taints"]
    assert {"key": "virtual-kubelet.io/provider", "value": "gpucloud", "effect": "NoSchedule"} in taints
    assert {"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"} in taints
    assert sum(t["key"] == "virtual-kubelet.io/provider" for t in taints) == 1
    assert [t for t in fake.node("vk-b")["spec"]["taints"] if t["key"] == "virtual-kubelet.io/provider"] == [
        {"key": "virtual-kubelet.io/provider", "value": "othercloud", "effect": "NoExecute"}]
    restored = [e for e in fake.events if e["reason"] == "ProviderTaintRestored"]
    assert [(e["involvedObject"]["name"], e["type"]) for e in restored] == [("vk-a", "Warning")]
    assert metric(sh, "gpucluster_burst_actions_total", kind="taint_provider") == 1
    # Once there, the next cycle has nothing to add.
    patches = len([r for r in fake.requests if r[0] == "PATCH"])
    assert sh.reconcile() is not None
    assert len([r for r in fake.requests if r[0] == "PATCH"]) == patches


def test_a_call_that_never_answers_gives_up_within_its_timeout_and_the_retry_acts(api: tuple[FakeApi, str]) -> None:
    """A hung API call ends at the request timeout (0.5 s here) as a retryable `timeout`; the retry lands."""
    fake, url = api
    exhausted_cluster(fake)
    clock = Clock()
    sh = make_shell(url, clock)
    lead_and_sync(sh)
    fake.fault("PATCH", "/nodes/vk-a$", "hang")
    done: list[object] = []
    worker = threading.Thread(target=lambda: done.append(sh.reconcile()), daemon=True)
    worker.start()
    worker.join(timeout=10)  # far beyond the timeout; without one the call would wait for the server
    assert not worker.is_alive() and done and done[0] is not None
    assert metric(sh, "gpucluster_burst_errors_total", kind="timeout") == 1
    assert [t["key"] for t in fake.node("vk-a")["spec"]["taints"]] == ["virtual-kubelet.io/provider"]


def test_on_stop_the_controller_releases_its_lease_and_the_standby_leads_at_once(api: tuple[FakeApi, str]) -> None:
    fake, url = api
    exhausted_cluster(fake)
    settings = BurstSettings.from_mapping({"tick_seconds": 0.05, "retry_period_seconds": 0.05,
                                           "watch_timeout_seconds": 1})
    sh = BurstShell(settings, http_port(url, 1.0), identity="leader")
    stop = threading.Event()
    thread = threading.Thread(target=sh.run, args=(stop,), daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and sh.last_decision is None:
        time.sleep(0.02)
    assert fake.objects["leases"]["gpu-burst/burst-controller"]["spec"]["holderIdentity"] == "leader"
    stop.set()
    thread.join(timeout=10)
    assert not thread.is_alive()
    standby = BurstShell(settings, http_port(url, 1.0), identity="standby")
    assert standby.elector.step()  # at once: no wait for the lease to expire


def test_a_gangs_gates_lift_side_by_side_and_a_refused_lift_backs_off_alone(api: tuple[FakeApi, str]) -> None:
    """At scale a gang's release is the burst controller's longest write: its lifts go out together (bounded),
    each through the fenced port; one refused lift waits its own backoff while the others are released."""
    from agents.burst_controller.shell import UNGATE_CONCURRENCY

    fake, url = api
    fake.put(NODES, onprem_node("n1", 8, pool="a"))
    pods = 3 * UNGATE_CONCURRENCY
    for i in range(pods):
        fake.put(PODS, gpu_pod(f"gang-{i}", 8, workload="training", namespace="training", pool="a", gated=True))
        fake.fault("PATCH", f"/pods/gang-{i}$", 422 if i == 7 else ("delay", 0.05))  # 422: not retried
    sh = make_shell(url, Clock())
    lead_and_sync(sh)
    decision = sh.reconcile()
    assert decision is not None
    assert sum(a.kind.value == "ungate" for a in decision.actions) == pods
    gated = [n for n, p in fake.objects["pods"].items() if p["spec"].get("schedulingGates")]
    assert gated == ["training/gang-7"]
    assert 1 < fake.max_in_flight <= UNGATE_CONCURRENCY + 2  # the lease loop and a watch may add one each
    assert metric(sh, "gpucluster_burst_actions_total", kind="ungate") == pods - 1
    assert [a.pod for a in sh._backoff] == ["gang-7"]


def test_gate_lifts_are_batched_in_decision_order_and_nothing_else_is() -> None:
    from agents.burst_controller.decide import Action, ActionKind
    from agents.burst_controller.shell import _batches

    def act(kind: ActionKind, pod: str = "") -> Action:
        return Action(kind, node="", pod=pod, namespace="training" if pod else "")

    actions = [act(ActionKind.CLOSE_NODE), act(ActionKind.UNGATE, "a"), act(ActionKind.UNGATE, "b"),
               act(ActionKind.OPEN_NODE), act(ActionKind.UNGATE, "c")]
    assert [[a.pod or a.kind.value for a in b] for b in _batches(actions)] == [
        ["close_node"], ["a", "b"], ["open_node"], ["c"]]


def test_a_reservation_is_put_on_and_taken_off_keeping_every_other_taint(api: tuple[FakeApi, str]) -> None:
    """The handover's reservation (``<prefix>/reserved=<pool>:NoSchedule``) on an on-prem node: any other copy of
    its key replaced, the guard's and the kubelet's taints kept, and taken off again leaving those."""
    fake, url = api
    node = onprem_node("n1", 8, pool="a", health="degraded")
    node["spec"]["taints"] += [{"key": S.reserved_taint_key, "value": "old", "effect": "NoExecute"},
                               {"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"}]
    fake.put(NODES, node)
    sh = make_shell(url, Clock())
    lead_and_sync(sh)
    assert sh.apply(Action(ActionKind.RESERVE_NODE, node="n1", pool="a"))
    taints = fake.node("n1")["spec"]["taints"]
    assert [t for t in taints if t["key"] == S.reserved_taint_key] == [
        {"key": "gpucluster.io/reserved", "value": "a", "effect": "NoSchedule"}]
    assert {"key": S.health_taint_key, "value": "degraded", "effect": "NoSchedule"} in taints
    assert {"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"} in taints
    assert sh.view.snapshot().reserved == {"n1": "a"}
    patches = len([r for r in fake.requests if r[0] == "PATCH"])
    sh.apply(Action(ActionKind.RESERVE_NODE, node="n1", pool="a"))
    assert len([r for r in fake.requests if r[0] == "PATCH"]) == patches, "already there: no second patch"
    assert sh.apply(Action(ActionKind.RELEASE_NODE, node="n1"))
    assert [t["key"] for t in fake.node("n1")["spec"]["taints"]] == [S.health_taint_key, "node.kubernetes.io/not-ready"]
    assert sh.view.snapshot().reserved == {}
