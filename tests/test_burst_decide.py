"""Decision tables for the burst controller core, and the incremental view that feeds it."""

from __future__ import annotations

import json
import random
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from agents.burst_controller.cli import load_file
from agents.burst_controller.contract import BurstSettings, SettingsError
from agents.burst_controller.decide import (
    Action,
    ActionKind,
    BurstState,
    Mode,
    PodRef,
    PoolGpus,
    Snapshot,
    VirtualNode,
    decide,
    effective_free_gpus,
    state_from_snapshot,
)
from agents.burst_controller.view import ClusterView, pod_pool
from fakes.burst_objects import gpu_pod, onprem_node, virtual_node
from tests.churn import churn

S = BurstSettings(
    open_below_free_gpus=1,
    close_at_free_gpus=8,
    open_hold_seconds=60,
    close_hold_seconds=600,
    pending_grace_seconds=30,
    stale_after_seconds=120,
    watch_timeout_seconds=60,
)
NOW = 10_000.0


def snap(
    free: int,
    *,
    alloc: int = 64,
    pending_inf: int = 0,
    pending_train: int = 0,
    vnodes: Mapping[str, tuple[str | None, int]] | None = None,
    age: float = 1.0,
    synced: bool = True,
    cost: tuple[PodRef, ...] = (),
    pools: Mapping[str, tuple[int, int]] | None = None,
) -> Snapshot:
    """`pools`: pool → (free, pending training), the part of `free`/`pending_train` that belongs to it."""
    nodes = vnodes if vnodes is not None else {"vk-a": ("NoSchedule", 0)}
    return Snapshot(
        pools={p: PoolGpus(f, t) for p, (f, t) in (pools or {}).items()},
        synced=synced,
        observed_at=NOW - age,
        onprem_allocatable_gpus=alloc,
        onprem_free_gpus=free,
        pending_inference_gpus=pending_inf,
        pending_training_gpus=pending_train,
        virtual_nodes={n: VirtualNode(n, "p", eff, used) for n, (eff, used) in nodes.items()},
        pods_needing_cost=cost,
    )


CLOSED = BurstState(Mode.CLOSED, changed_at=1000.0, last_now=NOW - 5)
OPEN = BurstState(Mode.OPEN, changed_at=1000.0, last_now=NOW - 5)
OPEN_A = Action(ActionKind.OPEN_NODE, node="vk-a")
OPEN_B = Action(ActionKind.OPEN_NODE, node="vk-b")
CLOSE_A = Action(ActionKind.CLOSE_NODE, node="vk-a")
CLOSE_B = Action(ActionKind.CLOSE_NODE, node="vk-b")
OPEN_NODES = {"vk-a": (None, 0)}

TABLE = [
    # id, snapshot, previous state, expected actions, expected mode
    ("exhausted-hold-starts", snap(0), CLOSED, (), Mode.CLOSED),
    ("exhausted-hold-not-met", snap(0), replace(CLOSED, low_since=NOW - 59), (), Mode.CLOSED),
    ("exhausted-sustained-opens", snap(0), replace(CLOSED, low_since=NOW - 60), (OPEN_A,), Mode.OPEN),
    (
        "freed-sustained-closes",
        snap(20, vnodes=OPEN_NODES),
        replace(OPEN, close_since=NOW - 600),
        (CLOSE_A,),
        Mode.CLOSED,
    ),
    ("freed-hold-not-met", snap(20, vnodes=OPEN_NODES), replace(OPEN, close_since=NOW - 599), (), Mode.OPEN),
    (
        "freed-but-returning-pods-do-not-fit",
        snap(20, vnodes={"vk-a": (None, 16)}),
        replace(OPEN, close_since=NOW - 900),
        (),
        Mode.OPEN,
    ),
    (
        "freed-and-returning-pods-fit",
        snap(24, vnodes={"vk-a": (None, 16)}),
        replace(OPEN, close_since=NOW - 600),
        (CLOSE_A,),
        Mode.CLOSED,
    ),
    (
        "band-while-open-no-close",
        snap(5, vnodes=OPEN_NODES),
        replace(OPEN, close_since=NOW - 900),
        (),
        Mode.OPEN,
    ),
    ("band-while-closed-no-open", snap(5), replace(CLOSED, low_since=NOW - 900), (), Mode.CLOSED),
    ("stale-data-no-change", snap(0, age=121), replace(CLOSED, low_since=NOW - 900), (), Mode.CLOSED),
    ("not-synced-no-change", snap(0, synced=False), replace(CLOSED, low_since=NOW - 900), (), Mode.CLOSED),
    ("no-onprem-capacity-visible", snap(0, alloc=0), replace(CLOSED, low_since=NOW - 900), (), Mode.CLOSED),
    (
        "stale-while-open-leaves-taints",
        snap(60, vnodes=OPEN_NODES, age=500),
        replace(OPEN, close_since=0.0),
        (),
        Mode.OPEN,
    ),
    (
        "several-nodes-open-together",
        snap(0, vnodes={"vk-a": ("NoSchedule", 0), "vk-b": ("NoSchedule", 0)}),
        replace(CLOSED, low_since=NOW - 60),
        (OPEN_A, OPEN_B),
        Mode.OPEN,
    ),
    (
        "several-nodes-close-together",
        snap(40, vnodes={"vk-a": (None, 0), "vk-b": (None, 0)}),
        replace(OPEN, close_since=NOW - 600),
        (CLOSE_A, CLOSE_B),
        Mode.CLOSED,
    ),
    (
        "several-nodes-return-sum-counts",
        snap(20, vnodes={"vk-a": (None, 8), "vk-b": (None, 8)}),
        replace(OPEN, close_since=NOW - 900),
        (),
        Mode.OPEN,
    ),
    (
        "new-untainted-node-joins-closed",
        snap(5, vnodes={"vk-a": ("NoSchedule", 0), "vk-b": (None, 0)}),
        CLOSED,
        (CLOSE_B,),
        Mode.CLOSED,
    ),
    (
        "noexecute-rewritten-to-noschedule",
        snap(5, vnodes={"vk-a": ("NoExecute", 0)}),
        CLOSED,
        (CLOSE_A,),
        Mode.CLOSED,
    ),
    (
        "hand-tainted-node-reopened",
        snap(0, vnodes={"vk-a": (None, 0), "vk-b": ("NoSchedule", 0)}),
        OPEN,
        (OPEN_B,),
        Mode.OPEN,
    ),
    (
        "training-gang-pending-opens",
        snap(8, pending_train=8),
        replace(CLOSED, low_since=NOW - 60),
        (OPEN_A,),
        Mode.OPEN,
    ),
    (
        "training-gang-pending-blocks-close",
        snap(30, pending_train=24, vnodes=OPEN_NODES),
        replace(OPEN, close_since=NOW - 900),
        (),
        Mode.OPEN,
    ),
    # Per pool: a gang pending for full pool A can only take A's GPUs; idle pool B stays inference's.
    (
        "gang-pending-on-pool-a-pool-b-idle-no-open",
        snap(64, pending_train=64, pools={"a": (0, 64), "b": (64, 0)}),
        replace(CLOSED, low_since=NOW - 600),
        (),
        Mode.CLOSED,
    ),
    (
        "gang-pending-on-pool-a-pool-b-idle-close-allowed",
        snap(64, pending_train=64, pools={"a": (0, 64), "b": (64, 0)}, vnodes=OPEN_NODES),
        replace(OPEN, close_since=NOW - 600),
        (CLOSE_A,),
        Mode.CLOSED,
    ),
    (
        "gang-pending-on-pool-a-pool-b-full-opens",
        snap(0, pending_train=64, pools={"a": (0, 64), "b": (0, 0)}),
        replace(CLOSED, low_since=NOW - 60),
        (OPEN_A,),
        Mode.OPEN,
    ),
    (
        "gang-pending-on-pool-a-pool-b-idle-but-external-does-not-fit",
        snap(64, pending_train=64, pools={"a": (0, 64), "b": (64, 0)}, vnodes={"vk-a": (None, 60)}),
        replace(OPEN, close_since=NOW - 600),
        (),
        Mode.OPEN,
    ),
    (
        "inference-pending-within-grace",
        snap(4, pending_inf=2),
        replace(CLOSED, pending_since=NOW - 29),
        (),
        Mode.CLOSED,
    ),
    (
        "inference-pending-beyond-grace",
        snap(4, pending_inf=2),
        replace(CLOSED, pending_since=NOW - 30),
        (OPEN_A,),
        Mode.OPEN,
    ),
    (
        "inference-pending-blocks-close",
        snap(40, pending_inf=1, vnodes=OPEN_NODES),
        replace(OPEN, close_since=NOW - 900),
        (),
        Mode.OPEN,
    ),
    (
        "pods-on-virtual-nodes-get-cost",
        snap(5, vnodes=OPEN_NODES, cost=(PodRef("serving", "a"),)),
        OPEN,
        (Action(ActionKind.SET_DELETION_COST, namespace="serving", pod="a", deletion_cost=-100),),
        Mode.OPEN,
    ),
    (
        "clock-backwards-no-flip",
        snap(0),
        replace(CLOSED, low_since=NOW - 900, last_now=NOW + 30),
        (),
        Mode.CLOSED,
    ),
    (
        # A flip stamped ahead of this clock (a previous leader's fast clock) freezes nothing: the hold decides.
        "flip-stamped-in-the-future-does-not-freeze",
        snap(60, vnodes=OPEN_NODES),
        replace(OPEN, changed_at=NOW + 3600, close_since=NOW - 900),
        (CLOSE_A,),
        Mode.CLOSED,
    ),
    (
        "clock-jump-forward-restarts-hold",
        snap(0),
        replace(CLOSED, low_since=NOW - 4000, last_now=NOW - 4000),
        (),
        Mode.CLOSED,
    ),
]


@pytest.mark.parametrize(
    ("snapshot", "state", "actions", "mode"), [row[1:] for row in TABLE], ids=[row[0] for row in TABLE]
)
def test_decision_table(
    snapshot: Snapshot, state: BurstState, actions: tuple[Action, ...], mode: Mode
) -> None:
    decision = decide(snapshot, state, NOW, S)
    assert decision.actions == actions
    assert decision.state.mode is mode
    assert decision.state.last_now == NOW
    assert all(a.kind is not ActionKind.CLOSE_NODE or a.node for a in decision.actions)


@pytest.mark.parametrize(
    ("free", "pending", "pools", "expected"),
    [
        (64, 64, {}, 0),  # no breakdown: free − pending, as before
        (64, 64, {"a": (0, 64), "b": (64, 0)}, 64),  # A's backlog cannot use B's idle GPUs
        (16, 64, {"a": (16, 64)}, 0),  # A's backlog takes all of A, and no more
        (24, 32, {"a": (8, 16), "b": (16, 16)}, 0),  # per pool: max(0, 8 − 16) + max(0, 16 − 16)
        (40, 20, {"a": (16, 8), "b": (8, 0)}, 20),  # 8 + 8 + (16 free − 12 pending outside any pool)
        (8, 30, {"a": (8, 0)}, -22),  # pending without a pool still nets cluster-wide (may go negative)
    ],
    ids=["no-pools", "a-backlog-b-idle", "a-only", "both-pools", "with-unpooled", "unpooled-negative"],
)
def test_effective_free_is_netted_per_pool(
    free: int, pending: int, pools: dict[str, tuple[int, int]], expected: int
) -> None:
    snapshot = snap(free, pending_train=pending, pools=pools)
    assert effective_free_gpus(snapshot) == expected
    assert decide(snapshot, OPEN, NOW, S).effective_free_gpus == expected


@pytest.mark.parametrize(
    ("free", "pending", "pools", "inference_pools", "expected"),
    [
        (64, 0, {"serve": (0, 0), "train": (64, 0)}, ("serve",), 0),  # an idle training pool is no room
        (64, 0, {"serve": (0, 0), "train": (64, 0)}, (), 64),  # unconfined inference may use it
        (40, 0, {"serve": (8, 0), "train": (24, 0)}, ("serve",), 8),  # 8 free GPUs of no pool do not count
        (40, 12, {"serve": (8, 0), "train": (24, 0)}, ("serve",), -4),  # training of no pool may land in serve
        (48, 16, {"a": (16, 16), "b": (16, 0), "c": (16, 0)}, ("a", "b"), 16),  # a's backlog, b's room, not c's
    ],
    ids=["train-pool-idle", "unconfined", "unpooled-free", "unpooled-pending", "two-of-three"],
)
def test_effective_free_counts_only_the_pools_inference_may_use(
    free: int, pending: int, pools: dict[str, tuple[int, int]], inference_pools: tuple[str, ...], expected: int
) -> None:
    snapshot = snap(free, pending_train=pending, pools=pools)
    assert effective_free_gpus(snapshot, inference_pools) == expected
    settings = S.replace(inference_pools=inference_pools)
    assert decide(snapshot, OPEN, NOW, settings).effective_free_gpus == expected


@given(st.dictionaries(st.sampled_from("abcd"), st.tuples(st.integers(0, 64), st.integers(0, 64)), max_size=4),
       st.integers(0, 64), st.integers(0, 64), st.sets(st.sampled_from("abcde")))
def test_confining_inference_never_adds_room(
    pools: dict[str, tuple[int, int]], unpooled_free: int, unpooled_pending: int, confined: set[str]
) -> None:
    free = unpooled_free + sum(f for f, _ in pools.values())
    pending = unpooled_pending + sum(t for _, t in pools.values())
    snapshot = snap(free, alloc=max(free, 1), pending_train=pending, pools=pools)
    unconfined = effective_free_gpus(snapshot)
    narrowed = effective_free_gpus(snapshot, tuple(sorted(confined)))
    assert narrowed <= unconfined
    # Confined to every known pool, only the GPUs of no pool are lost.
    if pools:
        assert effective_free_gpus(snapshot, tuple(sorted(pools))) == unconfined - unpooled_free


def test_burst_opens_while_the_inference_pool_is_full_and_a_training_pool_idles() -> None:
    """The defect: 64 idle GPUs of a pool inference may not use kept the burst closed while its own pool was full."""
    full = snap(64, pools={"serve": (0, 0), "train": (64, 0)})
    held = replace(CLOSED, low_since=NOW - 75)
    assert decide(full, held, NOW, S).flipped is None
    decision = decide(full, held, NOW, S.replace(inference_pools=("serve",)))
    assert decision.flipped is Mode.OPEN
    assert decision.reasons[0] == "open: 0 effective free on-prem GPUs < 1 for 75s"


def test_flip_records_time_and_reason() -> None:
    decision = decide(snap(0), replace(CLOSED, low_since=NOW - 75), NOW, S)
    assert decision.flipped is Mode.OPEN
    assert decision.state.changed_at == NOW
    assert decision.state.low_since is None
    assert decision.reasons == ("open: 0 effective free on-prem GPUs < 1 for 75s",)
    assert decision.effective_free_gpus == 0


def test_blind_decisions_reset_holds() -> None:
    decision = decide(snap(0, age=121), replace(CLOSED, low_since=NOW - 900), NOW, S)
    assert (decision.state.low_since, decision.state.close_since, decision.state.pending_since) == (None, None, None)
    # A clock stepped back restarts the holds from now (this decision flips nothing).
    stepped = decide(snap(0), replace(CLOSED, low_since=NOW - 900, last_now=NOW + 1), NOW, S)
    assert (stepped.state.low_since, stepped.state.close_since, stepped.flipped) == (NOW, None, None)


def test_clock_backwards_reason() -> None:
    decision = decide(snap(0), replace(CLOSED, last_now=NOW + 30), NOW, S)
    assert decision.reasons == ("clock moved back 30.0s: no flip, holds restart",)


def test_unobserved_gap_restarts_hold() -> None:
    decision = decide(snap(20, vnodes=OPEN_NODES), OPEN, NOW, S)
    jumped = decide(snap(20, vnodes=OPEN_NODES, age=-700), decision.state, NOW + 700, S)
    assert jumped.actions == ()
    assert jumped.state.close_since == NOW + 700
    assert jumped.reasons == ("no decision for 700s: holds restart",)


def test_close_condition_needs_hold_counted_from_first_sight() -> None:
    state = OPEN
    decision = decide(snap(20, vnodes=OPEN_NODES), state, NOW, S)
    assert decision.state.close_since == NOW
    assert decision.close_needs_gpus == 8
    state = decision.state
    for t in range(60, 600, 60):  # observed every minute: a sustained condition
        later = decide(snap(20, vnodes=OPEN_NODES, age=-t), state, NOW + t, S)
        assert later.actions == ()
        state = later.state
    last = decide(snap(20, vnodes=OPEN_NODES, age=-600), state, NOW + 600, S)
    assert last.actions == (CLOSE_A,)
    assert last.reasons == ("close: 20 effective free on-prem GPUs >= 8 + 0 in use externally for 600s",)


@pytest.mark.parametrize(
    ("series", "start"),
    [
        ([0, 2, 0, 3, 0, 5, 0, 7, 0], Mode.CLOSED),  # dips below the open line, each shorter than the hold
        ([5, 2, 7, 1, 6, 3, 7, 4], Mode.CLOSED),  # inside the band
        ([5, 2, 7, 1, 6, 3, 7, 4], Mode.OPEN),
        ([9, 12, 7, 30, 5, 20, 6, 8], Mode.OPEN),  # rises above the close line, each shorter than the hold
    ],
)
def test_oscillation_never_flips(series: list[int], start: Mode) -> None:
    vnodes = {"vk-a": ("NoSchedule" if start is Mode.CLOSED else None, 0)}
    state = BurstState(start, last_now=NOW)
    t = NOW
    for step in range(200):
        t += 50.0  # each value lasts 50 s: shorter than both holds
        free = series[step % len(series)]
        decision = decide(replace(snap(free, vnodes=vnodes), observed_at=t), state, t, S)
        assert decision.actions == ()
        state = decision.state
    assert state.mode is start


def test_restart_recovers_mode_from_taints() -> None:
    closed = Snapshot(True, NOW, 64, 5, virtual_nodes={"a": VirtualNode("a", "p", "NoSchedule", 0, 500.0)})
    assert state_from_snapshot(closed, NOW) == BurstState(Mode.CLOSED, changed_at=500.0, last_now=NOW)
    mixed = Snapshot(
        True,
        NOW,
        64,
        5,
        virtual_nodes={
            "a": VirtualNode("a", "p", None, 0, 700.0),
            "b": VirtualNode("b", "p", "NoSchedule", 0, 600.0),
            "new": VirtualNode("new", "p", "NoSchedule", 0, None),
        },
    )
    assert state_from_snapshot(mixed, NOW) == BurstState(Mode.OPEN, changed_at=700.0, last_now=NOW)
    untouched = Snapshot(True, NOW, 64, 5, virtual_nodes={"a": VirtualNode("a", "p", None, 0, None)})
    assert state_from_snapshot(untouched, NOW) == BurstState(Mode.OPEN, changed_at=None, last_now=NOW)


def test_restart_then_decide_keeps_taints_until_hold() -> None:
    snapshot = snap(0)
    state = state_from_snapshot(snapshot, NOW)
    decision = decide(snapshot, state, NOW, S)
    assert decision.actions == ()
    assert decision.state.low_since == NOW


# -- settings ---------------------------------------------------------------------------------------


def test_settings_defaults() -> None:
    s = BurstSettings()
    assert (s.taint_key, s.taint_value, s.gpu_resource) == ("gpucluster.io/burst", "closed", "nvidia.com/gpu")
    assert (s.open_below_free_gpus, s.close_at_free_gpus, s.external_deletion_cost) == (8, 32, -100)
    assert s.resync_seconds == 30
    assert s.changed_at_annotation == "gpucluster.io/burst-changed-at"
    assert BurstSettings(label_prefix="example.org").taint_key == "example.org/burst"


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"close_at_free_gpus": 8}, "cfg.yaml: close_at_free_gpus: must exceed open_below_free_gpus (8)"),
        ({"nope": 1}, "cfg.yaml: unknown key 'nope'; allowed keys: action_backoff_base_seconds"),
        ({"open_hold_seconds": "soon"}, "cfg.yaml: key 'open_hold_seconds' must be a number of seconds"),
        ({"close_at_free_gpus": True}, "cfg.yaml: key 'close_at_free_gpus' must be an integer"),
        ({"open_hold_seconds": -1}, "cfg.yaml: open_hold_seconds: must be >= 0, got -1.0"),
        ({"taint_key": "virtual-kubelet.io/provider"}, "cfg.yaml: taint_key: the provider's own taint"),
        ({"renew_deadline_seconds": 20}, "cfg.yaml: renew_deadline_seconds: must be below lease_duration"),
        ({"provider_taints": {"gpucloud": "no-equals"}},
         "cfg.yaml: provider_taints.gpucloud: must be '<prefix>/<name>=<value>', got 'no-equals'"),
        ({"provider_taints": {"gpucloud": "gpucluster.io/burst=x"}},
         "cfg.yaml: provider_taints.gpucloud: 'gpucluster.io/burst' is the burst taint"),
        ({"provider_taints": ["virtual-kubelet.io/provider=gpucloud"]},
         "cfg.yaml: key 'provider_taints' must be a mapping of names to strings"),
        ({"inference_pools": "serve"}, "cfg.yaml: key 'inference_pools' must be a list of names, got 'serve'"),
        ({"inference_pools": ["serve", 3]}, "cfg.yaml: key 'inference_pools[1]' must be a string, got 3"),
        ({"inference_pools": ["serve", "serve"]},
         "cfg.yaml: inference_pools[1]: must be a distinct pool name, got 'serve'"),
        ({"inference_pools": [""]}, "cfg.yaml: inference_pools[0]: must be a distinct pool name, got ''"),
    ],
)
def test_settings_errors_name_the_key(data: dict[str, object], message: str) -> None:
    with pytest.raises(SettingsError) as err:
        BurstSettings.from_mapping(data, source="cfg.yaml")
    assert str(err.value).startswith(message)


def test_settings_from_file(tmp_path: Path) -> None:
    path = tmp_path / "burst.yaml"
    path.write_text("open_below_free_gpus: 2\nclose_at_free_gpus: '16'\nclose_hold_seconds: 900\n")
    s = load_file(path)
    assert (s.open_below_free_gpus, s.close_at_free_gpus, s.close_hold_seconds) == (2, 16, 900.0)
    assert BurstSettings.from_mapping(json.loads(s.to_json())) == s
    confined = s.replace(inference_pools=("serve", "edge"))
    assert BurstSettings.from_mapping(json.loads(confined.to_json())) == confined
    bad = tmp_path / "bad.json"
    bad.write_text('{"close_at_free_gpus": 0}')
    with pytest.raises(SettingsError, match=f"^{bad}: close_at_free_gpus"):
        load_file(bad)
    with pytest.raises(SettingsError, match="cannot read settings"):
        load_file(tmp_path / "missing.yaml")


# -- incremental view --------------------------------------------------------------------------------


def test_view_aggregates_exclude_thermal_and_cordoned_nodes() -> None:
    nodes = [
        onprem_node("n1", 8),
        onprem_node("hot", 8, thermal=True),
        onprem_node("cordoned", 8, unschedulable=True),
        onprem_node("down", 8, ready=False),
        virtual_node("vk-a", "gpucloud", burst_effect=None, changed_at="2024-05-01T00:00:00Z"),
        {"metadata": {"name": "cpu"}, "status": {"allocatable": {"cpu": "32"}}},
    ]
    pods = [
        gpu_pod("t1", 6, node="n1", workload="training", namespace="train"),
        gpu_pod("t2", 8, node="hot", workload="training", namespace="train"),
        gpu_pod("i1", 2, node="vk-a"),
        gpu_pod("i2", 1, node="vk-a", deletion_cost=-100),
        gpu_pod("p1", 2, unschedulable=True),
        gpu_pod("p2", 4, unschedulable=True, workload="training", namespace="train"),
        gpu_pod("p3", 4),  # pending, not yet judged by the scheduler
        gpu_pod("done", 8, node="n1", phase="Succeeded"),
    ]
    snapshot = ClusterView.from_lists(nodes, pods, S, NOW).snapshot()
    assert (snapshot.onprem_allocatable_gpus, snapshot.onprem_free_gpus) == (8, 2)
    assert (snapshot.pending_inference_gpus, snapshot.pending_training_gpus) == (2, 4)
    assert snapshot.virtual_nodes == {
        "vk-a": VirtualNode("vk-a", "gpucloud", None, 3, 1714521600.0),
    }
    assert snapshot.pods_needing_cost == (PodRef("inference", "i1"),)
    assert snapshot.synced and snapshot.observed_at == NOW


@pytest.mark.parametrize("health_class", ["fatal", "degraded"])
def test_view_counts_no_headroom_on_nodes_the_health_guard_quarantined(health_class: str) -> None:
    """A quarantined node takes no training, whatever the class: its free GPUs must not keep the burst shut."""
    nodes = [onprem_node("ok", 8, pool="a"), onprem_node("sick", 8, pool="a", health=health_class)]
    view = ClusterView.from_lists(nodes, [gpu_pod("t", 2, node="ok", workload="training")], S, NOW)
    snapshot = view.snapshot()
    assert (snapshot.onprem_allocatable_gpus, snapshot.onprem_free_gpus) == (8, 6)
    assert snapshot.pools["a"].free == 6
    # Released by the guard (taint gone): its GPUs count again; quarantined again: they leave again.
    view.apply_node("MODIFIED", onprem_node("sick", 8, pool="a"))
    assert (view.snapshot().onprem_free_gpus, view.snapshot().pools["a"].free) == (14, 14)
    view.apply_node("MODIFIED", onprem_node("sick", 8, pool="a", health=health_class))
    assert view.snapshot().onprem_free_gpus == 6


def test_view_reads_the_health_taint_key_the_guard_writes() -> None:
    from agents.health_guard.contract import Names

    settings = BurstSettings(label_prefix="example.org")
    assert settings.health_taint_key == Names("example.org").taint == "example.org/gpu-health"
    nodes = [onprem_node("ok", 8, settings=settings), onprem_node("sick", 8, health="fatal", settings=settings)]
    assert ClusterView.from_lists(nodes, [], settings, NOW).snapshot().onprem_free_gpus == 8


@pytest.mark.parametrize(("what", "taint"), [
    ("the guard's fence on a leaf whose switch is at fault", {"key": S.switch_fault_taint_key, "value": "leaf-07"}),
    ("a pool's warm spare (the node-pool agent's)", {"key": S.spare_taint_key, "value": "true"}),
])
def test_view_counts_no_headroom_where_training_cannot_land(what: str, taint: dict[str, str]) -> None:
    """Its free GPUs are no headroom (the key is the one its writer writes), and they count again once the taint
    is lifted."""
    from agents.health_guard.contract import Names
    from agents.node_taints import spare_taint_key

    assert S.switch_fault_taint_key == Names(S.label_prefix).switch_fault
    assert S.spare_taint_key == spare_taint_key(S.label_prefix)
    held = onprem_node("held", 8, pool="a")
    held["spec"]["taints"].append({**taint, "effect": "NoSchedule"})
    view = ClusterView.from_lists([onprem_node("ok", 8, pool="a"), held], [], S, NOW)
    assert (view.snapshot().onprem_free_gpus, view.snapshot().pools["a"].free) == (8, 8), what
    view.apply_node("MODIFIED", onprem_node("held", 8, pool="a"))
    assert view.snapshot().onprem_free_gpus == 16, what


def test_view_nets_pending_training_per_pool() -> None:
    nodes = [onprem_node("a1", 8, pool="a"), onprem_node("a2", 8, pool="a"), onprem_node("b1", 8, pool="b"),
             onprem_node("b2", 8, pool="b"), virtual_node("vk-a")]
    pods = [
        gpu_pod("ta", 8, node="a1", workload="training"),
        gpu_pod("ia", 8, node="a2"),
        gpu_pod("ib", 2, node="b1"),
        gpu_pod("wait-a0", 8, unschedulable=True, workload="training", pool="a"),
        gpu_pod("wait-a1", 8, unschedulable=True, workload="training", pool="a"),
        gpu_pod("wait-any", 4, unschedulable=True, workload="training"),
        gpu_pod("wait-missing", 8, unschedulable=True, workload="training", pool="gone"),
    ]
    view = ClusterView.from_lists(nodes, pods, S, NOW)
    snapshot = view.snapshot()
    # A pod confined to a pool that does not exist can never start: it is reported and counts nowhere.
    assert (snapshot.onprem_free_gpus, snapshot.pending_training_gpus) == (14, 20)
    assert [(g.name, g.reason) for g in snapshot.infeasible] == [("wait-missing", "gang needs 8 GPUs, pool gone has 0")]
    assert snapshot.pools == {
        "b": PoolGpus(14, 0, free_nodes={8: 1, 6: 1}),
        "a": PoolGpus(0, 16, unplaced_pods={8: 2}),
    }
    # b's 14 free GPUs minus the 4 pending for any pool; a's and the missing pool's backlog take nothing else.
    assert effective_free_gpus(snapshot) == 10
    view.apply_pod("DELETED", gpu_pod("ia", 8, node="a2"))
    assert view.snapshot().pools["a"] == PoolGpus(8, 16, free_nodes={8: 1}, unplaced_pods={8: 2})
    view.apply_node("MODIFIED", onprem_node("b1", 8, pool="b", unschedulable=True))
    assert view.snapshot().pools["b"] == PoolGpus(8, 0, free_nodes={8: 1})
    view.apply_node("DELETED", onprem_node("b2", 8, pool="b"))
    assert "b" not in view.snapshot().pools


@pytest.mark.parametrize(
    ("spec", "pool"),
    [
        ({"nodeSelector": {"gpucluster.io/pool": "a"}}, "a"),
        ({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "gpucluster.io/pool", "operator": "In", "values": ["a"]}]},
            {"matchExpressions": [{"key": "gpucluster.io/pool", "operator": "In", "values": ["a"]}]}]}}}}, "a"),
        ({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "gpucluster.io/pool", "operator": "In", "values": ["a", "b"]}]}]}}}}, ""),
        ({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "gpucluster.io/pool", "operator": "In", "values": ["a"]}]},
            {"matchExpressions": [{"key": "gpucluster.io/location", "operator": "In", "values": ["onprem"]}]}]}}}},
         ""),
        ({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "gpucluster.io/pool", "operator": "NotIn", "values": ["a"]}]}]}}}}, ""),
        ({}, ""),
    ],
    ids=["node-selector", "same-pool-in-every-term", "two-values", "one-term-unpinned", "not-in", "none"],
)
def test_pod_pool_from_required_affinity(spec: dict[str, Any], pool: str) -> None:
    assert pod_pool({"spec": spec}, "gpucluster.io/pool") == pool


def test_view_incremental_matches_full_list() -> None:
    rng = random.Random(7)

    def node(name: str) -> dict[str, Any]:
        if name.endswith("7"):
            return virtual_node(name, burst_effect=rng.choice([None, "NoSchedule"]))
        return onprem_node(name, 8, thermal=rng.random() < 0.2, pool=rng.choice(["a", "b"]))

    def pod(name: str) -> dict[str, Any]:
        return gpu_pod(
            name,
            rng.randrange(0, 5),
            node=rng.choice([None, *[f"n{i}" for i in range(30)]]),
            workload=rng.choice(["inference", "training", "system"]),
            unschedulable=rng.random() < 0.5,
            phase=rng.choice([None, None, "Succeeded"]),
            deletion_cost=rng.choice([None, -100]),
            pool=rng.choice([None, "a", "b", "c"]),
        )

    def check(got: Snapshot, full: Snapshot) -> None:
        assert replace(got, pods_needing_cost=()) == replace(full, pods_needing_cost=())
        assert sorted(got.pods_needing_cost, key=str) == sorted(full.pods_needing_cost, key=str)

    churn(S, rng, node_names=30, pod_names=300, make_node=node, make_pod=pod, check=check)


def test_view_asks_the_deletion_cost_only_for_pods_of_its_inference_namespace() -> None:
    """The controller's pod Role is the inference namespace's: a pod of another namespace on a virtual node (a
    user's own burst workload, a provider's daemon) is counted but never patched, so no write is refused."""
    pods = [gpu_pod("mine", 1, node="vk-a"), gpu_pod("theirs", 1, node="vk-a", namespace="research"),
            gpu_pod("batch", 2, node="vk-a", workload="training", namespace="training")]
    snapshot = ClusterView.from_lists([virtual_node("vk-a")], pods, S, NOW).snapshot()
    assert snapshot.pods_needing_cost == (PodRef("inference", "mine"),)
    assert snapshot.virtual_nodes["vk-a"].gpus_in_use == 4
    elsewhere = S.replace(inference_namespace="research")
    assert ClusterView.from_lists([virtual_node("vk-a")], pods, elsewhere, NOW).snapshot().pods_needing_cost == (
        PodRef("research", "theirs"),)


def test_view_pod_before_node_and_relist_drops_missing() -> None:
    view = ClusterView(S)
    view.apply_pod("ADDED", gpu_pod("i1", 2, node="vk-a"))
    view.apply_pod("ADDED", gpu_pod("t1", 3, node="n1", workload="training"))
    assert view.snapshot().pods_needing_cost == ()
    view.apply_node("ADDED", virtual_node("vk-a"))
    view.apply_node("ADDED", onprem_node("n1", 8))
    snapshot = view.snapshot()
    assert snapshot.pods_needing_cost == (PodRef("inference", "i1"),)
    assert snapshot.virtual_nodes["vk-a"].gpus_in_use == 2
    assert snapshot.onprem_free_gpus == 5
    assert not snapshot.synced
    view.replace_nodes([onprem_node("n1", 8)], NOW)
    view.replace_pods([gpu_pod("t1", 3, node="n1", workload="training")], NOW)
    snapshot = view.snapshot()
    assert (snapshot.virtual_nodes, snapshot.pods_needing_cost, snapshot.onprem_free_gpus) == ({}, (), 5)
    assert snapshot.synced
    view.mark_unsynced()
    assert not view.snapshot().synced


@pytest.mark.parametrize("state", [CLOSED, OPEN])
def test_a_virtual_node_without_its_provider_taint_is_tainted_first_in_any_mode(state: BurstState) -> None:
    """The provider taint is safety, not hysteresis: it is added whatever the mode, before any other action,
    and only on the node that lacks it."""
    base = snap(20, vnodes={"vk-a": ("NoSchedule", 0), "vk-b": ("NoSchedule", 0)})
    bare = replace(base.virtual_nodes["vk-b"], provider_taint_missing=True)
    snapshot = replace(base, virtual_nodes={**base.virtual_nodes, "vk-b": bare})
    acts = decide(snapshot, state, NOW, S).actions
    assert acts[0] == Action(ActionKind.TAINT_PROVIDER, node="vk-b")
    assert [a for a in acts if a.kind is ActionKind.TAINT_PROVIDER] == [acts[0]]
    assert not [a for a in decide(base, state, NOW, S).actions if a.kind is ActionKind.TAINT_PROVIDER]


def test_view_marks_a_virtual_node_that_lacks_its_providers_taint() -> None:
    settings = S.replace(provider_taints={"gpucloud": "virtual-kubelet.io/provider=gpucloud"})
    bare = virtual_node("vk-bare", "gpucloud", settings=settings)
    bare["spec"]["taints"] = [t for t in bare["spec"]["taints"] if t["key"] != "virtual-kubelet.io/provider"]
    wrong_value = virtual_node("vk-wrong", "gpucloud", settings=settings)
    wrong_value["spec"]["taints"][0]["value"] = "othercloud"
    nodes = [bare, wrong_value, virtual_node("vk-ok", "gpucloud", settings=settings),
             virtual_node("vk-unknown", "othercloud", settings=settings), onprem_node("n1", 8)]
    snapshot = ClusterView.from_lists(nodes, [], settings, NOW).snapshot()
    assert {n: v.provider_taint_missing for n, v in snapshot.virtual_nodes.items()} == {
        "vk-bare": True, "vk-wrong": True, "vk-ok": False, "vk-unknown": False}


def test_each_provider_gets_its_own_deletion_cost_from_view_to_action() -> None:
    """Replicas on the dearer provider carry the lower cost, so a scale-down removes them first; a provider the
    settings do not rank takes external_deletion_cost; a node relabelled to another provider is asked again."""
    ranked = S.replace(provider_deletion_costs={"dear": -150, "cheap": -100})
    nodes = [onprem_node("n1", 8), virtual_node("vk-dear", "dear"), virtual_node("vk-cheap", "cheap"),
             virtual_node("vk-other", "other")]
    pods = [gpu_pod("d1", 1, node="vk-dear"), gpu_pod("d2", 1, node="vk-dear", deletion_cost=-100),
            gpu_pod("d3", 1, node="vk-dear", deletion_cost=-150), gpu_pod("c1", 1, node="vk-cheap", deletion_cost=-100),
            gpu_pod("o1", 1, node="vk-other")]
    view = ClusterView.from_lists(nodes, pods, ranked, NOW)
    snapshot = view.snapshot()
    wanted = {PodRef("inference", "d1"): -150, PodRef("inference", "d2"): -150, PodRef("inference", "o1"): -100}
    assert dict(snapshot.deletion_costs) == wanted
    assert sorted(snapshot.pods_needing_cost, key=str) == sorted(wanted, key=str)
    decision = decide(snapshot, state_from_snapshot(snapshot, NOW), NOW, ranked)
    patches = {(a.pod, a.deletion_cost) for a in decision.actions if a.kind is ActionKind.SET_DELETION_COST}
    assert patches == {("d1", -150), ("d2", -150), ("o1", -100)}
    view.apply_node("MODIFIED", virtual_node("vk-other", "dear", resource_version="2"))
    assert view.snapshot().deletion_costs[PodRef("inference", "o1")] == -150
    view.apply_pod("MODIFIED", gpu_pod("o1", 1, node="vk-other", deletion_cost=-150))
    assert PodRef("inference", "o1") not in view.snapshot().pods_needing_cost


@pytest.mark.parametrize(("costs", "message"), [
    ({"dear": True}, "provider_deletion_costs: 'dear' must map to an int32 pod-deletion-cost, got True"),
    ({"dear": -(2**31) - 1}, "provider_deletion_costs: 'dear' must map to an int32 pod-deletion-cost, got -2147483649"),
    ({"dear": "-150"}, "provider_deletion_costs: 'dear' must map to an int32 pod-deletion-cost, got '-150'"),
    ({"": -150}, "provider_deletion_costs: '' must map to an int32 pod-deletion-cost, got -150"),
])
def test_provider_deletion_costs_are_checked(costs: dict[str, Any], message: str) -> None:
    with pytest.raises(SettingsError) as err:
        S.replace(provider_deletion_costs=costs)
    assert str(err.value) == message


_JSON = st.recursive(st.none() | st.booleans() | st.integers(-(2**40), 2**40) | st.floats() | st.text(max_size=8),
                     lambda inner: st.lists(inner, max_size=3)
                     | st.dictionaries(st.text(max_size=6), inner, max_size=3),
                     max_leaves=6)


@hypothesis_settings(max_examples=300, deadline=None)
@given(data=st.dictionaries(st.sampled_from([*BurstSettings.model_fields, "bogus", "openHoldSeconds"]), _JSON,
                            max_size=4))
def test_any_settings_file_is_read_or_refused_naming_the_file_and_a_key(data: dict[str, Any]) -> None:
    """Hostile ConfigMap contents: the parser returns settings or one SettingsError that names the file and a
    key; never another exception, never a half-read object."""
    try:
        parsed = BurstSettings.parse(data, source="cm.yaml")
    except SettingsError as exc:
        message = str(exc)
        assert message.startswith("cm.yaml: ")
        names = {*BurstSettings.model_fields, "bogus", "openHoldSeconds"}
        assert any(name in message for name in names), message
    else:
        assert BurstSettings.parse(json.loads(parsed.to_json()), source="round trip") == parsed


@hypothesis_settings(max_examples=200, deadline=None)
@given(costs=st.dictionaries(st.sampled_from(["dear", "cheap", "mid", "unpriced"]), st.integers(-10**6, 10**6)),
       providers=st.lists(st.sampled_from(["dear", "cheap", "mid", "unpriced"]), min_size=1, max_size=6))
def test_the_burst_opens_the_cheapest_provider_first_and_closes_the_dearest_first(
        costs: dict[str, int], providers: list[str]) -> None:
    """The taints come off one write after another: a replica placed between two writes lands on whichever node
    is already open, so the open order is the fill order (the highest pod-deletion-cost, i.e. the cheapest
    provider, first) and the close order its reverse. Names sort the other way round from prices on purpose."""
    settings = S.model_copy(update={"provider_deletion_costs": costs})
    names = [f"vk-{i}-{p}" for i, p in enumerate(providers)]

    def snapshot(effect: str | None, free: int) -> Snapshot:
        return replace(snap(free), virtual_nodes={
            n: VirtualNode(n, p, effect, 0) for n, p in zip(names, providers, strict=True)})

    def cost(node: str) -> int:
        return settings.deletion_cost_for(providers[names.index(node)])

    opened = [a.node for a in decide(snapshot("NoSchedule", 0), replace(CLOSED, low_since=NOW - 60), NOW,
                                     settings).actions if a.kind is ActionKind.OPEN_NODE]
    assert sorted(opened) == sorted(names)
    assert [cost(n) for n in opened] == sorted((cost(n) for n in opened), reverse=True), opened
    closed = [a.node for a in decide(snapshot(None, 20), replace(OPEN, close_since=NOW - 600), NOW,
                                     settings).actions if a.kind is ActionKind.CLOSE_NODE]
    assert sorted(closed) == sorted(names)
    assert [cost(n) for n in closed] == sorted(cost(n) for n in closed), closed


def test_a_burst_over_two_priced_providers_opens_the_cheaper_before_the_dearer() -> None:
    """The local stack's pair: backup-cloud sorts first by name and is dearer (a lower deletion cost)."""
    settings = S.model_copy(update={"provider_deletion_costs": {"local-cloud": 100_000, "backup-cloud": 99_950}})
    nodes = {"vk-backup-cloud": VirtualNode("vk-backup-cloud", "backup-cloud", "NoSchedule", 0),
             "vk-local-cloud": VirtualNode("vk-local-cloud", "local-cloud", "NoSchedule", 0)}
    decision = decide(replace(snap(0), virtual_nodes=nodes), replace(CLOSED, low_since=NOW - 60), NOW, settings)
    assert [a.node for a in decision.actions if a.kind is ActionKind.OPEN_NODE] == ["vk-local-cloud",
                                                                                   "vk-backup-cloud"]
