"""Scheduling rules: GPU pods go through the gang scheduler with a declared tier, GPUs are never overcommitted,
training is gang-scheduled, outranks inference and stays on-prem; every container requests cpu and memory."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import yaml

from components.guardrail_rules import guardrail
from components.naming import VK_PROVIDER_TAINT
from components.training_spec import SUPERVISOR_COMMAND
from policies.rules.core import ADVISORY, MANDATORY, Resource, RuleContext, as_map, as_seq, quantity, rule
from policies.rules.pods import gpu_counts, is_training, is_volcano_job, pod_templates, requests_gpus
from training_runtime.settings import CHECKPOINT_DIR

_BREAKS = "a violation breaks the scheduling design"


@rule(
    "gpu-priority-class",
    "Every pod that requests GPUs (MIG slices included) names the training or the inference PriorityClass.",
    MANDATORY,
    f"{_BREAKS}: without a GPU tier, preemption order between training and inference is undefined, and a GPU pod "
    "at the system tier would preempt training gangs",
)
def check_gpu_priority_class(res: Resource, ctx: RuleContext) -> list[str]:
    out = []
    gpu_tiers = sorted({ctx.training_class, ctx.inference_class})
    for pod in pod_templates(res):
        if not requests_gpus(pod, ctx.gpu_resource):
            continue
        cls = pod.spec.get("priorityClassName")
        if cls not in gpu_tiers:
            out.append(
                f"{pod.where}: GPU pod has priorityClassName {cls!r}, not one of the GPU tiers "
                f"{gpu_tiers}; set priorityClassName to '{ctx.training_class}' for training or "
                f"'{ctx.inference_class}' for inference"
            )
    return out


@rule(
    "gpu-limits-equal-requests",
    "GPU limits equal GPU requests on every container (MIG slices included).",
    MANDATORY,
    "extended resources cannot be overcommitted; a mismatch is rejected or miscounted",
)
def check_gpu_limits_equal_requests(res: Resource, ctx: RuleContext) -> list[str]:
    out = []
    for pod in pod_templates(res):
        for where, container in pod.containers():
            for name, (request, limit) in gpu_counts(container, ctx.gpu_resource).items():
                if request is None or limit is None or quantity(request) != quantity(limit):
                    out.append(
                        f"{where}: {name} requests ({request}) and limits ({limit}) differ; GPUs cannot "
                        f"be overcommitted, set resources.requests and resources.limits '{name}' "
                        "to the same count"
                    )
    return out


@rule(
    "gpu-scheduler",
    "Every GPU pod (MIG slices included) uses the chosen gang scheduler.",
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
                f"pods it did not place); {guardrail('gang-scheduler').fix_text(ctx.guardrail_names)}"
            )
    return out


@rule(
    "training-gang-scheduled",
    "Training (Volcano Jobs, and pods of any workload kind with the training PriorityClass or labelled "
         "workload=training) is gang-scheduled: minAvailable equals replicas.",
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
        if not is_training(res, pod, ctx):
            continue
        if res.kind == "Job" and res.api_version == "batch/v1" and pod.annotations.get("scheduling.k8s.io/group-name"):
            continue  # kube-batch: an Indexed Job ganged by its PodGroup
        out.append(
            f"{res.kind} is training (priorityClassName {pod.spec.get('priorityClassName')!r}, "
            f"{ctx.keys.workload}={pod.labels.get(ctx.keys.workload)!r}) but is not gang-scheduled; run training "
            "as a Volcano Job (batch.volcano.sh) with minAvailable equal to its replicas"
        )
    return out


@rule(
    "training-outranks-inference",
    "Training pods (Volcano Jobs, pods labelled workload=training) use a PriorityClass whose value is above "
         "inference's.",
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
                f"inference ('{ctx.inference_class}', value {inference_value}), so a gang cannot take GPUs from "
                f"inference; {guardrail('training-priority').fix_text(ctx.guardrail_names)}"
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
    "Training pods (by PriorityClass, label or Volcano Job, in any workload kind) have a required node affinity "
         "that excludes virtual nodes, and tolerate neither the virtual nodes' taints nor every taint.",
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
        names = ctx.guardrail_names
        if not terms or not all(_term_excludes_virtual(t, ctx) for t in terms):
            out.append(f"{pod.where}: training pods may land on a virtual node; "
                       f"{guardrail('onprem-affinity').fix_text(names)} (or 'type NotIn [virtual-kubelet]')")
        virtual = (VK_PROVIDER_TAINT, ctx.keys.burst_taint)
        for tol in (as_map(t) for t in as_seq(pod.spec.get("tolerations"))):
            if tol.get("key") in virtual or (not tol.get("key") and tol.get("operator") == "Exists"):
                out.append(f"{pod.where}: training tolerates {tol.get('key') or 'every taint'}, which lets it "
                           f"onto virtual nodes; {guardrail('no-virtual-node-toleration').fix_text(names)}")
    return out


@rule(
    "training-no-spare-toleration",
    "Training pods do not tolerate the warm spares' taint (a toleration of every taint is refused by "
         "training-onprem-only).",
    MANDATORY,
    "a gang on a pool's warm spares leaves the next quarantine no node to replace with",
)
def check_training_no_spare_toleration(res: Resource, ctx: RuleContext) -> list[str]:
    spare = ctx.keys.spare_taint
    return [f"{pod.where}: training tolerates the warm spares' taint {spare}, so a gang may take a pool's spares "
            "and a quarantine under another gang would find none; remove that toleration"
            for pod in pod_templates(res) if is_training(res, pod, ctx)
            for tol in (as_map(t) for t in as_seq(pod.spec.get("tolerations"))) if tol.get("key") == spare]


@rule(
    "training-handover-gate",
    "Where the stack runs the make-before-break handover, training pods (by PriorityClass, label or Volcano "
         "Job) start behind its scheduling gate.",
    MANDATORY,
    "an ungated gang takes inference's GPUs by reclaim before a standby covers them: ready inference drops",
)
def check_training_handover_gate(res: Resource, ctx: RuleContext) -> list[str]:
    if ctx.handover_gate is None:
        return []
    out = []
    for pod in pod_templates(res):
        if not is_training(res, pod, ctx):
            continue
        gates = [as_map(g).get("name") for g in as_seq(pod.spec.get("schedulingGates"))]
        if ctx.handover_gate not in gates:
            out.append(f"{pod.where}: training starts without the handover gate (gates {gates}); "
                       f"{guardrail('handover-gate').fix_text(ctx.guardrail_names)}")
    return out


@rule(
    "training-restart-in-place",
    "Where the stack restarts gangs in place, every training Volcano Job runs its command under the training "
         "runtime's supervisor and mounts a checkpoint volume (CHECKPOINT_DIR).",
    MANDATORY,
    "a gang that cannot restart in place is deleted and recreated pod by pod at every crash (an eviction, a "
    "reschedule and a container start per pod, at 2,048 pods), and without a checkpoint it starts from step 0",
)
def check_training_restart_in_place(res: Resource, ctx: RuleContext) -> list[str]:
    if not ctx.restart_in_place or not is_volcano_job(res):
        return []
    out = []
    for pod in pod_templates(res):
        if not is_training(res, pod, ctx):
            continue
        fix = guardrail("restart-in-place").fix_text(ctx.guardrail_names)
        trainers = [(w, c) for w, c in pod.containers() if ".containers[" in w][:1]
        for where, container in trainers:
            command = [str(c) for c in as_seq(container.get("command"))]
            if tuple(command[:len(SUPERVISOR_COMMAND)]) != SUPERVISOR_COMMAND:
                shown = " ".join(command) if command else "(the image's own)"
                out.append(f"{where}: its command {shown} does not run under the supervisor, so a crash restarts the "
                           f"whole gang through Volcano; {fix}")
            env = {as_map(e).get("name") for e in as_seq(container.get("env"))}
            if CHECKPOINT_DIR not in env:
                out.append(f"{where}: mounts no checkpoint volume ({CHECKPOINT_DIR} unset): the gang can neither "
                           f"restart in place nor resume; {fix}")
    return out


#: Volcano actions the preemption path runs, in the order it needs them: enqueue admits a gang only when its
#: minAvailable fits, allocate binds it whole, preempt picks victims inside a queue, reclaim across queues.
VOLCANO_ACTIONS = ("enqueue", "allocate", "preempt", "reclaim")
#: Volcano plugins the design needs: priority orders jobs and victims, gang keeps gangs whole, predicates
#: honours taints and affinity (training stays on-prem), capacity shares queues by their deserved GPUs.
VOLCANO_PLUGINS = ("priority", "gang", "predicates", "capacity")
#: Plugins that must not run: proportion answers the same queue questions as capacity, by weight.
VOLCANO_FORBIDDEN_PLUGINS = ("proportion",)
#: Where a scheduler configuration sits: the chart's override value, or the ConfigMap key Volcano reads.
VOLCANO_CONF_KEY = "volcano-scheduler.conf"


def chart_name(chart: object) -> str:
    """A chart's name from its reference: ``volcano``, ``repo/volcano`` or a local path ending in ``/volcano``."""
    return str(chart or "").rstrip("/").rsplit("/", 1)[-1]


def volcano_scheduler_conf(res: Resource) -> tuple[str, str] | None:
    """Where and what a Volcano scheduler configuration is in this resource (chart values or ConfigMap)."""
    if res.type.startswith("kubernetes:helm.sh/") and chart_name(res.props.get("chart")) == "volcano":
        custom = as_map(as_map(res.props.get("values")).get("custom"))
        return "values.custom.scheduler_config_override", str(custom.get("scheduler_config_override") or "")
    if res.kind == "ConfigMap":
        text = as_map(res.props.get("data")).get(VOLCANO_CONF_KEY)
        if isinstance(text, str):
            return f"data.{VOLCANO_CONF_KEY}", text
    return None


_ACTION_SPLIT = re.compile(r"[,\s]+")


def scheduler_conf_problems(text: str) -> list[str]:
    """What a Volcano scheduler configuration lacks for the preemption path (empty when it has it all)."""
    if not text.strip():
        return ["is not set, so the chart's default applies (no reclaim, no preempt, proportion instead of "
                "capacity); pass components.gang_scheduler.volcano_scheduler_conf()"]
    try:
        conf = yaml.safe_load(text)
    except yaml.YAMLError as error:
        return [f"is not YAML ({error.__class__.__name__}); the scheduler would not start"]
    conf = as_map(conf)
    actions = [a for a in _ACTION_SPLIT.split(str(conf.get("actions") or "")) if a]
    out = []
    missing = [a for a in VOLCANO_ACTIONS if a not in actions]
    if missing:
        out.append(f"actions '{', '.join(actions)}' lack {', '.join(missing)}; without enqueue a gang is not admitted "
                   "whole, without preempt or reclaim a pending gang cannot take GPUs from inference (reclaim is the "
                   "only cross-queue path)")
    elif actions.index("enqueue") > actions.index("allocate"):
        out.append("action enqueue comes after allocate; enqueue must admit a gang before allocate binds it")
    plugins = [as_map(p) for tier in as_seq(conf.get("tiers")) for p in as_seq(as_map(tier).get("plugins"))]
    names = [str(p.get("name")) for p in plugins]
    absent = [p for p in VOLCANO_PLUGINS if p not in names]
    if absent:
        out.append(f"plugins {names} lack {', '.join(absent)}; the preemption path needs {', '.join(VOLCANO_PLUGINS)}")
    for name in (p for p in VOLCANO_FORBIDDEN_PLUGINS if p in names):
        out.append(f"plugin {name} is enabled; queues share by their deserved GPUs (capacity), and {name} would "
                   "let training reclaim only its weighted share")
    for plugin in plugins:
        if plugin.get("name") not in VOLCANO_PLUGINS:
            continue
        off = sorted(k for k, v in plugin.items() if str(k).startswith("enable") and v is False)
        if off:
            out.append(f"plugin {plugin.get('name')} has {', '.join(f'{k}: false' for k in off)}; the preemption "
                       "path needs every extension point of that plugin")
    return out


@rule(
    "gang-scheduler-preemption-path",
    "The Volcano scheduler configuration keeps the preemption path: actions enqueue, allocate, preempt and "
         "reclaim; plugins priority, gang, predicates and capacity (none disabled, no proportion); the inference "
         "queue reclaimable and every training queue not.",
    MANDATORY,
    f"{_BREAKS}: without them a pending gang never gets GPUs back from inference, or training gets reclaimed",
)
def check_gang_scheduler(res: Resource, ctx: RuleContext) -> list[str]:
    found = volcano_scheduler_conf(res)
    if found is not None:
        where, text = found
        return [f"{where} {problem}" for problem in scheduler_conf_problems(text)]
    if res.kind != "Queue" or res.group != "scheduling.volcano.sh":
        return []
    reclaimable = as_map(res.props.get("spec")).get("reclaimable")
    if res.object_name == ctx.inference_queue and reclaimable is False:
        return ["the inference queue has reclaimable: false; reclaim could not evict inference for a pending gang; "
                "set scheduling.inferenceQueue.reclaimable: true"]
    if res.object_name in ctx.training_queues and reclaimable is not False:
        return [f"training queue {res.object_name} has reclaimable: {reclaimable} (Volcano's default is true); "
                "another queue could reclaim a gang's members; set reclaimable: false"]
    return []


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
