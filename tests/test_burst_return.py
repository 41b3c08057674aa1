"""Make-before-break return: `plan_return` (the on-prem bridge per handover service and the evictions it
covers), `decide` emitting SET_RETURN and EVICT, the stack's `<service>-return` Deployment and the controller's
right to scale it and to evict, and the shell doing both on the in-memory API.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

import pytest

from agents.burst_controller.contract import BurstSettings, SettingsError
from agents.burst_controller.decide import (
    Action,
    ActionKind,
    BurstState,
    Mode,
    PodRef,
    ServiceReplicas,
    Snapshot,
    VirtualNode,
    decide,
    plan_return,
)
from components.mockrt import RunResult

NOW = 10_000.0
RESERVE = 8  # open_below_free_gpus: the room a return leaves on-prem


def svc(live: int, external: int, *, ready: int | None = None, home: int = 0, home_ready: int | None = None,
        pending: int = 0, leaving: int = 0, gpus: int = 1, minimum: int = 2) -> ServiceReplicas:
    ready = live if ready is None else ready
    return ServiceReplicas(min_replicas=minimum, main_live=live, main_ready=ready, main_ready_external=external,
                           main_ready_onprem={"a": ready - external}, gpus_per_replica=gpus, main_leaving=leaving,
                           return_live=home, return_ready=home if home_ready is None else home_ready,
                           return_pending=pending)


def ext(n: int, name: str = "a") -> tuple[PodRef, ...]:
    return tuple(PodRef("inference", f"{name}-ext-{i}") for i in range(n))


# id, services, effective free GPUs, share, bridge wanted, evictions per service
PLAN_TABLE: list[tuple[str, Mapping[str, ServiceReplicas], int, float, dict[str, int], dict[str, int]]] = [
    ("off-wants-nothing", {"a": svc(10, 4)}, 100, 0.0, {}, {}),
    ("off-empties-a-bridge-left-up", {"a": svc(10, 4, home=2)}, 100, 0.0, {"a": 0}, {}),
    ("nothing-external-nothing-to-do", {"a": svc(10, 0)}, 100, 0.5, {}, {}),
    ("starts-the-bridge-first-evicts-nothing", {"a": svc(10, 4)}, 100, 0.5, {"a": 4}, {}),
    ("capped-at-the-share-rounded-up", {"a": svc(10, 8)}, 100, 0.25, {"a": 3}, {}),
    ("room-for-bridge-and-replacement-each", {"a": svc(10, 8)}, RESERVE + 6, 1.0, {"a": 3}, {}),
    ("no-room-above-the-reserve", {"a": svc(10, 8)}, RESERVE + 1, 1.0, {"a": 0}, {}),
    ("training-needs-the-room", {"a": svc(10, 8)}, -4, 1.0, {"a": 0}, {}),
    ("a-bridge-starting-waits", {"a": svc(10, 4, home=4, home_ready=0)}, 100, 0.5, {"a": 4}, {}),
    ("a-ready-bridge-evicts-one-at-a-time", {"a": svc(10, 4, home=4)}, 100, 0.5, {"a": 4}, {"a": 1}),
    ("eviction-needs-room-for-the-replacement", {"a": svc(10, 4, home=4)}, RESERVE + 2, 0.5, {"a": 2}, {"a": 1}),
    ("no-room-for-a-replacement-no-eviction", {"a": svc(10, 4, home=4)}, RESERVE, 0.5, {"a": 0}, {}),
    ("an-unbound-bridge-pod-takes-its-room-first", {"a": svc(10, 4, home=2, home_ready=0, pending=2)},
     RESERVE + 4, 1.0, {"a": 2}, {}),
    ("no-eviction-while-a-move-is-in-flight", {"a": svc(10, 3, ready=9, home=3)}, 100, 0.5, {"a": 4}, {}),
    ("moves-in-flight-keep-their-cover", {"a": svc(10, 2, ready=8, home=2)}, 100, 0.5, {"a": 4}, {}),
    ("an-eviction-made-is-not-made-again", {"a": svc(9, 3, home=1, leaving=1)}, 100, 0.5, {"a": 4}, {}),
    ("done-the-bridge-goes", {"a": svc(10, 0, home=3)}, 100, 0.5, {"a": 0}, {}),
    ("done-but-replacements-starting-keep-it", {"a": svc(10, 0, ready=8, home=3)}, 100, 0.5, {"a": 2}, {}),
    ("two-gpu-replicas-need-twice-the-room", {"a": svc(10, 8, gpus=2)}, RESERVE + 8, 1.0, {"a": 2}, {}),
    ("services-share-the-room-in-name-order", {"a": svc(10, 4), "b": svc(10, 4)}, RESERVE + 10, 1.0,
     {"a": 4, "b": 1}, {}),
]


@pytest.mark.parametrize(("services", "free", "share", "want", "evict"), [t[1:] for t in PLAN_TABLE],
                         ids=[t[0] for t in PLAN_TABLE])
def test_plan_return_table(services: Mapping[str, ServiceReplicas], free: int, share: float,
                           want: dict[str, int], evict: dict[str, int]) -> None:
    snapshot = Snapshot(synced=True, observed_at=NOW, onprem_allocatable_gpus=256, onprem_free_gpus=max(0, free),
                        services=services, external_replicas={n: ext(s.main_ready_external, n)
                                                              for n, s in services.items()})
    plan = plan_return(snapshot, free, BurstSettings(return_surge_share=share, open_below_free_gpus=RESERVE))
    assert dict(plan.targets) == want
    assert {n: len(refs) for n, refs in plan.evictions.items()} == evict
    for name, refs in plan.evictions.items():  # the first ones listed: the dearest provider's
        assert refs == ext(len(refs), name)


def test_return_settings_are_off_by_default_and_validated() -> None:
    assert BurstSettings().return_surge_share == 0.0
    assert not BurstSettings(return_surge_share=0.5).return_bridge  # no handover services: nothing to bring home
    assert BurstSettings(return_surge_share=0.5, handover_services={"a": 1}).return_bridge
    assert BurstSettings.from_mapping({"return_surge_share": 0.25}).return_surge_share == 0.25
    with pytest.raises(SettingsError, match=r"return_surge_share: must be between 0 and 1"):
        BurstSettings(return_surge_share=1.5)


def _snapshot(service: ServiceReplicas, free: int) -> Snapshot:
    node = VirtualNode("vk-a", provider="a", taint_effect=None, gpus_in_use=service.main_ready_external,
                       changed_at=0.0)
    return Snapshot(synced=True, observed_at=NOW, onprem_allocatable_gpus=64, onprem_free_gpus=free,
                    virtual_nodes={node.name: node}, services={"a": service},
                    external_replicas={"a": ext(service.main_ready_external)})


def test_decide_makes_before_it_breaks_while_the_burst_stays_open() -> None:
    settings = BurstSettings(return_surge_share=0.5, handover_services={"a": 2}, open_below_free_gpus=RESERVE)
    state = BurstState(mode=Mode.OPEN, changed_at=0.0)
    d = decide(_snapshot(svc(10, 2), 40), state, NOW, settings)
    assert [a for a in d.actions if a.kind in (ActionKind.SET_RETURN, ActionKind.EVICT)] == [
        Action(ActionKind.SET_RETURN, service="a", replicas=2)] and d.home == {"a": 2}
    assert d.state.mode is Mode.OPEN and d.flipped is None  # the return never waits for a close
    evict = Action(ActionKind.EVICT, namespace="inference", pod="a-ext-0", service="a")
    # The bridge is Ready: one external replica goes (the dearest), the bridge stays for the next.
    d = decide(_snapshot(svc(10, 2, home=2), 38), d.state, NOW + 5, settings)
    assert [a for a in d.actions if a.kind in (ActionKind.SET_RETURN, ActionKind.EVICT)] == [evict]
    # Evicted, replaced on-prem, not Ready yet: nothing more to do, the cover stays.
    d = decide(_snapshot(svc(10, 1, ready=9, home=2), 37), d.state, NOW + 10, settings)
    assert not [a for a in d.actions if a.kind in (ActionKind.SET_RETURN, ActionKind.EVICT)]
    # The replacement is Ready: the last one goes, and the bridge pod nothing is left for with it.
    d = decide(_snapshot(svc(10, 1, home=2), 37), d.state, NOW + 40, settings)
    assert [a for a in d.actions if a.kind in (ActionKind.SET_RETURN, ActionKind.EVICT)] == [
        Action(ActionKind.SET_RETURN, service="a", replicas=1), evict]
    # The last replacement starting keeps its cover; once Ready, the bridge goes.
    d = decide(_snapshot(svc(10, 0, ready=9, home=1), 36), d.state, NOW + 45, settings)
    assert not [a for a in d.actions if a.kind in (ActionKind.SET_RETURN, ActionKind.EVICT)]
    d = decide(_snapshot(svc(10, 0, home=1), 36), d.state, NOW + 80, settings)
    assert [a for a in d.actions if a.kind in (ActionKind.SET_RETURN, ActionKind.EVICT)] == [
        Action(ActionKind.SET_RETURN, service="a", replicas=0)]


def test_decide_after_a_leader_change_repeats_no_move() -> None:
    """A new leader starts from the taints alone and still sees the move in flight in the pods."""
    settings = BurstSettings(return_surge_share=0.5, handover_services={"a": 2}, open_below_free_gpus=RESERVE)
    snapshot = _snapshot(svc(9, 1, home=2, leaving=1), 36)  # one evicted, its replacement not created yet
    from agents.burst_controller.decide import state_from_snapshot

    d = decide(snapshot, state_from_snapshot(snapshot, NOW), NOW, settings)
    evicted = [a for a in d.actions if a.kind is ActionKind.EVICT]
    assert evicted == []  # the move in flight finishes first: its replacement is not even created yet
    assert d.home == {"a": 2}  # and its cover stays


def test_decide_blind_does_nothing() -> None:
    settings = BurstSettings(return_surge_share=0.5, handover_services={"a": 2})
    stale = _snapshot(svc(10, 2, home=2), 40)
    d = decide(Snapshot(**{**stale.__dict__, "observed_at": NOW - 1_000}), BurstState(mode=Mode.OPEN), NOW, settings)
    assert d.actions == ()


# --------------------------------------------------------------------------- the stack

RETURN_ON = {"returnSurgeShare": 0.1}
SERVICES = ["sdxl-turbo", "llama-70b-chat", "whisper-large"]


def test_no_return_deployment_by_default_and_evictions_only_for_clearing_a_pool(
        prod: RunResult, run_stack: Any) -> None:
    assert [d.name for d in prod.by_kind("Deployment") if d.name.endswith("-return")] == []
    rules = prod.one("Role", "burst-controller-handover").inputs["rules"]
    assert not [n for n in rules[0]["resourceNames"] if n.endswith("-return")]
    # Clearing a pool for training the scheduler leaves waiting (clearAfterSeconds) is off by default: no eviction
    # grant at all; turned on, evictions in the inference namespace, through the Eviction API.
    assert not [r for r in rules if "pods/eviction" in r["resources"]]
    on = run_stack("prod", lambda c: c["gpu-cluster:burst"].setdefault("handover", {}).update(clearAfterSeconds=30))
    rules = on.one("Role", "burst-controller-handover").inputs["rules"]
    assert [r for r in rules if "pods/eviction" in r["resources"]] == [
        {"apiGroups": [""], "resources": ["pods/eviction"], "verbs": ["create"]}]


def test_return_deployment_is_the_service_pinned_on_prem_outside_the_hpa(run_stack: Any) -> None:
    result = run_stack("prod", lambda c: c["gpu-cluster:burst"].update(RETURN_ON))
    for name in SERVICES:
        home, main = result.one("Deployment", f"{name}-return"), result.one("Deployment", name)
        assert home.inputs["spec"]["replicas"] == 0 and home.ignore_changes == ["spec.replicas"]
        pod, main_pod = home.inputs["spec"]["template"]["spec"], main.inputs["spec"]["template"]["spec"]
        assert pod["containers"] == main_pod["containers"] and pod["priorityClassName"] == main_pod["priorityClassName"]
        terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
        assert {"key": "gpucluster.io/location", "operator": "In", "values": ["onprem"]} in \
            terms[0]["matchExpressions"]
        assert not [t for t in pod["tolerations"] if t["key"] == "gpucluster.io/burst"]
        labels = home.inputs["spec"]["template"]["metadata"]["labels"]
        assert labels["gpucluster.io/role"] == "return" and labels["gpucluster.io/service"] == name
        # The Service and the PDB select it (it serves, it counts as available) ...
        for selector in (result.one("Service", name).inputs["spec"]["selector"],
                         result.one("PodDisruptionBudget", name).inputs["spec"]["selector"]["matchLabels"]):
            assert all(labels.get(k) == v for k, v in selector.items()), selector
        # ... the main Deployment (the HPA's scale target) does not, nor does it select the main's pods.
        assert not all(labels.get(k) == v for k, v in main.inputs["spec"]["selector"]["matchLabels"].items())
        main_labels = main.inputs["spec"]["template"]["metadata"]["labels"]
        assert not all(main_labels.get(k) == v for k, v in home.inputs["spec"]["selector"]["matchLabels"].items())
        hpa = result.one("HorizontalPodAutoscaler", name)
        assert hpa.inputs["spec"]["scaleTargetRef"]["name"] == name


def test_return_rbac_is_the_named_scales_and_evictions_in_inference_only(run_stack: Any) -> None:
    import yaml

    result = run_stack("prod", lambda c: c["gpu-cluster:burst"].update(RETURN_ON))
    role = result.one("Role", "burst-controller-handover")
    assert role.inputs["metadata"]["namespace"] == "inference"
    assert role.inputs["rules"] == [
        {"apiGroups": ["apps"], "resources": ["deployments/scale"],
         "resourceNames": [f"{s}-standby" for s in SERVICES] + [f"{s}-return" for s in SERVICES],
         "verbs": ["get", "patch"]},
        {"apiGroups": [""], "resources": ["pods/eviction"], "verbs": ["create"]},
    ]
    data = yaml.safe_load(result.one("ConfigMap", "burst-controller-settings").inputs["data"]["settings.yaml"])
    assert data["return_surge_share"] == 0.1


def test_return_share_is_bounded_at_config_time(run_stack: Any) -> None:
    from components.config import ConfigError

    with pytest.raises(ConfigError, match="returnSurgeShare"):
        run_stack("local", lambda c: c["gpu-cluster:burst"].update({"returnSurgeShare": 2}))


# --------------------------------------------------------------------------- the shell (in-memory API)

def test_shell_scales_the_bridge_then_evicts_the_external_replicas() -> None:
    from agents.burst_controller.shell import NODES, PODS, BurstShell
    from agents.kit.port import DEPLOYMENTS
    from fakes.burst_objects import gpu_pod, onprem_node, virtual_node
    from fakes.kube_api import MemoryApi

    clock = [1_700_000_000.0]

    def now() -> float:
        return clock[0]

    settings = BurstSettings(open_below_free_gpus=1, close_at_free_gpus=64, open_hold_seconds=0,
                             close_hold_seconds=0, pending_grace_seconds=0, tick_seconds=5,
                             handover_services={"svc": 2}, return_surge_share=0.5,
                             provider_deletion_costs={"dear": -200})
    api = MemoryApi(now)
    api.put(NODES, onprem_node("n1", 8))
    api.put(NODES, virtual_node("vk-a", burst_effect=None))  # the burst is open, on-prem has room again
    api.put(NODES, virtual_node("vk-dear", provider="dear", burst_effect=None))
    for i in range(2):
        api.put(PODS, gpu_pod(f"svc-on-{i}", node="n1", service="svc"))
    api.put(PODS, gpu_pod("svc-ext-0", node="vk-a", service="svc", deletion_cost=-100))
    api.put(PODS, gpu_pod("svc-ext-1", node="vk-dear", service="svc", deletion_cost=-200))
    api.put(DEPLOYMENTS, {"metadata": {"name": "svc-return", "namespace": "inference"}, "spec": {"replicas": 0}})
    sh = BurstShell(settings, api, identity="a", clock=now, monotonic=now, sleep=lambda s: None,
                    rng=random.Random(7))
    assert sh.elector.step() and sh.relist(NODES) and sh.relist(PODS)
    snap = sh.view.snapshot()
    assert snap.external_replicas["svc"] == (PodRef("inference", "svc-ext-1"), PodRef("inference", "svc-ext-0"))
    first = sh.reconcile()
    assert first is not None and first.home == {"svc": 2}
    assert api.scales["inference/svc-return"] == 2 and not api.evicted
    # One bridge pod Ready on-prem, one waiting for room: neither is pending inference (nothing to open).
    api.put(PODS, gpu_pod("svc-return-0", node="n1", service="svc", home=True))
    api.put(PODS, gpu_pod("svc-return-1", service="svc", home=True, unschedulable=True))
    assert sh.relist(PODS)
    snap = sh.view.snapshot()
    assert (snap.services["svc"].return_live, snap.services["svc"].return_ready) == (2, 1)
    assert snap.pending_inference_gpus == 0 and snap.services["svc"].main_live == 4
    clock[0] += 5
    assert sh.elector.step()
    second = sh.reconcile()
    assert second is not None
    assert api.evicted == ["inference/svc-ext-1"]  # one Ready cover, one eviction: the dearest provider's
    assert sh.metrics.actions.labels("evict")._value.get() == 1
    # The view counts it as leaving at once: the next decision, before any watch event, evicts nothing more.
    counts = sh.view.snapshot().services["svc"]
    assert (counts.main_leaving, counts.main_ready_external) == (1, 1)
    clock[0] += 5
    assert sh.elector.step()
    third = sh.reconcile()
    assert third is not None and api.evicted == ["inference/svc-ext-1"]
    assert api.count("patch:deployments/scale") == 1


def test_shell_leaves_a_pod_the_pdb_protects_and_tries_again_later() -> None:
    from agents.burst_controller.shell import NODES, PODS, BurstShell
    from fakes.burst_objects import gpu_pod, onprem_node, virtual_node
    from fakes.kube_api import MemoryApi

    clock = [1_700_000_000.0]

    def now() -> float:
        return clock[0]

    settings = BurstSettings(open_below_free_gpus=1, close_at_free_gpus=64, open_hold_seconds=0,
                             close_hold_seconds=0, pending_grace_seconds=0, handover_services={"svc": 1},
                             return_surge_share=1.0)
    api = MemoryApi(now)
    api.put(NODES, onprem_node("n1", 8))
    api.put(NODES, virtual_node("vk-a", burst_effect=None))
    api.put(PODS, gpu_pod("svc-ext-0", node="vk-a", service="svc", deletion_cost=-100))
    api.put(PODS, gpu_pod("svc-return-0", node="n1", service="svc", home=True))
    api.pdb_blocked.add("inference/svc-ext-0")
    slept: list[float] = []
    sh = BurstShell(settings, api, identity="a", clock=now, monotonic=now, sleep=slept.append,
                    rng=random.Random(7))
    assert sh.elector.step() and sh.relist(NODES) and sh.relist(PODS)
    sh.reconcile()
    assert not api.evicted and sh.view.snapshot().services["svc"].main_ready_external == 1
    # The PDB's "not now" is this cycle's answer: asked once, never waited out inside the cycle (retried in the call,
    # each refusal held the cycle about 7.5 s: minutes for the dozens a clearing at the prod size asks at once).
    assert api.count("create:pods/eviction") == 1 and slept == []
    # A server error is no "not now": retried inside the call, as every call is.
    from agents.kit.errors import ApiError

    api.pdb_blocked.clear()
    api.fail("create:pods/eviction", ApiError("server_error", "etcd leader changed", 503))
    clock[0] += 5  # past the action's backoff (2 s, ±20 %)
    assert sh.elector.step()
    sh.reconcile()
    assert api.evicted == ["inference/svc-ext-0"] and api.count("create:pods/eviction") == 3



def test_shell_reserves_the_nodes_it_clears_before_evicting_and_gives_them_back_once_the_gang_is_placed() -> None:
    """The clearing end to end on the in-memory API: a 4-node gang waits in a pool with 2 empty nodes and 2 holding
    replicas. Past clearAfterSeconds the two nodes get the reservation; only the next cycle, which sees it, evicts
    their replicas (the replacements cannot come back there); once the gang is bound the reservation comes off."""
    from agents.burst_controller.shell import NODES, PODS, BurstShell
    from fakes.burst_objects import gpu_pod, onprem_node
    from fakes.kube_api import MemoryApi

    clock = [1_700_000_000.0]

    def now() -> float:
        return clock[0]

    settings = BurstSettings(open_below_free_gpus=1, close_at_free_gpus=64, open_hold_seconds=0,
                             close_hold_seconds=0, pending_grace_seconds=0, handover_services={"svc": 1},
                             handover={"clear_after_seconds": 30.0})
    api = MemoryApi(now)
    for i in range(1, 5):
        api.put(NODES, onprem_node(f"n{i}", 8, pool="a"))
    for i in (1, 2):
        api.put(PODS, gpu_pod(f"svc-{i}", 2, node=f"n{i}", service="svc", pool="a"))
    for i in range(4):
        api.put(PODS, gpu_pod(f"gang-{i}", 8, workload="training", namespace="training", pool="a",
                              unschedulable=True))
    sh = BurstShell(settings, api, identity="a", clock=now, monotonic=now, sleep=lambda s: None,
                    rng=random.Random(7))
    key = settings.reserved_taint_key

    def reserved() -> dict[str, str]:
        return {n: t["value"] for n in ("n1", "n2", "n3", "n4")
                for t in api.get(NODES, n)["spec"].get("taints") or () if t["key"] == key}

    def cycle(seconds: float) -> None:
        clock[0] += seconds
        assert sh.elector.step()
        assert sh.reconcile() is not None

    assert sh.elector.step() and sh.relist(NODES) and sh.relist(PODS)
    assert sh.reconcile() is not None
    assert reserved() == {} and not api.evicted  # the scheduler has its clearAfterSeconds first
    cycle(31)
    assert reserved() == {"n1": "a", "n2": "a"} and not api.evicted
    assert [e["reason"] for e in api.events if e["reason"].startswith("Node")] == ["NodeReserved", "NodeReserved"]
    cycle(5)
    assert sorted(api.evicted) == ["inference/svc-1", "inference/svc-2"]
    assert reserved() == {"n1": "a", "n2": "a"}
    # The replicas gone (evicted) and the gang bound on the four nodes: the reservation comes off.
    for i in range(4):
        api.put(PODS, gpu_pod(f"gang-{i}", 8, node=f"n{i + 1}", workload="training", namespace="training", pool="a"))
    assert sh.relist(PODS)
    cycle(5)
    assert reserved() == {}
    assert sh.metrics.actions.labels("release_node")._value.get() == 2
