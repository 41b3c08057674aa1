"""Edge cases of the burst controller's decision core, written from the design text (issue 16, items 1-9).

Each test is a table row or a short scenario in simulated time; the view is fed API-shaped objects where the
behaviour starts in what the view reports (taint copies, eligibility, gangs that can never fit).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agents.burst_controller.contract import GANG_ANNOTATION, BurstSettings, Cover, HandoverTunables, SettingsError
from agents.burst_controller.decide import (
    ActionKind,
    BurstState,
    Decision,
    Mode,
    PodRef,
    PoolGpus,
    ServiceReplicas,
    Snapshot,
    VirtualNode,
    decide,
    plan_standby,
)
from agents.burst_controller.view import ClusterView
from fakes.burst_objects import gpu_pod, onprem_node, virtual_node

S = BurstSettings(
    open_below_free_gpus=1,
    close_at_free_gpus=4,
    open_hold_seconds=60,
    close_hold_seconds=20,
    pending_grace_seconds=30,
    handover=HandoverTunables(timeout_seconds=60),
    handover_services={"svc": 2},
)
NOW = 100_000.0
TICK = 5.0
OPEN = BurstState(Mode.OPEN, changed_at=1000.0, last_now=NOW - TICK)
CLOSED = BurstState(Mode.CLOSED, changed_at=1000.0, last_now=NOW - TICK)


def service(
    live: int = 4, onprem: Mapping[str, int] | None = None, external: int = 0, standby: int = 0,
    standby_ready: int | None = None, minimum: int = 2,
) -> ServiceReplicas:
    onprem = {} if onprem is None else dict(onprem)
    return ServiceReplicas(
        min_replicas=minimum, main_live=live, main_ready=sum(onprem.values()) + external,
        main_ready_external=external, main_ready_onprem=onprem, standby_live=standby,
        standby_ready=standby if standby_ready is None else standby_ready,
    )


def kinds(decision: Decision, kind: ActionKind) -> list[str]:
    return [a.pod or a.node or a.service for a in decision.actions if a.kind is kind]


def run(snapshots: Mapping[float, Snapshot] | Snapshot, state: BurstState, start: float, end: float,
        settings: BurstSettings = S) -> list[tuple[float, Decision]]:
    """Decide every tick from `start` to `end` (inclusive) on the same cluster, as the shell's loop does."""
    out: list[tuple[float, Decision]] = []
    t = start
    while t <= end:
        snapshot = snapshots if isinstance(snapshots, Snapshot) else snapshots[t]
        decision = decide(replace(snapshot, observed_at=t), state, t, settings)
        out.append((t, decision))
        state = decision.state
        t += TICK
    return out


def first(decisions: list[tuple[float, Decision]], kind: ActionKind) -> float | None:
    return next((t for t, d in decisions if any(a.kind is kind for a in d.actions)), None)


# -- 1. cover: minimum closes on the standby that was actually scaled -------------------------------------------


def test_cover_minimum_close_waits_for_the_minimum_not_the_current_count() -> None:
    minimum = S.replace(handover=S.handover.replace(cover=Cover.MINIMUM))
    # Open, the close condition held: 4 external replicas (minReplicas 2) go home when the burst closes.
    snapshot = Snapshot(
        synced=True, observed_at=NOW, onprem_allocatable_gpus=64, onprem_free_gpus=32,
        virtual_nodes={"vk": VirtualNode("vk", "cloud", None, 4)},
        services={"svc": service(external=4, standby=2)},
    )
    decision = decide(snapshot, replace(OPEN, close_since=NOW - 20), NOW, minimum)
    assert decision.standby == {"svc": 2}  # what was scaled: the minimum
    assert decision.flipped is Mode.CLOSED  # and it is ready: no wait for the handover timeout
    assert not any("closing anyway" in r or "waits" in r for r in decision.reasons)


def test_cover_has_no_default_in_the_planner() -> None:
    snapshot = Snapshot(True, NOW, 64, 32, services={"svc": service(external=4)})
    with pytest.raises(TypeError):
        plan_standby(snapshot, True)  # type: ignore[call-arg]


# -- 2. a gang waits only for the handover it needs ------------------------------------------------------------


def two_gangs(standby_ready: int) -> Snapshot:
    """Gang A (pool a) displaces svc's on-prem replicas; gang B (pool b) displaces nobody."""
    a = tuple(PodRef("training", f"a-{i}") for i in range(2))
    b = tuple(PodRef("training", f"b-{i}") for i in range(2))
    return Snapshot(
        synced=True, observed_at=NOW, onprem_allocatable_gpus=64, onprem_free_gpus=0,
        pending_training_gpus=32, virtual_nodes={"vk": VirtualNode("vk", "cloud", None, 0)},
        pools={"a": PoolGpus(0, 16), "b": PoolGpus(0, 16)},
        services={"svc": service(onprem={"a": 4}, standby=4, standby_ready=standby_ready)},
        unplaced_training={"a": 16, "b": 16}, gated_pods=a + b,
        gated_pool={**{r: "a" for r in a}, **{r: "b" for r in b}},
    )


def test_gang_displacing_no_inference_is_released_while_another_pool_hands_over() -> None:
    decision = decide(two_gangs(standby_ready=0), OPEN, NOW, S)
    assert sorted(kinds(decision, ActionKind.UNGATE)) == ["b-0", "b-1"]
    ready = decide(two_gangs(standby_ready=4), decision.state, NOW + TICK, S)
    assert sorted(kinds(ready, ActionKind.UNGATE)) == ["a-0", "a-1", "b-0", "b-1"]


def test_view_reports_the_pool_each_gated_pod_targets() -> None:
    view = ClusterView.from_lists(
        [onprem_node("n1", pool="a"), onprem_node("n2", pool="b")],
        [gpu_pod("g-a", 8, workload="training", namespace="training", pool="a", gated=True),
         gpu_pod("g-any", 8, workload="training", namespace="training", gated=True)],
        S, NOW,
    )
    assert view.snapshot().gated_pool == {PodRef("training", "g-a"): "a", PodRef("training", "g-any"): ""}


# -- 3. no NoExecute copy of the burst taint survives ----------------------------------------------------------


@pytest.mark.parametrize("effects", [["NoExecute"], ["NoSchedule", "NoExecute"], ["NoExecute", "NoSchedule"],
                                     ["NoSchedule", "PreferNoSchedule"]])
def test_every_copy_of_the_burst_taint_but_one_noschedule_is_repaired(effects: list[str]) -> None:
    node = virtual_node("vk", burst_effect=None)
    node["spec"]["taints"] += [{"key": S.taint_key, "value": S.taint_value, "effect": e} for e in effects]
    view = ClusterView.from_lists([onprem_node("n1"), node], [], S, NOW)
    decision = decide(view.snapshot(), CLOSED, NOW, S)
    assert kinds(decision, ActionKind.CLOSE_NODE) == ["vk"]


@given(st.lists(st.sampled_from(["NoSchedule", "NoExecute", "PreferNoSchedule", "", "bogus"]), max_size=4))
def test_any_taint_list_for_our_key_reads_as_a_mismatch_unless_one_noschedule(effects: list[str]) -> None:
    """Property over the taints a node may carry for our key: closed mode rewrites the node unless it holds exactly
    one NoSchedule copy; open mode reopens it whenever any copy is there."""
    node = virtual_node("vk", burst_effect=None)
    node["spec"]["taints"] += [{"key": S.taint_key, "value": S.taint_value, "effect": e} for e in effects]
    snapshot = ClusterView.from_lists([onprem_node("n1"), node], [], S, NOW).snapshot()
    repaired = kinds(decide(snapshot, CLOSED, NOW, S), ActionKind.CLOSE_NODE)
    assert repaired == ([] if effects == ["NoSchedule"] else ["vk"])
    assert kinds(decide(snapshot, OPEN, NOW, S), ActionKind.OPEN_NODE) == (["vk"] if effects else [])


def test_a_single_noschedule_copy_is_left_alone() -> None:
    view = ClusterView.from_lists([onprem_node("n1"), virtual_node("vk")], [], S, NOW)
    assert decide(view.snapshot(), CLOSED, NOW, S).actions == ()


# -- 4. clock skew never freezes the controller ----------------------------------------------------------------


def exhausted() -> Snapshot:
    return Snapshot(
        synced=True, observed_at=NOW, onprem_allocatable_gpus=64, onprem_free_gpus=0, pending_inference_gpus=2,
        virtual_nodes={"vk": VirtualNode("vk", "cloud", "NoSchedule", 0)},
    )


@pytest.mark.parametrize("skew", [600.0, 86_400.0])
def test_a_flip_stamped_in_the_future_does_not_blind_the_controller(skew: float) -> None:
    # A previous leader with a fast clock stamped the last flip `skew` seconds ahead of ours.
    state = BurstState(Mode.CLOSED, changed_at=NOW + skew, last_now=None)
    opened = first(run(exhausted(), state, NOW, NOW + 120), ActionKind.OPEN_NODE)
    assert opened is not None and opened <= NOW + S.pending_grace_seconds + TICK


def test_a_clock_stepped_back_does_not_blind_the_controller() -> None:
    # Our own clock ran an hour ahead, flipped, then was stepped back.
    state = BurstState(Mode.CLOSED, changed_at=NOW + 3600, last_now=NOW + 3600)
    opened = first(run(exhausted(), state, NOW, NOW + 120), ActionKind.OPEN_NODE)
    assert opened is not None and opened <= NOW + S.pending_grace_seconds + 2 * TICK


def gated_waiting(gated_at: float | None) -> Snapshot:
    gang = PodRef("training", "w-0")
    return Snapshot(
        synced=True, observed_at=NOW, onprem_allocatable_gpus=64, onprem_free_gpus=0, pending_training_gpus=8,
        virtual_nodes={"vk": VirtualNode("vk", "cloud", None, 0)}, pools={"a": PoolGpus(0, 8)},
        services={"svc": service(onprem={"a": 4}, standby=4, standby_ready=0)},
        unplaced_training={"a": 8}, gated_pods=(gang,), gated_pool={gang: "a"},
        gated_at={} if gated_at is None else {gang: gated_at},
    )


@pytest.mark.parametrize("created", [NOW + 3600, NOW + 86_400])
def test_gated_training_is_released_at_its_timeout_despite_a_future_creation_stamp(created: float) -> None:
    released = first(run(gated_waiting(created), OPEN, NOW, NOW + 180), ActionKind.UNGATE)
    assert released is not None and NOW + S.handover.timeout_seconds <= released <= NOW + 60 + TICK


def test_gated_training_is_released_at_its_timeout_across_a_clock_step_back() -> None:
    before = run(gated_waiting(None), OPEN, NOW, NOW + 30)
    state = before[-1][1].state
    assert first(before, ActionKind.UNGATE) is None
    # The clock steps back 10 minutes; the pod has waited 30 s and must go 30 s later on the new clock.
    after = run(gated_waiting(None), state, NOW - 600 + TICK, NOW - 600 + 120)
    released = first(after, ActionKind.UNGATE)
    assert released is not None and released <= NOW - 600 + TICK + 30 + TICK


# -- 5. "no nodes listed" is not "no node eligible" ------------------------------------------------------------


@pytest.mark.parametrize("why", ["thermal", "cordoned", "not_ready"])
def test_burst_opens_when_every_listed_gpu_node_is_ineligible(why: str) -> None:
    nodes = [onprem_node(f"n{i}", thermal=why == "thermal", unschedulable=why == "cordoned",
                         ready=why != "not_ready") for i in range(4)]
    view = ClusterView.from_lists([*nodes, virtual_node("vk")], [gpu_pod("inf-0", 1, unschedulable=True)], S, NOW)
    snapshot = view.snapshot()
    assert snapshot.onprem_allocatable_gpus == 0 and snapshot.onprem_gpu_nodes == 4
    opened = first(run(snapshot, CLOSED, NOW, NOW + 60), ActionKind.OPEN_NODE)
    assert opened is not None and opened <= NOW + S.pending_grace_seconds + TICK


def test_no_gpu_node_listed_at_all_leaves_the_taints() -> None:
    view = ClusterView.from_lists([virtual_node("vk")], [gpu_pod("inf-0", 1, unschedulable=True)], S, NOW)
    decisions = run(view.snapshot(), CLOSED, NOW, NOW + 120)
    assert all(d.actions == () for _, d in decisions)
    assert "no on-prem GPU node listed" in decisions[-1][1].reasons[0]


# -- 6. training that can never fit holds nothing open ---------------------------------------------------------


def pool_a(nodes: int = 4) -> list[dict[str, object]]:
    return [onprem_node(f"a{i}", 8, pool="a") for i in range(nodes)] + [virtual_node("vk", burst_effect=None)]


def worker(name: str, gpus: int, gang: str, *, pool: str | None = "a", gated: bool = False) -> dict[str, object]:
    pod = gpu_pod(name, gpus, workload="training", namespace="training", pool=pool, unschedulable=not gated,
                  gated=gated)
    pod["metadata"]["annotations"][GANG_ANNOTATION] = gang
    return pod


@pytest.mark.parametrize(
    ("pods", "why"),
    [
        ([worker(f"big-{i}", 8, "big") for i in range(5)], "gang needs 40 GPUs, pool a has 32"),
        ([worker("wide-0", 16, "wide")], "a pod asks for 16 GPUs, the largest node in pool a has 8"),
        ([worker(f"any-{i}", 8, "any", pool=None) for i in range(5)], "gang needs 40 GPUs, the on-prem pools have 32"),
    ],
    ids=["gang-larger-than-pool", "pod-larger-than-any-node", "poolless-gang-larger-than-cluster"],
)
def test_training_that_can_never_fit_neither_holds_the_burst_open_nor_counts(pods: list[dict[str, object]],
                                                                             why: str) -> None:
    view = ClusterView.from_lists(pool_a(), pods, S, NOW)
    snapshot = view.snapshot()
    assert snapshot.pending_training_gpus == 0 and snapshot.unplaced_training == {}
    assert [g.reason for g in snapshot.infeasible] == [why]
    # The burst is open with every on-prem GPU free: it closes after its hold, the hopeless gang holds nothing.
    closed = first(run(snapshot, OPEN, NOW, NOW + 60), ActionKind.CLOSE_NODE)
    assert closed is not None


def test_hopeless_gated_gang_keeps_no_standby_and_is_released() -> None:
    services = [gpu_pod(f"svc-{i}", 1, node=f"a{i}", service="svc", namespace="inference") for i in range(4)]
    gang = [worker(f"big-{i}", 8, "big", gated=True) for i in range(5)]
    view = ClusterView.from_lists(pool_a(), services + gang, S, NOW)
    decision = decide(view.snapshot(), OPEN, NOW, S)
    assert decision.standby == {}
    assert sorted(kinds(decision, ActionKind.UNGATE)) == [f"big-{i}" for i in range(5)]


def test_a_gang_that_fits_still_counts() -> None:
    view = ClusterView.from_lists(pool_a(), [worker(f"ok-{i}", 8, "ok") for i in range(4)], S, NOW)
    snapshot = view.snapshot()
    assert snapshot.pending_training_gpus == 32 and snapshot.infeasible == ()


# -- 7. gangs without a pool are judged node by node -----------------------------------------------------------


def test_poolless_gang_does_not_fit_free_gpus_scattered_two_per_node() -> None:
    nodes = [onprem_node(f"n{i}", 8, pool="a") for i in range(8)] + [virtual_node("vk", burst_effect=None)]
    # Six GPUs of each node are taken (inference of svc on two of them), two are free on each: 16 free in all.
    pods = [gpu_pod(f"busy-{i}", 6, node=f"n{i}", workload="training", namespace="training") for i in range(6)]
    pods += [gpu_pod(f"svc-{i}-{j}", 3, node=f"n{i}", service="svc", namespace="inference")
             for i in (6, 7) for j in range(2)]
    pods += [worker(f"w-{i}", 8, "g", pool=None, gated=True) for i in range(2)]
    view = ClusterView.from_lists(nodes, pods, S, NOW)
    snapshot = view.snapshot()
    assert snapshot.onprem_free_gpus == 16 and snapshot.unplaced_training == {"": 16}
    decision = decide(snapshot, OPEN, NOW, S)
    assert decision.standby == {"svc": 4}
    assert kinds(decision, ActionKind.UNGATE) == []


# -- 8. inconsistent inputs never close the burst --------------------------------------------------------------


def open_with_hold_met(**changes: object) -> Snapshot:
    base = Snapshot(
        synced=True, observed_at=NOW, onprem_allocatable_gpus=64, onprem_free_gpus=40,
        virtual_nodes={"vk": VirtualNode("vk", "cloud", None, 0)},
    )
    return replace(base, **changes)  # type: ignore[arg-type]


def test_consistent_inputs_close() -> None:
    decision = decide(open_with_hold_met(), replace(OPEN, close_since=NOW - 60), NOW, S)
    assert decision.flipped is Mode.CLOSED


@pytest.mark.parametrize(
    "changes",
    [
        {"onprem_free_gpus": 100},  # more free than allocatable
        {"onprem_free_gpus": -5},
        {"pending_inference_gpus": -1},
        {"pending_training_gpus": -8},
        {"standby_external_gpus": 30},  # more standby GPUs than GPUs in use externally: negative close need
        {"virtual_nodes": {"vk": VirtualNode("vk", "cloud", None, -20)}},
        {"pools": {"a": PoolGpus(-3, 0)}},
    ],
    ids=["free-above-allocatable", "negative-free", "negative-pending-inference", "negative-pending-training",
         "negative-close-need", "negative-external", "negative-pool-free"],
)
def test_inconsistent_inputs_never_close(changes: dict[str, object]) -> None:
    for state in (replace(OPEN, close_since=NOW - 600), CLOSED):
        decision = decide(open_with_hold_met(**changes), state, NOW, S)
        assert decision.flipped is None
        assert kinds(decision, ActionKind.CLOSE_NODE) == []
        assert any(r.startswith("inputs inconsistent") for r in decision.reasons)


# -- 9. settings: the tick is shorter than the staleness limit, both bounded ----------------------------------


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"watch_timeout_seconds": 10, "stale_after_seconds": 30, "tick_seconds": 30},
         "tick_seconds: must be below stale_after_seconds (30)"),
        ({"tick_seconds": 61}, "tick_seconds: must be at most 60"),
        ({"stale_after_seconds": 901}, "stale_after_seconds: must be at most 900"),
    ],
)
def test_tick_and_staleness_are_bounded(data: dict[str, object], message: str) -> None:
    with pytest.raises(SettingsError) as err:
        BurstSettings.from_mapping(data, source="settings.yaml")
    assert str(err.value).startswith(f"settings.yaml: {message}")
