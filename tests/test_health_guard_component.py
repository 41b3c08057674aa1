"""The health guard as rendered by the real program on the mock runtime: RBAC, Deployment, settings,
config mapping, tolerations of the workloads, dashboard."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from agents.health_guard.contract import HealthClass, parse_settings, xid_query
from components.dashboards import gpu_health
from components.mockrt import RecordingMocks, RecordingMonitor, RunResult, run_program
from components.training_job import TrainingJobArgs, volcano_job_spec
from tests.conftest import StackRunner, raw_stack
from tests.test_health_guard_xid_query import listed_xids
from tools.localcluster.plan import load_stack_config

P = "gpu-cluster:"
ROOT = Path(__file__).resolve().parents[1]
SYSTEM_NS = "gpu-system"


def pod_spec(result: RunResult, kind: str, name: str) -> dict[str, Any]:
    spec: dict[str, Any] = result.one(kind, name).inputs["spec"]["template"]["spec"]
    return spec


def settings_of(result: RunResult) -> dict[str, Any]:
    raw: dict[str, Any] = json.loads(result.one("ConfigMap", "health-guard-settings").inputs["data"]["settings.json"])
    return raw


def test_rbac_is_least_privilege(prod: RunResult) -> None:
    role = prod.one("ClusterRole", "gpu-cluster:health-guard")
    assert role.inputs["rules"] == [
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch", "patch"]},
        {"apiGroups": [""], "resources": ["nodes/status"], "verbs": ["patch"]},
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]},
    ]
    assert all("*" not in v for r in role.inputs["rules"] for v in r["verbs"] + r["resources"])
    binding = prod.one("ClusterRoleBinding", "gpu-cluster:health-guard")
    assert binding.inputs["subjects"] == [{"kind": "ServiceAccount", "name": "health-guard", "namespace": SYSTEM_NS}]
    events = prod.one("Role", "health-guard-node-events")
    assert events.metadata["namespace"] == "default"
    assert events.inputs["rules"] == [{"apiGroups": [""], "resources": ["events"], "verbs": ["create"]}]
    lease = prod.one("Role", "health-guard-lease")
    assert lease.metadata["namespace"] == SYSTEM_NS
    assert lease.inputs["rules"] == [
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "resourceNames": ["health-guard"],
         "verbs": ["get", "list", "watch", "update"]},
    ]
    evict = {r.metadata["namespace"]: r.inputs["rules"] for r in prod.by_kind("Role")
             if r.metadata["name"] == "health-guard-evict"}
    assert evict == {ns: [{"apiGroups": [""], "resources": ["pods/eviction"], "verbs": ["create"]}]
                     for ns in ("training", "inference")}


def test_deployment_two_replicas_one_leader_restricted(prod: RunResult) -> None:
    deployment = prod.one("Deployment", "health-guard")
    assert deployment.inputs["spec"]["replicas"] == 2
    spec = pod_spec(prod, "Deployment", "health-guard")
    assert spec["nodeSelector"] == {"gpucluster.io/pool": "system"}
    assert spec["priorityClassName"] == "platform-critical"
    (c,) = spec["containers"]
    assert c["image"] == "registry.gpucluster.io/platform/health-guard:0.1.0"
    assert c["args"] == ["--config=/etc/health-guard/settings.json", "--metrics-port=9316"]
    assert c["env"] == [{"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}]
    assert c["securityContext"]["runAsNonRoot"] is True and c["securityContext"]["readOnlyRootFilesystem"] is True
    assert deployment.metadata["annotations"]["checkov.io/skip1"].startswith("CKV_K8S_38=")


def test_a_drain_never_takes_both_replicas(prod: RunResult) -> None:
    pdb = prod.one("PodDisruptionBudget", "health-guard")
    assert pdb.metadata["namespace"] == "gpu-system"
    assert pdb.inputs["spec"]["minAvailable"] == 1
    # The budget covers exactly the Deployment's pods.
    selector = prod.one("Deployment", "health-guard").inputs["spec"]["selector"]["matchLabels"]
    assert pdb.inputs["spec"]["selector"]["matchLabels"] == selector
    assert selector["app.kubernetes.io/name"] == "health-guard"


def test_settings_are_the_agents_own_and_carry_the_documented_defaults(prod: RunResult) -> None:
    s = parse_settings(settings_of(prod), source="health-guard-settings")
    assert (s.label_prefix, s.namespace, s.node_selector) == ("gpucluster.io", SYSTEM_NS,
                                                              "gpucluster.io/location=onprem")
    assert (s.max_nodes_per_hour, s.max_nodes_quarantined, s.max_pool_percent_per_hour,
            s.max_pool_percent_quarantined, s.probation_seconds) == (2, 4, 10.0, 20.0, 1800)
    thermal = s.signal("gpu-temperature")
    assert (thermal.threshold, thermal.clear, thermal.hold_seconds, thermal.health_class) == (
        78.0, 73.0, 120, HealthClass.DEGRADED)
    assert 79 in listed_xids(s.signal("xid-fatal").query)


def test_stack_config_maps_signals_to_classes(run_stack: StackRunner) -> None:
    result = run_stack("local", lambda c: c.update({P + "observability": {"health": {
        "fatalXids": [79], "degradedXids": [94, 48],
        "signalClasses": {"nvlink-errors": "fatal", "ib-link-errors": "off"},
        "maxNodesQuarantined": 2, "probationSeconds": 60}}}))
    s = parse_settings(settings_of(result))
    assert s.signal("xid-fatal").query == xid_query([79])
    assert listed_xids(s.signal("xid-degraded").query) == [48, 94]
    assert s.signal("nvlink-errors").health_class is HealthClass.FATAL
    assert "ib-link-errors" not in {x.name for x in s.signals}
    assert (s.max_nodes_quarantined, s.probation_seconds) == (2, 60)


def test_the_health_section_is_the_guards_own_model_spelled_once(run_stack: StackRunner) -> None:
    """`observability.health` is the guard's ``GuardTunables`` plus the XID lists and `signalClasses`: every one of
    its keys set in the stack reaches the guard's file with the value set, and neither side restates a bound."""
    from agents.health_guard.contract import GuardTunables
    from components.config.observability import HealthGuardConfig

    assert issubclass(HealthGuardConfig, GuardTunables)
    chosen = GuardTunables(stale_after_seconds=45, probation_seconds=90, max_nodes_per_hour=5,
                           max_nodes_quarantined=7, max_pool_percent_per_hour=12.5, max_pool_percent_quarantined=30.0,
                           flap_limit=4, flap_window_seconds=3600, evict_inference_on_fatal=False,
                           switch_fault_min_nodes=5, switch_fault_leaf_percent=25.0)
    assert chosen.tunables() != GuardTunables().tunables()
    stack_keys = HealthGuardConfig.model_validate(chosen.tunables()).model_dump(by_alias=True)
    result = run_stack("local", lambda c: c.update({P + "observability": {"health": {
        k: stack_keys[k] for k in (HealthGuardConfig.model_fields[f].alias or f for f in GuardTunables.model_fields)
    }}}))
    deployed = parse_settings(settings_of(result))
    assert GuardTunables.model_validate(deployed.tunables()) == chosen
    # The file's keys are sorted: moving a key between the two models never changes what is deployed.
    raw = result.one("ConfigMap", "health-guard-settings").inputs["data"]["settings.json"]
    assert list(json.loads(raw)) == sorted(json.loads(raw))


@pytest.mark.parametrize(("health", "message"), [
    ({"fatalXids": [79], "degradedXids": [79]}, "XIDs [79] are in both fatalXids and degradedXids"),
    ({"signalClasses": {"gpu-temprature": "fatal"}}, "unknown signal(s) gpu-temprature"),
    ({"maxPoolPercentPerHour": 150}, "maxPoolPercentPerHour"),
    ({"staleAfterSeconds": 5}, "staleAfterSeconds"),
])
def test_bad_health_config_is_refused_naming_the_key(health: dict[str, Any], message: str) -> None:
    config, secrets = raw_stack("local")
    config[P + "observability"] = {"health": health}
    with pytest.raises(Exception) as caught:
        run_program("local", config, secrets, monitor=RecordingMonitor(RecordingMocks()))
    assert message in str(caught.value)


def test_follows_the_label_prefix(run_stack: StackRunner) -> None:
    result = run_stack("local", lambda c: c.update({P + "labelPrefix": "ml.example.org"}))
    s = parse_settings(settings_of(result))
    assert (s.names.taint, s.names.repaired, s.node_selector) == (
        "ml.example.org/gpu-health", "ml.example.org/gpu-repaired", "ml.example.org/location=onprem")
    tolerations = pod_spec(result, "DaemonSet", "dcgm-exporter")["tolerations"]
    assert {"key": "ml.example.org/gpu-health", "operator": "Exists", "effect": "NoSchedule"} in tolerations
    assert all(t["key"].startswith("ml.example.org/") for t in tolerations)


def test_inference_tolerates_degraded_only_and_training_nothing(prod: RunResult, local: RunResult) -> None:
    for result in (prod, local):
        for kind in ("Deployment",):
            for r in result.by_kind(kind):
                health = [t for t in pod_spec(result, kind, r.name).get("tolerations", [])
                          if t.get("key") == "gpucluster.io/gpu-health"]
                if r.metadata.get("namespace") == "inference":
                    assert health == [{"key": "gpucluster.io/gpu-health", "operator": "Equal", "value": "degraded",
                                       "effect": "NoSchedule"}], r.name
    cfg = load_stack_config(ROOT, "local")
    spec = volcano_job_spec(TrainingJobArgs.from_config(cfg, cfg.training.jobs[0]))
    for task in spec["tasks"]:
        keys = [t.get("key") for t in task["template"]["spec"].get("tolerations", [])]
        assert "gpucluster.io/gpu-health" not in keys


def test_guard_can_be_turned_off(run_stack: StackRunner) -> None:
    result = run_stack("local", lambda c: c.update({P + "observability": {"healthGuard": False}}))
    assert "health-guard" not in [r.metadata["name"] for r in result.by_kind("Deployment")]
    assert result.one("PrometheusRule", "gpu-alerts")


def test_health_dashboard_configmap_and_valid_queries(prod: RunResult, tmp_path: Path) -> None:
    cm = prod.one("ConfigMap", "gpu-health-dashboard")
    assert cm.metadata["labels"]["grafana_dashboard"] == "1"
    dashboard = json.loads(cm.inputs["data"]["gpu-health.json"])
    titles = [p["title"] for p in dashboard["panels"]]
    assert {"Gang restarts per pool (per hour)", "Gang restarts per job (last 24 h)",
            "Mean time between failures per pool", "Guard breaker"} <= set(titles)
    promtool = shutil.which("promtool")
    assert promtool, "promtool missing: run `make observability-tools`"
    exprs = [t["expr"] for p in gpu_health.build()["panels"] for t in p["targets"]]
    path = tmp_path / "dashboard.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "d", "rules": [
        {"record": f"dashboard:q{i}", "expr": e} for i, e in enumerate(exprs)]}]}))
    check = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr


def test_every_replicated_agent_spreads_over_nodes_and_its_budget_lets_a_stuck_replica_go(prod: RunResult) -> None:
    """The guard's two replicas got no anti-affinity while its siblings had it; a stuck standby blocked drains."""
    spread = {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{
        "weight": 100, "podAffinityTerm": {"topologyKey": "kubernetes.io/hostname", "labelSelector": {}}}]}}
    for name in ("health-guard", "burst-controller"):
        deployment = prod.one("Deployment", name)
        spec = deployment.inputs["spec"]
        assert spec["replicas"] == 2, name
        affinity = spec["template"]["spec"]["affinity"]
        term = affinity["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"][0]
        assert term["podAffinityTerm"]["labelSelector"] == {"matchLabels": spec["selector"]["matchLabels"]}, name
        assert {**term, "podAffinityTerm": {**term["podAffinityTerm"], "labelSelector": {}}} == \
            spread["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"][0], name
    budgets = prod.by_kind("PodDisruptionBudget")
    agents = [b for b in budgets if b.metadata.get("namespace") == "gpu-system"]
    assert {b.metadata["name"] for b in agents} >= {"health-guard", "burst-controller"}
    stuck = [b.metadata["name"] for b in budgets if b.inputs["spec"].get("unhealthyPodEvictionPolicy") != "AlwaysAllow"]
    assert stuck == []
