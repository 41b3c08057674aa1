"""The real nodes' monitoring: prometheus-operator and the Prometheus resource it turns into a StatefulSet, selecting
the stack's monitors and rules, behind the Service the stack's guard asks, restricted and least-privileged."""

from __future__ import annotations

import copy
import subprocess
from pathlib import Path
from typing import Any

import pytest

from components.config import ClusterConfig
from components.mockrt import run_program, stack_config
from components.pins import PROMETHEUS, PROMETHEUS_OPERATOR, prometheus_release
from tests.test_controller_isolation import restricted_problems
from tools import image_local
from tools import images as tool
from tools.localcluster import prometheus_operator as po
from tools.localcluster.plan import load_stack_config
from tools.localcluster.realnodes import IMAGES_BY_KIND

ROOT = Path(__file__).resolve().parents[1]


def _cfg() -> ClusterConfig:
    cfg = load_stack_config(ROOT, "local")
    assert isinstance(cfg, ClusterConfig)
    return cfg


SYSTEM_CLASS = _cfg().priorities.system.name


def _by_kind(docs: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(d["kind"], d["metadata"]["name"]): d for d in docs}


def test_the_operators_service_is_what_the_stacks_guard_asks() -> None:
    cfg = _cfg()
    # The operator names the governing Service of every Prometheus prometheus-operated, in the resource's namespace.
    assert f"http://{po.SERVICE}.{cfg.monitoring_namespace}.svc:{po.PORT}" == cfg.observability.prometheus_url
    prom = po.prometheus_resource(cfg.monitoring_namespace, "cpu-local-01", {}, SYSTEM_CLASS)
    assert prom["metadata"]["namespace"] == cfg.monitoring_namespace


def _pod_spec(doc: dict[str, Any]) -> dict[str, Any] | None:
    spec = doc.get("spec") or {}
    if doc["kind"] == "CronJob":
        spec = spec["jobTemplate"]["spec"]
    template = spec.get("template")
    return template["spec"] if template else None


def test_no_pod_of_the_stack_outranks_the_prometheus_the_guard_reads() -> None:
    """The descheduler's CronJob pod (the system class) preempted a Prometheus at the default priority every minute
    on a full system node: the guard saw its Service without a ready pod and every series start again."""
    from tools.render import manifests

    config, secrets = stack_config("local")
    docs = list(manifests(run_program("local", config, secrets)).values())
    classes = {d["metadata"]["name"]: d["value"] for d in docs if d["kind"] == "PriorityClass"}
    prom = po.prometheus_resource("monitoring", "cpu-local-01", {}, SYSTEM_CLASS)["spec"]
    operator = po.operator_deployment("monitoring", "cpu-local-01", SYSTEM_CLASS)["spec"]["template"]["spec"]
    assert prom["priorityClassName"] == operator["priorityClassName"] == SYSTEM_CLASS
    ranks = {f"{d['kind']}/{d['metadata']['name']}": classes.get(pod.get("priorityClassName", ""), 0)
             for d in docs if (pod := _pod_spec(d)) is not None}
    assert "CronJob/descheduler" in ranks and ranks["CronJob/descheduler"] == classes[SYSTEM_CLASS], ranks
    assert max(ranks.values()) <= classes[SYSTEM_CLASS], ranks


def _millicores(quantity: str) -> int:
    return int(quantity[:-1]) if quantity.endswith("m") else int(float(quantity) * 1000)


def test_every_platform_pod_of_the_local_stack_fits_its_two_core_system_node_at_once() -> None:
    """Everything the local stack and the monitoring install place on the real system node, with the descheduler's
    run beside them: one core short and the run preempts the lowest pod there at every schedule."""
    from tools.render import manifests

    cfg = _cfg()
    config, secrets = stack_config("local")
    docs = [d for d in manifests(run_program("local", config, secrets)).values()
            if d["metadata"].get("namespace") == cfg.system_namespace]
    docs += po.manifests(cfg.monitoring_namespace, "cpu-local-01", {}, SYSTEM_CLASS)
    total, seen = 0, {}
    for doc in docs:
        pod = _pod_spec(doc) if doc["kind"] in ("Deployment", "StatefulSet", "CronJob") else None
        if doc["kind"] == "Prometheus":
            pod, replicas = {"containers": [doc["spec"]]}, doc["spec"]["replicas"]
        elif pod is not None:
            replicas = doc["spec"].get("replicas", 1) if doc["kind"] != "CronJob" else 1
        else:
            continue
        cpu = sum(_millicores(c.get("resources", {}).get("requests", {}).get("cpu", "0")) for c in pod["containers"])
        seen[f"{doc['kind']}/{doc['metadata']['name']}"] = cpu * replicas
        total += cpu * replicas
    assert {"CronJob/descheduler", "Prometheus/local", "Deployment/health-guard"} <= set(seen), seen
    assert total <= 2000, f"{total}m of CPU requests on a 2-core node: {seen}"


def test_prometheus_selects_the_stacks_monitors_and_rules_by_its_monitor_labels_in_every_namespace() -> None:
    spec = po.prometheus_resource("monitoring", "cpu-local-01", {"release": "platform"}, SYSTEM_CLASS)["spec"]
    for kind in ("serviceMonitor", "podMonitor", "rule"):
        assert spec[f"{kind}Selector"] == {"matchLabels": {"release": "platform"}}
        assert spec[f"{kind}NamespaceSelector"] == {}
    # No monitorLabels (the local stack): every monitor and rule, as `{}` selects all (a missing selector would
    # select none).
    spec = po.prometheus_resource("monitoring", "cpu-local-01", {}, SYSTEM_CLASS)["spec"]
    assert spec["serviceMonitorSelector"] == spec["podMonitorSelector"] == spec["ruleSelector"] == {}
    assert "probeSelector" not in spec and "scrapeConfigSelector" not in spec


def test_the_stacks_monitors_and_rules_carry_the_labels_prometheus_selects() -> None:
    config, secrets = stack_config("local")
    config = copy.deepcopy(config)
    config.setdefault("gpu-cluster:observability", {})["monitorLabels"] = {"release": "platform"}
    result = run_program("local", config, secrets)
    selected = [r for kind in ("ServiceMonitor", "PodMonitor", "PrometheusRule") for r in result.by_kind(kind)]
    assert {r.kind for r in selected} == {"ServiceMonitor", "PodMonitor", "PrometheusRule"}
    for r in selected:
        assert r.metadata["labels"]["release"] == "platform", (r.kind, r.metadata["name"])


def test_prometheus_is_the_local_build_at_the_release_the_operator_is_built_on() -> None:
    spec = po.prometheus_resource("monitoring", "cpu-local-01", {}, SYSTEM_CLASS)["spec"]
    assert spec["image"] == image_local.PROMETHEUS_IMAGE and spec["imagePullPolicy"] == "Never"
    # Upstream tags Prometheus 3.5.0 as module v0.305.0; the operator's default version, and what it generates for.
    assert prometheus_release(PROMETHEUS.version) == "v3.5.0" == spec["version"]
    assert spec["version"] == image_local.PROMETHEUS_IMAGE.rsplit(":", 1)[1]
    assert spec["nodeSelector"] == {"kubernetes.io/hostname": "cpu-local-01"}


def test_a_prometheus_module_version_names_its_release() -> None:
    assert prometheus_release("v0.300.1") == "v3.0.1" and prometheus_release("v0.310.0") == "v3.10.0"
    for bad in ("v3.5.0", "v0.55.0", "v0.305"):
        with pytest.raises(ValueError, match="not a Prometheus module version"):
            prometheus_release(bad)


BUILT_PROMETHEUS = tool.LOCAL_BIN / "prometheus"


@pytest.mark.skipif(not BUILT_PROMETHEUS.exists(), reason="make localcluster (the Go builds)")
def test_the_built_prometheus_reports_the_release_its_image_is_tagged_with() -> None:
    out = subprocess.run([str(BUILT_PROMETHEUS), "--version"], capture_output=True, text=True, check=True)
    assert f"v{(out.stdout or out.stderr).split()[2]}" == po.PROMETHEUS_VERSION


def test_the_operator_runs_the_pinned_build_with_the_pinned_reloader() -> None:
    dep = po.operator_deployment("monitoring", "cpu-local-01", SYSTEM_CLASS)
    (container,) = dep["spec"]["template"]["spec"]["containers"]
    assert container["image"] == image_local.PROMETHEUS_OPERATOR_IMAGE
    assert container["image"].endswith(f":{PROMETHEUS_OPERATOR.version}") and container["imagePullPolicy"] == "Never"
    assert f"--prometheus-config-reloader={image_local.PROMETHEUS_CONFIG_RELOADER_IMAGE}" in container["args"]
    assert "--prometheus-instance-namespaces=monitoring" in container["args"]
    built = {i.name: i for i in tool.binary_images(Path("/b"))}
    assert built["prometheus-operator"].ref == image_local.PROMETHEUS_OPERATOR_IMAGE
    # The operator's StatefulSets run the reloader as the command /bin/prometheus-config-reloader.
    assert built["prometheus-config-reloader"].path == "/bin/prometheus-config-reloader"
    assert built["prometheus-config-reloader"].binary == Path("/b/prometheus-config-reloader")
    assert {"prometheus-server", "prometheus-operator", "prometheus-config-reloader"} <= set(IMAGES_BY_KIND["system"])


def test_every_pod_passes_the_restricted_level_of_the_monitoring_namespace() -> None:
    pod = po.operator_deployment("monitoring", "cpu-local-01", SYSTEM_CLASS)["spec"]["template"]["spec"]
    assert restricted_problems(pod) == []
    # The operator's containers drop everything and run read-only; the pod's context is the resource's.
    prom = po.prometheus_resource("monitoring", "cpu-local-01", {}, SYSTEM_CLASS)["spec"]["securityContext"]
    generated = {"securityContext": prom, "containers": [
        {"name": n, "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                                        "capabilities": {"drop": ["ALL"]}}}
        for n in ("prometheus", "config-reloader")]}
    assert restricted_problems(generated) == []


def test_grants_are_least_privilege_no_wildcards_and_writes_only_in_the_monitoring_namespace() -> None:
    docs = _by_kind(po.manifests("monitoring", "cpu-local-01", {}, SYSTEM_CLASS))
    rules = [(d["kind"], r) for d in docs.values() if d["kind"] in ("ClusterRole", "Role") for r in d["rules"]]
    for _, rule in rules:
        assert "*" not in [*rule["apiGroups"], *rule["resources"], *rule["verbs"]], rule
    cluster = [r for kind, r in rules if kind == "ClusterRole"]
    # Cluster-wide, only reads, and the operator's events about the monitors it rejects.
    for rule in cluster:
        assert set(rule["verbs"]) <= {"get", "list", "watch"} or rule["resources"] == ["events"], rule
    role = docs[("Role", po.OPERATOR)]
    assert role["metadata"]["namespace"] == "monitoring"
    writes = {res for r in role["rules"] for res in r["resources"]
              if {"create", "update", "patch", "delete"} & set(r["verbs"])}
    assert writes == {"statefulsets", "configmaps", "secrets", "services", "prometheuses/status"}
    # Each account is bound to its own grants only.
    for kind in ("ClusterRoleBinding", "RoleBinding"):
        for d in (d for d in docs.values() if d["kind"] == kind):
            (subject,) = d["subjects"]
            assert subject["namespace"] == "monitoring"
            assert subject["name"] in (po.OPERATOR, po.PROMETHEUS_ACCOUNT)
    assert docs[("Deployment", po.OPERATOR)]["spec"]["template"]["spec"]["serviceAccountName"] == po.OPERATOR
    assert docs[("Prometheus", po.NAME)]["spec"]["serviceAccountName"] == po.PROMETHEUS_ACCOUNT


def test_objects_come_in_dependency_order() -> None:
    kinds = [d["kind"] for d in po.manifests("monitoring", "cpu-local-01", {}, SYSTEM_CLASS)]
    assert kinds.index("ServiceAccount") < kinds.index("Deployment") and kinds[-1] == "Prometheus"
