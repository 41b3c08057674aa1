"""What one node needs so that it carries its pool's labels and taints, and nothing the agent set before that the
pool no longer asks for. Pure: the node's JSON and its pool in, one patch (or nothing) out.

Taints have no merge key, so a patch sends the node's whole list: every taint whose key is not the pool's is
copied as read — the health guard's quarantine above all — and the patch carries the ``resourceVersion`` it was
computed from, so the API server refuses it (409) if anyone changed the node in between. The guard writes the
same way, so neither can drop the other's taint: the loser re-reads and recomputes.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from agents.node_pools.contract import Pool


@dataclass(frozen=True)
class Applied:
    """The label and taint keys the agent set on a node (its ``applied`` annotation)."""

    labels: frozenset[str] = frozenset()
    taints: frozenset[str] = frozenset()

    def document(self) -> str:
        return json.dumps({"labels": sorted(self.labels), "taints": sorted(self.taints)}, separators=(",", ":"))


def read_applied(text: object) -> Applied:
    """The annotation as written by :meth:`Applied.document`; anything else reads as nothing applied, so the
    agent never removes a key it cannot prove it set."""
    if not isinstance(text, str):
        return Applied()
    try:
        data = json.loads(text)
    except ValueError:
        return Applied()
    if not isinstance(data, dict):
        return Applied()

    def keys(field: str) -> frozenset[str]:
        value = data.get(field)
        return frozenset(k for k in value if isinstance(k, str)) if isinstance(value, list) else frozenset()

    return Applied(keys("labels"), keys("taints"))


def _taint_set(taints: list[Mapping[str, Any]]) -> set[tuple[str, str, str]]:
    return {(str(t.get("key")), str(t.get("value") or ""), str(t.get("effect"))) for t in taints}


def node_patch(node: Mapping[str, Any], pool: Pool | None, annotation: str,
               spare_taint: Mapping[str, str] | None = None) -> dict[str, Any] | None:
    """The strategic-merge patch that brings ``node`` to ``pool`` (``None``: the node is in no pool), with the spare
    taint and its label when ``spare_taint`` is given (the node is one of its pool's warm spares), or ``None`` when
    it already is.
    A node in no pool that the agent never labelled is never touched."""
    metadata = node.get("metadata") or {}
    labels: Mapping[str, Any] = metadata.get("labels") or {}
    annotations: Mapping[str, Any] = metadata.get("annotations") or {}
    applied = read_applied(annotations.get(annotation))
    if pool is None and annotation not in annotations:
        return None
    want_labels = pool.labels_for(node) if pool else {}
    want_taints = [t.model_dump() for t in pool.taints] if pool else []
    if pool and spare_taint is not None:
        # The taint keeps training off; a label of the same key and value lets a DaemonSet (the image pre-pull)
        # and a person select the spares.
        want_taints.append(dict(spare_taint))
        want_labels[spare_taint["key"]] = spare_taint["value"]
    want_keys = Applied(frozenset(want_labels), frozenset(t["key"] for t in want_taints))

    label_patch: dict[str, str | None] = {k: v for k, v in want_labels.items() if labels.get(k) != v}
    label_patch.update({k: None for k in applied.labels - want_keys.labels if k in labels})

    current = list((node.get("spec") or {}).get("taints") or [])
    ours = applied.taints | want_keys.taints
    taints = [t for t in current if t.get("key") not in ours] + want_taints
    taints_change = _taint_set(taints) != _taint_set(current) or len(taints) != len(current)

    document = want_keys.document() if pool else None
    annotation_change = annotations.get(annotation) != document
    if not (label_patch or taints_change or annotation_change):
        return None
    patch: dict[str, Any] = {"metadata": {"resourceVersion": metadata.get("resourceVersion")}}
    if label_patch:
        patch["metadata"]["labels"] = label_patch
    if annotation_change:
        patch["metadata"]["annotations"] = {annotation: document}
    if taints_change:
        patch["spec"] = {"taints": taints}
    return patch
