"""The gradual return: a descheduler CronJob whose policy touches only inference on burst-tainted nodes."""

from __future__ import annotations

from typing import Any

import yaml

from components.mockrt import RunResult, config_error
from tests.conftest import StackRunner

NS = "gpu-system"


def policy(result: RunResult) -> dict[str, Any]:
    cm = result.one("ConfigMap", "descheduler-policy")
    loaded: dict[str, Any] = yaml.safe_load(cm.inputs["data"]["policy.yaml"])
    return loaded


def test_policy_is_only_the_burst_return(prod: RunResult) -> None:
    assert policy(prod) == {
        "apiVersion": "descheduler/v1alpha2",
        "kind": "DeschedulerPolicy",
        "maxNoOfPodsToEvictPerNode": 8,
        "maxNoOfPodsToEvictPerNamespace": 16,
        "maxNoOfPodsToEvictTotal": 16,
        "profiles": [{
            "name": "burst-return",
            "pluginConfig": [
                {"name": "DefaultEvictor", "args": {
                    "labelSelector": {"matchLabels": {"gpucluster.io/workload": "inference"}},
                    "priorityThreshold": {"value": 10_001},
                    "minPodAge": "600s",
                    "nodeFit": True,
                    "podProtections": {"defaultDisabled": ["PodsWithLocalStorage"]},
                }},
                {"name": "RemovePodsViolatingNodeTaints", "args": {"includedTaints": ["gpucluster.io/burst"],
                                                                   "namespaces": {"include": ["inference"]}}},
            ],
            "plugins": {
                "filter": {"enabled": ["DefaultEvictor"]},
                "preEvictionFilter": {"enabled": ["DefaultEvictor"]},
                "deschedule": {"enabled": ["RemovePodsViolatingNodeTaints"]},
            },
        }],
    }


def test_training_can_never_be_evicted(prod: RunResult) -> None:
    threshold = policy(prod)["profiles"][0]["pluginConfig"][0]["args"]["priorityThreshold"]["value"]
    training = prod.one("PriorityClass", "gpu-training").inputs["value"]
    inference = prod.one("PriorityClass", "gpu-inference").inputs["value"]
    assert inference < threshold <= training


def test_preferred_affinity_mode_is_opt_in(run_stack: StackRunner) -> None:
    result = run_stack("local", lambda cfg: cfg["gpu-cluster:descheduler"].update(preferOnpremAffinity=True))
    profile = policy(result)["profiles"][0]
    assert profile["plugins"]["deschedule"]["enabled"] == [
        "RemovePodsViolatingNodeTaints", "RemovePodsViolatingNodeAffinity"]
    assert profile["pluginConfig"][2] == {
        "name": "RemovePodsViolatingNodeAffinity",
        "args": {"nodeAffinityType": ["preferredDuringSchedulingIgnoredDuringExecution"],
                 "namespaces": {"include": ["inference"]}},
    }
    assert profile["pluginConfig"][0]["args"]["nodeFit"] is True


def test_cronjob_runs_the_pinned_image_on_schedule(local: RunResult) -> None:
    job = local.one("CronJob", "descheduler")
    spec = job.inputs["spec"]
    assert spec["schedule"] == "* * * * *"
    assert spec["concurrencyPolicy"] == "Forbid"
    pod = spec["jobTemplate"]["spec"]["template"]["spec"]
    c = pod["containers"][0]
    assert c["image"] == "registry.k8s.io/descheduler/descheduler:v0.36.0"
    assert c["args"] == ["--policy-config-file=/policy-dir/policy.yaml", "--v=3"]
    assert pod["serviceAccountName"] == "descheduler"
    assert pod["restartPolicy"] == "Never"
    assert spec["jobTemplate"]["spec"]["activeDeadlineSeconds"] == 600
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    # It evicts through the API, so it keeps its token; checkov's token check is skipped on this CronJob only.
    assert "automountServiceAccountToken" not in pod
    assert job.metadata["annotations"] == {"checkov.io/skip1": job.metadata["annotations"]["checkov.io/skip1"]}
    assert job.metadata["annotations"]["checkov.io/skip1"].startswith("CKV_K8S_38=")


def test_rbac_is_upstream_without_extras(prod: RunResult) -> None:
    role = prod.one("ClusterRole", "gpu-cluster:descheduler")
    assert role.inputs["rules"] == [
        {"apiGroups": ["events.k8s.io"], "resources": ["events"], "verbs": ["create", "update"]},
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "watch", "list"]},
        {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["get", "watch", "list"]},
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "watch", "list"]},
        {"apiGroups": ["scheduling.k8s.io"], "resources": ["priorityclasses"], "verbs": ["get", "watch", "list"]},
        {"apiGroups": ["policy"], "resources": ["poddisruptionbudgets"], "verbs": ["get", "watch", "list"]},
        {"apiGroups": [""], "resources": ["persistentvolumeclaims"], "verbs": ["get", "watch", "list"]},
    ]
    binding = prod.one("ClusterRoleBinding", "gpu-cluster:descheduler")
    assert binding.inputs["subjects"] == [{"kind": "ServiceAccount", "name": "descheduler", "namespace": NS}]
    # It evicts in the inference namespace only, the one its policy includes; never deletes.
    evict = prod.one("Role", "descheduler-evict")
    assert evict.metadata["namespace"] == "inference"
    assert evict.inputs["rules"] == [{"apiGroups": [""], "resources": ["pods/eviction"], "verbs": ["create"]}]
    assert prod.one("RoleBinding", "descheduler-evict").inputs["subjects"] == binding.inputs["subjects"]


def test_bad_cron_is_refused() -> None:
    message = config_error(lambda raw: raw["descheduler"].update(schedule="every 2 minutes"))
    assert "Pulumi.prod.yaml" in message
    assert "descheduler.schedule: must be a five-field cron expression" in message


def test_per_node_limit_cannot_exceed_the_total() -> None:
    message = config_error(lambda raw: raw["descheduler"].update(maxPodsPerNode=20))
    assert "descheduler: maxPodsPerNode (20) must not exceed maxPodsTotal (16)" in message


def test_unpinned_image_is_refused() -> None:
    message = config_error(lambda raw: raw["descheduler"].update(image="registry.k8s.io/descheduler/descheduler"))
    assert "descheduler.image: must be pinned by tag or digest" in message


def test_the_runs_requests_are_the_stacks(prod: RunResult, local: RunResult) -> None:
    def requests(result: RunResult) -> dict[str, str]:
        pod = result.one("CronJob", "descheduler").inputs["spec"]["jobTemplate"]["spec"]["template"]["spec"]
        res = pod["containers"][0]["resources"]
        assert res["limits"]["memory"] == res["requests"]["memory"]  # memory's request is its limit
        return {k: res["requests"][k] for k in ("cpu", "memory")}

    assert requests(prod) == {"cpu": "500m", "memory": "256Mi"}  # the default
    assert requests(local) == {"cpu": "100m", "memory": "256Mi"}  # Pulumi.local.yaml's, for its 2-core node


def test_a_bad_request_is_refused_with_its_key() -> None:
    message = config_error(lambda raw: raw["descheduler"].update(resources={"cpu": "half", "memory": "256Mi"}))
    assert "descheduler.resources.cpu: must be a Kubernetes quantity" in message
    message = config_error(lambda raw: raw["descheduler"].update(resources={"cpu": "1"}))
    assert "descheduler.resources.memory" in message
