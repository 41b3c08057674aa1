"""The policy rules: the cluster's operating lessons as checks over registered resources.

Each rule is a pure function over a :class:`Resource` (type, props, urn, name, options) or over the
whole stack, plus a :class:`RuleContext` built from the stack config (tiers, scheduler, thresholds,
label prefix). The same functions run in two places:

* ``make policy`` / ``tools.policy`` over the mock runtime's registrations (``resources.json`` data);
* the CrossGuard pack (``policies/__main__.py``) under ``pulumi preview --policy-pack policies``,
  through :func:`build_policies`, which wraps them as ``ResourceValidationPolicy`` /
  ``StackValidationPolicy``.

Two facts of the real engine shape the rules (pulumi_policy 1.21):

* the analyzer protocol carries ``protect`` but not ``retainOnDelete``; the engine path therefore leaves
  ``Options.retain_on_delete`` as ``None`` (unknown) and only ``make policy`` judges it;
* secret property values reach the pack already unwrapped, so there the credentials rule compares
  values with the stack file's plain config instead of looking for the secret marker.

Mandatory rules encode invariants whose violation breaks the design (a training gang that cannot
preempt, a NoExecute taint that kills production inference, a checkpoint volume one ``pulumi destroy``
away from deletion). Advisory rules are recommendations whose right answer depends on the workload.
This module must not import the pack's ``__main__`` (starting a pack blocks forever).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import yaml
from pulumi_policy import (
    EnforcementLevel,
    Policy,
    PolicyResource,
    ReportViolation,
    ResourceValidationArgs,
    ResourceValidationPolicy,
    StackValidationArgs,
    StackValidationPolicy,
)

from components.config import ClusterConfig, Descheduler, Observability, Priorities
from components.naming import INFERENCE, TRAINING, VK_PROVIDER_TAINT, Keys
from components.security import PRIVILEGE_ALLOW_LIST

#: How the mock runtime (and resources.json) shows a secret value.
SECRET_PLACEHOLDER = "[secret]"
#: The name label that matches a pod to :data:`components.security.PRIVILEGE_ALLOW_LIST`.
NAME_LABEL = "app.kubernetes.io/name"
REQUIRED_DCGM_COUNTERS = ("DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE")
PACK_NAME = "gpu-cluster-policies"

# --------------------------------------------------------------------------- inputs


@dataclass(frozen=True)
class Options:
    """The resource options a rule may read. ``retain_on_delete`` is None where the engine hides it."""

    protect: bool = False
    retain_on_delete: bool | None = None


@dataclass(frozen=True)
class Resource:
    """One registered resource as the rules see it (plain dicts and lists, unknowns as None)."""

    type: str
    props: Mapping[str, Any]
    urn: str = ""
    name: str = ""
    options: Options = field(default_factory=Options)

    @property
    def kind(self) -> str:
        kind = self.props.get("kind")
        if isinstance(kind, str) and kind:
            return kind
        token = self.type.rsplit(":", 1)[-1]
        return token.removesuffix("Patch")

    @property
    def api_version(self) -> str:
        version = self.props.get("apiVersion")
        if isinstance(version, str) and version:
            return version
        parts = self.type.split(":")
        if len(parts) == 3 and parts[0] == "kubernetes":
            return parts[1].removeprefix("core/")
        return ""

    @property
    def group(self) -> str:
        return self.api_version.rsplit("/", 1)[0] if "/" in self.api_version else ""

    @property
    def metadata(self) -> Mapping[str, Any]:
        return _map(self.props.get("metadata"))

    @property
    def object_name(self) -> str:
        return str(self.metadata.get("name") or self.name)

    @property
    def namespace(self) -> str:
        return str(self.metadata.get("namespace") or "")

    @property
    def labels(self) -> Mapping[str, Any]:
        return _map(self.metadata.get("labels"))

    @property
    def label(self) -> str:
        """How tables and messages name the resource."""
        ns = f"{self.namespace}/" if self.namespace else ""
        return f"{self.kind} {ns}{self.object_name}"


@dataclass(frozen=True)
class RuleContext:
    """The stack-config values the rules need; one per stack."""

    label_prefix: str = "gpucluster.io"
    gpu_resource: str = "nvidia.com/gpu"
    scheduler_name: str = "volcano"
    tiers: Mapping[str, int] = field(default_factory=dict)
    training_class: str = "gpu-training"
    inference_class: str = "gpu-inference"
    thermal_limit_celsius: int = 78
    max_evictions_per_node: int = 4
    max_evictions_per_namespace: int = 8
    max_evictions_total: int = 16
    virtual_nodes: frozenset[str] = frozenset()
    allow_list: frozenset[str] = frozenset(PRIVILEGE_ALLOW_LIST)
    #: True where secret values show as the placeholder (mock runtime); False under the real engine.
    secrets_marked: bool = True
    #: Plain (non-secret) string values of the stack file; a credential equal to one came from plain config.
    plain_config_values: frozenset[str] = frozenset()

    @property
    def keys(self) -> Keys:
        return Keys(self.label_prefix)

    @classmethod
    def from_config(
        cls, cfg: ClusterConfig, *, secrets_marked: bool = True, plain_config_values: Iterable[str] = ()
    ) -> RuleContext:
        return cls(
            label_prefix=cfg.label_prefix,
            gpu_resource=cfg.gpu_resource,
            scheduler_name=cfg.scheduling.scheduler_name,
            tiers={t.name: t.value for t in cfg.priorities.tiers().values()},
            training_class=cfg.priorities.training.name,
            inference_class=cfg.priorities.inference.name,
            thermal_limit_celsius=cfg.observability.thermal_threshold_celsius,
            max_evictions_per_node=cfg.descheduler.max_pods_per_node,
            max_evictions_per_namespace=cfg.descheduler.max_pods_per_namespace,
            max_evictions_total=cfg.descheduler.max_pods_total,
            virtual_nodes=frozenset(p.node_name for p in cfg.providers),
            secrets_marked=secrets_marked,
            plain_config_values=frozenset(plain_config_values),
        )

    @classmethod
    def defaults(cls) -> RuleContext:
        """The schema defaults, for a pack started without stack config (e.g. ``pulumi policy publish``)."""
        priorities, descheduler, observability = Priorities(), Descheduler(), Observability()
        return cls(
            tiers={t.name: t.value for t in priorities.tiers().values()},
            training_class=priorities.training.name,
            inference_class=priorities.inference.name,
            thermal_limit_celsius=observability.thermal_threshold_celsius,
            max_evictions_per_node=descheduler.max_pods_per_node,
            max_evictions_per_namespace=descheduler.max_pods_per_namespace,
            max_evictions_total=descheduler.max_pods_total,
        )


ResourceCheck = Callable[[Resource, RuleContext], list[str]]
StackCheck = Callable[[Sequence[Resource], RuleContext], list[tuple[Resource, str]]]


@dataclass(frozen=True)
class Rule:
    """One rule: exactly one of ``check`` (per resource) or ``stack_check`` (whole stack)."""

    name: str
    description: str
    level: EnforcementLevel
    why_level: str
    check: ResourceCheck | None = None
    stack_check: StackCheck | None = None

    @property
    def mandatory(self) -> bool:
        return self.level is EnforcementLevel.MANDATORY


@dataclass(frozen=True)
class Violation:
    rule: str
    level: EnforcementLevel
    urn: str
    resource: str
    message: str


# --------------------------------------------------------------------------- helpers


def _map(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _seq(value: Any) -> list[Any]:
    if isinstance(value, Sequence) and not isinstance(value, str | bytes):
        return list(value)
    return []


def plain(value: Any) -> Any:
    """Copy engine proxies into plain dicts/lists; an unknown (preview) value becomes None."""
    from pulumi_policy.proxy import UnknownValueError

    if isinstance(value, Mapping):
        out: dict[str, Any] = {}
        for key in list(value.keys()):
            try:
                out[str(key)] = plain(value[key])
            except UnknownValueError:
                out[str(key)] = None
        return out
    if isinstance(value, Sequence) and not isinstance(value, str | bytes):
        items: list[Any] = []
        for index in range(len(value)):
            try:
                items.append(plain(value[index]))
            except UnknownValueError:
                items.append(None)
        return items
    return value


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
            for container in _seq(self.spec.get(group)):
                c = _map(container)
                found.append((f"{self.where}.{group}[{c.get('name', '?')}]", c))
        return found


WORKLOAD_KINDS = {"Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "ReplicationController"}


def is_volcano_job(res: Resource) -> bool:
    return res.kind == "Job" and res.group == "batch.volcano.sh"


def pod_templates(res: Resource) -> list[PodTemplate]:
    """Every pod spec a resource would create: Pods, workloads, Jobs, CronJobs and Volcano Jobs."""
    spec = _map(res.props.get("spec"))
    labels = res.labels

    def template(raw: Any, where: str, overrides: Mapping[str, Any] | None = None) -> PodTemplate:
        t = _map(raw)
        meta = _map(t.get("metadata"))
        pod_spec = dict(_map(t.get("spec")))
        for key, value in (overrides or {}).items():
            if value and not pod_spec.get(key):
                pod_spec[key] = value
        return PodTemplate(where, {**labels, **_map(meta.get("labels"))}, _map(meta.get("annotations")), pod_spec)

    if res.kind == "Pod" and res.api_version == "v1":
        return [PodTemplate("spec", labels, _map(res.metadata.get("annotations")), spec)]
    if is_volcano_job(res):
        job_level = {"schedulerName": spec.get("schedulerName"), "priorityClassName": spec.get("priorityClassName")}
        return [
            template(_map(task).get("template"), f"spec.tasks[{_map(task).get('name', i)}].template.spec", job_level)
            for i, task in enumerate(_seq(spec.get("tasks")))
        ]
    if res.kind in WORKLOAD_KINDS or (res.kind == "Job" and res.api_version == "batch/v1"):
        return [template(spec.get("template"), "spec.template.spec")] if spec.get("template") else []
    if res.kind == "CronJob":
        job_spec = _map(_map(spec.get("jobTemplate")).get("spec"))
        return [template(job_spec.get("template"), "spec.jobTemplate.spec.template.spec")]
    return []


def _quantity(value: Any) -> float | None:
    try:
        return float(str(value))
    except ValueError:
        return None


def gpu_count(container: Mapping[str, Any], gpu_resource: str) -> tuple[Any, Any]:
    resources = _map(container.get("resources"))
    return _map(resources.get("requests")).get(gpu_resource), _map(resources.get("limits")).get(gpu_resource)


def requests_gpus(pod: PodTemplate, gpu_resource: str) -> bool:
    return any(any(v is not None for v in gpu_count(c, gpu_resource)) for _, c in pod.containers())


def is_training(res: Resource, pod: PodTemplate, ctx: RuleContext) -> bool:
    return is_volcano_job(res) or pod.labels.get(ctx.keys.workload) == TRAINING


def is_inference(pod: PodTemplate, ctx: RuleContext) -> bool:
    return (
        pod.labels.get(ctx.keys.workload) == INFERENCE
        or pod.spec.get("priorityClassName") == ctx.inference_class
    )


def _required_terms(pod: PodTemplate) -> list[Mapping[str, Any]]:
    node_affinity = _map(_map(pod.spec.get("affinity")).get("nodeAffinity"))
    required = _map(node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution"))
    return [_map(t) for t in _seq(required.get("nodeSelectorTerms"))]


def _term_only_virtual(term: Mapping[str, Any], ctx: RuleContext) -> bool:
    return any(
        e.get("key") == ctx.keys.location and e.get("operator") == "In" and _seq(e.get("values")) == ["external"]
        for e in (_map(x) for x in _seq(term.get("matchExpressions")))
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


def _standby_deployment(res: Resource, ctx: RuleContext) -> bool:
    pods = pod_templates(res)
    return res.kind == "Deployment" and bool(pods) and all(is_standby(p, ctx) for p in pods)


def inference_deployments(resources: Iterable[Resource], ctx: RuleContext) -> list[Resource]:
    return [
        r for r in resources
        if r.kind == "Deployment" and any(is_inference(p, ctx) for p in pod_templates(r))
    ]


def _selector_matches(selector: Mapping[str, Any], labels: Mapping[str, Any]) -> bool:
    """A LabelSelector (matchLabels and matchExpressions) against a label set; empty matches nothing."""
    match_labels = _map(selector.get("matchLabels"))
    expressions = [_map(e) for e in _seq(selector.get("matchExpressions"))]
    if not match_labels and not expressions:
        return False
    if any(labels.get(k) != v for k, v in match_labels.items()):
        return False
    for expr in expressions:
        key, op, values = str(expr.get("key")), expr.get("operator"), _seq(expr.get("values"))
        present = key in labels
        if (op == "In" and labels.get(key) not in values) or (op == "NotIn" and present and labels.get(key) in values):
            return False
        if (op == "Exists" and not present) or (op == "DoesNotExist" and present):
            return False
    return True


# --------------------------------------------------------------------------- GPU pods


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


def check_gpu_limits_equal_requests(res: Resource, ctx: RuleContext) -> list[str]:
    out = []
    for pod in pod_templates(res):
        for where, container in pod.containers():
            request, limit = gpu_count(container, ctx.gpu_resource)
            if request is None and limit is None:
                continue
            if request is None or limit is None or _quantity(request) != _quantity(limit):
                out.append(
                    f"{where}: {ctx.gpu_resource} requests ({request}) and limits ({limit}) differ; GPUs cannot "
                    f"be overcommitted, set resources.requests and resources.limits '{ctx.gpu_resource}' "
                    "to the same count"
                )
    return out


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


# --------------------------------------------------------------------------- training


def check_training_gang(res: Resource, ctx: RuleContext) -> list[str]:
    if is_volcano_job(res):
        spec = _map(res.props.get("spec"))
        tasks = [_map(t) for t in _seq(spec.get("tasks"))]
        replicas = sum(int(_quantity(t.get("replicas")) or 0) for t in tasks)
        min_available = spec.get("minAvailable")
        out = []
        if min_available is None or _quantity(min_available) != replicas:
            out.append(
                f"spec.minAvailable is {min_available} but the tasks have {replicas} replicas; a partial gang "
                f"holds GPUs without making progress: set spec.minAvailable: {replicas}"
            )
        for task in tasks:
            task_min = task.get("minAvailable")
            if task_min is not None and _quantity(task_min) != _quantity(task.get("replicas")):
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
    for expr in (_map(e) for e in _seq(term.get("matchExpressions"))):
        key, op, values = expr.get("key"), expr.get("operator"), _seq(expr.get("values"))
        if key == "type" and op == "NotIn" and "virtual-kubelet" in values:
            return True
        if key == ctx.keys.location and op == "In" and values and all(v == "onprem" for v in values):
            return True
        if key == "kubernetes.io/hostname" and op == "NotIn" and ctx.virtual_nodes and ctx.virtual_nodes <= set(values):
            return True
    return False


def check_training_onprem(res: Resource, ctx: RuleContext) -> list[str]:
    out = []
    for pod in pod_templates(res):
        if not is_training(res, pod, ctx):
            continue
        required = _map(
            _map(_map(pod.spec.get("affinity")).get("nodeAffinity")).get("requiredDuringSchedulingIgnoredDuringExecution")
        )
        terms = [_map(t) for t in _seq(required.get("nodeSelectorTerms"))]
        if not terms or not all(_term_excludes_virtual(t, ctx) for t in terms):
            out.append(
                f"{pod.where}: training pods may land on a virtual node; add a required node affinity whose every "
                f"term has '{ctx.keys.location} In [onprem]' or 'type NotIn [virtual-kubelet]'"
            )
    return out


# --------------------------------------------------------------------------- taints

_TAINT_STRING = re.compile(r"(?P<key>[A-Za-z0-9][\w./-]*)(=[\w.-]*)?:NoExecute")


def _is_virtual_node(res: Resource, ctx: RuleContext) -> bool:
    labels = res.labels
    return (
        labels.get("type") == "virtual-kubelet"
        or labels.get(ctx.keys.location) == "external"
        or res.object_name in ctx.virtual_nodes
    )


def _is_vk_provider(pod: PodTemplate, ctx: RuleContext) -> bool:
    images = " ".join(str(c.get("image", "")) for _, c in pod.containers())
    return (
        ctx.keys.provider in pod.labels
        or "virtual-kubelet" in images
        or "virtual-kubelet" in str(pod.labels.get("app.kubernetes.io/component", ""))
    )


def _strings(value: Any, path: str = "") -> Iterable[tuple[str, str]]:
    if isinstance(value, str):
        yield path, value
    elif isinstance(value, Mapping):
        for k, v in value.items():
            yield from _strings(v, f"{path}.{k}" if path else str(k))
    elif isinstance(value, Sequence) and not isinstance(value, bytes):
        for i, v in enumerate(value):
            yield from _strings(v, f"{path}[{i}]")


def check_no_noexecute(res: Resource, ctx: RuleContext) -> list[str]:
    out = []
    guarded = (ctx.keys.burst_taint, ctx.keys.thermal_taint)
    fix = "use effect NoSchedule (running pods stay; the descheduler moves them back gradually)"
    if res.kind == "Node":
        virtual = _is_virtual_node(res, ctx)
        for taint in (_map(t) for t in _seq(_map(res.props.get("spec")).get("taints"))):
            if taint.get("effect") != "NoExecute":
                continue
            if virtual:
                out.append(f"virtual node {res.object_name} gets taint {taint.get('key')}:NoExecute, which would evict "
                           f"every inference pod running there at once; {fix}")
            elif taint.get("key") in guarded:
                out.append(f"taint {taint.get('key')}:NoExecute on node {res.object_name}; {fix}")
    for pod in pod_templates(res):
        vk = _is_vk_provider(pod, ctx)
        for where, container in pod.containers():
            for path, text in _strings({k: container.get(k) for k in ("args", "command", "env")}):
                for match in _TAINT_STRING.finditer(text):
                    if vk or match["key"] in guarded or match["key"] == VK_PROVIDER_TAINT:
                        out.append(f"{where}.{path}: '{match.group(0)}' sets a NoExecute taint; {fix}")
                if vk and "NoExecute" in text and not _TAINT_STRING.search(text):
                    out.append(f"{where}.{path}: virtual-kubelet provider configured with NoExecute; {fix}")
    if res.kind == "ConfigMap":
        for path, text in _strings(res.props.get("data")):
            for match in _TAINT_STRING.finditer(text):
                if match["key"] in guarded or match["key"] == VK_PROVIDER_TAINT:
                    out.append(f"data.{path}: '{match.group(0)}' configures a NoExecute taint; {fix}")
    return out


# --------------------------------------------------------------------------- inference


def check_inference_no_replicas(res: Resource, ctx: RuleContext) -> list[str]:
    if res.kind != "Deployment" or not any(is_inference(p, ctx) for p in pod_templates(res)):
        return []
    if _standby_deployment(res, ctx):  # the burst controller owns a standby's count, not an HPA
        return []
    if _map(res.props.get("spec")).get("replicas") is not None:
        return ["inference Deployment sets spec.replicas; every `pulumi up` would reset what the HPA chose. "
                "Remove spec.replicas and let the HorizontalPodAutoscaler own the count"]
    return []


def check_inference_no_burst_toleration(res: Resource, ctx: RuleContext) -> list[str]:
    out = []
    for pod in pod_templates(res):
        if not is_inference(pod, ctx):
            continue
        for tol in (_map(t) for t in _seq(pod.spec.get("tolerations"))):
            if tol.get("key") == ctx.keys.burst_taint and is_standby(pod, ctx):
                continue  # it can only ever land on virtual nodes: the taint closes nothing for it
            if tol.get("key") == ctx.keys.burst_taint and pod.labels.get(ctx.keys.role) == "standby":
                out.append(f"{pod.where}: a standby tolerates the burst taint but may land on-prem; require "
                           f"'{ctx.keys.location} In [external]' in every required node affinity term")
            elif tol.get("key") == ctx.keys.burst_taint:
                out.append(f"{pod.where}: inference tolerates the burst taint {ctx.keys.burst_taint}; remove that "
                           "toleration (tolerate only the provider's taint) so closing burst capacity keeps new "
                           "pods on-prem")
            elif not tol.get("key") and tol.get("operator") == "Exists":
                out.append(f"{pod.where}: a toleration with operator Exists and no key tolerates every taint, "
                           f"including {ctx.keys.burst_taint}; list the taints inference may tolerate instead")
    return out


def _targets(resources: Sequence[Resource], kind: str) -> set[tuple[str, str]]:
    found = set()
    for r in resources:
        if r.kind == "HorizontalPodAutoscaler" or (r.kind == "ScaledObject" and r.group == "keda.sh"):
            ref = _map(_map(r.props.get("spec")).get("scaleTargetRef"))
            if str(ref.get("kind") or "Deployment") == kind:
                found.add((r.namespace, str(ref.get("name"))))
    return found


def check_inference_autoscaled(resources: Sequence[Resource], ctx: RuleContext) -> list[tuple[Resource, str]]:
    scaled = _targets(resources, "Deployment")
    return [
        (d, f"inference Deployment {d.object_name} has no HorizontalPodAutoscaler (or KEDA ScaledObject) in "
            f"namespace '{d.namespace}' targeting it; add one with scaleTargetRef kind Deployment, "
            f"name {d.object_name}")
        for d in inference_deployments(resources, ctx)
        if (d.namespace, d.object_name) not in scaled and not _standby_deployment(d, ctx)
    ]


def _pdbs_for(resources: Sequence[Resource], deployment: Resource) -> list[Resource]:
    labels = {k: v for p in pod_templates(deployment) for k, v in p.labels.items()}
    return [
        r for r in resources
        if r.kind == "PodDisruptionBudget" and r.namespace == deployment.namespace
        and _selector_matches(_map(_map(r.props.get("spec")).get("selector")), labels)
    ]


def check_inference_pdb(resources: Sequence[Resource], ctx: RuleContext) -> list[tuple[Resource, str]]:
    return [
        (d, f"inference Deployment {d.object_name} has no PodDisruptionBudget selecting its pods; add a "
            "policy/v1 PodDisruptionBudget (maxUnavailable: 1) so drains and the descheduler move it gradually")
        for d in inference_deployments(resources, ctx)
        if not _pdbs_for(resources, d)
    ]


# --------------------------------------------------------------------------- descheduler


def descheduler_policy(res: Resource) -> tuple[str, Mapping[str, Any]] | None:
    if res.kind != "ConfigMap":
        return None
    for key, text in _map(res.props.get("data")).items():
        if not isinstance(text, str) or "DeschedulerPolicy" not in text:
            continue
        try:
            doc = yaml.safe_load(text)
        except yaml.YAMLError:
            continue
        if isinstance(doc, Mapping) and doc.get("kind") == "DeschedulerPolicy":
            return str(key), doc
    return None


def _evictor_protects_training(args: Mapping[str, Any], ctx: RuleContext) -> bool:
    threshold = _map(args.get("priorityThreshold"))
    value = threshold.get("value")
    if value is None and threshold.get("name") is not None:
        value = ctx.tiers.get(str(threshold.get("name")))
    training_value = ctx.tiers.get(ctx.training_class)
    # Only pods with priority below the threshold are evictable.
    if value is not None and training_value is not None and training_value >= int(value):
        return True
    selector = _map(args.get("labelSelector"))
    workload = ctx.keys.workload
    return bool(selector) and not _selector_matches(selector, {workload: TRAINING}) and (
        _map(selector.get("matchLabels")).get(workload) is not None
        or any(_map(e).get("key") == workload for e in _seq(selector.get("matchExpressions")))
    )


def check_descheduler_bounded(res: Resource, ctx: RuleContext) -> list[str]:
    found = descheduler_policy(res)
    if found is None:
        return []
    key, policy = found
    out = []
    limits = {
        "maxNoOfPodsToEvictPerNode": ctx.max_evictions_per_node,
        "maxNoOfPodsToEvictPerNamespace": ctx.max_evictions_per_namespace,
        "maxNoOfPodsToEvictTotal": ctx.max_evictions_total,
    }
    for name, limit in limits.items():
        value = policy.get(name)
        number = _quantity(value) if value is not None else None
        if number is None or not 0 < number <= limit:
            out.append(f"data.{key}: {name} is {value}; set it between 1 and {limit} (descheduler.* in the stack "
                       "config) so inference returns on-prem a few pods per cycle, not all at once")
    profiles = [_map(p) for p in _seq(policy.get("profiles"))]
    if not profiles:
        out.append(f"data.{key}: the policy has no profiles; declare a profile whose DefaultEvictor protects training")
    for profile in profiles:
        evictor = next(
            (_map(c).get("args") for c in _seq(profile.get("pluginConfig")) if _map(c).get("name") == "DefaultEvictor"),
            None,
        )
        if not _evictor_protects_training(_map(evictor), ctx):
            out.append(
                f"data.{key}: profile '{profile.get('name')}' can evict training; give its DefaultEvictor a "
                f"priorityThreshold at or below '{ctx.training_class}' ({ctx.tiers.get(ctx.training_class)}) or a "
                f"labelSelector '{ctx.keys.workload} In [{INFERENCE}]'"
            )
    return out


# --------------------------------------------------------------------------- checkpoints


def is_checkpoint(res: Resource) -> bool:
    if res.kind not in ("PersistentVolumeClaim", "PersistentVolume", "StorageClass"):
        return False
    return "checkpoint" in res.object_name or any("checkpoint" in str(v) for v in res.labels.values())


def check_checkpoint_storage(res: Resource, ctx: RuleContext) -> list[str]:
    if not is_checkpoint(res):
        return []
    out = []
    spec = _map(res.props.get("spec"))
    if res.kind in ("PersistentVolumeClaim", "PersistentVolume") and _seq(spec.get("accessModes")) != ["ReadWriteMany"]:
        out.append(f"accessModes is {_seq(spec.get('accessModes'))}; every worker of a gang writes its shard, so "
                   "set accessModes: [ReadWriteMany] on a shared-filesystem backend")
    if res.kind == "PersistentVolume" and spec.get("persistentVolumeReclaimPolicy") != "Retain":
        out.append(f"persistentVolumeReclaimPolicy is {spec.get('persistentVolumeReclaimPolicy')!r}; set "
                   "persistentVolumeReclaimPolicy: Retain so deleting the claim keeps the checkpoints")
    if res.kind == "StorageClass" and res.props.get("reclaimPolicy") != "Retain":
        out.append(f"reclaimPolicy is {res.props.get('reclaimPolicy')!r}; set reclaimPolicy: Retain so volumes it "
                   "provisions outlive their claims")
    if res.kind == "StorageClass":
        # Deleting a class never deletes volumes, and its parameters are immutable (a change replaces
        # it): protect would only block legitimate changes. Retain is what its volumes inherit.
        return out
    if not res.options.protect:
        out.append("not protected; register it with ResourceOptions(protect=True) so no infrastructure change "
                   "can delete checkpoints")
    if res.options.retain_on_delete is False:
        out.append("retainOnDelete is off; register it with ResourceOptions(retain_on_delete=True) so removing it "
                   "from the program leaves the object in the cluster")
    return out


# --------------------------------------------------------------------------- observability

_TEMP_COMPARISON = re.compile(r"DCGM_FI_DEV_GPU_TEMP\b[^<>\n]*?(?P<op>>=|>)\s*(?P<value>\d+(\.\d+)?)")


def check_thermal_alert(res: Resource, ctx: RuleContext) -> list[str]:
    if res.kind != "PrometheusRule":
        return []
    out = []
    for group in (_map(g) for g in _seq(_map(res.props.get("spec")).get("groups"))):
        for rule in (_map(r) for r in _seq(group.get("rules"))):
            expr = str(rule.get("expr") or "")
            for match in _TEMP_COMPARISON.finditer(expr):
                if float(match["value"]) > ctx.thermal_limit_celsius:
                    out.append(
                        f"rule '{rule.get('alert') or rule.get('record')}' in group '{group.get('name')}' compares "
                        f"GPU temperature {match['op']} {match['value']} °C, above the configured limit of "
                        f"{ctx.thermal_limit_celsius} °C; use observability.thermalThresholdCelsius "
                        "instead of a literal"
                    )
    return out


def dcgm_counters(res: Resource) -> dict[str, set[str]]:
    """Data keys of a ConfigMap that hold DCGM counter CSVs, with the counters they enable."""
    found: dict[str, set[str]] = {}
    if res.kind != "ConfigMap":
        return found
    for key, text in _map(res.props.get("data")).items():
        if not isinstance(text, str):
            continue
        fields = {
            line.split(",", 1)[0].strip()
            for line in text.splitlines()
            if line.strip().startswith("DCGM_") and "," in line
        }
        if fields:
            found[str(key)] = fields
    return found


def check_dcgm_counters(res: Resource, ctx: RuleContext) -> list[str]:
    out = []
    for key, fields in dcgm_counters(res).items():
        missing = [c for c in REQUIRED_DCGM_COUNTERS if c not in fields]
        if missing:
            out.append(f"data.{key}: the DCGM counters CSV lacks {', '.join(missing)}; add a line "
                       f"'{missing[0]}, gauge, …' — temperature drives the thermal guard and tensor activity "
                       "is the utilization that does not lie")
    return out


# --------------------------------------------------------------------------- images and pods

_DIGEST = re.compile(r"@sha256:[0-9a-f]{64}$")


def image_problem(image: str) -> str | None:
    if not image:
        return "has no image"
    if _DIGEST.search(image):
        return None
    last = image.rsplit("/", 1)[-1]
    if ":" not in last:
        return f"image '{image}' has no tag or digest"
    if last.endswith(":latest"):
        return f"image '{image}' uses the 'latest' tag"
    return None


def check_images_pinned(res: Resource, ctx: RuleContext) -> list[str]:
    out = []
    for pod in pod_templates(res):
        for where, container in pod.containers():
            problem = image_problem(str(container.get("image") or ""))
            if problem:
                out.append(f"{where}: {problem}; pin a version tag or digest (components/images.py)")
    if res.type.startswith("kubernetes:helm.sh/") and not res.props.get("version"):
        out.append("Helm chart without a version; pin version= so a chart release cannot change the cluster")
    return out


def _is_workload_pod(pod: PodTemplate, ctx: RuleContext) -> bool:
    return pod.labels.get(ctx.keys.workload) in (TRAINING, INFERENCE)


def _adds_sys_admin(container: Mapping[str, Any]) -> bool:
    caps = _map(_map(container.get("securityContext")).get("capabilities"))
    return "SYS_ADMIN" in _seq(caps.get("add"))


def check_pod_security(res: Resource, ctx: RuleContext) -> list[str]:
    out = []
    for pod in pod_templates(res):
        if _is_workload_pod(pod, ctx) or is_volcano_job(res):
            continue  # users' training/inference images; governed by namespace Pod Security admission
        allowed = pod.app_name in ctx.allow_list
        pod_ctx = _map(pod.spec.get("securityContext"))
        for where, container in pod.containers():
            sc = _map(container.get("securityContext"))
            non_root = sc.get("runAsNonRoot", pod_ctx.get("runAsNonRoot"))
            if non_root is not True and not allowed:
                out.append(f"{where}: runAsNonRoot is not true; use components.security.pod_security_context() "
                           "and container_security_context()")
            if sc.get("readOnlyRootFilesystem") is not True:
                out.append(f"{where}: readOnlyRootFilesystem is not true; set it and mount an emptyDir where the "
                           "process must write")
            if sc.get("allowPrivilegeEscalation") is not False and not (allowed and _adds_sys_admin(container)):
                out.append(f"{where}: allowPrivilegeEscalation is not false; set allowPrivilegeEscalation: false")
    return out


def check_privileges(res: Resource, ctx: RuleContext) -> list[str]:
    out = []
    for pod in pod_templates(res):
        allowed = pod.app_name in ctx.allow_list
        how = (f"add '{pod.app_name or '<app.kubernetes.io/name>'}' to components.security.PRIVILEGE_ALLOW_LIST "
               "with the reason, or drop the privilege")
        for flag in ("hostNetwork", "hostPID", "hostIPC"):
            if pod.spec.get(flag) is True:
                out.append(f"{pod.where}: {flag} is true; no component of this platform needs it — remove it")
        host_paths = {
            str(_map(v).get("name")): str(_map(_map(v).get("hostPath")).get("path"))
            for v in _seq(pod.spec.get("volumes"))
            if _map(v).get("hostPath") is not None
        }
        if host_paths and not allowed:
            out.append(f"{pod.where}: hostPath volumes {sorted(host_paths.values())} in a component that is not "
                       f"allow-listed; {how}")
        for where, container in pod.containers():
            sc = _map(container.get("securityContext"))
            if sc.get("privileged") is True:
                out.append(f"{where}: privileged: true; grant the single capability needed instead "
                           "(e.g. SYS_ADMIN for DCGM profiling) and remove privileged")
            added = [str(c) for c in _seq(_map(sc.get("capabilities")).get("add"))]
            if added and not allowed:
                out.append(f"{where}: adds capabilities {added} in a component that is not allow-listed; {how}")
            for mount in (_map(m) for m in _seq(container.get("volumeMounts"))):
                name = str(mount.get("name"))
                if name in host_paths and mount.get("readOnly") is not True:
                    out.append(f"{where}: hostPath {host_paths[name]} is mounted read-write; set readOnly: true "
                               "on the volumeMount")
    return out


# --------------------------------------------------------------------------- RBAC and credentials


def check_rbac(res: Resource, ctx: RuleContext) -> list[str]:
    out = []
    if res.kind in ("Role", "ClusterRole") and res.group == "rbac.authorization.k8s.io":
        for index, rule in enumerate(_map(r) for r in _seq(res.props.get("rules"))):
            for fld in ("verbs", "resources", "apiGroups", "nonResourceURLs"):
                if "*" in _seq(rule.get(fld)):
                    out.append(f"rules[{index}].{fld} contains '*'; list the exact {fld} the component uses "
                               "(least privilege)")
    if res.kind in ("RoleBinding", "ClusterRoleBinding"):
        ref = _map(res.props.get("roleRef"))
        if ref.get("name") == "cluster-admin":
            out.append("binds cluster-admin; bind a ClusterRole that lists only the verbs and resources needed")
    return out


_CREDENTIAL_ENV = re.compile(r"(^|_)(PASSWORD|PASSWD|TOKEN|API_KEY|APIKEY|SECRET|SECRET_KEY|ACCESS_KEY|CREDENTIALS?)$")
_CREDENTIAL_PROP = {"kubeconfig", "password", "token", "apiKey", "clientSecret", "secretKey", "accessKey"}


def _leaks(value: Any, ctx: RuleContext) -> bool:
    if not isinstance(value, str) or value == "" or value == SECRET_PLACEHOLDER:
        return False
    if ctx.secrets_marked:
        return True
    return value in ctx.plain_config_values


def check_plain_credentials(res: Resource, ctx: RuleContext) -> list[str]:
    out = []
    fix = "read it with components.stack.secret_value() from a key set by `pulumi config set --secret`"
    if res.kind == "Secret" and res.api_version == "v1":
        for fld in ("data", "stringData"):
            for key, value in _map(res.props.get(fld)).items():
                if _leaks(value, ctx):
                    out.append(f"{fld}.{key} is a plain value; {fix}")
    if res.type.startswith("pulumi:providers:"):
        for key, value in res.props.items():
            if key in _CREDENTIAL_PROP and _leaks(value, ctx):
                out.append(f"provider input '{key}' is a plain value; {fix}")
    for pod in pod_templates(res):
        for where, container in pod.containers():
            for env in (_map(e) for e in _seq(container.get("env"))):
                name, value = str(env.get("name", "")), env.get("value")
                if _CREDENTIAL_ENV.search(name) and isinstance(value, str) and value and not value.startswith("/"):
                    out.append(f"{where}.env[{name}] holds a credential literally; use valueFrom.secretKeyRef to a "
                               "Secret whose data comes from secret config")
    return out


# --------------------------------------------------------------------------- advisory


def check_container_resources(res: Resource, ctx: RuleContext) -> list[str]:
    out = []
    for pod in pod_templates(res):
        for where, container in pod.containers():
            requests = _map(_map(container.get("resources")).get("requests"))
            missing = [r for r in ("cpu", "memory") if r not in requests]
            if missing:
                out.append(f"{where}: no resources.requests for {', '.join(missing)}; without requests the "
                           "scheduler packs blindly — use components.security.resources()")
    return out


def check_pdb_sanity(resources: Sequence[Resource], ctx: RuleContext) -> list[tuple[Resource, str]]:
    out: list[tuple[Resource, str]] = []
    min_replicas: dict[tuple[str, str], int] = {}
    for r in resources:
        if r.kind == "HorizontalPodAutoscaler":
            spec = _map(r.props.get("spec"))
            ref = _map(spec.get("scaleTargetRef"))
            min_replicas[(r.namespace, str(ref.get("name")))] = int(_quantity(spec.get("minReplicas")) or 1)
    for pdb in (r for r in resources if r.kind == "PodDisruptionBudget"):
        spec = _map(pdb.props.get("spec"))
        if str(spec.get("maxUnavailable")) in ("0", "0%") or str(spec.get("minAvailable")) == "100%":
            out.append((pdb, "allows no voluntary disruption: node drains and the descheduler's gradual return "
                             "stall; use maxUnavailable: 1"))
    for deployment in inference_deployments(resources, ctx):
        floor = min_replicas.get((deployment.namespace, deployment.object_name))
        for pdb in _pdbs_for(resources, deployment):
            min_available = _map(pdb.props.get("spec")).get("minAvailable")
            if floor is not None and isinstance(min_available, int) and min_available >= floor:
                out.append((pdb, f"minAvailable {min_available} is not below the HPA's minReplicas {floor} for "
                                 f"{deployment.object_name}: at the floor nothing may be evicted; use "
                                 "maxUnavailable: 1"))
    return out


# --------------------------------------------------------------------------- the pack

M, A = EnforcementLevel.MANDATORY, EnforcementLevel.ADVISORY
_BREAKS = "a violation breaks the scheduling design"

RULES: list[Rule] = [
    Rule("gpu-priority-class", "Every pod that requests GPUs names a PriorityClass from the declared tiers.",
         M, f"{_BREAKS}: without a tier, preemption order between training and inference is undefined",
         check=check_gpu_priority_class),
    Rule("gpu-limits-equal-requests", "GPU limits equal GPU requests on every container.",
         M, "extended resources cannot be overcommitted; a mismatch is rejected or miscounted",
         check=check_gpu_limits_equal_requests),
    Rule("gpu-scheduler", "Every GPU pod uses the chosen gang scheduler.",
         M, "two schedulers on the same nodes double-book GPUs, and the gang scheduler cannot preempt pods "
            "it did not place", check=check_gpu_scheduler),
    Rule("training-gang-scheduled", "Training (Volcano Jobs, pods labelled workload=training) is gang-scheduled: "
         "minAvailable equals replicas.", M, "a partial gang holds GPUs and makes no progress",
         check=check_training_gang),
    Rule("training-outranks-inference", "Training pods use a PriorityClass whose value is above inference's.",
         M, f"{_BREAKS}: a gang must be able to take GPUs from inference", check=check_training_outranks_inference),
    Rule("training-onprem-only", "Training pods have a required node affinity that excludes virtual nodes.",
         M, "a gang member on external capacity stalls the whole NCCL ring", check=check_training_onprem),
    Rule("no-noexecute-taints", "No taint on a virtual node, and no burst or thermal taint anywhere, has effect "
         "NoExecute (node patches, provider args, controller config).",
         M, "NoExecute evicts every running inference pod at once; the return must be gradual",
         check=check_no_noexecute),
    Rule("inference-no-fixed-replicas", "Inference Deployments leave spec.replicas unset (a standby pinned to "
         "virtual nodes excepted: the burst controller scales it).",
         M, "a fixed count fights the HPA on every update", check=check_inference_no_replicas),
    Rule("inference-autoscaled", "Every inference Deployment (standbys excepted) has an HPA or KEDA ScaledObject "
         "targeting it.",
         M, "without autoscaling, bursting adds no capacity and production falls over",
         stack_check=check_inference_autoscaled),
    Rule("inference-pdb", "Every inference Deployment has a PodDisruptionBudget selecting its pods.",
         M, "without a PDB, drains and the descheduler can take all replicas at once",
         stack_check=check_inference_pdb),
    Rule("inference-no-burst-toleration", "Inference pods do not tolerate the burst taint (nor every taint); "
         "only a standby required onto virtual nodes may.",
         M, "the burst taint is how the controller closes external capacity",
         check=check_inference_no_burst_toleration),
    Rule("descheduler-bounded", "The descheduler policy has eviction limits within the stack config and a "
         "DefaultEvictor that cannot evict training.",
         M, "unbounded eviction turns the gradual return into an outage; evicting training kills a gang",
         check=check_descheduler_bounded),
    Rule("checkpoint-storage-retained", "Checkpoint claims and volumes are ReadWriteMany, Retain, protected and "
         "retainOnDelete; checkpoint StorageClasses reclaim with Retain (retainOnDelete is judged by `make "
         "policy`; the engine does not report it).",
         M, "checkpoints are the only copy of weeks of training", check=check_checkpoint_storage),
    Rule("thermal-alert-threshold", "GPU temperature alerts fire at or below the configured thermal limit.",
         M, "a GPU above the limit throttles silently and slows the whole gang", check=check_thermal_alert),
    Rule("dcgm-counters", "DCGM counter CSVs include DCGM_FI_DEV_GPU_TEMP and DCGM_FI_PROF_PIPE_TENSOR_ACTIVE.",
         M, "the thermal guard and the utilization that does not lie depend on them", check=check_dcgm_counters),
    Rule("images-pinned", "Every container image is pinned by tag or digest, never 'latest'; charts pin a version.",
         M, "an unpinned image changes the cluster without a diff", check=check_images_pinned),
    Rule("pod-security-restricted", "Our own pods run non-root, with a read-only root filesystem and no "
         "privilege escalation (allow-listed components keep only their named exception).",
         M, "platform agents run on every GPU node; a compromise there reaches every job", check=check_pod_security),
    Rule("privileges-allow-listed", "Capabilities and hostPath only for components on "
         "components.security.PRIVILEGE_ALLOW_LIST (by app.kubernetes.io/name); hostPath read-only; never "
         "privileged or host namespaces.", M, "privileges are exceptions, named and reviewed",
         check=check_privileges),
    Rule("rbac-least-privilege", "RBAC rules list no wildcard verbs, resources or apiGroups; nothing binds "
         "cluster-admin.", M, "a wildcard grants tomorrow's resources too", check=check_rbac),
    Rule("no-plain-credentials", "Credentials come from Pulumi secrets: Secret data and provider credentials are "
         "secret values, and env credentials use secretKeyRef.",
         M, "plain credentials land in state files and PR diffs", check=check_plain_credentials),
    Rule("container-resources", "Every container requests cpu and memory.",
         A, "advisory: right-sizing depends on the workload; it is a recommendation, not an invariant",
         check=check_container_resources),
    Rule("pdb-sanity", "PodDisruptionBudgets allow at least one voluntary disruption, also at the HPA floor.",
         A, "advisory: a strict PDB is sometimes deliberate; it only stalls drains and the gradual return",
         stack_check=check_pdb_sanity),
]


# --------------------------------------------------------------------------- evaluation


def evaluate(resources: Sequence[Resource], ctx: RuleContext, rules: Sequence[Rule] = RULES) -> list[Violation]:
    """Every rule over every resource (and the stack), in rule order."""
    found: list[Violation] = []
    for rule in rules:
        if rule.check is not None:
            for res in resources:
                found += [Violation(rule.name, rule.level, res.urn, res.label, m) for m in rule.check(res, ctx)]
        if rule.stack_check is not None:
            found += [
                Violation(rule.name, rule.level, res.urn, res.label, m) for res, m in rule.stack_check(resources, ctx)
            ]
    return found


def resource_from_args(args: ResourceValidationArgs | PolicyResource) -> Resource:
    """The engine's view of a resource as a :class:`Resource` (retainOnDelete unknown there)."""
    return Resource(
        type=args.resource_type,
        props=plain(args.props),
        urn=args.urn,
        name=args.name,
        options=Options(
            protect=bool(args.opts.protect), retain_on_delete=getattr(args.opts, "retain_on_delete", None)
        ),
    )


def _resource_validate(rule: Rule, context: Callable[[], RuleContext]) -> Callable[..., None]:
    check = rule.check
    assert check is not None

    def validate(args: ResourceValidationArgs, report: ReportViolation) -> None:
        for message in check(resource_from_args(args), context()):
            report(message, None)

    return validate


def _stack_validate(rule: Rule, context: Callable[[], RuleContext]) -> Callable[..., None]:
    check = rule.stack_check
    assert check is not None

    def validate(args: StackValidationArgs, report: ReportViolation) -> None:
        resources = [resource_from_args(r) for r in args.resources]
        for res, message in check(resources, context()):
            report(message, res.urn or None)

    return validate


def build_policies(context: Callable[[], RuleContext], rules: Sequence[Rule] = RULES) -> list[Policy]:
    """The rules as CrossGuard policies; ``context`` is called per validation (cached by the caller)."""
    policies: list[Policy] = []
    for rule in rules:
        description = f"{rule.description} ({rule.level.value}: {rule.why_level})"
        if rule.check is not None:
            policies.append(ResourceValidationPolicy(
                name=rule.name, description=description, enforcement_level=rule.level,
                validate=_resource_validate(rule, context),
            ))
        else:
            policies.append(StackValidationPolicy(
                name=rule.name, description=description, enforcement_level=rule.level,
                validate=_stack_validate(rule, context),
            ))
    return policies


def _parsed(value: Any) -> Any:
    """A config value as the engine passes it (JSON/YAML text for structures), parsed where possible."""
    if not isinstance(value, str):
        return value
    try:
        return yaml.safe_load(value)
    except yaml.YAMLError:
        return value


def engine_context() -> RuleContext:
    """The context inside the real engine: stack config from ``PULUMI_CONFIG``, plain keys from the stack file.

    The engine hands the pack every config value (secrets decrypted) but not which keys are secret;
    the stack file ``Pulumi.<stack>.yaml`` (``secure:`` entries) says which are.
    """
    import os
    from pathlib import Path

    import pulumi

    from components.config import PROJECT, ConfigError, parse_config, raw_from_pulumi_config

    values = dict(pulumi.runtime.get_config_env() or {})
    stack = os.environ.get("PULUMI_STACK", "")
    stack_file = Path(__file__).resolve().parent.parent / f"Pulumi.{stack}.yaml"
    plain_keys: set[str] = set(values)
    if stack_file.exists():
        data = yaml.safe_load(stack_file.read_text()) or {}
        config = _map(data.get("config"))
        plain_keys = {k if ":" in k else f"{PROJECT}:{k}" for k, v in config.items()
                      if not (isinstance(v, Mapping) and "secure" in v)}
    plain_values = {v for k, v in values.items() if k in plain_keys}
    plain_text = {s for _, s in _strings([_parsed(v) for v in plain_values])}
    raw = raw_from_pulumi_config({k: v for k, v in values.items() if k in plain_keys}, PROJECT)
    try:
        cfg = parse_config(raw, stack_file.name)
    except ConfigError:
        return RuleContext.defaults()
    return RuleContext.from_config(cfg, secrets_marked=False, plain_config_values=plain_text)
