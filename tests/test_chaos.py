"""The chaos soak's pure parts: the seeded draw of faults and the duration flag."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tools.chaos.__main__ import seconds
from tools.chaos.schedule import (
    AGENT_FAULTS,
    GPU_FAULTS,
    NETWORK_FAULTS,
    PROCESS_OF,
    TRAINING_FAULTS,
    Fault,
    schedule,
)

AGENTS, PROVIDERS, KUBELETS = ("burst-controller", "health-guard"), ("vk-a",), ("sys-0", "gpu-01")
MONITORING = ("prometheus", "prometheus-operator")
NETWORK = ("apiproxy",)
RANKS = ("0", "1")
GPUS = ("real-gpu-01", "real-gpu-02")


@given(st.integers(0, 2**32), st.floats(1.0, 7200.0), st.floats(1.0, 600.0))
def test_one_fault_per_period_with_a_target_of_its_kind_and_the_same_draw_for_the_same_seed(
        seed: int, duration: float, every: float) -> None:
    plan = schedule(seed, duration, every, AGENTS, PROVIDERS, KUBELETS, monitoring=MONITORING, network=NETWORK,
                    ranks=RANKS, gpus=GPUS)
    assert [i.at for i in plan] == [every * (n + 1) for n in range(len(plan))]
    assert all(i.at < duration for i in plan) and (not plan or plan[-1].at + every >= duration)
    for i in plan:
        if i.fault in AGENT_FAULTS:
            assert i.target in AGENTS
        elif i.fault is Fault.PROVIDER_KILLED:
            assert i.target in PROVIDERS
        elif i.fault is Fault.KUBELET_RESTARTED:
            assert i.target in KUBELETS
        elif i.fault is Fault.PROMETHEUS_KILLED:
            assert i.target in MONITORING
        elif i.fault in NETWORK_FAULTS:
            assert i.target in NETWORK
        elif i.fault in TRAINING_FAULTS:
            assert i.target in RANKS
        elif i.fault in GPU_FAULTS:
            assert i.target in GPUS
        else:
            assert i.target == PROCESS_OF[i.fault]
    assert plan == schedule(seed, duration, every, AGENTS, PROVIDERS, KUBELETS, monitoring=MONITORING,
                            network=NETWORK, ranks=RANKS, gpus=GPUS)


@given(st.integers(0, 2**32))
def test_every_second_gpu_fault_is_fatal_and_the_rest_of_a_seeds_plan_is_what_it_was_without_it(seed: int) -> None:
    """The fatal GPU fault is the degraded one's alternate, not a kind of its own in the draw: a seed that found a
    defect before it existed replays the same faults on the same targets at the same times."""
    kw = {"monitoring": MONITORING, "network": NETWORK, "ranks": RANKS, "gpus": GPUS}
    plan = schedule(seed, 7200, 30, AGENTS, PROVIDERS, KUBELETS, **kw)
    before = schedule(seed, 7200, 30, AGENTS, PROVIDERS, KUBELETS, kinds=[f for f in Fault if f is not Fault.GPU_FATAL],
                      **kw)
    assert [(i.at, i.target, Fault.GPU_DEGRADED if i.fault is Fault.GPU_FATAL else i.fault) for i in plan] == [
        (i.at, i.target, i.fault) for i in before]
    gpu = [i.fault for i in plan if i.fault in GPU_FAULTS]
    assert gpu == [Fault.GPU_DEGRADED, Fault.GPU_FATAL] * (len(gpu) // 2) + [Fault.GPU_DEGRADED] * (len(gpu) % 2)
    # Asked for alone, it is drawn as itself.
    alone = schedule(seed, 600, 30, (), (), (), kinds=[Fault.GPU_FATAL], gpus=GPUS)
    assert alone and {i.fault for i in alone} == {Fault.GPU_FATAL}


def test_a_kind_without_a_target_is_never_drawn_and_none_at_all_is_an_error() -> None:
    plan = schedule(1, 3600, 10, (), (), ())
    assert plan and all(i.fault in PROCESS_OF for i in plan)
    with pytest.raises(ValueError, match="no fault kind has a target"):
        schedule(1, 60, 10, (), (), (), kinds=AGENT_FAULTS)
    with pytest.raises(ValueError, match="every_s must be positive"):
        schedule(1, 60, 0, AGENTS, PROVIDERS, KUBELETS)


def test_every_kind_is_drawn_over_a_long_soak() -> None:
    plan = schedule(7, 7200, 30, AGENTS, PROVIDERS, KUBELETS, monitoring=MONITORING, network=NETWORK,
                    ranks=RANKS, gpus=GPUS)
    assert {i.fault for i in plan} == set(Fault)
    assert {i.target for i in plan if i.fault in GPU_FAULTS} == set(GPUS)
    assert {i.target for i in plan if i.fault is Fault.PROMETHEUS_KILLED} == set(MONITORING)
    assert {i.target for i in plan if i.fault is Fault.KUBE_ROUTER_KILLED} == {"kube-router"}
    # Without a monitoring install there is no Prometheus to kill: never drawn.
    assert Fault.PROMETHEUS_KILLED not in {i.fault for i in schedule(7, 7200, 30, AGENTS, PROVIDERS, KUBELETS)}
    # Without the proxy in front of the API server (a cluster without real nodes) no network fault is drawn.
    assert not set(NETWORK_FAULTS) & {i.fault for i in schedule(7, 7200, 30, AGENTS, PROVIDERS, KUBELETS)}


@pytest.mark.parametrize(("text", "value"), [("90", 90.0), ("150s", 150.0), ("10m", 600.0), ("2h", 7200.0),
                                             (" 1.5h ", 5400.0)])
def test_durations(text: str, value: float) -> None:
    assert seconds(text) == value


@given(st.text(max_size=12))
def test_a_duration_is_a_number_with_a_unit_or_a_clear_error(text: str) -> None:
    try:
        value = seconds(text)
    except argparse.ArgumentTypeError as err:
        assert str(err) == f"not a duration: {text!r} (use e.g. 150s, 10m, 2h)"
    else:
        assert value > 0


def test_bench_chaos_reports_the_last_soak_or_says_none_ran(tmp_path: Path) -> None:
    from bench import bench_chaos

    none = tmp_path / "none.json"
    assert bench_chaos.run(none, none)["status"] == "not run here: run `make chaos DURATION=2h` first"
    # No soak on this machine: the committed report's soak, as it was reported (a committed "not run" is not one).
    last = {"name": "chaos soak (last `make chaos`)", "measured_at": "2026-12-07T16:00:00+00:00", "seed": 50}
    (tmp_path / "committed.json").write_text(json.dumps({"benchmarks": {"bench_chaos": {"result": last}}}))
    assert bench_chaos.run(none, tmp_path / "committed.json") == last
    (tmp_path / "committed.json").write_text(json.dumps(
        {"benchmarks": {"bench_chaos": {"result": {"name": "chaos soak", "status": "not run here"}}}}))
    assert bench_chaos.run(none, tmp_path / "committed.json")["status"].startswith("not run here: run `make chaos")
    report = {"duration_s": 7200.0, "seed": 1, "every_s": 30.0, "faults_by_kind": {"etcd-killed": 20},
              "worst_recovery_s_by_kind": {"etcd-killed": 41.0}, "violations": {"not-whole-within-bound": 0},
              "inference_availability": 0.999, "violation_details": []}
    (tmp_path / "r.json").write_text(json.dumps(report))
    got = bench_chaos.run(tmp_path / "r.json")
    assert got["faults_by_kind"] == {"etcd-killed": 20} and got["violations"] == {"not-whole-within-bound": 0}
    assert got["training_steps_lost"].startswith("not measured") and "violation_details" not in got
    # A soak with its gang reports what the gang lost, a zero included.
    (tmp_path / "g.json").write_text(json.dumps({**report, "training_steps_lost": 0, "checkpoints_lost": 0,
                                                 "training_restarts_by_fault": {"trainer-killed": 3}}))
    got = bench_chaos.run(tmp_path / "g.json")
    assert got["training_steps_lost"] == 0 and got["checkpoints_lost"] == 0
    assert got["training_restarts_by_fault"] == {"trainer-killed": 3}
    # A short soak since (a fix checked in minutes) does not replace the committed long run; it is named beside it.
    long_run = {**last, "duration_s": 7200.0}
    (tmp_path / "committed.json").write_text(json.dumps({"benchmarks": {"bench_chaos": {"result": long_run}}}))
    (tmp_path / "short.json").write_text(json.dumps({**report, "duration_s": 311.7, "seed": 196}))
    kept = bench_chaos.run(tmp_path / "short.json", tmp_path / "committed.json")
    assert {k: v for k, v in kept.items() if k != "shorter_soak_since"} == long_run
    assert kept["shorter_soak_since"].startswith("seed 196, 311.7 s, ")
    # A long one replaces it.
    assert bench_chaos.run(tmp_path / "g.json", tmp_path / "committed.json")["seed"] == 1


def test_the_soak_stops_when_faults_in_a_row_leave_the_cluster_not_whole() -> None:
    from tools.chaos.soak import STOP_AFTER_NOT_WHOLE, not_coming_back

    assert STOP_AFTER_NOT_WHOLE == 3
    assert not not_coming_back([])
    assert not not_coming_back([None, None])  # two: it may yet come back
    assert not not_coming_back([None, None, 4.2, None, None])
    assert not_coming_back([1.0, None, None, None])
    assert not_coming_back([None], in_a_row=1)


def test_the_agents_logs_are_kept_beside_the_report_previous_instances_included(tmp_path: Path) -> None:
    from types import SimpleNamespace

    from kubernetes.client import ApiException

    from tools.chaos.__main__ import keep_logs

    def pod(name: str, *containers: str) -> Any:
        return SimpleNamespace(metadata=SimpleNamespace(name=name),
                               spec=SimpleNamespace(containers=[SimpleNamespace(name=c) for c in containers]))

    class Core:
        def list_namespaced_pod(self, namespace: str) -> Any:
            assert namespace == "gpu-system"
            return SimpleNamespace(items=[pod("guard-0", "guard"), pod("burst-0", "burst", "proxy")])

        def read_namespaced_pod_log(self, name: str, namespace: str, container: str, previous: bool) -> str:
            if previous and name != "guard-0":  # only the guard restarted
                raise ApiException(status=400, reason="previous terminated container not found")
            return f"{name}/{container}{' before' if previous else ''}\n"

    kept = keep_logs(Core(), "gpu-system", tmp_path / "logs")
    assert sorted(p.name for p in kept) == ["burst-0.burst.log", "burst-0.proxy.log", "guard-0.guard.log",
                                            "guard-0.guard.previous.log"]
    assert (tmp_path / "logs" / "guard-0.guard.previous.log").read_text() == "guard-0/guard before\n"
