"""Gangs placed by the InfiniBand fabric in the simulator: the placement rule by tables and properties, the fabric
of the model, and gangs that stay inside one leaf when they fit one."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bench.bench_topology import fabric_stack, percentile, spans
from bench.sim.engine import Simulator, simulate
from bench.sim.model import ClusterModel, DeschedulerLimits, PoolModel
from bench.sim.policies import NEVER, Policy
from bench.sim.run import default_workload
from bench.sim.topology import (
    Fabric,
    FabricLeaf,
    GangPlacement,
    leaves_spanned,
    place_gang,
    place_gang_idle_first,
    stranded_gpus,
)
from bench.sim.workload import Gang, Workload, WorkloadSpec
from components.config import LEAF_TIER, SPINE_TIER, TopologyMode, gang_tier

GPN = 8


def fabric(*spines: Sequence[int]) -> tuple[dict[int, str], dict[str, str]]:
    """Nodes 0.. numbered leaf by leaf: ``fabric((4, 4), (4,))`` is leaves a (0–3), b (4–7) under spine s0 and c
    (8–11) under s1. Returns (leaf of each node, spine of each leaf)."""
    leaf_of: dict[int, str] = {}
    spine_of: dict[str, str] = {}
    node = 0
    for s, sizes in enumerate(spines):
        for size in sizes:
            leaf = "abcdefghijklmnop"[len(spine_of)]
            spine_of[leaf] = f"s{s}"
            for _ in range(size):
                leaf_of[node] = leaf
                node += 1
    return leaf_of, spine_of


def free(leaf_of: dict[int, str], taken: Sequence[int] = (), partly: dict[int, int] | None = None) -> dict[int, int]:
    """The nodes a gang may take (all but ``taken``), empty but for ``partly`` (node → free GPUs)."""
    return {n: (partly or {}).get(n, GPN) for n in leaf_of if n not in taken}


def leaves(nodes: Sequence[int] | None, leaf_of: dict[int, str]) -> list[str]:
    assert nodes is not None
    return sorted({leaf_of[n] for n in nodes})


# --- The rule, by tables ---------------------------------------------------------------------------------------


LEAF_OF, SPINE_OF = fabric((4, 4), (4, 4))  # a b | c d


@pytest.mark.parametrize(("taken", "need", "mode", "tier", "expected"), [
    # One leaf: the one with the least room that holds the gang (a: 3 free, the rest 4).
    ((0,), 3, "hard", LEAF_TIER, ["a"]),
    ((0,), 4, "hard", LEAF_TIER, ["b"]),
    # Equal room (a and c: 2 each): the leaf under the spine with less room (s0: a 2 + b 0).
    ((0, 1, 4, 5, 6, 7, 8, 9), 2, "hard", LEAF_TIER, ["a"]),
    # No leaf holds 3: hard waits; soft takes two leaves under one spine, the fuller one (s1: 2 + 1, s0: 2 + 2).
    ((0, 1, 4, 5, 8, 9, 12, 13, 14), 3, "hard", LEAF_TIER, None),
    ((0, 1, 4, 5, 8, 9, 12, 13, 14), 3, "soft", LEAF_TIER, ["c", "d"]),
    # One spine: both need two leaves; s1 has less room (4 + 2) than s0 (4 + 4).
    ((8, 9), 6, "hard", SPINE_TIER, ["c", "d"]),
    # No spine holds 5 (2 + 2 each): hard waits, soft takes the fewest leaves anywhere (three).
    ((0, 1, 4, 5, 8, 9, 12, 13), 5, "hard", SPINE_TIER, None),
    ((0, 1, 4, 5, 8, 9, 12, 13), 5, "soft", SPINE_TIER, ["a", "b", "c"]),
    # No constraint (a gang no spine holds): the fewest leaves anywhere, in either mode.
    ((), 9, "hard", None, ["a", "b", "c"]),
    # Not enough nodes at all: nobody places it.
    ((0, 1, 2, 3, 4, 5, 6, 7, 8), 8, "soft", SPINE_TIER, None),
])
def test_place_gang_by_table(taken: tuple[int, ...], need: int, mode: TopologyMode, tier: int | None,
                             expected: list[str] | None) -> None:
    placed = place_gang(free(LEAF_OF, taken), LEAF_OF, SPINE_OF, need, mode, tier)
    if expected is None:
        assert placed is None
    else:
        assert placed is not None and len(set(placed)) == need and not set(placed) & set(taken)
        assert leaves(placed, LEAF_OF) == expected


def test_the_tightest_leaves_keep_the_big_hole_whole() -> None:
    # Under one spine: a empty (4), b and c 3 free each. Six nodes fit in two leaves either as a + (2 of b) or as
    # b + c; the tighter b + c leaves a whole for a 4-node gang.
    leaf_of, spine_of = fabric((4, 4, 4))
    placed = place_gang(free(leaf_of, (4, 8)), leaf_of, spine_of, 6, "hard", SPINE_TIER)
    assert leaves(placed, leaf_of) == ["b", "c"]


def test_nodes_are_taken_most_free_first_inside_a_leaf() -> None:
    leaf_of, spine_of = fabric((4,))
    placed = place_gang(free(leaf_of, partly={0: 2, 1: 6}), leaf_of, spine_of, 3, "hard", LEAF_TIER)
    assert placed == [2, 3, 1]


def test_an_empty_gang_takes_nothing() -> None:
    assert place_gang(free(LEAF_OF), LEAF_OF, SPINE_OF, 0, "hard", LEAF_TIER) == []


# --- The rule, by properties -----------------------------------------------------------------------------------


@st.composite
def situations(draw: st.DrawFn) -> tuple[dict[int, int], dict[int, str], dict[str, str], int, TopologyMode,
                                         int | None]:
    shape = draw(st.lists(st.lists(st.integers(1, 5), min_size=1, max_size=3), min_size=1, max_size=3))
    leaf_of, spine_of = fabric(*shape)
    nodes = sorted(leaf_of)
    free_gpus = draw(st.lists(st.integers(0, GPN), min_size=len(nodes), max_size=len(nodes)))
    taken = draw(st.sets(st.sampled_from(nodes)))
    candidates = {n: free_gpus[n] for n in nodes if n not in taken}
    need = draw(st.integers(1, len(nodes) + 1))
    mode = draw(st.sampled_from(["soft", "hard"]))
    tier = draw(st.sampled_from([LEAF_TIER, SPINE_TIER, None]))
    return candidates, leaf_of, spine_of, need, mode, tier


def _fewest(rooms: Sequence[int], need: int) -> int | None:
    """The fewest of these rooms that add up to ``need`` (None: they do not)."""
    total = 0
    for count, room in enumerate(sorted(rooms, reverse=True), 1):
        total += room
        if total >= need:
            return count
    return None


@settings(max_examples=400, deadline=None)
@given(situations())
def test_place_gang_properties(case: tuple[dict[int, int], dict[int, str], dict[str, str], int, TopologyMode,
                                           int | None]) -> None:
    candidates, leaf_of, spine_of, need, mode, tier = case
    placed = place_gang(candidates, leaf_of, spine_of, need, mode, tier)
    rooms: dict[str, int] = {}
    for n in candidates:
        rooms[leaf_of[n]] = rooms.get(leaf_of[n], 0) + 1
    spine_rooms: dict[str, list[int]] = {}
    for leaf, room in rooms.items():
        spine_rooms.setdefault(spine_of[leaf], []).append(room)
    leaf_fits = any(room >= need for room in rooms.values())
    under_spine = [k for k in (_fewest(r, need) for r in spine_rooms.values()) if k is not None]
    if placed is not None:
        assert len(placed) == need and len(set(placed)) == need and set(placed) <= set(candidates)
    # Soft (and a gang without constraint) always places when the pool has the nodes; hard only then too.
    if mode == "soft" or tier is None:
        assert (placed is not None) == (len(candidates) >= need)
    # Hard waits exactly when no switch of its tier has room.
    elif tier == LEAF_TIER:
        assert (placed is not None) == leaf_fits
        if placed is not None:
            assert leaves_spanned(placed, leaf_of) == 1
    else:
        assert (placed is not None) == bool(under_spine)
        if placed is not None:
            assert len({spine_of[leaf_of[n]] for n in placed}) == 1
    if placed is None:
        return
    spanned = leaves_spanned(placed, leaf_of)
    # Never more leaves than needed: one when a leaf-tier gang finds a leaf, else the fewest under one spine.
    if tier == LEAF_TIER and leaf_fits:
        assert spanned == 1
    elif tier is not None and under_spine:
        assert spanned == min(under_spine)
    else:
        assert spanned == _fewest(list(rooms.values()), need)


def test_idle_nodes_are_placed_on_before_any_inference_is_preempted() -> None:
    # Leaves a and b of 4 nodes; b idle, a with inference on one node (6 of 8 GPUs free). Best fit over every
    # node ties on room (4 each) and takes a, preempting; Volcano binds on the idle leaf b first.
    capacity = dict.fromkeys(LEAF_OF, GPN)
    busy = {**free(LEAF_OF, tuple(range(8, 16))), 0: GPN - 2}
    assert leaves(place_gang(busy, LEAF_OF, SPINE_OF, 4, "hard", LEAF_TIER) or [], LEAF_OF) == ["a"]
    placed = place_gang_idle_first(busy, capacity, LEAF_OF, SPINE_OF, 4, "hard", LEAF_TIER)
    assert placed is not None and leaves(placed, LEAF_OF) == ["b"]
    # No idle leaf holds it: hard mode preempts inside one leaf rather than wait.
    scattered = {**busy, 4: GPN - 1}
    placed = place_gang_idle_first(scattered, capacity, LEAF_OF, SPINE_OF, 4, "hard", LEAF_TIER)
    assert placed is not None and len(placed) == 4 and leaves_spanned(placed, LEAF_OF) == 1


@settings(max_examples=300, deadline=None)
@given(situations())
def test_a_gang_the_idle_nodes_hold_never_preempts(case: tuple[dict[int, int], dict[int, str], dict[str, str], int,
                                                                TopologyMode, int | None]) -> None:
    candidates, leaf_of, spine_of, need, mode, tier = case
    capacity = dict.fromkeys(leaf_of, GPN)
    idle = {n: f for n, f in candidates.items() if f >= GPN}
    placed = place_gang_idle_first(candidates, capacity, leaf_of, spine_of, need, mode, tier)
    on_idle = place_gang(idle, leaf_of, spine_of, need, mode, tier) if len(idle) >= need else None
    if on_idle is not None:
        assert placed == on_idle and set(placed) <= set(idle)
    else:  # the rule over every node, as before
        assert placed == place_gang(candidates, leaf_of, spine_of, need, mode, tier)


# --- Measures and the model's fabric ---------------------------------------------------------------------------


def test_stranded_gpus_are_the_free_gpus_of_partly_used_leaves() -> None:
    leaf_of, _ = fabric((2, 2, 2))  # a: both empty; b: one used, one half free; c: full
    capacity = dict.fromkeys(leaf_of, GPN)
    node_free = {0: 8, 1: 8, 2: 0, 3: 4, 4: 0, 5: 0}
    assert stranded_gpus(node_free, capacity, leaf_of) == (4, 20)


def test_a_fabric_from_the_stack_sizes_tiers_with_the_stacks_helpers() -> None:
    model = ClusterModel.from_config(fabric_stack(leaf_nodes=32, leaves_per_spine=2))
    assert model.topology_mode == "soft"
    pool = model.pools[0]
    assert pool.fabric is not None and pool.fabric.nodes == pool.nodes == 128
    assert [leaf.nodes for leaf in pool.fabric.leaves] == [32, 32, 32, 32]
    assert [gang_tier(pool.fabric.topology, n) for n in (32, 33, 64, 65)] == [LEAF_TIER, SPINE_TIER, SPINE_TIER, None]
    scaled = model.scaled_to(4096).pools[0]
    assert scaled.fabric is not None and scaled.fabric.nodes == scaled.nodes == 256
    assert ClusterModel.from_config(fabric_stack()).pools[0].fabric == pool.fabric


def test_a_stack_without_topology_has_no_fabric_and_prod_has_its_leaves() -> None:
    from bench.sim.run import load_stack

    model = load_stack("local").model
    assert model.topology_mode is None and all(p.fabric is None for p in model.pools)
    prod = load_stack("prod").model
    assert prod.topology_mode == "soft"
    assert [[(leaf.name, leaf.nodes, leaf.spine) for leaf in p.fabric.leaves] for p in prod.pools if p.fabric] == [
        [(f"leaf-{x}{i}", 32, f"spine-{x}{(i + 1) // 2}") for i in range(1, 5)] for x in "ab"]


def test_scaling_a_fabric_keeps_its_switches_and_its_total() -> None:
    uneven = Fabric((FabricLeaf("a", 3, "s"), FabricLeaf("b", 5, "s"), FabricLeaf("c", 2, "t")))
    for nodes in (3, 7, 10, 23, 100):
        scaled = uneven.scaled(nodes)
        assert scaled.nodes == nodes and all(leaf.nodes >= 1 for leaf in scaled.leaves)
        assert [(leaf.name, leaf.spine) for leaf in scaled.leaves] == [("a", "s"), ("b", "s"), ("c", "t")]
    with pytest.raises(ValueError, match="cannot spread 2 nodes over 3 leaves"):
        uneven.scaled(2)
    assert Fabric.even("p", 10, 4, 2).leaves == (FabricLeaf("p-leaf1", 4, "p-spine1"),
                                                 FabricLeaf("p-leaf2", 4, "p-spine1"),
                                                 FabricLeaf("p-leaf3", 2, "p-spine2"))


def test_spans_and_percentile() -> None:
    placements = [GangPlacement(2, 1, 1, 0.0), GangPlacement(2, 2, 1, 0.0), GangPlacement(40, 2, 2, 0.0)]
    assert spans(placements) == {"2": {"gangs": 2, "minimum": 1, "mean": 1.5, "max": 2},
                                 "40": {"gangs": 1, "minimum": 2, "mean": 2.0, "max": 2}}
    assert percentile([], 0.99) == 0.0
    assert percentile([float(x) for x in range(1, 101)], 0.99) == 99.0


# --- In the simulator --------------------------------------------------------------------------------------------


def _pool(fabric: Fabric | None) -> ClusterModel:
    pool = PoolModel("gpu", 8, GPN, fabric)
    return ClusterModel(pools=(pool,), providers=(), services=(), descheduler=DeschedulerLimits(60.0, 1, 1, 1, 0.0))


TWO_LEAVES = Fabric((FabricLeaf("a", 4, "s"), FabricLeaf("b", 4, "s")))
# 3 nodes, then 3, then 2: the flat placement splits the second gang over both leaves; by the fabric, the
# second takes leaf b whole and the third finds one node left in each leaf.
GANGS = Workload((Gang(0.0, 3, 5000.0, "gpu"), Gang(10.0, 3, 5000.0, "gpu"), Gang(20.0, 2, 100.0, "gpu")),
                 (), WorkloadSpec(training_load=0.0, spikes_per_day=0.0))


@pytest.mark.parametrize(("mode", "spanned", "third_waits"), [
    (None, [1, 2, 1], False),
    ("soft", [1, 1, 2], False),
    ("hard", [1, 1, 1], True),
])
def test_gangs_placed_by_the_fabric_in_the_simulator(mode: TopologyMode | None, spanned: list[int],
                                                     third_waits: bool) -> None:
    sim = Simulator(replace(_pool(TWO_LEAVES), topology_mode=mode), GANGS, Policy("p", NEVER), 6000.0, check=True)
    sim.run()
    placements = sim.counters.gang_placements
    assert [p.leaves for p in placements] == spanned
    assert [p.fewest for p in placements] == [1, 1, 1]
    # Hard: the 2-node gang waits until the first two gangs end (5000 s and 5010 s) and a leaf has room.
    assert placements[2].wait_s == (pytest.approx(5000.0 - 20.0) if third_waits else 0.0)


def test_a_fabric_placed_flat_moves_no_figure() -> None:
    """The fabric without a mode is only measured: every figure is the flat pool's."""
    spec = WorkloadSpec(gang_nodes=(1, 2, 3, 5), gang_weights=(1, 1, 1, 1))
    workload = default_workload(_pool(None), 2.0, 3, 0.0, spec)
    flat = simulate(_pool(None), workload, Policy("p", NEVER), 2 * 86400.0)
    measured = simulate(_pool(TWO_LEAVES), workload, Policy("p", NEVER), 2 * 86400.0)
    assert {k: v for k, v in flat.summary().items() if k != "runtime_s"} == \
        {k: v for k, v in measured.summary().items() if k != "runtime_s"}


def test_a_topology_stacks_gangs_land_inside_one_leaf_when_they_fit() -> None:
    model = replace(ClusterModel.from_config(fabric_stack(leaf_nodes=32, leaves_per_spine=2)), services=(),
                    providers=())
    workload = default_workload(model, 2.0, 1, 0.0, WorkloadSpec(training_load=0.9))
    runs = {}
    for mode in ("hard", "soft", None):
        sim = Simulator(replace(model, topology_mode=mode), workload, Policy("p", NEVER), 2 * 86400.0, check=True)
        sim.run()
        runs[mode] = sim.counters.gang_placements
        assert runs[mode] and all(p.leaves >= p.fewest for p in runs[mode])
        assert len(sim.counters.stranded) > 0
    # Hard: every gang of up to a leaf's 32 nodes in one leaf, a 64-node gang in two (one spine).
    assert all(p.leaves == p.fewest == (1 if p.nodes <= 32 else 2) for p in runs["hard"])
    # Soft packs: fewer leaves per multi-node gang than the flat placement.
    def mean_leaves(ps: list[GangPlacement]) -> float:
        multi = [p.leaves for p in ps if p.nodes > 1]
        return sum(multi) / len(multi)
    assert mean_leaves(runs["soft"]) < mean_leaves(runs[None])
