"""The history checker (tools/localcluster/history.py) on audit logs written by hand and generated: a history that
keeps the fencing rule yields nothing, one write out of turn yields exactly that write, and the audit parser answers
any broken timestamp with an error naming the line."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tools.localcluster.history import (
    GpuFault,
    TaintFlip,
    burst_flip_violations,
    fencing_violations,
    quarantine_violations,
    repeated_evictions,
    taint_flips,
    unquarantined_faults,
)
from tools.localcluster.rbac_usage import Request, parse_audit

NS, LEASE, AGENT = "gpu-system", "health-guard", "health-guard"


def event(at: float, agent: str, verb: str, resource: str, name: str, code: int = 200, group: str = "",
          namespace: str = NS, subresource: str | None = None) -> dict[str, Any]:
    ref: dict[str, Any] = {"resource": resource, "namespace": namespace, "name": name, "apiGroup": group}
    if subresource:
        ref["subresource"] = subresource
    return {"kind": "Event", "auditID": f"{agent}-{verb}-{name}-{at}", "stage": "ResponseComplete",
            "verb": verb, "user": {"username": "system:serviceaccount:gpu-system:health-guard"},
            "userAgent": agent, "objectRef": ref, "responseStatus": {"code": code},
            "requestReceivedTimestamp": datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
            "annotations": {"authorization.k8s.io/decision": "allow"}}


def lease(at: float, who: str, code: int = 200, verb: str = "update") -> dict[str, Any]:
    return event(at, who, verb, "leases", LEASE, code, group="coordination.k8s.io")


def patch(at: float, who: str, node: str = "gpu-01") -> dict[str, Any]:
    return event(at, who, "patch", "nodes", node, namespace="")


def check(*events: dict[str, Any]) -> list[tuple[str, str]]:
    text = "".join(json.dumps(e) + "\n" for e in events)
    found = fencing_violations(parse_audit(text, "audit.log"), agent=AGENT, namespace=NS, lease=LEASE)
    return [(v.invariant, v.detail) for v in found]


A, B = f"{AGENT}/guard-a", f"{AGENT}/guard-b"


def test_a_clean_handover_has_no_violation() -> None:
    assert check(lease(1, A, verb="create"), patch(2, A), lease(3, A), patch(4, A),
                 lease(20, B), patch(21, B), patch(22, B, "gpu-02")) == []


def test_a_write_after_another_took_the_lease_is_named() -> None:
    assert check(lease(1, A), lease(10, B), patch(11, A), patch(12, B)) == [
        ("write-while-another-held-the-lease",
         f"{A}: patch nodes gpu-01 (HTTP 200) while {B} held {NS}/{LEASE}")]


def test_a_write_after_a_refused_renewal_is_named_until_the_next_renewal() -> None:
    """The acceptance defect, as the checker sees it: the renewal is refused with 409 and the replica writes on."""
    assert check(lease(1, A), lease(5, A, code=409), patch(6, A), lease(7, A), patch(8, A)) == [
        ("write-after-refused-renewal",
         f"{A}: patch nodes gpu-01 (HTTP 200) after its renewal of {NS}/{LEASE} was refused (409)")]


def test_a_lease_taken_by_someone_else_or_deleted() -> None:
    person = "kubectl/v1.34.0 (linux/amd64) kubernetes/abc"
    assert check(lease(1, A), lease(2, person), patch(3, A)) == [
        ("write-while-another-held-the-lease",
         f"{A}: patch nodes gpu-01 (HTTP 200) while {person} (not a replica of {AGENT}) held {NS}/{LEASE}")]
    assert check(lease(1, A), lease(2, person, verb="delete"), patch(3, A)) == []  # nobody held it


def test_refused_and_failed_writes_and_other_agents_are_not_counted() -> None:
    other = "burst-controller/x"
    failed = patch(11, A) | {"responseStatus": {"code": 403}}
    assert check(lease(1, A), lease(10, B), failed, patch(12, other), lease(13, f"{other}-lease")) == []


def test_repeated_evictions_are_named() -> None:
    evict = event(5, A, "create", "pods", "gang-0", namespace="training", subresource="eviction")
    again = evict | {"auditID": "again", "requestReceivedTimestamp": "1970-01-01T00:00:06.000000Z"}
    text = "".join(json.dumps(e) + "\n" for e in (evict, again))
    found = repeated_evictions(parse_audit(text, "a"), agent=AGENT)
    assert [v.detail for v in found] == [f"{AGENT} evicted training/gang-0 2 times"]
    assert repeated_evictions(parse_audit(text, "a"), agent=AGENT, since=5.5) == []


def test_a_name_evicted_once_per_fault_is_a_new_pod_each_time_and_twice_in_one_fault_is_named() -> None:
    """A gang's pod replaced after one GPU fault comes back under its name; a later fault on its new node evicts it
    again: two pods, one eviction each. Two evictions between the same two faults are one pod evicted twice."""
    def evict(at: float) -> dict[str, Any]:
        e = event(at, A, "create", "pods", "gang-0", namespace="training", subresource="eviction")
        return e | {"auditID": f"e{at}", "requestReceivedTimestamp": f"1970-01-01T00:00:{at:09.6f}Z"}

    text = "".join(json.dumps(e) + "\n" for e in (evict(5), evict(15), evict(25), evict(26)))
    found = repeated_evictions(parse_audit(text, "a"), agent=AGENT, faults=[4, 14, 24])
    assert [(v.at, v.detail) for v in found] == [(24, f"{AGENT} evicted training/gang-0 2 times after the fault at 24")]
    assert len(repeated_evictions(parse_audit(text, "a"), agent=AGENT)) == 1  # no windows: the whole run is one
    assert repeated_evictions(parse_audit(text, "a"), agent=AGENT, faults=[4, 14, 24, 25.5]) == []


@st.composite
def fenced_history(draw: st.DrawFn) -> tuple[list[dict[str, Any]], list[tuple[float, str]]]:
    """Terms of two or three replicas, one after another, each renewing and writing only inside its own term; and
    the (time, replica) of every moment a write would be out of turn."""
    replicas = [f"{AGENT}/r{i}" for i in range(draw(st.integers(2, 3)))]
    events: list[dict[str, Any]] = []
    out_of_turn: list[tuple[float, str]] = []
    t = 1.0
    for _ in range(draw(st.integers(1, 6))):
        holder = draw(st.sampled_from(replicas))
        events.append(lease(t, holder))
        for _ in range(draw(st.integers(0, 5))):
            t += draw(st.floats(0.001, 5.0))
            events.append(patch(t, holder) if draw(st.booleans()) else lease(t, holder))
            out_of_turn += [(t + 0.0005, r) for r in replicas if r != holder]
        t += draw(st.floats(0.001, 20.0))
    return events, out_of_turn


@given(fenced_history(), st.data())
def test_a_fenced_history_is_clean_and_one_write_out_of_turn_is_found(
        history: tuple[list[dict[str, Any]], list[tuple[float, str]]], data: st.DataObject) -> None:
    events, out_of_turn = history
    assert check(*events) == []
    if out_of_turn:
        at, who = data.draw(st.sampled_from(out_of_turn))
        found = check(*events, patch(at, who, "gpu-99"))
        assert len(found) == 1 and found[0][0] == "write-while-another-held-the-lease"
        assert found[0][1].startswith(f"{who}: patch nodes gpu-99")


@given(st.text(max_size=40))
def test_a_broken_timestamp_is_an_error_naming_the_line(stamp: str) -> None:
    line = json.dumps(lease(1, A) | {"requestReceivedTimestamp": stamp}) + "\n"
    try:
        parsed = parse_audit(line, "audit.log")
    except ValueError as err:
        assert str(err).startswith("audit.log:1: requestReceivedTimestamp")
    else:
        assert len(parsed) == 1 and parsed[0].received == datetime.fromisoformat(stamp.replace("Z", "+00:00")) \
            .timestamp()


@pytest.mark.parametrize(("stamp", "message"), [
    ("yesterday", "audit.log:1: requestReceivedTimestamp 'yesterday' is not an RFC 3339 time"),
    ("2026-13-01T00:00:00Z", "audit.log:1: requestReceivedTimestamp '2026-13-01T00:00:00Z' is not an RFC 3339 time"),
])
def test_broken_timestamps(stamp: str, message: str) -> None:
    with pytest.raises(ValueError) as err:
        parse_audit(json.dumps(lease(1, A) | {"requestReceivedTimestamp": stamp}) + "\n", "audit.log")
    assert str(err.value) == message


def test_the_request_keeps_user_agent_and_time() -> None:
    (r,) = parse_audit(json.dumps(patch(1.5, A)) + "\n", "a")
    assert r == Request("system:serviceaccount:gpu-system:health-guard", "patch", "", "nodes", "", "gpu-01", True,
                        200, A, 1.5)


def test_a_torn_line_mid_file_is_an_error_or_skipped_when_asked() -> None:
    text = json.dumps(patch(1, A)) + "\n" + '{"kind": "Ev' + "\n" + json.dumps(patch(2, A)) + "\n"
    with pytest.raises(ValueError, match=r"audit\.log:2: not JSON"):
        parse_audit(text, "audit.log")
    skipped: list[str] = []
    assert [r.received for r in parse_audit(text, "audit.log", skipped=skipped)] == [1.0, 2.0]
    assert len(skipped) == 1 and skipped[0].startswith("audit.log:2: not JSON")


# --------------------------------------------------------------------------- the burst taint's hysteresis

OPEN, CLOSE = 5.0, 20.0  # the local stack: min(openHoldSeconds, pendingGraceSeconds), closeHoldSeconds


def test_flips_are_read_per_node_between_the_samples_around_them() -> None:
    samples = [(0.0, "vk-a", True), (0.0, "vk-b", True), (1.0, "vk-a", True), (2.0, "vk-a", False),
               (2.0, "vk-b", True), (5.0, "vk-b", False), (30.0, "vk-a", True)]
    assert taint_flips(samples) == [TaintFlip("vk-a", 1.0, 2.0, False), TaintFlip("vk-b", 2.0, 5.0, False),
                                    TaintFlip("vk-a", 2.0, 30.0, True)]


def test_a_close_inside_the_close_hold_is_named_and_a_gap_in_the_samples_never_is() -> None:
    early = [TaintFlip("vk-a", 99.0, 100.0, False), TaintFlip("vk-a", 110.0, 111.0, True)]
    (v,) = burst_flip_violations(early, open_after_close_s=OPEN, close_after_open_s=CLOSE)
    assert v.invariant == "burst-taint-hysteresis" and v.at == 111.0
    assert v.detail == "vk-a: the burst closed at most 12.0s after it opened (hold 20s)"
    # The same flips seen across a 15 s sampling gap (an API server restarting) may have been 20 s apart.
    gap = [TaintFlip("vk-a", 99.0, 100.0, False), TaintFlip("vk-a", 110.0, 119.5, True)]
    assert burst_flip_violations(gap, open_after_close_s=OPEN, close_after_open_s=CLOSE) == []
    reopen = [TaintFlip("vk-a", 0.0, 1.0, True), TaintFlip("vk-a", 2.0, 3.0, False)]
    assert [v.detail for v in burst_flip_violations(reopen, open_after_close_s=OPEN, close_after_open_s=CLOSE)] == [
        "vk-a: the burst opened at most 3.0s after it closed (hold 5s)"]


@given(st.lists(st.tuples(st.floats(0.0, 60.0), st.booleans()), min_size=1, max_size=12),
       st.lists(st.floats(0.2, 15.0), min_size=200, max_size=200))
def test_a_controller_that_keeps_its_holds_is_never_named_however_it_is_sampled(
        waits: list[tuple[float, bool]], gaps: list[float]) -> None:
    # A timeline of flips each at least its hold after the one before, sampled at irregular instants.
    t, tainted, changes = 0.0, True, []
    for extra, _ in waits:
        t += (OPEN if tainted else CLOSE) + extra
        tainted = not tainted
        changes.append((t, tainted))
    state, at, samples, i = True, 0.0, [], 0
    for gap in gaps:
        while i < len(changes) and changes[i][0] <= at:
            state = changes[i][1]
            i += 1
        samples.append((at, "vk-a", state))
        at += gap
    assert burst_flip_violations(taint_flips(samples), open_after_close_s=OPEN, close_after_open_s=CLOSE) == []


@given(st.floats(0.6, CLOSE - 2.5), st.floats(0.1, 0.5))
def test_a_close_sampled_closely_inside_its_hold_is_always_named(early: float, step: float) -> None:
    # Open at 1 s, closed again ``early`` seconds later: sampled every ``step``, the widest the interval can read is
    # early + 2 steps, still short of the hold less its slack.
    times = [k * step for k in range(int((early + 5) / step) + 2)]
    samples = [(at, "vk-a", not (1.0 <= at < 1.0 + early)) for at in times]
    found = burst_flip_violations(taint_flips(samples), open_after_close_s=OPEN, close_after_open_s=CLOSE)
    assert [v.invariant for v in found] == ["burst-taint-hysteresis"]


# --------------------------------------------------------------------------- the guard's quarantines

PROBATION = 60.0


def readings(node: str, tainted_between: list[tuple[float, float]], until: float) -> list[tuple[float, str, bool]]:
    """One sample a second of ``node``'s quarantine taint, present within each (start, end) span."""
    return [(float(t), node, any(a <= t < b for a, b in tainted_between)) for t in range(int(until))]


def judged(samples: list[tuple[float, str, bool]], faults: list[GpuFault]) -> list[str]:
    return [v.invariant for v in quarantine_violations(taint_flips(samples), faults, probation_s=PROBATION)]


def test_one_fault_one_quarantine_released_after_its_clear_and_probation_is_clean() -> None:
    fault = GpuFault("gpu-1", start=10, clear=40)
    assert judged(readings("gpu-1", [(25, 110)], 200), [fault]) == []


def test_a_release_before_the_clear_plus_probation_is_named() -> None:
    fault = GpuFault("gpu-1", start=10, clear=40)
    found = quarantine_violations(taint_flips(readings("gpu-1", [(25, 80)], 200)), [fault], probation_s=PROBATION)
    assert [v.invariant for v in found] == ["released-before-clear-and-probation"]
    assert found[0].detail == ("gpu-1 released by 80, 20s before its fault's clear (40) plus the 60s probation")


def test_a_second_quarantine_for_one_fault_and_one_without_a_fault_are_named() -> None:
    fault = GpuFault("gpu-1", start=10, clear=40)
    assert judged(readings("gpu-1", [(25, 110), (120, 130)], 200), [fault]) == [
        "more-than-one-quarantine-per-fault"]
    assert judged(readings("gpu-2", [(25, 110)], 200), [fault]) == ["quarantine-without-a-fault"]
    # Two faults on the node, one quarantine each: clean.
    second = GpuFault("gpu-1", start=150, clear=170)
    assert judged(readings("gpu-1", [(25, 110), (160, 240)], 300), [fault, second]) == []


@given(start=st.floats(0, 100), window=st.floats(1, 60), detect=st.floats(0, 30),
       extra=st.floats(0, 100), gap=st.integers(1, 5))
def test_a_guard_that_keeps_its_probation_is_never_named_however_it_is_sampled(
        start: float, window: float, detect: float, extra: float, gap: int) -> None:
    """Quarantined after the fault began, released no sooner than its clear plus the probation: never a violation,
    whatever the sampling interval (an API server restarting leaves gaps)."""
    fault = GpuFault("gpu-1", start=start, clear=start + window)
    on, off = start + detect, start + window + PROBATION + extra
    samples = [(float(t), "gpu-1", on <= t < off) for t in range(0, int(off) + 50, gap)]
    assert judged(samples, [fault]) == []


@given(early=st.floats(2, 59), gap=st.integers(1, 3))
def test_a_release_sampled_inside_the_probation_is_always_named(early: float, gap: int) -> None:
    fault = GpuFault("gpu-1", start=10, clear=40)
    off = fault.clear + PROBATION - early - gap  # seen off at the latest one sample later, still early
    samples = [(float(t), "gpu-1", 20 <= t < off) for t in range(0, 200, gap)]
    assert "released-before-clear-and-probation" in judged(samples, [fault])


# --------------------------------------------------------------------------- faults the guard never answered

#: The local guard: XID holds 0 + a 2 s poll + a 20 s cycle deadline (tools.chaos.verdict.quarantine_bound_s).
WITHIN = 22.0


def missed(samples: list[tuple[float, str, bool]], faults: list[GpuFault],
           breaker: list[tuple[float, bool]] | None = None) -> list[str]:
    return [v.detail for v in unquarantined_faults(samples, faults, within_s=WITHIN, breaker=breaker or [])]


def test_a_fault_prometheus_showed_and_the_guard_never_answered_is_named() -> None:
    """The soak's degraded XID on an idle node left no taint and no violation: nothing judged a fault never answered."""
    fault = GpuFault("gpu-1", start=10, clear=40, seen=16)
    assert missed(readings("gpu-1", [], 200), [fault]) == [
        "gpu-1: the GPU fault served from 10, queryable from 16, left it untainted 22s after"]
    # Answered within the bound, or the node already quarantined when its fault began: clean.
    assert missed(readings("gpu-1", [(30, 120)], 200), [fault]) == []
    assert missed(readings("gpu-1", [(0, 120)], 200), [fault]) == []
    # Answered, but later than the bound: named.
    assert len(missed(readings("gpu-1", [(16 + WITHIN + 5, 120)], 200), [fault])) == 1


def test_a_fault_never_queryable_a_tripped_breaker_or_no_samples_is_not_charged_to_the_guard() -> None:
    unseen = GpuFault("gpu-1", start=10, clear=40, seen=None)
    assert missed(readings("gpu-1", [], 200), [unseen]) == []
    fault = GpuFault("gpu-1", start=10, clear=40, seen=16)
    assert missed(readings("gpu-1", [], 200), [fault], breaker=[(20.0, True)]) == []
    assert missed(readings("gpu-1", [], 200), [fault], breaker=[(5.0, True), (9.0, False), (200.0, True)]) != []
    assert missed(readings("gpu-1", [], 30), [fault]) == []  # no sample as late as the bound: nothing to judge by


@given(seen=st.floats(0, 20), detect=st.floats(0, WITHIN), gap=st.integers(1, 5), others=st.integers(0, 3))
def test_a_guard_that_answers_within_its_bound_is_never_named_however_it_is_sampled(
        seen: float, detect: float, gap: int, others: int) -> None:
    fault = GpuFault("gpu-1", start=10, clear=40, seen=10 + seen)
    on = fault.seen + detect  # type: ignore[operator]
    samples = [(float(t), node, node == "gpu-1" and t >= on)
               for t in range(0, 200, gap) for node in ("gpu-1", *(f"other-{i}" for i in range(others)))]
    assert missed(samples, [fault]) == []


def test_the_soaks_bound_is_the_guards_own_timing() -> None:
    from agents.health_guard.contract import HealthSettings
    from tools.chaos.verdict import quarantine_bound_s

    guard = HealthSettings()
    assert quarantine_bound_s(guard) == guard.poll_seconds + guard.renew_deadline_seconds  # the XIDs hold 0
    held = guard.model_copy(update={"poll_seconds": 5})
    assert quarantine_bound_s(held) == 5 + guard.renew_deadline_seconds
