"""The pools' InfiniBand fabric as Volcano 1.14 reads it: one HyperNode per switch, and the scheduler plugin that
places by them. Plain dicts, no Pulumi: the gang scheduler component creates them and tests read them directly.

HyperNodes are rendered from the stack rather than discovered by Volcano's controller from node labels: the label
discovery (``networkTopologyDiscovery`` source ``label`` in the controller's ConfigMap) names each HyperNode
``hypernode-<type>-tier<n>-<random>``, so no name would match the switch a person, the CLI or the health guard
calls it, and what it creates is outside the preview and the policy pack. A leaf names its nodes exactly (a node
is in its leaf before the node-pool agent has labelled it), or, where the site's discovery labels the nodes, by
that label (Volcano's ``labelMatch`` member). A spine's members are its leaves' HyperNodes.
"""

from __future__ import annotations

from typing import Any

from components.config import LEAF_TIER, SPINE_TIER, TIER_NAMES, GpuPool, PoolTopology
from components.naming import Keys, common_labels

HYPERNODE_API = "topology.volcano.sh/v1alpha1"
HYPERNODE_KIND = "HyperNode"
#: Volcano's scheduler plugin for HyperNodes and a job's ``networkTopology`` (pkg/scheduler/plugins/network-
#: topology-aware in v1.14.1).
TOPOLOGY_PLUGIN = "network-topology-aware"
#: HyperNode-level bin packing weight of GPUs against CPU's and memory's 1 (Volcano's default for each): gangs are
#: sized in GPUs, and a leaf's free GPUs are what a later gang that must fit in one leaf needs together.
GPU_BINPACK_WEIGHT = 10


def _node(selector: dict[str, Any]) -> dict[str, Any]:
    return {"type": "Node", "selector": selector}


def leaf_members(topology: PoolTopology, leaf_name: str) -> list[dict[str, Any]]:
    """A leaf's members: each of its nodes by exact name, or the nodes whose site label has the leaf's value."""
    leaf = next(leaf for leaf in topology.leaves if leaf.name == leaf_name)
    if topology.leaf_label is not None:
        return [_node({"labelMatch": {"matchLabels": {topology.leaf_label: leaf.selector_value}}})]
    return [_node({"exactMatch": {"name": name}}) for name in leaf.node_names]


def hypernodes(pools: list[GpuPool], label_prefix: str) -> list[dict[str, Any]]:
    """Every pool's switches as HyperNode manifests: its leaves (tier 1), then its spines (tier 2)."""
    keys = Keys(label_prefix)
    out: list[dict[str, Any]] = []
    for pool in pools:
        topology = pool.topology
        if topology is None:
            continue
        tiers: list[tuple[int, str, list[dict[str, Any]]]] = [
            (LEAF_TIER, leaf.name, leaf_members(topology, leaf.name)) for leaf in topology.leaves]
        tiers += [(SPINE_TIER, spine.name, [{"type": "HyperNode", "selector": {"exactMatch": {"name": leaf}}}
                                             for leaf in spine.leaves]) for spine in topology.spines]
        for tier, name, members in tiers:
            out.append({
                "apiVersion": HYPERNODE_API,
                "kind": HYPERNODE_KIND,
                "metadata": {"name": name, "labels": {**common_labels(name, f"fabric-{TIER_NAMES[tier]}"),
                                                      keys.pool: pool.name}},
                "spec": {"tier": tier, "tierName": TIER_NAMES[tier], "members": members},
            })
    return out


def topology_plugin(gpu_resource: str) -> dict[str, Any]:
    """The scheduler plugin entry: HyperNode-aware placement of jobs with a ``networkTopology`` and HyperNode-level
    bin packing that counts GPUs (``hypernode.binpack.resources``), so free GPUs stay together in whole leaves."""
    return {
        "name": TOPOLOGY_PLUGIN,
        "arguments": {
            "hypernode.binpack.resources": gpu_resource,
            f"hypernode.binpack.resources.{gpu_resource}": GPU_BINPACK_WEIGHT,
        },
    }
