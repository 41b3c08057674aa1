"""What the rules look for inside objects: pod templates, GPU requests, and which pods are training,
inference or an inference standby (shared by the rule areas)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from components.naming import INFERENCE, TRAINING
from policies.rules.core import Resource, RuleContext, as_map, as_seq

#: A pod's app name, for messages; privileged agents are matched by namespace and service account instead
#: (:mod:`policies.rules.allow_lists`), since a label costs nothing to copy.
NAME_LABEL = "app.kubernetes.io/name"


@dataclass(frozen=True)
class PodTemplate:
    """A pod spec inside a workload, with the labels that identify it."""

    where: str
    labels: Mapping[str, Any]
    annotations: Mapping[str, Any]
    spec: Mapping[str, Any]

    @property
    def app_name(self) -> str:
        return str(self.labels.get(NAME_LABEL, ""))

    def containers(self) -> list[tuple[str, Mapping[str, Any]]]:
        found = []
        for group in ("initContainers", "containers", "ephemeralContainers"):
            for container in as_seq(self.spec.get(group)):
                c = as_map(container)
                found.append((f"{self.where}.{group}[{c.get('name', '?')}]", c))
        return found


WORKLOAD_KINDS = {"Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "ReplicationController"}


def is_volcano_job(res: Resource) -> bool:
    return res.kind == "Job" and res.group == "batch.volcano.sh"


def pod_templates(res: Resource) -> list[PodTemplate]:
    """Every pod spec a resource would create: Pods, workloads, Jobs, CronJobs and Volcano Jobs."""
    spec = as_map(res.props.get("spec"))
    labels = res.labels

    def template(raw: Any, where: str, overrides: Mapping[str, Any] | None = None) -> PodTemplate:
        t = as_map(raw)
        meta = as_map(t.get("metadata"))
        pod_spec = dict(as_map(t.get("spec")))
        for key, value in (overrides or {}).items():
            if value and not pod_spec.get(key):
                pod_spec[key] = value
        return PodTemplate(where, {**labels, **as_map(meta.get("labels"))}, as_map(meta.get("annotations")), pod_spec)

    if res.kind == "Pod" and res.api_version == "v1":
        return [PodTemplate("spec", labels, as_map(res.metadata.get("annotations")), spec)]
    if is_volcano_job(res):
        job_level = {"schedulerName": spec.get("schedulerName"), "priorityClassName": spec.get("priorityClassName")}
        tasks = [as_map(task) for task in as_seq(spec.get("tasks"))]
        return [
            template(task.get("template"), f"spec.tasks[{task.get('name', i)}].template.spec", job_level)
            for i, task in enumerate(tasks)
        ]
    if res.kind in WORKLOAD_KINDS or (res.kind == "Job" and res.api_version == "batch/v1"):
        return [template(spec.get("template"), "spec.template.spec")] if spec.get("template") else []
    if res.kind == "CronJob":
        job_spec = as_map(as_map(spec.get("jobTemplate")).get("spec"))
        return [template(job_spec.get("template"), "spec.jobTemplate.spec.template.spec")]
    return []


#: NVIDIA's MIG slices under the device plugin's "mixed" strategy (``nvidia.com/mig-3g.40gb``): GPUs too.
MIG_PREFIX = "nvidia.com/mig-"


def is_gpu_resource(name: str, gpu_resource: str) -> bool:
    """The stack's GPU resource, NVIDIA's whole GPUs, and every MIG slice."""
    return name in (gpu_resource, "nvidia.com/gpu") or name.startswith(MIG_PREFIX)


def gpu_counts(container: Mapping[str, Any], gpu_resource: str) -> dict[str, tuple[Any, Any]]:
    """Each GPU resource a container names, with its (request, limit); None where one side is absent."""
    resources = as_map(container.get("resources"))
    requests, limits = as_map(resources.get("requests")), as_map(resources.get("limits"))
    names = sorted({str(k) for k in (*requests, *limits) if is_gpu_resource(str(k), gpu_resource)})
    return {name: (requests.get(name), limits.get(name)) for name in names}


def requests_gpus(pod: PodTemplate, gpu_resource: str) -> bool:
    return any(gpu_counts(c, gpu_resource) for _, c in pod.containers())


def is_training(res: Resource, pod: PodTemplate, ctx: RuleContext) -> bool:
    """Training, by what a workload cannot shed without losing its rank: a Volcano Job, or the training
    PriorityClass in any workload kind; the workload label counts too, but relabelling alone does not hide it."""
    return (
        is_volcano_job(res)
        or pod.spec.get("priorityClassName") == ctx.training_class
        or pod.labels.get(ctx.keys.workload) == TRAINING
    )


def is_inference(pod: PodTemplate, ctx: RuleContext) -> bool:
    return (
        pod.labels.get(ctx.keys.workload) == INFERENCE
        or pod.spec.get("priorityClassName") == ctx.inference_class
    )


def _required_terms(pod: PodTemplate) -> list[Mapping[str, Any]]:
    node_affinity = as_map(as_map(pod.spec.get("affinity")).get("nodeAffinity"))
    required = as_map(node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution"))
    return [as_map(t) for t in as_seq(required.get("nodeSelectorTerms"))]


def _term_only_virtual(term: Mapping[str, Any], ctx: RuleContext) -> bool:
    return any(
        e.get("key") == ctx.keys.location and e.get("operator") == "In" and as_seq(e.get("values")) == ["external"]
        for e in (as_map(x) for x in as_seq(term.get("matchExpressions")))
    )


def is_standby(pod: PodTemplate, ctx: RuleContext) -> bool:
    """An inference standby: labelled role=standby and required onto virtual nodes only (every term)."""
    terms = _required_terms(pod)
    return (
        is_inference(pod, ctx)
        and pod.labels.get(ctx.keys.role) == "standby"
        and bool(terms)
        and all(_term_only_virtual(t, ctx) for t in terms)
    )


def is_standby_deployment(res: Resource, ctx: RuleContext) -> bool:
    pods = pod_templates(res)
    return res.kind == "Deployment" and bool(pods) and all(is_standby(p, ctx) for p in pods)


def inference_deployments(resources: Iterable[Resource], ctx: RuleContext) -> list[Resource]:
    return [
        r for r in resources
        if r.kind == "Deployment" and any(is_inference(p, ctx) for p in pod_templates(r))
    ]


def selector_matches(selector: Mapping[str, Any], labels: Mapping[str, Any]) -> bool:
    """A LabelSelector (matchLabels and matchExpressions) against a label set; empty matches nothing."""
    match_labels = as_map(selector.get("matchLabels"))
    expressions = [as_map(e) for e in as_seq(selector.get("matchExpressions"))]
    if not match_labels and not expressions:
        return False
    if any(labels.get(k) != v for k, v in match_labels.items()):
        return False
    for expr in expressions:
        key, op, values = str(expr.get("key")), expr.get("operator"), as_seq(expr.get("values"))
        present = key in labels
        if (op == "In" and labels.get(key) not in values) or (op == "NotIn" and present and labels.get(key) in values):
            return False
        if (op == "Exists" and not present) or (op == "DoesNotExist" and present):
            return False
    return True
