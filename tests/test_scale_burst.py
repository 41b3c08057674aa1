"""The burst run at scale, its pure parts: the scenario's plan on each shape, the phases' view of a sample of the API's
pods and nodes, and the phase clock the simulator and the run share."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bench.bench_sim_vs_e2e import PHASES, UNGATE, PhaseClock, PhaseView
from tools.localcluster import scaleburst
from tools.localcluster.scale import quick_burst, shape, shape_config

ROOT = Path(__file__).resolve().parent.parent
PREFIX = "gpucluster.io"


@pytest.mark.parametrize("name", ["small", "prod", "llama3"])
def test_the_plan_leaves_on_prem_short_by_what_the_providers_can_hold(name: str) -> None:
    cfg = shape_config(shape(name), ROOT)
    plan = scaleburst.burst_plan(cfg, "h100-a")
    assert plan.gang_pods == len(cfg.pool("h100-a").node_names)
    assert plan.inference_gpus == sum(s.max_replicas * s.gpus_per_replica for s in cfg.inference.services)
    assert plan.external_gpus == sum(p.gpus for p in cfg.providers)
    assert plan.displaced_gpus > 0
    if plan.background_pool is None:  # the gang takes every on-prem GPU: all of inference is displaced
        assert plan.displaced_gpus == plan.inference_gpus
    else:
        assert plan.displaced_gpus <= plan.external_gpus
        assert 0 < plan.background_pods <= len(cfg.pool(plan.background_pool).node_names)
    # Every gang fits its team's capability, beside the other gang where both are the same team's.
    caps = {t.name: t.capability_gpus for t in cfg.scheduling.teams}
    held: dict[str, int] = {}
    if plan.background_team is not None:  # the gang is the platform's own job: the training queue, no team
        held[plan.background_team] = plan.background_pods * 8
    assert all(caps[t] is None or gpus <= caps[t] for t, gpus in held.items()), (held, caps)


def test_the_prod_plan_is_the_stack_as_declared() -> None:
    """Prod's services at maxReplicas take 512 GPUs and its providers hold 384: the other training (a team's,
    within its capability) leaves on-prem 192 GPUs short."""
    plan = scaleburst.burst_plan(shape_config(shape("prod"), ROOT), "h100-a")
    assert (plan.inference_gpus, plan.external_gpus, plan.displaced_gpus) == (512, 384, 192)
    assert (plan.background_team, plan.background_pods) == ("llm", 88)


def test_the_small_shape_runs_the_local_stacks_timings_and_keeps_its_proportions() -> None:
    small, prod = shape_config(shape("small"), ROOT), shape_config(shape("prod"), ROOT)
    local = quick_burst(ROOT)
    assert small.burst.close_hold_seconds == local["burst"]["closeHoldSeconds"] == 20  # Pulumi.local.yaml's
    assert small.descheduler.min_pod_age_seconds == local["descheduler"]["minPodAgeSeconds"] == 30
    assert small.burst.handover.timeout_seconds == local["burst"]["handover"]["timeoutSeconds"] == 60
    assert prod.burst.close_hold_seconds == 900  # the stack's own
    ratio = small.onprem_gpus / prod.onprem_gpus
    for a, b in zip(small.inference.services, prod.inference.services, strict=True):
        assert a.min_replicas == b.min_replicas
        assert a.max_replicas == max(b.min_replicas, int(b.max_replicas * ratio))
    assert [p.gpus for p in small.providers] == [max(8, int(p.gpus * ratio)) for p in prod.providers]


def _cfg(pool_nodes: int, other_nodes: int, inference: int, external: int, cap: int | None) -> Any:
    pools = [SimpleNamespace(name="a", node_names=[f"a{i}" for i in range(pool_nodes)], gpus_per_node=8,
                             gpu_count=pool_nodes * 8)]
    if other_nodes:
        pools.append(SimpleNamespace(name="b", node_names=[f"b{i}" for i in range(other_nodes)], gpus_per_node=8,
                                     gpu_count=other_nodes * 8))
    by_name = {p.name: p for p in pools}
    return SimpleNamespace(
        label_prefix="gpucluster.io", pools=pools, pool=by_name.__getitem__,
        onprem_gpus=sum(p.gpu_count for p in pools),
        inference=SimpleNamespace(services=[SimpleNamespace(max_replicas=inference, gpus_per_replica=1)]),
        providers=[SimpleNamespace(gpus=external)],
        scheduling=SimpleNamespace(teams=[SimpleNamespace(name="t", capability_gpus=cap)]))


@given(st.integers(1, 300), st.integers(0, 300), st.integers(1, 4000), st.integers(0, 4000))
def test_the_other_training_never_overflows_its_pool_and_on_prem_is_short_exactly_as_planned(
        pool_nodes: int, other_nodes: int, inference: int, external: int) -> None:
    plan = scaleburst.burst_plan(_cfg(pool_nodes, other_nodes, inference, external, None), "a")
    assert 0 <= plan.background_pods <= other_nodes
    free_after = (pool_nodes + other_nodes) * 8 - pool_nodes * 8 - plan.background_pods * 8
    assert plan.displaced_gpus == max(0, inference - free_after)
    if 0 < plan.background_pods < other_nodes:  # room to size it: short by half the providers, to a node
        want = min(inference, external // 2)
        assert want <= plan.displaced_gpus < want + 8


def test_a_team_without_room_is_an_error_that_says_so() -> None:
    with pytest.raises(ValueError, match="no team's capabilityGpus leaves room for a gang of 800 GPUs"):
        scaleburst.burst_plan(_cfg(10, 100, 10, 10, 512), "a")


def _pod(name: str, svc: str, node: str | None, ready: bool, role: str | None = None,
         deleting: bool = False) -> dict[str, Any]:
    labels = {f"{PREFIX}/service": svc, **({f"{PREFIX}/role": role} if role else {})}
    return {"metadata": {"name": name, "labels": labels, **({"deletionTimestamp": "x"} if deleting else {})},
            "spec": {"nodeName": node},
            "status": {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}}


def test_the_view_counts_ready_main_replicas_by_place_and_the_standby_apart() -> None:
    pods = [_pod("m1", "chat", "gpu-a-1", True), _pod("m2", "chat", "vk-1", True), _pod("m3", "chat", "gpu-b-1", True),
            _pod("m4", "chat", "gpu-a-2", False), _pod("m5", "chat", "gpu-a-3", True, deleting=True),
            _pod("s1", "chat", "vk-1", True, role="standby"), _pod("s2", "chat", None, False, role="standby"),
            _pod("w1", "chat", "vk-1", True, role="warm"), _pod("x1", "other", "gpu-a-1", True)]
    v = scaleburst.view(pods, {"chat": 2}, (None, "NoSchedule"), {"chat": 4}, PREFIX, {"gpu-a-1", "gpu-a-2",
                        "gpu-a-3"}, {"vk-1"}, gang_ungated=True, gang_running=False)
    assert (v.ready["chat"], v.ready_in_pool["chat"], v.ready_external["chat"]) == (3, 1, 1)
    assert (v.standby_asked["chat"], v.standby_ready["chat"], v.standby_live["chat"]) == (2, 1, 2)
    assert "other" not in v.ready
    holds = v.holds()
    assert holds[UNGATE] and not holds["time_to_preempt_s"] and not holds["time_to_open_s"]
    assert not holds["time_to_standby_ready_s"] and not holds["time_to_close_s"]


def test_the_burst_taints_effect_is_read_by_its_key_only() -> None:
    node = {"spec": {"taints": [{"key": "virtual-kubelet.io/provider", "effect": "NoSchedule"},
                                {"key": f"{PREFIX}/burst", "effect": "NoSchedule"}]}}
    assert scaleburst.burst_effect(node, f"{PREFIX}/burst") == "NoSchedule"
    assert scaleburst.burst_effect({"spec": {}}, f"{PREFIX}/burst") is None


def test_only_the_main_deployments_go_to_max_replicas() -> None:
    cfg = shape_config(shape("small"), ROOT)
    objs = [{"kind": "Deployment", "metadata": {"name": s.name, "namespace": cfg.inference_namespace},
             "spec": {}} for s in cfg.inference.services]
    objs += [{"kind": "Deployment", "metadata": {"name": "sdxl-turbo-standby", "namespace": cfg.inference_namespace},
              "spec": {"replicas": 0}},
             {"kind": "Deployment", "metadata": {"name": "burst-controller", "namespace": "gpu-system"}, "spec": {}},
             {"kind": "Service", "metadata": {"name": "sdxl-turbo", "namespace": cfg.inference_namespace}}]
    out = scaleburst.inference_at_max(objs, cfg)
    assert {d["metadata"]["name"]: d["spec"].get("replicas") for d in out} == {
        **{s.name: s.max_replicas for s in cfg.inference.services}, "sdxl-turbo-standby": 0}
    assert objs[0]["spec"] == {}  # the rendered objects are not changed


def _view(**over: Any) -> PhaseView:
    base: dict[str, Any] = dict(wanted={"s": 2}, ready={"s": 2}, ready_in_pool={"s": 2}, ready_external={"s": 0},
                                standby_asked={"s": 0}, standby_ready={"s": 0}, standby_live={"s": 0},
                                taints=("NoSchedule",), gang_ungated=False, gang_running=False)
    return PhaseView(**{**base, **over})


def test_the_clock_times_the_end_phases_from_the_end_only() -> None:
    clock = PhaseClock(chained=False)
    clock.see(1.0, _view(), None)  # the taint is on and nothing is external: close and return hold already
    assert "time_to_close_s" not in clock.phases and "time_to_return_s" not in clock.phases
    assert "time_to_standby_gone_s" not in clock.phases  # gone only after the gang ran
    clock.see(5.0, _view(gang_running=True, gang_ungated=True, ready_in_pool={"s": 0}), None)
    assert clock.phases["time_to_gang_running_s"] == 5.0 and clock.phases[UNGATE] == 5.0
    assert clock.phases["time_to_preempt_s"] == 5.0 and clock.phases["time_to_standby_gone_s"] == 5.0
    clock.see(40.0, _view(), 3.0)
    assert clock.phases["time_to_close_s"] == 3.0 and clock.phases["time_to_return_s"] == 3.0
    assert clock.phases["time_to_return_standby_gone_s"] == 3.0


def test_a_chained_clock_waits_for_each_phase_before_the_next() -> None:
    clock = PhaseClock(chained=True)
    clock.see(2.0, _view(gang_running=True, ready_in_pool={"s": 0}), None)  # no standby ready yet: nothing
    assert set(clock.phases) <= {UNGATE}
    clock.see(3.0, _view(standby_asked={"s": 2}, standby_ready={"s": 2}, standby_live={"s": 2}), None)
    assert clock.phases["time_to_standby_ready_s"] == 3.0 and "time_to_preempt_s" not in clock.phases
    assert list(clock.phases) == [k for k in (UNGATE, *PHASES) if k in clock.phases]


def test_descheduler_cycles_are_read_from_its_log() -> None:
    log = ('I1 "Number of evictions" ... totalEvicted=3\nnoise\nI2 "Number of evictions in this cycle" x '
           'totalEvicted=16\n')
    assert scaleburst.evictions_per_cycle(log) == [3, 16]


def test_occupancy_counts_nodes_live_pods_are_bound_to() -> None:
    pods = [{"spec": {"nodeName": "a1"}, "status": {"phase": "Running"}, "metadata": {}},
            {"spec": {"nodeName": "a2"}, "status": {"phase": "Succeeded"}, "metadata": {}},
            {"spec": {"nodeName": "a3"}, "status": {"phase": "Running"}, "metadata": {"deletionTimestamp": "x"}},
            {"spec": {}, "status": {"phase": "Pending"}, "metadata": {}}]
    assert scaleburst.occupancy(pods, ["a1", "a2", "a3", "a4"]) == (["a2", "a3", "a4"], ["a1"])


class _Core:
    def __init__(self, pods: list[dict[str, Any]], reserved: tuple[str, ...] = ()) -> None:
        self.pods = pods
        self.reserved = reserved

    def list_node(self) -> Any:
        def node(name: str) -> Any:
            taints = [SimpleNamespace(key="gpucluster.io/reserved", value="a")] if name in self.reserved else None
            return SimpleNamespace(metadata=SimpleNamespace(name=name), spec=SimpleNamespace(taints=taints))

        return SimpleNamespace(items=[node(f"a{i}") for i in range(4)] + [node("b0")])

    def list_pod_for_all_namespaces(self, **_: Any) -> Any:
        import json

        return SimpleNamespace(data=json.dumps({"items": self.pods}).encode())


@pytest.mark.parametrize(("bound", "stalled"), [(["a1"], True), ([], False), (["a0", "a1", "a2", "a3"], False)])
def test_a_stall_is_named_the_reclaim_stall_only_when_the_pool_has_empty_and_occupied_nodes(
        bound: list[str], stalled: bool) -> None:
    """Volcano 1.14.1 reclaims onto nodes with reclaimees only and commits whole jobs only, and allocate discards a
    partial gang: a whole-pool gang in a pool with both kinds of node is placed by neither (the burst run at scale)."""
    cfg = _cfg(4, 0, 1, 1, None)
    pods = [{"spec": {"nodeName": n}, "status": {"phase": "Running"}, "metadata": {}} for n in bound]
    out = scaleburst.stall(_Core(pods, reserved=("a0", "a1", "b0")), cfg, "a", 4, 180.0)
    assert out["reclaim_stall"] is stalled
    assert out["reserved_nodes"] == 2 and "2 reserved for it" in out["reason"]
    assert (out["empty_nodes"], out["occupied_nodes"]) == (4 - len(bound), len(bound))
    assert (scaleburst.RECLAIM_STALL in out["reason"]) is stalled


def test_an_agents_evictions_are_counted_by_their_answer() -> None:
    def event(agent: str, code: int, sub: str = "eviction", stage: str = "ResponseComplete") -> dict[str, Any]:
        return {"stage": stage, "verb": "create", "objectRef": {"resource": "pods", "subresource": sub},
                "userAgent": f"{agent}/1.0 (linux)", "responseStatus": {"code": code}}

    events = [event("burst-controller", 201), event("burst-controller", 429), event("burst-controller", 201),
              event("descheduler", 201), event("burst-controller", 201, sub="binding"),
              event("burst-controller", 201, stage="RequestReceived"), {"stage": "ResponseComplete", "verb": "create",
                                                                          "objectRef": "broken", "user": 3}]
    assert scaleburst.evictions_by(events, "burst-controller") == {"201": 2, "429": 1}


def test_a_return_held_by_a_standby_with_no_room_is_named_the_pdb_deadlock() -> None:
    """The small shape's run: 44 sdxl replicas outside after the close, their return standby 20 of 44 placed, the PDB
    counting the 24 pending as expected and allowing no disruption; the descheduler moved nothing for 37 minutes."""
    import json

    cfg = shape_config(shape("small"), ROOT)
    ns, outside = cfg.inference_namespace, cfg.providers[0].node_name

    def pod(name: str, node: str | None, role: str | None = None) -> dict[str, Any]:
        labels = {f"{PREFIX}/service": "sdxl-turbo", **({f"{PREFIX}/role": role} if role else {})}
        return {"metadata": {"name": name, "labels": labels}, "spec": {"nodeName": node}}

    pods = [pod("m1", outside), pod("m2", "gpu-b-001"), pod("s1", outside, "standby"), pod("s2", None, "standby")]
    core = SimpleNamespace(list_namespaced_pod=lambda namespace, **_: SimpleNamespace(
        data=json.dumps({"items": pods if namespace == ns else []}).encode()))
    budget = SimpleNamespace(metadata=SimpleNamespace(name="sdxl-turbo", labels={f"{PREFIX}/service": "sdxl-turbo"}),
                             status=SimpleNamespace(disruptions_allowed=0))
    policy = SimpleNamespace(list_namespaced_pod_disruption_budget=lambda namespace: SimpleNamespace(items=[budget]))
    out = scaleburst.blocked_return(core, policy, cfg)
    assert out["services"]["sdxl-turbo"] == {"outside": 1, "standby": 2, "standby_unplaced": 1,
                                             "pdb_disruptions_allowed": 0}
    assert out["pdb_deadlock"] and "allows no disruption" in out["reason"]
    budget.status.disruptions_allowed = 1  # the PDB lets it go: something else holds it, not named the deadlock
    assert not scaleburst.blocked_return(core, policy, cfg)["pdb_deadlock"]
