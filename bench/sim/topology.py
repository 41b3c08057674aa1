"""Training gangs placed by their pool's InfiniBand fabric, as Volcano 1.14's network-topology-aware scheduling
places the gangs our template renders, and what the fabric's figures measure.

The template (``components/training_spec.py`` ``network_topology``) gives a gang that fits in the largest leaf
``highestTierAllowed: 1``, a larger one that fits under the largest spine ``2``, and a gang no spine holds no
constraint (``components.config.topology.gang_tier``). ``place_gang`` is the placement rule, pure so that tables
and properties test it; ``ZoneFabric`` applies it to the simulator's nodes, and ``Fabric`` is a pool's fabric in
the simulated cluster's model.

The rule. A leaf's *room* is its nodes a gang may take (no training on them; inference there is preempted, as
on any node). Nodes are taken most free first, as the flat placement takes them. The rule runs over the idle nodes
first and over every node only when they cannot hold the gang (``place_gang_idle_first``): Volcano binds on idle
nodes and preempts only for a gang that idle nodes cannot place.

1. Tier 1: the leaf with the least room that holds the whole gang (best fit, so the big holes stay whole for the
   big gangs; ties: the leaf under the spine with less room, then the first listed).
2. Tier 2, or a soft tier-1 gang no leaf has room for: under one spine, in the fewest leaves; among spines that
   need as few, the one with the least room; inside it the tightest leaves (``_tightest``).
3. Hard mode stops there: the gang stays pending until some switch of its tier has room. Soft mode, and a gang
   with no constraint, take the fewest leaves (tightest) anywhere in the pool: Volcano's HyperNode bin packing
   still pulls a gang together where no switch holds it.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, NamedTuple, TypeVar

from components.config import (
    LEAF_TIER,
    SPINE_TIER,
    Leaf,
    PoolTopology,
    Spine,
    TopologyMode,
    fewest_leaves,
    gang_tier,
)

if TYPE_CHECKING:
    from bench.sim.cluster import ClusterState

N = TypeVar("N", bound=Hashable)
#: The leaf label of the fabrics the simulator builds (by count, as a site's own discovery labels nodes): the
#: stack's helpers size tiers from it; no node carries it.
SIM_LEAF_LABEL = "bench.sim/leaf"


# --- The rule --------------------------------------------------------------------------------------------------


def place_gang(free_by_node: Mapping[N, int], leaf_of: Mapping[N, str], spine_of: Mapping[str, str],
               nodes_needed: int, mode: TopologyMode, tier: int | None) -> list[N] | None:
    """The nodes a gang of ``nodes_needed`` nodes takes, or ``None`` while it must wait.

    ``free_by_node``: the nodes the gang may take, with their free GPUs (most free are taken first; ties keep the
    mapping's order). ``leaf_of`` names each node's leaf, ``spine_of`` each leaf's spine, in the fabric's order
    (ties between leaves and spines go to the first listed). ``tier``: the Job's ``highestTierAllowed``
    (``gang_tier``), ``None`` for no constraint. ``None`` back: hard mode and no switch of the tier has room, or
    fewer nodes than the gang in all.
    """
    if nodes_needed <= 0:
        return []
    groups: dict[str, list[N]] = {}
    for node in sorted(free_by_node, key=lambda n: -free_by_node[n]):
        groups.setdefault(leaf_of[node], []).append(node)
    rooms = {leaf: len(nodes) for leaf, nodes in groups.items()}
    order = {leaf: i for i, leaf in enumerate(spine_of)}
    spine_order = {spine: i for i, spine in enumerate(dict.fromkeys(spine_of.values()))}
    spine_room: dict[str, int] = {}
    for leaf, room in rooms.items():
        spine_room[spine_of[leaf]] = spine_room.get(spine_of[leaf], 0) + room
    hard = mode == "hard"
    if tier == LEAF_TIER:
        fits = [leaf for leaf, room in rooms.items() if room >= nodes_needed]
        if fits:
            best = min(fits, key=lambda leaf: (rooms[leaf], spine_room[spine_of[leaf]], order[leaf]))
            return groups[best][:nodes_needed]
        if hard:
            return None
    if tier in (LEAF_TIER, SPINE_TIER):
        plans = [(_tightest([leaf for leaf in rooms if spine_of[leaf] == spine], rooms, nodes_needed, order), room,
                  spine_order[spine]) for spine, room in spine_room.items() if room >= nodes_needed]
        if plans:
            leaves, _, _ = min(plans, key=lambda plan: (len(plan[0]), plan[1], plan[2]))
            return _take(groups, leaves, nodes_needed)
        if hard:
            return None
    if sum(rooms.values()) < nodes_needed:
        return None
    return _take(groups, _tightest(list(rooms), rooms, nodes_needed, order), nodes_needed)


def place_gang_idle_first(free_by_node: Mapping[N, int], capacity_by_node: Mapping[N, int],
                          leaf_of: Mapping[N, str], spine_of: Mapping[str, str], nodes_needed: int,
                          mode: TopologyMode, tier: int | None) -> list[N] | None:
    """``place_gang`` as Volcano runs it: its allocate action binds on idle nodes, and only a gang that idle nodes
    cannot hold (its tier's switches considered) goes to the preempt and reclaim actions, which evict what runs on
    the nodes it needs. So the rule runs over the idle nodes first; only when it finds no placement there does it
    run over every node the gang may take, inference included. Without that order a gang placed by leaf would
    preempt inference in a leaf with just enough room while a whole idle leaf waited."""
    idle = {n: f for n, f in free_by_node.items() if f >= capacity_by_node[n]}
    if len(idle) >= nodes_needed:
        placed = place_gang(idle, leaf_of, spine_of, nodes_needed, mode, tier)
        if placed is not None:
            return placed
    return place_gang(free_by_node, leaf_of, spine_of, nodes_needed, mode, tier)


def _tightest(leaves: list[str], rooms: Mapping[str, int], need: int, order: Mapping[str, int]) -> list[str]:
    """The fewest of ``leaves`` whose room adds up to ``need`` (their count: the largest first), and of those
    counts the tightest: each pick is the smallest leaf after which the rest can still be covered by as many
    leaves as are left to pick, so the leaves left untouched are the big ones. The rooms must add up to ``need``."""
    by_size = sorted(leaves, key=lambda leaf: (-rooms[leaf], order[leaf]))
    count = total = 0
    for leaf in by_size:
        if total >= need:
            break
        total += rooms[leaf]
        count += 1
    chosen: list[str] = []
    rest = by_size
    left = need
    for picks_left in range(count, 0, -1):
        for leaf in sorted(rest, key=lambda x: (rooms[x], order[x])):
            others = [x for x in rest if x != leaf][: picks_left - 1]
            if rooms[leaf] + sum(rooms[x] for x in others) >= left:
                chosen.append(leaf)
                rest = [x for x in rest if x != leaf]
                left -= rooms[leaf]
                break
    return chosen


def _take(groups: Mapping[str, list[N]], leaves: Iterable[str], need: int) -> list[N]:
    nodes: list[N] = []
    for leaf in leaves:
        nodes += groups[leaf][: need - len(nodes)]
    return nodes


# --- What the figures measure ----------------------------------------------------------------------------------


def stranded_gpus(free_by_node: Mapping[N, int], capacity_by_node: Mapping[N, int],
                  leaf_of: Mapping[N, str]) -> tuple[int, int]:
    """(free GPUs on leaves neither empty nor full, all free GPUs) over the nodes of ``capacity_by_node``: a
    partly used leaf's free GPUs are the fragments a gang that needs a whole leaf cannot use."""
    free: dict[str, int] = {}
    capacity: dict[str, int] = {}
    for node, cap in capacity_by_node.items():
        leaf = leaf_of[node]
        free[leaf] = free.get(leaf, 0) + free_by_node[node]
        capacity[leaf] = capacity.get(leaf, 0) + cap
    stranded = sum(f for leaf, f in free.items() if 0 < f < capacity[leaf])
    return stranded, sum(free.values())


def leaves_spanned(nodes: Iterable[N], leaf_of: Mapping[N, str]) -> int:
    return len({leaf_of[node] for node in nodes})


# --- The simulated cluster's fabric ----------------------------------------------------------------------------


class FabricLeaf(NamedTuple):
    name: str
    nodes: int
    spine: str


@dataclass(frozen=True)
class Fabric:
    """A pool's fabric in the simulated cluster: its leaves, each a run of the pool's nodes in order (simulated
    nodes are anonymous: which nodes a leaf holds does not matter, only how many), and the spine of each."""

    leaves: tuple[FabricLeaf, ...]

    @classmethod
    def of(cls, topology: PoolTopology) -> Fabric:
        sizes, spines = topology.leaf_sizes(), topology.spine_of()
        return cls(tuple(FabricLeaf(leaf.name, sizes[leaf.name], spines[leaf.name]) for leaf in topology.leaves))

    @classmethod
    def even(cls, prefix: str, nodes: int, leaf_nodes: int, leaves_per_spine: int) -> Fabric:
        """``nodes`` in leaves of ``leaf_nodes`` (the last one takes what is left), ``leaves_per_spine`` to a
        spine: a regular fat tree, for shapes no stack file spells out."""
        sizes = [min(leaf_nodes, nodes - start) for start in range(0, nodes, leaf_nodes)]
        return cls(tuple(FabricLeaf(f"{prefix}-leaf{i + 1}", size, f"{prefix}-spine{i // leaves_per_spine + 1}")
                         for i, size in enumerate(sizes)))

    @property
    def nodes(self) -> int:
        return sum(leaf.nodes for leaf in self.leaves)

    def node_leaves(self) -> list[str]:
        """The leaf of each of the pool's nodes, in node order."""
        return [leaf.name for leaf in self.leaves for _ in range(leaf.nodes)]

    def spine_of(self) -> dict[str, str]:
        return {leaf.name: leaf.spine for leaf in self.leaves}

    @cached_property
    def topology(self) -> PoolTopology:
        """The same fabric as the stack spells one (leaves by count), for the stack's own tier and size helpers."""
        spines: dict[str, list[str]] = {}
        for leaf in self.leaves:
            spines.setdefault(leaf.spine, []).append(leaf.name)
        return PoolTopology(leaf_label=SIM_LEAF_LABEL,
                            leaves=[Leaf(name=leaf.name, node_count=leaf.nodes) for leaf in self.leaves],
                            spines=[Spine(name=name, leaves=leaves) for name, leaves in spines.items()])

    def scaled(self, nodes: int) -> Fabric:
        """The same switches over ``nodes`` nodes: each leaf scaled alike (largest remainders), none empty."""
        if nodes == self.nodes:
            return self
        if nodes < len(self.leaves):
            raise ValueError(f"cannot spread {nodes} nodes over {len(self.leaves)} leaves")
        exact = [leaf.nodes * nodes / self.nodes for leaf in self.leaves]
        sizes = [max(1, int(x)) for x in exact]
        by_remainder = sorted(range(len(sizes)), key=lambda i: (sizes[i] - exact[i], i))
        step = 1 if sum(sizes) < nodes else -1
        while sum(sizes) != nodes:
            for i in by_remainder if step > 0 else reversed(by_remainder):
                if sum(sizes) == nodes:
                    break
                if sizes[i] + step >= 1:
                    sizes[i] += step
        return Fabric(tuple(leaf._replace(nodes=size) for leaf, size in zip(self.leaves, sizes, strict=True)))


class GangPlacement(NamedTuple):
    """Where a gang of a pool with a fabric started: its nodes, the leaves it spans, the fewest it could span
    (``fewest_leaves``) and how long it was pending."""

    nodes: int
    leaves: int
    fewest: int
    wait_s: float


class ZoneFabric:
    """The training zone of one pool with a fabric: the leaf of each of its nodes and the gangs' tiers."""

    def __init__(self, fabric: Fabric, nodes: list[int], gpus_per_node: int) -> None:
        # A pool's training zone is its first nodes (the nodes reserved for inference, if any, come last).
        self.leaf_of = dict(zip(nodes, fabric.node_leaves(), strict=False))
        self.spine_of = fabric.spine_of()
        self.capacity = dict.fromkeys(nodes, gpus_per_node)
        self.topology = fabric.topology
        self._tier: dict[int, int | None] = {}
        self._fewest: dict[int, int] = {}

    def tier(self, nodes: int) -> int | None:
        """The template's ``highestTierAllowed`` for a gang of ``nodes`` nodes (``None``: no constraint)."""
        if nodes not in self._tier:
            self._tier[nodes] = gang_tier(self.topology, nodes)
        return self._tier[nodes]

    def fewest(self, nodes: int) -> int:
        if nodes not in self._fewest:
            self._fewest[nodes] = fewest_leaves(self.topology, nodes)
        return self._fewest[nodes]

    def place(self, buckets: list[dict[int, None]], nodes: int, mode: TopologyMode) -> list[int] | None:
        """``place_gang_idle_first`` over the zone's nodes without training (``buckets``: the zone's nodes by free
        GPUs)."""
        free = {node: f for f in range(len(buckets) - 1, -1, -1) for node in buckets[f]}
        return place_gang_idle_first(free, self.capacity, self.leaf_of, self.spine_of, nodes, mode, self.tier(nodes))

    def stranded(self, node_free: list[int]) -> tuple[int, int]:
        return stranded_gpus({n: node_free[n] for n in self.capacity}, self.capacity, self.leaf_of)


def zone_fabrics(cluster: ClusterState) -> dict[int, ZoneFabric]:
    """Training zone → its fabric, for the pools that have one (none: the placement is the flat one)."""
    out: dict[int, ZoneFabric] = {}
    for pool in cluster.model.pools:
        z = cluster.train_zone.get(pool.name)
        if pool.fabric is None or z is None:
            continue
        if pool.fabric.nodes != pool.nodes:
            raise ValueError(f"pool {pool.name!r}: its fabric's leaves hold {pool.fabric.nodes} nodes, the pool "
                             f"{pool.nodes}")
        nodes = [i for i, zone in enumerate(cluster.node_zone) if zone == z]
        out[z] = ZoneFabric(pool.fabric, nodes, cluster.zone_gpn[z])
    return out
