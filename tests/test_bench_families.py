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
        return bf.family_row("steep-ramps", days=0.1)


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


def test_the_table_carries_each_policys_mean_gang_wait_and_a_report_without_it_still_renders(
        row: dict[str, Any]) -> None:
    """What the training side pays for a policy sits beside what inference gets (the gate's early release traded
    availability for gang wait: issue 47's note)."""
    wait = row["policies"]["controller"]["gang_wait_hours_mean"]
    assert isinstance(wait, float) and wait >= 0
    text = bf.to_markdown(bf.result({"steep-ramps": row}, 0.1))
    assert "| flips | gang wait h |" in text
    assert "| steep-ramps | controller | " in text and f" | {wait:.3f} |" in text
    assert "| steep-ramps | inference alone |" in text
    older = {**row, "policies": {name: {k: v for k, v in f.items() if k != "gang_wait_hours_mean"}
                                 for name, f in row["policies"].items()}}
    assert "| steep-ramps | controller |" in bf.to_markdown(bf.result({"steep-ramps": older}, 0.1))


def test_the_steep_ramps_are_also_sampled_every_minute_and_both_traces_are_rows() -> None:
    from bench.sim.families import case

    assert case("steep-ramps, 1-min samples")[:3] == ("steep-ramps", 0.0, 60.0)
    assert case("steep-ramps").bin_s == 300.0
    traces = {name: case(name).trace for name in bf.cases() if case(name).trace is not None}
    assert {name: path.name for name, path in traces.items() if path} == {
        "GenTD26 trace": "gentd26-sd-requests.csv.gz", "Alibaba 2023 trace": "alibaba-gpu-2023-pods.csv.gz"}
    assert all(path.is_file() for path in traces.values() if path)


def test_the_rows_run_in_processes_as_they_would_one_after_another(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each row is seeded and independent, so the process pool changes nothing but the wall time."""
    monkeypatch.setattr(bf, "GPUS", 256)
    monkeypatch.setattr(bf, "WARMUP_DAYS", 0.02)
    monkeypatch.setattr(bf, "cases", lambda: ["steep-ramps", "decays"])
    serial, pooled = bf.run(days=0.03, workers=1), bf.run(days=0.03, workers=2)
    assert list(pooled["families"]) == ["steep-ramps", "decays"]
    assert pooled == serial


def test_the_row_measures_what_stops_the_target_beside_the_controller(row: dict[str, Any]) -> None:
    """Each changed environment, and all of them together, against the same services-alone bound."""
    labels = [label for label, _ in bf.BOUNDS]
    both = bf.ALL_BOUNDS
    assert both == " + ".join(labels)
    assert list(row["bounds"]) == [*labels, both, f"{both}, return {bf.BOUND_RETURN_SHARE:g}",
                                   bf.PERFECT_FORECAST, bf.PERFECT_FORECAST_AND_GPUS, bf.DEPLOYABLE]
    stack_bound = row["policies"]["inference alone"]["inference_availability"]
    for label, b in row["bounds"].items():
        # A perfect forecast serves the services alone too: those rows are against the services alone with it.
        assert (b["bound"] == stack_bound) == (not label.startswith(bf.PERFECT_FORECAST))
        assert b["bound"] >= stack_bound
        assert b["gap_points"] == pytest.approx((b["bound"] - b["inference_availability"]) * 100, abs=1e-4)
        assert b["gap_to_stack_bound_points"] == pytest.approx(
            (stack_bound - b["inference_availability"]) * 100, abs=1e-4)
        assert b["met"] == (b["gap_points"] <= bf.TARGET_GAP_POINTS)
        assert b["targets"]["availability"] == b["met"]
    assert row["stopped_by"] == bf.stopped_by(row["bounds"], row["met"])
    needed = row["provider_gpus_needed"]
    assert needed is None or needed in (1.0, *bf.PROVIDER_LADDER)
    assert (needed == 1.0) == row["bounds"][bf.PERFECT_FORECAST]["met"]
    if row["bounds"][bf.PERFECT_FORECAST_AND_GPUS]["met"]:
        assert needed is not None
    text = bf.to_markdown(bf.result({"steep-ramps": row}, 0.1))
    table = text[text.index("What stops the target"):]
    for label in ["as modelled", *row["bounds"]]:
        assert f"| steep-ramps | {label} |" in table
    stops = text[text.index("What stops each family's availability target"):]
    perfect = row["bounds"][bf.PERFECT_FORECAST]["gap_points"]
    assert f"| steep-ramps | {row['gap_points']:.3f} | {perfect:.3f} |" in stops
    assert f"| {row['stopped_by']} | {bf.needed(row['provider_gpus_needed'])} | " in stops
    assert f"{row['bounds'][bf.DEPLOYABLE]['gap_points']:.3f}, " in stops
    assert row["warm_pool_needed"] == bf.warm_pool_needed(row["warm"])
    assert f" | {bf.warm_needed(row, row['oracle_at_headroom_external_gpu_hours'])} | " in stops
    four = text[text.index("The four targets"):text.index("What stops the target")]
    for label in ["the stack's settings, as modelled", both, f"{both}, return {bf.BOUND_RETURN_SHARE:g}"]:
        assert f"| steep-ramps | {label} |" in four


def verdicts(**met: bool) -> dict[str, Any]:
    keys = (bf.PERFECT_FORECAST, bf.PERFECT_FORECAST_AND_GPUS, bf.ALL_BOUNDS)
    return {k: {"met": met.get(name, False)} for k, name in zip(keys, ("forecast", "gpus", "both"), strict=True)}


@pytest.mark.parametrize(("met", "bounds", "stopped"), [
    (True, verdicts(), "nothing: met"),
    (False, verdicts(forecast=True, gpus=True, both=True), "what the forecast knows"),
    (False, verdicts(gpus=True, both=True), "the provider GPUs"),
    (False, verdicts(both=True), "external start time and provider GPUs"),
    (False, verdicts(), "the controller: no bound meets it"),
])
def test_what_stops_a_family_is_the_first_bound_that_meets_the_target(met: bool, bounds: dict[str, Any],
                                                                      stopped: str) -> None:
    assert bf.stopped_by(bounds, met) == stopped


def warm_rows(**met: bool) -> dict[str, Any]:
    return {bf.warm_label(share, ramp): {"met": met.get(f"{share:g}/{ramp:g}", False), "external_gpu_hours": 3000.0}
            for share, ramp in bf.WARM_SIZES}


@pytest.mark.parametrize(("warm", "needed", "cell"), [
    (warm_rows(), None, "none up to share 1"),
    # The smallest share that meets it, whatever order the sizes are run in.
    (warm_rows(**{"1/0": True, "0.5/0": True}), "share 0.5", "share 0.5, 3.00×"),
    (warm_rows(**{"1/0": True, "0.25/0": True}), "share 0.25", "share 0.25, 3.00×"),
    # A pool with a forecast ramp is a different mechanism: it never counts as the pool alone.
    (warm_rows(**{"0.1/300": True, "0/300": True}), None, "none up to share 1"),
    # A report from before the larger sizes claims only the pools it ran; one without pools claims nothing.
    ({k: v for k, v in warm_rows().items() if k in ("share 0.1", "share 0.25")}, None, "none up to share 0.25"),
    ({}, None, "–"),
])
def test_the_smallest_warm_pool_that_meets_the_target(warm: dict[str, Any], needed: str | None, cell: str) -> None:
    assert bf.warm_pool_needed(warm) == needed
    row = {"met": False, "warm": warm, "warm_pool_needed": needed}
    assert bf.warm_needed(row, 1000.0) == cell
    assert bf.warm_needed({**row, "met": True}, 1000.0) == "none needed"


ALONE_WORST_HIGH, ALONE_WORST_LOW = 0.97, 0.90
FIGS = {"worst_window_availability": 0.96, "external_gpu_hours": 1200.0, "taint_flips": 10}


@pytest.mark.parametrize(("change", "gap", "alone_worst", "missed"), [
    ({}, 0.01, ALONE_WORST_HIGH, "none"),
    ({}, 0.021, ALONE_WORST_HIGH, "availability"),
    # Where the services alone reach 95 %, the controller must too; elsewhere it may stay 1 point below them.
    ({"worst_window_availability": 0.949}, 0.0, ALONE_WORST_HIGH, "worst 5 min"),
    ({"worst_window_availability": 0.89}, 0.0, ALONE_WORST_LOW, "none"),
    ({"worst_window_availability": 0.889}, 0.0, ALONE_WORST_LOW, "worst 5 min"),
    # 1.3 x the oracle's 1,000 GPU·h at the same headroom; half the naive burst's 20 flips.
    ({"external_gpu_hours": 1300.0}, 0.0, ALONE_WORST_HIGH, "none"),
    ({"external_gpu_hours": 1301.0, "taint_flips": 11}, 0.0, ALONE_WORST_HIGH, "external GPU·h, flips"),
])
def test_the_four_targets_judge_each_run(change: dict[str, float], gap: float, alone_worst: float,
                                         missed: str) -> None:
    verdict = bf.targets({**FIGS, **change}, gap, alone_worst=alone_worst, fair_ext=1000.0, naive_flips=20)
    assert list(verdict) == list(bf.TARGETS)
    assert bf.missed(verdict) == missed


def test_a_missing_oracle_figure_fails_the_cost_target() -> None:
    assert bf.targets(FIGS, 0.0, alone_worst=ALONE_WORST_HIGH, fair_ext=0.0, naive_flips=20)["external GPU·h"] is False


def test_every_run_of_the_row_carries_its_verdict(row: dict[str, Any]) -> None:
    assert list(row["targets"]) == list(bf.TARGETS)
    for group in ("bounds", "warm", "mechanisms"):
        for entry in row[group].values():
            assert list(entry["targets"]) == list(bf.TARGETS)
            assert entry["targets"]["availability"] == entry["met"]
    assert row["placement_oracle_external_gpu_hours"] >= 0


def test_the_cost_target_is_against_the_oracle_at_the_same_headroom(row: dict[str, Any]) -> None:
    """The plain oracle asks for demand exactly; the fair one asks what the HPAs ask (more replicas, no fewer GPU·h)."""
    fair = row["oracle_at_headroom_external_gpu_hours"]
    assert fair >= row["policies"]["oracle"]["external_gpu_hours"]
    ext = row["policies"]["controller"]["external_gpu_hours"]
    assert row["external_vs_oracle_at_headroom"] == (pytest.approx(ext / fair, abs=1e-3) if fair else None)


def test_the_provider_ladder_reruns_only_below_the_doubled_row(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fewest provider GPUs: the first step of the ladder that meets the target, runs stopping there."""
    from bench.sim.run import load_stack

    setup = load_stack("prod")
    model = setup.model
    base = sum(p.gpus for p in model.providers)
    bound = 0.9990
    tried: list[int] = []

    class Run:
        def __init__(self, gpus: int) -> None:
            self.gpus = gpus

        def summary(self) -> dict[str, float]:  # meets the target from 1.5× the provider GPUs on
            return {"inference_availability": bound - (0.0 if self.gpus >= 1.5 * base else 0.05) / 100}

    def fake(m: Any, *_: Any) -> Run:
        tried.append(sum(p.gpus for p in m.providers))
        return Run(tried[-1])

    monkeypatch.setattr(bf, "simulate", fake)
    rows: dict[str, Any] = {bf.PERFECT_FORECAST: {"met": False, "bound": bound},
                            bf.PERFECT_FORECAST_AND_GPUS: {"met": True}}
    assert bf.provider_gpus_needed(model, None, setup.settings, 1.0, rows) == 1.5  # type: ignore[arg-type]
    assert tried == [sum(round(k * p.gpus) for p in model.providers) for k in (1.1, 1.25, 1.5)]
    rows[bf.PERFECT_FORECAST_AND_GPUS]["met"] = False
    monkeypatch.setattr(bf, "PROVIDER_LADDER", (1.1, 2.0))
    assert bf.provider_gpus_needed(model, None, setup.settings, 1.0, rows) is None  # type: ignore[arg-type]
    rows[bf.PERFECT_FORECAST]["met"] = True
    tried.clear()
    assert bf.provider_gpus_needed(model, None, setup.settings, 1.0, rows) == 1.0  # type: ignore[arg-type]
    assert tried == []


def test_each_bound_runs_the_policy_and_environment_it_names(monkeypatch: pytest.MonkeyPatch) -> None:
    """The perfect forecast changes the HPAs only; the deployable row is the doubled contract with a warm pool."""
    from bench.sim.engine import Outcome
    from bench.sim.run import load_stack

    setup = load_stack("prod")
    runs: list[str] = []

    def fake(m: Any, w: Any, policy: Any, *_: Any) -> Any:
        runs.append(f"{policy.name}|{policy.foresight_s}|{policy.settings.warm_pool_share}|"
                    f"{policy.settings.return_surge_share}|{sum(p.gpus for p in m.providers)}|"
                    f"{m.latencies.external_start_s}")
        return type("R", (), {"summary": lambda self: Outcome(policy.name, 1, 1.0).summary()})()

    monkeypatch.setattr(bf, "simulate", fake)
    monkeypatch.setattr(bf, "inference_alone", lambda *a, **k: Outcome("alone", 1, 1.0))
    rows = bf.bounds(setup.model, None, setup.settings, 1.0, 1.0)  # type: ignore[arg-type]
    gpus = sum(p.gpus for p in setup.model.providers)
    start, fast = setup.model.latencies.external_start_s, setup.model.latencies.onprem_start_s
    back = bf.BOUND_RETURN_SHARE
    assert runs == [
        f"controller|0.0|0.0|0.0|{gpus}|{fast}",
        f"controller|0.0|0.0|0.0|{2 * gpus}|{start}",
        f"controller|0.0|0.0|0.0|{2 * gpus}|{fast}",
        f"controller|0.0|0.0|{back}|{2 * gpus}|{fast}",
        f"controller with a perfect forecast|{start + 15.0}|0.0|0.0|{gpus}|{start}",
        f"controller with a perfect forecast|{start + 15.0}|0.0|0.0|{2 * gpus}|{start}",
        f"controller|0.0|{bf.DEPLOYABLE_SHARE}|0.0|{2 * gpus}|{start}",
    ]
    assert len(rows) == len(runs)


def test_the_bounds_change_the_environment_they_name() -> None:
    from bench.sim.run import load_stack

    model = load_stack("prod").model
    fast, doubled = (change(model) for _, change in bf.BOUNDS)
    assert fast.latencies.external_start_s == model.latencies.onprem_start_s
    assert fast.providers == model.providers and doubled.latencies == model.latencies
    assert [p.gpus for p in doubled.providers] == [2 * p.gpus for p in model.providers]


def test_the_placement_oracle_keeps_the_real_hpa_and_leaves_no_pod_out_that_fits_home(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The cost bound: the HPA's own lag, headroom and start times, but every external pod home the moment it fits."""
    from bench.sim.demand import DEFAULT_BIN_S, DEFAULT_PEAK_SHARE
    from bench.sim.engine import Simulator
    from bench.sim.families import family_workload
    from bench.sim.policies import placement_oracle
    from bench.sim.run import default_workload, load_stack
    from bench.sim.workload import DAY

    model = load_stack(bf.STACK).model.scaled_to(bf.GPUS)
    workload = family_workload(default_workload(model, 1.0, bf.SEED, 0.2), "steep-ramps", 1.2 * DAY, bf.SEED,
                               DEFAULT_PEAK_SHARE, ramp_gangs=0.0, bin_s=DEFAULT_BIN_S)
    sim = Simulator(model, workload, placement_oracle(model), 1.0 * DAY, 0.2 * DAY)
    assert sim.hpa.headroom == workload.spec.hpa_headroom and not sim.hpa.zero_lag
    assert sim.scheduler.external_lat == model.latencies.external_start_s
    c = sim.cluster
    syncs: list[int] = []
    run = sim.hpa.run

    def checked(t: float) -> None:
        run(t)
        outside = [c.pods[p] for v in c.vn_order for p in c.vn_pods[v]]
        assert not any(c.fits_onprem(p.gpus) for p in outside if not p.standby), t
        syncs.append(len(outside))

    monkeypatch.setattr(sim.hpa, "run", checked)
    sim.run()
    assert syncs and max(syncs) > 0  # the burst was used, and every pod out could not have come home
