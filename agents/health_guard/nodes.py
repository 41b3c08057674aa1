"""Nodes and pods as the guard reads and writes them: the view the decision takes, and the patches, the
condition and the eviction the shell sends. Pure: JSON in, JSON out."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from agents.health_guard.contract import (
    CONDITION_TYPE,
    OPT_OUT_VALUE,
    SWITCH_CONDITION_TYPE,
    TAINT_EFFECT,
    HealthClass,
    HealthSettings,
    Names,
)
from agents.health_guard.decide import NodeView, Quarantine
from agents.health_guard.switches import SwitchFence, SwitchMarks
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
    switch = next((t for t in (node.get("spec") or {}).get("taints") or [] if t.get("key") == names.switch_fault),
                  None)
    leaf = str(labels.get(names.leaf, ""))
    marks = SwitchMarks(
        leaf=leaf,
        spine=str(labels.get(names.spine, "")),
        # A value we did not write: the node's own leaf (the taint still keeps it out).
        fault=None if switch is None else (str(switch.get("value") or "") or leaf or None),
        marked=str(labels[names.switch_fault]) if labels.get(names.switch_fault) else None,
        reasons=tuple(r for r in str(annotations.get(names.switch_reasons, "")).split(",") if r),
        condition_false=any(c.get("type") == SWITCH_CONDITION_TYPE and c.get("status") == "False"
                            for c in conditions),
        repaired=names.switch_repaired in labels or names.switch_repaired in annotations,
    )
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
        switch=marks,
    )


def _other_taints(names: Names, node: Mapping[str, Any], key: str | None = None) -> list[dict[str, Any]]:
    """Every taint but ours (``key``: the health taint unless named), kept as the node has them."""
    mine = names.taint if key is None else key
    return [t for t in (node.get("spec") or {}).get("taints") or [] if t.get("key") != mine]


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


def condition_patch(healthy: bool, reason: str, message: str, now: float,
                    condition_type: str = CONDITION_TYPE) -> dict[str, Any]:
    """``GpuHealthy`` (or the switch's condition) on ``nodes/status``; strategic merge keys conditions by type, so
    others are kept."""
    stamp = rfc3339(now)
    return {"status": {"conditions": [{
        "type": condition_type, "status": "True" if healthy else "False", "reason": reason, "message": message,
        "lastHeartbeatTime": stamp, "lastTransitionTime": stamp,
    }]}}


def switch_fence_patch(settings: HealthSettings, node: Mapping[str, Any], action: SwitchFence, now: float
                       ) -> dict[str, Any]:
    """Strategic-merge patch: the switch-fault taint naming the leaf (NoSchedule), its label and reasons. The whole
    taint list with ``resourceVersion``, as :func:`quarantine_patch` (the health taint is kept, and the reverse).
    A declaration removes a switch repair mark left from before, so it cannot release this fault."""
    names = settings.names
    metadata = node.get("metadata") or {}
    taints = [*_other_taints(names, node, names.switch_fault),
              {"key": names.switch_fault, "value": action.leaf, "effect": TAINT_EFFECT}]
    since = None if action.declared else (metadata.get("annotations") or {}).get(names.switch_since)
    labels: dict[str, str | None] = {names.switch_fault: action.leaf}
    annotations: dict[str, str | None] = {names.switch_since: since or rfc3339(now),
                                          names.switch_reasons: ",".join(action.reasons)}
    if action.declared:
        labels[names.switch_repaired] = annotations[names.switch_repaired] = None
    return {"metadata": {"resourceVersion": metadata.get("resourceVersion"), "labels": labels,
                         "annotations": annotations},
            "spec": {"taints": taints}}


def switch_release_patch(settings: HealthSettings, node: Mapping[str, Any]) -> dict[str, Any]:
    """Removes the switch-fault taint, label, reasons and the switch repair mark; every other taint stays."""
    names = settings.names
    metadata = node.get("metadata") or {}
    return {
        "metadata": {
            "resourceVersion": metadata.get("resourceVersion"),
            "labels": {names.switch_fault: None, names.switch_repaired: None},
            "annotations": {names.switch_since: None, names.switch_reasons: None, names.switch_repaired: None},
        },
        "spec": {"taints": _other_taints(names, node, names.switch_fault)},
    }


def switch_release(settings: HealthSettings, cls: HealthClass) -> str:
    """What releases a switch fault of class ``cls``."""
    how = f"after {settings.probation_seconds}s with its nodes' InfiniBand signals clear"
    if cls is HealthClass.FATAL:
        how += f", and {settings.names.switch_repaired}=<who> on any of its nodes once the switch is fixed"
    return how


def switch_detail(settings: HealthSettings, cls: HealthClass, leaf: str, reasons: tuple[str, ...]) -> str:
    """What the leaf's nodes' condition says: which switch, why, and what releases it."""
    return (f"leaf switch {leaf} at fault ({cls}: {', '.join(reasons)}): its nodes take no new pods "
            f"({settings.names.switch_fault}={leaf}:{TAINT_EFFECT}), nothing is evicted; released "
            f"{switch_release(settings, cls)}")


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
