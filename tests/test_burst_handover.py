"""Make-before-break handover: decision tables for the standby and the training gate, and the view's counts.

A gang waits at the handover gate while the standby on virtual nodes comes up to cover the inference it
will reclaim; closing the burst waits the same way for the replicas the descheduler will move home.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agents.burst_controller.contract import BurstSettings, Cover, HandoverTunables, SettingsError
from agents.burst_controller.decide import (
    Action,
    ActionKind,
    BurstState,
    Decision,
    Mode,
    NodeRoom,
    PodRef,
    PoolGpus,
    ServiceReplicas,
    Snapshot,
    StandbyRoom,
    VirtualNode,
    decide,
    plan_standby,
    standby_room,
)
from agents.burst_controller.plans import plan_clear
from agents.burst_controller.view import ClusterView
from fakes.burst_objects import gpu_pod, onprem_node, virtual_node
from tests.churn import churn

S = BurstSettings(
    open_below_free_gpus=1,
    close_at_free_gpus=4,
    open_hold_seconds=5,
    close_hold_seconds=20,
    pending_grace_seconds=5,
    handover=HandoverTunables(timeout_seconds=60),
    handover_services={"svc": 4},
)
NOW = 10_000.0
GANG = tuple(PodRef("training", f"gang-worker-{i}") for i in range(4))
CLOSED = BurstState(Mode.CLOSED, changed_at=1000.0, last_now=NOW - 1)
OPEN = BurstState(Mode.OPEN, changed_at=1000.0, last_now=NOW - 1)


def svc(
    live: int = 4,
    ready: int | None = None,
    onprem: Mapping[str, int] | None = None,
    external: int = 0,
    standby: int = 0,
    standby_ready: int | None = None,
    minimum: int = 4,
    starting: Mapping[str, int] | None = None,
) -> ServiceReplicas:
    onprem = {"a": live} if onprem is None else onprem
    ready = sum(onprem.values()) + external if ready is None else ready
    return ServiceReplicas(
        min_replicas=minimum,
        main_live=live,
        main_ready=ready,
        main_ready_external=external,
        main_ready_onprem=dict(onprem),
        main_starting_onprem=dict(starting or {}),
        standby_live=standby,
        standby_ready=standby if standby_ready is None else standby_ready,
    )


def snap(
    service: ServiceReplicas | None,
    *,
    free: Mapping[str, int] | None = None,
    unplaced: Mapping[str, int] | None = None,
    gated: tuple[PodRef, ...] = (),
    external_used: int = 0,
    burst: str | None = "NoSchedule",
    pending_inf: int = 0,
) -> Snapshot:
    """Pool `a`: 32 GPUs; `free` per pool; `unplaced` training GPUs per pool (gated or not bound yet)."""
    free = {"a": 28} if free is None else free
    unplaced = unplaced or {}
    return Snapshot(
        synced=True,
        observed_at=NOW - 1,
        onprem_allocatable_gpus=64,
        onprem_free_gpus=sum(free.values()),
        pending_inference_gpus=pending_inf,
        pending_training_gpus=sum(unplaced.values()),
        virtual_nodes={"vk": VirtualNode("vk", "cloud", burst, external_used)},
        pools={p: PoolGpus(free.get(p, 0), unplaced.get(p, 0)) for p in free.keys() | unplaced.keys()},
        services={} if service is None else {"svc": service},
        unplaced_training=unplaced,
        gated_pods=gated,
    )


def kinds(decision: Decision, kind: ActionKind) -> list[Action]:
    return [a for a in decision.actions if a.kind is kind]


def standby_of(decision: Decision) -> int | None:
    found = kinds(decision, ActionKind.SET_STANDBY)
    assert len(found) <= 1
    return found[0].replicas if found else None


# id, snapshot, state, standby replicas set (None: no scale action), gang released
GATE_TABLE = [
    # The gang fits in free GPUs: nothing is reclaimed, so nothing waits.
    ("fits-in-free", snap(svc(), free={"a": 32}, unplaced={"a": 32}, gated=GANG), CLOSED, None, True),
    # The gang needs the GPUs inference holds: standby first, gate stays.
    ("needs-reclaim-scales-standby", snap(svc(), unplaced={"a": 32}, gated=GANG), CLOSED, 4, False),
    # Standby asked for, pods not ready yet: still waiting, no new scale action.
    ("standby-starting", snap(svc(standby=4, standby_ready=2), unplaced={"a": 32}, gated=GANG), CLOSED, None, False),
    ("standby-ready-releases", snap(svc(standby=4), unplaced={"a": 32}, gated=GANG), CLOSED, None, True),
    # The gang is in pool b; inference runs in pool a: not at risk.
    ("other-pool-not-at-risk", snap(svc(), free={"a": 28, "b": 0}, unplaced={"b": 32}, gated=GANG), CLOSED, None,
     True),
    # Released but not bound yet (reclaim in progress): inference is still at risk, the standby stays.
    ("released-not-bound-keeps-standby", snap(svc(standby=4), unplaced={"a": 32}), CLOSED, None, False),
    # Reclaimed: main replicas pending elsewhere; the standby bridges until they are ready.
    ("reclaimed-bridges", snap(svc(ready=0, onprem={}, standby=4), free={"a": 0}), OPEN, None, False),
    ("replacements-half-ready", snap(svc(onprem={}, external=2, standby=4), free={"a": 0}), OPEN, 2, False),
    ("replacements-ready-scale-down", snap(svc(onprem={}, external=4, standby=4), free={"a": 0}), OPEN, 0, False),
    # HPA above the minimum: the standby covers the current count (capacity survives the handover).
    ("hpa-above-min-covers-current", snap(svc(live=10), unplaced={"a": 32}, gated=GANG), CLOSED, 10, False),
    # Part of the service is safe elsewhere: only the shortfall below the goal is covered.
    ("partly-safe", snap(svc(onprem={"a": 2}, external=2), unplaced={"a": 32}, gated=GANG), OPEN, 2, False),
    # Replicas still starting on the pool's nodes (often on GPUs training just freed) are reclaimed as
    # surely as Ready ones: the gate waits for their cover too, and the standby holds them.
    ("starting-onprem-at-risk", snap(svc(onprem={}, external=2, starting={"a": 2}), unplaced={"a": 32},
                                     gated=GANG), OPEN, 2, False),
    ("starting-onprem-covered", snap(svc(onprem={}, external=2, starting={"a": 2}, standby=2), unplaced={"a": 32},
                                     gated=GANG), OPEN, None, True),
    ("starting-other-pool-safe", snap(svc(onprem={}, external=2, starting={"b": 2}), free={"b": 0},
                                      unplaced={"a": 32}, gated=GANG), OPEN, None, True),
    # Nothing at risk and no standby running: no action at all (steady state).
    ("steady", snap(svc()), CLOSED, None, False),
]


@pytest.mark.parametrize(("snapshot", "state", "standby", "released"), [t[1:] for t in GATE_TABLE],
                         ids=[t[0] for t in GATE_TABLE])
def test_gate_and_standby_table(snapshot: Snapshot, state: BurstState, standby: int | None, released: bool) -> None:
    decision = decide(snapshot, state, NOW, S)
    assert standby_of(decision) == standby, decision
    ungated = kinds(decision, ActionKind.UNGATE)
    assert ungated == ([Action(ActionKind.UNGATE, namespace="training", pod=r.name) for r in GANG] if released else [])
    if snapshot.gated_pods:  # first seen now; kept until the pods are no longer gated (a failed patch retries)
        assert decision.state.gated_since == NOW


def test_gate_times_out_because_training_outranks_inference() -> None:
    waiting = snap(svc(standby=4, standby_ready=0), unplaced={"a": 32}, gated=GANG)
    state = replace(CLOSED, gated_seen=dict.fromkeys(GANG, NOW - 59))
    assert kinds(decide(waiting, state, NOW, S), ActionKind.UNGATE) == []
    decision = decide(waiting, replace(CLOSED, gated_seen=dict.fromkeys(GANG, NOW - 60)), NOW, S)
    assert len(kinds(decision, ActionKind.UNGATE)) == 4
    assert any("training outranks inference" in r and "svc standby 0/4 ready" in r for r in decision.reasons)


def test_each_gated_pod_waits_its_own_timeout() -> None:
    # Gang A was gated 60 s ago, gang B 5 s ago; the standby is not ready: only A's pods go.
    a, b = PodRef("training", "a-0"), PodRef("training", "b-0")
    waiting = replace(snap(svc(standby=4, standby_ready=0), unplaced={"a": 64}, gated=(a, b)),
                      gated_at={a: NOW - 60, b: NOW - 5})
    decision = decide(waiting, CLOSED, NOW, S)
    assert kinds(decision, ActionKind.UNGATE) == [Action(ActionKind.UNGATE, namespace="training", pod="a-0")]
    assert decision.state.gated_seen[b] == NOW  # B still waits, counted from its first sight


def test_a_gang_waits_only_for_the_services_it_displaces() -> None:
    # Service "svc" runs on-prem in pool a (the gang's pool); "other" is external and still bridging an earlier
    # handover (standby not ready). The gang waits for svc's standby only.
    other = svc(onprem={}, external=2, standby=2, standby_ready=0, live=4)
    snapshot = replace(snap(svc(standby=4), unplaced={"a": 32}, gated=GANG),
                       services={"svc": svc(standby=4), "other": other})
    decision = decide(snapshot, CLOSED, NOW, S.replace(handover_services={"svc": 4, "other": 4}))
    assert len(kinds(decision, ActionKind.UNGATE)) == 4


def test_gate_released_at_once_without_handover_services() -> None:
    off = S.replace(handover_services={})
    decision = decide(snap(None, unplaced={"a": 32}, gated=GANG), CLOSED, NOW, off)
    assert len(kinds(decision, ActionKind.UNGATE)) == 4
    assert standby_of(decision) is None


def test_gated_demand_opens_the_burst_like_pending_training() -> None:
    # Gated GPUs count as pending training: effective free = 28 - 32 < 1, so the burst opens after its hold.
    snapshot = snap(svc(standby=4, standby_ready=0), unplaced={"a": 32}, gated=GANG)
    first = decide(snapshot, CLOSED, NOW, S)
    assert first.effective_free_gpus == 0 and first.flipped is None
    later = decide(snapshot, first.state, NOW + 5, S)
    assert later.flipped is Mode.OPEN


def close_ready(service: ServiceReplicas) -> tuple[Snapshot, BurstState]:
    """Open, the close condition held for the whole hold: external replicas are about to be sent home."""
    snapshot = snap(service, free={"a": 32}, external_used=4, burst=None)
    return snapshot, replace(OPEN, close_since=NOW - 20)


def test_close_waits_for_standby_then_closes() -> None:
    snapshot, state = close_ready(svc(onprem={}, external=4))
    waiting = decide(snapshot, state, NOW, S)
    assert waiting.flipped is None and waiting.state.mode is Mode.OPEN
    assert standby_of(waiting) == 4
    assert any(r.startswith("close waits for the standby: svc standby 0/4 ready, 4 at risk") for r in waiting.reasons)
    assert waiting.state.close_since == NOW - 20  # the hold is kept: close as soon as the standby is ready
    ready, _ = close_ready(svc(onprem={}, external=4, standby=4))
    closed = decide(ready, waiting.state, NOW + 3, S)
    assert closed.flipped is Mode.CLOSED
    assert kinds(closed, ActionKind.CLOSE_NODE) == [Action(ActionKind.CLOSE_NODE, node="vk")]
    assert standby_of(closed) is None  # still wanted: the replicas are on their way home


def test_close_goes_ahead_after_the_handover_timeout() -> None:
    snapshot, state = close_ready(svc(onprem={}, external=4))
    decision = decide(snapshot, replace(state, close_since=NOW - 20 - 60), NOW, S)
    assert decision.flipped is Mode.CLOSED
    assert any("closing anyway" in r for r in decision.reasons)


def test_return_home_shrinks_the_standby_as_replicas_arrive() -> None:
    # Closed: two replicas already home, two still external (to be descheduled); the standby covers the two.
    decision = decide(snap(svc(onprem={"a": 2}, external=2, standby=4), free={"a": 30}), CLOSED, NOW, S)
    assert standby_of(decision) == 2
    home = decide(snap(svc(onprem={"a": 4}, external=0, standby=2), free={"a": 28}), CLOSED, NOW, S)
    assert standby_of(home) == 0


def test_cover_minimum_caps_the_standby_at_min_replicas() -> None:
    decision = decide(snap(svc(live=10), unplaced={"a": 32}, gated=GANG), CLOSED, NOW,
                      S.replace(handover=S.handover.replace(cover=Cover.MINIMUM)))
    assert standby_of(decision) == 4


@pytest.mark.parametrize("cover", list(Cover))
def test_plan_never_leaves_fewer_than_minimum_ready_when_risk_is_taken(cover: Cover) -> None:
    """Property: once the standby is ready at its target, losing every at-risk replica keeps >= minimum ready
    (and, covering the current count, keeps every replica the service had)."""
    rng = random.Random(3)
    for _ in range(2000):
        minimum = rng.randint(1, 6)
        live = rng.randint(minimum, 12)
        onprem_a, onprem_b = rng.randint(0, live), 0
        onprem_b = rng.randint(0, live - onprem_a)
        external = rng.randint(0, live - onprem_a - onprem_b)
        # Of the rest (not Ready), some are starting on pool a's nodes: a gang reclaiming a takes them too.
        starting_a = rng.randint(0, live - onprem_a - onprem_b - external)
        service = svc(live=live, onprem={"a": onprem_a, "b": onprem_b}, external=external,
                      standby=rng.randint(0, 3), minimum=minimum, starting={"a": starting_a} if starting_a else {})
        snapshot = snap(service, free={"a": rng.randint(0, 8), "b": 8}, unplaced={"a": rng.choice([0, 32])})
        returning = rng.random() < 0.5
        plan = plan_standby(snapshot, returning, cover)
        reclaimed = snapshot.unplaced_training.get("a", 0) > snapshot.pools["a"].free
        risk = onprem_a if reclaimed else 0
        risk += external if returning else 0
        # The gate waits for this service whenever the gang takes any of its pods, Ready or starting.
        assert ("svc" in plan.gang_services) == (reclaimed and onprem_a + starting_a > 0)
        if risk == 0 and service.standby_live == 0 and not (reclaimed and starting_a):
            assert "svc" not in plan.targets
            continue
        target = plan.targets["svc"]
        goal = max(minimum, live)
        assert 0 <= target <= (goal if cover == "current" else minimum)
        assert service.main_ready - risk + target >= (goal if cover == "current" else minimum)


def test_view_counts_service_replicas_by_role_readiness_and_place() -> None:
    s = S
    nodes = [onprem_node("n1", 8, pool="a"), onprem_node("n2", 8, pool="b"), virtual_node("vk", gpus=16)]
    pods = [
        gpu_pod("m1", node="n1", service="svc", namespace="inference"),
        gpu_pod("m2", node="n2", service="svc", namespace="inference"),
        gpu_pod("m3", node="vk", service="svc", namespace="inference"),
        gpu_pod("m4", node="n1", service="svc", namespace="inference", ready=False),
        gpu_pod("m5", service="svc", namespace="inference", unschedulable=True),
        gpu_pod("m6", node="n1", service="svc", namespace="inference", deleting=True),
        gpu_pod("sb1", node="vk", service="svc", standby=True, namespace="inference"),
        gpu_pod("sb2", service="svc", standby=True, namespace="inference", unschedulable=True),
        gpu_pod("other", node="n1", service="not-tracked", namespace="inference"),
        {**(g0 := gpu_pod("g0", 8, workload="training", namespace="training", pool="a", gated=True)),
         "metadata": {**g0["metadata"], "creationTimestamp": "2023-11-14T22:13:20Z"}},
        gpu_pod("g1", 8, workload="training", namespace="training", pool="a", gated=True),
        gpu_pod("t0", 8, workload="training", namespace="training", pool="b"),  # released, not bound yet
    ]
    snapshot = ClusterView.from_lists(nodes, pods, s, NOW).snapshot()
    assert snapshot.services["svc"] == ServiceReplicas(
        min_replicas=4, main_live=5, main_ready=3, main_ready_external=1, main_ready_onprem={"a": 1, "b": 1},
        main_starting_onprem={"a": 1},  # m4: bound on-prem, not Ready (m5, unbound, is on no node yet)
        standby_live=2, standby_ready=1, main_leaving=1,  # m6, being deleted: a move already made
        standby_unschedulable=1,  # sb2: the scheduler found no room for it
    )
    # A pending standby is no reason to open the burst; the pending main replica is.
    assert snapshot.pending_inference_gpus == 1
    assert set(snapshot.gated_pods) == {PodRef("training", "g0"), PodRef("training", "g1")}
    assert snapshot.gated_at == {PodRef("training", "g0"): 1_700_000_000.0}
    # Gated pods are pending training demand (they net against their pool's free GPUs).
    assert snapshot.pending_training_gpus == 16
    assert snapshot.pools["a"].pending_training == 16
    assert snapshot.unplaced_training == {"a": 16, "b": 8}


def test_view_moves_counts_when_a_node_appears_after_its_pods() -> None:
    view = ClusterView(S)
    view.apply_pod("ADDED", gpu_pod("m1", node="n1", service="svc", namespace="inference"))
    view.apply_pod("ADDED", gpu_pod("m2", node="vk", service="svc", namespace="inference"))
    before = view.snapshot().services["svc"]
    assert (before.main_ready, before.main_ready_external, dict(before.main_ready_onprem)) == (2, 0, {})
    view.apply_node("ADDED", onprem_node("n1", 8, pool="a"))
    view.apply_node("ADDED", virtual_node("vk"))
    after = view.snapshot().services["svc"]
    assert (after.main_ready_external, dict(after.main_ready_onprem)) == (1, {"a": 1})
    view.apply_node("DELETED", onprem_node("n1", 8, pool="a"))
    assert dict(view.snapshot().services["svc"].main_ready_onprem) == {}


def test_view_incremental_service_counts_match_full_list() -> None:
    rng = random.Random(11)

    def node(name: str) -> dict[str, Any]:
        return virtual_node(name) if name.endswith("3") else onprem_node(name, 8, pool=rng.choice(["a", "b"]))

    def pod(name: str) -> dict[str, Any]:
        training = rng.random() < 0.3
        node = rng.choice([None, *[f"n{i}" for i in range(12)]])
        return gpu_pod(
            name, rng.randrange(1, 9) if training else 1, node=node,
            workload="training" if training else "inference",
            service=None if training else rng.choice(["svc", "svc", "other"]),
            standby=rng.random() < 0.3, ready=rng.choice([None, False]),
            gated=training and node is None and rng.random() < 0.5,
            unschedulable=rng.random() < 0.5, deleting=rng.random() < 0.1,
            pool=rng.choice([None, "a", "b"]) if training else None,
            phase=rng.choice([None, None, "Succeeded"]),
        )

    def check(got: Snapshot, full: Snapshot) -> None:
        assert got.services == full.services
        assert got.unplaced_training == full.unplaced_training
        assert got.standby_external_gpus == full.standby_external_gpus
        assert sorted(got.gated_pods, key=str) == sorted(full.gated_pods, key=str)

    churn(S, rng, node_names=12, pod_names=120, make_node=node, make_pod=pod, check=check, every=300)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"handover_services": {"svc": 0}}, "'svc' must map to a minReplicas >= 1"),
        ({"handover_services": ["svc"]}, "must be a mapping of names to integers"),
        ({"handover_services": {"svc": "four"}}, "key 'handover_services.svc' must be an integer"),
        ({"handover": {"timeout_seconds": -1}}, "handover.timeout_seconds: must be >= 0"),
        ({"inference_namespace": ""}, "inference_namespace: must not be empty"),
    ],
)
def test_handover_settings_errors_name_the_key(data: dict[str, object], message: str) -> None:
    with pytest.raises(SettingsError, match=message.replace("(", r"\(").replace(")", r"\)")):
        BurstSettings.from_mapping(data, source="settings.yaml")


def test_handover_settings_round_trip() -> None:
    again = BurstSettings.from_mapping(__import__("json").loads(S.to_json()))
    assert again.handover_services == {"svc": 4} and again.handover.timeout_seconds == 60
    assert (again.handover_gate, again.role_label) == ("gpucluster.io/handover", "gpucluster.io/role")


def test_standby_gpus_need_no_room_on_prem_to_close() -> None:
    # 4 main replicas and 4 standby replicas external; 12 free on-prem, close threshold 4: the main ones fit
    # (4 + 4 <= 12); counting the standby too (4 + 8 > 12) would hold the close back for another hold.
    service = svc(onprem={}, external=4, standby=4)
    snapshot = replace(snap(service, free={"a": 12}, external_used=8, burst=None), standby_external_gpus=4)
    decision = decide(snapshot, replace(OPEN, close_since=NOW - 20), NOW, S)
    assert decision.close_needs_gpus == 8
    assert decision.flipped is Mode.CLOSED


def test_view_counts_standby_gpus_on_virtual_nodes_only() -> None:
    nodes = [onprem_node("n1", 8, pool="a"), virtual_node("vk", gpus=16)]
    pods = [
        gpu_pod("sb1", 2, node="vk", service="svc", standby=True, namespace="inference"),
        gpu_pod("sb2", 2, service="svc", standby=True, namespace="inference", unschedulable=True),
        gpu_pod("m1", 2, node="vk", service="svc", namespace="inference"),
    ]
    snapshot = ClusterView.from_lists(nodes, pods, S, NOW).snapshot()
    assert (snapshot.external_gpus_in_use, snapshot.standby_external_gpus) == (4, 2)
    # Only the main replica needs the deletion cost (HPA scale-down order); the standby is external anyway.
    assert snapshot.pods_needing_cost == (PodRef("inference", "m1"),)


@pytest.mark.parametrize(
    ("free_nodes", "unplaced_pods", "fits"),
    [
        ({8: 2}, {8: 2}, True),  # two empty 8-GPU nodes hold two whole-node workers
        ({2: 8}, {8: 2}, False),  # 16 free GPUs, 2 per node: no whole node for a worker
        ({4: 2}, {2: 4}, True),  # four 2-GPU pods pack two per node
        ({4: 1, 2: 1}, {4: 1, 2: 1}, True),  # largest first, best fit: 4 -> the 4, 2 -> the 2
        ({6: 1}, {4: 1, 3: 1}, False),  # 7 GPUs wanted, 6 free on one node
        ({8: 1, 2: 3}, {8: 1, 2: 3}, True),
        ({8: 3}, {3: 7}, False),  # 2 per node fit (6 of 8): 6 pods, not 7
    ],
)
def test_unplaced_training_fits_free_gpus_node_by_node(
    free_nodes: dict[int, int], unplaced_pods: dict[int, int], fits: bool
) -> None:
    free = sum(f * n for f, n in free_nodes.items())
    unplaced = sum(g * n for g, n in unplaced_pods.items())
    pool = PoolGpus(free, unplaced, free_nodes=free_nodes, unplaced_pods=unplaced_pods)
    snapshot = replace(snap(svc(), free={"a": free}, unplaced={"a": unplaced}, gated=GANG), pools={"a": pool})
    plan = plan_standby(snapshot, returning=False, cover=Cover.CURRENT)
    assert plan.gang_services == (frozenset() if fits else frozenset({"svc"}))


def test_scattered_free_gpus_do_not_release_a_whole_node_gang() -> None:
    """Enough free GPUs by count but not by node: the gang would reclaim inference, so the standby comes first."""
    nodes = [onprem_node(f"n{i}", 8, pool="a") for i in range(4)]
    gang = [gpu_pod(f"g{i}", 8, workload="training", namespace="training", pool="a", gated=True) for i in range(2)]
    inference = [gpu_pod(f"m{i}", 6, node=f"n{i}", service="svc", namespace="inference") for i in range(2)]
    # Free: n0 2, n1 2, n2 8, n3 8: the two workers fit the two empty nodes; nothing is at risk.
    fits = ClusterView.from_lists(nodes, inference + gang, S, NOW).snapshot()
    assert fits.pools["a"].free_nodes == {2: 2, 8: 2}
    assert len(kinds(decide(fits, CLOSED, NOW, S), ActionKind.UNGATE)) == 2
    # One more replica on n2: 18 free GPUs >= 16 wanted by count, but only n3 holds a whole worker.
    inference.append(gpu_pod("m2", 2, node="n2", service="svc", namespace="inference"))
    scattered = ClusterView.from_lists(nodes, inference + gang, S, NOW).snapshot()
    assert (scattered.pools["a"].free, scattered.unplaced_training) == (18, {"a": 16})
    decision = decide(scattered, CLOSED, NOW, S)
    assert kinds(decision, ActionKind.UNGATE) == []
    assert standby_of(decision) == 4  # all three replicas may go; the goal is at least minReplicas (4)


# id, standby (live, ready, unschedulable), warm placeholders, gang released at once
FULL_TABLE = [
    # 4 asked, 2 placed and ready, 2 the scheduler found no room for: as large as the providers hold.
    ("full-releases", (4, 2, 2), 0, True),
    # 2 not placed yet and not judged unschedulable: the scheduler may still place them; wait.
    ("pending-not-judged-waits", (4, 2, 0), 0, False),
    # A placed standby pod is still starting: wait for it.
    ("placed-not-ready-waits", (4, 1, 2), 0, False),
    # Warm placeholders hold GPUs on the virtual nodes: a standby pod preempts one, so "no room" is not final.
    ("warm-placeholders-wait", (4, 2, 2), 2, False),
    # Every standby pod ready: covered as before.
    ("all-ready-releases", (4, 4, 0), 0, True),
]


@pytest.mark.parametrize(("standby", "warm", "released"), [r[1:] for r in FULL_TABLE],
                         ids=[r[0] for r in FULL_TABLE])
def test_a_standby_the_providers_cannot_hold_whole_releases_the_gang_without_waiting_the_timeout(
        standby: tuple[int, int, int], warm: int, released: bool) -> None:
    """The prod stack at maxReplicas asks 512 GPUs of standby of providers holding 384: the gate waited its whole
    timeout (300 s) for replicas no virtual node could ever take (found by the burst run at scale)."""
    live, ready, unschedulable = standby
    service = replace(svc(standby=live, standby_ready=ready), standby_unschedulable=unschedulable, warm_live=warm)
    decision = decide(snap(service, unplaced={"a": 32}, gated=GANG), CLOSED, NOW, S)
    assert (len(kinds(decision, ActionKind.UNGATE)) == len(GANG)) is released, decision.reasons
    if released and ready < live:
        assert any("as large as the providers hold" in r for r in decision.reasons), decision.reasons


def test_a_full_standby_lets_the_close_go_ahead_without_waiting_the_timeout() -> None:
    service = replace(svc(onprem={}, external=4, standby=4, standby_ready=2), standby_unschedulable=2)
    snapshot = snap(service, free={"a": 32}, external_used=4, burst=None)
    closed = decide(snapshot, replace(OPEN, close_since=NOW - 20), NOW, S)
    assert closed.flipped is Mode.CLOSED, closed.reasons
    room = standby_room(snapshot.services, {}, NOW, S.handover.standby_retry_seconds)
    plan = plan_standby(snapshot, returning=True, cover=Cover.CURRENT, room=room)
    assert plan.full == {"svc"} and "(the providers hold no more)" in plan.describe()
    assert plan.targets == {"svc": 2}  # what the providers placed, not the 4 asked


def test_a_full_standby_asks_only_for_what_was_placed_until_the_retry_while_its_replicas_come_home() -> None:
    """The unplaced pods of a standby count as expected in the service's PDB, which then allows no disruption: after
    a close at scale the descheduler's 4,864 evictions over 37 min were all refused (429) and 44 replicas stayed
    outside. While replicas are to come home, the standby asks only for what was placed; after
    `standbyRetrySeconds` for its whole size again."""
    retry = S.handover.standby_retry_seconds

    def home(standby: int, ready: int, unschedulable: int, t: float) -> Snapshot:
        service = replace(svc(onprem={}, external=4, standby=standby, standby_ready=ready),
                          standby_unschedulable=unschedulable)
        return replace(snap(service, free={"a": 32}, external_used=4, burst=None), observed_at=t - 1)

    first = decide(home(4, 2, 2, NOW), replace(OPEN, close_since=NOW - 30), NOW, S)
    assert first.flipped is Mode.CLOSED and standby_of(first) == 2, first.reasons
    assert first.state.standby_room == {"svc": StandbyRoom(2, NOW)}
    # The unplaced pods are gone; nothing says "no room" any more, but the cut holds until the retry.
    held = decide(home(2, 2, 0, NOW + retry - 1), first.state, NOW + retry - 1, S)
    assert standby_of(held) is None and held.standby == {"svc": 2}, held.reasons
    retried = decide(home(2, 2, 0, NOW + retry), held.state, NOW + retry, S)
    assert standby_of(retried) == 4 and retried.state.standby_room == {}, retried.reasons
    # Asked again, placed again only in part: a new cut, counted from then.
    again = decide(home(4, 3, 1, NOW + retry + 5), retried.state, NOW + retry + 5, S)
    assert standby_of(again) == 3 and again.state.standby_room == {"svc": StandbyRoom(3, NOW + retry + 5)}


def test_a_full_standby_with_nothing_outside_keeps_waiting_for_room_and_releases_the_gang() -> None:
    """With nothing to bring home no eviction waits on the PDB: the standby keeps its unplaced pods, so it grows the
    moment room appears, and the gang goes at once all the same."""
    service = replace(svc(standby=4, standby_ready=2), standby_unschedulable=2)
    decision = decide(snap(service, unplaced={"a": 32}, gated=GANG), CLOSED, NOW, S)
    assert standby_of(decision) is None and decision.standby == {"svc": 4}, decision.reasons
    assert len(kinds(decision, ActionKind.UNGATE)) == len(GANG)


@given(live=st.integers(1, 12), unschedulable=st.integers(0, 12), ready=st.integers(0, 12),
       warm=st.integers(0, 2), later=st.floats(0, 600), external=st.integers(1, 8))
def test_no_standby_pod_the_scheduler_found_no_room_for_is_asked_for_again_before_the_retry(
        live: int, unschedulable: int, ready: int, warm: int, later: float, external: int) -> None:
    """Invariant behind the PDB deadlock: once the scheduler said "no room" (every placed standby pod ready, no warm
    placeholder to preempt), no decision before `standbyRetrySeconds` asks for more standby pods than were placed
    while the service's external replicas are to come home (the burst closing, or closed)."""
    unschedulable = min(unschedulable, live)
    placed = live - unschedulable
    ready = min(ready, placed)
    service = replace(svc(onprem={"a": 4}, external=external, standby=live, standby_ready=ready),
                      standby_unschedulable=unschedulable, warm_live=warm)
    for snapshot, state in ((snap(service, unplaced={"a": 32}, gated=GANG, external_used=external), CLOSED),
                            (snap(service, free={"a": 32}, external_used=external, burst=None),
                             replace(OPEN, close_since=NOW - 30))):
        first = decide(snapshot, state, NOW, S)
        judged = unschedulable > 0 and ready >= placed and warm == 0
        assert ("svc" in first.state.standby_room) is judged
        if not judged:
            continue
        assert first.standby.get("svc", 0) <= placed, first.reasons
        after = replace(snapshot, services={"svc": replace(service, standby_live=placed, standby_unschedulable=0)})
        t = NOW + min(later, S.handover.standby_retry_seconds - 0.5)
        nxt = decide(replace(after, observed_at=t - 1), replace(first.state, last_now=t - 1), t, S)
        if nxt.state.mode is Mode.CLOSED:  # a burst opened again brings nothing home: its standby may wait for room
            assert nxt.standby.get("svc", 0) <= placed, nxt.reasons


def test_the_view_counts_standby_pods_the_scheduler_found_no_room_for() -> None:
    nodes = [onprem_node("n1", 8, pool="a"), virtual_node("vk", gpus=16)]
    pods = [gpu_pod("sb1", node="vk", service="svc", standby=True, namespace="inference"),
            gpu_pod("sb2", service="svc", standby=True, namespace="inference", unschedulable=True),
            gpu_pod("sb3", service="svc", standby=True, namespace="inference")]  # not judged yet
    replicas = ClusterView.from_lists(nodes, pods, S, NOW).snapshot().services["svc"]
    assert (replicas.standby_live, replicas.standby_ready, replicas.standby_unschedulable) == (3, 1, 1)


def room(name: str, free: int, *gpus: int) -> NodeRoom:
    return NodeRoom(name, free, tuple((PodRef("inference", f"{name}-r{i}"), g) for i, g in enumerate(gpus)))


def stalled(free_nodes: Mapping[int, int], pods: int = 4, gated: tuple[PodRef, ...] = (),
            rooms: tuple[NodeRoom, ...] = ()) -> Snapshot:
    """Pool a: ``pods`` released 8-GPU training pods unplaced; ``free_nodes`` free GPUs -> nodes."""
    base = snap(svc(), unplaced={"a": 8 * pods}, gated=gated)
    pool = PoolGpus(sum(f * n for f, n in free_nodes.items()), 8 * pods, free_nodes=dict(free_nodes),
                    unplaced_pods={8: pods})
    return replace(base, pools={"a": pool}, clearable={"a": rooms},
                   gated_pool={ref: "a" for ref in gated})


ROOMS = (room("n1", 6, 2), room("n2", 4, 2, 2), room("n3", 0, 4, 4), room("n4", 2, 2))  # n4: 4 short of a node
#: The clearing turned on (off by default), after the 30 s the tables count in.
CLEARING = S.replace(handover=S.handover.model_copy(update={"clear_after_seconds": 30.0}))


# id, snapshot, seconds unplaced so far (None: first seen now), nodes reserved, then the pods evicted from them
CLEAR_TABLE = [
    # Two whole nodes free, four pods: two nodes to clear, those with the fewest replica GPUs (n1, n2), not n3.
    ("clears-the-fewest", stalled({8: 2}, rooms=ROOMS), 31.0, ["n1", "n2"], ["n1-r0", "n2-r0", "n2-r1"]),
    # The scheduler has had less than clearAfterSeconds: it may still reclaim by itself.
    ("waits-for-the-scheduler", stalled({8: 2}, rooms=ROOMS), 10.0, [], []),
    ("first-seen-waits", stalled({8: 2}, rooms=ROOMS), None, [], []),
    # Training still behind the gate is the handover's to wait for.
    ("gated-is-not-stalled", stalled({8: 2}, gated=GANG, rooms=ROOMS), 31.0, [], []),
    # It fits the free nodes: the scheduler places it without anyone's help.
    ("fits-free", stalled({8: 4}, rooms=ROOMS), 31.0, [], []),
    # Not enough room anywhere for all of it: clear what makes room for as many pods as can go.
    ("as-many-as-fit", stalled({8: 1}, pods=5, rooms=ROOMS), 31.0, ["n1", "n2", "n3"],
     ["n1-r0", "n2-r0", "n2-r1", "n3-r0", "n3-r1"]),
    # A node already being cleared (its replicas leaving, counted free) is used first, and reserved too (its
    # leaving replicas' replacements would take it): nothing evicted twice.
    ("being-cleared-first", stalled({8: 2}, rooms=(NodeRoom("n0", 8), *ROOMS)), 31.0, ["n0", "n1"], ["n1-r0"]),
]


@pytest.mark.parametrize(("snapshot", "waited", "nodes", "evicted"), [r[1:] for r in CLEAR_TABLE],
                         ids=[r[0] for r in CLEAR_TABLE])
def test_released_training_the_scheduler_leaves_waiting_gets_its_room_reserved_then_cleared(
        snapshot: Snapshot, waited: float | None, nodes: list[str], evicted: list[str]) -> None:
    """Volcano 1.14.1 places a gang that needs both empty nodes and nodes inference holds neither by allocate nor
    by reclaim (the burst run at scale: 96 empty and 32 occupied nodes of prod's pool, the gang never ran). The
    nodes are reserved first and evicted only once the reservation is seen: at the prod size each evicted replica's
    replacement took back the GPUs its eviction freed before Volcano could place the gang."""
    state = CLOSED if waited is None else replace(CLOSED, stalled_since={"a": NOW - waited})
    first = decide(snapshot, state, NOW, CLEARING)
    assert kinds(first, ActionKind.EVICT) == [], "nothing is evicted from a node not reserved yet"
    reserved = {a.node: a.pool for a in kinds(first, ActionKind.RESERVE_NODE)}
    assert reserved == dict.fromkeys(nodes, "a"), first.reasons
    assert set(nodes) >= {pod.rsplit("-", 1)[0] for pod in evicted}
    pool = snapshot.pools["a"]
    waiting = not snapshot.gated_pods and pool.free_nodes.get(8, 0) < pool.unplaced_pods[8]
    assert first.state.stalled_since == ({"a": NOW if waited is None else NOW - waited} if waiting else {})
    assert first.state.reserved_since == dict.fromkeys(reserved, NOW)
    # The next decision sees the reservations: the same nodes are kept and their replicas evicted, in one go.
    then = decide(replace(snapshot, reserved=reserved), first.state, NOW + 1, CLEARING)
    assert [a.pod for a in kinds(then, ActionKind.EVICT)] == evicted, then.reasons
    assert kinds(then, ActionKind.RESERVE_NODE) == [] and kinds(then, ActionKind.RELEASE_NODE) == []
    actions = [a.kind for a in then.actions]
    if evicted:
        said = f"handover: training released for pool a unplaced for {waited + 1 if waited else 1:.0f}s"
        assert any(r.startswith(said) and f"evicting {len(evicted)} replicas" in r for r in then.reasons)
        assert then.state.reserved_since == dict.fromkeys(reserved, NOW)
    else:
        assert ActionKind.EVICT not in actions


def _reserved_pool(snapshot: Snapshot, nodes: Mapping[str, str], waited: float, since: float) -> tuple[
        Snapshot, BurstState]:
    state = replace(CLOSED, stalled_since={"a": NOW - waited}, reserved_since=dict.fromkeys(nodes, since))
    return replace(snapshot, reserved=dict(nodes)), state


def test_a_reservation_stays_while_the_training_waits_even_once_it_fits() -> None:
    """Once the cleared nodes are empty the training fits the free GPUs: that is when the scheduler places it, so
    the reservation must hold then, not come off and let inference back."""
    snapshot, state = _reserved_pool(stalled({8: 4}), {"n1": "a", "n2": "a"}, 90.0, NOW - 60)
    decision = decide(snapshot, state, NOW, CLEARING)
    assert kinds(decision, ActionKind.RELEASE_NODE) == [] and kinds(decision, ActionKind.EVICT) == []
    assert decision.state.reserved_since == {"n1": NOW - 60, "n2": NOW - 60}
    assert decision.state.stalled_since == {"a": NOW - 90}


def test_a_reservation_comes_off_once_the_training_is_placed() -> None:
    snapshot, state = _reserved_pool(replace(stalled({8: 4}), unplaced_training={}), {"n1": "a", "n2": "a"}, 90.0,
                                     NOW - 60)
    decision = decide(snapshot, state, NOW, CLEARING)
    assert [a.node for a in kinds(decision, ActionKind.RELEASE_NODE)] == ["n1", "n2"]
    assert decision.state.stalled_since == {}
    # Each keeps its first sight until it is seen gone: a refused release cannot restart its hold.
    assert decision.state.reserved_since == {"n1": NOW - 60, "n2": NOW - 60}
    gone = decide(replace(snapshot, reserved={}), decision.state, NOW + 1, CLEARING)
    assert gone.state.reserved_since == {} and gone.actions == ()


def test_a_reservation_the_scheduler_never_uses_is_given_back_and_the_stall_restarts() -> None:
    """Training the scheduler holds back for another reason (its queue's quota) must not idle GPUs for good."""
    hold = CLEARING.handover.reserve_seconds
    snapshot, state = _reserved_pool(stalled({8: 2}, rooms=ROOMS), {"n1": "a", "n2": "a"}, 999.0, NOW - hold)
    decision = decide(snapshot, state, NOW, CLEARING)
    assert [a.node for a in kinds(decision, ActionKind.RELEASE_NODE)] == ["n1", "n2"]
    assert kinds(decision, ActionKind.EVICT) == [] and kinds(decision, ActionKind.RESERVE_NODE) == []
    assert decision.state.stalled_since == {"a": NOW}
    assert decision.state.reserved_since == {"n1": NOW - hold, "n2": NOW - hold}
    assert any("nodes given back" in r for r in decision.reasons)
    # Just before the hold ends it is kept, and the clearing goes on.
    snapshot, state = _reserved_pool(stalled({8: 2}, rooms=ROOMS), {"n1": "a", "n2": "a"}, 999.0, NOW - hold + 1)
    decision = decide(snapshot, state, NOW, CLEARING)
    assert kinds(decision, ActionKind.RELEASE_NODE) == []
    assert [a.pod for a in kinds(decision, ActionKind.EVICT)] == ["n1-r0", "n2-r0", "n2-r1"]


def test_reservations_of_a_pool_with_nothing_waiting_or_with_clearing_off_come_off() -> None:
    """A reservation left by a leader that died, for a pool whose training has gone, or with the clearing turned
    off since, is taken off: nobody else would."""
    snapshot, state = _reserved_pool(stalled({8: 2}, rooms=ROOMS), {"n1": "a", "x9": "b"}, 40.0, NOW - 10)
    decision = decide(snapshot, state, NOW, CLEARING)
    assert [a.node for a in kinds(decision, ActionKind.RELEASE_NODE)] == ["x9"]
    off = decide(snapshot, state, NOW, S)
    assert [a.node for a in kinds(off, ActionKind.RELEASE_NODE)] == ["n1", "x9"]
    assert kinds(off, ActionKind.EVICT) == [] and kinds(off, ActionKind.RESERVE_NODE) == []


def test_a_reservation_seen_first_by_a_new_leader_counts_from_its_first_sight() -> None:
    snapshot, _ = _reserved_pool(stalled({8: 2}, rooms=ROOMS), {"n1": "a", "n2": "a"}, 0.0, 0.0)
    state = replace(CLOSED, stalled_since={"a": NOW - 40})
    decision = decide(snapshot, state, NOW, CLEARING)
    assert decision.state.reserved_since == {"n1": NOW, "n2": NOW}
    assert [a.pod for a in kinds(decision, ActionKind.EVICT)] == ["n1-r0", "n2-r0", "n2-r1"]


def test_a_clock_stepped_back_shifts_the_reservations_with_it() -> None:
    snapshot, state = _reserved_pool(stalled({8: 2}, rooms=ROOMS), {"n1": "a", "n2": "a"}, 40.0, NOW - 100)
    back = replace(state, last_now=NOW + 50)
    decision = decide(snapshot, back, NOW, CLEARING)
    assert decision.state.reserved_since == {"n1": NOW - 150, "n2": NOW - 150}


def test_clearing_is_off_at_zero_and_by_default() -> None:
    """Off by default: at the prod stack's size each evicted replica's replacement took back the GPUs its eviction
    freed before Volcano could place the gang whole (the burst run at scale), so it churned inference for nothing."""
    assert S.handover.clear_after_seconds == 0.0
    decision = decide(stalled({8: 2}, rooms=ROOMS), replace(CLOSED, stalled_since={"a": NOW - 999}), NOW, S)
    assert kinds(decision, ActionKind.EVICT) == [] and decision.state.stalled_since == {}
    assert kinds(decision, ActionKind.RESERVE_NODE) == []


def test_the_view_offers_a_pools_nodes_with_replicas_and_counts_leaving_ones_free() -> None:
    nodes = [onprem_node("n1", 8, pool="a"), onprem_node("n2", 8, pool="a"), onprem_node("n3", 8, pool="b")]
    pods = [gpu_pod("m1", 2, node="n1", service="svc", namespace="inference"),
            gpu_pod("m2", 2, node="n2", service="svc", namespace="inference", deleting=True),
            gpu_pod("m3", 2, node="n3", service="svc", namespace="inference"),
            gpu_pod("t0", 8, workload="training", namespace="training", pool="a", unschedulable=True)]
    snapshot = ClusterView.from_lists(nodes, pods, S, NOW).snapshot()
    assert snapshot.clearable == {"a": (NodeRoom("n1", 6, ((PodRef("inference", "m1"), 2),)), NodeRoom("n2", 8))}


def test_in_a_pool_with_a_topology_the_clearing_empties_the_leaf_where_the_free_gpus_are() -> None:
    """One pod's room is missing; leaf-1 already has a free node and a node with 4 replica GPUs, leaf-2 a node with
    only 2: the gang, placed by its leaves, spans one leaf only if leaf-1's node is the one cleared."""
    rooms = (NodeRoom("n1", 4, ((PodRef("inference", "n1-r0"), 4),), "leaf-1"),
             NodeRoom("n5", 6, ((PodRef("inference", "n5-r0"), 2),), "leaf-2"))
    base = stalled({8: 1}, pods=2, rooms=rooms)
    pool = replace(base.pools["a"], free_by_leaf={"leaf-1": 12, "leaf-2": 6})
    snapshot = replace(base, pools={"a": pool})
    state = replace(CLOSED, stalled_since={"a": NOW - 40})
    assert {a.node for a in kinds(decide(snapshot, state, NOW, CLEARING), ActionKind.RESERVE_NODE)} == {"n1"}
    # Without a topology the node with the fewest replica GPUs goes, as before.
    flat = replace(base, clearable={"a": tuple(replace(n, leaf="") for n in rooms)})
    assert {a.node for a in kinds(decide(flat, state, NOW, CLEARING), ActionKind.RESERVE_NODE)} == {"n5"}


def test_the_view_offers_each_nodes_leaf_and_the_pools_free_gpus_per_leaf() -> None:
    def node(name: str, leaf: str | None) -> dict[str, Any]:
        obj = onprem_node(name, 8, pool="a")
        if leaf is not None:
            obj["metadata"]["labels"][S.leaf_label] = leaf
        return obj

    nodes = [node("n1", "leaf-1"), node("n2", "leaf-1"), node("n3", "leaf-2"), node("n4", None)]
    pods = [gpu_pod("m1", 2, node="n1", service="svc", namespace="inference"),
            gpu_pod("t0", 8, workload="training", namespace="training", pool="a", unschedulable=True)]
    view = ClusterView.from_lists(nodes, pods, S, NOW)
    snapshot = view.snapshot()
    assert snapshot.pools["a"].free_by_leaf == {"leaf-1": 14, "leaf-2": 8}
    assert snapshot.clearable["a"] == (NodeRoom("n1", 6, ((PodRef("inference", "m1"), 2),), "leaf-1"),)
    view.apply_node("MODIFIED", node("n3", "leaf-1"))  # relabelled: its free GPUs move with it
    assert view.snapshot().pools["a"].free_by_leaf == {"leaf-1": 22}


def test_the_view_reads_the_reservation_of_onprem_nodes_as_it_changes() -> None:
    reserved = onprem_node("n1", 8, pool="a")
    reserved["spec"]["taints"] = [{"key": S.reserved_taint_key, "value": "a", "effect": "NoSchedule"}]
    virtual = virtual_node("vk-a", settings=S)
    virtual["spec"]["taints"].append({"key": S.reserved_taint_key, "value": "a", "effect": "NoSchedule"})
    view = ClusterView.from_lists([reserved, onprem_node("n2", 8, pool="a"), virtual], [], S, NOW)
    snapshot = view.snapshot()
    assert snapshot.reserved == {"n1": "a"}
    assert snapshot.pools["a"].free == 16, "a reserved node's GPUs are free GPUs of its pool (training may use them)"
    view.apply_node("MODIFIED", onprem_node("n1", 8, pool="a"))
    assert view.snapshot().reserved == {}
    view.apply_node("MODIFIED", reserved)
    view.apply_node("DELETED", reserved)
    assert view.snapshot().reserved == {}


@given(st.lists(st.tuples(st.booleans(), st.booleans(), st.floats(0, 400)), min_size=1, max_size=12))
def test_clearing_never_evicts_from_a_node_not_reserved_for_the_pool_and_never_holds_one_past_its_bound(
        steps: list[tuple[bool, bool, float]]) -> None:
    """Whatever the API does with the reservations (applied or refused) and however long each cycle takes, an
    eviction is only ever of a replica on a node the snapshot shows reserved for that pool, and no node stays
    reserved past `reserveSeconds` (plus one cycle) without the training being placed."""
    hold = CLEARING.handover.reserve_seconds
    base = stalled({8: 2}, rooms=ROOMS)
    reserved: dict[str, str] = {}
    since: dict[str, float] = {}
    state, now = replace(CLOSED, stalled_since={"a": NOW - 40}), NOW
    for applied, placed, wait in steps:
        snapshot = replace(base, observed_at=now, reserved=dict(reserved),
                           unplaced_training={} if placed else base.unplaced_training)
        decision = decide(snapshot, state, now, CLEARING)
        evicted = {a.pod.rsplit("-", 1)[0] for a in kinds(decision, ActionKind.EVICT)}
        assert all(reserved.get(node) == "a" for node in evicted), (reserved, evicted)
        released = {a.node for a in kinds(decision, ActionKind.RELEASE_NODE)}
        assert all(now - since[n] < hold for n in set(reserved) - released), (reserved, released, since, now)
        if applied:
            for a in kinds(decision, ActionKind.RESERVE_NODE):
                reserved[a.node] = a.pool
                since.setdefault(a.node, now)
            for a in kinds(decision, ActionKind.RELEASE_NODE):
                reserved.pop(a.node, None)
                since.pop(a.node, None)
        state, now = decision.state, now + wait


@given(st.dictionaries(st.sampled_from([1, 2, 4, 8]), st.integers(1, 6), min_size=1, max_size=3),
       st.dictionaries(st.sampled_from([0, 1, 2, 4, 6, 8]), st.integers(0, 4), max_size=4),
       st.lists(st.tuples(st.integers(0, 8), st.lists(st.sampled_from([1, 2, 4]), max_size=4)), max_size=8))
def test_clearing_evicts_each_replica_once_and_only_from_nodes_reserved_that_then_hold_a_waiting_pod(
        pods: dict[int, int], free: dict[int, int], nodes: list[tuple[int, list[int]]]) -> None:
    rooms = tuple(room(f"n{i}", min(f, 8), *gpus) for i, (f, gpus) in enumerate(nodes) if min(f, 8) + sum(gpus) <= 8)
    pool = PoolGpus(sum(f * n for f, n in free.items()), sum(s * n for s, n in pods.items()),
                    free_nodes={f: n for f, n in free.items() if n and f}, unplaced_pods=dict(pods))
    snapshot = replace(snap(svc(), unplaced={"a": pool.pending_training}), pools={"a": pool}, clearable={"a": rooms})
    first = plan_clear(snapshot, {"a": NOW - 60}, {}, NOW, 30.0, 600.0)
    assert first.evictions == () and first.release == ()
    assert set(first.reserve) <= {n.name for n in rooms} and set(first.reserve.values()) <= {"a"}
    # The next decision, with the reservations on: the same nodes, and only their replicas go.
    plan = plan_clear(replace(snapshot, reserved=dict(first.reserve)), first.stalled_since, first.reserved_since,
                      NOW + 1, 30.0, 600.0)
    assert plan.reserve == {} and plan.release == () and set(plan.reserved_since) == set(first.reserve)
    assert len(plan.evictions) == len(set(plan.evictions))
    by_node = {n.name: n for n in rooms}
    emptied = {ref.name.rsplit("-", 1)[0] for ref in plan.evictions}
    assert emptied <= set(first.reserve)
    assert all(by_node[n].replicas for n in emptied)
    # Each emptied node gives all its replicas, and holds at least the smallest waiting pod once empty.
    assert all(set(plan.evictions) >= {r for r, _ in by_node[n].replicas} for n in emptied)
    assert all(by_node[n].room >= min(pods) for n in emptied)
    assert len(first.reserve) <= sum(pods.values())
