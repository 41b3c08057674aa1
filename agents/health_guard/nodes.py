"""Nodes and pods as the guard reads and writes them: the view the decision takes, and the patches, the
condition and the eviction the shell sends. Pure: JSON in, JSON out."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from agents.health_guard.contract import (
    CONDITION_TYPE,
    OPT_OUT_VALUE,
    TAINT_EFFECT,
    HealthClass,
    HealthSettings,
    Names,
)
from agents.health_guard.decide import NodeView, Quarantine
from agents.kit.lease import rfc3339

TRAINING = "training"
INFERENCE = "inference"
GANG_LABEL = "volcano.sh/job-name"




def parse_history(text: str | None) -> tuple[float, ...]:
    """The history annotation (comma-separated epoch seconds); anything unreadable is skipped."""
    out: list[float] = []
    for part in (text or "").split(","):
        try:
            value = float(part)
        except ValueError:
            continue
        if math.isfinite(value) and value > 0:
            out.append(value)
    return tuple(sorted(out))


def node_view(settings: HealthSettings, node: Mapping[str, Any]) -> NodeView:
    names = settings.names
    metadata = node.get("metadata") or {}
    labels = metadata.get("labels") or {}
    annotations = metadata.get("annotations") or {}
    taint = next((t for t in (node.get("spec") or {}).get("taints") or [] if t.get("key") == names.taint), None)
    quarantined: HealthClass | None = None
    if taint is not None:
        try:
            quarantined = HealthClass(taint.get("value"))
        except ValueError:
            quarantined = HealthClass.FATAL  # a value we did not write: the strict reading
    conditions = (node.get("status") or {}).get("conditions") or []
    return NodeView(
        name=metadata["name"],
        pool=str(labels.get(names.pool, "")),
        quarantined=quarantined,
        marked=names.taint in labels,
        reasons=tuple(r for r in str(annotations.get(names.reasons, "")).split(",") if r),
        condition_false=any(c.get("type") == CONDITION_TYPE and c.get("status") == "False" for c in conditions),
        repaired=names.repaired in labels or names.repaired in annotations,
        opted_out=labels.get(names.opt_out) == OPT_OUT_VALUE,
        history=parse_history(annotations.get(names.history)),
        overridden=frozenset(x for x in str(annotations.get(names.overridden, "")).split(",") if x),
    )


def _other_taints(names: Names, node: Mapping[str, Any]) -> list[dict[str, Any]]:
    return [t for t in (node.get("spec") or {}).get("taints") or [] if t.get("key") != names.taint]


def quarantine_patch(settings: HealthSettings, node: Mapping[str, Any], action: Quarantine, now: float
                     ) -> dict[str, Any]:
    """Strategic-merge patch: our taint (NoSchedule, never NoExecute), class label, why and history.

    ``spec.taints`` has no merge key, so the whole list is sent with ``resourceVersion``: the API server
    refuses it if someone changed the node in between, and the next cycle retries on fresh data. A repair
    mark left from an earlier repair is removed, so it cannot release this new fault.
    """
    names = settings.names
    metadata = node.get("metadata") or {}
    taints = [*_other_taints(names, node), {"key": names.taint, "value": str(action.health_class),
                                             "effect": TAINT_EFFECT}]
    since = (metadata.get("annotations") or {}).get(names.since) if action.escalation else None
    return {
        "metadata": {
            "resourceVersion": metadata.get("resourceVersion"),
            "labels": {names.taint: str(action.health_class), names.repaired: None},
            "annotations": {
                names.since: since or rfc3339(now),
                names.reasons: ",".join(action.reasons),
                names.detail: detail(settings, action.health_class, action.reasons),
                names.history: ",".join(f"{t:.0f}" for t in action.history),
                names.repaired: None,
            },
        },
        "spec": {"taints": taints},
    }


def release_patch(settings: HealthSettings, node: Mapping[str, Any]) -> dict[str, Any]:
    """Removes our taint, label, reasons and the repair mark; the history stays (rate limit, flap count)."""
    names = settings.names
    metadata = node.get("metadata") or {}
    return {
        "metadata": {
            "resourceVersion": metadata.get("resourceVersion"),
            "labels": {names.taint: None, names.repaired: None},
            "annotations": {names.since: None, names.reasons: None, names.detail: None, names.repaired: None},
        },
        "spec": {"taints": _other_taints(names, node)},
    }


def condition_patch(healthy: bool, reason: str, message: str, now: float) -> dict[str, Any]:
    """``GpuHealthy`` on ``nodes/status``; strategic merge keys conditions by type, so others are kept."""
    stamp = rfc3339(now)
    return {"status": {"conditions": [{
        "type": CONDITION_TYPE, "status": "True" if healthy else "False", "reason": reason, "message": message,
        "lastHeartbeatTime": stamp, "lastTransitionTime": stamp,
    }]}}


def detail(settings: HealthSettings, cls: HealthClass, reasons: tuple[str, ...]) -> str:
    names = settings.names
    how = (f"label or annotate {names.repaired}=<who> after the repair; released after "
           f"{settings.probation_seconds}s healthy") if cls is HealthClass.FATAL else (
        f"released after {settings.probation_seconds}s healthy")
    return f"{cls}: {', '.join(reasons)}; {how}"


def evictable(settings: HealthSettings, pod: Mapping[str, Any], cls: HealthClass) -> bool:
    """Training always; inference too when the node is fatal; only in the eviction namespaces (where the guard's
    Roles are). DaemonSet pods and pods already leaving never."""
    metadata = pod.get("metadata") or {}
    if metadata.get("namespace") not in settings.eviction_namespaces:
        return False
    if metadata.get("deletionTimestamp") or (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
        return False
    if any(o.get("kind") == "DaemonSet" for o in metadata.get("ownerReferences") or []):
        return False
    workload = (metadata.get("labels") or {}).get(settings.names.workload)
    if workload == TRAINING:
        return True
    return workload == INFERENCE and cls is HealthClass.FATAL and settings.evict_inference_on_fatal


def eviction(pod: Mapping[str, Any]) -> dict[str, Any]:
    """A policy/v1 Eviction of exactly this pod: the UID precondition makes the API server refuse (409) an
    eviction that arrives after the pod was replaced by a new one under the same name (a gang restarted
    elsewhere), so a late eviction can never hit a healthy node's pod."""
    metadata = pod.get("metadata") or {}
    body: dict[str, Any] = {"apiVersion": "policy/v1", "kind": "Eviction",
                            "metadata": {"name": metadata.get("name"), "namespace": metadata.get("namespace")}}
    if metadata.get("uid"):
        body["deleteOptions"] = {"preconditions": {"uid": metadata["uid"]}}
    return body
