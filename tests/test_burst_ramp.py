"""The handover's cover for the demand ramp: `track_replicas` (each service's replica-count history over the
window), `expected_ramp` (its rise carried forward over the external start) and `plan_standby` with the
ramp; `decide` keeps the gang gated until that larger cover is ready, or until the timeout.
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
    expected_ramp,
    plan_standby,
    track_replicas,
)

NOW = 10_000.0
GANG = (PodRef("training", "gang-0"),)
WINDOW = 300.0
AHEAD = 180.0

# id, history ((time, count) change points), now, window, ahead, replicas expected
RAMP_TABLE = [
    ("flat", ((NOW - 900, 40),), NOW, WINDOW, AHEAD, 0),
    ("rise-over-the-window", ((NOW - 400, 40), (NOW - 100, 70)), NOW, WINDOW, AHEAD, 18),
    ("rounded-up", ((NOW - 400, 40), (NOW - 100, 41)), NOW, WINDOW, AHEAD, 1),
    ("falling", ((NOW - 400, 70), (NOW - 100, 40)), NOW, WINDOW, AHEAD, 0),
    ("fell-then-rose-above-the-window-start", ((NOW - 400, 50), (NOW - 200, 30), (NOW - 50, 60)), NOW, WINDOW,
     AHEAD, 6),
    ("short-history-from-the-oldest-point", ((NOW - 60, 40), (NOW - 10, 70)), NOW, WINDOW, AHEAD, 18),
    ("capped-at-the-current-count", ((NOW - 400, 1), (NOW - 10, 10)), NOW, WINDOW, 3600.0, 10),
    ("nothing-ahead", ((NOW - 400, 40), (NOW - 100, 70)), NOW, WINDOW, 0.0, 0),
    ("no-window", ((NOW - 400, 40), (NOW - 100, 70)), NOW, 0.0, AHEAD, 0),
    ("no-history", (), NOW, WINDOW, AHEAD, 0),
]


@pytest.mark.parametrize(("points", "now", "window", "ahead", "ramp"), [t[1:] for t in RAMP_TABLE],
                         ids=[t[0] for t in RAMP_TABLE])
def test_expected_ramp_table(points: tuple[tuple[float, int], ...], now: float, window: float, ahead: float,
                             ramp: int) -> None:
    assert expected_ramp(points, now, window, ahead) == ramp


@given(
    counts=st.lists(st.integers(0, 500), min_size=1, max_size=12),
    ahead=st.floats(0, 900, allow_nan=False),
    more=st.floats(0, 900, allow_nan=False),
)
def test_expected_ramp_is_bounded_and_monotone_in_how_far_ahead(counts: list[int], ahead: float,
                                                                 more: float) -> None:
    points = tuple((NOW - 30.0 * (len(counts) - i), n) for i, n in enumerate(counts))
    ramp = expected_ramp(points, NOW, WINDOW, ahead)
    assert 0 <= ramp <= counts[-1]
    assert expected_ramp(points, NOW, WINDOW, ahead + more) >= ramp


def svc(live: int, ready: int | None = None, onprem: Mapping[str, int] | None = None, standby: int = 0,
        standby_ready: int | None = None, minimum: int = 2) -> ServiceReplicas:
    ready = live if ready is None else ready
    onprem = {"a": ready} if onprem is None else dict(onprem)
    return ServiceReplicas(min_replicas=minimum, main_live=live, main_ready=ready,
                           main_ready_external=ready - sum(onprem.values()), main_ready_onprem=onprem,
                           standby_live=standby, standby_ready=standby if standby_ready is None else standby_ready)


def test_track_replicas_keeps_changes_back_to_the_window_start() -> None:
    seen: Mapping[str, tuple[tuple[float, int], ...]] = {}
    for t, n in ((0.0, 10), (5.0, 10), (10.0, 12), (200.0, 15), (400.0, 15)):
        seen = track_replicas(seen, {"web": svc(n)}, t, WINDOW)
    assert seen == {"web": ((10.0, 12), (200.0, 15))}  # 12 was the count when the window opened at 100 s
    seen = track_replicas(seen, {"web": svc(15)}, 500.0, WINDOW)
    assert seen == {"web": ((200.0, 15),)}
    assert track_replicas(seen, {}, 505.0, WINDOW) == {}  # a service no longer listed is forgotten


@given(
    changes=st.lists(st.tuples(st.floats(0, 50, allow_nan=False), st.integers(0, 50)), min_size=1, max_size=10),
    idle=st.lists(st.floats(0, 400, allow_nan=False), min_size=1, max_size=6),
)
def test_track_replicas_is_the_same_whether_or_not_unchanged_ticks_ran(
    changes: list[tuple[float, int]], idle: list[float]
) -> None:
    """Skipping decisions whose inputs did not change (the simulator's quiet ticks) changes no history."""
    every: Mapping[str, tuple[tuple[float, int], ...]] = {}
    skipped: Mapping[str, tuple[tuple[float, int], ...]] = {}
    t = 0.0
    for step, n in changes:
        t += step
        every = track_replicas(every, {"web": svc(n)}, t, WINDOW)
        skipped = track_replicas(skipped, {"web": svc(n)}, t, WINDOW)
        for pause in idle:  # the same count seen again later: only `every` looks
            every = track_replicas(every, {"web": svc(n)}, t + pause, WINDOW)
        t += max(idle)
        every = track_replicas(every, {"web": svc(n)}, t, WINDOW)
        skipped = track_replicas(skipped, {"web": svc(n)}, t, WINDOW)
    assert every == skipped


def snapshot(services: Mapping[str, ServiceReplicas], unplaced: int = 16, free: int = 0) -> Snapshot:
    return Snapshot(
        synced=True, observed_at=NOW - 1, onprem_allocatable_gpus=256, onprem_free_gpus=free,
        pending_training_gpus=unplaced, virtual_nodes={"vk": VirtualNode("vk", "cloud", None, 0)},
        pools={"a": PoolGpus(free=free, pending_training=unplaced)}, services=dict(services),
        unplaced_training={"a": unplaced} if unplaced else {}, gated_pods=GANG if unplaced else (),
    )


# id, service, ramp, cover, targets
PLAN_TABLE = [
    ("gang-cover-plus-the-ramp", svc(20), 6, Cover.CURRENT, {"web": 26}),
    ("no-ramp-replaces-what-is-taken", svc(20), 0, Cover.CURRENT, {"web": 20}),
    ("unready-replicas-and-the-ramp", svc(24, ready=20), 6, Cover.CURRENT, {"web": 30}),
    ("minimum-cover-keeps-the-floor-only", svc(20), 6, Cover.MINIMUM, {"web": 2}),
    ("live-standby-bridges-the-ramp-after-the-take", svc(20, onprem={}, standby=10), 6, Cover.CURRENT,
     {"web": 6}),
]


@pytest.mark.parametrize(("service", "ramp", "cover", "targets"), [t[1:] for t in PLAN_TABLE],
                         ids=[t[0] for t in PLAN_TABLE])
def test_plan_standby_with_the_ramp_table(service: ServiceReplicas, ramp: int, cover: Cover,
                                          targets: Mapping[str, int]) -> None:
    unplaced = 16 if service.main_ready_onprem else 0
    plan = plan_standby(snapshot({"web": service}, unplaced), False, cover, Sizing.POOL, ramp={"web": ramp})
    assert dict(plan.targets) == targets


def test_a_service_with_nothing_at_risk_and_no_standby_gets_no_ramp_standby() -> None:
    plan = plan_standby(snapshot({"web": svc(20)}, unplaced=0), False, Cover.CURRENT, ramp={"web": 6})
    assert dict(plan.targets) == {} and dict(plan.ramp) == {}


@given(
    live=st.integers(0, 60), unready=st.integers(0, 20), onprem=st.integers(0, 60), standby=st.integers(0, 30),
    ramp=st.integers(0, 40), more=st.integers(0, 40), minimum=st.integers(1, 10),
    sizing=st.sampled_from(list(Sizing)),
)
def test_cover_holds_what_the_gang_takes_and_grows_with_the_ramp(
    live: int, unready: int, onprem: int, standby: int, ramp: int, more: int, minimum: int, sizing: Sizing
) -> None:
    ready = max(0, live - unready)
    onprem = min(onprem, ready)
    service = svc(live, ready=ready, onprem={"a": onprem}, standby=standby, minimum=minimum)
    snap = snapshot({"web": service}, unplaced=16)

    def target(r: int) -> int:
        return plan_standby(snap, False, Cover.CURRENT, sizing, ramp={"web": r}).targets.get("web", 0)

    plan = plan_standby(snap, False, Cover.CURRENT, sizing, ramp={"web": ramp})
    taken = plan.at_risk.get("web", 0)
    # What stays ready once the gang has taken its replicas, plus the standby, reaches the goal and the ramp.
    if taken:
        assert ready - taken + target(ramp) >= max(minimum, live) + ramp
        assert target(ramp) >= taken
    # Monotone in the ramp, and the ramp adds no more than itself.
    assert target(ramp) <= target(ramp + more) <= target(ramp) + more


def test_settings_carry_the_ramp_and_refuse_negative_seconds() -> None:
    assert BurstSettings().handover.ramp_seconds == 0.0  # off by default: see the setting's comment
    s = BurstSettings.from_mapping({"handover": {"ramp_seconds": 180, "ramp_window_seconds": 120}})
    assert (s.handover.ramp_seconds, s.handover.ramp_window_seconds) == (180.0, 120.0)
    assert BurstSettings.from_mapping(s.to_mapping()) == s
    with pytest.raises(SettingsError, match=r"handover.ramp_seconds: must be >= 0, got -1"):
        BurstSettings.parse({"handover": {"ramp_seconds": -1}})
    with pytest.raises(SettingsError, match=r"handover.ramp_window_seconds: must be >= 0"):
        BurstSettings.parse({"handover": {"ramp_window_seconds": -5}})


RAMPING = BurstSettings(open_below_free_gpus=1, close_at_free_gpus=4, handover_services={"web": 2},
                        handover=HandoverTunables(timeout_seconds=300.0, ramp_seconds=AHEAD,
                                                  ramp_window_seconds=WINDOW))


def _standby(decision_actions: tuple[object, ...]) -> list[int]:
    return [a.replicas for a in decision_actions if getattr(a, "kind", None) is ActionKind.SET_STANDBY]


def _ungated(decision_actions: tuple[object, ...]) -> list[str]:
    return [a.pod for a in decision_actions if getattr(a, "kind", None) is ActionKind.UNGATE]


def test_the_gang_waits_for_the_cover_of_the_ramp_measured_while_it_waits() -> None:
    """Admitted while the service is flat, the gang meets a ramp while gated: the standby grows with it and the
    gate stays until the larger cover is ready."""
    state = BurstState(Mode.OPEN, changed_at=1000.0, last_now=NOW - 400)
    state = decide(snapshot({"web": svc(20)}, unplaced=0), state, NOW - 300, RAMPING).state
    flat = decide(snapshot({"web": svc(20)}), state, NOW - 200, RAMPING)
    assert _standby(flat.actions) == [20] and dict(flat.ramp) == {}
    # The HPA adds 10 replicas (not ready yet); 20 ready ones would still be taken.
    rising = decide(snapshot({"web": svc(30, ready=20, standby=20)}), flat.state, NOW - 100, RAMPING)
    assert dict(rising.ramp) == {"web": 6}  # +10 over the 300 s window, carried 180 s ahead
    assert _standby(rising.actions) == [36] and not _ungated(rising.actions)
    # The standby that covered the admission-time take is ready, the ramp's part is not: still gated.
    part = decide(snapshot({"web": svc(30, ready=20, standby=36, standby_ready=30)}), rising.state, NOW - 50,
                  RAMPING)
    assert not _ungated(part.actions)
    ready = decide(snapshot({"web": svc(30, ready=20, standby=36)}), part.state, NOW, RAMPING)
    assert _ungated(ready.actions) == ["gang-0"]


def test_without_the_ramp_the_admission_time_cover_releases_the_gang() -> None:
    off = BurstSettings(open_below_free_gpus=1, close_at_free_gpus=4, handover_services={"web": 2})
    state = BurstState(Mode.OPEN, changed_at=1000.0, last_now=NOW - 400)
    state = decide(snapshot({"web": svc(20)}, unplaced=0), state, NOW - 300, off).state
    rising = decide(snapshot({"web": svc(30, ready=20, standby=30)}), state, NOW - 100, off)
    assert dict(rising.ramp) == {} and rising.state.replicas_seen == {}
    assert _ungated(rising.actions) == ["gang-0"]


def test_the_ramp_cover_still_yields_to_the_timeout() -> None:
    state = BurstState(Mode.OPEN, changed_at=1000.0, last_now=NOW - 400,
                       gated_seen={GANG[0]: NOW - 300}, replicas_seen={"web": ((NOW - 400, 20), (NOW - 100, 30))})
    late = decide(snapshot({"web": svc(30, ready=20, standby=36, standby_ready=20)}), state, NOW, RAMPING)
    assert _ungated(late.actions) == ["gang-0"]
    assert any("standby not ready after 300s" in r and "for the ramp" in r for r in late.reasons)


def test_a_clock_step_back_shifts_the_replica_history_with_it() -> None:
    state = BurstState(Mode.OPEN, changed_at=1000.0, last_now=NOW,
                       replicas_seen={"web": ((NOW - 200, 20), (NOW - 100, 30))})
    back = decide(snapshot({"web": svc(30, ready=20, standby=0)}), state, NOW - 60, RAMPING)
    assert back.state.replicas_seen == {"web": ((NOW - 260, 20), (NOW - 160, 30))}
    assert dict(back.ramp) == {"web": 6}
