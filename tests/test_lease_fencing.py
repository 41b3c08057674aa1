"""The fencing guarantee of every agent's election (docs/agents.md): no two replicas may write at the same instant,
a renewal refused with 409 ends leadership before another write, a Lease taken or deleted from under a live leader
stops its next write as soon as its watch shows it, and no call holds a cycle past its deadline.

The property test drives two or three replicas against one in-memory API with an adversary that interleaves
renewals, takeovers by a writer with a skewed clock, deletions, 409s, lost replies, timeouts, releases, delayed
watch events and wall-clock jumps, and checks after every step that at most one replica may write."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agents.health_guard.shell import Guard
from agents.kit.errors import ApiError
from agents.kit.lease import LeaseElector, LeaseFollower
from agents.kit.port import LEASES, NODES, PODS, Fenced, Resource
from fakes.kube_api import MemoryApi
from tests.fake_kube_api import http_port, serve
from tests.test_agent_watches import wait_for
from tests.test_health_guard_shell import NODES as GUARD_NODES
from tests.test_health_guard_shell import SETTINGS, T0, Cluster, FakePrometheus, HttpCluster, P, k8s_node, k8s_pod

DURATION, DEADLINE, TIMEOUT = 15.0, 10.0, 2.0
KEY = "sys/agent"


class Flaky:
    """A replica's own path to the API: the next write may be refused (409), time out before it reaches the
    server, or reach it and lose its reply."""

    def __init__(self, api: MemoryApi) -> None:
        self.api = api
        self.next_fault: str | None = None

    def get(self, resource: Resource, name: str, namespace: str | None = None) -> dict[str, Any]:
        return self.api.get(resource, name, namespace)

    def _write(self, call: Any) -> dict[str, Any]:
        fault, self.next_fault = self.next_fault, None
        if fault == "conflict":
            raise ApiError("conflict", "the object has been modified", 409)
        if fault == "timeout":
            raise ApiError("timeout", "no answer")
        answer: dict[str, Any] = call()
        if fault == "lost_reply":
            raise ApiError("timeout", "the reply was lost")
        return answer

    def create(self, resource: Resource, body: dict[str, Any], namespace: str | None = None, *a: Any) -> Any:
        return self._write(lambda: self.api.create(resource, body, namespace))

    def replace(self, resource: Resource, name: str, body: dict[str, Any], namespace: str | None = None) -> Any:
        return self._write(lambda: self.api.replace(resource, name, body, namespace))


class Replica:
    def __init__(self, api: MemoryApi, identity: str, mono: list[float]) -> None:
        self.port = Flaky(api)
        self.skew = 0.0  # its wall clock's jump; expiry never reads it
        self.elector = LeaseElector(self.port, "sys", "agent", identity,  # type: ignore[arg-type]
                                    lease_duration_seconds=DURATION, renew_deadline_seconds=DEADLINE,
                                    request_timeout_seconds=TIMEOUT, monotonic=lambda: mono[0],
                                    wall=lambda: 1e9 + mono[0] + self.skew)
        self.follower = LeaseFollower(self.elector)
        self.delivered = 0  # how far into the API's history this replica's watch has got

    def deliver(self, api: MemoryApi, events: int) -> None:
        lease_events = [(etype, obj) for _, plural, etype, obj in api.history if plural == "leases"]
        for etype, obj in lease_events[self.delivered:self.delivered + events]:
            self.follower.apply(etype, obj)
        self.delivered = min(len(lease_events), self.delivered + events)


def world(replicas: int) -> tuple[MemoryApi, list[Replica], list[float]]:
    mono = [0.0]
    api = MemoryApi(clock=lambda: mono[0])
    return api, [Replica(api, f"r{i}", mono) for i in range(replicas)], mono


def writers(group: list[Replica]) -> list[str]:
    return [r.elector.identity for r in group if r.elector.can_write()]


OPS = st.one_of(
    st.tuples(st.just("step"), st.integers(0, 2)),
    st.tuples(st.just("advance"), st.floats(0.0, 40.0)),
    st.tuples(st.just("deliver"), st.integers(0, 2), st.integers(1, 4)),
    st.tuples(st.just("fault"), st.integers(0, 2), st.sampled_from(["conflict", "timeout", "lost_reply"])),
    st.tuples(st.just("delete")),
    st.tuples(st.just("skewed_takeover")),
    st.tuples(st.just("release"), st.integers(0, 2)),
    st.tuples(st.just("wall_jump"), st.integers(0, 2), st.floats(-3600.0, 3600.0)),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(2, 3), st.lists(OPS, max_size=60))
def test_no_two_replicas_may_write_in_the_same_instant(replicas: int, ops: list[tuple[Any, ...]]) -> None:
    api, group, mono = world(replicas)
    for r in group:  # every replica has read the Lease's place once before the adversary starts
        r.elector.step()
    for op in ops:
        kind = op[0]
        who = group[op[1] % replicas] if kind in ("step", "deliver", "fault", "release", "wall_jump") else None
        if kind == "step" and who is not None:
            refused = who.port.next_fault == "conflict"
            led = who.elector.step()
            if refused:  # a 409 on the renewal ends leadership before another write
                assert not led and not who.elector.can_write()
        elif kind == "advance":
            mono[0] += op[1]
        elif kind == "deliver" and who is not None:
            who.deliver(api, op[2])
        elif kind == "fault" and who is not None:
            who.port.next_fault = op[2]
        elif kind == "delete" and KEY in api.objects.get("leases", {}):
            api.remove(LEASES, KEY)
        elif kind == "skewed_takeover" and KEY in api.objects.get("leases", {}):
            lease = api.objects["leases"][KEY]
            api.replace(LEASES, "agent", {**lease, "spec": {**lease["spec"], "holderIdentity": "skewed"}}, "sys")
        elif kind == "release" and who is not None:
            who.elector.release()
        elif kind == "wall_jump" and who is not None:
            who.skew += op[2]
        assert len(writers(group)) <= 1, (op, writers(group))
        for r in group:  # a replica whose watch has shown the newest record of another holder, or none, is fenced
            lease_events = [(etype, obj) for _, plural, etype, obj in api.history if plural == "leases"]
            if r.delivered and r.delivered == len(lease_events):
                etype, obj = lease_events[-1]
                if etype == "DELETED" or obj["spec"].get("holderIdentity") != r.elector.identity:
                    assert not r.elector.can_write(), (op, r.elector.identity)


def test_a_renewal_refused_with_409_ends_leadership_before_another_write() -> None:
    api, (a, _), _ = world(2)
    assert a.elector.step() and a.elector.can_write()
    a.port.next_fault = "conflict"
    assert a.elector.step() is False
    fenced = Fenced(api, a.elector.can_write)
    with pytest.raises(ApiError) as refused:
        fenced.patch(NODES, "n1", {})
    assert refused.value.kind == "not_leader" and a.elector.lost == 1


def test_the_health_guard_whose_renewal_is_refused_sends_no_write() -> None:
    """The acceptance defect: a guard whose Lease renewal got 409 went on as leader until its renew deadline and
    sent six writes, three of them evictions. Now its cycle ends at the election and the API sees none."""
    prom, port = FakePrometheus(), Cluster()
    for i, n in enumerate(GUARD_NODES):
        port.put(PODS, k8s_pod(f"gang-{i}", n, "training", job="gang"))
    guard = Guard(SETTINGS, prom, port, identity="me")
    guard.clock, guard.monotonic = (lambda: T0), (lambda: 0.0)
    assert guard.cycle() is not None  # leads, nothing to do yet
    prom.xid = {"gpu-01": 1}
    port.fail("replace:leases", ApiError("conflict", "the object has been modified", 409))
    before = len(port.writes())
    guard.clock, guard.monotonic = (lambda: T0 + 1), (lambda: 1.0)
    assert guard.cycle() is None
    assert [c for c, _, _ in port.writes()[before:] if c != "replace:leases"] == []
    assert port.evicted_names == []


def test_a_lease_deleted_under_the_leader_fences_it_at_once_and_the_new_term_waits_one_lease() -> None:
    api, (a, b), mono = world(2)
    a.elector.step()
    b.elector.step()
    a.deliver(api, 10)
    assert a.elector.can_write()
    api.remove(LEASES, KEY)
    a.deliver(api, 10)  # the DELETED event
    assert not a.elector.can_write()
    assert b.elector.step() is False  # b saw a Lease before: it re-creates it but writes nothing for one term
    assert api.objects["leases"][KEY]["spec"]["holderIdentity"] == "r1" and not b.elector.can_write()
    mono[0] += DURATION
    assert b.elector.step() is True and b.elector.can_write()
    assert a.elector.step() is False


def test_a_takeover_seen_on_the_watch_fences_the_old_leader_and_a_stale_event_does_not() -> None:
    api, (a, _), _ = world(2)
    a.elector.step()
    a.deliver(api, 10)
    lease = api.objects["leases"][KEY]
    old = {**lease, "spec": {**lease["spec"], "holderIdentity": "skewed"}}  # an event older than a's own record
    a.follower.apply("MODIFIED", old)
    assert a.elector.can_write()
    api.replace(LEASES, "agent", {**lease, "spec": {**lease["spec"], "holderIdentity": "skewed"}}, "sys")
    a.deliver(api, 10)
    assert not a.elector.can_write()
    assert a.elector.step() is False  # the skewed replica's record is fresh on a's clock


def test_a_call_that_never_answers_ends_at_the_call_deadline_and_the_cycle_goes_on() -> None:
    """In process nothing bounds a call but the kit itself: before it, a guard cycle whose patch never answered
    blocked until the call gave up on its own (30 s in the acceptance test)."""
    prom, port = FakePrometheus(), Cluster()
    for i, n in enumerate(GUARD_NODES):
        port.put(PODS, k8s_pod(f"gang-{i}", n, "training", job="gang"))
    guard = Guard(SETTINGS.model_copy(update={"request_timeout_seconds": 0.2}), prom, port, identity="me")
    released = threading.Event()
    real_patch = port.patch

    def hung(*args: Any, **kwargs: Any) -> Any:
        if args[0] == NODES:
            released.wait(300)
        return real_patch(*args, **kwargs)

    port.patch = hung  # type: ignore[method-assign]
    prom.xid = {"gpu-01": 1}
    guard.clock, guard.monotonic = (lambda: T0), (lambda: 0.0)
    try:
        decision = guard.cycle()
        assert decision is not None and decision.actions  # the cycle returned with the patch still hanging
        assert not released.is_set()
        failed = guard.metrics.registry.get_sample_value("gpucluster_health_errors_total", {"stage": "patch"})
        assert failed is not None and failed >= 1  # the quarantine's patch, given up as a timeout
        assert port.taints("gpu-01") == [(f"{P}/pool", "a", "NoSchedule")]  # nothing half-applied by the hung one
    finally:
        released.set()


def test_a_takeover_reaches_a_running_guard_through_its_lease_watch_over_http() -> None:
    """End to end on the real client: the guard runs (renewer, watches), a writer with a skewed clock takes its
    Lease, and the guard's fence closes on the watch event, well before its next renewal (retry period 60 s)."""
    fake = HttpCluster()
    fake.watch_hold_seconds = 0.5
    for n in GUARD_NODES:
        fake.put(NODES, k8s_node(n))
    settings_ = SETTINGS.model_copy(update={"retry_period_seconds": 60.0, "poll_seconds": 60.0})
    with serve(fake) as url:
        guard = Guard(settings_, FakePrometheus(), http_port(url), identity="me")
        stop = threading.Event()
        thread = threading.Thread(target=guard.run, args=(stop,), daemon=True)
        thread.start()
        try:
            wait_for(guard.elector.can_write)
            lease = fake.get(LEASES, SETTINGS.lease_name, SETTINGS.namespace)
            fake.replace(LEASES, SETTINGS.lease_name,
                         {**lease, "spec": {**lease["spec"], "holderIdentity": "skewed"}}, SETTINGS.namespace)
            wait_for(lambda: not guard.elector.can_write())
            assert guard.elector.lost == 1
        finally:
            stop.set()
            thread.join(timeout=10)


def test_a_leader_blind_to_prometheus_steps_down_and_the_standby_that_can_see_leads() -> None:
    """Found by the stack-in-pods e2e: the replacement guard pod that took the Lease could not reach DNS or
    Prometheus for minutes (its network not wired yet) and held the Lease, judging nothing, while the standby
    could see. A leader whose every query failed for its renew deadline gives the Lease up and sits out two lease
    durations."""
    blind, seeing = FakePrometheus(), FakePrometheus()
    blind.down = True
    port = Cluster()
    for i, n in enumerate(GUARD_NODES):
        port.put(PODS, k8s_pod(f"gang-{i}", n, "training", job="gang"))
    leader, standby = Guard(SETTINGS, blind, port, identity="new-pod"), Guard(SETTINGS, seeing, port, identity="old")
    lease = SETTINGS.lease_name, SETTINGS.namespace

    def at(guard: Guard, mono: float) -> Any:
        guard.clock, guard.monotonic = (lambda: T0 + mono), (lambda: mono)
        return guard.cycle()

    for mono in (0.0, 5.0, 10.0, 15.0):
        blinded = at(leader, mono)  # leads, sees nothing, so decides nothing: every reading unknown
        assert blinded is not None and blinded.actions == ()
        assert port.get(LEASES, *lease)["spec"]["holderIdentity"] == "new-pod"
    assert at(leader, 21.0) is None  # blind past its renew deadline (20 s): steps down
    assert port.get(LEASES, *lease)["spec"]["holderIdentity"] is None
    assert leader.metrics.registry.get_sample_value("gpucluster_health_errors_total", {"stage": "blind"}) == 1
    assert at(standby, 22.0) is not None  # takes the Lease at once and judges
    assert port.get(LEASES, *lease)["spec"]["holderIdentity"] == "old"
    assert leader.elector.step() is False and not leader.elector.can_write()  # sits out
    leader.monotonic = lambda: 21.0 + 2 * SETTINGS.lease_duration_seconds
    assert leader.elector.step() is False  # back in the race, behind the standby's live Lease
