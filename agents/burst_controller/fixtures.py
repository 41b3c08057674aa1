"""Builders for API-shaped node and pod objects (the JSON the API serves).

The tests, the benchmark and the simulator describe clusters with these, so they all feed the view
exactly what a list or watch would; `MemoryApi` answers the shell's API calls the same way, in memory.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from typing import Any

from kubernetes.client.exceptions import ApiException

from agents.burst_controller.contract import BurstSettings

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
    ready: bool | None = None,
    gated: bool = False,
    deleting: bool = False,
    settings: BurstSettings = _DEFAULT,
) -> dict[str, Any]:
    """A pod bound to `node` (Running) or pending; `unschedulable` adds the scheduler's verdict.

    `pool` confines the pod to one on-prem pool with required node affinity, as the training template does.
    `service`/`standby` label an inference replica; `ready` (default: running) sets its Ready condition;
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
    meta: dict[str, Any] = {"name": name, "namespace": namespace, "labels": labels, "annotations": annotations}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return {
        "metadata": meta,
        "spec": spec,
        "status": {"phase": phase or ("Running" if node else "Pending"), "conditions": conditions},
    }


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


class MemoryApi:
    """An in-memory `shell.ClusterApi` for tests and the benchmark: no HTTP, the API's answers and errors.

    Objects keep resourceVersions; node patches honour optimistic concurrency (409 on a stale one); `fail`
    queues errors per call name (consumed in order) and `fail_always` makes a call fail for good. Every call is
    logged in `calls` as (name, target, time of `clock()`), so tests can say when each write started.
    """

    def __init__(self, clock: Callable[[], float] = lambda: 0.0) -> None:
        self.clock = clock
        self.rv = 100
        self.objects: dict[str, dict[str, dict[str, Any]]] = {"nodes": {}, "pods": {}, "leases": {}, "scales": {}}
        self.events: list[dict[str, Any]] = []
        self.calls: list[tuple[str, str, float]] = []
        self.watch_answers: dict[str, list[list[dict[str, Any]] | BaseException]] = {"nodes": [], "pods": []}
        self._queued: dict[str, list[BaseException]] = {}
        self._always: dict[str, BaseException] = {}

    # -- setup -----------------------------------------------------------------------------------

    def put(self, kind: str, obj: dict[str, Any]) -> dict[str, Any]:
        self.rv += 1
        obj = copy.deepcopy(obj)
        obj["metadata"]["resourceVersion"] = str(self.rv)
        meta = obj["metadata"]
        key = meta["name"] if kind == "nodes" else f"{meta.get('namespace', '')}/{meta['name']}"
        self.objects[kind][key] = obj
        return obj

    def fail(self, call: str, *errors: BaseException) -> None:
        self._queued.setdefault(call, []).extend(errors)

    def fail_always(self, call: str, error: BaseException | None) -> None:
        if error is None:
            self._always.pop(call, None)
        else:
            self._always[call] = error

    def count(self, call: str) -> int:
        return sum(1 for name, _, _ in self.calls if name == call)

    def _enter(self, call: str, target: str) -> None:
        self.calls.append((call, target, self.clock()))
        queued = self._queued.get(call)
        if queued:
            raise queued.pop(0)
        if call in self._always:
            raise self._always[call]

    # -- ClusterApi ------------------------------------------------------------------------------

    def list(self, kind: str, limit: int, token: str | None) -> dict[str, Any]:
        self._enter("list", kind)
        items = list(self.objects[kind].values())
        start = int(token or 0)
        page = items[start : start + limit]
        meta: dict[str, Any] = {"resourceVersion": str(self.rv)}
        if start + limit < len(items):
            meta["continue"] = str(start + limit)
        return {"metadata": meta, "items": copy.deepcopy(page)}

    def watch(self, kind: str, resource_version: str) -> Iterator[dict[str, Any]]:
        self._enter("watch", kind)
        answer = self.watch_answers[kind].pop(0) if self.watch_answers[kind] else []
        if isinstance(answer, BaseException):
            raise answer
        yield from answer

    def read_node(self, name: str) -> dict[str, Any]:
        self._enter("read_node", name)
        return copy.deepcopy(self._get("nodes", name))

    def patch_node(self, name: str, body: dict[str, Any]) -> dict[str, Any]:
        self._enter("patch_node", name)
        current = self._get("nodes", name)
        want = (body.get("metadata") or {}).get("resourceVersion")
        if want is not None and want != current["metadata"]["resourceVersion"]:
            raise ApiException(status=409, reason="Conflict")
        return copy.deepcopy(self.put("nodes", merge_patch(current, body)))

    def patch_pod(self, namespace: str, name: str, body: dict[str, Any], content_type: str) -> dict[str, Any]:
        self._enter("patch_pod", f"{namespace}/{name}")
        current = copy.deepcopy(self._get("pods", f"{namespace}/{name}"))
        if "strategic" in content_type:  # only what the shell sends: delete scheduling gates by name
            doomed = {g["name"] for g in body["spec"]["schedulingGates"] if g.get("$patch") == "delete"}
            gates = [g for g in current["spec"].get("schedulingGates", []) if g["name"] not in doomed]
            current["spec"]["schedulingGates"] = gates
            return copy.deepcopy(self.put("pods", current))
        return copy.deepcopy(self.put("pods", merge_patch(current, body)))

    def scale(self, namespace: str, deployment: str, replicas: int) -> None:
        self._enter("scale", f"{namespace}/{deployment}")
        self.objects["scales"][f"{namespace}/{deployment}"] = {"spec": {"replicas": replicas}}

    def create_event(self, namespace: str, body: dict[str, Any]) -> None:
        self._enter("create_event", namespace)
        self.events.append(copy.deepcopy(body))

    def read_lease(self, namespace: str, name: str) -> dict[str, Any] | None:
        self._enter("read_lease", name)
        lease = self.objects["leases"].get(f"{namespace}/{name}")
        return copy.deepcopy(lease) if lease is not None else None

    def create_lease(self, namespace: str, body: dict[str, Any]) -> None:
        self._enter("create_lease", body["metadata"]["name"])
        self.put("leases", {**body, "metadata": {**body["metadata"], "namespace": namespace}})

    def replace_lease(self, namespace: str, name: str, body: dict[str, Any]) -> None:
        self._enter("replace_lease", name)
        current = self._get("leases", f"{namespace}/{name}")
        if body["metadata"].get("resourceVersion") != current["metadata"]["resourceVersion"]:
            raise ApiException(status=409, reason="Conflict")
        self.put("leases", {**body, "metadata": {**body["metadata"], "namespace": namespace}})

    def _get(self, kind: str, key: str) -> dict[str, Any]:
        obj = self.objects[kind].get(key)
        if obj is None:
            raise ApiException(status=404, reason="NotFound")
        return obj
