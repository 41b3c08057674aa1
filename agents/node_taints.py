"""Node taint and label keys more than one agent reads, spelled once and standard library only.

The health guard writes the health taint and the burst controller reads it; the node-pool agent writes the spare
taint and reads the health taint; the node-pool agent writes the fabric
labels (leaf and spine switch of a node) and the guard reads them to see a switch fault as one. Their images share
no other module (the guard's carries no burst controller or node-pool agent), so the
keys live here.
"""

from __future__ import annotations

HEALTH_TAINT_NAME = "gpu-health"
SWITCH_FAULT_TAINT_NAME = "switch-fault"
SPARE_TAINT_NAME = "spare"
RESERVED_TAINT_NAME = "reserved"
#: Label names (after ``<prefix>/``) of a GPU node's InfiniBand leaf switch and the spine switch above that leaf.
LEAF_LABEL_NAME = "leaf"
SPINE_LABEL_NAME = "spine"


def health_taint_key(prefix: str) -> str:
    """``<prefix>/gpu-health``: the guard's quarantine taint (value fatal or degraded, effect NoSchedule)."""
    return f"{prefix}/{HEALTH_TAINT_NAME}"


def switch_fault_taint_key(prefix: str) -> str:
    """``<prefix>/switch-fault``: the guard's fence on every node of a leaf whose switch is at fault (value the
    leaf, effect NoSchedule): the burst controller counts no headroom there, the node-pool agent never drops it."""
    return f"{prefix}/{SWITCH_FAULT_TAINT_NAME}"


def spare_taint_key(prefix: str) -> str:
    """``<prefix>/spare``: a warm spare of its pool (value ``true``, effect NoSchedule), set by the node-pool agent:
    training does not tolerate it, inference does (agents/node_pools/spares.py)."""
    return f"{prefix}/{SPARE_TAINT_NAME}"


def reserved_taint_key(prefix: str) -> str:
    """``<prefix>/reserved``: a node the burst controller's handover cleared for training its pool's scheduler left
    waiting (value the pool, effect NoSchedule): training tolerates it, inference does not, so an evicted replica's
    replacement cannot take back the GPUs its eviction freed. The node-pool agent leaves it alone."""
    return f"{prefix}/{RESERVED_TAINT_NAME}"


def leaf_label_key(prefix: str) -> str:
    """``<prefix>/leaf``: the name of the leaf switch a node hangs off (set on every node of a pool with a
    topology; the value is the leaf's name in the stack, also its Volcano HyperNode's name)."""
    return f"{prefix}/{LEAF_LABEL_NAME}"


def spine_label_key(prefix: str) -> str:
    """``<prefix>/spine``: the name of the spine switch above the node's leaf (set with the leaf label: a pool's
    topology always names both tiers)."""
    return f"{prefix}/{SPINE_LABEL_NAME}"
