"""Decision tables for the health guard's pure core: classes, hysteresis, missing and stale metrics, the
rate limit and its breaker, probation, the repair mark, flapping, and the operator's word."""

from __future__ import annotations

from dataclasses import replace

import pytest

from agents.health_guard.contract import DCGM, FATAL_XIDS, IB, HealthClass, HealthSettings
from agents.health_guard.decide import (
    Decision,
    Drain,
    GuardState,
    MarkCondition,
    NodeStatus,
    NodeView,
    Observations,
    Quarantine,
    Reading,
    RecordOverride,
    Release,
    Suppress,
    TripBreaker,
    decide,
    pool_allowance,
)
from tests.test_health_guard_xid_query import listed_xids

FATAL, DEGRADED = HealthClass.FATAL, HealthClass.DEGRADED
T0 = 1_800_000_000.0
S = HealthSettings(
    probation_seconds=60, max_nodes_per_hour=2, max_nodes_quarantined=3,
    max_pool_percent_per_hour=100, max_pool_percent_quarantined=100,
)
POOL = [f"gpu-{i:02d}" for i in range(1, 9)]


def nodes(**overrides: NodeView) -> dict[str, NodeView]:
    out = {n: NodeView(n, "a") for n in POOL}
    out.update(overrides)
    return out


def obs(now: float, temps: dict[str, float] | None = None, xid79: tuple[str, ...] = (),
        xid94: tuple[str, ...] = (), dcgm_seen: float | None = None, ib_down: tuple[str, ...] = (),
        reporting: tuple[str, ...] = tuple(POOL)) -> Observations:
    seen = now if dcgm_seen is None else dcgm_seen
    temps = {n: 50.0 for n in reporting} | (temps or {})
    return Observations(
        readings={"gpu-temperature": temps, "xid-fatal": {n: 1.0 for n in xid79},
                  "xid-degraded": {n: 1.0 for n in xid94}, "ib-port-down": {n: 1.0 for n in ib_down}},
        last_seen={DCGM: {n: seen for n in reporting}, IB: {n: now for n in reporting}},
    )


def kinds(decision, node: str) -> list[str]:
    return [type(a).__name__ for a in decision.actions if getattr(a, "node", None) == node]


# --------------------------------------------------------------------------- every class


@pytest.mark.parametrize(("signals", "expected"), [
    ({"xid79": ("gpu-01",)}, FATAL),
    ({"ib_down": ("gpu-01",)}, None),  # held 60 s: not at once
    ({"xid94": ("gpu-01",)}, DEGRADED),
    ({"xid94": ("gpu-01",), "xid79": ("gpu-01",)}, FATAL),  # the worst class wins
    ({"temps": {"gpu-01": 80.0}}, None),  # the temperature is held 120 s first
])
def test_class_of_a_signal_on_first_sight(signals, expected) -> None:
    d = decide(S, obs(T0, **signals), nodes(), GuardState(), T0)
    q = [a for a in d.actions if isinstance(a, Quarantine)]
    if expected is None:
        assert q == [] and d.status["gpu-01"] is NodeStatus.PENDING
    else:
        assert [(a.node, a.health_class) for a in q] == [("gpu-01", expected)]
        assert Drain("gpu-01", expected) in d.actions
        assert d.status["gpu-01"] is NodeStatus.QUARANTINED


def test_every_default_signal_maps_to_a_class_and_a_source() -> None:
    classes = {s.name: s.health_class for s in HealthSettings().signals}
    assert classes == {
        "xid-fatal": FATAL, "ecc-uncorrectable": FATAL, "row-remap-failure": FATAL, "ib-port-down": FATAL,
        "gpu-temperature": DEGRADED, "xid-degraded": DEGRADED, "nvlink-errors": DEGRADED,
        "nvlink-recovery": DEGRADED, "ib-link-errors": DEGRADED, "ecc-correctable-storm": DEGRADED,
    }
    assert all(s.source for s in HealthSettings().signals)
    assert listed_xids(HealthSettings().signal("xid-fatal").query) == sorted(FATAL_XIDS)


def test_ib_port_down_is_fatal_after_its_hold() -> None:
    d1 = decide(S, obs(T0, ib_down=("gpu-02",)), nodes(), GuardState(), T0)
    d2 = decide(S, obs(T0 + 59, ib_down=("gpu-02",)), nodes(), d1.state, T0 + 59)
    d3 = decide(S, obs(T0 + 60, ib_down=("gpu-02",)), nodes(), d2.state, T0 + 60)
    assert not [a for a in d2.actions if isinstance(a, Quarantine)]
    assert [a.health_class for a in d3.actions if isinstance(a, Quarantine)] == [FATAL]


# --------------------------------------------------------------------------- temperature and hysteresis


def run(settings: HealthSettings, steps: list[tuple[int, float]], view: NodeView | None = None) -> list[Decision]:
    """Feed (seconds, temperature of gpu-01) steps; returns the decisions."""
    state: GuardState = GuardState()
    out: list[Decision] = []
    for t, temp in steps:
        d = decide(settings, obs(T0 + t, {"gpu-01": temp}), nodes(**({"gpu-01": view} if view else {})), state,
                   T0 + t)
        state, out = d.state, [*out, d]
    return out


@pytest.mark.parametrize(("steps", "quarantined_at"), [
    ([(0, 78.0), (60, 79.0), (120, 78.0)], 2),            # at the limit, held 120 s
    ([(0, 80.0), (60, 77.9), (120, 80.0), (240, 80.0)], 3),  # one sample below restarts the hold
    ([(0, 77.9), (120, 77.9), (240, 77.9)], None),         # below the limit never
    ([(0, 85.0), (119, 85.0)], None),                       # not yet held
])
def test_temperature_hold(steps, quarantined_at) -> None:
    decisions = run(S, steps)
    hits = [i for i, d in enumerate(decisions) if any(isinstance(a, Quarantine) for a in d.actions)]
    assert hits == ([] if quarantined_at is None else [quarantined_at])


def quarantined(cls=DEGRADED, reasons=("gpu-temperature",), **kw) -> NodeView:
    kw.setdefault("history", (T0 - 3600,))
    return NodeView("gpu-01", "a", quarantined=cls, marked=True, reasons=reasons, condition_false=True, **kw)


@pytest.mark.parametrize(("temps", "released"), [
    ([72.0, 72.0, 72.0], True),    # below 73 °C (limit − band) for the probation: released
    ([75.0, 75.0, 75.0], False),   # between 73 and 78: hysteresis keeps it out
    ([72.0, 75.0, 72.0], False),   # a break in probation restarts it
])
def test_temperature_hysteresis_and_probation(temps, released) -> None:
    view = quarantined()
    state = GuardState()
    d = None
    for i, temp in enumerate(temps):
        d = decide(S, obs(T0 + 30 * i, {"gpu-01": temp}), nodes(**{"gpu-01": view}), state, T0 + 30 * i)
        state = d.state
    assert d is not None
    assert (Release("gpu-01", DEGRADED, "healthy for 60s") in d.actions) is released
    assert d.status["gpu-01"] is (NodeStatus.HEALTHY if released else
                                  NodeStatus.PROBATION if temps[-1] < 73 else NodeStatus.QUARANTINED)


# --------------------------------------------------------------------------- missing and stale metrics


def test_missing_metrics_never_unhealthy_and_never_healthy() -> None:
    none = Observations()
    d = decide(S, none, nodes(), GuardState(), T0)
    assert d.actions == () and set(d.status.values()) == {NodeStatus.UNKNOWN}
    # A quarantined node without data is not released, however long.
    view = quarantined()
    state = GuardState()
    for t in (0, 100, 10_000):
        d = decide(S, none, nodes(**{"gpu-01": view}), state, T0 + t)
        state = d.state
    assert not [a for a in d.actions if isinstance(a, Release)]
    assert d.status["gpu-01"] is NodeStatus.QUARANTINED


def test_stale_metrics_never_unhealthy() -> None:
    # XID 79 and 90 °C, but DCGM last reported 121 s ago (stale after 120 s): nothing happens.
    stale = obs(T0, {"gpu-01": 90.0}, xid79=("gpu-01",), dcgm_seen=T0 - 121)
    d = decide(S, stale, nodes(), GuardState(), T0)
    assert not [a for a in d.actions if isinstance(a, Quarantine)]
    assert d.readings["gpu-01"]["xid-fatal"] is Reading.UNKNOWN
    fresh = obs(T0, xid79=("gpu-01",), dcgm_seen=T0 - 120)
    assert [a.node for a in decide(S, fresh, nodes(), GuardState(), T0).actions if isinstance(a, Quarantine)] == [
        "gpu-01"]


def test_failed_query_is_unknown_not_clear() -> None:
    o = obs(T0)
    failed = Observations(o.readings, o.last_seen, frozenset({"gpu-temperature"}))
    view = quarantined()
    state = GuardState()
    for t in (0, 100):
        d = decide(S, failed, nodes(**{"gpu-01": view}), state, T0 + t)
        state = d.state
    assert d.status["gpu-01"] is NodeStatus.QUARANTINED


# --------------------------------------------------------------------------- rate limit and breaker


def test_the_third_node_in_an_hour_is_refused_and_trips_the_breaker() -> None:
    d = decide(S, obs(T0, xid79=("gpu-01", "gpu-02", "gpu-03")), nodes(), GuardState(), T0)
    assert [a.node for a in d.actions if isinstance(a, Quarantine)] == ["gpu-01", "gpu-02"]
    sup = [a for a in d.actions if isinstance(a, Suppress)]
    assert [a.node for a in sup] == ["gpu-03"]
    assert "max_nodes_per_hour is 2" in sup[0].limit
    assert [type(a) for a in d.actions if isinstance(a, TripBreaker)] == [TripBreaker]
    assert d.breaker_tripped and d.status["gpu-03"] is NodeStatus.SUPPRESSED


@pytest.mark.parametrize(("history_age", "allowed"), [(3599, False), (3600, True)])
def test_hour_window_edge(history_age, allowed) -> None:
    # Two nodes were quarantined (and released) `history_age` seconds ago; a third one now.
    old = {n: NodeView(n, "a", history=(T0 - history_age,)) for n in ("gpu-05", "gpu-06")}
    d = decide(S, obs(T0, xid79=("gpu-01",)), nodes(**old), GuardState(), T0)
    assert bool([a for a in d.actions if isinstance(a, Quarantine)]) is allowed


def test_total_limit_counts_nodes_already_quarantined() -> None:
    s = S.model_copy(update={"max_nodes_quarantined": 2, "max_nodes_per_hour": 10})
    held = {n: NodeView(n, "a", quarantined=DEGRADED, marked=True, reasons=("gpu-temperature",),
                        condition_false=True, history=(T0 - 7200,)) for n in ("gpu-07", "gpu-08")}
    d = decide(s, obs(T0, {"gpu-07": 90.0, "gpu-08": 90.0}, xid79=("gpu-01",)), nodes(**held), GuardState(), T0)
    assert [a.limit for a in d.actions if isinstance(a, Suppress)] == [
        "2 nodes already quarantined, max_nodes_quarantined is 2"]


@pytest.mark.parametrize(("percent", "size", "allowance"), [(25, 8, 2), (10, 8, 1), (0, 8, 0), (50, 3, 1),
                                                             (100, 4, 4)])
def test_pool_allowance(percent, size, allowance) -> None:
    assert pool_allowance(percent, size) == allowance


def test_pool_percent_limits_one_pool_not_another() -> None:
    s = S.model_copy(update={"max_nodes_per_hour": 10, "max_nodes_quarantined": 10,
                             "max_pool_percent_quarantined": 25})
    view = {n: NodeView(n, "a" if n <= "gpu-04" else "b") for n in POOL}
    d = decide(s, obs(T0, xid79=("gpu-01", "gpu-02", "gpu-05")), view, GuardState(), T0)
    # Pool a has 4 nodes: 25 % allows one. Pool b is untouched by a's limit, but the breaker trips first.
    assert [a.node for a in d.actions if isinstance(a, Quarantine)] == ["gpu-01"]
    assert "pool a has 1 of 4 nodes quarantined" in next(a.limit for a in d.actions if isinstance(a, Suppress))


def test_worst_first_within_the_limit() -> None:
    s = S.model_copy(update={"max_nodes_per_hour": 1})
    d = decide(s, obs(T0, xid94=("gpu-01",), xid79=("gpu-05",)), nodes(), GuardState(), T0)
    assert [(a.node, a.health_class) for a in d.actions if isinstance(a, Quarantine)] == [("gpu-05", FATAL)]


def test_breaker_stays_tripped_until_a_person_resets_it() -> None:
    tripped = "2026-12-01T00:00:00Z gpu-03 refused"
    # Days later, with no quarantine in the window, a new fault is still only reported.
    later = T0 + 5 * 86400
    d = decide(S, obs(later, xid79=("gpu-04",)), nodes(), GuardState(), later, breaker=tripped)
    assert not [a for a in d.actions if isinstance(a, Quarantine)]
    assert [a.node for a in d.actions if isinstance(a, Suppress)] == ["gpu-04"]
    assert not [a for a in d.actions if isinstance(a, TripBreaker)]  # already recorded
    # A person removed the annotation: the guard acts again.
    d = decide(S, obs(T0, xid79=("gpu-04",)), nodes(), GuardState(), T0, breaker=None)
    assert [a.node for a in d.actions if isinstance(a, Quarantine)] == ["gpu-04"]


def test_tripped_breaker_still_drains_and_releases() -> None:
    view = quarantined(history=(T0 - 7200,))
    state = GuardState(healthy_since={"gpu-01": T0 - 60})
    d = decide(S, obs(T0, {"gpu-01": 60.0}), nodes(**{"gpu-01": view}), state, T0, breaker="tripped")
    assert kinds(d, "gpu-01") == ["Drain", "Release"]


def test_escalation_is_not_rate_limited() -> None:
    held = quarantined()
    s = S.model_copy(update={"max_nodes_quarantined": 1, "max_nodes_per_hour": 1})
    d = decide(s, obs(T0, xid79=("gpu-01",)), nodes(**{"gpu-01": held}), GuardState(), T0, breaker="tripped")
    q = [a for a in d.actions if isinstance(a, Quarantine)]
    assert [(a.health_class, a.escalation, a.reasons) for a in q] == [(FATAL, True, ("gpu-temperature", "xid-fatal"))]


# --------------------------------------------------------------------------- release


def fatal_view(**kw) -> NodeView:
    return quarantined(cls=FATAL, reasons=("xid-fatal",), **kw)


@pytest.mark.parametrize(("repaired", "healthy_for", "status"), [
    (False, 600, NodeStatus.AWAITING_REPAIR),  # probation over, no repair mark
    (True, 30, NodeStatus.PROBATION),           # repair mark, probation not over
    (True, 60, NodeStatus.HEALTHY),             # both: released
])
def test_fatal_needs_repair_mark_and_probation(repaired, healthy_for, status) -> None:
    view = fatal_view(repaired=repaired)
    state = GuardState(healthy_since={"gpu-01": T0 - healthy_for})
    d = decide(S, obs(T0), nodes(**{"gpu-01": view}), state, T0)
    assert d.status["gpu-01"] is status
    assert any(isinstance(a, Release) for a in d.actions) is (status is NodeStatus.HEALTHY)


def test_fatal_signal_still_present_blocks_release_even_with_repair_mark() -> None:
    view = fatal_view(repaired=True)
    state = GuardState(healthy_since={"gpu-01": T0 - 600})
    d = decide(S, obs(T0, xid79=("gpu-01",)), nodes(**{"gpu-01": view}), state, T0)
    assert d.status["gpu-01"] is NodeStatus.QUARANTINED and "gpu-01" not in d.state.healthy_since


def test_flapping_node_needs_the_repair_mark_too() -> None:
    flappy = quarantined(history=(T0 - 7200, T0 - 3600, T0 - 600))  # third time within a day
    state = GuardState(healthy_since={"gpu-01": T0 - 600})
    d = decide(S, obs(T0), nodes(**{"gpu-01": flappy}), state, T0)
    assert d.status["gpu-01"] is NodeStatus.AWAITING_REPAIR
    d = decide(S, obs(T0), nodes(**{"gpu-01": replace(flappy, repaired=True)}), state, T0)
    assert Release("gpu-01", DEGRADED, "healthy for 60s and marked repaired") in d.actions


def test_a_node_flapping_around_the_limit_is_never_quarantined_without_a_full_hold() -> None:
    steps = [(t, 80.0 if (t // 60) % 2 == 0 else 70.0) for t in range(0, 1200, 60)]
    assert not any(any(isinstance(a, Quarantine) for a in d.actions) for d in run(S, steps))


def test_lost_condition_is_reasserted_and_pods_drained_every_cycle() -> None:
    view = replace(quarantined(), condition_false=False)
    d = decide(S, obs(T0, {"gpu-01": 90.0}), nodes(**{"gpu-01": view}), GuardState(), T0)
    assert kinds(d, "gpu-01") == ["MarkCondition", "Drain"]
    assert MarkCondition("gpu-01", DEGRADED, ("gpu-temperature",)) in d.actions


# --------------------------------------------------------------------------- people


def test_opt_out_label_is_respected() -> None:
    view = NodeView("gpu-01", "a", opted_out=True)
    d = decide(S, obs(T0, xid79=("gpu-01",)), nodes(**{"gpu-01": view}), GuardState(), T0)
    assert kinds(d, "gpu-01") == [] and d.status["gpu-01"] is NodeStatus.OPTED_OUT


def test_taint_removed_by_hand_is_respected_until_the_signal_clears() -> None:
    by_hand = NodeView("gpu-01", "a", marked=True, reasons=("xid-fatal",), history=(T0 - 60,))
    d = decide(S, obs(T0, xid79=("gpu-01",)), nodes(**{"gpu-01": by_hand}), GuardState(), T0)
    assert kinds(d, "gpu-01") == ["Release", "RecordOverride"]
    assert RecordOverride("gpu-01", frozenset({"xid-fatal"})) in d.actions
    overridden = NodeView("gpu-01", "a", overridden=frozenset({"xid-fatal"}))
    # Still XID 79 next cycle: the operator's decision stands (and is on the node: nothing to write).
    d2 = decide(S, obs(T0 + 1, xid79=("gpu-01",)), nodes(**{"gpu-01": overridden}), d.state, T0 + 1)
    assert kinds(d2, "gpu-01") == []
    # It cleared once: the override is removed from the node; then it came back: a new fault, quarantined.
    d3 = decide(S, obs(T0 + 2), nodes(**{"gpu-01": overridden}), d2.state, T0 + 2)
    assert kinds(d3, "gpu-01") == ["RecordOverride"] and RecordOverride("gpu-01", frozenset()) in d3.actions
    d4 = decide(S, obs(T0 + 3, xid79=("gpu-01",)), nodes(), d3.state, T0 + 3)
    assert kinds(d4, "gpu-01") == ["Quarantine", "Drain"]


def test_the_operators_override_outlives_a_restart_and_a_new_leader() -> None:
    """Defect: the override lived in memory; a restarted guard re-quarantined the node while the fault went on."""
    overridden = NodeView("gpu-01", "a", overridden=frozenset({"xid-fatal"}))
    fresh = GuardState()  # a new process, or the standby that just took the lease
    d = decide(S, obs(T0, xid79=("gpu-01",)), nodes(**{"gpu-01": overridden}), fresh, T0)
    assert kinds(d, "gpu-01") == [] and d.status["gpu-01"] is NodeStatus.HEALTHY
    # A write that was lost (annotation missing) is written again while the override holds.
    d2 = decide(S, obs(T0, xid79=("gpu-01",)), nodes(), d.state, T0)
    assert kinds(d2, "gpu-01") == ["RecordOverride"]


def test_an_override_covers_only_what_fired_then() -> None:
    overridden = NodeView("gpu-01", "a", overridden=frozenset({"xid-fatal"}))
    d = decide(S, obs(T0, xid79=("gpu-01",), xid94=("gpu-01",)), nodes(**{"gpu-01": overridden}), GuardState(), T0)
    assert [(a.health_class, a.reasons) for a in d.actions if isinstance(a, Quarantine)] == [
        (DEGRADED, ("xid-degraded",))]


# --------------------------------------------------------------------------- no reading is no evidence


def test_a_nan_temperature_never_releases_a_hot_node() -> None:
    """Defect: NaN was dropped, read as 'no sample' (clear) and released a heat-quarantined node on no reading."""
    hot = NodeView("gpu-01", "a", quarantined=DEGRADED, marked=True, reasons=("gpu-temperature",),
                   condition_false=True, history=(T0 - 600,))
    state = GuardState()
    for t in range(0, int(S.probation_seconds) * 3, 15):
        d = decide(S, obs(T0 + t, {"gpu-01": float("nan")}), nodes(**{"gpu-01": hot}), state, T0 + t)
        state = d.state
        assert d.readings["gpu-01"]["gpu-temperature"] is Reading.UNKNOWN
        assert not [a for a in d.actions if isinstance(a, Release)], t
        assert d.status["gpu-01"] is NodeStatus.QUARANTINED
    # A real reading below the clear level starts probation; it completes only after the full probation.
    d = decide(S, obs(T0 + 1000, {"gpu-01": 60.0}), nodes(**{"gpu-01": hot}), state, T0 + 1000)
    assert d.status["gpu-01"] is NodeStatus.PROBATION


def test_a_nan_reading_never_quarantines() -> None:
    state = GuardState()
    for t in range(0, 600, 15):
        d = decide(S, obs(T0 + t, {"gpu-01": float("nan")}), nodes(), state, T0 + t)
        state = d.state
        assert kinds(d, "gpu-01") == []
