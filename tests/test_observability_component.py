"""The observability component as rendered by the real program on the mock runtime."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from components import images
from components.alert_rules import build_rule_spec
from components.config import ConfigError, parse_config
from components.dashboards import gpu_fleet
from components.dashboards.grafana import DATASOURCE, FLEET_UID, HEALTH_UID, TOP
from components.dcgm_counters import parse as parse_counters
from components.mockrt import RecordingMocks, RecordingMonitor, RunResult, raw_from_stack, run_program
from components.observability import alert_thresholds, kube_state_label
from tests.conftest import StackRunner, raw_stack
from tests.dashboard_support import boards, queries, query_variables, references, selectors

P = "gpu-cluster:"
SYSTEM_NS = "gpu-system"
TELEMETRY_NS = "gpu-telemetry"


def pod_spec(result: RunResult, kind: str, name: str) -> dict[str, Any]:
    spec: dict[str, Any] = result.one(kind, name).inputs["spec"]["template"]["spec"]
    return spec


def container(result: RunResult, kind: str, name: str) -> dict[str, Any]:
    (only,) = pod_spec(result, kind, name)["containers"]
    return dict(only)


def env(c: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in c["env"]}


# ---- DCGM exporter ---------------------------------------------------------------------------------


def test_dcgm_exporter_daemonset(prod: RunResult) -> None:
    ds = prod.one("DaemonSet", "dcgm-exporter")
    assert ds.metadata["namespace"] == TELEMETRY_NS
    spec = pod_spec(prod, "DaemonSet", "dcgm-exporter")
    c = container(prod, "DaemonSet", "dcgm-exporter")
    assert c["image"] == images.DCGM_EXPORTER == "nvcr.io/nvidia/k8s/dcgm-exporter:4.2.3-4.1.3-ubuntu22.04"
    assert env(c) == {
        "DCGM_EXPORTER_COLLECTORS": "/etc/dcgm-exporter/custom/counters.csv",
        "DCGM_EXPORTER_INTERVAL": "5000",
        "DCGM_EXPORTER_LISTEN": ":9400",
        "DCGM_EXPORTER_KUBERNETES": "true",
        "NVIDIA_VISIBLE_DEVICES": "all",
        "NODE_NAME": {"fieldRef": {"fieldPath": "spec.nodeName"}},
    }
    assert c["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["SYS_ADMIN"]}
    assert c["securityContext"]["privileged"] is False
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    mounts = {m["name"]: m for m in c["volumeMounts"]}
    assert mounts["pod-resources"] == {
        "name": "pod-resources",
        "mountPath": "/var/lib/kubelet/pod-resources",
        "readOnly": True,
    }
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes["pod-resources"]["hostPath"] == {"path": "/var/lib/kubelet/pod-resources", "type": "Directory"}
    host_paths = sorted(v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v)
    assert host_paths == ["/var/lib/kubelet/pod-resources"]
    assert spec["priorityClassName"] == "platform-critical"
    assert spec["runtimeClassName"] == "nvidia"
    assert spec.get("hostNetwork") is None and spec.get("hostPID") is None
    assert spec["automountServiceAccountToken"] is False
    # Root and SYS_ADMIN are checkov exceptions on this DaemonSet only, each with its reason.
    skipped = sorted(v.split("=", 1)[0] for k, v in ds.metadata["annotations"].items() if k.startswith("checkov"))
    assert skipped == ["CKV_K8S_23", "CKV_K8S_25", "CKV_K8S_39", "CKV_K8S_40"]
    assert ds.metadata["annotations"]["kube-score/ignore"] == (
        "container-security-context-user-group-id,pod-probes-identical")


def test_dcgm_checkov_skips_point_at_the_allow_list_the_pack_enforces(prod: RunResult) -> None:
    from policies.rules.allow_lists import privileged_agents

    ds = prod.one("DaemonSet", "dcgm-exporter")
    reasons = [v.split("=", 1)[1] for k, v in ds.metadata["annotations"].items() if k.startswith("checkov")]
    cited = {r.split("allow-listed in ", 1)[1].rstrip(")") for r in reasons if "allow-listed in " in r}
    assert cited == {"policies/rules/allow_lists.py"}
    assert (Path(__file__).parent.parent / "policies/rules/allow_lists.py").is_file()
    # What the skips excuse (root, SYS_ADMIN) is what that list grants dcgm-exporter, and no more.
    [dcgm] = [a for a in privileged_agents(TELEMETRY_NS) if a.name == "dcgm-exporter"]
    assert dcgm.run_as_root and dcgm.capabilities == {"SYS_ADMIN"}


def test_gpu_daemonsets_run_on_gpu_pools_only_and_tolerate_their_taints(prod: RunResult) -> None:
    for name in ("dcgm-exporter", "ib-exporter"):
        spec = pod_spec(prod, "DaemonSet", name)
        terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        assert terms["nodeSelectorTerms"] == [
            {
                "matchExpressions": [
                    {"key": "gpucluster.io/pool", "operator": "In", "values": ["h100-a", "h200-b"]},
                    {"key": "gpucluster.io/location", "operator": "In", "values": ["onprem"]},
                ]
            }
        ], name
        assert spec["tolerations"] == [
            {"key": "gpucluster.io/pool", "operator": "Equal", "value": "h100-a", "effect": "NoSchedule"},
            {"key": "gpucluster.io/pool", "operator": "Equal", "value": "h200-b", "effect": "NoSchedule"},
            {"key": "gpucluster.io/switch-fault", "operator": "Exists", "effect": "NoSchedule"},
            {"key": "gpucluster.io/gpu-health", "operator": "Exists", "effect": "NoSchedule"},
            # A node the burst handover cleared for waiting training is still measured.
            {"key": "gpucluster.io/reserved", "operator": "Exists", "effect": "NoSchedule"},
            # The prod pools keep warm spares, watched like any node.
            {"key": "gpucluster.io/spare", "operator": "Exists", "effect": "NoSchedule"},
        ], name


def test_dcgm_counters_configmap_is_our_csv(prod: RunResult) -> None:
    cm = prod.one("ConfigMap", "dcgm-exporter-counters")
    fields = {c.field for c in parse_counters(cm.inputs["data"]["counters.csv"])}
    assert {"DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "DCGM_FI_PROF_SM_OCCUPANCY"} <= fields
    assert len(fields) == 26


def test_dcgm_interval_comes_from_the_stack(run_stack: StackRunner) -> None:
    result = run_stack("local", lambda c: c.update({P + "observability": {"dcgmIntervalMs": 10000}}))
    assert env(container(result, "DaemonSet", "dcgm-exporter"))["DCGM_EXPORTER_INTERVAL"] == "10000"


# ---- InfiniBand exporter ---------------------------------------------------------------------------


def test_ib_exporter_daemonset_is_unprivileged_with_read_only_sys(prod: RunResult) -> None:
    spec = pod_spec(prod, "DaemonSet", "ib-exporter")
    c = container(prod, "DaemonSet", "ib-exporter")
    assert c["image"] == "registry.gpucluster.io/platform/ib-exporter:0.1.0"
    assert c["args"] == ["--sysfs-root=/host/sys", "--listen-address=0.0.0.0:9315"]
    assert c["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
        "privileged": False,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    assert spec["securityContext"]["runAsUser"] == 65532
    assert c["volumeMounts"] == [{"name": "sys", "mountPath": "/host/sys", "readOnly": True}]
    assert spec["volumes"] == [{"name": "sys", "hostPath": {"path": "/sys", "type": "Directory"}}]
    assert spec["automountServiceAccountToken"] is False


def test_ib_exporter_can_be_turned_off(run_stack: StackRunner) -> None:
    result = run_stack("local", lambda c: c.update({P + "observability": {"ibExporter": False}}))
    assert [r.metadata["name"] for r in result.by_kind("DaemonSet")] == ["dcgm-exporter"]
    assert {r.metadata["name"] for r in result.by_kind("ServiceMonitor")} >= {"dcgm-exporter", "health-guard"}
    assert "ib-exporter" not in {r.metadata["name"] for r in result.by_kind("ServiceMonitor")}


# ---- scraping --------------------------------------------------------------------------------------


def test_exporter_monitors_add_the_node_label_and_dcgm_keeps_the_gpus_workload(prod: RunResult) -> None:
    node = {"sourceLabels": ["__meta_kubernetes_pod_node_name"], "targetLabel": "node", "action": "replace"}
    workload = [
        {"sourceLabels": ["__meta_kubernetes_pod_name"], "targetLabel": "exporter_pod", "action": "replace"},
        {"regex": "namespace|pod|container", "action": "labeldrop"},
    ]
    for name, port, relabelings in (("dcgm-exporter", 9400, [node, *workload]), ("ib-exporter", 9315, [node])):
        sm = prod.one("ServiceMonitor", name)
        assert sm.inputs["apiVersion"] == "monitoring.coreos.com/v1"
        (endpoint,) = sm.inputs["spec"]["endpoints"]
        assert endpoint == {"port": "metrics", "path": "/metrics", "interval": "15s", "relabelings": relabelings}
        service = prod.one("Service", f"{name}-metrics")
        assert service.inputs["spec"]["ports"] == [{"name": "metrics", "port": port, "targetPort": "metrics"}]
        assert service.inputs["spec"]["selector"] == sm.inputs["spec"]["selector"]["matchLabels"]


def test_the_guard_is_scraped_like_every_agent_and_keeps_its_urns(prod: RunResult) -> None:
    """``honorLabels``: the guard's ``node``/``namespace``/``job`` name what it acts on, not its own pod."""
    sm = prod.one("ServiceMonitor", "health-guard")
    assert sm.inputs["spec"]["endpoints"] == [{"port": "metrics", "interval": "15s", "path": "/metrics",
                                               "honorLabels": True}]
    (stack,) = prod.by_type("gpu-cluster:observability:ObservabilityStack")
    for registered in (sm, prod.one("Service", "health-guard-metrics")):
        # Created by this component before the agent builder: the alias keeps `pulumi up` from replacing them.
        assert registered.aliases == [f"parent:{stack.urn}"], registered.urn


def test_monitor_labels_reach_service_monitors_and_rules(run_stack: StackRunner) -> None:
    result = run_stack(
        "local", lambda c: c.update({P + "observability": {"monitorLabels": {"release": "kube-prometheus"}}})
    )
    assert result.one("ServiceMonitor", "ib-exporter").metadata["labels"]["release"] == "kube-prometheus"
    assert result.one("PrometheusRule", "gpu-alerts").metadata["labels"]["release"] == "kube-prometheus"


# ---- alert rules -----------------------------------------------------------------------------------


def test_prometheus_rule_is_the_tested_rule_set(prod: RunResult) -> None:
    rule = prod.one("PrometheusRule", "gpu-alerts")
    assert rule.metadata["namespace"] == "monitoring"
    cfg = parse_config(raw_from_stack("prod"), "Pulumi.prod.yaml")
    assert rule.inputs["spec"] == build_rule_spec(alert_thresholds(cfg))
    rules = {r["alert"]: r for g in rule.inputs["spec"]["groups"] for r in g["rules"]}
    assert (rules["GpuTemperatureCritical"]["expr"], rules["GpuTemperatureCritical"]["for"]) == (
        "DCGM_FI_DEV_GPU_TEMP >= 78",
        "2m",
    )
    assert rules["CheckpointOverBudget"]["expr"] == (
        "max by (namespace, job_name) (gpucluster_checkpoint_duration_seconds) > 30")
    assert rules["TrainingHeartbeatStalled"]["expr"] == (
        "max by (namespace, job_name) (changes(training_step_heartbeat_timestamp_seconds[10m])) == 0 "
        "and on (namespace, job_name) max by (namespace, job_name) "
        "(training_step_heartbeat_timestamp_seconds offset 10m)"
    )
    assert 'kube_pod_labels{label_gpucluster_io_workload="training"}' in rules["TrainingTensorCoresIdle"]["expr"]
    assert rules["InfinibandRateBelowNominal"]["expr"].startswith("infiniband_rate_bytes_per_second < 50000000000 ")


def test_thermal_threshold_flows_from_the_stack_into_rules_guard_and_dashboard(run_stack: StackRunner) -> None:
    result = run_stack(
        "local",
        lambda c: c.update({P + "observability": {"thermalThresholdCelsius": 75, "thermalHoldSeconds": 60}}),
    )
    rules = {
        r["alert"]: r for g in result.one("PrometheusRule", "gpu-alerts").inputs["spec"]["groups"] for r in g["rules"]
    }
    assert (rules["GpuTemperatureCritical"]["expr"], rules["GpuTemperatureCritical"]["for"]) == (
        "DCGM_FI_DEV_GPU_TEMP >= 75",
        "1m",
    )
    settings = json.loads(result.one("ConfigMap", "health-guard-settings").inputs["data"]["settings.json"])
    (thermal,) = [s for s in settings["signals"] if s["name"] == "gpu-temperature"]
    assert (thermal["threshold"], thermal["clear_below"], thermal["hold_seconds"]) == (75.0, 70.0, 60)
    dashboard = json.loads(result.one("ConfigMap", "gpu-fleet-dashboard").inputs["data"]["gpu-fleet.json"])
    steps = dashboard["panels"][0]["fieldConfig"]["defaults"]["thresholds"]["steps"]
    assert steps == [
        {"color": "green", "value": None},
        {"color": "orange", "value": 70.0},
        {"color": "red", "value": 75.0},
    ]


def test_promtool_accepts_the_deployed_rules(prod: RunResult, tmp_path: Path) -> None:
    promtool = shutil.which("promtool")
    assert promtool, "promtool missing: run `make observability-tools`"
    path = tmp_path / "rules.yml"
    path.write_text(yaml.safe_dump(prod.one("PrometheusRule", "gpu-alerts").inputs["spec"]))
    result = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


# ---- dashboard -------------------------------------------------------------------------------------


def test_dashboard_configmap_for_the_grafana_sidecar(prod: RunResult) -> None:
    cm = prod.one("ConfigMap", "gpu-fleet-dashboard")
    assert cm.metadata["namespace"] == "monitoring"
    assert cm.metadata["labels"]["grafana_dashboard"] == "1"
    dashboard = json.loads(cm.inputs["data"]["gpu-fleet.json"])
    assert dashboard["uid"] == "gpucluster-gpu-fleet"
    assert [p["title"] for p in dashboard["panels"]] == [
        "GPU temperature per node / GPU",
        "Tensor-core activity per training pod",
        "InfiniBand throughput per port",
        "InfiniBand transmit wait per port",
        "InfiniBand errors per port",
        "NVLink errors per GPU",
        "Burst state: external nodes open to inference",
        "Nodes out of service (GPU health)",
        "Hottest GPUs now",
    ]
    burst = dashboard["panels"][6]["targets"][0]["expr"]
    assert 'kube_node_spec_taint{key="gpucluster.io/burst"}' in burst


def test_dashboard_queries_are_valid_promql(tmp_path: Path) -> None:
    """promtool has no expression checker; a recording-rule file made of the panel queries is checked instead."""
    promtool = shutil.which("promtool")
    assert promtool, "promtool missing: run `make observability-tools`"
    board = gpu_fleet.build()
    exprs = [t["expr"] for p in board["panels"] for t in p["targets"]]
    assert len(exprs) == 18
    exprs += [v["query"].removeprefix("query_result(").removesuffix(")") for v in query_variables(board)
              if v["query"].startswith("query_result(")]
    rules = {
        "groups": [
            {"name": "dashboard", "rules": [{"record": f"dashboard:q{i}", "expr": e} for i, e in enumerate(exprs)]}
        ]
    }
    path = tmp_path / "dashboard.yml"
    path.write_text(yaml.safe_dump(rules))
    result = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


#: The variable-bearing labels each metric arrives with (tests/test_scrape_path.py checks the panels on the
#: labels that really arrive): dcgm-exporter's and the ib-exporter's series get ``node`` from the scrape path but
#: no pool; the guard's name a pool, a quarantined node, a restarted gang (``job``).
NODE_METRICS = ("DCGM_", "infiniband_", "gpucluster_health_node_quarantined")
POOL_METRICS = ("gpucluster_health_nodes_quarantined", "gpucluster_health_pool_quarantined_ratio",
                "gpucluster_health_seconds_between_failures", "gpucluster_health_suppressed_total",
                "gpucluster_health_taints_applied_total")
GANG_METRICS = ("gpucluster_health_gang_restarts_total",)
#: Per-GPU and per-port series: thousands in prod.
FAN_OUT = ("DCGM_", "infiniband_")
FILTERED = re.compile(r'^-?(?:sort_desc\()?(?:topk|bottomk)\((\d+),')


def _carried(metric: str) -> set[str]:
    labels = set()
    if metric.startswith(NODE_METRICS + GANG_METRICS):
        labels.add("node")
    if metric.startswith(POOL_METRICS + GANG_METRICS):
        labels.add("pool")
    if metric.startswith(GANG_METRICS):
        labels.add("job")
    return labels


def test_the_dashboards_have_chained_pool_node_and_job_variables(prod: RunResult) -> None:
    """The first panel drew all 2,048 prod GPUs: there was nothing to choose a pool or a node by."""
    for uid, board in boards(prod).items():
        variables = query_variables(board)
        assert [v["name"] for v in variables] == ["pool", "node", "job"], uid
        for v in variables:
            assert (v["multi"], v["includeAll"], v["datasource"]) == (True, True, DATASOURCE), (uid, v["name"])
            assert v["query"].startswith(("label_values(", "query_result(")), (uid, v["name"])
        pool, node, job = variables
        # "All" pools: prod's two GPU pools, not its system pool.
        assert pool["query"] == 'label_values(kube_node_labels{label_gpucluster_io_pool=~"h100-a|h200-b"}, ' \
            "label_gpucluster_io_pool)", uid
        assert pool["allValue"] == "h100-a|h200-b", uid
        assert "$pool" in node["query"] and {"$pool", "$node"} <= set(re.findall(r"\$\w+", job["query"])), uid
        assert (node["allValue"], job["allValue"]) == (".*", ".*"), uid


def test_every_dashboard_reference_is_a_variable_of_its_own_dashboard(prod: RunResult) -> None:
    problems = []
    for uid, board in boards(prod).items():
        names = [v["name"] for v in board["templating"]["list"]]
        texts = [(q.where, q.expr + q.legend) for q in queries(board)]
        texts += [(f"{uid} / {p['title']} / link", link["url"])
                  for p in board["panels"] for link in p["fieldConfig"]["defaults"].get("links", [])]
        problems += [f"{where}: ${name}" for where, text in texts for name in references(text) if name not in names]
        for index, variable in enumerate(board["templating"]["list"]):
            # A variable may only depend on the ones before it: Grafana resolves them in this order.
            problems += [f"{uid} / variable {variable['name']}: ${name}"
                         for name in references(variable.get("query", "")) if name not in names[:index]]
    assert problems == []


def test_every_query_on_a_pool_or_node_labelled_metric_filters_by_the_variables(prod: RunResult) -> None:
    """Node-labelled series without a pool label keep to the selected pools by a join on kube_node_labels;
    kube-state-metrics' own series are those joins (and the burst panel's external nodes, in no pool)."""
    pool_join = 'kube_node_labels{label_gpucluster_io_pool=~"$pool"}'
    problems = []
    for board in boards(prod).values():
        for q in queries(board):
            for metric, matchers in selectors(q.expr):
                if metric.startswith("kube_"):
                    continue
                carried = _carried(metric)
                problems += [f"{q.where}: {metric} not filtered by ${label}" for label in sorted(carried)
                             if matchers.get(label) != ("=~", f"${label}")]
                if "node" in carried and "pool" not in carried and pool_join not in q.expr:
                    problems.append(f"{q.where}: {metric} not kept to the selected pools")
    assert problems == []


def test_sort_desc_only_where_it_orders_and_fan_out_panels_are_bounded(prod: RunResult) -> None:
    """A graph draws every series whatever their order: sort_desc there does nothing, topk bounds it."""
    problems = []
    for board in boards(prod).values():
        for p in board["panels"]:
            for t in p["targets"]:
                where, expr = f"{board['uid']} / {p['title']}", t["expr"]
                if "sort_desc" in expr and (p["type"] == "timeseries" or not t["instant"]):
                    problems.append(f"{where}: sort_desc in a {p['type']} range query")
                if p["type"] == "stat" or not any(m.startswith(FAN_OUT) for m, _ in selectors(expr)):
                    continue
                bound = FILTERED.match(expr)
                if bound is None or int(bound.group(1)) > TOP:
                    problems.append(f"{where}: per-GPU or per-port series without topk/bottomk({TOP})")
    assert problems == []
    hottest = next(p for p in gpu_fleet.build()["panels"] if p["title"] == "Hottest GPUs now")
    assert hottest["type"] == "bargauge" and hottest["targets"][0]["expr"].startswith("sort_desc(topk(20, ")


def test_the_fleet_and_health_dashboards_link_to_each_other_keeping_the_selection(prod: RunResult) -> None:
    found = boards(prod)
    assert set(found) == {FLEET_UID, HEALTH_UID}
    for uid, other in ((FLEET_UID, HEALTH_UID), (HEALTH_UID, FLEET_UID)):
        links = [link for link in found[uid]["links"] if link["url"] == f"/d/{other}"]
        assert [(link["type"], link["includeVars"], link["keepTime"]) for link in links] == [("link", True, True)]
        data_links = [link["url"] for p in found[uid]["panels"]
                      for link in p["fieldConfig"]["defaults"].get("links", [])]
        assert data_links and all(url.startswith(f"/d/{other}?") and "${__url_time_range}" in url
                                  for url in data_links), uid
    temperature = found[FLEET_UID]["panels"][0]["fieldConfig"]["defaults"]["links"][0]["url"]
    assert temperature == (f"/d/{HEALTH_UID}?var-node=${{__field.labels.node}}&${{datasource:queryparam}}"
                           "&${pool:queryparam}&${job:queryparam}&${__url_time_range}")


def test_the_dashboards_follow_the_label_prefix_and_pools_of_the_stack(run_stack: StackRunner) -> None:
    def edit(c: dict[str, Any]) -> None:
        c[P + "labelPrefix"] = "ml.example.org"

    for board in boards(run_stack("local", edit)).values():
        pool = query_variables(board)[0]
        assert pool["query"] == 'label_values(kube_node_labels{label_ml_example_org_pool=~"local-gpu"}, ' \
            "label_ml_example_org_pool)"
        assert pool["allValue"] == "local-gpu"
        assert "gpucluster_io" not in json.dumps(board)


def test_dashboards_can_be_turned_off(run_stack: StackRunner) -> None:
    result = run_stack("local", lambda c: c.update({P + "observability": {"dashboards": False}}))
    assert "gpu-fleet-dashboard" not in {r.metadata.get("name") for r in result.by_kind("ConfigMap")}


# ---- config validation -----------------------------------------------------------------------------


def _fails(edit: dict[str, Any]) -> str:
    config, secrets = raw_stack("local")
    config[P + "observability"] = edit
    monitor = RecordingMonitor(RecordingMocks())
    with pytest.raises(ConfigError) as caught:
        run_program("local", config, secrets, monitor=monitor)
    assert monitor.records == []
    return str(caught.value)


def test_poll_longer_than_hold_is_rejected_before_any_resource() -> None:
    msg = _fails({"healthGuardPollSeconds": 300})
    assert "Pulumi.local.yaml" in msg
    assert "healthGuardPollSeconds (300) must not exceed thermalHoldSeconds (120)" in msg


@pytest.mark.parametrize(("old", "new", "value"), [("thermalGuard", "healthGuard", False),
                                                  ("thermalPollSeconds", "healthGuardPollSeconds", 30),
                                                  ("thermalGuardPort", "healthGuardPort", 9400)])
def test_the_old_health_guard_keys_still_work_for_one_release_and_say_the_new_name(old: str, new: str,
                                                                                   value: Any) -> None:
    from components.config import Observability

    with pytest.warns(FutureWarning, match=f"observability.{old} is renamed observability.{new}"):
        renamed = Observability.model_validate({old: value})
    assert renamed == Observability.model_validate({new: value})
    with pytest.raises(ValueError, match=f"{old} and {new} are both set"):
        Observability.model_validate({old: value, new: value})


def test_a_renamed_key_reaches_the_engine_as_a_warning(monkeypatch: pytest.MonkeyPatch) -> None:
    import pulumi

    config, secrets = raw_stack("local")
    config[P + "observability"] = {**config.get(P + "observability", {}), "thermalPollSeconds": 30}
    said: list[str] = []
    monkeypatch.setattr(pulumi.log, "warn", lambda message, *args, **kwargs: said.append(message))
    result = run_program("local", config, secrets, monitor=RecordingMonitor(RecordingMocks()))
    assert any("observability.thermalPollSeconds is renamed observability.healthGuardPollSeconds" in m
               for m in said), said
    documents = [json.loads(r.inputs["data"]["settings.json"]) for r in result.resources
                 if r.type == "kubernetes:core/v1:ConfigMap" and "settings.json" in (r.inputs.get("data") or {})]
    assert [d["poll_seconds"] for d in documents if "signals" in d] == [30]


def test_warning_band_wider_than_threshold_is_rejected() -> None:
    msg = _fails({"thermalThresholdCelsius": 60, "thermalWarningBandCelsius": 62})
    assert "thermalWarningBandCelsius (62) must be below thermalThresholdCelsius (60)" in msg


def test_kube_state_label() -> None:
    assert kube_state_label("gpucluster.io/workload") == "label_gpucluster_io_workload"
    assert kube_state_label("ml.example.org/location") == "label_ml_example_org_location"


def test_component_tree(prod: RunResult) -> None:
    (component,) = prod.by_type("gpu-cluster:observability:ObservabilityStack")
    children = {r.type for r in prod.resources if r.parent == component.urn}
    assert children == {
        "kubernetes:core/v1:ConfigMap",
        "kubernetes:core/v1:ServiceAccount",
        "kubernetes:core/v1:Service",
        "kubernetes:apps/v1:DaemonSet",
        "kubernetes:monitoring.coreos.com/v1:ServiceMonitor",
        "kubernetes:monitoring.coreos.com/v1:PrometheusRule",
        "gpu-cluster:health:HealthGuard",  # its own objects: tests/test_health_guard_component.py
    }
    # The guard's Service and ServiceMonitor are the HealthGuard's children (aliased from here).
    assert len([r for r in prod.resources if r.parent == component.urn]) == 13


def test_dcgm_exporter_mounts_the_pod_resources_of_the_kubelet_root_the_stack_names(run_stack: StackRunner,
                                                                                    local: RunResult) -> None:
    """A site whose kubelets run with another ``--root-dir`` (k0s here): the host side of the mount follows the
    stack's ``kubeletRootDir``, the exporter still finds its socket where it looks, and the policy pack allows
    exactly that host path."""
    from policies.rules import evaluate
    from tools import policy

    root = "/var/lib/k0s/kubelet/"
    result = run_stack("local", lambda c: c.update({P + "kubeletRootDir": root}))
    volumes = {v["name"]: v for v in pod_spec(result, "DaemonSet", "dcgm-exporter")["volumes"]}
    assert volumes["pod-resources"]["hostPath"] == {"path": "/var/lib/k0s/kubelet/pod-resources", "type": "Directory"}
    mounts = {m["name"]: m for m in container(result, "DaemonSet", "dcgm-exporter")["volumeMounts"]}
    assert mounts["pod-resources"]["mountPath"] == "/var/lib/kubelet/pod-resources"
    ctx = policy.context_for("local", {**raw_from_stack("local"), "kubeletRootDir": root})
    assert evaluate(policy.resources_of(result), ctx) == []
    # The default path is not allowed on such a stack: the allow-list follows the setting, not a constant.
    found = evaluate(policy.resources_of(local), ctx)
    assert [(v.rule, v.resource) for v in found] == [
        ("privileges-allow-listed", "DaemonSet gpu-telemetry/dcgm-exporter")]
    assert "hostPath volumes ['/var/lib/kubelet/pod-resources'] are not allow-listed" in found[0].message


@pytest.mark.parametrize(("root", "message"), [
    ("var/lib/kubelet", "must be an absolute path below '/'"),
    ("/", "must be an absolute path below '/'"),
    ("/var/lib/../kubelet", "must not contain '..' or ':'"),
])
def test_a_kubelet_root_that_is_not_a_host_directory_is_refused(root: str, message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)) as err:
        parse_config({**raw_from_stack("local"), "kubeletRootDir": root}, "Pulumi.local.yaml")
    assert "kubeletRootDir" in str(err.value)
