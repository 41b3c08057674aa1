"""The handover standby sized to what waiting training displaces, and capped while replicas return home.

Decision tables for `displaced_gpus` (GPUs a gang must reclaim, node by node) and for `plan_standby` under
`Sizing.DISPLACED` and `return_batch`; the settings and stack config that carry both; the view's GPUs per
replica.
"""

from __future__ import annotations

from collections.abc import Mapping

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agents.burst_controller.contract import BurstSettings, Cover, HandoverTunables, SettingsError, Sizing
from agents.burst_controller.decide import (
    ActionKind,
    BurstState,
    Mode,
    PodRef,
    PoolGpus,
    ServiceReplicas,
    Snapshot,
    VirtualNode,
    decide,
    displaced_gpus,
    plan_standby,
)
from agents.burst_controller.view import ClusterView
from components import burst_controller as burst_component
from components.config import parse_config
from components.mockrt import raw_from_stack
from fakes.burst_objects import gpu_pod, onprem_node, virtual_node

NOW = 10_000.0
GANG = (PodRef("training", "gang-0"),)


def pool(free: int, free_nodes: Mapping[int, int] | None = None, pods: Mapping[int, int] | None = None) -> PoolGpus:
    return PoolGpus(free=free, pending_training=0, free_nodes=dict(free_nodes or {}), unplaced_pods=dict(pods or {}))


# id, unplaced training GPUs, the pool (None: no entry), GPUs displaced
DISPLACED_TABLE = [
    ("fits-whole-nodes", 16, pool(16, {8: 2}, {8: 2}), 0),
    ("small-pods-share-a-node", 8, pool(8, {8: 1}, {4: 2}), 0),
    ("counts-only-short", 32, pool(20), 12),
    ("counts-only-fits", 8, pool(20), 0),
    ("no-pool-entry-takes-all", 24, None, 24),
    ("second-pod-on-the-fullest-partial-node", 16, pool(16, {8: 1, 6: 1, 2: 1}, {8: 2}), 2),
    ("partial-then-nothing-left", 24, pool(13, {8: 1, 5: 1}, {8: 3}), 3 + 8),
    ("fragments-do-not-add-up", 8, pool(8, {4: 2}, {8: 1}), 4),
    ("largest-pods-first", 12, pool(10, {8: 1, 2: 1}, {8: 1, 4: 1}), 2),
]


@pytest.mark.parametrize(("unplaced", "where", "displaced"), [t[1:] for t in DISPLACED_TABLE],
                         ids=[t[0] for t in DISPLACED_TABLE])
def test_displaced_gpus_table(unplaced: int, where: PoolGpus | None, displaced: int) -> None:
    assert displaced_gpus(unplaced, where) == displaced


@given(
    free_nodes=st.dictionaries(st.integers(1, 8), st.integers(1, 6), max_size=8),
    pods=st.dictionaries(st.sampled_from([1, 2, 4, 8]), st.integers(1, 6), min_size=1, max_size=4),
)
def test_displaced_is_zero_exactly_when_training_fits_and_never_exceeds_it(
    free_nodes: dict[int, int], pods: dict[int, int]
) -> None:
    from agents.burst_controller.plans import _fits_free

    unplaced = sum(size * n for size, n in pods.items())
    where = pool(sum(f * n for f, n in free_nodes.items()), free_nodes, pods)
    d = displaced_gpus(unplaced, where)
    assert 0 <= d <= unplaced
    assert (d == 0) == _fits_free(unplaced, where)
    # Free GPUs that no pod can use are never counted as room: what is displaced covers the shortfall.
    assert d >= unplaced - where.free


def service(onprem: Mapping[str, int], external: int = 0, gpus: int = 1, standby: int = 0,
            minimum: int = 2) -> ServiceReplicas:
    ready = sum(onprem.values()) + external
    return ServiceReplicas(min_replicas=minimum, main_live=ready, main_ready=ready, main_ready_external=external,
                           main_ready_onprem=dict(onprem), standby_live=standby, standby_ready=standby,
                           gpus_per_replica=gpus)


def snapshot(services: Mapping[str, ServiceReplicas], pools: Mapping[str, PoolGpus], unplaced: Mapping[str, int],
             poolless: PoolGpus | None = None, free: int | None = None) -> Snapshot:
    return Snapshot(
        synced=True, observed_at=NOW - 1, onprem_allocatable_gpus=256,
        onprem_free_gpus=sum(p.free for p in pools.values()) if free is None else free,
        pending_training_gpus=sum(unplaced.values()),
        virtual_nodes={"vk": VirtualNode("vk", "cloud", "NoSchedule", 0)},
        pools=dict(pools), services=dict(services), unplaced_training=dict(unplaced), gated_pods=GANG,
        poolless=poolless,
    )


# A gang of two 8-GPU pods for pool a, whose free GPUs are one empty node and one with 6 free: it displaces 2.
A_SHORT_BY_2 = {"a": pool(14, {8: 1, 6: 1}, {8: 2})}

# id, services, pools, unplaced training, poolless, sizing, targets
PLAN_TABLE = [
    ("pool-sizing-takes-every-replica", {"web": service({"a": 20})}, A_SHORT_BY_2, {"a": 16}, None, Sizing.POOL,
     {"web": 20}),
    ("displaced-takes-what-the-gang-lacks", {"web": service({"a": 20})}, A_SHORT_BY_2, {"a": 16}, None,
     Sizing.DISPLACED, {"web": 2}),
    ("displaced-per-service-upper-bound", {"web": service({"a": 20}), "chat": service({"a": 3}, gpus=4)},
     A_SHORT_BY_2, {"a": 16}, None, Sizing.DISPLACED, {"web": 2, "chat": 1}),
    ("displaced-never-more-than-the-pool-holds", {"web": service({"a": 1}, minimum=1)}, {"a": pool(0)},
     {"a": 32}, None, Sizing.DISPLACED, {"web": 1}),
    ("other-pool-untouched", {"web": service({"a": 20, "b": 30})}, A_SHORT_BY_2 | {"b": pool(8)}, {"a": 16},
     None, Sizing.DISPLACED, {"web": 2}),
    ("gang-that-fits-displaces-nobody", {"web": service({"a": 20})}, {"a": pool(16, {8: 2}, {8: 2})}, {"a": 16},
     None, Sizing.DISPLACED, {}),
    ("poolless-training-over-every-pool", {"web": service({"a": 5, "b": 5})}, {"a": pool(4), "b": pool(4)},
     {"": 16}, pool(8, {4: 2}, {8: 2}), Sizing.DISPLACED, {"web": 4 + 4}),
]


@pytest.mark.parametrize(("services", "pools", "unplaced", "poolless", "sizing", "targets"),
                         [t[1:] for t in PLAN_TABLE], ids=[t[0] for t in PLAN_TABLE])
def test_plan_standby_sizing_table(services: Mapping[str, ServiceReplicas], pools: Mapping[str, PoolGpus],
                                   unplaced: Mapping[str, int], poolless: PoolGpus | None, sizing: Sizing,
                                   targets: Mapping[str, int]) -> None:
    plan = plan_standby(snapshot(services, pools, unplaced, poolless), False, Cover.CURRENT, sizing)
    assert dict(plan.targets) == targets
    assert plan.gang_services == frozenset(targets)


# id, external replicas, return batch, standby wanted while returning
RETURN_TABLE = [
    ("all-external-at-risk", 10, 0, 10),
    ("capped-at-the-batch", 10, 3, 3),
    ("fewer-than-the-batch", 2, 3, 2),
]


@pytest.mark.parametrize(("external", "batch", "target"), [t[1:] for t in RETURN_TABLE],
                         ids=[t[0] for t in RETURN_TABLE])
def test_return_batch_caps_the_returning_standby(external: int, batch: int, target: int) -> None:
    snap = snapshot({"web": service({"a": 4}, external=external)}, {"a": pool(100)}, {})
    assert plan_standby(snap, True, Cover.CURRENT, Sizing.DISPLACED, batch).targets == {"web": target}


def test_decide_scales_the_displaced_standby_and_releases_the_gang_when_it_is_ready() -> None:
    settings = BurstSettings(open_below_free_gpus=1, close_at_free_gpus=4, handover_services={"web": 2},
                             handover=HandoverTunables(sizing=Sizing.DISPLACED))
    assert BurstSettings().handover.sizing is Sizing.POOL  # the default: the whole pool is covered
    closed = BurstState(Mode.CLOSED, changed_at=1000.0, last_now=NOW - 1)
    waiting = decide(snapshot({"web": service({"a": 20})}, A_SHORT_BY_2, {"a": 16}), closed, NOW, settings)
    assert [(a.kind, a.replicas) for a in waiting.actions if a.kind is ActionKind.SET_STANDBY] == [
        (ActionKind.SET_STANDBY, 2)]
    assert not [a for a in waiting.actions if a.kind is ActionKind.UNGATE]
    ready = decide(snapshot({"web": service({"a": 20}, standby=2)}, A_SHORT_BY_2, {"a": 16}), waiting.state,
                   NOW + 5, settings)
    assert [a.pod for a in ready.actions if a.kind is ActionKind.UNGATE] == ["gang-0"]


def test_settings_carry_sizing_and_return_batch() -> None:
    s = BurstSettings.from_mapping({"handover": {"sizing": "pool", "return_batch": 8}})
    assert s.handover.sizing is Sizing.POOL and s.handover.return_batch == 8
    assert BurstSettings.from_mapping(s.to_mapping()) == s
    with pytest.raises(SettingsError, match=r"key 'handover.sizing' must be 'pool' or 'displaced', got 'all'"):
        BurstSettings.from_mapping({"handover": {"sizing": "all"}}, source="cm.yaml")
    with pytest.raises(SettingsError, match=r"handover.return_batch: must be >= 0, got -1"):
        BurstSettings.parse({"handover": {"return_batch": -1}})


def stack_settings(handover: dict[str, object]) -> BurstSettings:
    raw = raw_from_stack("prod")
    burst = dict(raw.get("burst") or {})
    burst["handover"] = handover
    return burst_component.settings_from_config(parse_config({**raw, "burst": burst}, "Pulumi.prod.yaml"))


def test_stack_config_deploys_the_agent_defaults_and_the_chosen_sizing() -> None:
    deployed = stack_settings({})
    assert (deployed.handover.sizing, deployed.handover.return_batch) == (
        BurstSettings().handover.sizing, BurstSettings().handover.return_batch)
    chosen = stack_settings({"sizing": "displaced", "returnBatch": 16})
    assert chosen.handover.sizing is Sizing.DISPLACED and chosen.handover.return_batch == 16


def test_stack_config_refuses_an_unknown_sizing() -> None:
    with pytest.raises(Exception, match=r"burst\.handover\.sizing"):
        stack_settings({"sizing": "everything"})


def test_view_reports_gpus_per_replica_of_the_main_pods() -> None:
    settings = BurstSettings(handover_services={"chat": 1})
    nodes = [onprem_node("n1", 8, pool="a"), virtual_node("vk", gpus=16)]
    pods = [gpu_pod("c1", node="n1", gpus=4, service="chat", namespace="inference"),
            gpu_pod("c2", node="vk", gpus=4, service="chat", namespace="inference")]
    view = ClusterView.from_lists(nodes, pods, settings, NOW)
    assert view.snapshot().services["chat"].gpus_per_replica == 4
    view.apply_pod("DELETED", pods[0])
    view.apply_pod("DELETED", pods[1])
    assert view.snapshot().services["chat"].gpus_per_replica == 1  # no pod: the upper bound
