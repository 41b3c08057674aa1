"""Scheduling rules: GPU pods go through the gang scheduler with a declared tier, GPUs are never overcommitted,
training is gang-scheduled, outranks inference and stays on-prem; every container requests cpu and memory."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from components.naming import TRAINING
from policies.rules.core import ADVISORY, MANDATORY, Resource, RuleContext, as_map, as_seq, quantity, rule
from policies.rules.pods import gpu_count, is_training, is_volcano_job, pod_templates, requests_gpus

_BREAKS = "a violation breaks the scheduling design"


@rule(
    "gpu-priority-class",
    "Every pod that requests GPUs names a PriorityClass from the declared tiers.",
    MANDATORY,
    f"{_BREAKS}: without a tier, preemption order between training and inference is undefined",
)
def check_gpu_priority_class(res: Resource, ctx: RuleContext) -> list[str]:
    out = []
    for pod in pod_templates(res):
        if not requests_gpus(pod, ctx.gpu_resource):
            continue
        cls = pod.spec.get("priorityClassName")
        if cls not in ctx.tiers:
            out.append(
                f"{pod.where}: GPU pod has priorityClassName {cls!r}, not one of the declared tiers "
                f"{sorted(ctx.tiers)}; set priorityClassName to '{ctx.training_class}' for training or "
                f"'{ctx.inference_class}' for inference"
            )
    return out


@rule(
    "gpu-limits-equal-requests",
    "GPU limits equal GPU requests on every container.",
    MANDATORY,
    "extended resources cannot be overcommitted; a mismatch is rejected or miscounted",
)
def check_gpu_limits_equal_requests(res: Resource, ctx: RuleContext) -> list[str]:
    out = []
    for pod in pod_templates(res):
        for where, container in pod.containers():
            request, limit = gpu_count(container, ctx.gpu_resource)
            if request is None and limit is None:
                continue
            if request is None or limit is None or quantity(request) != quantity(limit):
                out.append(
                    f"{where}: {ctx.gpu_resource} requests ({request}) and limits ({limit}) differ; GPUs cannot "
                    f"be overcommitted, set resources.requests and resources.limits '{ctx.gpu_resource}' "
                    "to the same count"
                )
    return out


@rule(
    "gpu-scheduler",
    "Every GPU pod uses the chosen gang scheduler.",
    MANDATORY,
    "two schedulers on the same nodes double-book GPUs, and the gang scheduler cannot preempt pods "
            "it did not place",
)
def check_gpu_scheduler(res: Resource, ctx: RuleContext) -> list[str]:
    out = []
    for pod in pod_templates(res):
        if not requests_gpus(pod, ctx.gpu_resource):
            continue
        name = pod.spec.get("schedulerName") or "default-scheduler"
        if name != ctx.scheduler_name:
            out.append(
                f"{pod.where}: GPU pod uses schedulerName '{name}'; every GPU pod must go through "
                f"'{ctx.scheduler_name}' (two schedulers double-book GPUs and the gang scheduler cannot preempt "
                f"pods it did not place); set schedulerName: {ctx.scheduler_name}"
            )
    return out


@rule(
    "training-gang-scheduled",
    "Training (Volcano Jobs, pods labelled workload=training) is gang-scheduled: "
         "minAvailable equals replicas.",
    MANDATORY,
    "a partial gang holds GPUs and makes no progress",
)
def check_training_gang(res: Resource, ctx: RuleContext) -> list[str]:
    if is_volcano_job(res):
        spec = as_map(res.props.get("spec"))
        tasks = [as_map(t) for t in as_seq(spec.get("tasks"))]
        replicas = sum(int(quantity(t.get("replicas")) or 0) for t in tasks)
        min_available = spec.get("minAvailable")
        out = []
        if min_available is None or quantity(min_available) != replicas:
            out.append(
                f"spec.minAvailable is {min_available} but the tasks have {replicas} replicas; a partial gang "
                f"holds GPUs without making progress: set spec.minAvailable: {replicas}"
            )
        for task in tasks:
            task_min = task.get("minAvailable")
            if task_min is not None and quantity(task_min) != quantity(task.get("replicas")):
                out.append(
                    f"spec.tasks[{task.get('name')}].minAvailable is {task_min} but replicas is "
                    f"{task.get('replicas')}; set them equal so the task starts whole or not at all"
                )
        return out
    out = []
    for pod in pod_templates(res):
        if pod.labels.get(ctx.keys.workload) != TRAINING:
            continue
        if res.kind == "Job" and res.api_version == "batch/v1" and pod.annotations.get("scheduling.k8s.io/group-name"):
            continue  # kube-batch: an Indexed Job ganged by its PodGroup
        out.append(
            f"{res.kind} carries {ctx.keys.workload}={TRAINING} but is not gang-scheduled; run training as a "
            "Volcano Job (batch.volcano.sh) with minAvailable equal to its replicas"
        )
    return out


@rule(
    "training-outranks-inference",
    "Training pods use a PriorityClass whose value is above inference's.",
    MANDATORY,
    f"{_BREAKS}: a gang must be able to take GPUs from inference",
)
def check_training_outranks_inference(res: Resource, ctx: RuleContext) -> list[str]:
    out = []
    inference_value = ctx.tiers.get(ctx.inference_class)
    for pod in pod_templates(res):
        if not is_training(res, pod, ctx):
            continue
        cls = pod.spec.get("priorityClassName")
        value = ctx.tiers.get(str(cls))
        if value is None or inference_value is None or value <= inference_value:
            out.append(
                f"{pod.where}: training uses priorityClassName {cls!r} (value {value}), which does not outrank "
                f"inference ('{ctx.inference_class}', value {inference_value}); set priorityClassName: "
                f"{ctx.training_class} so a gang can take GPUs from inference"
            )
    return out


def _term_excludes_virtual(term: Mapping[str, Any], ctx: RuleContext) -> bool:
    for expr in (as_map(e) for e in as_seq(term.get("matchExpressions"))):
        key, op, values = expr.get("key"), expr.get("operator"), as_seq(expr.get("values"))
        if key == "type" and op == "NotIn" and "virtual-kubelet" in values:
            return True
        if key == ctx.keys.location and op == "In" and values and all(v == "onprem" for v in values):
            return True
        if key == "kubernetes.io/hostname" and op == "NotIn" and ctx.virtual_nodes and ctx.virtual_nodes <= set(values):
            return True
    return False


@rule(
    "training-onprem-only",
    "Training pods have a required node affinity that excludes virtual nodes.",
    MANDATORY,
    "a gang member on external capacity stalls the whole NCCL ring",
)
def check_training_onprem(res: Resource, ctx: RuleContext) -> list[str]:
    out = []
    for pod in pod_templates(res):
        if not is_training(res, pod, ctx):
            continue
        required = as_map(
            as_map(as_map(pod.spec.get("affinity")).get("nodeAffinity")).get("requiredDuringSchedulingIgnoredDuringExecution")
        )
        terms = [as_map(t) for t in as_seq(required.get("nodeSelectorTerms"))]
        if not terms or not all(_term_excludes_virtual(t, ctx) for t in terms):
            out.append(
                f"{pod.where}: training pods may land on a virtual node; add a required node affinity whose every "
                f"term has '{ctx.keys.location} In [onprem]' or 'type NotIn [virtual-kubelet]'"
            )
    return out


@rule(
    "container-resources",
    "Every container requests cpu and memory.",
    ADVISORY,
    "advisory: right-sizing depends on the workload; it is a recommendation, not an invariant",
)
def check_container_resources(res: Resource, ctx: RuleContext) -> list[str]:
    out = []
    for pod in pod_templates(res):
        for where, container in pod.containers():
            requests = as_map(as_map(container.get("resources")).get("requests"))
            missing = [r for r in ("cpu", "memory") if r not in requests]
            if missing:
                out.append(f"{where}: no resources.requests for {', '.join(missing)}; without requests the "
                           "scheduler packs blindly — use components.security.resources()")
    return out
