"""Burst and gradual return: no NoExecute taint, inference autoscaled with a PDB and kept off the burst taint,
and a descheduler bounded enough to bring inference home a few pods at a time."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import yaml

from components.guardrail_rules import guardrail
from components.naming import INFERENCE, TRAINING, VK_PROVIDER_TAINT
from policies.rules.core import (
    ADVISORY,
    MANDATORY,
    Resource,
    RuleContext,
    as_map,
    as_seq,
    quantity,
    rule,
    stack_rule,
    strings,
)
from policies.rules.pods import (
    PodTemplate,
    inference_deployments,
    is_inference,
    is_standby,
    is_standby_deployment,
    pod_templates,
    selector_matches,
)

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


@rule(
    "no-noexecute-taints",
    "No taint on a virtual node, and no burst, thermal or health-guard taint anywhere, has effect "
         "NoExecute (node patches, provider args, controller config).",
    MANDATORY,
    "NoExecute evicts every running inference pod at once; the return must be gradual",
)
def check_no_noexecute(res: Resource, ctx: RuleContext) -> list[str]:
    out = []
    # The health guard's quarantine evicts through the Eviction API (PDBs honoured), never by NoExecute.
    guarded = (ctx.keys.burst_taint, ctx.keys.thermal_taint, ctx.keys.health_taint)
    fix = (f"{guardrail('no-noexecute-burst-taint').fix_text(ctx.guardrail_names)} (running pods stay; the "
           "descheduler moves them back gradually)")
    if res.kind == "Node":
        virtual = _is_virtual_node(res, ctx)
        for taint in (as_map(t) for t in as_seq(as_map(res.props.get("spec")).get("taints"))):
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
            for path, text in strings({k: container.get(k) for k in ("args", "command", "env")}):
                for match in _TAINT_STRING.finditer(text):
                    if vk or match["key"] in guarded or match["key"] == VK_PROVIDER_TAINT:
                        out.append(f"{where}.{path}: '{match.group(0)}' sets a NoExecute taint; {fix}")
                if vk and "NoExecute" in text and not _TAINT_STRING.search(text):
                    out.append(f"{where}.{path}: virtual-kubelet provider configured with NoExecute; {fix}")
    if res.kind == "ConfigMap":
        for path, text in strings(res.props.get("data")):
            for match in _TAINT_STRING.finditer(text):
                if match["key"] in guarded or match["key"] == VK_PROVIDER_TAINT:
                    out.append(f"data.{path}: '{match.group(0)}' configures a NoExecute taint; {fix}")
    return out


@rule(
    "inference-no-fixed-replicas",
    "Inference Deployments leave spec.replicas unset (a standby pinned to "
         "virtual nodes excepted: the burst controller scales it).",
    MANDATORY,
    "a fixed count fights the HPA on every update",
)
def check_inference_no_replicas(res: Resource, ctx: RuleContext) -> list[str]:
    if res.kind != "Deployment" or not any(is_inference(p, ctx) for p in pod_templates(res)):
        return []
    if is_standby_deployment(res, ctx):  # the burst controller owns a standby's count, not an HPA
        return []
    if as_map(res.props.get("spec")).get("replicas") is not None:
        return ["inference Deployment sets spec.replicas; every `pulumi up` would reset what the HPA chose. "
                "Remove spec.replicas and let the HorizontalPodAutoscaler own the count"]
    return []


def _targets(resources: Sequence[Resource], kind: str) -> set[tuple[str, str]]:
    found = set()
    for r in resources:
        if r.kind == "HorizontalPodAutoscaler" or (r.kind == "ScaledObject" and r.group == "keda.sh"):
            ref = as_map(as_map(r.props.get("spec")).get("scaleTargetRef"))
            if str(ref.get("kind") or "Deployment") == kind:
                found.add((r.namespace, str(ref.get("name"))))
    return found


@stack_rule(
    "inference-autoscaled",
    "Every inference Deployment (standbys excepted) has an HPA or KEDA ScaledObject "
         "targeting it.",
    MANDATORY,
    "without autoscaling, bursting adds no capacity and production falls over",
)
def check_inference_autoscaled(resources: Sequence[Resource], ctx: RuleContext) -> list[tuple[Resource, str]]:
    scaled = _targets(resources, "Deployment")
    return [
        (d, f"inference Deployment {d.object_name} has no HorizontalPodAutoscaler (or KEDA ScaledObject) in "
            f"namespace '{d.namespace}' targeting it; add one with scaleTargetRef kind Deployment, "
            f"name {d.object_name}")
        for d in inference_deployments(resources, ctx)
        if (d.namespace, d.object_name) not in scaled and not is_standby_deployment(d, ctx)
    ]


def _pdbs_for(resources: Sequence[Resource], deployment: Resource) -> list[Resource]:
    labels = {k: v for p in pod_templates(deployment) for k, v in p.labels.items()}
    return [
        r for r in resources
        if r.kind == "PodDisruptionBudget" and r.namespace == deployment.namespace
        and selector_matches(as_map(as_map(r.props.get("spec")).get("selector")), labels)
    ]


@stack_rule(
    "inference-pdb",
    "Every inference Deployment has a PodDisruptionBudget selecting its pods.",
    MANDATORY,
    "without a PDB, drains and the descheduler can take all replicas at once",
)
def check_inference_pdb(resources: Sequence[Resource], ctx: RuleContext) -> list[tuple[Resource, str]]:
    return [
        (d, f"inference Deployment {d.object_name} has no PodDisruptionBudget selecting its pods; add a "
            "policy/v1 PodDisruptionBudget (maxUnavailable: 1) so drains and the descheduler move it gradually")
        for d in inference_deployments(resources, ctx)
        if not _pdbs_for(resources, d)
    ]


@rule(
    "inference-no-burst-toleration",
    "Inference pods do not tolerate the burst taint (nor every taint); "
         "only a standby required onto virtual nodes may.",
    MANDATORY,
    "the burst taint is how the controller closes external capacity",
)
def check_inference_no_burst_toleration(res: Resource, ctx: RuleContext) -> list[str]:
    out = []
    for pod in pod_templates(res):
        if not is_inference(pod, ctx):
            continue
        for tol in (as_map(t) for t in as_seq(pod.spec.get("tolerations"))):
            if tol.get("key") == ctx.keys.burst_taint and is_standby(pod, ctx):
                continue  # it can only ever land on virtual nodes: the taint closes nothing for it
            if tol.get("key") == ctx.keys.burst_taint and pod.labels.get(ctx.keys.role) == "standby":
                out.append(f"{pod.where}: a standby tolerates the burst taint but may land on-prem; require "
                           f"'{ctx.keys.location} In [external]' in every required node affinity term")
            elif tol.get("key") == ctx.keys.burst_taint:
                out.append(f"{pod.where}: inference that is no standby tolerates the burst taint "
                           f"{ctx.keys.burst_taint}, so closing burst capacity would not keep new pods on-prem; "
                           f"{guardrail('standby-only-burst-toleration').fix_text(ctx.guardrail_names)} "
                           "(tolerate only the provider's taint)")
            elif not tol.get("key") and tol.get("operator") == "Exists":
                out.append(f"{pod.where}: a toleration with operator Exists and no key tolerates every taint, "
                           f"including {ctx.keys.burst_taint}; list the taints inference may tolerate instead")
    return out


def descheduler_policy(res: Resource) -> tuple[str, Mapping[str, Any]] | None:
    if res.kind != "ConfigMap":
        return None
    for key, text in as_map(res.props.get("data")).items():
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
    threshold = as_map(args.get("priorityThreshold"))
    value = threshold.get("value")
    if value is None and threshold.get("name") is not None:
        value = ctx.tiers.get(str(threshold.get("name")))
    training_value = ctx.tiers.get(ctx.training_class)
    # Only pods with priority below the threshold are evictable.
    if value is not None and training_value is not None and training_value >= int(value):
        return True
    selector = as_map(args.get("labelSelector"))
    workload = ctx.keys.workload
    return bool(selector) and not selector_matches(selector, {workload: TRAINING}) and (
        as_map(selector.get("matchLabels")).get(workload) is not None
        or any(as_map(e).get("key") == workload for e in as_seq(selector.get("matchExpressions")))
    )


@rule(
    "descheduler-bounded",
    "The descheduler policy has eviction limits within the stack config and a "
         "DefaultEvictor that cannot evict training.",
    MANDATORY,
    "unbounded eviction turns the gradual return into an outage; evicting training kills a gang",
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
        number = quantity(value) if value is not None else None
        if number is None or not 0 < number <= limit:
            out.append(f"data.{key}: {name} is {value}; set it between 1 and {limit} (descheduler.* in the stack "
                       "config) so inference returns on-prem a few pods per cycle, not all at once")
    profiles = [as_map(p) for p in as_seq(policy.get("profiles"))]
    if not profiles:
        out.append(f"data.{key}: the policy has no profiles; declare a profile whose DefaultEvictor protects training")
    for profile in profiles:
        plugins = (as_map(c) for c in as_seq(profile.get("pluginConfig")))
        evictor = next((c.get("args") for c in plugins if c.get("name") == "DefaultEvictor"), None)
        if not _evictor_protects_training(as_map(evictor), ctx):
            out.append(
                f"data.{key}: profile '{profile.get('name')}' can evict training; give its DefaultEvictor a "
                f"priorityThreshold at or below '{ctx.training_class}' ({ctx.tiers.get(ctx.training_class)}) or a "
                f"labelSelector '{ctx.keys.workload} In [{INFERENCE}]'"
            )
    return out


TAINTS_PLUGIN = "RemovePodsViolatingNodeTaints"
AFFINITY_PLUGIN = "RemovePodsViolatingNodeAffinity"
EVICTOR = "DefaultEvictor"
_DURATION = re.compile(r"(?P<value>\d+(\.\d+)?)(?P<unit>ms|us|ns|h|m|s)")
_SECONDS = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}


def duration_seconds(value: Any) -> float | None:
    """A Go duration (``600s``, ``10m``, ``1h30m``) in seconds; None when it is not one."""
    text = str(value).strip() if value is not None else ""
    if not text or _DURATION.sub("", text) != "":
        return None
    return sum(float(m["value"]) * _SECONDS[m["unit"]] for m in _DURATION.finditer(text))


def _enabled(plugins: Mapping[str, Any]) -> dict[str, list[str]]:
    return {str(point): [str(p) for p in as_seq(as_map(cfg).get("enabled"))] for point, cfg in plugins.items()}


def return_plugin_problems(policy: Mapping[str, Any], ctx: RuleContext) -> list[str]:
    """How a DeschedulerPolicy differs from the gradual return: one profile, the burst taint, minPodAge, nodeFit."""
    profiles = [as_map(p) for p in as_seq(policy.get("profiles"))]
    if len(profiles) != 1:
        return [f"has {len(profiles)} profiles; the descheduler does one thing here, the gradual return: one profile "
                f"with {TAINTS_PLUGIN} for {ctx.keys.burst_taint}"]
    profile = profiles[0]
    name = profile.get("name")
    out = []
    deschedule = [TAINTS_PLUGIN, *([AFFINITY_PLUGIN] if ctx.prefer_onprem_affinity else [])]
    wanted = {"deschedule": deschedule, "filter": [EVICTOR], "preEvictionFilter": [EVICTOR]}
    enabled = _enabled(as_map(profile.get("plugins")))
    for point, plugins in sorted(enabled.items()):
        extra = [p for p in plugins if p not in wanted.get(point, [])]
        if extra:
            out.append(f"profile '{name}' enables {', '.join(extra)} at {point}; only {TAINTS_PLUGIN} (deschedule"
                       f"{', with ' + AFFINITY_PLUGIN if ctx.prefer_onprem_affinity else ''}) and {EVICTOR} may run")
    if TAINTS_PLUGIN not in enabled.get("deschedule", []):
        out.append(f"profile '{name}' does not enable {TAINTS_PLUGIN} at deschedule; nothing would return inference "
                   "on-prem")
    configs = {str(as_map(c).get("name")): as_map(as_map(c).get("args")) for c in as_seq(profile.get("pluginConfig"))}
    extra_configs = sorted(set(configs) - {EVICTOR, *deschedule})
    if extra_configs:
        out.append(f"profile '{name}' configures {', '.join(extra_configs)}; only {EVICTOR} and {TAINTS_PLUGIN} belong "
                   "to the return")
    taints = configs.get(TAINTS_PLUGIN, {})
    if as_seq(taints.get("includedTaints")) != [ctx.keys.burst_taint] or set(taints) - {"includedTaints",
                                                                                        "namespaces"}:
        out.append(f"profile '{name}': {TAINTS_PLUGIN} args are {dict(taints)}; set exactly includedTaints: "
                   f"[{ctx.keys.burst_taint}] (and namespaces) so only pods on closed virtual nodes are moved")
    only = {"include": [ctx.inference_namespace]}
    for plugin in deschedule:
        namespaces = configs.get(plugin, {}).get("namespaces")
        if as_map(namespaces) != only:
            out.append(f"profile '{name}': {plugin} namespaces are {namespaces!r}; set namespaces: {only} so the "
                       "return evicts inference only, where the descheduler's eviction Role is")
    if ctx.prefer_onprem_affinity and AFFINITY_PLUGIN in configs:
        types = as_seq(configs[AFFINITY_PLUGIN].get("nodeAffinityType"))
        if types != ["preferredDuringSchedulingIgnoredDuringExecution"]:
            out.append(f"profile '{name}': {AFFINITY_PLUGIN} nodeAffinityType is {types}; only "
                       "[preferredDuringSchedulingIgnoredDuringExecution] moves pods home")
    evictor = configs.get(EVICTOR, {})
    age = duration_seconds(evictor.get("minPodAge"))
    floor = max(ctx.min_pod_age_seconds, 1)
    if age is None or age < floor:
        out.append(f"profile '{name}': {EVICTOR} minPodAge is {evictor.get('minPodAge')!r}; set at least '{floor}s' "
                   "(descheduler.minPodAgeSeconds) so a pod that just started on external capacity is not moved again")
    if evictor.get("nodeFit") is not True:
        out.append(f"profile '{name}': {EVICTOR} nodeFit is {evictor.get('nodeFit')!r}; set nodeFit: true so a pod is "
                   "evicted only when an on-prem node can take it")
    return out


@rule(
    "descheduler-return-only",
    "The descheduler policy is exactly the gradual return: one profile whose only deschedule plugin is "
         "RemovePodsViolatingNodeTaints with includedTaints [the burst taint] in the inference namespace only "
         "(namespaces.include), and a DefaultEvictor with "
         "minPodAge (at least descheduler.minPodAgeSeconds) and nodeFit.",
    MANDATORY,
    "any other plugin or taint evicts production inference for reasons the burst design never accounted for",
)
def check_descheduler_return_only(res: Resource, ctx: RuleContext) -> list[str]:
    found = descheduler_policy(res)
    if found is None:
        return []
    key, policy = found
    return [f"data.{key}: {problem}" for problem in return_plugin_problems(policy, ctx)]


@stack_rule(
    "pdb-sanity",
    "PodDisruptionBudgets allow at least one voluntary disruption, also at the HPA floor.",
    ADVISORY,
    "advisory: a strict PDB is sometimes deliberate; it only stalls drains and the gradual return",
)
def check_pdb_sanity(resources: Sequence[Resource], ctx: RuleContext) -> list[tuple[Resource, str]]:
    out: list[tuple[Resource, str]] = []
    min_replicas: dict[tuple[str, str], int] = {}
    for r in resources:
        if r.kind == "HorizontalPodAutoscaler":
            spec = as_map(r.props.get("spec"))
            ref = as_map(spec.get("scaleTargetRef"))
            min_replicas[(r.namespace, str(ref.get("name")))] = int(quantity(spec.get("minReplicas")) or 1)
    for pdb in (r for r in resources if r.kind == "PodDisruptionBudget"):
        spec = as_map(pdb.props.get("spec"))
        if str(spec.get("maxUnavailable")) in ("0", "0%") or str(spec.get("minAvailable")) == "100%":
            out.append((pdb, "allows no voluntary disruption: node drains and the descheduler's gradual return "
                             "stall; use maxUnavailable: 1"))
    for deployment in inference_deployments(resources, ctx):
        floor = min_replicas.get((deployment.namespace, deployment.object_name))
        for pdb in _pdbs_for(resources, deployment):
            min_available = as_map(pdb.props.get("spec")).get("minAvailable")
            if floor is not None and isinstance(min_available, int) and min_available >= floor:
                out.append((pdb, f"minAvailable {min_available} is not below the HPA's minReplicas {floor} for "
                                 f"{deployment.object_name}: at the floor nothing may be evicted; use "
                                 "maxUnavailable: 1"))
    return out
