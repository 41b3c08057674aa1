"""Warm spares: the choice by tables and properties, then the node-pool agent keeping them on the in-memory API
while the guard quarantines and releases a node under a gang."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agents.kit.port import NODES, PODS
from agents.node_pools.contract import NodePoolSettings, Pool, Taint, parse_settings
from agents.node_pools.decide import Applied
from agents.node_pools.shell import NodePools
from agents.node_pools.spares import SpareView, choose_spares, target
from components.mockrt import config_error
from fakes.kube_api import MemoryApi
from tests.test_node_pools import ANNOTATION, HEALTH, PREFIX, node
from tests.test_node_pools import applied as applied_patch

SPARE = {"key": f"{PREFIX}/spare", "value": "true", "effect": "NoSchedule"}
V = SpareView


@pytest.mark.parametrize(("case", "nodes", "spares", "expected"), [
    ("a new pool: the idle nodes, first by name", [V("a"), V("b"), V("c")], 1, {"a"}),
    ("a node in training is never taken", [V("a", training=True), V("b"), V("c")], 2, {"b", "c"}),
    ("the spares stay spares", [V("a"), V("b", spare=True), V("c")], 1, {"b"}),
    ("a quarantine uses one up: the spare is released", [V("a", quarantined=True), V("b", spare=True)], 1, set()),
    ("a quarantined node is no spare", [V("a", quarantined=True, spare=True), V("b"), V("c")], 2, {"b"}),
    ("a fenced leaf's node is no spare", [V("a", fenced=True, spare=True), V("b")], 1, {"b"}),
    ("the spare in the leaf that lost a node goes first",
     [V("a1", "L1", quarantined=True), V("a2", "L1", spare=True), V("b1", "L2", spare=True), V("b2", "L2")], 2,
     {"b1"}),
    ("a new spare in the leaf with the fewest", [V("a1", "L1", spare=True), V("a2", "L1"), V("b1", "L2")], 2,
     {"a1", "b1"}),
    ("no idle node: fewer spares than wanted", [V("a", training=True), V("b", spare=True)], 2, {"b"}),
    # The burst handover emptied it for a gang that waits: training does not tolerate the spare taint.
    ("a node reserved for waiting training is not taken", [V("a", reserved=True), V("b")], 1, {"b"}),
    ("a spare already is kept though reserved since", [V("a", spare=True, reserved=True), V("b")], 1, {"a"}),
    ("none wanted", [V("a", spare=True), V("b")], 0, set()),
])
def test_which_nodes_are_spares(case: str, nodes: list[SpareView], spares: int, expected: set[str]) -> None:
    assert choose_spares(nodes, spares) == expected, case


VIEW = st.builds(SpareView, name=st.sampled_from([f"n{i}" for i in range(12)]),
                 leaf=st.sampled_from([None, "L1", "L2", "L3"]), quarantined=st.booleans(), fenced=st.booleans(),
                 spare=st.booleans(), training=st.booleans(), reserved=st.booleans())


@given(nodes=st.lists(VIEW, max_size=12, unique_by=lambda v: v.name), spares=st.integers(0, 6))
def test_spares_are_usable_idle_or_kept_never_more_than_wanted_and_stable(nodes: list[SpareView],
                                                                          spares: int) -> None:
    chosen = choose_spares(nodes, spares)
    by_name = {n.name: n for n in nodes}
    want = target(spares, nodes)
    usable = [n for n in nodes if not n.quarantined and not n.fenced]
    kept = [n for n in usable if n.spare]
    idle = [n for n in usable if not n.spare and not n.training and not n.reserved]
    assert len(chosen) == min(want, len(kept) + len(idle))
    for name in chosen:
        n = by_name[name]
        assert not n.quarantined and not n.fenced  # only a node that can serve
        assert n.spare or not (n.training or n.reserved)  # a busy or reserved node is never taken
    if want >= len(kept):  # nothing to release: every spare stays one (no flip on an unrelated event)
        assert {n.name for n in kept} <= chosen
    else:  # only spares, no new one, while some must go
        assert chosen <= {n.name for n in kept}
    # Applying the choice and asking again changes nothing.
    again = [SpareView(n.name, n.leaf, n.quarantined, n.fenced, n.name in chosen, n.training, n.reserved)
             for n in nodes]
    assert choose_spares(again, spares) == chosen


# ------------------------------------------------------------------ the agent

POOL = Pool(name="h100-a", nodes=["gpu-a-[001-004]"], labels={f"{PREFIX}/pool": "h100-a"},
            taints=[Taint(key=f"{PREFIX}/pool", value="h100-a", effect="NoSchedule")], spares=1)


def pod(name: str, node_name: str, phase: str = "Running") -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "training"}, "spec": {"nodeName": node_name},
            "status": {"phase": phase}}


def spares(api: MemoryApi) -> set[str]:
    return {n for n in (f"gpu-a-00{i}" for i in range(1, 5))
            if SPARE in (api.get(NODES, n)["spec"].get("taints") or [])}


def settle(agent: NodePools, api: MemoryApi) -> None:
    """Passes until nothing is sent, the watches brought current by a relist each time."""
    for _ in range(5):
        agent.informer.relist()
        assert agent.pod_informer is not None
        agent.pod_informer.relist()
        if agent.reconcile() == 0:
            return
    raise AssertionError("the agent did not converge")


def test_a_quarantine_releases_the_spare_at_once_and_the_repaired_node_becomes_the_next() -> None:
    api = MemoryApi()
    for i in range(1, 5):
        api.put(NODES, node(f"gpu-a-00{i}"))
    for i, where in enumerate(("gpu-a-001", "gpu-a-002", "gpu-a-004")):  # a gang on three nodes
        api.put(PODS, pod(f"gang-worker-{i}", where))
    api.put(PODS, pod("old-gang-worker-0", "gpu-a-004", phase="Succeeded"))  # done: not busy
    agent = NodePools(NodePoolSettings(label_prefix=PREFIX, pools=[POOL], namespace="gpu-system"), api,
                      identity="a")
    assert agent.elector.step()
    settle(agent, api)
    assert spares(api) == {"gpu-a-003"}  # the one idle node
    assert agent.registry.get_sample_value("gpucluster_node_pools_spares", {"pool": "h100-a"}) == 1

    # The guard quarantines gpu-a-002 under the gang: the spare is released in the same pass, so the replacement
    # pod can bind there; the guard's taint stays.
    quarantined = copy.deepcopy(api.get(NODES, "gpu-a-002"))
    quarantined["spec"]["taints"].append(HEALTH)
    api.put(NODES, quarantined)
    api.remove(PODS, "training/gang-worker-1")
    settle(agent, api)
    assert spares(api) == set()
    assert HEALTH in api.get(NODES, "gpu-a-002")["spec"]["taints"]
    api.put(PODS, pod("gang-worker-1", "gpu-a-003"))  # the replacement lands on the released spare

    # Repaired and through probation, the guard releases it: it is the idle node, so it becomes the spare.
    repaired = copy.deepcopy(api.get(NODES, "gpu-a-002"))
    repaired["spec"]["taints"] = [t for t in repaired["spec"]["taints"] if t != HEALTH]
    api.put(NODES, repaired)
    settle(agent, api)
    assert spares(api) == {"gpu-a-002"}


def test_while_the_pod_watch_is_not_current_the_spares_stay_as_the_nodes_carry_them() -> None:
    """A restarted agent lists nodes before pods: until it knows which nodes are busy it neither takes a new spare
    nor drops one (a spare dropped for a moment is a node a gang may take)."""
    api = MemoryApi()
    # As the agent before the restart left them: gpu-a-004 its spare, the record saying the agent set the taint.
    record = Applied(frozenset({f"{PREFIX}/pool"}), frozenset({f"{PREFIX}/pool", SPARE["key"]})).document()
    for i in range(1, 5):
        api.put(NODES, node(f"gpu-a-00{i}", taints=[SPARE] if i == 4 else [], annotations={ANNOTATION: record}))
    agent = NodePools(NodePoolSettings(label_prefix=PREFIX, pools=[POOL], namespace="gpu-system"), api,
                      identity="a")
    assert agent.elector.step()
    agent.informer.relist()
    agent.reconcile()  # the pod watch has not listed yet
    assert spares(api) == {"gpu-a-004"}
    assert all(f"{PREFIX}/pool" in api.get(NODES, f"gpu-a-00{i}")["metadata"]["labels"] for i in range(1, 5))
    settle(agent, api)  # once it has, the spare the node carries is kept: it is idle and the pool wants one
    assert spares(api) == {"gpu-a-004"}


def test_without_spares_the_agent_watches_no_pods() -> None:
    plain = Pool(name="h100-a", nodes=["gpu-a-[001-004]"])
    agent = NodePools(NodePoolSettings(label_prefix=PREFIX, pools=[plain]), MemoryApi())
    assert agent.pod_informer is None


@pytest.mark.parametrize(("pool", "expected"), [
    (Pool(name="p", nodes=["gpu-[1-2]"], spares=2), "pool p: spares (2) must be fewer than its nodes (2)"),
    (Pool(name="p", nodes=["gpu-[1-2]"], taints=[Taint(key=f"{PREFIX}/spare", effect="NoSchedule")]),
     f"pool p: {PREFIX}/spare belongs to the pool's spares; a pool may not set it"),
    (Pool(name="p", nodes=["gpu-[1-2]"], taints=[Taint(key=f"{PREFIX}/reserved", effect="NoSchedule")]),
     f"pool p: {PREFIX}/reserved belongs to the burst handover; a pool may not set it"),
])
def test_settings_refuse_spares_that_leave_no_node_and_the_spare_taint_as_a_pool_taint(pool: Pool,
                                                                                       expected: str) -> None:
    with pytest.raises(ValueError, match=expected.replace("(", r"\(").replace(")", r"\)")):
        NodePoolSettings(label_prefix=PREFIX, pools=[pool])


# ------------------------------------------------------------------ what the stack renders


def test_each_pool_keeps_the_spares_its_size_and_repair_time_call_for(prod: Any, local: Any) -> None:
    settings = parse_settings(json.loads(prod.one("ConfigMap", "node-pools-settings").inputs["data"]["settings.json"]))
    # 128 nodes × 8 GPUs at the Llama 3 rate, out 48 h each: 0.97 nodes in repair on average; with four spares a
    # failure finds one 98 % of the time (three: 92.5 %, under the 95 % default coverage).
    assert {p.name: p.spares for p in settings.pools} == {"h100-a": 4, "h200-b": 4}
    assert settings.training_namespace == "training"
    # Only then does the agent read pods, and only the training namespace's, to tell an idle node.
    role = prod.one("Role", "node-pools-pods")
    assert role.metadata["namespace"] == "training"
    assert role.inputs["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "watch"]}]
    # Four nodes a pool: none (a sized count holds back at most one node in 16), so the local stack renders neither.
    local_settings = json.loads(local.one("ConfigMap", "node-pools-settings").inputs["data"]["settings.json"])
    assert all(p.get("spares", 0) == 0 for p in local_settings["pools"])
    assert not [r for r in local.by_kind("Role") if r.metadata["name"] == "node-pools-pods"]


def test_an_explicit_spare_count_wins_and_one_that_leaves_no_node_is_refused(run_stack: Any) -> None:
    result = run_stack("prod", lambda cfg: cfg["gpu-cluster:pools"][1].update(spareNodes=2))
    pools = json.loads(result.one("ConfigMap", "node-pools-settings").inputs["data"]["settings.json"])["pools"]
    assert [p["spares"] for p in pools] == [4, 2]
    message = config_error(lambda raw: raw["pools"][0].update(spareNodes=128))
    assert "pools[0].spareNodes: must leave the pool at least one node for training: it has 128" in message
    message = config_error(lambda raw: raw["pools"][0].update(repairHours=0))
    assert "pools[0].repairHours" in message


def test_the_spares_pull_the_pools_training_images_ahead(prod: Any, run_stack: Any) -> None:
    """One DaemonSet per pool that keeps spares and has images to pull: on the spares only (the agent's label),
    every image by an init container, never preempting (the lowest class), restricted and tokenless."""
    prepull = {d.metadata["name"]: d for d in prod.by_kind("DaemonSet") if d.metadata["name"].startswith("image-")}
    assert set(prepull) == {"image-prepull-h100-a"}  # h200-b declares no job: nothing to pull
    spec = prepull["image-prepull-h100-a"].inputs["spec"]["template"]["spec"]
    assert spec["nodeSelector"] == {"gpucluster.io/pool": "h100-a", "gpucluster.io/spare": "true"}
    assert [c["image"] for c in spec["initContainers"]] == ["registry.gpucluster.io/training/megatron-llm:24.11-py3"]
    assert spec["initContainers"][0]["command"] == ["/bin/sh", "-c", "exit 0"]
    assert spec["priorityClassName"] == "standard" and spec["automountServiceAccountToken"] is False
    assert {t["key"] for t in spec["tolerations"]} == {"gpucluster.io/pool", "gpucluster.io/spare"}
    assert all(c["securityContext"]["runAsNonRoot"] for c in (*spec["initContainers"], *spec["containers"]))
    extra = "registry.gpucluster.io/training/research:2026.12"
    more = run_stack("prod", lambda cfg: cfg["gpu-cluster:training"].update(prepullImages=[extra]))
    images = {d.metadata["name"]: [c["image"] for c in d.inputs["spec"]["template"]["spec"]["initContainers"]]
              for d in more.by_kind("DaemonSet") if d.metadata["name"].startswith("image-prepull-")}
    assert images == {"image-prepull-h100-a": ["registry.gpucluster.io/training/megatron-llm:24.11-py3", extra],
                      "image-prepull-h200-b": [extra]}
    assert "must be pinned" in config_error(
        lambda raw: raw["training"].update(prepullImages=["registry.gpucluster.io/training/research"]))


def test_a_spare_carries_the_label_the_prepull_selects_and_loses_both_when_released() -> None:
    from agents.node_pools.decide import node_patch

    label_key = SPARE["key"]
    n = node("gpu-a-001")
    spare = applied_patch(n, node_patch(n, POOL, ANNOTATION, SPARE))
    assert spare["metadata"]["labels"][label_key] == "true" and SPARE in spare["spec"]["taints"]
    released = applied_patch(spare, node_patch(spare, POOL, ANNOTATION, None))
    assert label_key not in released["metadata"]["labels"] and SPARE not in released["spec"]["taints"]



@given(mean=st.floats(0, 60), coverage=st.floats(0.01, 0.999))
def test_the_sized_spares_are_the_fewest_that_cover_the_share_of_failures_asked(mean: float, coverage: float) -> None:
    import math

    from components.failure_rate import spares_for

    def at_least(k: int) -> float:  # P(N >= k), N ~ Poisson(mean): a failure finds no spare
        return 1.0 - sum(math.exp(-mean) * mean ** i / math.factorial(i) for i in range(k))

    k = spares_for(mean, coverage)
    if mean == 0:  # nothing fails: nothing to cover
        assert k == 0
        return
    assert at_least(k) <= 1 - coverage + 1e-9
    assert k == 0 or at_least(k - 1) > 1 - coverage - 1e-9  # one fewer would not do
    assert spares_for(mean, min(0.999, coverage + 0.1)) >= k and spares_for(mean + 1, coverage) >= k


def test_the_sizing_follows_the_failure_rate_it_is_given() -> None:
    from components.failure_rate import FAILURES_PER_GPU_SECOND, sized_spares

    assert sized_spares(16_384, 2_048) == 23
    assert sized_spares(16_384, 2_048, failures_per_gpu_second=2 * FAILURES_PER_GPU_SECOND) > 23
    assert sized_spares(16_384, 2_048, failures_per_gpu_second=0.0) == 0


@given(mean=st.floats(0, 60), spares=st.integers(0, 200), coverage=st.floats(0.01, 0.999))
def test_the_share_that_finds_a_spare_grows_with_the_spares_and_meets_the_sized_coverage(
        mean: float, spares: int, coverage: float) -> None:
    from components.failure_rate import spare_found_share, spares_for

    share = spare_found_share(mean, spares)
    assert 0.0 <= share <= 1.0 + 1e-12 and spare_found_share(mean, spares + 1) >= share - 1e-12
    assert spare_found_share(mean, spares_for(mean, coverage)) >= coverage - 1e-9  # the goodput model's share


def test_sizing_holds_back_at_most_one_node_in_sixteen_and_refuses_a_bad_coverage() -> None:
    from components.config.pools import GpuPool

    sized = {n: GpuPool(name="p", nodes=[f"g-[1-{n}]"]).spares for n in (4, 15, 16, 128, 2048)}
    assert sized == {4: 0, 15: 0, 16: 1, 128: 4, 2048: 23}
    assert GpuPool(name="p", nodes=["g-[1-128]"], spare_coverage=0.5).spares == 2
    message = config_error(lambda raw: raw["pools"][0].update(spareCoverage=1))
    assert "pools[0].spareCoverage" in message



def test_a_declared_job_must_fit_beside_its_pools_spares() -> None:
    message = config_error(lambda raw: raw["training"]["jobs"][0].update(workers=125))
    assert ("training.jobs[0].workers: pool 'h100-a' has only 128 nodes, 4 of them warm spares training never uses "
            "(got 125)") in message
