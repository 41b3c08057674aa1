"""Each policy rule on resources built here: one that passes and one that fails with its message.

The rules are pure functions over (type, props, options); the same checks run through the pulumi_policy
objects the pack registers, which the last tests exercise with ResourceValidationArgs and
StackValidationArgs built by hand (as the engine would send them).
"""

from __future__ import annotations

import copy
import json
from dataclasses import replace
from typing import Any

import pytest
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
    RULES,
    SECRET_PLACEHOLDER,
    Options,
    Resource,
    RuleContext,
    build_policies,
    engine_context,
    evaluate,
)

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
        "spec.template.spec: GPU pod has priorityClassName 'high', not one of the declared tiers "
        "['gpu-inference', 'gpu-training', 'platform-critical', 'standard']; set priorityClassName to "
        "'gpu-training' for training or 'gpu-inference' for inference"
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
        "place); set schedulerName: volcano"
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
        f"Deployment carries {WORKLOAD}=training but is not gang-scheduled; run training as a Volcano Job "
        "(batch.volcano.sh) with minAvailable equal to its replicas"
    ]


def test_training_outranks_inference() -> None:
    assert messages("training-outranks-inference", training_job()) == []
    assert messages("training-outranks-inference", training_job(priorityClassName="gpu-inference")) == [
        "spec.tasks[worker].template.spec: training uses priorityClassName 'gpu-inference' (value 10000), which "
        "does not outrank inference ('gpu-inference', value 10000); set priorityClassName: gpu-training so a "
        "gang can take GPUs from inference"
    ]


def test_training_onprem_only() -> None:
    assert messages("training-onprem-only", training_job()) == []
    preferred_only = {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 100, "preference": {"matchExpressions": [
            {"key": f"{PREFIX}/location", "operator": "In", "values": ["onprem"]}]}}]}}
    expected = [
        "spec.tasks[worker].template.spec: training pods may land on a virtual node; add a required node "
        f"affinity whose every term has '{PREFIX}/location In [onprem]' or 'type NotIn [virtual-kubelet]'"
    ]
    assert messages("training-onprem-only", training_job(affinity=preferred_only)) == expected
    # One term that allows external nodes is enough to reach a virtual node (terms are ORed).
    two_terms = copy.deepcopy(ONPREM_AFFINITY)
    terms = two_terms["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    terms.append({"matchExpressions": [{"key": f"{PREFIX}/location", "operator": "In", "values": ["external"]}]})
    assert messages("training-onprem-only", training_job(affinity=two_terms)) == expected


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
        f"spec.template.spec: inference tolerates the burst taint {PREFIX}/burst; remove that toleration "
        "(tolerate only the provider's taint) so closing burst capacity keeps new pods on-prem"
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


def dcgm(name: str = "dcgm-exporter") -> Resource:
    sys_admin = container(securityContext={"readOnlyRootFilesystem": True, "runAsNonRoot": False,
                                           "capabilities": {"add": ["SYS_ADMIN"], "drop": ["ALL"]}},
                          volumeMounts=[{"name": "pod-resources", "mountPath": "/var/lib/kubelet/pod-resources",
                                         "readOnly": True}])
    spec = {"containers": [sys_admin], "volumes": [
        {"name": "pod-resources", "hostPath": {"path": "/var/lib/kubelet/pod-resources"}}]}
    return res("DaemonSet", "apps/v1", name, "gpu-system", {"app.kubernetes.io/name": name}, spec={
        "selector": {"matchLabels": {"app.kubernetes.io/name": name}},
        "template": {"metadata": {"labels": {"app.kubernetes.io/name": name}}, "spec": spec}})


def test_allow_listed_component_keeps_only_its_exception() -> None:
    assert messages("pod-security-restricted", dcgm()) == []
    assert messages("privileges-allow-listed", dcgm()) == []


def test_privileges_allow_listed() -> None:
    how = "add 'sidecar' to components.security.PRIVILEGE_ALLOW_LIST with the reason, or drop the privilege"
    assert messages("privileges-allow-listed", dcgm("sidecar")) == [
        f"spec.template.spec: hostPath volumes ['/var/lib/kubelet/pod-resources'] in a component that is not "
        f"allow-listed; {how}",
        f"spec.template.spec.containers[main]: adds capabilities ['SYS_ADMIN'] in a component that is not "
        f"allow-listed; {how}",
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
    from tools.mockrt import stack_config

    config, secrets = stack_config("local")
    env = {k: (v if isinstance(v, str) else json.dumps(v)) for k, v in config.items()}
    for key in secrets:
        env[key] = "decrypted-token"  # what the engine hands the pack for a secure: value
    monkeypatch.setenv("PULUMI_CONFIG", json.dumps(env))
    monkeypatch.setenv("PULUMI_STACK", "local")
    ctx = engine_context()
    assert ctx.secrets_marked is False
    assert ctx.virtual_nodes == frozenset({"vk-local-cloud"})
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

    from tools.mockrt import ROOT, stack_config

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
                                     "(least privilege)")]
        assert response.diagnostics[0].enforcementLevel == analyzer_pb2.EnforcementLevel.Value("MANDATORY")
        channel.close()
    finally:
        pack.terminate()
        pack.wait(timeout=30)
