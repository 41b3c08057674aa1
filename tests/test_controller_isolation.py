"""Privileged agents apart from controllers, and controllers that write only where they act (issue 18).

* The DCGM and InfiniBand exporters (root, SYS_ADMIN, hostPath) run in the telemetry namespace, the only one
  whose Pod Security level is ``privileged``; the system namespace, with every controller, enforces
  ``restricted``, and every pod the stack puts there meets that profile (checked here the way the admission
  plugin checks it, so the label cannot refuse our own pods at apply time).
* No ClusterRole of the stack writes pods: the burst controller, the health guard and the descheduler read
  cluster-wide and write through Roles in the namespaces where they act, each named below.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from components.config import PROJECT, parse_config
from components.mockrt import RunResult, raw_from_stack
from policies.rules import RuleContext, evaluate
from tests.conftest import StackRunner
from tools import policy

SYS, TEL, TRAIN, INF, MON = "gpu-system", "gpu-telemetry", "training", "inference", "monitoring"
P = f"{PROJECT}:"
WORKLOADS = ("Deployment", "DaemonSet", "StatefulSet", "Job", "CronJob", "Pod")
POD_WRITE_VERBS = {"create", "update", "patch", "delete", "deletecollection", "*"}
#: Volume types the restricted profile admits (Pod Security Standards, "Volume Types").
RESTRICTED_VOLUMES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim",
                      "projected", "secret"}


def levels(result: RunResult) -> dict[str, str]:
    return {ns.metadata["name"]: ns.metadata["labels"]["pod-security.kubernetes.io/enforce"]
            for ns in result.by_kind("Namespace")}


def pod_specs(result: RunResult, namespace: str) -> Iterator[tuple[str, dict[str, Any]]]:
    for kind in WORKLOADS:
        for r in result.by_kind(kind):
            if r.metadata.get("namespace") != namespace:
                continue
            spec = r.inputs["spec"]
            if kind == "CronJob":
                spec = spec["jobTemplate"]["spec"]
            yield f"{kind} {r.metadata['name']}", spec if kind == "Pod" else spec["template"]["spec"]


def restricted_problems(pod: dict[str, Any]) -> list[str]:
    """What the Pod Security ``restricted`` profile (v1.34) refuses in a pod spec."""
    out = [f"spec.{flag}" for flag in ("hostNetwork", "hostPID", "hostIPC") if pod.get(flag)]
    out += [f"volume {v['name']}" for v in pod.get("volumes") or []
            if not set(v) - {"name"} <= RESTRICTED_VOLUMES]
    pod_sc = pod.get("securityContext") or {}
    for c in [*(pod.get("initContainers") or []), *pod["containers"]]:
        sc = c.get("securityContext") or {}
        name = c["name"]
        if sc.get("privileged"):
            out.append(f"{name}: privileged")
        if sc.get("allowPrivilegeEscalation") is not False:
            out.append(f"{name}: allowPrivilegeEscalation")
        if sc.get("runAsNonRoot", pod_sc.get("runAsNonRoot")) is not True:
            out.append(f"{name}: runAsNonRoot")
        if sc.get("runAsUser", pod_sc.get("runAsUser")) == 0:
            out.append(f"{name}: runAsUser 0")
        seccomp = (sc.get("seccompProfile") or pod_sc.get("seccompProfile") or {}).get("type")
        if seccomp not in ("RuntimeDefault", "Localhost"):
            out.append(f"{name}: seccompProfile {seccomp}")
        caps = sc.get("capabilities") or {}
        if "ALL" not in (caps.get("drop") or []) or set(caps.get("add") or []) - {"NET_BIND_SERVICE"}:
            out.append(f"{name}: capabilities {caps}")
        if any(p.get("hostPort") for p in c.get("ports") or []):
            out.append(f"{name}: hostPort")
    return out


# --------------------------------------------------------------------------- privileged agents apart


@pytest.mark.parametrize("stack", ["prod", "local"])
def test_only_the_telemetry_namespace_is_privileged(stack: str, prod: RunResult, local: RunResult) -> None:
    result = prod if stack == "prod" else local
    found = levels(result)
    assert found[SYS] == "restricted" and found[TEL] == "privileged" and found[MON] == "restricted"
    assert [ns for ns, level in found.items() if level == "privileged"] == [TEL]


@pytest.mark.parametrize("stack", ["prod", "local"])
def test_the_telemetry_namespace_holds_the_exporters_and_nothing_else(stack: str, prod: RunResult,
                                                                      local: RunResult) -> None:
    result = prod if stack == "prod" else local
    there = sorted((r.kind, r.metadata["name"]) for r in result.resources
                   if r.custom and r.metadata.get("namespace") == TEL)
    assert there == [
        ("ConfigMap", "dcgm-exporter-counters"),
        ("DaemonSet", "dcgm-exporter"), ("DaemonSet", "ib-exporter"),
        ("NetworkPolicy", "allow-metrics-scrape"), ("NetworkPolicy", "default-deny"),
        ("Service", "dcgm-exporter-metrics"), ("Service", "ib-exporter-metrics"),
        ("ServiceAccount", "dcgm-exporter"), ("ServiceAccount", "ib-exporter"),
        ("ServiceMonitor", "dcgm-exporter"), ("ServiceMonitor", "ib-exporter"),
    ]
    # Each exporter's monitor scrapes its own namespace; the exporters hold no token and no RBAC.
    for name in ("dcgm-exporter", "ib-exporter"):
        monitor = result.one("ServiceMonitor", name)
        assert monitor.metadata["namespace"] == TEL
        assert monitor.inputs["spec"]["namespaceSelector"] == {"matchNames": [TEL]}
    bound = {s["name"] for b in result.by_kind("ClusterRoleBinding") + result.by_kind("RoleBinding")
             for s in b.inputs.get("subjects") or [] if s.get("namespace") == TEL}
    assert bound == set()


@pytest.mark.parametrize("stack", ["prod", "local"])
def test_every_pod_in_the_system_namespace_meets_the_restricted_profile(stack: str, prod: RunResult,
                                                                        local: RunResult) -> None:
    result = prod if stack == "prod" else local
    pods = dict(pod_specs(result, SYS))
    assert {"Deployment burst-controller", "Deployment health-guard", "CronJob descheduler"} <= set(pods)
    assert {name: restricted_problems(spec) for name, spec in pods.items() if restricted_problems(spec)} == {}
    # The exporters would not be admitted there: what keeps them in the telemetry namespace.
    for name in ("dcgm-exporter", "ib-exporter"):
        spec = dict(pod_specs(result, TEL))[f"DaemonSet {name}"]
        assert restricted_problems(spec), name


def test_a_renamed_telemetry_namespace_moves_the_exporters_and_their_allow_list(run_stack: StackRunner) -> None:
    result = run_stack("local", lambda c: c.update({P + "telemetryNamespace": "node-telemetry"}))
    assert levels(result)["node-telemetry"] == "privileged" and TEL not in levels(result)
    assert {r.metadata["namespace"] for r in result.by_kind("DaemonSet")} == {"node-telemetry"}
    raw = {**raw_from_stack("local"), "telemetryNamespace": "node-telemetry"}
    ctx = policy.context_for("local", raw)
    assert {a.namespace for a in ctx.privileged} == {"node-telemetry"}
    assert evaluate(policy.resources_of(result), ctx) == []


def test_the_telemetry_namespace_is_its_own() -> None:
    cfg = parse_config(raw_from_stack("prod"), "Pulumi.prod.yaml")
    assert cfg.telemetry_namespace == TEL
    assert RuleContext.from_config(cfg).privileged[0].namespace == TEL


# --------------------------------------------------------------------------- writes only where they act


def pod_writes(result: RunResult) -> set[tuple[str, str, str, str]]:
    """(kind, namespace or '', role, 'resource:verb') of every pod write the stack grants to our controllers."""
    controllers = {"burst-controller", "health-guard", "descheduler"}
    subjects = {}
    for b in result.by_kind("ClusterRoleBinding") + result.by_kind("RoleBinding"):
        names = {s["name"] for s in b.inputs["subjects"] if s.get("namespace") == SYS}
        subjects[(b.kind.removesuffix("Binding"), b.metadata.get("namespace", ""), b.inputs["roleRef"]["name"])] = names
    out = set()
    for r in result.by_kind("ClusterRole") + result.by_kind("Role"):
        key = (r.kind, r.metadata.get("namespace", ""), r.metadata["name"])
        if not subjects.get(key, set()) & controllers:
            continue
        for rule in r.inputs["rules"]:
            for resource in rule["resources"]:
                if resource == "pods" or resource.startswith("pods/"):
                    out |= {(*key, f"{resource}:{v}") for v in rule["verbs"] if v in POD_WRITE_VERBS}
    return out


def test_no_cluster_role_writes_pods(prod: RunResult, local: RunResult) -> None:
    for result in (prod, local):
        writes = [(r.metadata["name"], rule) for r in result.by_kind("ClusterRole") for rule in r.inputs["rules"]
                  if any(x == "pods" or x.startswith("pods/") for x in rule["resources"])
                  and set(rule["verbs"]) & POD_WRITE_VERBS]
        assert writes == [], result.stack


def test_controllers_write_pods_only_where_they_act(prod: RunResult) -> None:
    assert pod_writes(prod) == {
        # Deletion cost on replicas that run externally; the handover gate on training pods (the clearing's and the
        # return's evictions are off by default).
        ("Role", INF, "burst-controller-pods", "pods:patch"),
        ("Role", TRAIN, "burst-controller-pods", "pods:patch"),
        # Training from degraded and fatal nodes, inference from fatal ones too (evictInferenceOnFatal).
        ("Role", TRAIN, "health-guard-evict", "pods/eviction:create"),
        ("Role", INF, "health-guard-evict", "pods/eviction:create"),
        # The gradual return: inference only, the namespace its policy includes.
        ("Role", INF, "descheduler-evict", "pods/eviction:create"),
    }
    # The guard itself evicts only there: its settings name the namespaces its Roles cover.
    guard = json.loads(prod.one("ConfigMap", "health-guard-settings").inputs["data"]["settings.json"])
    assert guard["eviction_namespaces"] == [TRAIN, INF]
    # Reads stay cluster-wide (free capacity and what runs on a node are cluster-wide questions).
    reads = {r.metadata["name"]: [rule["verbs"] for rule in r.inputs["rules"] if rule["resources"] == ["pods"]]
             for r in prod.by_kind("ClusterRole")}
    assert reads["gpu-cluster:burst-controller"] == [["list", "watch"]]
    assert reads["gpu-cluster:health-guard"] == [["list"]]
    assert reads["gpu-cluster:descheduler"] == [["get", "watch", "list"]]


def test_writes_follow_what_the_stack_turns_on(run_stack: StackRunner) -> None:
    """No handover: no gate to lift, so no training Role; no inference evictions: no inference Role."""
    result = run_stack("prod", lambda c: (c[P + "burst"].setdefault("handover", {}).update(enabled=False),
                                          c.setdefault(P + "observability", {}).setdefault("health", {}).update(
                                              evictInferenceOnFatal=False)))
    assert pod_writes(result) == {
        ("Role", INF, "burst-controller-pods", "pods:patch"),
        ("Role", TRAIN, "health-guard-evict", "pods/eviction:create"),
        ("Role", INF, "descheduler-evict", "pods/eviction:create"),
    }


def test_renamed_workload_namespaces_carry_the_roles_and_the_descheduler_policy(run_stack: StackRunner) -> None:
    result = run_stack("prod", lambda c: c.update({P + "inferenceNamespace": "serving",
                                                   P + "trainingNamespace": "jobs"}))
    assert {(ns, role) for _, ns, role, _ in pod_writes(result)} == {
        ("serving", "burst-controller-pods"), ("jobs", "burst-controller-pods"), ("jobs", "health-guard-evict"),
        ("serving", "health-guard-evict"), ("serving", "descheduler-evict")}
    doc = yaml.safe_load(result.one("ConfigMap", "descheduler-policy").inputs["data"]["policy.yaml"])
    taints = next(c for c in doc["profiles"][0]["pluginConfig"] if c["name"] == "RemovePodsViolatingNodeTaints")
    assert taints["args"]["namespaces"] == {"include": ["serving"]}
