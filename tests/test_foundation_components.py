"""Node pools, priority tiers, gang scheduling and the training gang template, as rendered."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
import yaml

from agents.node_pools.contract import NodePoolSettings, parse_settings
from components.config import ConfigError, parse_config
from components.gang_scheduler import VOLCANO_ACTIONS
from components.mockrt import RunResult, raw_from_stack
from tests.conftest import StackRunner

P = "gpu-cluster:"


def pool_settings(result: RunResult) -> NodePoolSettings:
    return parse_settings(json.loads(result.one("ConfigMap", "node-pools-settings").inputs["data"]["settings.json"]))


def test_every_prod_gpu_node_is_in_its_pool_with_labels_and_taint(prod: RunResult) -> None:
    members = pool_settings(prod).membership()
    assert len([n for n in members if n.startswith("gpu-")]) == 256
    node = members["gpu-b-128"]
    assert node.labels["gpucluster.io/pool"] == "h200-b"
    assert node.labels["gpucluster.io/location"] == "onprem"
    assert node.labels["gpucluster.io/gpu-model"] == "H200-SXM5-141GB"
    assert [t.model_dump() for t in node.taints] == [
        {"key": "gpucluster.io/pool", "value": "h200-b", "effect": "NoSchedule"}]
    patches = {r.metadata["name"]: r.inputs for r in prod.by_type("kubernetes:core/v1:NodePatch")}
    system = patches["cpu-sys-07"]
    assert system["metadata"]["labels"]["gpucluster.io/pool"] == "system"
    assert "spec" not in system


def test_label_prefix_is_configurable(run_stack: StackRunner) -> None:
    result = run_stack("local", lambda c: c.update({P + "labelPrefix": "ml.example.org"}))
    node = pool_settings(result).membership()["gpu-local-01"]
    assert node.labels["ml.example.org/pool"] == "local-gpu"
    assert node.taints[0].key == "ml.example.org/pool"


def test_priority_tiers(prod: RunResult) -> None:
    classes = {r.metadata["name"]: r.inputs for r in prod.by_kind("PriorityClass")}
    assert classes["gpu-training"]["value"] > classes["gpu-inference"]["value"]
    assert classes["gpu-training"]["preemptionPolicy"] == "PreemptLowerPriority"
    assert classes["gpu-inference"]["preemptionPolicy"] == "Never"
    assert classes["platform-critical"]["value"] > classes["gpu-training"]["value"]
    defaults = [name for name, c in classes.items() if c.get("globalDefault")]
    assert defaults == ["standard"]


def test_global_default_from_config(run_stack: StackRunner) -> None:
    result = run_stack("local", lambda c: c.update({P + "priorities": {"globalDefault": "inference"}}))
    defaults = [r.metadata["name"] for r in result.by_kind("PriorityClass") if r.inputs.get("globalDefault")]
    assert defaults == ["gpu-inference"]


def test_volcano_chart_values_carry_our_scheduler_conf(prod: RunResult) -> None:
    (chart,) = prod.by_type("kubernetes:helm.sh/v4:Chart")
    # The chart of the pinned Volcano module (the mock runtime resolves it to its module reference), its images
    # of the same release: what the local cluster builds from tools/localcluster/volcano/go.mod.
    assert chart.inputs["chart"] == "volcano.sh/volcano@v1.14.1/installer/helm/chart/volcano"
    assert chart.inputs["version"] == "1.14.0"
    assert "repositoryOpts" not in chart.inputs
    values = chart.inputs["values"]
    assert values["basic"]["image_tag_version"] == "v1.14.1"
    conf = yaml.safe_load(values["custom"]["scheduler_config_override"])
    assert [a.strip() for a in conf["actions"].split(",")] == VOLCANO_ACTIONS
    first_tier = [p["name"] for p in conf["tiers"][0]["plugins"]]
    assert first_tier == ["priority", "gang", "conformance"]
    # Queue shares come from explicit deserved amounts (capacity), never from weights (proportion):
    # with proportion a training queue reclaims only up to its weighted share of the GPUs.
    second_tier = [p["name"] for p in conf["tiers"][1]["plugins"]]
    assert "capacity" in second_tier and "proportion" not in second_tier
    custom = values["custom"]
    assert custom["default_ns"] == {"gpucluster.io/pool": "system"}
    # No admission webhook: its certificate would come from a Helm hook, which helm.v4.Chart never runs.
    assert custom["admission_enable"] is False
    # Our restricted profile, and none of the chart's default DAC_OVERRIDE.
    assert custom["default_csc"]["readOnlyRootFilesystem"] is True
    assert custom["default_csc"]["capabilities"] == {"add": [], "drop": ["ALL"]}
    assert custom["default_sc"]["runAsNonRoot"] is True


def test_queues_one_training_queue_per_pool(prod: RunResult) -> None:
    # Two pools: each gets its own training queue, capped at the pool's GPUs, so Volcano's enqueue gate
    # admits gangs per pool (a gang waiting for a full h100-a pool does not hold h200-b's room).
    assert sorted(r.metadata["name"] for r in prod.by_kind("Queue")) == [
        "inference", "team-llm", "team-vision", "training-h100-a", "training-h200-b"]
    for pool in ("h100-a", "h200-b"):
        spec = prod.one("Queue", f"training-{pool}").inputs["spec"]
        assert spec == {"weight": 8, "reclaimable": False, "capability": {"nvidia.com/gpu": 1024},
                        "deserved": {"nvidia.com/gpu": 1024}}
    # Inference deserves nothing: every inference pod is a reclaim victim for a training queue.
    assert prod.one("Queue", "inference").inputs["spec"] == {"weight": 2, "reclaimable": True}


def test_one_shared_training_queue_when_asked(run_stack: StackRunner) -> None:
    def shared(c: dict[str, Any]) -> None:
        c[P + "scheduling"]["trainingQueuePerPool"] = False
        c[P + "training"]["jobs"][0]["enabled"] = True

    result = run_stack("prod", shared)
    assert sorted(r.metadata["name"] for r in result.by_kind("Queue")) == [
        "inference", "team-llm", "team-vision", "training"]
    # One queue over both pools deserves all of their GPUs.
    assert result.one("Queue", "training").inputs["spec"] == {
        "weight": 8, "reclaimable": False, "deserved": {"nvidia.com/gpu": 2048}}
    assert _gang(result, "llm-pretrain-70b")["queue"] == "training"


def test_per_pool_capability_is_capped_by_the_training_queue_capability(run_stack: StackRunner) -> None:
    def capped(c: dict[str, Any]) -> None:
        c[P + "scheduling"]["trainingQueue"]["gpuCapability"] = 512

    result = run_stack("prod", capped)
    spec = result.one("Queue", "training-h100-a").inputs["spec"]
    assert spec["capability"] == {"nvidia.com/gpu": 512}
    # Deserved is the pool's GPUs unless set; it may not exceed what the queue can hold.
    assert spec["deserved"] == {"nvidia.com/gpu": 1024}


def test_queue_deserved_from_config_and_its_bound(run_stack: StackRunner) -> None:
    def deserved(c: dict[str, Any]) -> None:
        c[P + "scheduling"]["trainingQueue"]["gpuDeserved"] = 600

    result = run_stack("prod", deserved)
    assert result.one("Queue", "training-h100-a").inputs["spec"]["deserved"] == {"nvidia.com/gpu": 600}

    raw = copy.deepcopy(raw_from_stack("prod"))
    raw["scheduling"]["trainingQueue"].update(gpuCapability=512, gpuDeserved=600)
    with pytest.raises(ConfigError) as info:
        parse_config(raw, "Pulumi.prod.yaml")
    message = str(info.value)
    assert "Pulumi.prod.yaml" in message and "scheduling.trainingQueue" in message
    assert "gpuDeserved (600) exceeds gpuCapability (512)" in message


def test_local_stack_uses_the_preinstalled_volcano(local: RunResult) -> None:
    assert local.by_type("kubernetes:helm.sh/v4:Chart") == []
    # One pool: one training queue under its configured name, as before.
    assert {r.metadata["name"] for r in local.by_kind("Queue")} == {"training", "inference"}


def test_kube_batch_legacy_engine(run_stack: StackRunner) -> None:
    def edit(c: dict[str, Any]) -> None:
        c[P + "kubernetesVersion"] = "1.24"
        c[P + "scheduling"] = {"engine": "kube-batch"}

    result = run_stack("local", edit)
    crds = {r.metadata["name"]: r.inputs for r in result.by_kind("CustomResourceDefinition")}
    assert set(crds) == {"podgroups.scheduling.incubator.k8s.io", "queues.scheduling.incubator.k8s.io"}
    assert crds["podgroups.scheduling.incubator.k8s.io"]["apiVersion"] == "apiextensions.k8s.io/v1"
    deploy = result.one("Deployment", "kube-batch").inputs
    container = deploy["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == "docker.io/kubesigs/kube-batch:v0.5"
    role = result.one("ClusterRole", "kube-batch").inputs
    verbs = {v for rule in role["rules"] for v in rule["verbs"]}
    assert "*" not in verbs
    assert all("*" not in rule["resources"] for rule in role["rules"])
    skips = result.one("Deployment", "kube-batch").metadata["annotations"]
    assert sorted(v.split("=", 1)[0] for v in skips.values()) == ["CKV_K8S_38", "CKV_K8S_8", "CKV_K8S_9"]
    job = result.one("Job", "smoke-gang").inputs
    assert job["apiVersion"] == "batch/v1"
    template = job["spec"]["template"]
    assert template["spec"]["schedulerName"] == "kube-batch"
    assert template["spec"]["securityContext"] == {"seccompProfile": {"type": "RuntimeDefault"}}
    assert template["metadata"]["annotations"]["scheduling.k8s.io/group-name"] == "smoke-gang"
    podgroup = next(r for r in result.by_kind("PodGroup"))
    assert podgroup.inputs["spec"]["minMember"] == 4


def _gang(result: RunResult, name: str) -> dict[str, Any]:
    job = result.one("Job", name).inputs
    assert job["apiVersion"] == "batch.volcano.sh/v1alpha1"
    spec: dict[str, Any] = job["spec"]
    return spec


def test_training_gang(local: RunResult) -> None:
    spec = _gang(local, "smoke-gang")
    assert spec["minAvailable"] == 4
    assert spec["tasks"][0]["replicas"] == 4 and spec["tasks"][0]["minAvailable"] == 4
    assert spec["queue"] == "training"
    assert spec["priorityClassName"] == "gpu-training"
    assert spec["maxRetry"] == 3
    restart = {p["event"]: p["action"] for p in spec["policies"]}
    # A failed pod restarts the gang; an evicted one is replaced alone, the others wait in their pods (the gang
    # restarts in place: its command runs under the supervisor).
    assert restart["PodFailed"] == "RestartJob" and restart["PodEvicted"] == "RestartPod"
    pod = spec["tasks"][0]["template"]["spec"]
    assert pod["schedulerName"] == "volcano"
    exprs = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"][0]["matchExpressions"]
    assert {"key": "gpucluster.io/location", "operator": "In", "values": ["onprem"]} in exprs
    assert {"key": "type", "operator": "NotIn", "values": ["virtual-kubelet"]} in exprs
    # Its pool's taint, and the nodes the burst handover reserves for waiting training; nothing of inference's.
    assert pod["tolerations"] == [
        {"key": "gpucluster.io/pool", "operator": "Equal", "value": "local-gpu", "effect": "NoSchedule"},
        {"key": "gpucluster.io/reserved", "operator": "Exists", "effect": "NoSchedule"},
    ]
    container = pod["containers"][0]
    assert pod["securityContext"] == {"seccompProfile": {"type": "RuntimeDefault"}}
    assert container["securityContext"] == {"allowPrivilegeEscalation": False}
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "1"
    assert env["TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC"] == "480"
    assert container["resources"]["limits"]["nvidia.com/gpu"] == container["resources"]["requests"]["nvidia.com/gpu"]
    assert container["resources"]["requests"]["cpu"] == "4"
    assert container["resources"]["requests"]["memory"] == container["resources"]["limits"]["memory"] == "16Gi"
    assert "WORLD_SIZE" not in env, "the pytorch plugin owns rank and world size"
    # Workers wait at the handover gate until the burst controller has covered the inference they displace.
    assert pod["schedulingGates"] == [{"name": "gpucluster.io/handover"}]


def test_no_handover_gate_when_off_or_under_kube_batch(run_stack: StackRunner) -> None:
    off = run_stack("local", lambda c: c["gpu-cluster:burst"].update({"handover": {"enabled": False}}))
    assert "schedulingGates" not in _gang(off, "smoke-gang")["tasks"][0]["template"]["spec"]

    def no_inference(c: dict[str, Any]) -> None:
        c["gpu-cluster:inference"] = {"services": []}

    template = _gang(run_stack("local", no_inference), "smoke-gang")["tasks"][0]["template"]
    assert "schedulingGates" not in template["spec"]


def test_prod_example_job_is_disabled_but_can_be_enabled(prod: RunResult, run_stack: StackRunner) -> None:
    assert [r for r in prod.by_kind("Job") if r.metadata.get("name") == "llm-pretrain-70b"] == []

    def enable(c: dict[str, Any]) -> None:
        c[P + "training"]["jobs"][0]["enabled"] = True

    result = run_stack("prod", enable)
    spec = _gang(result, "llm-pretrain-70b")
    assert spec["minAvailable"] == 64
    assert spec["queue"] == "training-h100-a"  # the queue of the job's own pool
    assert spec["maxRetry"] == 20


def test_outputs(prod: RunResult) -> None:
    assert prod.outputs["onpremGpus"] == 2048
    assert prod.outputs["scheduler"] == "volcano"


def test_children_are_parented_to_their_component(prod: RunResult) -> None:
    by_urn = prod.by_urn()
    queue = prod.one("Queue", "training-h100-a")
    assert by_urn[queue.parent].type == "gpu-cluster:scheduling:GangScheduler"
    patch = next(iter(prod.by_type("kubernetes:core/v1:NodePatch")))
    assert by_urn[patch.parent].type == "gpu-cluster:nodes:GpuNodePools"
    assert by_urn[by_urn[patch.parent].parent].type == "gpu-cluster:index:UnifiedGpuCluster"
