"""A pool's fabric topology in the stack: the tier a gang gets for its size (tables), every validation message with
its key path (tables), and the parser on generated fabrics (properties). Render tests: tests/test_topology_render.py."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agents.node_taints import leaf_label_key, spine_label_key
from components.config import (
    LEAF_TIER,
    SPINE_TIER,
    ClusterConfig,
    ConfigError,
    PoolTopology,
    fewest_leaves,
    gang_tier,
    nodes_for,
    parse_config,
)
from components.mockrt import raw_from_stack
from components.node_pools import settings_from_config

LOCAL = raw_from_stack("local")
PROD = raw_from_stack("prod")


def local_topology(**changes: Any) -> dict[str, Any]:
    """Two leaves of two nodes each under one spine (the local pool's four nodes)."""
    topology: dict[str, Any] = {
        "leaves": [{"name": "leaf-l1", "nodes": ["gpu-local-[01-02]"]},
                   {"name": "leaf-l2", "nodes": ["gpu-local-[03-04]"]}],
        "spines": [{"name": "spine-l1", "leaves": ["leaf-l1", "leaf-l2"]}],
    }
    topology.update(changes)
    return topology


def prod_topology(pool: str = "a", leaf_size: int = 32, per_spine: int = 2) -> dict[str, Any]:
    """A prod pool (128 nodes) cut into leaves of ``leaf_size`` nodes, ``per_spine`` leaves under each spine."""
    count = 128 // leaf_size
    leaves = [{"name": f"leaf-{pool}{i}",
               "nodes": [f"gpu-{pool}-[{i * leaf_size + 1:03d}-{(i + 1) * leaf_size:03d}]"]} for i in range(count)]
    spines = [{"name": f"spine-{pool}{s}",
               "leaves": [leaf["name"] for leaf in leaves[s * per_spine:(s + 1) * per_spine]]}
              for s in range(count // per_spine)]
    return {"leaves": leaves, "spines": spines}


def parse(raw: dict[str, Any], **pools: dict[str, Any]) -> ClusterConfig:
    """``raw`` with ``pools[i].topology`` set for each ``p<i>=...``."""
    edited = copy.deepcopy(raw)
    for key, topology in pools.items():
        edited["pools"][int(key[1:])]["topology"] = topology
    return parse_config(edited, "Pulumi.test.yaml")


def problems(raw: dict[str, Any], **pools: dict[str, Any]) -> str:
    with pytest.raises(ConfigError) as caught:
        parse(raw, **pools)
    return str(caught.value)


# ------------------------------------------------------------------ what a gang gets, by table


@pytest.mark.parametrize(("workers", "gpus_per_worker", "gpus_per_node", "nodes"), [
    (1, 8, 8, 1), (4, 8, 8, 4), (4, 4, 8, 2), (5, 4, 8, 3), (3, 1, 8, 1), (16, 2, 8, 4), (2, 8, 4, 2),
])
def test_nodes_a_gang_fills(workers: int, gpus_per_worker: int, gpus_per_node: int, nodes: int) -> None:
    assert nodes_for(workers, gpus_per_worker, gpus_per_node) == nodes


@pytest.mark.parametrize(("leaf_size", "per_spine", "nodes", "tier", "fewest"), [
    (32, 2, 1, LEAF_TIER, 1),
    (32, 2, 32, LEAF_TIER, 1),      # exactly one leaf
    (32, 2, 33, SPINE_TIER, 2),     # one node more: two leaves under one spine
    (32, 2, 64, SPINE_TIER, 2),     # a whole spine
    (32, 2, 65, None, 3),           # no spine holds it: no constraint it could never meet
    (16, 4, 64, SPINE_TIER, 4),
    (64, 1, 64, LEAF_TIER, 1),
    (64, 1, 65, None, 2),           # a spine of one leaf holds no more than that leaf
    (128, 1, 128, LEAF_TIER, 1),
])
def test_the_tier_a_gang_gets_for_its_size(leaf_size: int, per_spine: int, nodes: int, tier: int | None,
                                           fewest: int) -> None:
    topology = parse(PROD, p0=prod_topology(leaf_size=leaf_size, per_spine=per_spine)).pools[0].topology
    assert topology is not None
    assert gang_tier(topology, nodes) == tier
    assert fewest_leaves(topology, nodes) == fewest


def test_uneven_leaves_size_by_the_largest() -> None:
    topology = PoolTopology.model_validate({
        "leaves": [{"name": "small", "nodes": ["n-[1-4]"]}, {"name": "big", "nodes": ["n-[5-14]"]}],
        "spines": [{"name": "s", "leaves": ["small", "big"]}]})
    assert [gang_tier(topology, n) for n in (4, 10, 11, 14, 15)] == [LEAF_TIER, LEAF_TIER, SPINE_TIER, SPINE_TIER,
                                                                      None]
    assert fewest_leaves(topology, 11) == 2 and fewest_leaves(topology, 10) == 1


def test_a_pool_without_topology_is_flat_and_the_mode_defaults_to_soft() -> None:
    cfg = parse_config(LOCAL, "Pulumi.local.yaml")
    assert all(p.topology is None for p in cfg.pools)
    assert cfg.scheduling.topology_mode == "soft"


def test_label_leaves_size_by_their_counts() -> None:
    leaves = [{"name": "leaf-l1", "labelValue": "SW_17", "nodeCount": 3}, {"name": "leaf-l2", "nodeCount": 1}]
    topology = parse(LOCAL, p0=local_topology(leafLabel="example.com/ib-leaf", leaves=leaves)).pools[0].topology
    assert topology is not None and topology.by_label
    assert topology.leaf_sizes() == {"leaf-l1": 3, "leaf-l2": 1}
    assert topology.leaves[1].selector_value == "leaf-l2" and topology.leaf_of() == {}
    assert gang_tier(topology, 3) == LEAF_TIER and gang_tier(topology, 4) == SPINE_TIER


# ------------------------------------------------------------------ validation, by table: each message and its key

L1, L2 = {"name": "leaf-l1", "nodes": ["gpu-local-[01-02]"]}, {"name": "leaf-l2", "nodes": ["gpu-local-[03-04]"]}
SPINE = {"name": "spine-l1", "leaves": ["leaf-l1", "leaf-l2"]}
LABELLED = {"leafLabel": "example.com/ib-leaf"}


@pytest.mark.parametrize(("topology", "expect"), [
    (local_topology(leaves=[L1, {"name": "leaf-l2", "nodes": ["gpu-local-[02-04]"]}]),
     ("pools[0].topology.leaves[1].nodes: nodes already under a leaf: gpu-local-02 (leaf 'leaf-l1')",)),
    (local_topology(leaves=[L1, {"name": "leaf-l2", "nodes": ["gpu-local-[03-05]"]}]),
     ("pools[0].topology.leaves[1].nodes: not nodes of pool 'local-gpu': gpu-local-05",)),
    (local_topology(leaves=[L1, {"name": "leaf-l2", "nodes": ["gpu-local-03"]}]),
     ("pools[0].topology.leaves: 1 node(s) of pool 'local-gpu' hang off no leaf: gpu-local-04",)),
    (local_topology(leaves=[L1, {"name": "leaf-l2"}]), ("pools[0].topology.leaves[1].nodes: is required",)),
    (local_topology(leaves=[L1, {**L2, "name": "Leaf_2"}]), ("pools[0].topology.leaves[1].name", "DNS-1123 label")),
    (local_topology(leaves=[L1, {**L2, "name": "leaf-l1"}]),
     ("pools[0].topology.leaves[1].name: duplicate leaf name",)),
    (local_topology(leaves=[L1, {**L2, "nodes": ["gpu-local-[04-03]"]}]),
     ("pools[0].topology.leaves[1].nodes", "runs backwards")),
    (local_topology(spines=[SPINE, {"name": "spine-l2", "leaves": ["leaf-l2"]}]),
     ("pools[0].topology.spines[1].leaves: leaf 'leaf-l2' is already under spine 'spine-l1'",)),
    (local_topology(spines=[{"name": "spine-l1", "leaves": ["leaf-l1"]}]),
     ("pools[0].topology.spines: leaves under no spine: leaf-l2",)),
    (local_topology(spines=[{"name": "spine-l1", "leaves": ["leaf-l1", "leaf-l2", "leaf-x"]}]),
     ("pools[0].topology.spines[0].leaves: no leaf 'leaf-x' in this pool's topology.leaves",)),
    (local_topology(spines=[]), ("pools[0].topology.spines",)),
    (local_topology(spines=[{"name": "leaf-l1", "leaves": ["leaf-l1", "leaf-l2"]}]),
     ("pools[0].topology.spines[0].name: is also a leaf's name",)),
    (local_topology(spines=[SPINE, {"name": "spine-l1", "leaves": ["leaf-l1"]}]),
     ("pools[0].topology.spines[1].name: duplicate spine name",)),
    (local_topology(leaves=[{**L1, "nodeCount": 2}, L2]),
     ("pools[0].topology.leaves[0].nodeCount: applies only with topology.leafLabel",)),
    (local_topology(**LABELLED, leaves=[{**L1, "nodeCount": 2}, {"name": "leaf-l2", "nodeCount": 2}]),
     ("pools[0].topology.leaves[0].nodes: leaves take their nodes by leafLabel here",)),
    (local_topology(**LABELLED, leaves=[{"name": "leaf-l1", "nodeCount": 2}, {"name": "leaf-l2"}]),
     ("pools[0].topology.leaves[1].nodeCount: is required with leafLabel",)),
    (local_topology(**LABELLED, leaves=[{"name": "leaf-l1", "nodeCount": 2}, {"name": "leaf-l2", "nodeCount": 1}]),
     ("pools[0].topology.leaves: the leaves' nodeCount add up to 3, but pool 'local-gpu' has 4 nodes",)),
    (local_topology(**LABELLED, leaves=[{"name": "leaf-l1", "labelValue": "x", "nodeCount": 2},
                                        {"name": "leaf-l2", "labelValue": "x", "nodeCount": 2}]),
     ("pools[0].topology.leaves[1].labelValue: another leaf selects the same label value",)),
    (local_topology(leafLabel="bad key!"), ("pools[0].topology.leafLabel", "not a qualified name")),
    (local_topology(**LABELLED, leaves=[{"name": "leaf-l1", "labelValue": "no spaces", "nodeCount": 4}],
                    spines=[{"name": "spine-l1", "leaves": ["leaf-l1"]}]),
     ("pools[0].topology.leaves[0].labelValue", "valid label value")),
    (local_topology(leaves=[]), ("pools[0].topology.leaves",)),
    (local_topology(switches=3), ("pools[0].topology.switches: unknown key",)),
])
def test_a_broken_topology_is_refused_naming_its_key(topology: dict[str, Any], expect: tuple[str, ...]) -> None:
    message = problems(LOCAL, p0=topology)
    for fragment in expect:
        assert fragment in message, message


def test_switch_names_are_unique_across_the_stack() -> None:
    other = prod_topology("b")
    other["leaves"][0]["name"] = "leaf-a0"
    other["spines"][0] = {"name": "spine-a0", "leaves": ["leaf-a0", "leaf-b1"]}
    message = problems(PROD, p0=prod_topology("a"), p1=other)
    assert ("pools[1].topology.leaves[0].name: switch name already used by pools[0].topology.leaves[0]; leaf and "
            "spine names are unique across the stack") in message
    assert "pools[1].topology.spines[0].name: switch name already used by pools[0].topology.spines[0]" in message


def test_topology_needs_volcano() -> None:
    raw = copy.deepcopy(LOCAL) | {"kubernetesVersion": "1.24", "scheduling": {"engine": "kube-batch", "install": False}}
    assert "pools[0].topology: needs scheduling.engine 'volcano'" in problems(raw, p0=local_topology())


def test_the_mode_is_soft_or_hard() -> None:
    raw = copy.deepcopy(LOCAL)
    raw["scheduling"] = {**raw["scheduling"], "topologyMode": "strict"}
    with pytest.raises(ConfigError, match=r"scheduling\.topologyMode"):
        parse_config(raw, "Pulumi.local.yaml")
    raw["scheduling"]["topologyMode"] = "hard"
    assert parse_config(raw, "Pulumi.local.yaml").scheduling.topology_mode == "hard"


# ------------------------------------------------------------------ the parser, by property


@st.composite
def fabrics(draw: st.DrawFn) -> tuple[int, list[int], list[int]]:
    """A pool of N nodes cut into consecutive leaves of drawn sizes, the leaves grouped into spines in order."""
    sizes = draw(st.lists(st.integers(1, 9), min_size=1, max_size=8))
    groups: list[int] = []
    left = len(sizes)
    while left:
        take = draw(st.integers(1, left))
        groups.append(take)
        left -= take
    return sum(sizes), sizes, groups


def fabric_topology(sizes: list[int], groups: list[int]) -> dict[str, Any]:
    leaves, start = [], 1
    for index, size in enumerate(sizes):
        leaves.append({"name": f"leaf-{index}", "nodes": [f"gpu-local-[{start:03d}-{start + size - 1:03d}]"]})
        start += size
    spines, first = [], 0
    for index, count in enumerate(groups):
        spines.append({"name": f"spine-{index}", "leaves": [f"leaf-{i}" for i in range(first, first + count)]})
        first += count
    return {"leaves": leaves, "spines": spines}


def with_pool_of(nodes: int) -> dict[str, Any]:
    raw = copy.deepcopy(LOCAL)
    raw["pools"][0]["nodes"] = [f"gpu-local-[001-{nodes:03d}]"]
    raw["training"] = {"jobs": []}
    raw["inference"] = {**raw["inference"], "services": []}
    return raw


@settings(max_examples=60, deadline=None)
@given(fabrics())
def test_every_drawn_fabric_parses_and_places_each_node_under_one_leaf_and_spine(
        fabric: tuple[int, list[int], list[int]]) -> None:
    nodes, sizes, groups = fabric
    cfg = parse(with_pool_of(nodes), p0=fabric_topology(sizes, groups))
    topology = cfg.pools[0].topology
    assert topology is not None
    assert sorted(topology.leaf_of()) == sorted(cfg.pools[0].node_names)
    assert set(topology.spine_of()) == {leaf.name for leaf in topology.leaves}
    assert sum(topology.spine_sizes().values()) == nodes
    tiers = [gang_tier(topology, n) for n in range(1, nodes + 2)]
    # The tier never goes down as a gang grows, a gang of one leaf's size stays in a leaf, none is beyond all.
    order = {LEAF_TIER: 0, SPINE_TIER: 1, None: 2}
    assert [order[t] for t in tiers] == sorted(order[t] for t in tiers)
    assert tiers[max(sizes) - 1] == LEAF_TIER and tiers[-1] is None
    assert all(fewest_leaves(topology, n) <= len(sizes) for n in range(1, nodes + 1))
    # The node-pool agent labels each node with exactly that leaf and the spine above it.
    settings = settings_from_config(cfg)
    spine_of = topology.spine_of()
    for node, leaf in topology.leaf_of().items():
        labels = settings.membership()[node].labels_for({"metadata": {"name": node, "labels": {}}})
        assert (labels[leaf_label_key(cfg.label_prefix)], labels[spine_label_key(cfg.label_prefix)]) == (
            leaf, spine_of[leaf])


@settings(max_examples=60, deadline=None)
@given(fabrics(), st.data())
def test_a_node_dropped_from_or_doubled_in_a_drawn_fabric_is_named(fabric: tuple[int, list[int], list[int]],
                                                                   data: st.DataObject) -> None:
    nodes, sizes, groups = fabric
    topology = fabric_topology(sizes, groups)
    victim = data.draw(st.integers(1, nodes))
    if data.draw(st.booleans()):
        raw = with_pool_of(nodes + 1)  # one node more than the leaves name
        expect = f"hang off no leaf: gpu-local-{nodes + 1:03d}"
    else:
        raw = with_pool_of(nodes)
        last = len(sizes) - 1  # named again by the last leaf: an earlier leaf (or the last one) has it already
        topology["leaves"][last]["nodes"].append(f"gpu-local-{victim:03d}")
        expect = f"pools[0].topology.leaves[{last}].nodes: nodes already under a leaf: gpu-local-{victim:03d}"
    assert expect in problems(raw, p0=topology)


_values = st.recursive(st.none() | st.booleans() | st.integers(-3, 70) | st.text("leafspin-[]0123x_", max_size=12),
                       lambda inner: st.lists(inner, max_size=3)
                       | st.dictionaries(st.sampled_from(["name", "nodes", "leaves", "spines", "leafLabel",
                                                          "labelValue", "nodeCount"]), inner, max_size=4),
                       max_leaves=10)


@settings(max_examples=150, deadline=None)
@given(_values)
def test_any_topology_value_parses_or_is_refused_cleanly(value: Any) -> None:
    """Whatever the stack file holds under a topology key, the loader answers with config or a ConfigError."""
    try:
        parse(LOCAL, p0=value)
    except ConfigError as error:
        assert "pools[0].topology" in str(error)
