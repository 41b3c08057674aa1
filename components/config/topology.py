"""A GPU pool's InfiniBand fabric: the leaf switches its nodes hang off (tier 1) and the spine switches above the
leaves (tier 2). Volcano places a gang inside one leaf or one spine by it; the node-pool agent labels each node
with its leaf and spine; the health guard reads those labels to see a switch fault as one fault.

A leaf names its nodes by the pool's node names or ranges, or, where a site's own discovery already labels each
node with its switch, by that label (``leafLabel``) and the label's value; then the stack cannot see which node is
where, so each leaf says how many nodes it has (``nodeCount``), which sizes the gangs that fit in one leaf.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Annotated, Literal

from pydantic import AfterValidator, Field

from agents.node_names import expand_node_names
from components.config.base import (
    ConfigModel,
    DnsLabel,
    LabelValue,
    NodePatterns,
    PositiveInt,
    Problem,
    check_label_key,
    unique_names,
)

if TYPE_CHECKING:
    from components.config.cluster import ClusterConfig
    from components.config.pools import GpuPool

#: Volcano HyperNode tiers: a leaf switch is tier 1, a spine switch tier 2 (``highestTierAllowed`` counts these).
LEAF_TIER = 1
SPINE_TIER = 2
#: The HyperNodes' ``tierName`` of each tier.
TIER_NAMES = {LEAF_TIER: "leaf", SPINE_TIER: "spine"}
#: How a gang is held to its tier (Volcano ``networkTopology.mode``).
TopologyMode = Literal["soft", "hard"]
LabelKey = Annotated[str, AfterValidator(check_label_key)]
#: Nodes shown in one message before "and N more".
_SHOWN = 5


class Leaf(ConfigModel):
    """One leaf switch and the pool's nodes cabled to it."""

    name: DnsLabel
    """The switch's name: its Volcano HyperNode's name and the `<labelPrefix>/leaf` label of its nodes; unique in
    the stack (HyperNodes are cluster-wide)."""
    nodes: NodePatterns | None = None
    """The pool's nodes cabled to this leaf, by name or range such as `gpu-a-[001-032]`; every node of the pool
    hangs off exactly one leaf. Leave out with `leafLabel`."""
    label_value: LabelValue | None = None
    """With `leafLabel`: the value that label has on this leaf's nodes; the leaf's name when left out."""
    node_count: PositiveInt | None = None
    """With `leafLabel`: how many of the pool's nodes hang off this leaf (the stack cannot see which they are); it
    sizes which gangs fit in one leaf, and the leaves' counts add up to the pool's nodes."""

    @property
    def node_names(self) -> list[str]:
        return expand_node_names(self.nodes or [])

    @property
    def selector_value(self) -> str:
        """The value of the site's leaf label that selects this leaf's nodes."""
        return self.label_value or self.name


class Spine(ConfigModel):
    """One spine switch and the leaves under it."""

    name: DnsLabel
    """The switch's name: its Volcano HyperNode's name and the `<labelPrefix>/spine` label of the nodes under it;
    unique in the stack."""
    leaves: list[DnsLabel] = Field(min_length=1)
    """Names of the leaves (`topology.leaves`) cabled to this spine; a leaf is under exactly one spine."""


class PoolTopology(ConfigModel):
    """The pool's fabric in two tiers: leaves (tier 1) under spines (tier 2)."""

    leaf_label: LabelKey | None = None
    """A node label the site's own discovery sets to the node's leaf switch (for example `example.com/ib-leaf`):
    each leaf then takes the nodes whose label has its `labelValue`, instead of naming its `nodes`."""
    leaves: list[Leaf] = Field(min_length=1)
    """The leaf switches (tier 1) and their nodes."""
    spines: list[Spine] = Field(min_length=1)
    """The spine switches (tier 2) and the leaves under each."""

    @property
    def by_label(self) -> bool:
        return self.leaf_label is not None

    def leaf_sizes(self) -> dict[str, int]:
        """Leaf name → its nodes (named, or counted with ``leafLabel``)."""
        return {leaf.name: (leaf.node_count or 0) if self.by_label else len(leaf.node_names) for leaf in self.leaves}

    def spine_of(self) -> dict[str, str]:
        """Leaf name → the spine above it (the first spine naming it, should a broken stack name it twice)."""
        found: dict[str, str] = {}
        for spine in self.spines:
            for leaf in spine.leaves:
                found.setdefault(leaf, spine.name)
        return found

    def spine_sizes(self) -> dict[str, int]:
        """Spine name → the nodes under its leaves."""
        sizes = self.leaf_sizes()
        return {spine.name: sum(sizes.get(leaf, 0) for leaf in spine.leaves) for spine in self.spines}

    def leaf_of(self) -> dict[str, str]:
        """Node name → its leaf, for leaves that name their nodes (empty with ``leafLabel``)."""
        return {node: leaf.name for leaf in self.leaves for node in leaf.node_names}


# --- What a gang gets -------------------------------------------------------------------------------------------


def nodes_for(workers: int, gpus_per_worker: int, gpus_per_node: int) -> int:
    """The fewest nodes a gang fills: as many workers share a node as its GPUs hold."""
    per_node = max(1, gpus_per_node // gpus_per_worker)
    return math.ceil(workers / per_node)


def gang_tier(topology: PoolTopology, nodes: int) -> int | None:
    """The lowest tier one switch of which holds a gang of ``nodes`` nodes: the leaf tier when the largest leaf
    does, else the spine tier when the largest spine does; ``None`` for a gang larger than any spine (no switch
    holds it, so it gets no constraint rather than one it can never meet)."""
    if nodes <= max(topology.leaf_sizes().values(), default=0):
        return LEAF_TIER
    if nodes <= max(topology.spine_sizes().values(), default=0):
        return SPINE_TIER
    return None


def fewest_leaves(topology: PoolTopology, nodes: int) -> int:
    """The fewest leaves whose nodes add up to ``nodes`` (the largest first): what a gang spans at best."""
    total = count = 0
    for size in sorted(topology.leaf_sizes().values(), reverse=True):
        if total >= nodes:
            break
        total += size
        count += 1
    return count


# --- Checks -------------------------------------------------------------------------------------------------


def _listed(names: list[str]) -> str:
    shown = ", ".join(names[:_SHOWN])
    return shown + (f" and {len(names) - _SHOWN} more" if len(names) > _SHOWN else "")


def _leaf_problems(where: str, pool: GpuPool, topology: PoolTopology) -> list[Problem]:
    """Every node of the pool under exactly one leaf: by name (no unknown node, none twice, none left out), or by
    the site's label (distinct values, counts that add up to the pool)."""
    problems: list[Problem] = []
    members = set(pool.node_names)
    owner: dict[str, str] = {}
    for index, leaf in enumerate(topology.leaves):
        at = f"{where}.leaves[{index}]"
        if topology.by_label:
            if leaf.nodes is not None:
                problems.append(Problem(f"{at}.nodes", "leaves take their nodes by leafLabel here; leave nodes out",
                                        leaf.nodes))
            if leaf.node_count is None:
                problems.append(Problem(f"{at}.nodeCount", "is required with leafLabel: how many of the pool's nodes "
                                        "hang off this leaf"))
            continue
        for key, value in (("labelValue", leaf.label_value), ("nodeCount", leaf.node_count)):
            if value is not None:
                problems.append(Problem(f"{at}.{key}", "applies only with topology.leafLabel", value))
        if leaf.nodes is None:
            problems.append(Problem(f"{at}.nodes", "is required: the pool's nodes cabled to this leaf (or set "
                                    "topology.leafLabel)"))
            continue
        unknown = [n for n in leaf.node_names if n not in members]
        if unknown:
            problems.append(Problem(f"{at}.nodes", f"not nodes of pool '{pool.name}': {_listed(unknown)}",
                                    leaf.nodes))
        twice: list[str] = []
        for node in leaf.node_names:
            if node in owner:
                twice.append(f"{node} (leaf '{owner[node]}')")
            owner[node] = owner.get(node, leaf.name)
        if twice:
            problems.append(Problem(f"{at}.nodes", f"nodes already under a leaf: {_listed(twice)}", leaf.nodes))
    if topology.by_label:
        values = [leaf.selector_value for leaf in topology.leaves]
        problems += [Problem(f"{where}.leaves[{i}].labelValue", "another leaf selects the same label value", v)
                     for i, v in enumerate(values) if v in values[:i]]
        counted = sum(leaf.node_count or 0 for leaf in topology.leaves)
        if all(leaf.node_count for leaf in topology.leaves) and counted != len(members):
            problems.append(Problem(f"{where}.leaves", f"the leaves' nodeCount add up to {counted}, but pool "
                                    f"'{pool.name}' has {len(members)} nodes: every node hangs off one leaf",
                                    counted))
    elif not any(leaf.nodes is None for leaf in topology.leaves):
        orphans = [n for n in pool.node_names if n not in owner]
        if orphans:
            problems.append(Problem(f"{where}.leaves", f"{len(orphans)} node(s) of pool '{pool.name}' hang off no "
                                    f"leaf: {_listed(orphans)}"))
    return problems


def _spine_problems(where: str, topology: PoolTopology) -> list[Problem]:
    """The tiers nest: every spine's leaves are this pool's, no leaf is under two spines, none under no spine."""
    problems: list[Problem] = []
    leaves = {leaf.name for leaf in topology.leaves}
    above: dict[str, str] = {}
    for index, spine in enumerate(topology.spines):
        at = f"{where}.spines[{index}].leaves"
        for leaf in spine.leaves:
            if leaf not in leaves:
                problems.append(Problem(at, f"no leaf '{leaf}' in this pool's topology.leaves", leaf))
            elif leaf in above:
                problems.append(Problem(at, f"leaf '{leaf}' is already under spine '{above[leaf]}'; a leaf hangs "
                                        "under one spine", leaf))
            else:
                above[leaf] = spine.name
    lone = [leaf.name for leaf in topology.leaves if leaf.name not in above]
    if lone:
        problems.append(Problem(f"{where}.spines", f"leaves under no spine: {_listed(lone)}; every leaf hangs "
                                "under one spine"))
    return problems


def topology_problems(cfg: ClusterConfig) -> list[Problem]:
    """Each pool's topology covers its nodes once and nests; switch names are unique across the stack (each is a
    cluster-wide HyperNode); topology needs Volcano."""
    problems: list[Problem] = []
    switch: dict[str, str] = {}
    for p_index, pool in enumerate(cfg.pools):
        topology = pool.topology
        if topology is None:
            continue
        where = f"pools[{p_index}].topology"
        if cfg.scheduling.engine.value != "volcano":
            problems.append(Problem(where, "needs scheduling.engine 'volcano' (HyperNodes and a job's "
                                    "networkTopology are Volcano's)", cfg.scheduling.engine.value))
        problems += unique_names(enumerate(leaf.name for leaf in topology.leaves), f"{where}.leaves", "leaf")
        problems += unique_names(enumerate(spine.name for spine in topology.spines), f"{where}.spines", "spine")
        problems += _leaf_problems(where, pool, topology)
        problems += _spine_problems(where, topology)
        named = [(f"{where}.leaves[{i}].name", leaf.name) for i, leaf in enumerate(topology.leaves)]
        named += [(f"{where}.spines[{i}].name", spine.name) for i, spine in enumerate(topology.spines)]
        mine: set[str] = set()
        for path, name in named:
            if name in switch and name not in mine:
                problems.append(Problem(path, f"switch name already used by {switch[name]}; leaf and spine names "
                                        "are unique across the stack (each is a cluster-wide HyperNode)", name))
            mine.add(name)
        for path, name in named:
            switch.setdefault(name, path.rsplit(".", 1)[0])
        leaf_names = {leaf.name for leaf in topology.leaves}
        problems += [Problem(f"{where}.spines[{i}].name", "is also a leaf's name; a switch is a leaf or a spine",
                             spine.name) for i, spine in enumerate(topology.spines) if spine.name in leaf_names]
    return problems
