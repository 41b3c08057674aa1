"""Builders for API-shaped node and pod objects (the JSON the API serves).

The tests, the benchmark and the simulator describe clusters with these, so they all feed the view
exactly what a list or watch would (``fakes.kube_api.MemoryApi`` stores them behind the kit's port).
"""

from __future__ import annotations

from typing import Any

from agents.burst_controller.contract import RETURN_ROLE, WARM_ROLE, BurstSettings

_DEFAULT = BurstSettings()


def onprem_node(
    name: str,
    gpus: int = 8,
    *,
    pool: str = "gpu",
    thermal: bool = False,
    health: str | None = None,
    unschedulable: bool = False,
    ready: bool = True,
    settings: BurstSettings = _DEFAULT,
    resource_version: str = "1",
) -> dict[str, Any]:
    taints: list[dict[str, Any]] = []
    if thermal:
        taints.append({"key": settings.thermal_taint_key, "value": "hot", "effect": "NoSchedule"})
    if health is not None:  # the health guard's quarantine: "fatal" or "degraded"
        taints.append({"key": settings.health_taint_key, "value": health, "effect": "NoSchedule"})
    return {
        "metadata": {
            "name": name,
            "resourceVersion": resource_version,
            "labels": {
                settings.pool_label: pool,
                settings.location_label: "onprem",
                settings.label_prefix + "/gpu-model": "h100",
            },
        },
        "spec": {"taints": taints, "unschedulable": unschedulable},
        "status": {
            "allocatable": {settings.gpu_resource: str(gpus), "cpu": "96"},
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }


def virtual_node(
    name: str,
    provider: str = "gpucloud",
    *,
    gpus: int = 64,
    burst_effect: str | None = "NoSchedule",
    changed_at: str | None = None,
    settings: BurstSettings = _DEFAULT,
    resource_version: str = "1",
) -> dict[str, Any]:
    """A virtual-kubelet node; `burst_effect=None` means our taint is absent (open)."""
    taints: list[dict[str, Any]] = [
        {"key": "virtual-kubelet.io/provider", "value": provider, "effect": "NoSchedule"}
    ]
    if burst_effect is not None:
        taints.append({"key": settings.taint_key, "value": settings.taint_value, "effect": burst_effect})
    annotations = {settings.changed_at_annotation: changed_at} if changed_at else {}
    return {
        "metadata": {
            "name": name,
            "resourceVersion": resource_version,
            "labels": {
                settings.location_label: "external",
                settings.provider_label: provider,
                settings.pool_label: "external",
                "type": "virtual-kubelet",
            },
            "annotations": annotations,
        },
        "spec": {"taints": taints},
        "status": {
            "allocatable": {settings.gpu_resource: str(gpus)},
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


def gpu_pod(
    name: str,
    gpus: int = 1,
    *,
    node: str | None = None,
    workload: str = "inference",
    namespace: str = "inference",
    phase: str | None = None,
    unschedulable: bool = False,
    deletion_cost: int | None = None,
    pool: str | None = None,
    service: str | None = None,
    standby: bool = False,
    warm: bool = False,
    home: bool = False,
    ready: bool | None = None,
    gated: bool = False,
    deleting: bool = False,
    settings: BurstSettings = _DEFAULT,
) -> dict[str, Any]:
    """A pod bound to `node` (Running) or pending; `unschedulable` adds the scheduler's verdict.

    `pool` confines the pod to one on-prem pool with required node affinity, as the training template does.
    `service`/`standby` label an inference replica (`warm`: a warm-pool placeholder, `home`: a pod of the
    make-before-break return's on-prem bridge); `ready` (default:
    running) sets its Ready condition;
    `gated` holds a pending pod at the handover scheduling gate.
    """
    conditions: list[dict[str, Any]] = []
    if node is None and unschedulable:
        conditions.append({"type": "PodScheduled", "status": "False", "reason": "Unschedulable"})
    running = (phase or ("Running" if node else "Pending")) == "Running"
    if ready if ready is not None else running:
        conditions.append({"type": "Ready", "status": "True"})
    annotations = {}
    if deletion_cost is not None:
        annotations["controller.kubernetes.io/pod-deletion-cost"] = str(deletion_cost)
    spec: dict[str, Any] = {
        "containers": [{"name": "main", "resources": {"limits": {settings.gpu_resource: str(gpus)}}}]
    }
    if node is not None:
        spec["nodeName"] = node
    if gated:
        spec["schedulingGates"] = [{"name": settings.handover_gate}]
    if pool is not None:
        spec["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [
                {"key": settings.location_label, "operator": "In", "values": ["onprem"]},
                {"key": settings.pool_label, "operator": "In", "values": [pool]},
            ]}]
        }}}
    labels = {settings.workload_label: workload}
    if service is not None:
        labels[settings.service_label] = service
    if standby:
        labels[settings.role_label] = "standby"
    if warm:
        labels[settings.role_label] = WARM_ROLE
    if home:
        labels[settings.role_label] = RETURN_ROLE
    meta: dict[str, Any] = {"name": name, "namespace": namespace, "labels": labels, "annotations": annotations}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return {
        "metadata": meta,
        "spec": spec,
        "status": {"phase": phase or ("Running" if node else "Pending"), "conditions": conditions},
    }
