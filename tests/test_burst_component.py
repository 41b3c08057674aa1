"""The burst controller's deployment: settings ConfigMap, leader-elected replicas, exact RBAC, metrics."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import yaml

from agents.burst_controller.contract import BurstSettings
from components.config import parse_config
from components.images import agent_image
from components.mockrt import RunResult, config_error, raw_from_stack

NS = "gpu-system"


def settings(result: RunResult) -> BurstSettings:
    cm = result.one("ConfigMap", "burst-controller-settings")
    data = yaml.safe_load(cm.inputs["data"]["settings.yaml"])
    return BurstSettings.from_mapping(data, source="configmap")


def test_settings_map_the_stack_burst_section(prod: RunResult) -> None:
    s = settings(prod)
    assert (s.taint_key, s.taint_value) == ("gpucluster.io/burst", "closed")
    assert (s.open_below_free_gpus, s.close_at_free_gpus) == (16, 64)
    assert (s.open_hold_seconds, s.close_hold_seconds, s.pending_grace_seconds) == (60.0, 900.0, 5.0)
    assert (s.external_deletion_cost, s.resync_seconds, s.stale_after_seconds) == (-100, 30.0, 120.0)
    assert (s.namespace, s.lease_name) == (NS, "burst-controller")
    assert s.gpu_resource == "nvidia.com/gpu"
    # Scale-down removes the dearer provider's replicas first (lambda-east 2.99 USD/GPU·h, dr-cluster 1.50).
    assert s.provider_deletion_costs == {"lambda-east": -150, "dr-cluster": -100}


def test_local_thresholds_follow_the_local_stack(local: RunResult) -> None:
    s = settings(local)
    # Two prices: the dearer provider's replicas are scaled down first.
    assert s.provider_deletion_costs == {"local-cloud": -100, "backup-cloud": -150}
    assert (s.open_below_free_gpus, s.close_at_free_gpus, s.open_hold_seconds, s.close_hold_seconds) == (
        1, 4, 5.0, 20.0)


def test_two_replicas_one_leader(prod: RunResult) -> None:
    d = prod.one("Deployment", "burst-controller")
    spec = d.inputs["spec"]
    assert spec["replicas"] == 2
    pod = spec["template"]["spec"]
    c = pod["containers"][0]
    assert c["image"] == agent_image("burst-controller")
    assert c["args"] == ["--config=/etc/burst-controller/settings.yaml", "--metrics-port=9102"]
    assert c["env"][0]["name"] == "POD_NAME"
    assert pod["priorityClassName"] == "platform-critical"
    assert pod["nodeSelector"] == {"gpucluster.io/pool": "system"}
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert c["securityContext"] == {
        "allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True, "runAsNonRoot": True,
        "privileged": False, "capabilities": {"drop": ["ALL"]}, "seccompProfile": {"type": "RuntimeDefault"},
    }
    assert prod.one("PodDisruptionBudget", "burst-controller").inputs["spec"]["minAvailable"] == 1
    # It patches nodes and pods, so it keeps its token; checkov's token check is skipped here only, with the reason.
    assert "automountServiceAccountToken" not in pod
    assert d.metadata["annotations"]["checkov.io/skip1"].startswith("CKV_K8S_38=")


def test_cluster_rbac_taints_nodes_and_only_reads_pods(prod: RunResult) -> None:
    role = prod.one("ClusterRole", "gpu-cluster:burst-controller")
    assert role.inputs["rules"] == [
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch", "patch"]},
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "watch"]},
    ]


def test_namespace_rbac_is_its_lease_and_events(prod: RunResult) -> None:
    role = prod.one("Role", "burst-controller")
    assert role.metadata["namespace"] == NS
    assert role.inputs["rules"] == [
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "resourceNames": ["burst-controller"],
         "verbs": ["get", "list", "watch", "update"]},
        {"apiGroups": [""], "resources": ["events"], "verbs": ["create", "patch"]},
    ]
    # Its Events about virtual nodes (BurstOpened, BurstClosed) go where the API server accepts Events about a
    # cluster-scoped object: default, where it may only create Events.
    events = prod.one("Role", "burst-controller-node-events")
    assert events.metadata["namespace"] == "default"
    assert events.inputs["rules"] == [{"apiGroups": [""], "resources": ["events"], "verbs": ["create"]}]
    for name in ("burst-controller", "burst-controller-node-events"):
        binding = prod.one("RoleBinding", name)
        assert binding.inputs["subjects"] == [{"kind": "ServiceAccount", "name": "burst-controller", "namespace": NS}]


def test_metrics_service_and_servicemonitor(prod: RunResult) -> None:
    svc = prod.one("Service", "burst-controller-metrics")
    assert svc.inputs["spec"]["ports"] == [{"name": "metrics", "port": 9102, "targetPort": "metrics"}]
    sm = prod.one("ServiceMonitor", "burst-controller")
    assert sm.inputs["spec"] == {
        "selector": {"matchLabels": svc.inputs["spec"]["selector"]},
        "endpoints": [{"port": "metrics", "interval": "15s", "path": "/metrics", "honorLabels": True}],
    }


def _error(edit: Any) -> str:
    return config_error(edit, "local")


def test_hysteresis_band_must_be_open() -> None:
    message = _error(lambda raw: raw["burst"].update(closeAtFreeGpus=1))
    assert "Pulumi.local.yaml" in message
    assert "burst: closeAtFreeGpus: must exceed openBelowFreeGpus (1) or the taint flaps, got 1" in message


def test_deletion_cost_must_be_negative() -> None:
    message = _error(lambda raw: raw["burst"].update(externalDeletionCost=5))
    # A rule on one key is reported at that key's path (the section embeds the agent's model, field rules and all).
    assert "burst.externalDeletionCost: must be negative so HPA scale-down removes external replicas" in message


def test_close_threshold_must_be_reachable() -> None:
    message = _error(lambda raw: raw["burst"].update(closeAtFreeGpus=64))
    assert "burst.closeAtFreeGpus: can never be reached: the stack has only 32 on-prem GPUs (got 64)" in message


def test_staleness_must_exceed_the_watch_timeout() -> None:
    message = _error(lambda raw: raw["burst"].update(staleAfterSeconds=30))
    assert "burst: staleAfterSeconds: must exceed watchTimeoutSeconds (60)" in message


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        ({"tickSeconds": 61}, "burst.tickSeconds: Input should be less than or equal to 60"),
        ({"staleAfterSeconds": 901}, "burst.staleAfterSeconds: Input should be less than or equal to 900"),
        ({"tickSeconds": 60, "staleAfterSeconds": 60}, "burst: tickSeconds: must be below staleAfterSeconds (60)"),
    ],
)
def test_tick_and_staleness_are_bounded_at_config_time(edit: dict[str, int], expected: str) -> None:
    message = _error(lambda raw: raw["burst"].update(edit))
    assert "Pulumi.local.yaml" in message and expected in message


def test_tick_reaches_the_agent(run_stack: Any) -> None:
    result = run_stack("local", lambda c: c["gpu-cluster:burst"].update({"tickSeconds": 2}))
    assert settings(result).tick_seconds == 2.0


def test_stack_defaults_are_the_agent_defaults() -> None:
    """One set of numbers: an unset stack key gives the agent exactly its own default."""
    from components.burst_controller import settings_from_config

    raw = copy.deepcopy(raw_from_stack("local"))
    del raw["burst"]  # every burst key at its default
    cfg = parse_config(raw, "Pulumi.local.yaml")
    deployed, agent = settings_from_config(cfg), BurstSettings()
    same = ("open_below_free_gpus", "close_at_free_gpus", "open_hold_seconds", "close_hold_seconds",
            "pending_grace_seconds", "external_deletion_cost", "resync_seconds", "stale_after_seconds",
            "tick_seconds", "taint_value", "handover", "taint_key")
    assert {k: getattr(deployed, k) for k in same} == {k: getattr(agent, k) for k in same}
    assert (deployed.open_below_free_gpus, deployed.close_at_free_gpus, deployed.resync_seconds) == (8, 32, 30.0)


def test_the_simulator_runs_the_settings_the_stack_deploys(prod: RunResult) -> None:
    from bench.sim.run import load_stack

    assert load_stack("prod").settings == settings(prod)


def test_handover_settings_name_every_service_with_its_minimum(prod: RunResult, local: RunResult) -> None:
    assert settings(prod).handover_services == {"sdxl-turbo": 8, "llama-70b-chat": 4, "whisper-large": 2}
    assert settings(local).handover_services == {"sdxl-turbo": 4}
    assert settings(local).inference_namespace == "inference"
    assert settings(prod).handover.timeout_seconds == 300.0


def test_the_deployed_settings_name_the_pools_inference_is_confined_to(prod: RunResult, run_stack: Any) -> None:
    """Free GPUs count toward keeping the burst closed only where some service may run."""
    assert settings(prod).inference_pools == ()  # every prod service may run in either pool

    def confine(config: dict[str, Any]) -> None:
        for service in config["gpu-cluster:inference"]["services"]:
            service["pool"] = "h200-b" if service["name"] == "whisper-large" else "h100-a"

    assert settings(run_stack("prod", confine)).inference_pools == ("h100-a", "h200-b")

    def one_pool(config: dict[str, Any]) -> None:
        for service in config["gpu-cluster:inference"]["services"]:
            service["pool"] = "h100-a"

    assert settings(run_stack("prod", one_pool)).inference_pools == ("h100-a",)


def test_handover_rbac_is_the_scale_of_the_named_standbys_and_evictions_only(prod: RunResult) -> None:
    role = prod.one("Role", "burst-controller-handover")
    assert role.metadata["namespace"] == "inference"
    assert role.inputs["rules"] == [{
        "apiGroups": ["apps"], "resources": ["deployments/scale"],
        "resourceNames": ["sdxl-turbo-standby", "llama-70b-chat-standby", "whisper-large-standby"],
        "verbs": ["get", "patch"],
    }]  # no eviction: the return bridge and the clearing of a stalled gang's room are both off by default
    binding = prod.one("RoleBinding", "burst-controller-handover")
    assert binding.inputs["subjects"] == [{"kind": "ServiceAccount", "name": "burst-controller", "namespace": NS}]


def test_handover_off_leaves_no_grant_and_no_services(run_stack: Any) -> None:
    result = run_stack("local", lambda c: c["gpu-cluster:burst"].update({"handover": {"enabled": False}}))
    assert settings(result).handover_services == {}
    assert [r for r in result.by_kind("Role") if r.metadata.get("name") == "burst-controller-handover"] == []


def test_handover_timeout_is_bounded() -> None:
    message = _error(lambda raw: raw["burst"].update(handover={"timeoutSeconds": 0}))
    assert "burst.handover.timeoutSeconds" in message


def test_the_handover_section_is_the_controllers_own_model_spelled_once(run_stack: Any) -> None:
    """`burst.handover` is the agent's ``HandoverTunables`` plus `enabled`: what the stack sets reaches the
    controller's file as the same nested keys, and no flat second spelling of them is left in it."""
    from agents.burst_controller.contract import HandoverTunables
    from components.config.burst import Handover

    assert issubclass(Handover, HandoverTunables)
    chosen = {"timeoutSeconds": 120, "cover": "minimum", "sizing": "displaced", "returnBatch": 8,
              "rampSeconds": 90, "rampWindowSeconds": 240}
    result = run_stack("local", lambda c: c["gpu-cluster:burst"].update({"handover": chosen}))
    deployed = settings(result)
    assert deployed.handover == HandoverTunables(timeout_seconds=120, cover="minimum", sizing="displaced",
                                                 return_batch=8, ramp_seconds=90, ramp_window_seconds=240)
    document = yaml.safe_load(result.one("ConfigMap", "burst-controller-settings").inputs["data"]["settings.yaml"])
    assert set(document["handover"]) == set(HandoverTunables.model_fields)
    assert [k for k in document if k.startswith("handover_")] == ["handover_services"]


def test_the_deployed_settings_name_every_providers_own_taint(prod: RunResult) -> None:
    """The controller restores a provider's taint only if the stack told it which one (key=value per provider)."""
    deployed = settings(prod).provider_taints
    cfg = parse_config(raw_from_stack("prod"), "Pulumi.prod.yaml")
    assert sorted(deployed) == sorted(p.name for p in cfg.providers) and deployed
    from components.providers import LIQO_TAINT

    expected = {"virtual-kubelet": lambda name: f"virtual-kubelet.io/provider={name}",
                "liqo": lambda name: f"{LIQO_TAINT}=true"}
    assert {p.name: deployed[p.name] for p in cfg.providers} == {
        p.name: expected[p.kind](p.name) for p in cfg.providers}


def test_summary_names_each_providers_deletion_cost() -> None:
    from components.burst_controller import external_pods_row
    from components.config import parse_config
    from components.mockrt import raw_from_stack

    prod = parse_config(raw_from_stack("prod"), "Pulumi.prod.yaml")
    assert external_pods_row(prod) == (
        "pod-deletion-cost lambda-east -150, dr-cluster -100 (scaled down first, the dearest provider first)")
    local = parse_config(raw_from_stack("local"), "Pulumi.local.yaml")
    assert external_pods_row(local) == (
        "pod-deletion-cost backup-cloud -150, local-cloud -100 (scaled down first, the dearest provider first)")
    # One provider: nothing to rank.
    single = raw_from_stack("local")
    single["providers"] = single["providers"][:1]
    assert external_pods_row(parse_config(single, "Pulumi.local.yaml")) == "pod-deletion-cost -100 (scaled down first)"
