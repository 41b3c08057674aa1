"""Each policy rule on resources built here: one that passes and one that fails with its message.

The rules are pure functions over (type, props, options); the same checks run through the pulumi_policy
objects the pack registers, which the last tests exercise with ResourceValidationArgs and
StackValidationArgs built by hand (as the engine would send them).
"""

from __future__ import annotations

import copy
import json
import re
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pulumi_policy import (
    PolicyCustomTimeouts,
    PolicyResource,
    PolicyResourceOptions,
    ResourceValidationArgs,
    ResourceValidationPolicy,
    StackValidationArgs,
    StackValidationPolicy,
)

from policies.rules import (
    MANDATORY,
    RULES,
    SECRET_PLACEHOLDER,
    Options,
    Resource,
    RuleContext,
    build_policies,
    engine_context,
    evaluate,
)
from policies.rules.allow_lists import RbacException, privileged_agents, rbac_exceptions
from policies.rules.burst import duration_seconds
from policies.rules.scheduling import scheduler_conf_problems
from policies.rules.security import url_passwords

CTX = replace(RuleContext.defaults(), virtual_nodes=frozenset({"vk-cloud"}))
PREFIX = "gpucluster.io"
WORKLOAD = f"{PREFIX}/workload"
IMAGE = "registry.gpucluster.io/platform/agent:0.1.0"


def res(kind: str, api_version: str, name: str, namespace: str | None = None, labels: dict[str, str] | None = None,
        options: Options | None = None, **body: Any) -> Resource:
    group_version = api_version if "/" in api_version else f"core/{api_version}"
    metadata: dict[str, Any] = {"name": name, "labels": labels or {}}
    if namespace:
        metadata["namespace"] = namespace
    return Resource(
        type=f"kubernetes:{group_version}:{kind}",
        props={"apiVersion": api_version, "kind": kind, "metadata": metadata, **body},
        urn=f"urn:pulumi:test::gpu-cluster::kubernetes:{group_version}:{kind}::{name}",
        name=name,
        options=options or Options(),
    )


def container(**overrides: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "name": "main",
        "image": IMAGE,
        "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}, "limits": {"memory": "128Mi"}},
        "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                            "runAsNonRoot": True, "capabilities": {"drop": ["ALL"]}},
    }
    base.update(overrides)
    return base


def platform_pod(**overrides: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {"securityContext": {"runAsNonRoot": True}, "containers": [container()]}
    spec.update(overrides)
    return spec


def gpu_container(gpus: Any = "1", limit: Any = None) -> dict[str, Any]:
    c = container()
    c["resources"] = {"requests": {"cpu": "4", "memory": "16Gi", "nvidia.com/gpu": gpus},
                      "limits": {"memory": "16Gi", "nvidia.com/gpu": gpus if limit is None else limit}}
    return c


def deployment(name: str, spec: dict[str, Any], labels: dict[str, str] | None = None, namespace: str = "gpu-system",
               replicas: int | None = None) -> Resource:
    labels = {"app.kubernetes.io/name": name, **(labels or {})}
    body: dict[str, Any] = {
        "selector": {"matchLabels": {"app.kubernetes.io/name": name}},
        "template": {"metadata": {"labels": labels}, "spec": spec},
    }
    if replicas is not None:
        body["replicas"] = replicas
    return res("Deployment", "apps/v1", name, namespace, labels, spec=body)


def inference_spec(**overrides: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "priorityClassName": "gpu-inference",
        "schedulerName": "volcano",
        "containers": [gpu_container()],
        "tolerations": [{"key": "virtual-kubelet.io/provider", "operator": "Exists", "effect": "NoSchedule"}],
    }
    spec.update(overrides)
    return spec


def inference(name: str = "chat", replicas: int | None = None, **overrides: Any) -> Resource:
    return deployment(name, inference_spec(**overrides), {WORKLOAD: "inference"}, "inference", replicas)


ONPREM_AFFINITY = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
    {"matchExpressions": [{"key": f"{PREFIX}/location", "operator": "In", "values": ["onprem"]},
                          {"key": "type", "operator": "NotIn", "values": ["virtual-kubelet"]}]}]}}}


def training_job(workers: int = 4, min_available: int | None = 4, **pod: Any) -> Resource:
    spec: dict[str, Any] = {
        "schedulerName": "volcano", "priorityClassName": "gpu-training", "affinity": ONPREM_AFFINITY,
        "containers": [gpu_container("8")],
    }
    spec.update(pod)
    body: dict[str, Any] = {"schedulerName": "volcano", "priorityClassName": "gpu-training", "queue": "training",
                            "tasks": [
        {"name": "worker", "replicas": workers,
         "template": {"metadata": {"labels": {WORKLOAD: "training"}}, "spec": spec}}]}
    if min_available is not None:
        body["minAvailable"] = min_available
    return res("Job", "batch.volcano.sh/v1alpha1", "pretrain", "training", spec=body)


def messages(rule: str, *resources: Resource, ctx: RuleContext = CTX) -> list[str]:
    chosen = [r for r in RULES if r.name == rule]
    assert chosen, f"no rule {rule}"
    return [v.message for v in evaluate(list(resources), ctx, chosen)]


# --------------------------------------------------------------------------- GPU pods


def test_gpu_priority_class() -> None:
    assert messages("gpu-priority-class", inference()) == []
    bad = inference(priorityClassName="high")
    assert messages("gpu-priority-class", bad) == [
        "spec.template.spec: GPU pod has priorityClassName 'high', not one of the GPU tiers "
        "['gpu-inference', 'gpu-training']; set priorityClassName to "
        "'gpu-training' for training or 'gpu-inference' for inference"
    ]
    # A declared tier above training would let a GPU pod preempt gangs: only the two GPU tiers count.
    assert len(messages("gpu-priority-class", inference(priorityClassName="platform-critical"))) == 1


def mig_container(request: Any = "1", limit: Any = "1") -> dict[str, Any]:
    c = container()
    c["resources"] = {"requests": {"cpu": "4", "memory": "16Gi", "nvidia.com/mig-3g.40gb": request},
                      "limits": {"memory": "16Gi", "nvidia.com/mig-3g.40gb": limit}}
    return c


def test_mig_slices_count_as_gpus() -> None:
    assert messages("gpu-priority-class", inference(containers=[mig_container()])) == []
    assert messages("gpu-scheduler", inference(containers=[mig_container()])) == []
    assert len(messages("gpu-priority-class", inference(priorityClassName=None, containers=[mig_container()]))) == 1
    assert len(messages("gpu-scheduler", inference(schedulerName=None, containers=[mig_container()]))) == 1
    assert messages("gpu-limits-equal-requests", inference(containers=[mig_container("1", "2")])) == [
        "spec.template.spec.containers[main]: nvidia.com/mig-3g.40gb requests (1) and limits (2) differ; GPUs "
        "cannot be overcommitted, set resources.requests and resources.limits 'nvidia.com/mig-3g.40gb' to the "
        "same count"
    ]


def test_gpu_limits_equal_requests() -> None:
    assert messages("gpu-limits-equal-requests", inference(containers=[gpu_container(2, "2")])) == []
    bad = inference(containers=[gpu_container("1", "2")])
    assert messages("gpu-limits-equal-requests", bad) == [
        "spec.template.spec.containers[main]: nvidia.com/gpu requests (1) and limits (2) differ; GPUs cannot be "
        "overcommitted, set resources.requests and resources.limits 'nvidia.com/gpu' to the same count"
    ]


def test_gpu_scheduler_and_platform_pods_without_gpus_are_not_concerned() -> None:
    assert messages("gpu-scheduler", inference(), deployment("agent", platform_pod())) == []
    bad = inference(schedulerName=None)
    assert messages("gpu-scheduler", bad) == [
        "spec.template.spec: GPU pod uses schedulerName 'default-scheduler'; every GPU pod must go through "
        "'volcano' (two schedulers double-book GPUs and the gang scheduler cannot preempt pods it did not "
        "place); set schedulerName: volcano, or submit with `gpucluster train submit`"
    ]


def test_volcano_job_level_scheduler_and_class_apply_to_its_pods() -> None:
    job = training_job()
    for task in job.props["spec"]["tasks"]:
        del task["template"]["spec"]["schedulerName"]
        del task["template"]["spec"]["priorityClassName"]
    assert messages("gpu-scheduler", job) == []
    assert messages("gpu-priority-class", job) == []


# --------------------------------------------------------------------------- training


def test_training_gang_scheduled() -> None:
    assert messages("training-gang-scheduled", training_job()) == []
    assert messages("training-gang-scheduled", training_job(workers=4, min_available=2)) == [
        "spec.minAvailable is 2 but the tasks have 4 replicas; a partial gang holds GPUs without making "
        "progress: set spec.minAvailable: 4"
    ]
    plain = deployment("trainer", training_job().props["spec"]["tasks"][0]["template"]["spec"],
                       {WORKLOAD: "training"}, "training")
    assert messages("training-gang-scheduled", plain) == [
        f"Deployment is training (priorityClassName 'gpu-training', {WORKLOAD}='training') but is not "
        "gang-scheduled; run training as a Volcano Job (batch.volcano.sh) with minAvailable equal to its replicas"
    ]


def test_training_is_recognised_by_its_priority_class_in_any_workload_kind() -> None:
    spec = training_job().props["spec"]["tasks"][0]["template"]["spec"]
    relabelled = {WORKLOAD: "inference"}
    as_deployment = deployment("trainer", spec, relabelled, "training")
    as_pod = res("Pod", "v1", "trainer", "training", relabelled, spec=spec)
    as_job = res("Job", "batch/v1", "trainer", "training", relabelled,
                 spec={"template": {"metadata": {"labels": relabelled}, "spec": spec}})
    for workload in (as_deployment, as_pod, as_job):
        assert messages("training-gang-scheduled", workload) == [
            f"{workload.kind} is training (priorityClassName 'gpu-training', {WORKLOAD}='inference') but is not "
            "gang-scheduled; run training as a Volcano Job (batch.volcano.sh) with minAvailable equal to its replicas"
        ]
    off_prem = res("Pod", "v1", "trainer", "training", relabelled, spec={**spec, "affinity": {}})
    assert len(messages("training-onprem-only", off_prem)) == 1
    # kube-batch: an Indexed Job ganged by its PodGroup annotation is gang-scheduled.
    ganged = res("Job", "batch/v1", "trainer", "training", spec={"template": {
        "metadata": {"annotations": {"scheduling.k8s.io/group-name": "trainer"}}, "spec": spec}})
    assert messages("training-gang-scheduled", ganged) == []


def test_training_outranks_inference() -> None:
    assert messages("training-outranks-inference", training_job()) == []
    assert messages("training-outranks-inference", training_job(priorityClassName="gpu-inference")) == [
        "spec.tasks[worker].template.spec: training uses priorityClassName 'gpu-inference' (value 10000), which "
        "does not outrank inference ('gpu-inference', value 10000), so a gang cannot take GPUs from inference; "
        "set priorityClassName: gpu-training"
    ]


def test_training_onprem_only() -> None:
    assert messages("training-onprem-only", training_job()) == []
    preferred_only = {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 100, "preference": {"matchExpressions": [
            {"key": f"{PREFIX}/location", "operator": "In", "values": ["onprem"]}]}}]}}
    expected = [
        "spec.tasks[worker].template.spec: training pods may land on a virtual node; add a required node "
        f"affinity whose every term has {PREFIX}/location In [onprem] (or 'type NotIn [virtual-kubelet]')"
    ]
    assert messages("training-onprem-only", training_job(affinity=preferred_only)) == expected
    # One term that allows external nodes is enough to reach a virtual node (terms are ORed).
    two_terms = copy.deepcopy(ONPREM_AFFINITY)
    terms = two_terms["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    terms.append({"matchExpressions": [{"key": f"{PREFIX}/location", "operator": "In", "values": ["external"]}]})
    assert messages("training-onprem-only", training_job(affinity=two_terms)) == expected



def test_training_no_spare_toleration() -> None:
    assert messages("training-no-spare-toleration", training_job()) == []
    spare = {"key": f"{PREFIX}/spare", "operator": "Exists", "effect": "NoSchedule"}
    assert messages("training-no-spare-toleration", training_job(tolerations=[spare])) == [
        f"spec.tasks[worker].template.spec: training tolerates the warm spares' taint {PREFIX}/spare, so a gang may "
        "take a pool's spares and a quarantine under another gang would find none; remove that toleration"]
    # Inference may use a spare's idle GPUs: the rule is training's only.
    assert messages("training-no-spare-toleration", inference(tolerations=[spare])) == []


# --------------------------------------------------------------------------- taints


def node_patch(name: str, taints: list[dict[str, str]], labels: dict[str, str] | None = None) -> Resource:
    r = res("Node", "v1", name, labels=labels, spec={"taints": taints})
    return replace(r, type="kubernetes:core/v1:NodePatch")


def test_no_noexecute_taints_on_nodes() -> None:
    ok = [
        node_patch("vk-cloud", [{"key": f"{PREFIX}/burst", "value": "closed", "effect": "NoSchedule"}]),
        node_patch("gpu-01", [{"key": "maintenance", "value": "x", "effect": "NoExecute"}]),
    ]
    assert messages("no-noexecute-taints", *ok) == []
    fix = "use effect NoSchedule (running pods stay; the descheduler moves them back gradually)"
    assert messages("no-noexecute-taints", node_patch("gpu-01", [
        {"key": f"{PREFIX}/thermal", "value": "hot", "effect": "NoExecute"}])) == [
        f"taint {PREFIX}/thermal:NoExecute on node gpu-01; {fix}"
    ]
    assert messages("no-noexecute-taints", node_patch("gpu-02", [
        {"key": f"{PREFIX}/gpu-health", "value": "fatal", "effect": "NoExecute"}])) == [
        f"taint {PREFIX}/gpu-health:NoExecute on node gpu-02; {fix}"
    ]
    assert messages("no-noexecute-taints", node_patch("vk-other", [
        {"key": "liqo.io/virtual-node", "value": "true", "effect": "NoExecute"}], {"type": "virtual-kubelet"})) == [
        f"virtual node vk-other gets taint liqo.io/virtual-node:NoExecute, which would evict every inference pod "
        f"running there at once; {fix}"
    ]


def test_no_noexecute_in_provider_args_or_controller_config() -> None:
    provider = deployment("vk-cloud", platform_pod(containers=[container(
        image="ghcr.io/virtual-kubelet/virtual-kubelet:1.11.0", args=["--provider=cloud", "--disable-taint=false"])]))
    assert messages("no-noexecute-taints", provider) == []
    bad_provider = deployment("vk-cloud", platform_pod(containers=[container(
        image="ghcr.io/virtual-kubelet/virtual-kubelet:1.11.0",
        args=["--taint=virtual-kubelet.io/provider=cloud:NoExecute"])]))
    assert messages("no-noexecute-taints", bad_provider) == [
        "spec.template.spec.containers[main].args[0]: 'virtual-kubelet.io/provider=cloud:NoExecute' sets a "
        "NoExecute taint; use effect NoSchedule (running pods stay; the descheduler moves them back gradually)"
    ]
    config = res("ConfigMap", "v1", "burst-controller", "gpu-system",
                 data={"settings.yaml": f"taint: {PREFIX}/burst=closed:NoExecute\n"})
    assert messages("no-noexecute-taints", config) == [
        f"data.settings.yaml: '{PREFIX}/burst=closed:NoExecute' configures a NoExecute taint; use effect NoSchedule "
        "(running pods stay; the descheduler moves them back gradually)"
    ]


# --------------------------------------------------------------------------- inference


def hpa(target: str, namespace: str = "inference", min_replicas: int = 2) -> Resource:
    return res("HorizontalPodAutoscaler", "autoscaling/v2", target, namespace, spec={
        "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": target},
        "minReplicas": min_replicas, "maxReplicas": 8})


def pdb(name: str, namespace: str = "inference", **spec: Any) -> Resource:
    body = {"selector": {"matchLabels": {"app.kubernetes.io/name": name}}, **(spec or {"maxUnavailable": 1})}
    return res("PodDisruptionBudget", "policy/v1", name, namespace, spec=body)


def test_inference_no_fixed_replicas() -> None:
    assert messages("inference-no-fixed-replicas", inference(), deployment("agent", platform_pod(), replicas=1)) == []
    assert messages("inference-no-fixed-replicas", inference(replicas=3)) == [
        "inference Deployment sets spec.replicas; every `pulumi up` would reset what the HPA chose. Remove "
        "spec.replicas and let the HorizontalPodAutoscaler own the count"
    ]


def test_inference_autoscaled_by_hpa_or_keda() -> None:
    keda = res("ScaledObject", "keda.sh/v1alpha1", "whisper", "inference", spec={"scaleTargetRef": {"name": "whisper"}})
    assert messages("inference-autoscaled", inference("chat"), hpa("chat"), inference("whisper"), keda) == []
    assert messages("inference-autoscaled", inference("chat"), hpa("chat", namespace="other")) == [
        "inference Deployment chat has no HorizontalPodAutoscaler (or KEDA ScaledObject) in namespace 'inference' "
        "targeting it; add one with scaleTargetRef kind Deployment, name chat"
    ]


def test_inference_pdb() -> None:
    assert messages("inference-pdb", inference("chat"), pdb("chat")) == []
    assert messages("inference-pdb", inference("chat"), pdb("other")) == [
        "inference Deployment chat has no PodDisruptionBudget selecting its pods; add a policy/v1 "
        "PodDisruptionBudget (maxUnavailable: 1) so drains and the descheduler move it gradually"
    ]


def test_inference_no_burst_toleration() -> None:
    assert messages("inference-no-burst-toleration", inference()) == []
    burst = inference(tolerations=[{"key": f"{PREFIX}/burst", "operator": "Exists", "effect": "NoSchedule"}])
    assert messages("inference-no-burst-toleration", burst) == [
        f"spec.template.spec: inference that is no standby tolerates the burst taint {PREFIX}/burst, so closing "
        "burst capacity would not keep new pods on-prem; remove that toleration (tolerate only the provider's taint)"
    ]
    everything = inference(tolerations=[{"operator": "Exists"}])
    assert messages("inference-no-burst-toleration", everything) == [
        "spec.template.spec: a toleration with operator Exists and no key tolerates every taint, including "
        f"{PREFIX}/burst; list the taints inference may tolerate instead"
    ]


# --------------------------------------------------------------------------- descheduler


def descheduler(evictor: dict[str, Any], **limits: Any) -> Resource:
    policy: dict[str, Any] = {
        "apiVersion": "descheduler/v1alpha2", "kind": "DeschedulerPolicy",
        "maxNoOfPodsToEvictPerNode": 2, "maxNoOfPodsToEvictPerNamespace": 4, "maxNoOfPodsToEvictTotal": 8,
        "profiles": [{"name": "return", "pluginConfig": [{"name": "DefaultEvictor", "args": evictor}]}],
    }
    policy.update(limits)
    for key in [k for k, v in policy.items() if v is None]:
        del policy[key]
    return res("ConfigMap", "v1", "descheduler-policy", "gpu-system", data={"policy.yaml": json.dumps(policy)})


def test_descheduler_bounded() -> None:
    assert messages("descheduler-bounded", descheduler({"priorityThreshold": {"value": 10001}})) == []
    assert messages("descheduler-bounded", descheduler({"priorityThreshold": {"name": "gpu-inference"}})) == []
    assert messages("descheduler-bounded", descheduler(
        {"labelSelector": {"matchLabels": {WORKLOAD: "inference"}}})) == []
    assert messages("descheduler-bounded", descheduler({"labelSelector": {"matchExpressions": [
        {"key": WORKLOAD, "operator": "NotIn", "values": ["training"]}]}})) == []
    assert messages("descheduler-bounded", descheduler(
        {"priorityThreshold": {"value": 2_000_000}}, maxNoOfPodsToEvictTotal=None)) == [
        "data.policy.yaml: maxNoOfPodsToEvictTotal is None; set it between 1 and 16 (descheduler.* in the stack "
        "config) so inference returns on-prem a few pods per cycle, not all at once",
        "data.policy.yaml: profile 'return' can evict training; give its DefaultEvictor a priorityThreshold at or "
        f"below 'gpu-training' (1000000) or a labelSelector '{WORKLOAD} In [inference]'",
    ]
    assert messages("descheduler-bounded", descheduler(
        {"priorityThreshold": {"value": 10001}}, maxNoOfPodsToEvictPerNode=50)) == [
        "data.policy.yaml: maxNoOfPodsToEvictPerNode is 50; set it between 1 and 4 (descheduler.* in the stack "
        "config) so inference returns on-prem a few pods per cycle, not all at once"
    ]


# --------------------------------------------------------------------------- checkpoints

KEPT = Options(protect=True, retain_on_delete=True)


def claim(options: Options = KEPT, modes: list[str] | None = None) -> Resource:
    return res("PersistentVolumeClaim", "v1", "checkpoints-weka", "training",
               {"app.kubernetes.io/component": "checkpoint-storage"}, options,
               spec={"accessModes": modes or ["ReadWriteMany"], "resources": {"requests": {"storage": "1Ti"}}})


def volume(policy: str = "Retain", options: Options = KEPT) -> Resource:
    return res("PersistentVolume", "v1", "checkpoints-static", options=options, spec={
        "accessModes": ["ReadWriteMany"], "persistentVolumeReclaimPolicy": policy})


def storage_class(policy: str = "Retain") -> Resource:
    return res("StorageClass", "storage.k8s.io/v1", "checkpoints-weka", provisioner="csi.weka.io", reclaimPolicy=policy)


def test_checkpoint_storage_retained() -> None:
    scratch = res("PersistentVolumeClaim", "v1", "scratch", "inference", spec={"accessModes": ["ReadWriteOnce"]})
    assert messages("checkpoint-storage-retained", claim(), volume(), storage_class(), scratch) == []
    # The engine does not report retainOnDelete (None): only what it can see is judged.
    assert messages("checkpoint-storage-retained", claim(Options(protect=True, retain_on_delete=None))) == []
    assert messages("checkpoint-storage-retained", claim(Options(protect=False, retain_on_delete=False))) == [
        "not protected; register it with ResourceOptions(protect=True) so no infrastructure change can delete "
        "checkpoints",
        "retainOnDelete is off; register it with ResourceOptions(retain_on_delete=True) so removing it from the "
        "program leaves the object in the cluster",
    ]
    assert messages("checkpoint-storage-retained", claim(modes=["ReadWriteOnce"])) == [
        "accessModes is ['ReadWriteOnce']; every worker of a gang writes its shard, so set accessModes: "
        "[ReadWriteMany] on a shared-filesystem backend"
    ]
    assert messages("checkpoint-storage-retained", volume("Delete")) == [
        "persistentVolumeReclaimPolicy is 'Delete'; set persistentVolumeReclaimPolicy: Retain so deleting the "
        "claim keeps the checkpoints"
    ]
    assert messages("checkpoint-storage-retained", storage_class("Delete")) == [
        "reclaimPolicy is 'Delete'; set reclaimPolicy: Retain so volumes it provisions outlive their claims"
    ]


# --------------------------------------------------------------------------- observability


def prometheus_rule(expr: str) -> Resource:
    return res("PrometheusRule", "monitoring.coreos.com/v1", "gpu-alerts", "monitoring", spec={
        "groups": [{"name": "gpu-thermal", "rules": [{"alert": "GpuTooHot", "expr": expr, "for": "2m"}]}]})


def test_thermal_alert_threshold() -> None:
    assert messages("thermal-alert-threshold", prometheus_rule("max by (Hostname) (DCGM_FI_DEV_GPU_TEMP) > 78")) == []
    assert messages("thermal-alert-threshold", prometheus_rule("DCGM_FI_DEV_GPU_TEMP >= 73")) == []
    assert messages("thermal-alert-threshold", prometheus_rule("avg(DCGM_FI_DEV_GPU_TEMP{gpu!=''}) > 85")) == [
        "rule 'GpuTooHot' in group 'gpu-thermal' compares GPU temperature > 85 °C, above the configured limit of "
        "78 °C; use observability.thermalThresholdCelsius instead of a literal"
    ]


def counters(*fields: str) -> Resource:
    csv = "# field, type, help\n" + "".join(f"{f}, gauge, help text\n" for f in fields)
    return res("ConfigMap", "v1", "dcgm-counters", "monitoring", data={"counters.csv": csv})


def test_dcgm_counters() -> None:
    full = counters("DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "DCGM_FI_DEV_XID_ERRORS")
    assert messages("dcgm-counters", full, res("ConfigMap", "v1", "other", "x", data={"a": "b"})) == []
    assert messages("dcgm-counters", counters("DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_GPU_UTIL")) == [
        "data.counters.csv: the DCGM counters CSV lacks DCGM_FI_PROF_PIPE_TENSOR_ACTIVE; add a line "
        "'DCGM_FI_PROF_PIPE_TENSOR_ACTIVE, gauge, …' — temperature drives the thermal guard and tensor activity "
        "is the utilization that does not lie"
    ]
    # A commented-out line does not count.
    commented = counters("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE")
    commented.props["data"]["counters.csv"] += "# DCGM_FI_DEV_GPU_TEMP, gauge, temp\n"
    assert len(messages("dcgm-counters", commented)) == 1


# --------------------------------------------------------------------------- images and pods


@pytest.mark.parametrize("image", [IMAGE, "registry:5000/x/agent:1.2", "busybox@sha256:" + "a" * 64])
def test_images_pinned_pass(image: str) -> None:
    assert messages("images-pinned", deployment("agent", platform_pod(containers=[container(image=image)]))) == []


@pytest.mark.parametrize(("image", "problem"), [
    ("registry:5000/x/agent", "image 'registry:5000/x/agent' has no tag or digest"),
    ("busybox:latest", "image 'busybox:latest' uses the 'latest' tag"),
])
def test_images_pinned_fail(image: str, problem: str) -> None:
    bad = deployment("agent", platform_pod(initContainers=[container(name="init", image=image)]))
    assert messages("images-pinned", bad) == [
        f"spec.template.spec.initContainers[init]: {problem}; pin a version tag or digest (components/images.py)"
    ]


def test_helm_chart_must_pin_a_version() -> None:
    chart = Resource("kubernetes:helm.sh/v4:Chart", {"chart": "volcano", "version": "1.15.0"}, "urn:chart", "volcano")
    assert messages("images-pinned", chart) == []
    assert messages("images-pinned", replace(chart, props={"chart": "volcano"})) == [
        "Helm chart without a version; pin version= so a chart release cannot change the cluster"
    ]


def test_pod_security_restricted() -> None:
    assert messages("pod-security-restricted", deployment("agent", platform_pod()), inference(), training_job()) == []
    loose = container(securityContext={"runAsNonRoot": False, "readOnlyRootFilesystem": False})
    assert messages("pod-security-restricted", deployment("agent", {"containers": [loose]})) == [
        "spec.template.spec.containers[main]: runAsNonRoot is not true; use "
        "components.security.pod_security_context() and container_security_context()",
        "spec.template.spec.containers[main]: readOnlyRootFilesystem is not true; set it and mount an emptyDir "
        "where the process must write",
        "spec.template.spec.containers[main]: allowPrivilegeEscalation is not false; set "
        "allowPrivilegeEscalation: false",
    ]


def test_a_stack_declared_inference_service_is_held_to_the_restricted_profile() -> None:
    """Acceptance found a root inference Deployment with privilege escalation and a writable root filesystem drawing
    only an advisory: the stack declares its inference services, so the mandatory rule holds for them too. Training
    gangs (the researchers' images) stay with the namespace's Pod Security admission."""
    root = gpu_container()
    root["securityContext"] = {"runAsNonRoot": False, "allowPrivilegeEscalation": True,
                               "readOnlyRootFilesystem": False}
    found = evaluate([inference(containers=[root])], CTX)
    assert [(v.rule, v.level, v.message) for v in found if v.rule == "pod-security-restricted"] == [
        ("pod-security-restricted", MANDATORY, f"spec.template.spec.containers[main]: {m}") for m in (
            "runAsNonRoot is not true; use components.security.pod_security_context() and "
            "container_security_context()",
            "readOnlyRootFilesystem is not true; set it and mount an emptyDir where the process must write",
            "allowPrivilegeEscalation is not false; set allowPrivilegeEscalation: false")]
    assert messages("pod-security-restricted", training_job(containers=[root])) == []


def dcgm(name: str = "dcgm-exporter", account: str = "dcgm-exporter", namespace: str = "gpu-telemetry") -> Resource:
    sys_admin = container(securityContext={"readOnlyRootFilesystem": True, "runAsNonRoot": False,
                                           "capabilities": {"add": ["SYS_ADMIN"], "drop": ["ALL"]}},
                          volumeMounts=[{"name": "pod-resources", "mountPath": "/var/lib/kubelet/pod-resources",
                                         "readOnly": True}])
    spec = {"serviceAccountName": account, "containers": [sys_admin], "volumes": [
        {"name": "pod-resources", "hostPath": {"path": "/var/lib/kubelet/pod-resources"}}]}
    return res("DaemonSet", "apps/v1", name, namespace, {"app.kubernetes.io/name": name}, spec={
        "selector": {"matchLabels": {"app.kubernetes.io/name": name}},
        "template": {"metadata": {"labels": {"app.kubernetes.io/name": name}}, "spec": spec}})


DCGM_GRANT = ("dcgm-exporter (namespace 'gpu-telemetry', service account 'dcgm-exporter') is allow-listed for "
              "capabilities ['SYS_ADMIN'] and read-only host paths ['/var/lib/kubelet/pod-resources'] only")


def test_allow_listed_component_keeps_only_its_exception() -> None:
    assert messages("pod-security-restricted", dcgm()) == []
    assert messages("privileges-allow-listed", dcgm()) == []
    # The allow-list is keyed on the pod's identity, not its label: another name with the same identity is fine...
    assert messages("privileges-allow-listed", dcgm(name="gpu-metrics")) == []
    # ...and the CAP_ spelling of the same capability too.
    cap_prefixed = dcgm()
    cap_prefixed.props["spec"]["template"]["spec"]["containers"][0]["securityContext"]["capabilities"]["add"] = [
        "CAP_SYS_ADMIN"]
    assert messages("privileges-allow-listed", cap_prefixed) == []


@pytest.mark.parametrize(("account", "namespace"), [("default", "gpu-telemetry"), ("dcgm-exporter", "inference"),
                                                    ("dcgm-exporter", "gpu-system")])
def test_a_relabelled_pod_gets_no_privilege(account: str, namespace: str) -> None:
    how = (f"no agent with namespace '{namespace}', service account '{account}' is allow-listed; add a "
           "PrivilegedAgent to policies/rules/allow_lists.py with the reason, or drop the privilege")
    assert messages("privileges-allow-listed", dcgm(account=account, namespace=namespace)) == [
        f"spec.template.spec: hostPath volumes ['/var/lib/kubelet/pod-resources'] are not allow-listed; {how}",
        f"spec.template.spec.containers[main]: adds capabilities ['SYS_ADMIN'] that are not allow-listed; {how}",
    ]
    assert messages("pod-security-restricted", dcgm(account=account, namespace=namespace)) == [
        "spec.template.spec.containers[main]: runAsNonRoot is not true; use "
        "components.security.pod_security_context() and container_security_context()",
        "spec.template.spec.containers[main]: allowPrivilegeEscalation is not false; set "
        "allowPrivilegeEscalation: false",
    ]


def test_an_allow_listed_agent_gets_nothing_beyond_its_grant() -> None:
    wider = dcgm()
    pod = wider.props["spec"]["template"]["spec"]
    pod["containers"][0]["securityContext"]["capabilities"]["add"].append("NET_ADMIN")
    pod["volumes"].append({"name": "root", "hostPath": {"path": "/"}})
    pod["containers"][0]["volumeMounts"].append({"name": "root", "mountPath": "/host", "readOnly": True})
    reason = next(a.reason for a in CTX.privileged if a.name == "dcgm-exporter")
    assert messages("privileges-allow-listed", wider) == [
        f"spec.template.spec: hostPath volumes ['/'] are not allow-listed; {DCGM_GRANT} ({reason})",
        f"spec.template.spec.containers[main]: adds capabilities ['NET_ADMIN'] that are not allow-listed; "
        f"{DCGM_GRANT} ({reason})",
    ]
    writable = dcgm()
    writable.props["spec"]["template"]["spec"]["containers"][0]["volumeMounts"][0]["readOnly"] = False
    writable.props["spec"]["template"]["spec"]["hostNetwork"] = True
    writable.props["spec"]["template"]["spec"]["containers"][0]["securityContext"]["privileged"] = True
    assert messages("privileges-allow-listed", writable) == [
        "spec.template.spec: hostNetwork is true; no component of this platform needs it — remove it",
        "spec.template.spec.containers[main]: privileged: true; grant the single capability needed instead "
        "(e.g. SYS_ADMIN for DCGM profiling) and remove privileged",
        "spec.template.spec.containers[main]: hostPath /var/lib/kubelet/pod-resources is mounted read-write; set "
        "readOnly: true on the volumeMount",
    ]


def test_the_agents_namespace_follows_the_stack_config() -> None:
    moved = replace(CTX, privileged=privileged_agents("gpu-agents"))
    assert messages("privileges-allow-listed", dcgm(namespace="gpu-agents"), ctx=moved) == []
    assert len(messages("privileges-allow-listed", dcgm(), ctx=moved)) == 2


# --------------------------------------------------------------------------- RBAC and credentials


def role(rules: list[dict[str, Any]]) -> Resource:
    return res("ClusterRole", "rbac.authorization.k8s.io/v1", "agent", rules=rules)


def binding(role_name: str) -> Resource:
    return res("ClusterRoleBinding", "rbac.authorization.k8s.io/v1", "agent",
               roleRef={"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role_name},
               subjects=[{"kind": "ServiceAccount", "name": "agent", "namespace": "gpu-system"}])


def test_rbac_least_privilege() -> None:
    good = role([{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch", "patch"]}])
    assert messages("rbac-least-privilege", good, binding("agent")) == []
    bad = role([{"apiGroups": ["*"], "resources": ["pods"], "verbs": ["*"]}])
    assert messages("rbac-least-privilege", bad, binding("cluster-admin")) == [
        "rules[0].verbs contains '*'; list the exact verbs the component uses (least privilege)",
        "rules[0].apiGroups contains '*'; list the exact apiGroups the component uses (least privilege)",
        "binds cluster-admin; bind a ClusterRole that lists only the verbs and resources needed",
    ]


def secret(value: str) -> Resource:
    return res("Secret", "v1", "vk-credentials", "gpu-system", stringData={"kubeconfig": value})


def test_no_plain_credentials() -> None:
    env_ok = container(env=[{"name": "QUEUE_CREDENTIALS", "valueFrom": {"secretKeyRef": {"name": "q", "key": "url"}}},
                            {"name": "TOKEN_FILE", "value": "/var/run/token"},
                            {"name": "KUBECONFIG", "value": "/etc/kube/config"}])
    assert messages("no-plain-credentials", secret(SECRET_PLACEHOLDER),
                    deployment("agent", platform_pod(containers=[env_ok]))) == []
    env_bad = container(env=[{"name": "QUEUE_PASSWORD", "value": "hunter2"}])
    provider = Resource("pulumi:providers:kubernetes", {"kubeconfig": "apiVersion: v1\nkind: Config"},
                        "urn:provider", "dr-cluster")
    assert messages("no-plain-credentials", secret("apiVersion: v1"),
                    deployment("agent", platform_pod(containers=[env_bad])), provider) == [
        "stringData.kubeconfig is a plain value; read it with components.stack.secret_value() from a key set by "
        "`pulumi config set --secret`",
        "spec.template.spec.containers[main].env[QUEUE_PASSWORD] holds a credential literally; use "
        "valueFrom.secretKeyRef to a Secret whose data comes from secret config",
        "provider input 'kubeconfig' is a plain value; read it with components.stack.secret_value() from a key "
        "set by `pulumi config set --secret`",
    ]


def test_no_plain_credentials_under_the_engine_compares_with_plain_config() -> None:
    # The engine unwraps secrets: only a value that also sits in plain config is known to be plain.
    engine = replace(CTX, secrets_marked=False, plain_config_values=frozenset({"amqp://guest:guest@queue"}))
    assert messages("no-plain-credentials", secret("decrypted-secret-value"), ctx=engine) == []
    assert len(messages("no-plain-credentials", secret("amqp://guest:guest@queue"), ctx=engine)) == 1


# --------------------------------------------------------------------------- advisory


def test_container_resources_advisory() -> None:
    assert messages("container-resources", deployment("agent", platform_pod())) == []
    bare = deployment("agent", platform_pod(containers=[container(resources={"limits": {"memory": "1Gi"}})]))
    assert messages("container-resources", bare) == [
        "spec.template.spec.containers[main]: no resources.requests for cpu, memory; without requests the "
        "scheduler packs blindly — use components.security.resources()"
    ]
    assert next(r for r in RULES if r.name == "container-resources").mandatory is False


def test_pdb_sanity_advisory() -> None:
    assert messages("pdb-sanity", inference("chat"), hpa("chat", min_replicas=4), pdb("chat")) == []
    assert messages("pdb-sanity", inference("chat"), hpa("chat", min_replicas=2), pdb("chat", minAvailable=2)) == [
        "minAvailable 2 is not below the HPA's minReplicas 2 for chat: at the floor nothing may be evicted; use "
        "maxUnavailable: 1"
    ]
    assert messages("pdb-sanity", pdb("chat", maxUnavailable=0)) == [
        "allows no voluntary disruption: node drains and the descheduler's gradual return stall; use "
        "maxUnavailable: 1"
    ]


# --------------------------------------------------------------------------- the pack's policy objects


def test_every_rule_has_a_level_a_reason_and_a_unique_name() -> None:
    names = [r.name for r in RULES]
    assert len(names) == len(set(names))
    assert {r.level.value for r in RULES} == {"mandatory", "advisory"}
    assert all(r.why_level and r.description for r in RULES)
    assert all((r.check is None) != (r.stack_check is None) for r in RULES)


def _opts(protect: bool) -> PolicyResourceOptions:
    return PolicyResourceOptions(protect, [], None, [], PolicyCustomTimeouts(0, 0, 0), [])


def test_resource_policy_reports_through_the_pulumi_policy_api() -> None:
    policies = {p.name: p for p in build_policies(lambda: CTX)}
    policy = policies["rbac-least-privilege"]
    assert isinstance(policy, ResourceValidationPolicy)
    assert policy.enforcement_level is not None and policy.enforcement_level.value == "mandatory"
    bad = role([{"apiGroups": [""], "resources": ["*"], "verbs": ["get"]}])
    reported: list[tuple[str, str | None]] = []

    def report(message: str, urn: str | None = None) -> None:
        reported.append((message, urn))

    args = ResourceValidationArgs(bad.type, bad.props, bad.urn, bad.name, _opts(False), None)
    policy.validate(args, report)
    assert reported == [("rules[0].resources contains '*'; list the exact resources the component uses "
                         "(least privilege)", None)]
    # The engine sends no retainOnDelete: an unprotected claim is still caught by protect alone.
    ckpt = claim(Options(protect=False, retain_on_delete=True))
    reported.clear()
    checkpoint_policy = policies["checkpoint-storage-retained"]
    assert isinstance(checkpoint_policy, ResourceValidationPolicy)
    checkpoint_policy.validate(
        ResourceValidationArgs(ckpt.type, ckpt.props, ckpt.urn, ckpt.name, _opts(False), None), report
    )
    assert [m for m, _ in reported] == [
        "not protected; register it with ResourceOptions(protect=True) so no infrastructure change can delete "
        "checkpoints"
    ]


def test_unknown_preview_values_read_as_none() -> None:
    from pulumi_policy.proxy import UNKNOWN_STRING_VALUE, unknown_checking_proxy

    from policies.rules import plain

    assert plain(unknown_checking_proxy({"a": {"b": UNKNOWN_STRING_VALUE, "c": [1, UNKNOWN_STRING_VALUE]}})) == {
        "a": {"b": None, "c": [1, None]}
    }


def test_stack_policy_reports_the_urn_of_the_offender() -> None:
    policy = next(p for p in build_policies(lambda: CTX) if p.name == "inference-autoscaled")
    assert isinstance(policy, StackValidationPolicy)
    deployments = [inference("chat"), inference("whisper"), hpa("whisper")]
    resources = [PolicyResource(r.type, r.props, r.urn, r.name, _opts(False), None, None, [], {}) for r in deployments]
    reported: list[tuple[str, str | None]] = []

    def report(message: str, urn: str | None = None) -> None:
        reported.append((message, urn))

    policy.validate(StackValidationArgs(resources), report)
    assert [urn for _, urn in reported] == [deployments[0].urn]


def test_engine_context_reads_the_stack_config_the_engine_passes(monkeypatch: pytest.MonkeyPatch) -> None:
    from components.mockrt import stack_config

    config, secrets = stack_config("local")
    env = {k: (v if isinstance(v, str) else json.dumps(v)) for k, v in config.items()}
    for key in secrets:
        env[key] = "decrypted-token"  # what the engine hands the pack for a secure: value
    monkeypatch.setenv("PULUMI_CONFIG", json.dumps(env))
    monkeypatch.setenv("PULUMI_STACK", "local")
    ctx = engine_context()
    assert ctx.secrets_marked is False
    assert ctx.virtual_nodes == frozenset({"vk-local-cloud", "vk-backup-cloud"})
    assert ctx.max_evictions_total == 2
    assert "amqp://queue.local:5672/jobs" in ctx.plain_config_values
    assert "decrypted-token" not in ctx.plain_config_values


def test_the_pack_serves_the_rules_over_the_analyzer_protocol() -> None:
    """Start policies/__main__.py as the engine would and ask it over gRPC (no CLI needed)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    import grpc
    from google.protobuf import empty_pb2, struct_pb2
    from pulumi.runtime.proto import analyzer_pb2, analyzer_pb2_grpc

    from components.mockrt import ROOT, stack_config

    config, _ = stack_config("local")
    env = {**os.environ, "PULUMI_STACK": "local", "PULUMI_PROJECT": "gpu-cluster", "PULUMI_DRY_RUN": "true",
           "PULUMI_CONFIG": json.dumps({k: v if isinstance(v, str) else json.dumps(v) for k, v in config.items()})}
    pack = subprocess.Popen([sys.executable, str(Path(ROOT, "policies", "__main__.py"))], cwd=ROOT / "policies",
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert pack.stdout is not None
        port = int(pack.stdout.readline().decode().strip())
        channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        stub = analyzer_pb2_grpc.AnalyzerStub(channel)
        info = stub.GetAnalyzerInfo(empty_pb2.Empty(), timeout=30)
        assert info.name == "gpu-cluster-policies"
        assert sorted(p.name for p in info.policies) == sorted(r.name for r in RULES)
        bad = role([{"apiGroups": [""], "resources": ["pods"], "verbs": ["*"]}])
        props = struct_pb2.Struct()
        props.update(dict(bad.props))
        response = stub.Analyze(analyzer_pb2.AnalyzeRequest(
            type=bad.type, properties=props, urn=bad.urn, name=bad.name,
            options=analyzer_pb2.AnalyzerResourceOptions(protect=False)), timeout=30)
        # The engine's message is the policy description, a newline, then the rule's message.
        assert [(d.policyName, d.message.split("\n", 1)[1]) for d in response.diagnostics] == [
            ("rbac-least-privilege", "rules[0].verbs contains '*'; list the exact verbs the component uses "
                                     "(least privilege)"),
            ("rbac-cluster-pod-writes", "rules[0] grants ['*'] on pods cluster-wide; keep list/watch here and write "
                                        "with a Role in each namespace where the controller acts (training, "
                                        "inference), or except the grant with its reason in "
                                        "policies/rules/allow_lists.py")]
        assert response.diagnostics[0].enforcementLevel == analyzer_pb2.EnforcementLevel.Value("MANDATORY")
        channel.close()
    finally:
        pack.terminate()
        pack.wait(timeout=30)


# --------------------------------------------------------------------------- issue 18: the pack's blind spots


def return_policy(**changes: Any) -> dict[str, Any]:
    """The descheduler policy the stack renders (the gradual return), to edit."""
    return {
        "apiVersion": "descheduler/v1alpha2", "kind": "DeschedulerPolicy",
        "maxNoOfPodsToEvictPerNode": 2, "maxNoOfPodsToEvictPerNamespace": 4, "maxNoOfPodsToEvictTotal": 8,
        "profiles": [{
            "name": "burst-return",
            "pluginConfig": [
                {"name": "DefaultEvictor", "args": {"labelSelector": {"matchLabels": {WORKLOAD: "inference"}},
                                                    "minPodAge": "600s", "nodeFit": True}},
                {"name": "RemovePodsViolatingNodeTaints", "args": {"includedTaints": [f"{PREFIX}/burst"],
                                                                   "namespaces": {"include": ["inference"]}}},
            ],
            "plugins": {"filter": {"enabled": ["DefaultEvictor"]}, "preEvictionFilter": {"enabled": ["DefaultEvictor"]},
                        "deschedule": {"enabled": ["RemovePodsViolatingNodeTaints"]}},
        }],
        **changes,
    }


def policy_map(policy: dict[str, Any]) -> Resource:
    return res("ConfigMap", "v1", "descheduler-policy", "gpu-system", data={"policy.yaml": json.dumps(policy)})


def test_descheduler_return_only_accepts_the_return_plugin() -> None:
    assert messages("descheduler-return-only", policy_map(return_policy())) == []
    longer = return_policy()
    longer["profiles"][0]["pluginConfig"][0]["args"]["minPodAge"] = "1h5m"
    assert messages("descheduler-return-only", policy_map(longer)) == []


def test_descheduler_return_only_refuses_anything_else() -> None:
    two = return_policy()
    two["profiles"].append(copy.deepcopy(two["profiles"][0]) | {"name": "other"})
    assert messages("descheduler-return-only", policy_map(two)) == [
        "data.policy.yaml: has 2 profiles; the descheduler does one thing here, the gradual return: one profile with "
        f"RemovePodsViolatingNodeTaints for {PREFIX}/burst"
    ]
    balance = return_policy()
    balance["profiles"][0]["plugins"]["balance"] = {"enabled": ["LowNodeUtilization"]}
    balance["profiles"][0]["pluginConfig"].append({"name": "LowNodeUtilization", "args": {}})
    assert messages("descheduler-return-only", policy_map(balance)) == [
        "data.policy.yaml: profile 'burst-return' enables LowNodeUtilization at balance; only "
        "RemovePodsViolatingNodeTaints (deschedule) and DefaultEvictor may run",
        "data.policy.yaml: profile 'burst-return' configures LowNodeUtilization; only DefaultEvictor and "
        "RemovePodsViolatingNodeTaints belong to the return",
    ]
    loose = return_policy()
    evictor, taints = (c["args"] for c in loose["profiles"][0]["pluginConfig"])
    taints["includedTaints"].append("node.kubernetes.io/unschedulable")
    evictor.update(minPodAge="30s", nodeFit=False)
    assert messages("descheduler-return-only", policy_map(loose)) == [
        "data.policy.yaml: profile 'burst-return': RemovePodsViolatingNodeTaints args are {'includedTaints': "
        f"['{PREFIX}/burst', 'node.kubernetes.io/unschedulable'], 'namespaces': {{'include': ['inference']}}}}; set "
        f"exactly includedTaints: [{PREFIX}/burst] (and namespaces) so only pods on closed virtual nodes are moved",
        "data.policy.yaml: profile 'burst-return': DefaultEvictor minPodAge is '30s'; set at least '300s' "
        "(descheduler.minPodAgeSeconds) so a pod that just started on external capacity is not moved again",
        "data.policy.yaml: profile 'burst-return': DefaultEvictor nodeFit is False; set nodeFit: true so a pod is "
        "evicted only when an on-prem node can take it",
    ]


def test_descheduler_affinity_plugin_only_when_the_config_turns_it_on() -> None:
    with_affinity = return_policy()
    profile = with_affinity["profiles"][0]
    profile["plugins"]["deschedule"]["enabled"].append("RemovePodsViolatingNodeAffinity")
    profile["pluginConfig"].append({"name": "RemovePodsViolatingNodeAffinity",
                                    "args": {"nodeAffinityType": ["preferredDuringSchedulingIgnoredDuringExecution"],
                                             "namespaces": {"include": ["inference"]}}})
    assert len(messages("descheduler-return-only", policy_map(with_affinity))) == 2
    on = replace(CTX, prefer_onprem_affinity=True)
    assert messages("descheduler-return-only", policy_map(with_affinity), ctx=on) == []
    profile["pluginConfig"][-1]["args"]["nodeAffinityType"] = ["requiredDuringSchedulingIgnoredDuringExecution"]
    assert len(messages("descheduler-return-only", policy_map(with_affinity), ctx=on)) == 1


def test_descheduler_return_evicts_in_the_inference_namespace_only() -> None:
    """The return's plugins name the inference namespace, the only one its eviction Role covers."""
    fix = ("set namespaces: {'include': ['inference']} so the return evicts inference only, where the descheduler's "
           "eviction Role is")
    for namespaces in (None, {"include": ["inference", "training"]}, {"exclude": ["kube-system"]},
                       {"include": ["inference"], "exclude": ["training"]}):
        wide = return_policy()
        args = wide["profiles"][0]["pluginConfig"][1]["args"]
        if namespaces is None:
            del args["namespaces"]
        else:
            args["namespaces"] = namespaces
        assert messages("descheduler-return-only", policy_map(wide)) == [
            f"data.policy.yaml: profile 'burst-return': RemovePodsViolatingNodeTaints namespaces are {namespaces!r}; "
            f"{fix}"], namespaces
    # The affinity plugin, where the config turns it on, is held to the same namespace.
    with_affinity = return_policy()
    profile = with_affinity["profiles"][0]
    profile["plugins"]["deschedule"]["enabled"].append("RemovePodsViolatingNodeAffinity")
    profile["pluginConfig"].append({"name": "RemovePodsViolatingNodeAffinity",
                                    "args": {"nodeAffinityType": ["preferredDuringSchedulingIgnoredDuringExecution"]}})
    assert messages("descheduler-return-only", policy_map(with_affinity), ctx=replace(
        CTX, prefer_onprem_affinity=True)) == [
        f"data.policy.yaml: profile 'burst-return': RemovePodsViolatingNodeAffinity namespaces are None; {fix}"]
    # Another stack's inference namespace is the one its policy must name.
    elsewhere = replace(CTX, inference_namespace="serving")
    assert messages("descheduler-return-only", policy_map(return_policy()), ctx=elsewhere) == [
        "data.policy.yaml: profile 'burst-return': RemovePodsViolatingNodeTaints namespaces are {'include': "
        "['inference']}; set namespaces: {'include': ['serving']} so the return evicts inference only, where the "
        "descheduler's eviction Role is"]


def test_cluster_wide_pod_writes_are_refused_unless_excepted() -> None:
    fix = ("keep list/watch here and write with a Role in each namespace where the controller acts (training, "
           "inference), or except the grant with its reason in policies/rules/allow_lists.py")
    reads = role([{"apiGroups": [""], "resources": ["pods", "nodes"], "verbs": ["get", "list", "watch"]},
                  {"apiGroups": [""], "resources": ["nodes"], "verbs": ["patch"]}])
    assert messages("rbac-cluster-pod-writes", reads) == []
    writes = role([
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "patch"]},
        {"apiGroups": [""], "resources": ["pods/eviction"], "verbs": ["create"]},
        {"apiGroups": [""], "resources": ["nodes", "pods/status"], "verbs": ["update"]},
        {"apiGroups": ["apps"], "resources": ["pods"], "verbs": ["delete"]},
    ])
    assert messages("rbac-cluster-pod-writes", writes) == [
        f"rules[0] grants ['patch'] on pods cluster-wide; {fix}",
        f"rules[1] grants ['create'] on pods/eviction cluster-wide; {fix}",
        f"rules[2] grants ['update'] on pods/status cluster-wide; {fix}",
    ]
    # The same rules in a namespaced Role are where writes belong.
    namespaced = res("Role", "rbac.authorization.k8s.io/v1", "agent", "inference", rules=writes.props["rules"])
    assert messages("rbac-cluster-pod-writes", namespaced) == []
    # An exception covers exactly its grants, with its reason; anything beyond is still refused.
    excepted = replace(CTX, rbac_exceptions=(RbacException(
        kind="ClusterRole", name="agent", reason="a node-local agent evicts whatever runs on its node",
        grants=frozenset({("pods", "patch"), ("pods/eviction", "create")})),))
    assert messages("rbac-cluster-pod-writes", writes, ctx=excepted) == [
        f"rules[2] grants ['update'] on pods/status cluster-wide; {fix}"]


def test_rbac_escalation_verbs_and_token_minting() -> None:
    assert messages("rbac-no-escalation", role([{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}])) == []
    bad = role([
        {"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["clusterroles"], "verbs": ["bind", "escalate"]},
        {"apiGroups": [""], "resources": ["users", "serviceaccounts"], "verbs": ["impersonate"]},
        {"apiGroups": [""], "resources": ["serviceaccounts/token"], "verbs": ["create"]},
    ])
    fix = "remove the grant, or except it with its reason in policies/rules/allow_lists.py"
    assert messages("rbac-no-escalation", bad) == [
        f"rules[0] grants 'bind' on ['clusterroles'], which binds roles the holder does not hold itself; {fix}",
        f"rules[0] grants 'escalate' on ['clusterroles'], which lets the holder grant itself any permission; {fix}",
        "rules[1] grants 'impersonate' on ['users', 'serviceaccounts'], which lets the holder act as any user, group "
        f"or service account; {fix}",
        "rules[2] grants 'create' on serviceaccounts/token cluster-wide: a token for any service account in any "
        "namespace; use a Role in the namespace whose accounts it needs (with resourceNames), or except it with its "
        "reason in policies/rules/allow_lists.py",
    ]
    # A namespaced Role may mint tokens for its own namespace's accounts; impersonation is refused everywhere.
    namespaced = res("Role", "rbac.authorization.k8s.io/v1", "agent", "gpu-system", rules=[
        {"apiGroups": [""], "resources": ["serviceaccounts/token"], "verbs": ["create"]},
        {"apiGroups": [""], "resources": ["groups"], "verbs": ["impersonate"]}])
    assert len(messages("rbac-no-escalation", namespaced)) == 1


def test_rbac_exceptions_name_the_role_and_the_grant() -> None:
    minting = res("ClusterRole", "rbac.authorization.k8s.io/v1", "gpu-cluster:vk-x", rules=[
        {"apiGroups": [""], "resources": ["serviceaccounts/token"], "verbs": ["create"]}])
    exception = RbacException("ClusterRole", "gpu-cluster:vk-x", "reflects tokens to the peer",
                              grants=frozenset({("serviceaccounts/token", "create")}))
    assert messages("rbac-no-escalation", minting, ctx=replace(CTX, rbac_exceptions=(exception,))) == []
    other_role = replace(exception, name="gpu-cluster:vk-y")
    assert len(messages("rbac-no-escalation", minting, ctx=replace(CTX, rbac_exceptions=(other_role,)))) == 1


def test_rbac_bindings_to_admin_and_edit() -> None:
    assert messages("rbac-least-privilege", binding("view")) == []
    edit = binding("edit")
    assert messages("rbac-least-privilege", edit) == [
        "binds the built-in ClusterRole 'edit' (every namespaced resource, Secrets and RoleBindings included); bind "
        "a role that lists only the verbs and resources needed, or except this binding with its reason in "
        "policies/rules/allow_lists.py"
    ]
    admin = res("RoleBinding", "rbac.authorization.k8s.io/v1", "agent", "inference",
                roleRef={"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "admin"})
    assert len(messages("rbac-least-privilege", admin)) == 1
    excepted = RbacException("RoleBinding", "agent", "a tenant's own namespace", namespace="inference",
                             role_refs=frozenset({"admin"}))
    assert messages("rbac-least-privilege", admin, ctx=replace(CTX, rbac_exceptions=(excepted,))) == []
    # Our own Role that happens to be called "admin" is judged by its rules, not its name.
    own = res("RoleBinding", "rbac.authorization.k8s.io/v1", "agent", "inference",
              roleRef={"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "admin"})
    assert messages("rbac-least-privilege", own) == []


def test_cluster_wide_secret_reads() -> None:
    namespaced = res("Role", "rbac.authorization.k8s.io/v1", "agent", "gpu-system", rules=[
        {"apiGroups": [""], "resources": ["secrets"], "resourceNames": ["queue"], "verbs": ["get"]}])
    assert messages("rbac-cluster-secrets", namespaced) == []
    reads = role([{"apiGroups": [""], "resources": ["configmaps", "secrets"], "verbs": ["get", "list"]}])
    assert messages("rbac-cluster-secrets", reads) == [
        "rules[0] grants ['get', 'list'] on secrets cluster-wide; use a Role in the namespace that holds the Secret, "
        "with resourceNames, or except the verbs with their reason in policies/rules/allow_lists.py"
    ]
    provider = replace(CTX, rbac_exceptions=rbac_exceptions(["lambda"]))
    vk = res("ClusterRole", "rbac.authorization.k8s.io/v1", "gpu-cluster:vk-lambda", rules=[
        {"apiGroups": [""], "resources": ["secrets"], "verbs": ["list", "watch"]}])
    assert messages("rbac-cluster-secrets", vk, ctx=provider) == []
    vk.props["rules"][0]["verbs"].append("get")
    assert messages("rbac-cluster-secrets", vk, ctx=provider) == [
        "rules[0] grants ['get'] on secrets cluster-wide (excepted: ['list', 'watch']); use a Role in the "
        "namespace that holds the Secret, with resourceNames, or except the verbs with their reason in "
        "policies/rules/allow_lists.py"
    ]


def test_checkpoint_claims_are_recognised_by_their_storage_class() -> None:
    ctx = replace(CTX, checkpoint_classes=frozenset({"fast-rwx"}), checkpoint_volumes=frozenset({"ckpt-static"}))
    by_class = res("PersistentVolumeClaim", "v1", "scratch", "training", spec={
        "storageClassName": "fast-rwx", "accessModes": ["ReadWriteOnce"]})
    by_volume = res("PersistentVolumeClaim", "v1", "scratch-2", "training", options=KEPT, spec={
        "storageClassName": "", "volumeName": "ckpt-static", "accessModes": ["ReadWriteMany"]})
    other = res("PersistentVolumeClaim", "v1", "scratch-3", "inference", spec={
        "storageClassName": "standard", "accessModes": ["ReadWriteOnce"]})
    klass = res("StorageClass", "storage.k8s.io/v1", "fast-rwx", provisioner="csi.weka.io", reclaimPolicy="Delete")
    found = messages("checkpoint-storage-retained", by_class, by_volume, other, klass, ctx=ctx)
    assert found == [
        "accessModes is ['ReadWriteOnce']; every worker of a gang writes its shard, so set accessModes: "
        "[ReadWriteMany] on a shared-filesystem backend",
        "not protected; register it with ResourceOptions(protect=True) so no infrastructure change can delete "
        "checkpoints",
        "reclaimPolicy is 'Delete'; set reclaimPolicy: Retain so volumes it provisions outlive their claims",
    ]


def test_passwords_in_urls_are_refused() -> None:
    env_ok = container(env=[{"name": "QUEUE_URL", "value": "amqps://queue.example:5671/jobs"},
                            {"name": "DB_URL", "value": "postgres://app:$(DB_PASSWORD)@db:5432/x"}],
                       args=["--endpoint=https://user@example.org/path"])
    assert messages("no-plain-credentials", deployment("agent", platform_pod(containers=[env_ok]))) == []
    env_bad = container(env=[{"name": "QUEUE_URL", "value": "amqps://worker:hunter2@queue.example:5671/jobs"}],
                        command=["serve", "--db=postgres://app:pw@db/x"])
    found = messages("no-plain-credentials", deployment("agent", platform_pod(containers=[env_bad])))
    assert found == [
        "spec.template.spec.containers[main].env[0].value: the URL amqps://worker:…@ embeds a password; keep the URL "
        "in a Secret from secret config and read it with valueFrom.secretKeyRef, or write the password as $(VAR) "
        "from a secretKeyRef variable",
        "spec.template.spec.containers[main].command[1]: the URL postgres://app:…@ embeds a password; keep the URL in "
        "a Secret from secret config and read it with valueFrom.secretKeyRef, or write the password as $(VAR) from "
        "a secretKeyRef variable",
    ]
    assert not any("hunter2" in m for m in found)
    config = res("ConfigMap", "v1", "settings", "gpu-system", data={"a.yaml": "url: https://u:p@host\n"})
    assert messages("no-plain-credentials", config) == [
        "data.a.yaml: the URL https://u:…@ embeds a password; a ConfigMap is plain text in the state and the "
        "cluster — move the URL to a Secret from secret config"
    ]


_SHOWN = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://[^\s/:@]*:…@$")


@given(st.from_regex(r"[a-z][a-z0-9+.-]{0,8}", fullmatch=True), st.from_regex(r"[A-Za-z0-9._~-]{0,12}", fullmatch=True),
       st.from_regex(r"[A-Za-z0-9!*'();&=+,%.~-]{1,16}", fullmatch=True), st.text(max_size=30))
def test_url_password_detection_finds_it_and_never_echoes_it(scheme: str, user: str, password: str,
                                                             noise: str) -> None:
    found = url_passwords(f"{noise} {scheme}://{user}:{password}@host.example/x")
    assert f"{scheme}://{user}:…@" in found
    assert all(_SHOWN.match(f) for f in found)


@given(st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,10}", fullmatch=True))
def test_a_password_from_a_variable_is_not_literal(name: str) -> None:
    assert url_passwords(f"amqps://worker:$({name})@queue/x") == []
    assert url_passwords(f"amqps://worker:${{{name}}}@queue/x") == []


@given(st.text(max_size=80))
def test_url_password_detection_takes_any_text(text: str) -> None:
    assert all(f.endswith(":…@") for f in url_passwords(text))


@given(st.lists(st.tuples(st.integers(0, 10_000), st.sampled_from(["h", "m", "s", "ms"])), min_size=1, max_size=4))
def test_go_durations_parse_to_seconds(parts: list[tuple[int, str]]) -> None:
    scale = {"h": 3600, "m": 60, "s": 1, "ms": 0.001}
    text = "".join(f"{n}{unit}" for n, unit in parts)
    assert duration_seconds(text) == pytest.approx(sum(n * scale[unit] for n, unit in parts))


@given(st.text(max_size=12), st.text(st.characters(blacklist_categories=("Zs", "Zl", "Zp", "Cc"),
                                                   blacklist_characters="0123456789.hmsun"), min_size=1, max_size=4))
def test_anything_else_is_no_duration(prefix: str, foreign: str) -> None:
    assert duration_seconds(f"{prefix}{foreign}1s") is None
    assert duration_seconds(None) is None and duration_seconds("") is None


SCHEDULER_CONF = (
    "actions: enqueue, allocate, preempt, reclaim, backfill\n"
    "tiers:\n- plugins:\n  - name: priority\n  - name: gang\n  - name: conformance\n"
    "- plugins:\n  - name: drf\n  - name: predicates\n  - name: capacity\n  - name: nodeorder\n"
)


def volcano_chart(conf: str | None) -> Resource:
    custom = {} if conf is None else {"scheduler_config_override": conf}
    return Resource("kubernetes:helm.sh/v4:Chart", {"chart": "volcano", "version": "1.15.0",
                                                    "values": {"custom": custom}}, "urn:chart", "volcano")


def test_gang_scheduler_keeps_the_preemption_path() -> None:
    assert messages("gang-scheduler-preemption-path", volcano_chart(SCHEDULER_CONF)) == []
    config_map = res("ConfigMap", "v1", "volcano-scheduler-configmap", "volcano-system",
                     data={"volcano-scheduler.conf": SCHEDULER_CONF.replace("reclaim, ", "")})
    assert messages("gang-scheduler-preemption-path", config_map) == [
        "data.volcano-scheduler.conf actions 'enqueue, allocate, preempt, backfill' lack reclaim; without enqueue a "
        "gang is not admitted whole, without preempt or reclaim a pending gang cannot take GPUs from inference "
        "(reclaim is the only cross-queue path)"
    ]
    weakened = (SCHEDULER_CONF.replace("  - name: gang\n", "").replace("capacity", "proportion")
                .replace("  - name: priority\n", "  - name: priority\n    enablePreemptable: false\n"))
    assert messages("gang-scheduler-preemption-path", volcano_chart(weakened)) == [
        "values.custom.scheduler_config_override plugins ['priority', 'conformance', 'drf', 'predicates', "
        "'proportion', 'nodeorder'] lack gang, capacity; the preemption path needs priority, gang, predicates, "
        "capacity",
        "values.custom.scheduler_config_override plugin proportion is enabled; queues share by their deserved GPUs "
        "(capacity), and proportion would let training reclaim only its weighted share",
        "values.custom.scheduler_config_override plugin priority has enablePreemptable: false; the preemption path "
        "needs every extension point of that plugin",
    ]
    assert messages("gang-scheduler-preemption-path", volcano_chart(None)) == [
        "values.custom.scheduler_config_override is not set, so the chart's default applies (no reclaim, no "
        "preempt, proportion instead of capacity); pass components.gang_scheduler.volcano_scheduler_conf()"
    ]
    late = SCHEDULER_CONF.replace("enqueue, allocate", "allocate, enqueue")
    assert len(messages("gang-scheduler-preemption-path", volcano_chart(late))) == 1


@given(st.text(max_size=200))
def test_scheduler_configuration_of_any_text_is_judged_without_raising(text: str) -> None:
    assert isinstance(scheduler_conf_problems(text), list)


def queue(name: str, reclaimable: bool | None) -> Resource:
    spec: dict[str, Any] = {"weight": 1}
    if reclaimable is not None:
        spec["reclaimable"] = reclaimable
    return res("Queue", "scheduling.volcano.sh/v1beta1", name, spec=spec)


def test_queues_keep_inference_reclaimable_and_training_not() -> None:
    assert messages("gang-scheduler-preemption-path", queue("inference", True), queue("training", False)) == []
    assert messages("gang-scheduler-preemption-path", queue("inference", False), queue("training", None)) == [
        "the inference queue has reclaimable: false; reclaim could not evict inference for a pending gang; set "
        "scheduling.inferenceQueue.reclaimable: true",
        "training queue training has reclaimable: None (Volcano's default is true); another queue could reclaim a "
        "gang's members; set reclaimable: false",
    ]


def test_volcano_roles_keep_only_their_excepted_writes() -> None:
    # The chart's ClusterRoles (release "volcano"): the scheduler binds and evicts, the job controller makes pods
    # and its jobs' Secrets, wherever jobs run; an extra write, or the same grants on another role, is refused.
    ctx = replace(CTX, rbac_exceptions=rbac_exceptions([]))
    scheduler = [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch", "patch", "delete"]},
                 {"apiGroups": [""], "resources": ["pods/status"], "verbs": ["update"]},
                 {"apiGroups": [""], "resources": ["pods/binding"], "verbs": ["create"]}]
    volcano = res("ClusterRole", "rbac.authorization.k8s.io/v1", "volcano-scheduler", rules=scheduler)
    assert messages("rbac-cluster-pod-writes", volcano, ctx=ctx) == []
    other = res("ClusterRole", "rbac.authorization.k8s.io/v1", "not-volcano", rules=scheduler)
    assert len(messages("rbac-cluster-pod-writes", other, ctx=ctx)) == 3
    secrets = [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get", "create", "delete", "update"]}]
    controllers = res("ClusterRole", "rbac.authorization.k8s.io/v1", "volcano-controllers", rules=secrets)
    assert messages("rbac-cluster-secrets", controllers, ctx=ctx) == []
    reads_all = res("ClusterRole", "rbac.authorization.k8s.io/v1", "volcano-controllers",
                    rules=[{**secrets[0], "verbs": ["get", "list"]}])
    assert len(messages("rbac-cluster-secrets", reads_all, ctx=ctx)) == 1


def test_training_must_be_able_to_restart_in_place_where_the_stack_does() -> None:
    from components.training_spec import SUPERVISOR_COMMAND

    bare = training_job()
    found = messages("training-restart-in-place", bare)
    assert len(found) == 2, found
    assert "its command (the image's own) does not run under the supervisor" in found[0]
    assert "mounts no checkpoint volume (CHECKPOINT_DIR unset): the gang can neither restart in place nor resume" \
        in found[1]
    supervised = gpu_container("8")
    supervised.update(command=[*SUPERVISOR_COMMAND, "python3", "train.py"],
                      env=[{"name": "CHECKPOINT_DIR", "value": "/checkpoints"}])
    assert messages("training-restart-in-place", training_job(containers=[supervised])) == []
    unwrapped = {**supervised, "command": ["python3", "train.py"]}
    (only,) = messages("training-restart-in-place", training_job(containers=[unwrapped]))
    assert "its command python3 train.py does not run under the supervisor" in only
    # A stack that does not restart in place asks nothing of its jobs.
    off = replace(CTX, restart_in_place=False)
    assert messages("training-restart-in-place", bare, ctx=off) == []
