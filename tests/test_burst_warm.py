"""Warm external capacity: `plan_warm` (the warm pool per handover service while the burst is open),
`decide` emitting SET_WARM, the stack's `<service>-warm` Deployment and the controller's right to scale it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from agents.burst_controller.contract import BurstSettings, HandoverTunables, SettingsError
from agents.burst_controller.decide import (
    Action,
    ActionKind,
    BurstState,
    Mode,
    ServiceReplicas,
    Snapshot,
    VirtualNode,
    decide,
    plan_warm,
)
from components.mockrt import RunResult

NOW = 10_000.0
WINDOW = 300.0


def svc(live: int, minimum: int = 2, warm: int = 0) -> ServiceReplicas:
    return ServiceReplicas(min_replicas=minimum, main_live=live, main_ready=live, main_ready_onprem={"a": live},
                           warm_live=warm)


# id, open, services, replica history per service, share, ramp seconds, placeholders wanted
PLAN_TABLE: list[tuple[str, bool, Mapping[str, ServiceReplicas], Mapping[str, tuple[tuple[float, int], ...]],
                       float, float, dict[str, int]]] = [
    ("closed-wants-none", False, {"a": svc(10)}, {}, 0.25, 0.0, {}),
    ("closed-empties-what-is-left", False, {"a": svc(10, warm=3), "b": svc(4)}, {}, 0.25, 0.0, {"a": 0}),
    ("off-wants-none", True, {"a": svc(10)}, {}, 0.0, 0.0, {}),
    ("off-empties-what-is-left", True, {"a": svc(10, warm=2)}, {}, 0.0, 0.0, {"a": 0}),
    ("share-rounds-up", True, {"a": svc(10), "b": svc(3)}, {}, 0.25, 0.0, {"a": 3, "b": 1}),
    ("share-exact-is-not-rounded-up", True, {"a": svc(8)}, {}, 0.25, 0.0, {"a": 2}),
    ("share-of-the-minimum-while-fewer-run", True, {"a": svc(1, minimum=4)}, {}, 0.5, 0.0, {"a": 2}),
    ("share-one-is-every-replica", True, {"a": svc(6)}, {}, 1.0, 0.0, {"a": 6}),
    ("unchanged-still-listed", True, {"a": svc(10, warm=3)}, {}, 0.25, 0.0, {"a": 3}),
    ("ramp-alone", True, {"a": svc(70)}, {"a": ((NOW - 400, 40), (NOW - 100, 70))}, 0.0, 180.0, {"a": 18}),
    ("ramp-on-top-of-the-share", True, {"a": svc(70)}, {"a": ((NOW - 400, 40), (NOW - 100, 70))}, 0.1, 180.0,
     {"a": 7 + 18}),
    ("ramp-falling-adds-nothing", True, {"a": svc(40)}, {"a": ((NOW - 400, 70), (NOW - 100, 40))}, 0.0, 180.0, {}),
    ("capped-at-the-replicas", True, {"a": svc(10)}, {"a": ((NOW - 400, 1), (NOW - 10, 10))}, 1.0, 3600.0,
     {"a": 10}),
]


@pytest.mark.parametrize(("open_", "services", "seen", "share", "ramp", "want"), [t[1:] for t in PLAN_TABLE],
                         ids=[t[0] for t in PLAN_TABLE])
def test_plan_warm_table(open_: bool, services: Mapping[str, ServiceReplicas],
                         seen: Mapping[str, tuple[tuple[float, int], ...]], share: float, ramp: float,
                         want: dict[str, int]) -> None:
    settings = BurstSettings(warm_pool_share=share, warm_pool_ramp_seconds=ramp,
                             handover=HandoverTunables(ramp_window_seconds=WINDOW))
    assert plan_warm(services, open_, seen, NOW, settings) == want


def test_warm_settings_are_off_by_default_and_validated() -> None:
    assert (BurstSettings().warm_pool_share, BurstSettings().warm_pool_ramp_seconds) == (0.0, 0.0)
    assert not BurstSettings(warm_pool_share=0.5).warm_pool  # no handover services: nothing to keep warm
    assert BurstSettings(warm_pool_share=0.5, handover_services={"a": 1}).warm_pool
    assert BurstSettings(warm_pool_ramp_seconds=60, handover_services={"a": 1}).warm_pool
    s = BurstSettings.from_mapping({"warm_pool_share": 0.25, "warm_pool_ramp_seconds": 120})
    assert (s.warm_pool_share, s.warm_pool_ramp_seconds) == (0.25, 120.0)
    with pytest.raises(SettingsError, match=r"warm_pool_share: must be between 0 and 1"):
        BurstSettings(warm_pool_share=1.5)
    with pytest.raises(SettingsError, match=r"warm_pool_ramp_seconds: must be >= 0"):
        BurstSettings(warm_pool_ramp_seconds=-1)


def _snapshot(services: Mapping[str, ServiceReplicas], closed: bool) -> Snapshot:
    node = VirtualNode("vk-a", provider="a", taint_effect="NoSchedule" if closed else None, changed_at=0.0)
    return Snapshot(synced=True, observed_at=NOW, onprem_allocatable_gpus=64, onprem_free_gpus=0,
                    virtual_nodes={node.name: node}, services=services)


def test_decide_scales_the_warm_pool_while_open_and_empties_it_at_the_close() -> None:
    settings = BurstSettings(warm_pool_share=0.25, handover_services={"a": 2})
    state = BurstState(mode=Mode.OPEN, changed_at=0.0)
    d = decide(_snapshot({"a": svc(10)}, closed=False), state, NOW, settings)
    assert Action(ActionKind.SET_WARM, service="a", replicas=3) in d.actions and d.warm == {"a": 3}
    # Once the Deployment has them, nothing more to do.
    d = decide(_snapshot({"a": svc(10, warm=3)}, closed=False), d.state, NOW + 5, settings)
    assert not [a for a in d.actions if a.kind is ActionKind.SET_WARM]
    # Closed: every placeholder goes.
    closed = BurstState(mode=Mode.CLOSED, changed_at=0.0)
    d = decide(_snapshot({"a": svc(10, warm=3)}, closed=True), closed, NOW, settings)
    assert [a for a in d.actions if a.kind is ActionKind.SET_WARM] == [
        Action(ActionKind.SET_WARM, service="a", replicas=0)]


def test_decide_without_a_warm_pool_never_scales_one() -> None:
    settings = BurstSettings(handover_services={"a": 2})
    d = decide(_snapshot({"a": svc(10)}, closed=False), BurstState(mode=Mode.OPEN, changed_at=0.0), NOW, settings)
    assert not [a for a in d.actions if a.kind is ActionKind.SET_WARM] and d.warm == {}


# --------------------------------------------------------------------------- the stack

WARM_ON = {"warmPoolShare": 0.25}


def _warm(result: RunResult, name: str) -> Any:
    return result.one("Deployment", f"{name}-warm")


def test_no_warm_deployment_and_no_grant_by_default(prod: RunResult) -> None:
    assert [d.name for d in prod.by_kind("Deployment") if d.name.endswith("-warm")] == []
    names = prod.one("Role", "burst-controller-handover").inputs["rules"][0]["resourceNames"]
    assert not [n for n in names if n.endswith("-warm")]


@pytest.mark.parametrize("edit", [WARM_ON, {"warmPoolRampSeconds": 180}], ids=["share", "ramp"])
def test_warm_deployment_is_a_lowest_priority_placeholder_on_virtual_nodes(run_stack: Any,
                                                                           edit: dict[str, Any]) -> None:
    result = run_stack("prod", lambda c: c["gpu-cluster:burst"].update(edit))
    for name in ("sdxl-turbo", "llama-70b-chat", "whisper-large"):
        warm, main = _warm(result, name), result.one("Deployment", name)
        assert warm.inputs["spec"]["replicas"] == 0 and warm.ignore_changes == ["spec.replicas"]
        pod = warm.inputs["spec"]["template"]["spec"]
        main_pod = main.inputs["spec"]["template"]["spec"]
        assert pod["containers"] == main_pod["containers"]  # the service's own image and server
        # The lowest PriorityClass of the stack: below inference, so every replica outranks a placeholder.
        assert pod["priorityClassName"] == "standard" and main_pod["priorityClassName"] == "gpu-inference"
        terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
        assert {"key": "gpucluster.io/location", "operator": "In", "values": ["external"]} in \
            terms[0]["matchExpressions"]
        # It exists only while the burst is open: it does not tolerate the burst taint (only standby may).
        assert not [t for t in pod["tolerations"] if t["key"] == "gpucluster.io/burst"]
        assert pod["tolerations"] == main_pod["tolerations"]
        labels = warm.inputs["spec"]["template"]["metadata"]["labels"]
        assert labels["gpucluster.io/role"] == "warm" and labels["gpucluster.io/service"] == name
        # Neither its Service nor its PDB selects a placeholder (it serves nobody), nor does the main selector.
        for selector in (result.one("Service", name).inputs["spec"]["selector"],
                         result.one("PodDisruptionBudget", name).inputs["spec"]["selector"]["matchLabels"],
                         main.inputs["spec"]["selector"]["matchLabels"]):
            assert not all(labels.get(k) == v for k, v in selector.items()), selector
        main_labels = main.inputs["spec"]["template"]["metadata"]["labels"]
        assert not all(main_labels.get(k) == v for k, v in warm.inputs["spec"]["selector"]["matchLabels"].items())


def test_warm_rbac_is_the_scale_of_the_named_deployments_only(run_stack: Any) -> None:
    result = run_stack("prod", lambda c: c["gpu-cluster:burst"].update(WARM_ON))
    role = result.one("Role", "burst-controller-handover")
    services = ["sdxl-turbo", "llama-70b-chat", "whisper-large"]
    assert role.inputs["rules"] == [{
        "apiGroups": ["apps"], "resources": ["deployments/scale"],
        "resourceNames": [f"{s}-standby" for s in services] + [f"{s}-warm" for s in services],
        "verbs": ["get", "patch"],
    }]  # the warm pool evicts nothing: scaling its placeholders is all it needs
    import yaml
    data = yaml.safe_load(result.one("ConfigMap", "burst-controller-settings").inputs["data"]["settings.yaml"])
    assert (data["warm_pool_share"], data["warm_pool_ramp_seconds"]) == (0.25, 0.0)


def test_warm_pool_without_the_handover_renders_nothing(run_stack: Any) -> None:
    result = run_stack("local", lambda c: c["gpu-cluster:burst"].update({**WARM_ON, "handover": {"enabled": False}}))
    assert [d.name for d in result.by_kind("Deployment") if d.name.endswith("-warm")] == []


def test_warm_share_is_bounded_at_config_time(run_stack: Any) -> None:
    from components.config import ConfigError

    with pytest.raises(ConfigError, match="warmPoolShare"):
        run_stack("local", lambda c: c["gpu-cluster:burst"].update({"warmPoolShare": 1.5}))


# --------------------------------------------------------------------------- the shell (in-memory API)

def test_shell_scales_the_warm_deployment_and_counts_its_placeholders_apart() -> None:
    import random

    from agents.burst_controller.shell import NODES, PODS, BurstShell
    from agents.kit.port import DEPLOYMENTS
    from fakes.burst_objects import gpu_pod, onprem_node, virtual_node
    from fakes.kube_api import MemoryApi

    clock = [1_700_000_000.0]

    def now() -> float:
        return clock[0]

    settings = BurstSettings(open_below_free_gpus=1, close_at_free_gpus=8, open_hold_seconds=0,
                             close_hold_seconds=0, pending_grace_seconds=0, tick_seconds=5,
                             handover_services={"svc": 2}, warm_pool_share=0.25)
    api = MemoryApi(now)
    api.put(NODES, onprem_node("n1", 8))
    api.put(NODES, virtual_node("vk-a", burst_effect=None))  # the burst is open
    api.put(PODS, gpu_pod("train-0", 8, node="n1", workload="training", namespace="train"))
    for i in range(8):
        api.put(PODS, gpu_pod(f"svc-{i}", node="vk-a", service="svc"))
    api.put(DEPLOYMENTS, {"metadata": {"name": "svc-warm", "namespace": "inference"}, "spec": {"replicas": 0}})
    sh = BurstShell(settings, api, identity="a", clock=now, monotonic=now, sleep=lambda s: None,
                    rng=random.Random(7))
    assert sh.elector.step() and sh.relist(NODES) and sh.relist(PODS)
    first = sh.reconcile()
    assert first is not None and first.warm == {"svc": 2}  # ceil(0.25 x 8)
    assert api.scales["inference/svc-warm"] == 2
    assert sh.metrics.actions.labels("set_warm")._value.get() == 1
    # The placeholders: one running beside the replicas, one waiting for room. Neither is pending inference
    # (no reason to open anything) nor external GPUs in use (they leave at the close); both are warm_live.
    api.put(PODS, gpu_pod("svc-warm-0", node="vk-a", service="svc", warm=True))
    api.put(PODS, gpu_pod("svc-warm-1", service="svc", warm=True, unschedulable=True))
    assert sh.relist(PODS)
    snap = sh.view.snapshot()
    assert snap.services["svc"].warm_live == 2 and snap.services["svc"].main_live == 8
    assert snap.pending_inference_gpus == 0 and snap.virtual_nodes["vk-a"].gpus_in_use == 8
    clock[0] += 5
    second = sh.reconcile()
    assert second is not None and not [a for a in second.actions if a.kind is ActionKind.SET_WARM]
    assert api.count("patch:deployments/scale") == 1  # the one scale, nothing since
    # The burst closes (on-prem room back, nothing left external): the pool goes to zero.
    for key in ["train/train-0", *(f"inference/svc-{i}" for i in range(8))]:
        api.remove(PODS, key)
    assert sh.relist(PODS)
    for _ in range(3):
        clock[0] += 5
        assert sh.elector.step()  # renew the lease
        sh.reconcile()
    assert sh.state is not None and sh.state.mode is Mode.CLOSED
    assert api.scales["inference/svc-warm"] == 0


def test_shell_without_the_warm_deployment_reports_and_goes_on() -> None:
    import random

    from agents.burst_controller.shell import NODES, PODS, BurstShell
    from fakes.burst_objects import gpu_pod, onprem_node, virtual_node
    from fakes.kube_api import MemoryApi

    settings = BurstSettings(open_below_free_gpus=1, close_at_free_gpus=8, open_hold_seconds=0,
                             close_hold_seconds=0, pending_grace_seconds=0, handover_services={"svc": 2},
                             warm_pool_share=0.5)
    api = MemoryApi(lambda: 1_700_000_000.0)
    api.put(NODES, onprem_node("n1", 8))
    api.put(NODES, virtual_node("vk-a", burst_effect=None))
    api.put(PODS, gpu_pod("train-0", 8, node="n1", workload="training", namespace="train"))
    api.put(PODS, gpu_pod("svc-0", node="vk-a", service="svc"))
    sh = BurstShell(settings, api, identity="a", clock=lambda: 1_700_000_000.0, monotonic=lambda: 0.0,
                    sleep=lambda s: None, rng=random.Random(7))
    assert sh.elector.step() and sh.relist(NODES) and sh.relist(PODS)
    decision = sh.reconcile()
    assert decision is not None and decision.warm == {"svc": 1}
    assert "inference/svc-warm" not in api.scales
