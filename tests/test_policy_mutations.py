"""Mutations of the rendered prod stack: each breaks one invariant the policy pack guards, as a careless
operator or a relabelling workload would, and must be refused by the rule that guards it.

Every mutation starts from the resources the prod stack registers on the mock runtime (the training
mutations from prod with its example job switched on, so a Volcano Job is rendered), changes or adds one
object, and asserts that a mandatory violation of the named rule appears on that object and was not there
before. The unmutated stacks are clean (tests/test_policy_stacks.py), so every violation is the mutation's.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any

import pytest
import yaml

from components.config import PROJECT
from components.mockrt import raw_from_stack, run_program
from policies.rules import Options, Resource, RuleContext, Violation, evaluate
from tests.conftest import raw_stack
from tools import policy

PREFIX = "gpucluster.io"
BURST_TAINT = f"{PREFIX}/burst"


class Stack:
    """The prod stack's resources, deep-copied so a mutation may edit any object in place."""

    def __init__(self, resources: list[Resource]) -> None:
        self.resources = list(resources)
        self._copied: set[int] = set()  # indexes already deep-copied (copy on first touch: the base is shared)

    def find(self, kind: str, name: str) -> Resource:
        found = [i for i, r in enumerate(self.resources) if r.kind == kind and r.object_name == name]
        assert len(found) == 1, f"the prod stack has {len(found)} {kind} named {name}"
        index = found[0]
        if index not in self._copied:
            original = self.resources[index]
            self.resources[index] = replace(original, props=copy.deepcopy(dict(original.props)))
            self._copied.add(index)
        return self.resources[index]

    def props(self, kind: str, name: str) -> dict[str, Any]:
        props = self.find(kind, name).props
        assert isinstance(props, dict)
        return props

    def set_options(self, kind: str, name: str, options: Options) -> None:
        target = self.find(kind, name)
        self.resources[self.resources.index(target)] = replace(target, options=options)

    def add(self, kind: str, api_version: str, name: str, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        group_version = api_version if "/" in api_version else f"core/{api_version}"
        props = {"apiVersion": api_version, "kind": kind, "metadata": {"name": name, "namespace": namespace}, **body}
        self.resources.append(Resource(f"kubernetes:{group_version}:{kind}", props,
                                       f"urn:pulumi:prod::{PROJECT}::kubernetes:{group_version}:{kind}::{name}", name))
        return props

    def clone(self, kind: str, name: str, new_name: str, namespace: str | None = None) -> dict[str, Any]:
        source = self.find(kind, name)
        props = copy.deepcopy(dict(source.props))
        props["metadata"]["name"] = new_name
        if namespace is not None:
            props["metadata"]["namespace"] = namespace
        self.resources.append(replace(source, props=props, name=new_name, urn=f"{source.urn}-{new_name}"))
        return props


# Helpers that return the live nested objects of a workload, to edit in place.
def live_pod_spec(props: dict[str, Any]) -> dict[str, Any]:
    spec = props["spec"]
    if props["kind"] == "Pod":
        return spec  # type: ignore[no-any-return]
    if "tasks" in spec:
        return spec["tasks"][0]["template"]["spec"]  # type: ignore[no-any-return]
    if "jobTemplate" in spec:
        return spec["jobTemplate"]["spec"]["template"]["spec"]  # type: ignore[no-any-return]
    return spec["template"]["spec"]  # type: ignore[no-any-return]


def live_labels(props: dict[str, Any]) -> dict[str, Any]:
    spec = props["spec"]
    template = spec["tasks"][0]["template"] if "tasks" in spec else spec["template"]
    return template["metadata"]["labels"]  # type: ignore[no-any-return]


def live_container(props: dict[str, Any]) -> dict[str, Any]:
    return live_pod_spec(props)["containers"][0]  # type: ignore[no-any-return]


# --------------------------------------------------------------------------- the mutations


@dataclass(frozen=True)
class Mutation:
    """One hostile or careless change: ``target`` (``Kind [ns/]name``) must carry a violation of ``rule``."""

    id: str
    rule: str
    target: str
    apply: Callable[[Stack], None]
    #: Rendered from prod with its example training job switched on (a Volcano Job to mutate).
    with_job: bool = False


MUTATIONS: list[Mutation] = []


Apply = Callable[[Stack], None]


def mutation(rule: str, target: str, *, with_job: bool = False) -> Callable[[Apply], Apply]:
    def register(apply: Apply) -> Apply:
        MUTATIONS.append(Mutation(apply.__name__, rule, target, apply, with_job))
        return apply

    return register


# ---- descheduler: exactly the return plugin

DESCHEDULER = "ConfigMap gpu-system/descheduler-policy"


def edit_descheduler(stack: Stack, edit: Callable[[dict[str, Any]], None]) -> None:
    data = stack.props("ConfigMap", "descheduler-policy")["data"]
    doc = yaml.safe_load(data["policy.yaml"])
    edit(doc)
    data["policy.yaml"] = yaml.safe_dump(doc, sort_keys=False)


def _return_profile(doc: dict[str, Any]) -> dict[str, Any]:
    return doc["profiles"][0]  # type: ignore[no-any-return]


def _plugin_args(doc: dict[str, Any], name: str) -> dict[str, Any]:
    return next(c for c in _return_profile(doc)["pluginConfig"] if c["name"] == name)["args"]  # type: ignore[no-any-return]


@mutation("descheduler-return-only", DESCHEDULER)
def descheduler_second_profile(stack: Stack) -> None:
    def edit(doc: dict[str, Any]) -> None:
        extra = copy.deepcopy(_return_profile(doc))
        extra["name"] = "rebalance"
        extra["pluginConfig"] = [c for c in extra["pluginConfig"] if c["name"] == "DefaultEvictor"]
        extra["pluginConfig"].append({"name": "RemoveDuplicates"})
        extra["plugins"] = {"balance": {"enabled": ["RemoveDuplicates"]}}
        doc["profiles"].append(extra)

    edit_descheduler(stack, edit)


@mutation("descheduler-return-only", DESCHEDULER)
def descheduler_extra_balance_plugin(stack: Stack) -> None:
    def edit(doc: dict[str, Any]) -> None:
        profile = _return_profile(doc)
        profile["pluginConfig"].append({"name": "LowNodeUtilization", "args": {
            "thresholds": {"cpu": 20}, "targetThresholds": {"cpu": 50}}})
        profile["plugins"]["balance"] = {"enabled": ["LowNodeUtilization"]}

    edit_descheduler(stack, edit)


@mutation("descheduler-return-only", DESCHEDULER)
def descheduler_other_taint(stack: Stack) -> None:
    edit_descheduler(stack, lambda doc: _plugin_args(doc, "RemovePodsViolatingNodeTaints").update(
        includedTaints=["node.kubernetes.io/unschedulable"]))


@mutation("descheduler-return-only", DESCHEDULER)
def descheduler_every_taint(stack: Stack) -> None:
    edit_descheduler(stack, lambda doc: _plugin_args(doc, "RemovePodsViolatingNodeTaints").pop("includedTaints"))


@mutation("descheduler-return-only", DESCHEDULER)
def descheduler_no_min_pod_age(stack: Stack) -> None:
    edit_descheduler(stack, lambda doc: _plugin_args(doc, "DefaultEvictor").pop("minPodAge"))


@mutation("descheduler-return-only", DESCHEDULER)
def descheduler_no_node_fit(stack: Stack) -> None:
    edit_descheduler(stack, lambda doc: _plugin_args(doc, "DefaultEvictor").update(nodeFit=False))


@mutation("descheduler-return-only", DESCHEDULER)
def descheduler_prefer_no_schedule_taints(stack: Stack) -> None:
    edit_descheduler(stack, lambda doc: _plugin_args(doc, "RemovePodsViolatingNodeTaints").update(
        includePreferNoSchedule=True))


@mutation("descheduler-bounded", DESCHEDULER)
def descheduler_unbounded(stack: Stack) -> None:
    edit_descheduler(stack, lambda doc: doc.pop("maxNoOfPodsToEvictTotal"))


@mutation("descheduler-bounded", DESCHEDULER)
def descheduler_evicts_training(stack: Stack) -> None:
    def edit(doc: dict[str, Any]) -> None:
        args = _plugin_args(doc, "DefaultEvictor")
        args.pop("labelSelector")
        args.pop("priorityThreshold")

    edit_descheduler(stack, edit)


# ---- training, recognised by its priority class in any workload kind

def _as_training(props: dict[str, Any]) -> None:
    spec = live_pod_spec(props)
    spec["priorityClassName"] = "gpu-training"


@mutation("training-gang-scheduled", "Deployment inference/llama-70b-chat")
def training_in_an_inference_deployment(stack: Stack) -> None:
    _as_training(stack.props("Deployment", "llama-70b-chat"))  # still labelled workload=inference


def _bare_pod(stack: Stack, name: str, labels: dict[str, str]) -> dict[str, Any]:
    source = stack.props("Deployment", "sdxl-turbo")
    spec = copy.deepcopy(live_pod_spec(source))
    spec["priorityClassName"] = "gpu-training"
    props = stack.add("Pod", "v1", name, "training", {"spec": spec})
    props["metadata"]["labels"] = labels
    return props


@mutation("training-gang-scheduled", "Pod training/rogue-trainer")
def training_as_a_bare_pod(stack: Stack) -> None:
    _bare_pod(stack, "rogue-trainer", {"app.kubernetes.io/name": "rogue-trainer"})


@mutation("training-onprem-only", "Pod training/rogue-trainer")
def training_pod_relabelled_may_go_virtual(stack: Stack) -> None:
    _bare_pod(stack, "rogue-trainer", {f"{PREFIX}/workload": "inference"})


@mutation("training-gang-scheduled", "Job training/rogue-trainer")
def training_as_a_batch_job(stack: Stack) -> None:
    spec = copy.deepcopy(live_pod_spec(stack.props("Deployment", "whisper-large")))
    spec["priorityClassName"] = "gpu-training"
    spec["restartPolicy"] = "Never"
    stack.add("Job", "batch/v1", "rogue-trainer", "training", {"spec": {
        "completions": 4, "parallelism": 4, "template": {"metadata": {"labels": {}}, "spec": spec}}})


@mutation("training-gang-scheduled", "Job training/llm-pretrain-70b", with_job=True)
def volcano_job_partial_gang(stack: Stack) -> None:
    stack.props("Job", "llm-pretrain-70b")["spec"]["minAvailable"] = 32


@mutation("training-grace-holds-a-checkpoint", "Job training/llm-pretrain-70b", with_job=True)
def volcano_job_with_the_default_grace(stack: Stack) -> None:
    live_pod_spec(stack.props("Job", "llm-pretrain-70b")).pop("terminationGracePeriodSeconds")


@mutation("training-grace-holds-a-checkpoint", "Job training/llm-pretrain-70b", with_job=True)
def volcano_job_with_a_grace_too_short_for_its_checkpoint(stack: Stack) -> None:
    live_pod_spec(stack.props("Job", "llm-pretrain-70b"))["terminationGracePeriodSeconds"] = 31


@mutation("training-onprem-only", "Job training/llm-pretrain-70b", with_job=True)
def volcano_job_without_onprem_affinity(stack: Stack) -> None:
    live_pod_spec(stack.props("Job", "llm-pretrain-70b")).pop("affinity")


@mutation("training-no-spare-toleration", "Job training/llm-pretrain-70b", with_job=True)
def volcano_job_tolerating_the_warm_spares(stack: Stack) -> None:
    live_pod_spec(stack.props("Job", "llm-pretrain-70b")).setdefault("tolerations", []).append(
        {"key": f"{PREFIX}/spare", "operator": "Exists", "effect": "NoSchedule"})


@mutation("training-outranks-inference", "Job training/llm-pretrain-70b", with_job=True)
def volcano_job_at_inference_priority(stack: Stack) -> None:
    job = stack.props("Job", "llm-pretrain-70b")
    job["spec"]["priorityClassName"] = "gpu-inference"
    live_pod_spec(job)["priorityClassName"] = "gpu-inference"


# ---- GPUs, MIG slices included

MIG = "nvidia.com/mig-3g.40gb"


def _to_mig(props: dict[str, Any], request: str = "1", limit: str = "1") -> None:
    resources = live_container(props)["resources"]
    resources["requests"].pop("nvidia.com/gpu")
    resources["limits"].pop("nvidia.com/gpu")
    resources["requests"][MIG] = request
    resources["limits"][MIG] = limit


@mutation("gpu-scheduler", "Deployment inference/sdxl-turbo")
def mig_pod_on_the_default_scheduler(stack: Stack) -> None:
    props = stack.props("Deployment", "sdxl-turbo")
    _to_mig(props)
    live_pod_spec(props).pop("schedulerName")


@mutation("gpu-limits-equal-requests", "Deployment inference/whisper-large")
def mig_overcommitted(stack: Stack) -> None:
    _to_mig(stack.props("Deployment", "whisper-large"), "1", "2")


@mutation("gpu-priority-class", "Deployment inference/whisper-large")
def mig_pod_without_a_tier(stack: Stack) -> None:
    props = stack.props("Deployment", "whisper-large")
    _to_mig(props)
    live_pod_spec(props).pop("priorityClassName")


@mutation("gpu-scheduler", "Deployment inference/llama-70b-chat")
def gpu_pod_on_the_default_scheduler(stack: Stack) -> None:
    live_pod_spec(stack.props("Deployment", "llama-70b-chat"))["schedulerName"] = "default-scheduler"


@mutation("gpu-priority-class", "Deployment inference/sdxl-turbo")
def gpu_pod_at_the_system_tier(stack: Stack) -> None:
    live_pod_spec(stack.props("Deployment", "sdxl-turbo"))["priorityClassName"] = "platform-critical"


# ---- privileges keyed on namespace, service account, capabilities and host paths

PRIVILEGES = "privileges-allow-listed"


def _add_capability(props: dict[str, Any], capability: str) -> None:
    sc = live_container(props)["securityContext"]
    sc.setdefault("capabilities", {}).setdefault("add", []).append(capability)


def _add_host_path(props: dict[str, Any], path: str, mount: str) -> None:
    spec = live_pod_spec(props)
    spec.setdefault("volumes", []).append({"name": "host", "hostPath": {"path": path, "type": "Directory"}})
    live_container(props).setdefault("volumeMounts", []).append({"name": "host", "mountPath": mount, "readOnly": True})


@mutation(PRIVILEGES, "Deployment gpu-system/burst-controller")
def controller_relabelled_as_dcgm_with_sys_admin(stack: Stack) -> None:
    props = stack.props("Deployment", "burst-controller")
    live_labels(props)["app.kubernetes.io/name"] = "dcgm-exporter"
    _add_capability(props, "SYS_ADMIN")


@mutation(PRIVILEGES, "Deployment inference/sdxl-turbo")
def inference_relabelled_as_dcgm_with_host_path(stack: Stack) -> None:
    props = stack.props("Deployment", "sdxl-turbo")
    live_labels(props)["app.kubernetes.io/name"] = "dcgm-exporter"
    _add_host_path(props, "/var/lib/kubelet/pod-resources", "/var/lib/kubelet/pod-resources")


@mutation(PRIVILEGES, "DaemonSet inference/dcgm-exporter")
def dcgm_copy_in_another_namespace(stack: Stack) -> None:
    stack.clone("DaemonSet", "dcgm-exporter", "dcgm-exporter", namespace="inference")


@mutation(PRIVILEGES, "DaemonSet gpu-telemetry/dcgm-exporter")
def dcgm_with_a_controller_service_account(stack: Stack) -> None:
    live_pod_spec(stack.props("DaemonSet", "dcgm-exporter"))["serviceAccountName"] = "burst-controller"


@mutation(PRIVILEGES, "DaemonSet gpu-telemetry/dcgm-exporter")
def dcgm_extra_capability(stack: Stack) -> None:
    _add_capability(stack.props("DaemonSet", "dcgm-exporter"), "NET_ADMIN")


@mutation(PRIVILEGES, "DaemonSet gpu-telemetry/dcgm-exporter")
def dcgm_extra_host_path(stack: Stack) -> None:
    _add_host_path(stack.props("DaemonSet", "dcgm-exporter"), "/", "/host")


@mutation(PRIVILEGES, "DaemonSet gpu-telemetry/ib-exporter")
def ib_exporter_wider_host_path(stack: Stack) -> None:
    spec = live_pod_spec(stack.props("DaemonSet", "ib-exporter"))
    next(v for v in spec["volumes"] if "hostPath" in v)["hostPath"]["path"] = "/"


@mutation(PRIVILEGES, "DaemonSet gpu-telemetry/ib-exporter")
def ib_exporter_capability(stack: Stack) -> None:
    _add_capability(stack.props("DaemonSet", "ib-exporter"), "SYS_ADMIN")


@mutation("pod-security-restricted", "DaemonSet gpu-telemetry/ib-exporter")
def ib_exporter_as_root(stack: Stack) -> None:
    props = stack.props("DaemonSet", "ib-exporter")
    live_pod_spec(props)["securityContext"].update(runAsNonRoot=False, runAsUser=0)
    live_container(props)["securityContext"]["runAsNonRoot"] = False


@mutation("pod-security-restricted", "Deployment gpu-system/burst-controller")
def controller_relabelled_as_inference_runs_as_root(stack: Stack) -> None:
    props = stack.props("Deployment", "burst-controller")
    live_labels(props)[f"{PREFIX}/workload"] = "inference"
    live_pod_spec(props)["securityContext"].update(runAsNonRoot=False, runAsUser=0)
    live_container(props)["securityContext"].update(runAsNonRoot=False, readOnlyRootFilesystem=False)


@mutation(PRIVILEGES, "DaemonSet gpu-telemetry/dcgm-exporter")
def dcgm_privileged(stack: Stack) -> None:
    live_container(stack.props("DaemonSet", "dcgm-exporter"))["securityContext"]["privileged"] = True


@mutation(PRIVILEGES, "DaemonSet gpu-telemetry/ib-exporter")
def ib_exporter_host_network(stack: Stack) -> None:
    live_pod_spec(stack.props("DaemonSet", "ib-exporter"))["hostNetwork"] = True


@mutation(PRIVILEGES, "DaemonSet gpu-telemetry/dcgm-exporter")
def dcgm_host_path_read_write(stack: Stack) -> None:
    mounts = live_container(stack.props("DaemonSet", "dcgm-exporter"))["volumeMounts"]
    next(m for m in mounts if m["name"] == "pod-resources")["readOnly"] = False


# ---- RBAC

def _grant(stack: Stack, kind: str, name: str, group: str, resources: list[str], verbs: list[str]) -> None:
    stack.props(kind, name)["rules"].append({"apiGroups": [group], "resources": resources, "verbs": verbs})


RBAC_GROUP = "rbac.authorization.k8s.io"


@mutation("rbac-no-escalation", "ClusterRole gpu-cluster:burst-controller")
def rbac_bind(stack: Stack) -> None:
    _grant(stack, "ClusterRole", "gpu-cluster:burst-controller", RBAC_GROUP, ["clusterroles"], ["bind"])


@mutation("rbac-no-escalation", "ClusterRole gpu-cluster:descheduler")
def rbac_escalate(stack: Stack) -> None:
    _grant(stack, "ClusterRole", "gpu-cluster:descheduler", RBAC_GROUP, ["roles", "clusterroles"], ["escalate"])


@mutation("rbac-no-escalation", "ClusterRole gpu-cluster:health-guard")
def rbac_impersonate_service_accounts(stack: Stack) -> None:
    _grant(stack, "ClusterRole", "gpu-cluster:health-guard", "", ["serviceaccounts"], ["impersonate"])


@mutation("rbac-no-escalation", "Role gpu-system/burst-controller")
def rbac_impersonate_users_in_a_role(stack: Stack) -> None:
    _grant(stack, "Role", "burst-controller", "", ["users", "groups"], ["impersonate"])


@mutation("rbac-no-escalation", "ClusterRole gpu-cluster:health-guard")
def rbac_mint_tokens(stack: Stack) -> None:
    _grant(stack, "ClusterRole", "gpu-cluster:health-guard", "", ["serviceaccounts/token"], ["create"])


@mutation("rbac-least-privilege", "RoleBinding inference/burst-controller-handover")
def rbac_bind_admin(stack: Stack) -> None:
    stack.props("RoleBinding", "burst-controller-handover")["roleRef"].update(kind="ClusterRole", name="admin")


@mutation("rbac-least-privilege", "ClusterRoleBinding gpu-cluster:descheduler")
def rbac_bind_edit(stack: Stack) -> None:
    stack.props("ClusterRoleBinding", "gpu-cluster:descheduler")["roleRef"]["name"] = "edit"


@mutation("rbac-least-privilege", "ClusterRoleBinding gpu-cluster:burst-controller")
def rbac_bind_cluster_admin(stack: Stack) -> None:
    stack.props("ClusterRoleBinding", "gpu-cluster:burst-controller")["roleRef"]["name"] = "cluster-admin"


@mutation("rbac-least-privilege", "ClusterRole gpu-cluster:burst-controller")
def rbac_wildcard_verbs(stack: Stack) -> None:
    stack.props("ClusterRole", "gpu-cluster:burst-controller")["rules"][0]["verbs"] = ["*"]


@mutation("rbac-cluster-secrets", "ClusterRole gpu-cluster:prometheus-adapter")
def rbac_cluster_wide_secret_reads(stack: Stack) -> None:
    _grant(stack, "ClusterRole", "gpu-cluster:prometheus-adapter", "", ["secrets"], ["get", "list", "watch"])


@mutation("rbac-cluster-secrets", "ClusterRole gpu-cluster:vk-lambda-east")
def rbac_provider_secret_writes(stack: Stack) -> None:
    rules = stack.props("ClusterRole", "gpu-cluster:vk-lambda-east")["rules"]
    next(r for r in rules if "secrets" in r["resources"])["verbs"] += ["create", "update", "patch"]


# ---- controllers write pods only where they act

POD_WRITES = "rbac-cluster-pod-writes"


@mutation(POD_WRITES, "ClusterRole gpu-cluster:burst-controller")
def burst_controller_patches_pods_cluster_wide(stack: Stack) -> None:
    """The grant it had before its writes moved to Roles in the inference and training namespaces."""
    stack.props("ClusterRole", "gpu-cluster:burst-controller")["rules"][1]["verbs"] = ["get", "list", "watch", "patch"]


@mutation(POD_WRITES, "ClusterRole gpu-cluster:health-guard")
def health_guard_evicts_cluster_wide(stack: Stack) -> None:
    _grant(stack, "ClusterRole", "gpu-cluster:health-guard", "", ["pods/eviction"], ["create"])


@mutation(POD_WRITES, "ClusterRole gpu-cluster:descheduler")
def descheduler_deletes_pods_cluster_wide(stack: Stack) -> None:
    """Upstream's ClusterRole grants pods delete; the descheduler only evicts, and only in inference."""
    _grant(stack, "ClusterRole", "gpu-cluster:descheduler", "", ["pods"], ["delete"])


@mutation("descheduler-return-only", DESCHEDULER)
def descheduler_return_in_every_namespace(stack: Stack) -> None:
    edit_descheduler(stack, lambda doc: _plugin_args(doc, "RemovePodsViolatingNodeTaints").pop("namespaces"))


@mutation(PRIVILEGES, "DaemonSet gpu-system/dcgm-exporter")
def dcgm_back_among_the_controllers(stack: Stack) -> None:
    """The same DaemonSet and service account in the controllers' (restricted) namespace: not its identity."""
    stack.clone("DaemonSet", "dcgm-exporter", "dcgm-exporter", namespace="gpu-system")


# ---- checkpoints, recognised by their storage class

CLAIM = "checkpoints-weka-ckpt"


def _disguise_claim(stack: Stack) -> dict[str, Any]:
    """The checkpoint claim under another name and without checkpoint labels; its class stays."""
    target = stack.find("PersistentVolumeClaim", CLAIM)
    props = stack.props("PersistentVolumeClaim", CLAIM)
    props["metadata"]["name"] = "scratch-a"
    props["metadata"]["labels"] = {"app.kubernetes.io/name": "scratch-a"}
    stack.resources[stack.resources.index(target)] = replace(target, name="scratch-a")
    return props


@mutation("checkpoint-storage-retained", "PersistentVolumeClaim training/scratch-a")
def checkpoint_claim_renamed_and_unprotected(stack: Stack) -> None:
    _disguise_claim(stack)
    stack.set_options("PersistentVolumeClaim", "scratch-a", Options(protect=False, retain_on_delete=False))


@mutation("checkpoint-storage-retained", "PersistentVolumeClaim training/scratch-a")
def checkpoint_claim_renamed_read_write_once(stack: Stack) -> None:
    _disguise_claim(stack)["spec"]["accessModes"] = ["ReadWriteOnce"]


@mutation("checkpoint-storage-retained", "PersistentVolumeClaim training/checkpoints-vast-ckpt")
def checkpoint_claim_unprotected(stack: Stack) -> None:
    stack.set_options("PersistentVolumeClaim", "checkpoints-vast-ckpt", Options(protect=False, retain_on_delete=True))


@mutation("checkpoint-storage-retained", "StorageClass checkpoints-weka-ckpt")
def checkpoint_class_deletes(stack: Stack) -> None:
    stack.props("StorageClass", "checkpoints-weka-ckpt")["reclaimPolicy"] = "Delete"


# ---- credentials

CREDENTIALS = "no-plain-credentials"


@mutation(CREDENTIALS, "Deployment inference/sdxl-turbo")
def password_in_an_environment_url(stack: Stack) -> None:
    env = live_container(stack.props("Deployment", "sdxl-turbo"))["env"]
    next(e for e in env if e["name"] == "QUEUE_URL")["value"] = "amqps://worker:hunter2@image-queue.gpucluster.io:5671/jobs"


@mutation(CREDENTIALS, "Deployment gpu-system/burst-controller")
def password_in_an_argument_url(stack: Stack) -> None:
    live_container(stack.props("Deployment", "burst-controller"))["args"].append(
        "--prometheus-url=https://admin:s3cret@prometheus.monitoring.svc:9090")


@mutation(CREDENTIALS, "ConfigMap gpu-system/burst-controller-settings")
def password_in_a_configmap_url(stack: Stack) -> None:
    stack.props("ConfigMap", "burst-controller-settings")["data"]["extra.yaml"] = (
        "prometheus: https://admin:s3cret@prometheus.monitoring.svc:9090\n")


@mutation(CREDENTIALS, "Deployment inference/whisper-large")
def literal_password_variable(stack: Stack) -> None:
    live_container(stack.props("Deployment", "whisper-large"))["env"].append({"name": "QUEUE_PASSWORD", "value": "x1"})


# ---- the gang scheduler's preemption path

CHART = "Chart volcano"


def edit_scheduler_conf(stack: Stack, edit: Callable[[dict[str, Any]], None]) -> None:
    custom = stack.props("Chart", "volcano")["values"]["custom"]
    conf = yaml.safe_load(custom["scheduler_config_override"])
    edit(conf)
    custom["scheduler_config_override"] = yaml.safe_dump(conf, sort_keys=False)


def _drop_action(action: str) -> Callable[[dict[str, Any]], None]:
    def edit(conf: dict[str, Any]) -> None:
        conf["actions"] = ", ".join(a.strip() for a in conf["actions"].split(",") if a.strip() != action)

    return edit


def _drop_plugin(plugin: str, instead: str | None = None) -> Callable[[dict[str, Any]], None]:
    def edit(conf: dict[str, Any]) -> None:
        for tier in conf["tiers"]:
            tier["plugins"] = [p if p["name"] != plugin else {"name": instead} for p in tier["plugins"]
                               if p["name"] != plugin or instead]

    return edit


SCHEDULER_RULE = "gang-scheduler-preemption-path"


@mutation(SCHEDULER_RULE, CHART)
def scheduler_without_reclaim(stack: Stack) -> None:
    edit_scheduler_conf(stack, _drop_action("reclaim"))


@mutation(SCHEDULER_RULE, CHART)
def scheduler_without_preempt(stack: Stack) -> None:
    edit_scheduler_conf(stack, _drop_action("preempt"))


@mutation(SCHEDULER_RULE, CHART)
def scheduler_without_enqueue(stack: Stack) -> None:
    edit_scheduler_conf(stack, _drop_action("enqueue"))


@mutation(SCHEDULER_RULE, CHART)
def scheduler_without_gang(stack: Stack) -> None:
    edit_scheduler_conf(stack, _drop_plugin("gang"))


@mutation(SCHEDULER_RULE, CHART)
def scheduler_without_priority(stack: Stack) -> None:
    edit_scheduler_conf(stack, _drop_plugin("priority"))


@mutation(SCHEDULER_RULE, CHART)
def scheduler_proportion_instead_of_capacity(stack: Stack) -> None:
    edit_scheduler_conf(stack, _drop_plugin("capacity", instead="proportion"))


@mutation(SCHEDULER_RULE, CHART)
def scheduler_capacity_not_reclaimable(stack: Stack) -> None:
    def edit(conf: dict[str, Any]) -> None:
        for tier in conf["tiers"]:
            for plugin in tier["plugins"]:
                if plugin["name"] == "capacity":
                    plugin["enableReclaimable"] = False

    edit_scheduler_conf(stack, edit)


@mutation(SCHEDULER_RULE, CHART)
def scheduler_chart_default_configuration(stack: Stack) -> None:
    stack.props("Chart", "volcano")["values"]["custom"].pop("scheduler_config_override")


@mutation(SCHEDULER_RULE, "Queue inference")
def inference_queue_not_reclaimable(stack: Stack) -> None:
    stack.props("Queue", "inference")["spec"]["reclaimable"] = False


@mutation(SCHEDULER_RULE, "Queue training-h100-a")
def training_queue_reclaimable(stack: Stack) -> None:
    stack.props("Queue", "training-h100-a")["spec"]["reclaimable"] = True


# ---- the core invariants (the pack caught these before issue 18)

@mutation("no-noexecute-taints", "Node vk-lambda-east")
def virtual_node_no_execute(stack: Stack) -> None:
    node = stack.props("Node", "vk-lambda-east")
    node.setdefault("spec", {}).setdefault("taints", []).append(
        {"key": BURST_TAINT, "value": "closed", "effect": "NoExecute"})


@mutation("no-noexecute-taints", "Deployment gpu-system/health-guard")
def health_guard_quarantines_with_no_execute(stack: Stack) -> None:
    live_container(stack.props("Deployment", "health-guard")).setdefault("env", []).append(
        {"name": "QUARANTINE_TAINT", "value": f"{PREFIX}/gpu-health=fatal:NoExecute"})


@mutation("inference-no-fixed-replicas", "Deployment inference/sdxl-turbo")
def inference_fixed_replicas(stack: Stack) -> None:
    stack.props("Deployment", "sdxl-turbo")["spec"]["replicas"] = 8


@mutation("inference-no-burst-toleration", "Deployment inference/llama-70b-chat")
def inference_tolerates_the_burst_taint(stack: Stack) -> None:
    live_pod_spec(stack.props("Deployment", "llama-70b-chat"))["tolerations"].append(
        {"key": BURST_TAINT, "operator": "Exists", "effect": "NoSchedule"})


@mutation("images-pinned", "DaemonSet gpu-telemetry/ib-exporter")
def image_latest(stack: Stack) -> None:
    image = "registry.gpucluster.io/platform/ib-exporter:latest"
    live_container(stack.props("DaemonSet", "ib-exporter"))["image"] = image


@mutation("thermal-alert-threshold", "PrometheusRule monitoring/gpu-alerts")
def thermal_alert_too_hot(stack: Stack) -> None:
    for group in stack.props("PrometheusRule", "gpu-alerts")["spec"]["groups"]:
        for entry in group["rules"]:
            entry["expr"] = str(entry.get("expr", "")).replace("GPU_TEMP >= 78", "GPU_TEMP >= 95")


# --------------------------------------------------------------------------- running them


@dataclass(frozen=True)
class Outcome:
    mutation: Mutation
    new: list[Violation]

    @property
    def caught(self) -> bool:
        """Refused at all: some new mandatory violation anywhere."""
        return any(v.level.value == "mandatory" for v in self.new)

    @property
    def named(self) -> bool:
        """Refused by the named rule, on the mutated object."""
        return any(v.rule == self.mutation.rule and v.resource == self.mutation.target and v.level.value == "mandatory"
                   for v in self.new)


def _key(v: Violation) -> tuple[str, str, str]:
    return v.rule, v.resource, v.message


def _job_config(config: dict[str, Any]) -> None:
    config[f"{PROJECT}:training"]["jobs"][0]["enabled"] = True


@dataclass(frozen=True)
class Base:
    """A rendered stack to mutate: its resources, rule context and the violations it has unmutated."""

    resources: list[Resource]
    ctx: RuleContext
    before: frozenset[tuple[str, str, str]]


def base_stacks() -> dict[bool, Base]:
    """The prod stack, without and with its example training job."""
    out: dict[bool, Base] = {}
    for with_job in (False, True):
        config, secrets = raw_stack("prod")
        raw = raw_from_stack("prod")
        if with_job:
            _job_config(config)
            raw["training"] = config[f"{PROJECT}:training"]
        resources = policy.resources_of(run_program("prod", config, secrets))
        ctx = policy.context_for("prod", raw)
        out[with_job] = Base(resources, ctx, frozenset(_key(v) for v in evaluate(resources, ctx)))
    return out


def run_mutation(m: Mutation, bases: dict[bool, Base]) -> Outcome:
    base = bases[m.with_job]
    stack = Stack(base.resources)
    m.apply(stack)
    return Outcome(m, [v for v in evaluate(stack.resources, base.ctx) if _key(v) not in base.before])


def outcomes() -> Iterator[Outcome]:
    bases = base_stacks()
    for m in MUTATIONS:
        yield run_mutation(m, bases)


@pytest.fixture(scope="module")
def bases() -> dict[bool, Base]:
    return base_stacks()


def test_the_corpus_is_large_and_ids_are_unique() -> None:
    ids = [m.id for m in MUTATIONS]
    assert len(ids) == len(set(ids))
    assert len(MUTATIONS) >= 30


@pytest.mark.parametrize("m", MUTATIONS, ids=[m.id for m in MUTATIONS])
def test_mutation_is_refused_by_its_rule(m: Mutation, bases: dict[bool, Base]) -> None:
    outcome = run_mutation(m, bases)
    found = [(v.rule, v.resource) for v in outcome.new if v.level.value == "mandatory"]
    assert outcome.named, f"{m.id}: expected {m.rule} on {m.target}; new mandatory violations: {found}"


if __name__ == "__main__":  # the measurement quoted in the issue note: python -m tests.test_policy_mutations
    results = list(outcomes())
    for o in results:
        print(f"{'named ' if o.named else 'caught' if o.caught else 'MISSED'}  {o.mutation.rule:32} {o.mutation.id}")
    print(f"{len(MUTATIONS)} mutations: {sum(o.caught for o in results)} refused, "
          f"{sum(o.named for o in results)} refused by the named rule on the mutated object")
