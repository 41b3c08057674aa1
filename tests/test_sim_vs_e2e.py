"""Simulator vs real: the local stack's burst scenario in the simulator, phase by phase, against the e2e's."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

import pytest

from bench import bench_sim_vs_e2e as vs
from bench.sim.run import load_stack


@pytest.fixture(scope="module")
def trace() -> vs.Trace:
    return vs.simulate_scenario()


def test_every_e2e_phase_is_reached_in_the_e2e_order(trace: vs.Trace) -> None:
    gang = list(vs.PHASES)[:6]
    assert [k for k in trace.phases if k != vs.UNGATE] == list(vs.PHASES)
    # The gate is lifted once the standby is ready (make before break), before the gang runs.
    assert trace.phases["time_to_standby_ready_s"] <= trace.phases[vs.UNGATE] <= trace.phases["time_to_gang_running_s"]
    assert all(trace.phases[a] <= trace.phases[b] for a, b in itertools.pairwise(gang))
    assert trace.phases["time_to_close_s"] <= trace.phases["time_to_return_s"]


def test_decisions_make_before_break(trace: vs.Trace) -> None:
    minimum = load_stack("local").model.services[0].min_replicas
    lines = [line for _, line in trace.decisions]
    assert lines[0] == f"standby -> {minimum}"  # the standby first, for every replica the gang reclaims
    assert lines.index("ungate the gang") > 0
    opened = next(i for i, line in enumerate(lines) if line.startswith("open:"))
    closed = next(i for i, line in enumerate(lines) if line.startswith("close:"))
    assert opened < closed
    assert lines[-1] == "standby -> 0"


def test_close_and_return_follow_the_stack_settings(trace: vs.Trace) -> None:
    setup = load_stack("local")
    s, d = setup.settings, setup.model.descheduler
    assert trace.phases["time_to_close_s"] >= s.close_hold_seconds
    # The descheduler moves at most maxPodsPerNode replicas per cycle from the one virtual node, each at least
    # minPodAge old: the last one leaves no sooner than the cycles that takes.
    assert d.max_per_node is not None
    cycles = math.ceil(setup.model.services[0].min_replicas / d.max_per_node)
    interval = vs.local_descheduler_interval_s()
    assert trace.phases["time_to_return_s"] >= trace.phases["time_to_close_s"] + (cycles - 1) * interval


def test_real_phases_prefer_the_last_run_then_the_report(tmp_path: Path) -> None:
    run = tmp_path / "e2e-phases.json"
    report = tmp_path / "report.json"
    report.write_text(json.dumps({"benchmarks": {"bench_e2e": {"result": {
        "measured_at": "2026-01-01T00:00:00+00:00", "time_to_open_s": 9.5, "vk_restart_open_s": 3.0}}}}))
    phases, source = vs.real_phases(run, report)
    assert phases == {"time_to_open_s": 9.5} and source.startswith("bench/report.json")
    run.write_text(json.dumps({"time_to_open_s": 7.25, "time_to_close_s": 20.0}))
    phases, source = vs.real_phases(run, report)
    assert phases == {"time_to_open_s": 7.25, "time_to_close_s": 20.0} and source.startswith("make e2e at ")
    report.unlink()
    run.unlink()
    assert vs.real_phases(run, report) == ({}, "no e2e run recorded")


def test_markdown_shows_both_sides_and_marks_a_missing_one() -> None:
    result = {"stack": "local", "e2e_source": "test", "simulated_decisions": ["+0.0 s standby -> 4"],
              "phases": [{"phase": k, "meaning": m, "simulated_s": 1.0, "e2e_s": None, "difference_s": None,
                          "why": vs.WHY[k]} for k, m in vs.PHASES.items()]}
    text = vs.to_markdown(result)
    assert "| the burst taint off every virtual node | 1 | – | – |" in text
    assert "+0.0 s standby -> 4" in text
