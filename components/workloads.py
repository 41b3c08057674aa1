"""Pod-spec building blocks shared by GPU workloads as Pulumi input types; the manifest-form ones live in
``components.pod_spec`` (no Pulumi) and are re-exported here."""

from __future__ import annotations

from collections.abc import Mapping

import pulumi_kubernetes as k8s

from components.naming import EXTERNAL, ONPREM, Keys
from components.pod_spec import (
    gpu_resources_manifest,
    onprem_required_affinity,
    onprem_required_expressions,
    pool_tolerations_manifest,
)

__all__ = [
    "UNHEALTHY_POD_EVICTION",
    "gpu_resources",
    "metrics_liveness_probe",
    "metrics_readiness_probe",
    "onprem_required_affinity",
    "onprem_required_expressions",
    "pool_tolerations",
    "prefer_onprem_affinity",
    "provider_preferences",
    "spread_across_nodes",
]


def provider_preferences(keys: Keys, weights: Mapping[str, int]) -> list[k8s.core.v1.PreferredSchedulingTermArgs]:
    """One preferred term per ranked provider (`provider_rank`): the cheaper, the heavier."""
    term = k8s.core.v1.NodeSelectorTermArgs
    match = k8s.core.v1.NodeSelectorRequirementArgs
    return [
        k8s.core.v1.PreferredSchedulingTermArgs(
            weight=w, preference=term(match_expressions=[match(key=keys.provider, operator="In", values=[name])]))
        for name, w in weights.items()
    ]


def prefer_onprem_affinity(keys: Keys, pool: str | None,
                           provider_weights: Mapping[str, int] | None = None) -> k8s.core.v1.AffinityArgs:
    """Required: a GPU node of ours (on-prem or external); preferred: on-prem, then the cheaper providers.

    With provider terms, a second on-prem term as heavy as the best one keeps on-prem's lead at 100.
    """
    required = [k8s.core.v1.NodeSelectorRequirementArgs(key=keys.location, operator="In", values=[ONPREM, EXTERNAL])]
    preferred = [k8s.core.v1.NodeSelectorRequirementArgs(key=keys.location, operator="In", values=[ONPREM])]
    if pool is not None:
        preferred.append(k8s.core.v1.NodeSelectorRequirementArgs(key=keys.pool, operator="In", values=[pool]))
    terms = [k8s.core.v1.PreferredSchedulingTermArgs(
        weight=100, preference=k8s.core.v1.NodeSelectorTermArgs(match_expressions=preferred))]
    if provider_weights:
        terms.append(k8s.core.v1.PreferredSchedulingTermArgs(
            weight=max(provider_weights.values()), preference=k8s.core.v1.NodeSelectorTermArgs(match_expressions=[
                k8s.core.v1.NodeSelectorRequirementArgs(key=keys.location, operator="In", values=[ONPREM])])))
        terms += provider_preferences(keys, provider_weights)
    return k8s.core.v1.AffinityArgs(
        node_affinity=k8s.core.v1.NodeAffinityArgs(
            required_during_scheduling_ignored_during_execution=k8s.core.v1.NodeSelectorArgs(
                node_selector_terms=[k8s.core.v1.NodeSelectorTermArgs(match_expressions=required)]
            ),
            preferred_during_scheduling_ignored_during_execution=terms,
        )
    )


def pool_tolerations(keys: Keys, pools: list[str]) -> list[k8s.core.v1.TolerationArgs]:
    return [k8s.core.v1.TolerationArgs(key=t["key"], operator=t["operator"], value=t["value"], effect=t["effect"])
            for t in pool_tolerations_manifest(keys, pools)]


def gpu_resources(gpu_resource: str, gpus: int, cpu: str, memory: str) -> k8s.core.v1.ResourceRequirementsArgs:
    """GPU limits equal requests (extended resources cannot overcommit); memory too."""
    manifest = gpu_resources_manifest(gpu_resource, gpus, cpu, memory)
    return k8s.core.v1.ResourceRequirementsArgs(requests=manifest["requests"], limits=manifest["limits"])


_METRICS_GET = k8s.core.v1.HTTPGetActionArgs(path="/metrics", port="metrics")


def metrics_readiness_probe() -> k8s.core.v1.ProbeArgs:
    """Readiness on an agent's metrics port (named ``metrics``): it answers once the process serves."""
    return k8s.core.v1.ProbeArgs(http_get=_METRICS_GET, period_seconds=10)


def metrics_liveness_probe() -> k8s.core.v1.ProbeArgs:
    """Liveness on the agent's ``/livez`` (agents/liveness.py): it fails once the agent's own loop stopped
    turning, which a metrics port that still answers would hide. The endpoint holds the staleness window;
    three failed checks restart the container."""
    return k8s.core.v1.ProbeArgs(http_get=k8s.core.v1.HTTPGetActionArgs(path="/livez", port="metrics"),
                                 period_seconds=20, failure_threshold=3)


#: Every PodDisruptionBudget of ours: a replica that is not ready protects nothing, so a drain (or the
#: descheduler) may evict it even while the budget is short; the default (IfHealthyBudget) blocks the drain on it.
UNHEALTHY_POD_EVICTION = "AlwaysAllow"


def spread_across_nodes(selector: dict[str, str]) -> k8s.core.v1.AffinityArgs:
    """Preferred anti-affinity by hostname: replicas on different nodes, so one node down leaves a replica.

    Preferred, not required: with fewer nodes than replicas the extra replica still schedules.
    """
    return k8s.core.v1.AffinityArgs(
        pod_anti_affinity=k8s.core.v1.PodAntiAffinityArgs(
            preferred_during_scheduling_ignored_during_execution=[
                k8s.core.v1.WeightedPodAffinityTermArgs(
                    weight=100,
                    pod_affinity_term=k8s.core.v1.PodAffinityTermArgs(
                        topology_key="kubernetes.io/hostname",
                        label_selector=k8s.meta.v1.LabelSelectorArgs(match_labels=selector),
                    ),
                )
            ]
        )
    )
