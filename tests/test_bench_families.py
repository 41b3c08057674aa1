"""bench_families' table on a small cluster and a short run: every policy, the warm-pool sizes, and the
mechanisms (the return, the forecasts against their own services-alone bound, all together) in the report."""

from __future__ import annotations

from typing import Any

import pytest

from bench import bench_families as bf


@pytest.fixture(scope="module")
def row() -> dict[str, Any]:
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(bf, "GPUS", 256)
        patch.setattr(bf, "WARMUP_DAYS", 0.05)
        return bf.family_row("steep-ramps", 0.0, days=0.1)


def test_the_row_holds_the_return_the_forecasts_and_all_together(row: dict[str, Any]) -> None:
    labels = list(row["mechanisms"])
    assert labels == ["return 0.25", "forecast: trend 180 s", "forecast: trend 180 s + daily season",
                      f"forecast: {bf.COMBINED[0]}"]
    stack_bound = row["policies"]["inference alone"]["inference_availability"]
    for label, m in row["mechanisms"].items():
        assert m["gap_to_stack_bound_points"] == pytest.approx((stack_bound - m["inference_availability"]) * 100,
                                                               abs=1e-4)
        assert m["gap_points"] == pytest.approx((m["bound"] - m["inference_availability"]) * 100, abs=1e-4)
        assert m["met"] == (m["gap_points"] <= bf.TARGET_GAP_POINTS)
        if not label.startswith("forecast"):
            assert m["bound"] == stack_bound  # the return leaves the HPAs, and so the bound, as they are
    assert isinstance(row["naive_taint_flips"], int)


def test_the_report_prints_every_mechanism_beside_the_stacks_settings(row: dict[str, Any]) -> None:
    text = bf.to_markdown(bf.result({"steep-ramps": row}, 0.1))
    table = text[text.index("Make-before-break return and the forecast metric"):]
    assert "| steep-ramps | the stack's settings |" in table
    for label in row["mechanisms"]:
        assert f"| steep-ramps | {label} |" in table


def test_the_steep_ramps_are_also_sampled_every_minute() -> None:
    rows = {row: (family, share, bin_s) for row, family, share, bin_s in bf.cases()}
    assert rows["steep-ramps, 1-min samples"] == ("steep-ramps", 0.0, 60.0)
    assert rows["steep-ramps"][2] == 300.0


def test_the_rows_run_in_processes_as_they_would_one_after_another(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each row is seeded and independent, so the process pool changes nothing but the wall time."""
    monkeypatch.setattr(bf, "GPUS", 256)
    monkeypatch.setattr(bf, "WARMUP_DAYS", 0.02)
    two = [("steep-ramps", "steep-ramps", 0.0, 300.0), ("decays", "decays", 0.0, 300.0)]
    monkeypatch.setattr(bf, "cases", lambda: two)
    serial, pooled = bf.run(days=0.03, workers=1), bf.run(days=0.03, workers=2)
    assert list(pooled["families"]) == ["steep-ramps", "decays"]
    assert pooled == serial


def test_the_row_measures_what_stops_the_target_beside_the_controller(row: dict[str, Any]) -> None:
    """Each changed environment, and all of them together, against the same services-alone bound."""
    labels = [label for label, _ in bf.BOUNDS]
    assert list(row["bounds"]) == [*labels, " + ".join(labels)]
    stack_bound = row["policies"]["inference alone"]["inference_availability"]
    for b in row["bounds"].values():
        assert b["gap_points"] == pytest.approx((stack_bound - b["inference_availability"]) * 100, abs=1e-4)
        assert b["met"] == (b["gap_points"] <= bf.TARGET_GAP_POINTS)
    text = bf.to_markdown(bf.result({"steep-ramps": row}, 0.1))
    table = text[text.index("What stops the target"):]
    for label in ["as modelled", *row["bounds"]]:
        assert f"| steep-ramps | {label} |" in table


def test_the_cost_target_is_against_the_oracle_at_the_same_headroom(row: dict[str, Any]) -> None:
    """The plain oracle asks for demand exactly; the fair one asks what the HPAs ask (more replicas, no fewer GPU·h)."""
    fair = row["oracle_at_headroom_external_gpu_hours"]
    assert fair >= row["policies"]["oracle"]["external_gpu_hours"]
    ext = row["policies"]["controller"]["external_gpu_hours"]
    assert row["external_vs_oracle_at_headroom"] == (pytest.approx(ext / fair, abs=1e-3) if fair else None)


def test_the_bounds_change_the_environment_they_name() -> None:
    from bench.sim.run import load_stack

    model = load_stack("prod").model
    fast, doubled = (change(model) for _, change in bf.BOUNDS)
    assert fast.latencies.external_start_s == model.latencies.onprem_start_s
    assert fast.providers == model.providers and doubled.latencies == model.latencies
    assert [p.gpus for p in doubled.providers] == [2 * p.gpus for p in model.providers]
