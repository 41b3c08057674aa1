"""Switch faults in the health guard: decision tables (a switch fault against one node's bad port, two leaves at
once, unlabelled nodes, the rails and the breaker, release by probation and the switch's repair mark, the
operator's word), a property over random fault sets, and the shell against the kit's in-memory API."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agents.health_guard.contract import DCGM, IB, HealthClass, HealthSettings
from agents.health_guard.decide import (
    Decision,
    Drain,
    GuardState,
    NodeStatus,
    NodeView,
    Observations,
    Quarantine,
    RecordOverride,
    Suppress,
    TripBreaker,
    decide,
)
from agents.health_guard.shell import Guard
from agents.health_guard.switches import (
    SwitchFault,
    SwitchFence,
    SwitchMarks,
    SwitchRelease,
    SwitchStatus,
    SwitchUnfence,
    need,
)
from agents.kit.errors import ApiError
from agents.kit.port import NODES as NODES_RES
from agents.kit.port import PODS
from tests.test_health_guard_shell import Views, k8s_node, k8s_pod, sample, turn, vector

FATAL, DEGRADED = HealthClass.FATAL, HealthClass.DEGRADED
T0 = 1_800_000_000.0
S = HealthSettings(probation_seconds=60, max_nodes_per_hour=2, max_nodes_quarantined=3,
                   max_pool_percent_per_hour=100, max_pool_percent_quarantined=100)
LEAVES = {"leaf-a": [f"gpu-{i:02d}" for i in range(1, 9)], "leaf-b": [f"gpu-{i:02d}" for i in range(9, 17)]}
ALL = [n for members in LEAVES.values() for n in members]
HOLD = 60  # ib-port-down's hold


def view(name: str, leaf: str | None = "auto", **marks: Any) -> NodeView:
    if leaf == "auto":
        leaf = next(k for k, v in LEAVES.items() if name in v)
    return NodeView(name, "a", switch=SwitchMarks(leaf=leaf or "", spine="spine-1" if leaf else "", **marks))


def cluster(*changed: NodeView, leaves: bool = True) -> dict[str, NodeView]:
    out = {n: view(n, "auto" if leaves else None) for n in ALL}
    out.update({v.name: v for v in changed})
    return out


def obs(now: float, port_down: tuple[str, ...] = (), link_errors: tuple[str, ...] = (),
        xid79: tuple[str, ...] = (), silent: tuple[str, ...] = ()) -> Observations:
    reporting = [n for n in ALL if n not in silent]
    return Observations(
        readings={"ib-port-down": dict.fromkeys(port_down, 1.0), "ib-link-errors": dict.fromkeys(link_errors, 5.0),
                  "xid-fatal": dict.fromkeys(xid79, 1.0), "gpu-temperature": dict.fromkeys(reporting, 50.0)},
        last_seen={DCGM: dict.fromkeys(ALL, now), IB: dict.fromkeys(reporting, now)},
    )


def held(nodes_: dict[str, NodeView], down: tuple[str, ...], settings_: HealthSettings = S,
         breaker: str | None = None, **more: Any) -> Decision:
    """Two cycles a hold apart, every port in ``down`` down throughout: the second decision."""
    first = decide(settings_, obs(T0, down, **more), nodes_, GuardState(), T0, breaker)
    return decide(settings_, obs(T0 + HOLD, down, **more), nodes_, first.state, T0 + HOLD, breaker)


def of(decision: Decision, kind: type) -> list[Any]:
    return [a for a in decision.actions if isinstance(a, kind)]


def fenced(leaf: str, reasons: tuple[str, ...] = ("ib-port-down",), cls: HealthClass = FATAL,
           **marks: Any) -> dict[str, NodeView]:
    """The leaf at fault as a previous cycle left it on the nodes."""
    base = {"fault": leaf, "marked": leaf, "reasons": reasons, "condition_false": True}
    return cluster(*(view(n, **{**base, **marks}) for n in LEAVES[leaf]))


# --------------------------------------------------------------------------- the threshold


@pytest.mark.parametrize(("size", "expected"), [(32, 3), (8, 3), (6, 3), (5, 3), (4, 2), (3, 2), (2, 2), (1, 2),
                                                (0, 2)])
def test_need_is_the_count_or_half_a_small_leaf_never_one(size, expected) -> None:
    assert need(S, size) == expected


def test_need_follows_the_settings() -> None:
    s = S.model_copy(update={"switch_fault_min_nodes": 8, "switch_fault_leaf_percent": 25})
    assert [need(s, n) for n in (64, 32, 16, 4)] == [8, 8, 4, 2]


# --------------------------------------------------------------------------- switch fault against one bad port


def test_many_bad_ports_under_one_leaf_are_one_switch_fault() -> None:
    bad = tuple(LEAVES["leaf-a"][:5])
    d = held(cluster(), bad)
    faults = of(d, SwitchFault)
    assert [(f.leaf, f.spine, f.health_class, f.reasons, f.bad, f.size) for f in faults] == [
        ("leaf-a", "spine-1", FATAL, ("ib-port-down",), bad, 8)]
    assert [a.node for a in of(d, SwitchFence)] == LEAVES["leaf-a"]  # the whole leaf, as one unit
    assert all(a.declared and a.leaf == "leaf-a" for a in of(d, SwitchFence))
    assert of(d, Quarantine) == of(d, Drain) == of(d, Suppress) == of(d, TripBreaker) == []
    assert not d.breaker_tripped and d.switches == {"leaf-a": SwitchStatus.FAULT}
    assert {d.status[n] for n in LEAVES["leaf-a"]} == {NodeStatus.SWITCH_FAULT}
    assert {d.status[n] for n in LEAVES["leaf-b"]} == {NodeStatus.HEALTHY}


def test_one_nodes_bad_port_is_still_that_nodes_fault() -> None:
    d = held(cluster(), ("gpu-03",))
    assert of(d, SwitchFault) == of(d, SwitchFence) == [] and d.switches == {}
    assert [(a.node, a.health_class, a.reasons) for a in of(d, Quarantine)] == [("gpu-03", FATAL, ("ib-port-down",))]
    assert of(d, Drain) == [Drain("gpu-03", FATAL)]


def test_below_the_threshold_each_node_goes_through_the_rails() -> None:
    d = held(cluster(), ("gpu-01", "gpu-02"))
    assert of(d, SwitchFault) == [] and [a.node for a in of(d, Quarantine)] == ["gpu-01", "gpu-02"]


def test_two_leaves_at_once_are_two_switch_faults() -> None:
    bad = (*LEAVES["leaf-a"][:3], *LEAVES["leaf-b"])
    d = held(cluster(), bad)
    assert [f.leaf for f in of(d, SwitchFault)] == ["leaf-a", "leaf-b"]
    assert sorted(a.node for a in of(d, SwitchFence)) == sorted(ALL)
    assert of(d, Quarantine) == of(d, TripBreaker) == []


def test_unlabelled_nodes_behave_as_before() -> None:
    d = held(cluster(leaves=False), tuple(LEAVES["leaf-a"][:5]))
    assert of(d, SwitchFault) == of(d, SwitchFence) == []
    assert [a.node for a in of(d, Quarantine)] == ["gpu-01", "gpu-02"]  # the rails: two an hour
    assert len(of(d, TripBreaker)) == 1 and d.breaker_tripped


def test_the_breaker_is_not_tripped_and_a_tripped_one_does_not_stop_the_fence() -> None:
    whole = tuple(LEAVES["leaf-a"])
    assert not held(cluster(), whole).breaker_tripped
    d = held(cluster(), whole, breaker="tripped earlier")
    assert [f.leaf for f in of(d, SwitchFault)] == ["leaf-a"] and of(d, Suppress) == []


def test_a_nodes_own_fault_under_a_faulted_leaf_is_still_quarantined() -> None:
    d = decide(S, obs(T0, tuple(LEAVES["leaf-a"]), xid79=("gpu-02",)), fenced("leaf-a"), GuardState(), T0)
    assert [(a.node, a.reasons) for a in of(d, Quarantine)] == [("gpu-02", ("xid-fatal",))]
    assert of(d, SwitchFault) == [] and d.status["gpu-02"] is NodeStatus.QUARANTINED


def test_suspect_leaf_quarantines_nobody_while_the_holds_run() -> None:
    """The first port down holds first; the rest of the leaf follows seconds later: no node is drained."""
    first = decide(S, obs(T0, ("gpu-01",)), cluster(), GuardState(), T0)
    rest = decide(S, obs(T0 + 5, tuple(LEAVES["leaf-a"])), cluster(), first.state, T0 + 5)
    assert rest.switches == {"leaf-a": SwitchStatus.SUSPECT} and rest.actions == ()
    at_hold = decide(S, obs(T0 + HOLD, tuple(LEAVES["leaf-a"])), cluster(), rest.state, T0 + HOLD)
    assert of(at_hold, Quarantine) == [] and at_hold.status["gpu-01"] is NodeStatus.PENDING
    declared = decide(S, obs(T0 + HOLD + 5, tuple(LEAVES["leaf-a"])), cluster(), at_hold.state, T0 + HOLD + 5)
    assert [f.leaf for f in of(declared, SwitchFault)] == ["leaf-a"] and of(declared, Quarantine) == []


def test_error_bursts_make_a_degraded_switch_fault() -> None:
    d = decide(S, obs(T0, link_errors=tuple(LEAVES["leaf-b"][:4])), cluster(), GuardState(), T0)
    assert [(f.leaf, f.health_class, f.reasons) for f in of(d, SwitchFault)] == [
        ("leaf-b", DEGRADED, ("ib-link-errors",))]


def test_a_fault_already_on_the_nodes_is_not_declared_again() -> None:
    """A restart or a new leader: the taint on the nodes is the record; no second Event, no write."""
    d = decide(S, obs(T0, tuple(LEAVES["leaf-a"])), fenced("leaf-a"), GuardState(), T0)
    assert d.actions == () and d.switches == {"leaf-a": SwitchStatus.FAULT}


def test_a_node_that_lost_the_fence_or_joined_the_leaf_gets_it() -> None:
    nodes_ = fenced("leaf-a")
    nodes_["gpu-04"] = view("gpu-04")
    d = decide(S, obs(T0, tuple(LEAVES["leaf-a"])), nodes_, GuardState(), T0)
    assert d.actions == (SwitchFence("gpu-04", "leaf-a", FATAL, ("ib-port-down",)),)


def test_port_downs_on_a_degraded_switch_escalate_it() -> None:
    first = decide(S, obs(T0, tuple(LEAVES["leaf-a"])), fenced("leaf-a", ("ib-link-errors",)), GuardState(), T0)
    d = decide(S, obs(T0 + HOLD, tuple(LEAVES["leaf-a"])), fenced("leaf-a", ("ib-link-errors",)), first.state,
               T0 + HOLD)
    assert {(a.health_class, a.reasons) for a in of(d, SwitchFence)} == {(FATAL, ("ib-link-errors", "ib-port-down"))}


def test_opted_out_nodes_are_left_alone() -> None:
    out = replace(view("gpu-01"), opted_out=True)
    d = held(cluster(out), tuple(LEAVES["leaf-a"]))
    assert "gpu-01" not in [a.node for a in of(d, SwitchFence)]
    assert of(d, SwitchFault)[0].size == 7


# --------------------------------------------------------------------------- release


def probation(nodes_: dict[str, NodeView], healthy_for: float, **more: Any) -> Decision:
    state = GuardState(switch_healthy_since={"leaf-a": T0 - healthy_for})
    return decide(S, obs(T0, **more), nodes_, state, T0)


@pytest.mark.parametrize(("repaired", "healthy_for", "status"), [
    (False, 30, SwitchStatus.PROBATION),
    (True, 30, SwitchStatus.PROBATION),          # the repair mark alone is not enough
    (False, 600, SwitchStatus.AWAITING_REPAIR),  # a port down is fatal: it waits for the mark
    (True, 60, None),                            # both: released
])
def test_fatal_switch_needs_its_repair_mark_and_probation(repaired, healthy_for, status) -> None:
    nodes_ = fenced("leaf-a")
    if repaired:  # on any one node of the leaf
        nodes_["gpu-05"] = replace(nodes_["gpu-05"], switch=replace(nodes_["gpu-05"].switch, repaired=True))
    d = probation(nodes_, healthy_for)
    assert d.switches.get("leaf-a") == status
    if status is None:
        assert [(r.leaf, r.nodes) for r in of(d, SwitchRelease)] == [("leaf-a", tuple(LEAVES["leaf-a"]))]
        assert [a.node for a in of(d, SwitchUnfence)] == LEAVES["leaf-a"]
        assert "marked repaired" in of(d, SwitchRelease)[0].why
        assert {d.status[n] for n in LEAVES["leaf-a"]} == {NodeStatus.HEALTHY}
    else:
        assert of(d, SwitchRelease) == [] and d.state.switch_healthy_since == {"leaf-a": T0 - healthy_for}


def test_a_degraded_switch_is_released_after_probation_alone() -> None:
    d = probation(fenced("leaf-a", ("ib-link-errors",)), 60)
    assert [r.leaf for r in of(d, SwitchRelease)] == ["leaf-a"]


@pytest.mark.parametrize(("more", "released"), [
    ({"port_down": ("gpu-01", "gpu-02", "gpu-03")}, False),  # still a switch fault: probation starts over
    ({"silent": ("gpu-01", "gpu-02", "gpu-03")}, False),      # no reading is no evidence
    ({"port_down": ("gpu-01", "gpu-02")}, True),               # what is left is those nodes' own
])
def test_release_needs_the_leaf_to_look_healthy(more, released) -> None:
    nodes_ = fenced("leaf-a", repaired=True)
    d = probation(nodes_, 600, **more)
    assert bool(of(d, SwitchRelease)) is released
    if not released:
        assert d.switches == {"leaf-a": SwitchStatus.FAULT} and d.state.switch_healthy_since == {}


def test_what_is_left_after_the_release_is_judged_node_by_node() -> None:
    d = probation(fenced("leaf-a", repaired=True), 600, port_down=("gpu-02",))
    assert of(d, Quarantine) == []  # the release cycle itself still holds the leaf's nodes
    after = {n: view(n) for n in ALL}
    d2 = decide(S, obs(T0 + HOLD, ("gpu-02",)), after, d.state, T0 + HOLD)  # its hold ran on meanwhile
    assert [a.node for a in of(d2, Quarantine)] == ["gpu-02"]


def test_the_taint_removed_by_hand_releases_the_leaf_and_overrides_what_fires() -> None:
    by_hand = cluster(*(view(n, marked="leaf-a", reasons=("ib-port-down",), condition_false=True)
                        for n in LEAVES["leaf-a"]))
    d = decide(S, obs(T0, tuple(LEAVES["leaf-a"][:4])), by_hand, GuardState(), T0)
    assert [(r.leaf, r.why) for r in of(d, SwitchRelease)] == [("leaf-a", "our taint was removed by hand")]
    assert [a.node for a in of(d, SwitchUnfence)] == LEAVES["leaf-a"]
    assert [(a.node, a.signals) for a in of(d, RecordOverride)] == [
        (n, frozenset({"ib-port-down"})) for n in LEAVES["leaf-a"][:4]]
    assert of(d, SwitchFault) == of(d, Quarantine) == []
    # Next cycle, the marks gone and the override on the nodes: nothing fires that is not ignored.
    after = cluster(*(replace(view(n), overridden=frozenset({"ib-port-down"})) for n in LEAVES["leaf-a"][:4]))
    d2 = decide(S, obs(T0 + HOLD, tuple(LEAVES["leaf-a"][:4])), after, d.state, T0 + HOLD)
    assert d2.actions == ()


def test_a_release_cut_short_is_finished_not_judged_again() -> None:
    """One node's unfence failed (a conflict): the next cycle unfences it, with no new probation or repair mark."""
    d = probation(fenced("leaf-a", repaired=True), 600)
    assert d.state.switch_releasing == frozenset({"leaf-a"})
    half = fenced("leaf-a")
    half.update({n: view(n) for n in LEAVES["leaf-a"][1:]})  # only gpu-01 still carries the marks
    d2 = decide(S, obs(T0 + 1), half, d.state, T0 + 1)
    assert d2.actions == (SwitchUnfence("gpu-01", "leaf-a", "finishing the release"),)
    d3 = decide(S, obs(T0 + 2), cluster(), d2.state, T0 + 2)
    assert d3.actions == () and d3.state.switch_releasing == frozenset()


def test_a_condition_left_by_a_failed_status_write_is_cleared() -> None:
    stale = cluster(view("gpu-03", condition_false=True))
    d = decide(S, obs(T0), stale, GuardState(), T0)
    assert d.actions == (SwitchUnfence("gpu-03", "leaf-a", "a stale condition"),)


# --------------------------------------------------------------------------- property


LEAF_SIZES = st.lists(st.integers(min_value=1, max_value=9), min_size=1, max_size=4)


@settings(max_examples=150, deadline=None)
@given(sizes=LEAF_SIZES, data=st.data())
def test_property_no_switch_faulted_node_is_drained_for_ib_and_one_decision_per_leaf(sizes, data) -> None:
    nodes_: dict[str, NodeView] = {}
    members: dict[str, list[str]] = {}
    for i, size in enumerate(sizes):
        leaf = f"leaf-{i}"
        members[leaf] = [f"{leaf}-n{j}" for j in range(size)]
        nodes_.update({n: NodeView(n, "a", switch=SwitchMarks(leaf=leaf)) for n in members[leaf]})
    loose = [f"loose-{j}" for j in range(data.draw(st.integers(0, 3)))]
    nodes_.update({n: NodeView(n, "a") for n in loose})
    names = sorted(nodes_)
    down = data.draw(st.sets(st.sampled_from(names)))
    errors = data.draw(st.sets(st.sampled_from(names)))
    xid = data.draw(st.sets(st.sampled_from(names)))
    breaker = data.draw(st.sampled_from([None, "tripped"]))
    s = S.model_copy(update={"switch_fault_min_nodes": data.draw(st.integers(2, 6)),
                             "max_nodes_per_hour": data.draw(st.integers(0, 4))})

    def o(now: float) -> Observations:
        return Observations(
            readings={"ib-port-down": dict.fromkeys(down, 1.0), "ib-link-errors": dict.fromkeys(errors, 5.0),
                      "xid-fatal": dict.fromkeys(xid, 1.0)},
            last_seen={DCGM: dict.fromkeys(names, now), IB: dict.fromkeys(names, now)})

    first = decide(s, o(T0), nodes_, GuardState(), T0, breaker)
    # The first cycle's fences written back, as the shell does: the taint on the nodes is the record.
    after = dict(nodes_)
    for a in of(first, SwitchFence):
        after[a.node] = replace(after[a.node], switch=replace(after[a.node].switch, fault=a.leaf, marked=a.leaf,
                                                               reasons=a.reasons, condition_false=True))
    d = decide(s, o(T0 + HOLD), after, first.state, T0 + HOLD, breaker)
    bad_leaves = {leaf for leaf, ns in members.items() if sum(1 for n in ns if n in down | errors) >= need(s, len(ns))}
    # Every leaf with enough bad nodes yields exactly one switch decision over both cycles (error bursts hold at
    # once, ports after their minute), and no other leaf any.
    faults = [f.leaf for f in (*of(first, SwitchFault), *of(d, SwitchFault))]
    assert sorted(faults) == sorted(bad_leaves)
    assert {leaf for leaf, status in d.switches.items() if status is SwitchStatus.FAULT} == bad_leaves
    ib = s.fabric_signals
    for decision in (first, d):
        leaves_now = {f.leaf for f in of(decision, SwitchFault)} | {
            leaf for leaf, st_ in decision.switches.items() if st_ is not SwitchStatus.SUSPECT}
        under = {n for leaf in leaves_now for n in members[leaf]}
        for q in of(decision, Quarantine):
            assert q.node not in under or not set(q.reasons) & ib, q
        for q in of(decision, Quarantine) + of(decision, Suppress):
            assert not (q.node in under and set(q.reasons) <= ib)
        assert all(a.node not in under or a.node in xid for a in of(decision, Drain))
        assert not [t for t in of(decision, TripBreaker) if any(n in t.reason for n in under if n not in xid)]


# --------------------------------------------------------------------------- the shell


P = "gpucluster.io"
SHELL = HealthSettings(probation_seconds=30, max_nodes_per_hour=2, max_nodes_quarantined=2,
                       max_pool_percent_per_hour=100, max_pool_percent_quarantined=100)
SHELL_LEAVES = {"leaf-a": ["gpu-01", "gpu-02", "gpu-03", "gpu-04"], "leaf-b": ["gpu-05", "gpu-06"]}


class FabricPrometheus:
    """DCGM quiet and fresh everywhere; InfiniBand fresh, ports down where ``down`` says."""

    def __init__(self, nodes_: list[str]) -> None:
        self.nodes = nodes_
        self.down: set[str] = set()
        self.now = T0

    def query_raw(self, promql: str) -> Any:
        if "timestamp(DCGM_FI_DEV_GPU_TEMP)" in promql:
            return vector("Hostname", dict.fromkeys(self.nodes, self.now))
        if "timestamp(infiniband" in promql:
            return vector("node", dict.fromkeys(self.nodes, self.now))
        if promql == SHELL.signal("gpu-temperature").query:
            return vector("Hostname", dict.fromkeys(self.nodes, 50.0))
        if promql == SHELL.signal("ib-port-down").query:
            return vector("node", dict.fromkeys(self.down, 1.0))
        return vector("Hostname", {})


class Fabric(Views):
    def __init__(self) -> None:
        super().__init__()
        for leaf, members in SHELL_LEAVES.items():
            for n in members:
                node = k8s_node(n)
                node["metadata"]["labels"].update({f"{P}/leaf": leaf, f"{P}/spine": "spine-1"})
                self.put(NODES_RES, node)
                self.put(PODS, k8s_pod(f"gang-{n}", n, "training", job="gang"))

    def switch_condition(self, name: str) -> dict[str, Any] | None:
        return next((c for c in self.nodes[name]["status"]["conditions"]
                     if c["type"] == "InfinibandSwitchHealthy"), None)


@pytest.fixture
def fabric() -> tuple[FabricPrometheus, Fabric, Guard]:
    prom, port = FabricPrometheus([n for ns in SHELL_LEAVES.values() for n in ns]), Fabric()
    return prom, port, Guard(SHELL, prom, port, identity="me")


def step(prom: FabricPrometheus, guard: Guard, t: float) -> Decision | None:
    prom.now = T0 + t
    return turn(guard, T0 + t, t)


def test_shell_fences_the_leaf_as_one_and_evicts_nothing(fabric) -> None:
    prom, port, guard = fabric
    prom.down = {"gpu-01", "gpu-02", "gpu-03"}
    step(prom, guard, 0)
    step(prom, guard, HOLD)
    for n in SHELL_LEAVES["leaf-a"]:
        assert port.taints(n) == [(f"{P}/pool", "a", "NoSchedule"), (f"{P}/switch-fault", "leaf-a", "NoSchedule")]
        labels = port.nodes[n]["metadata"]["labels"]
        assert labels[f"{P}/switch-fault"] == "leaf-a" and f"{P}/gpu-health" not in labels
        cond = port.switch_condition(n)
        assert cond is not None and cond["status"] == "False" and "leaf switch leaf-a" in cond["message"]
        assert f"{P}/switch-repaired" in cond["message"]
    assert port.taints("gpu-05") == [(f"{P}/pool", "a", "NoSchedule")]
    assert port.evicted_names == []
    switch_events = [e for e in port.events if e["reason"] == "InfinibandSwitchFault"]
    assert len(switch_events) == 1 and "leaf switch leaf-a (spine spine-1)" in switch_events[0]["message"]
    assert switch_events[0]["involvedObject"]["name"] == "gpu-01"
    assert sample(guard, "gpucluster_health_switch_faults", {"leaf": "leaf-a"}) == 1
    assert sample(guard, "gpucluster_health_breaker_tripped") == 0
    assert sample(guard, "gpucluster_health_nodes", {"status": "switch-fault"}) == 4
    # Cycles later and in a new process: nothing written twice.
    def writes() -> list[tuple[str, str, float]]:
        return [w for w in port.writes() if "leases" not in w[0]]

    before = writes()
    step(prom, guard, HOLD + 1)
    step(prom, Guard(SHELL, prom, port, identity="me"), HOLD + 2)
    assert writes() == before


def test_shell_releases_the_leaf_after_probation_and_its_repair_mark(fabric) -> None:
    prom, port, guard = fabric
    prom.down = {"gpu-01", "gpu-02", "gpu-03", "gpu-04"}
    step(prom, guard, 0)
    step(prom, guard, HOLD)
    prom.down = set()
    for t in (HOLD + 10, HOLD + 45):
        step(prom, guard, t)
    assert (f"{P}/switch-fault", "leaf-a", "NoSchedule") in port.taints("gpu-02")  # a port down: fatal
    port.edit_node("gpu-03", lambda n: n["metadata"]["labels"].update({f"{P}/switch-repaired": "alice"}))
    step(prom, guard, HOLD + 46)
    for n in SHELL_LEAVES["leaf-a"]:
        assert port.taints(n) == [(f"{P}/pool", "a", "NoSchedule")]
        labels = port.nodes[n]["metadata"]["labels"]
        assert f"{P}/switch-fault" not in labels and f"{P}/switch-repaired" not in labels
        cond = port.switch_condition(n)
        assert cond is not None and cond["status"] == "True"
    assert [e["reason"] for e in port.events if "Switch" in e["reason"]] == [
        "InfinibandSwitchFault", "InfinibandSwitchReleased"]
    assert sample(guard, "gpucluster_health_switch_faults", {"leaf": "leaf-a"}) == 0


def test_shell_finishes_a_release_a_conflict_cut_short(fabric) -> None:
    prom, port, guard = fabric
    prom.down = set(SHELL_LEAVES["leaf-b"])
    step(prom, guard, 0)
    step(prom, guard, HOLD)
    prom.down = set()
    step(prom, guard, HOLD + 1)
    port.edit_node("gpu-06", lambda n: n["metadata"]["annotations"].update({f"{P}/switch-repaired": "bob"}))
    port.fail("patch:nodes", ApiError("conflict", "the object has been modified", 409))
    step(prom, guard, HOLD + 31)
    carrying = [n for n in SHELL_LEAVES["leaf-b"] if (f"{P}/switch-fault", "leaf-b", "NoSchedule") in port.taints(n)]
    assert len(carrying) == 1
    step(prom, guard, HOLD + 32)
    assert all(port.taints(n) == [(f"{P}/pool", "a", "NoSchedule")] for n in SHELL_LEAVES["leaf-b"])
    assert [e["reason"] for e in port.events if "Switch" in e["reason"]] == [
        "InfinibandSwitchFault", "InfinibandSwitchReleased"]


def test_shell_a_single_bad_port_is_quarantined_and_drained_as_before(fabric) -> None:
    prom, port, guard = fabric
    prom.down = {"gpu-05"}
    step(prom, guard, 0)
    step(prom, guard, HOLD)
    assert port.taints("gpu-05")[-1] == (f"{P}/gpu-health", "fatal", "NoSchedule")
    assert port.evicted_names == ["gang-gpu-05"]
    assert not [e for e in port.events if "Switch" in e["reason"]]


def test_shell_a_quarantine_and_a_fence_in_one_cycle_both_land(fabric) -> None:
    """The node's second patch carries the resourceVersion its first one left, not the stale one."""
    prom, port, guard = fabric
    prom.down = {"gpu-05", "gpu-06"}
    step(prom, guard, 0)
    step(prom, guard, HOLD)
    for n in ("gpu-05", "gpu-06"):
        assert (f"{P}/switch-fault", "leaf-b", "NoSchedule") in port.taints(n)
    assert sample(guard, "gpucluster_health_errors_total", {"stage": "patch"}) == 0


def test_shell_the_taint_removed_by_hand_is_respected(fabric) -> None:
    prom, port, guard = fabric
    prom.down = set(SHELL_LEAVES["leaf-a"])
    step(prom, guard, 0)
    step(prom, guard, HOLD)
    for n in SHELL_LEAVES["leaf-a"]:  # kubectl taint nodes -l gpucluster.io/leaf=leaf-a gpucluster.io/switch-fault-
        port.edit_node(n, lambda node: node["spec"].update(
            taints=[t for t in node["spec"]["taints"] if t["key"] != f"{P}/switch-fault"]))
    for t in range(1, 5):
        step(prom, guard, HOLD + t)
    for n in SHELL_LEAVES["leaf-a"]:
        assert port.taints(n) == [(f"{P}/pool", "a", "NoSchedule")]
        annotations = port.nodes[n]["metadata"]["annotations"]
        assert annotations[f"{P}/gpu-health-overridden"] == "ib-port-down"
        assert f"{P}/switch-fault" not in port.nodes[n]["metadata"]["labels"]
    assert port.evicted_names == []


# --------------------------------------------------------------------------- the stack


def test_the_stack_keys_reach_the_guard_and_are_checked() -> None:
    from components.config import ConfigError, load_stack
    from components.health_guard import settings_from_config

    stack = Path(__file__).resolve().parents[1] / "Pulumi.local.yaml"
    default = settings_from_config(load_stack(stack))
    assert (default.switch_fault_min_nodes, default.switch_fault_leaf_percent) == (3, 50.0)
    s = settings_from_config(load_stack(stack, {"observability": {"health": {
        "switchFaultMinNodes": 8, "switchFaultLeafPercent": 25}}}))
    assert (s.switch_fault_min_nodes, s.switch_fault_leaf_percent) == (8, 25.0)
    with pytest.raises(ConfigError, match="switchFaultMinNodes"):
        load_stack(stack, {"observability": {"health": {"switchFaultMinNodes": 1}}})
