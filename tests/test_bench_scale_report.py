"""The scale section from a results file: its tables and its plot, without a control plane."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from bench import bench_scale


def _stats(p50: float, p99: float) -> dict[str, float]:
    return {"n": 1, "min": p50, "p50": p50, "p90": p99, "p99": p99}


def _shape(nodes: int, gangs: dict[str, float], storm: dict[str, float] | None) -> dict[str, Any]:
    return {"nodes": nodes, "gpus": nodes * 8, "up_s": 1.0,
            "gangs": {size: {"bound": _stats(s, s * 1.1), "running": _stats(s + 1, s + 2)}
                      for size, s in gangs.items()},
            "storm_taint_s": {} if storm is None else {"150": {"faults": 150, "rails": "open", "tainted": 150,
                                                               "healthy_nodes_tainted": 0, **storm}}}


def test_the_plot_draws_bind_time_against_gang_size_and_the_storm_beside_nvsentinel(tmp_path: Path) -> None:
    results = tmp_path / "results.json"
    llama3 = _shape(2060, {"256": 36.0, "2048": 252.0}, {"min": 4.1, "p50": 8.2, "p90": 9.0, "p99": 9.7})
    llama3["gangs"]["256"].update(leaves_spanned={"n": 1, "min": 9, "p50": 9, "p90": 9, "p99": 9, "max": 9},
                                  fewest_leaves=8)
    llama3["switch_fault"] = {"leaf": "gpu-a-leaf-01", "nodes": 32, "fenced": 32, "fenced_naming_the_leaf": 32,
                              "quarantined": 0, "fenced_outside_the_leaf": 0, "breaker_tripped": 0.0,
                              "min": 61.0, "p50": 63.5, "p90": 66.0, "p99": 66.0, "max": 66.2}
    llama3["switch_fault_after"] = {**llama3["switch_fault"], "conditions": 32, "to_condition_s": {"p50": 64.0},
                                    "released": 32, "release_after_repair_s": 41.5, "probation_s": 20}
    llama3["conditions"] = "beside a two-hour chaos soak"
    after = {**llama3, "switch_fault": llama3.pop("switch_fault_after")}
    results.write_text(json.dumps({"shapes": {"llama3": llama3, "after": after}}))
    result = bench_scale.run(results)
    assert result["plot"] == str(tmp_path / "scale.png") and (tmp_path / "scale.png").stat().st_size > 10_000
    text = bench_scale.to_markdown(result)
    assert "| llama3 | 2,060 | 16,480 | 1.0 | 2,048 | 1 |" in text and text.count("| – |\n") >= 1  # 2,048: none
    assert "| 9 (8) |" in text  # the 256-pod gang spanned 9 leaves where 8 would do
    assert "Measured beside a two-hour chaos soak: its timings are upper bounds of upper bounds." in text
    assert "| llama3 | gpu-a-leaf-01 | 32 | 32 | – | 0 | 0 | held | 63.5 | 66.0 | 66.2 | – | – |" in text
    assert "| after | gpu-a-leaf-01 | 32 | 32 | 32 | 0 | 0 | held | 63.5 | 66.0 | 66.2 | 64.0 | 32 in 41.5 s (20 s) |" \
        in text
    got = result["shapes"]["after"]
    assert got["leaves_spanned"] == {"256": {"p50": 9.0, "max": 9.0, "minimum": 8.0}}  # the 2,048 gang: none read
    assert got["switch_fault_to_condition_s"] == {"p50": 64.0} and "switch_fault_nodes_drained" not in got
    assert f"![Gang bind time against gang size; fault-storm latency beside NVSentinel's]({tmp_path / 'scale.png'})" \
        in text


def test_nothing_to_draw_draws_nothing(tmp_path: Path) -> None:
    results = tmp_path / "results.json"
    results.write_text(json.dumps({"shapes": {"empty": _shape(10, {}, None)}}))
    result = bench_scale.run(results)
    assert "plot" not in result and not (tmp_path / "scale.png").exists()
    assert "![" not in bench_scale.to_markdown(result)
    assert bench_scale.run(tmp_path / "absent.json") == {"status": "not run here: run `make bench-scale` first"}


def test_every_goal_is_measured_against_its_target_and_a_missed_one_names_what_holds_it(tmp_path: Path) -> None:
    results = tmp_path / "results.json"
    llama3 = _shape(2060, {"256": 20.0, "2048": 200.0}, {"min": 1.0, "p50": 1.5, "p90": 6.0, "p99": 7.0})
    llama3.update(gang_bind_s={k: v["bound"] for k, v in llama3["gangs"].items()}, storm_guard_poll_s=2,
                  apiserver_mutating_p99_s=0.4, pulumi_up_s=400.0,
                  apiserver_mutating_p99_by_call={"POST pods/binding": {"p99_s": 0.9, "calls": 2048}},
                  process_usage_at_rest={"health-guard": {"rss_mib": 90.0, "cpu_s": 1}},
                  process_usage_after={"health-guard": {"rss_mib": 80.0, "cpu_s": 2}, "kwok": {"rss_mib": 150.0}},
                  storms_process_usage_after={"health-guard": {"rss_mib": "n/a"}})
    # Not one of NVSentinel's sizes: no goal.
    llama3["storm_taint_s"]["25"] = {**llama3["storm_taint_s"]["150"], "faults": 25, "tainted": 25, "p50": 9.0,
                                     "p90": 9.0}
    results.write_text(json.dumps({"shapes": {"llama3": llama3}}))
    shape = bench_scale.run(results)["shapes"]["llama3"]
    by_goal = {g["goal"]: g for g in shape["goals"]}
    assert set(by_goal) == {"2,048-pod gang bound, p99", "150 faults tainted, p50 (guard poll 2 s)",
                            "150 faults tainted, p90 (guard poll 2 s)", "mutating API calls p99 over the gang runs",
                            "first `pulumi up`"}
    bind = by_goal["2,048-pod gang bound, p99"]
    assert bind["met"] is False and bind["measured_s"] == 220.0 and bind["bounded_by"].startswith("vc-scheduler")
    assert by_goal["150 faults tainted, p50 (guard poll 2 s)"] == {
        "goal": "150 faults tainted, p50 (guard poll 2 s)", "target_s": 2.0, "measured_s": 1.5, "met": True,
        "bounded_by": None}
    assert by_goal["150 faults tainted, p90 (guard poll 2 s)"]["met"] is False
    assert by_goal["first `pulumi up`"]["bounded_by"] == "the Pulumi engine"
    # The largest resident set of each process over every reading; a reading that is not a number is skipped.
    assert shape["agent_rss_mib"] == {"kwok": 150.0, "health-guard": 90.0}
    assert shape["limited_by"] is None
    text = bench_scale.to_markdown(bench_scale.run(results))
    assert "| llama3 | 2,048-pod gang bound, p99 | 30 | 220.0 | **no** | vc-scheduler:" in text
    assert "| llama3 | 150 faults tainted, p50 (guard poll 2 s) | 2 | 1.5 | yes |  |" in text
    assert "`POST pods/binding` 0.9 s (2,048 calls)" in text


FIGURE = st.one_of(st.none(), st.booleans(), st.text(max_size=3), st.integers(-5, 10**6),
                   st.floats(allow_nan=True, allow_infinity=True), st.lists(st.integers(), max_size=2))
STATS = st.one_of(FIGURE, st.dictionaries(st.sampled_from(["p50", "p90", "p99", "rss_mib", "n", "fewest_leaves"]),
                                          FIGURE, max_size=4),
                  st.fixed_dictionaries({"leaves_spanned": st.dictionaries(st.sampled_from(["p50", "max"]), FIGURE)}))
SIZED = st.one_of(FIGURE, st.dictionaries(
    st.sampled_from(["150", "375", "2048", "256", "x", "-1", "²", "0150", "064"]), STATS, max_size=4))
SHAPES = st.dictionaries(
    st.sampled_from(["gang_bind_s", "storm_taint_s", "storm_taint_fast_poll_s", "gang_evict_s",
                     "apiserver_mutating_p99_s", "storm_apiserver_mutating_p99_s", "pulumi_up_s",
                     "pulumi_preview_nochange_s", "storm_guard_poll_s", "process_usage_after",
                     "storms_process_usage_at_rest", "gangs", "switch_fault"]),
    SIZED, max_size=8)


@given(SHAPES)
def test_a_results_file_of_any_shape_gives_goals_and_footprints_never_an_error(shape: dict[str, Any]) -> None:
    """The results file is read, not trusted (hand edits, a run cut short): anything not a figure reads as not
    measured, and what is measured is judged against its target."""
    for goal in bench_scale.goals(shape):
        measured = goal["measured_s"]
        assert measured is None or (math.isfinite(measured) and measured >= 0)
        assert goal["met"] == (None if measured is None else measured <= goal["target_s"])
        assert (goal["bounded_by"] is not None) == (goal["met"] is False)
    for rss in bench_scale.agent_rss(shape).values():
        assert math.isfinite(rss) and rss >= 0
    figures = bench_scale.topology_figures(shape)
    assert set(figures) <= {"leaves_spanned", "switch_fault_to_condition_s", "switch_fault_nodes_drained"}
    for spans in figures.get("leaves_spanned", {}).values():
        assert spans["p50"] is not None and all(v is None or math.isfinite(v) for v in spans.values())


def test_the_burst_run_sits_beside_the_simulators_prediction_phase_by_phase() -> None:
    burst = {"phases": {"time_to_ungate_s": 60.2, "time_to_open_s": 71.0, "time_to_return_s": 300.5},
             "simulated": {"time_to_ungate_s": 60.0, "time_to_open_s": 70.0},
             "plan": {"inference_gpus": 128, "background_pods": 22, "gang_pods": 32, "pool": "h100-a",
                      "displaced_gpus": 48, "external_gpus": 96},
             "timings": "quick", "descheduler_evictions_per_cycle": [2, 16, 5], "descheduler_limit": 16}
    text = bench_scale.to_markdown({"shapes": {"small": {"burst": burst}}, "anchors": bench_scale.ANCHORS})
    assert "| phase | small real s | small simulated s |" in text
    assert "| the gang's gate lifted | 60.2 | 60 |" in text
    assert "| every replica home, from the gang's end | 300.5 | never |" in text
    assert "| the whole gang Running | never | never |" in text
    assert "descheduler evictions per cycle 16 at most over 3 cycles (limit 16)" in text
    assert "cleared the gang's room" not in text  # the clearing was off
    burst.update(clear_after_s=30.0, burst_controller_evictions={"201": 120, "429": 40})
    text = bench_scale.to_markdown({"shapes": {"small": {"burst": burst}}, "anchors": bench_scale.ANCHORS})
    assert ("The handover cleared the gang's room after 30 s (reserving its nodes first); its evictions by answer "
            "{'201': 120, '429': 40}.") in text


@given(st.dictionaries(st.sampled_from(["phases", "simulated", "plan", "descheduler_evictions_per_cycle",
                                        "fewest_ready", "clear_after_s", "burst_controller_evictions"]),
                       st.one_of(FIGURE, st.dictionaries(
                           st.sampled_from(["time_to_open_s", "pool", "x"]), FIGURE, max_size=3)), max_size=5))
def test_a_burst_entry_of_any_shape_renders_never_an_error(burst: dict[str, Any]) -> None:
    text = bench_scale.to_markdown({"shapes": {"s": {"burst": burst}}, "anchors": bench_scale.ANCHORS})
    assert ("**Burst at scale**" in text) == bool(burst)  # an entry with anything in it gets its table
