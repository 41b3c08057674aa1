"""The demand families the simulator judges every change on: each is the shape it claims, levelled like a
trace, the same for a seed, and the ramp-aligned training keeps every gang but moves its arrival."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bench.sim.demand import ALL, DEFAULT_BIN_S, TraceWorkload
from bench.sim.families import (
    FAMILIES,
    RAMP_GANG_SHARE,
    case,
    case_workload,
    cases,
    family_workload,
    ramp_aligned_gangs,
    shape,
)
from bench.sim.workload import DAY, HOUR, Gang, Workload, WorkloadSpec

HORIZON = 3 * DAY


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(sorted(FAMILIES)), st.integers(0, 10_000))
def test_every_family_is_a_levelled_shape_and_the_same_for_a_seed(family: str, seed: int) -> None:
    demand = shape(family, HORIZON, seed)
    assert len(demand) == int(HORIZON // DEFAULT_BIN_S)
    assert max(demand) == 1.0
    assert min(demand) >= 0.0
    assert shape(family, HORIZON, seed) == demand


def test_seeds_and_families_differ() -> None:
    shapes = {family: shape(family, HORIZON, 1) for family in FAMILIES}
    assert len(set(shapes.values())) == len(FAMILIES)
    assert shape("diurnal", HORIZON, 1) != shape("diurnal", HORIZON, 2)


def _mean(values: tuple[float, ...]) -> float:
    return sum(values) / len(values)


def test_steep_ramps_rise_more_than_half_the_mean_within_five_minutes() -> None:
    demand = shape("steep-ramps", 7 * DAY, 1)
    mean = _mean(demand)
    rises = [demand[i + 1] - demand[i] for i in range(len(demand) - 1)]  # one 5-minute bin apart
    steep = [r for r in rises if r >= 0.5 * mean]
    assert len(steep) >= 7, "about three ramps a day, each within one bin"


def test_flash_crowds_jump_at_least_twofold_and_are_gone_within_half_an_hour() -> None:
    demand = shape("flash-crowds", 7 * DAY, 3)
    jumps = [i for i in range(1, len(demand)) if demand[i] >= 1.9 * demand[i - 1]]
    assert jumps
    half_hour = int(HOUR / 2 / DEFAULT_BIN_S)
    for i in jumps:
        assert min(demand[i:i + half_hour + 2]) < demand[i] / 1.5


def test_the_smooth_loop_repeats_without_a_step_and_the_seam_loop_steps() -> None:
    period = int(12 * HOUR / DEFAULT_BIN_S)
    smooth = shape("loop-smooth", 2 * DAY, 5)
    assert smooth[:period] == smooth[period:2 * period]
    seam = shape("loop-seam", 2 * DAY, 5)
    piece = int(6 * HOUR / DEFAULT_BIN_S)
    # The drift falls back at every seam: the biggest drop in the series sits on one.
    drops = [seam[i - 1] - seam[i] for i in range(1, len(seam))]
    assert drops.index(max(drops)) % piece == piece - 1


def test_plateaus_hold_for_days() -> None:
    demand = shape("plateaus", 10 * DAY, 2)
    high = [v >= 0.7 for v in demand]
    runs, current = [], 1
    for a, b in itertools.pairwise(high):
        if a == b:
            current += 1
        else:
            runs.append(current)
            current = 1
    assert max(runs) * DEFAULT_BIN_S >= DAY


@pytest.mark.parametrize(("args", "message"), [
    (("weekly", HORIZON, 1), "unknown demand family 'weekly'"),
    (("diurnal", 60.0, 1), "must hold at least one bin"),
])
def test_bad_requests_name_what_is_wrong(args: tuple[str, float, int], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        shape(*args)


GANGS = tuple(Gang(arrival_s=i * HOUR, nodes=1 + i % 4, duration_s=2 * HOUR, pool="a") for i in range(60))


@given(st.floats(0.0, 1.0), st.integers(0, 1000))
def test_ramp_aligned_gangs_keep_every_gang_and_move_only_arrivals(share: float, seed: int) -> None:
    demand = shape("steep-ramps", HORIZON, seed)
    moved = ramp_aligned_gangs(GANGS, demand, DEFAULT_BIN_S, share, seed)
    key = lambda g: (g.nodes, g.duration_s, g.pool)  # noqa: E731
    assert sorted(map(key, moved)) == sorted(map(key, GANGS))
    assert [g.arrival_s for g in moved] == sorted(g.arrival_s for g in moved)
    if share == 0.0:
        assert moved == GANGS


def test_gangs_on_the_ramps_arrive_where_demand_rises() -> None:
    demand = shape("steep-ramps", HORIZON, 1)
    moved = ramp_aligned_gangs(GANGS, demand, DEFAULT_BIN_S, 1.0, 1)
    for gang in moved:
        i = int(gang.arrival_s // DEFAULT_BIN_S)
        assert demand[i] > demand[i - 1]
    with pytest.raises(ValueError, match=r"share must be in \[0, 1\]"):
        ramp_aligned_gangs(GANGS, demand, DEFAULT_BIN_S, 1.5, 1)


def test_a_family_workload_replaces_the_demand_of_every_service() -> None:
    base = Workload(GANGS, (), WorkloadSpec())
    workload = family_workload(base, "decays", HORIZON, 1, 0.8)
    assert isinstance(workload, TraceWorkload)
    assert set(workload.shapes) == {ALL} and workload.gangs == GANGS
    peak = max(workload.demand("any", 10, i * DEFAULT_BIN_S) for i in range(int(HORIZON // DEFAULT_BIN_S)))
    assert peak == pytest.approx(8.0)


def test_a_family_workload_in_minute_bins_spreads_a_ramp_over_its_five_minutes() -> None:
    base = Workload(GANGS, (), WorkloadSpec())
    workload = family_workload(base, "steep-ramps", HORIZON, 1, 0.8, bin_s=60.0)
    assert isinstance(workload, TraceWorkload) and workload.bin_s == 60.0
    demand = workload.shapes[ALL]
    assert len(demand) == int(HORIZON // 60)
    # Somewhere demand rises over five consecutive minutes by more than any single minute's rise.
    rises = [demand[i + 5] - demand[i] for i in range(len(demand) - 5)]
    steps = [demand[i + 1] - demand[i] for i in range(len(demand) - 1)]
    assert max(rises) > 2 * max(steps)


@pytest.mark.parametrize("name", list(cases()))
def test_simulate_accepts_every_family_of_the_report_by_name(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    """`make simulate FAMILY=<name>`: the run is on that family's demand (its services-alone bound, not the
    generated workload's, is the one printed)."""
    from bench.sim.run import default_workload, inference_alone, load_stack
    from tools.simulate import main

    days = 0.05
    assert main(["--stack", "local", "--days", str(days), "--warmup-days", "0", "--policies", "controller",
                 "--family", name, "--out", str(Path(".state/simulate/test-family.png"))]) == 0
    out = capsys.readouterr().out
    model = load_stack("local").model
    workload, lines = case_workload("local", model, default_workload(model, days, 1, 0.0), name, days * 86_400.0,
                                    1, 0.8)
    assert lines[0].startswith(f"demand family {name!r}: ") and lines[0] in out
    spec = case(name)
    if spec.trace is None:
        assert workload == family_workload(default_workload(model, days, 1, 0.0), spec.family, days * 86_400.0, 1,
                                           0.8, ramp_gangs=spec.ramp_gangs, bin_s=spec.bin_s)
    alone = inference_alone(model, workload, days, 0.0)
    bound = next(line for line in out.splitlines() if line.startswith("availability bound"))
    assert bound.endswith(f": {alone.inference_availability:.3%}, worst 5 min {alone.worst_window_availability:.1%}")


@pytest.mark.parametrize(("argv", "message"), [
    (["--family", "steep_ramps"], "simulate: unknown demand family 'steep_ramps'; known: 'diurnal', "),
    (["--family", "decays", "--inference-trace", "bench/traces/none.csv"],
     "simulate: --family replaces the inference demand; give it without --inference-trace and --trace"),
])
def test_simulate_refuses_a_family_it_cannot_run(argv: list[str], message: str,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    from tools.simulate import main

    assert main(["--stack", "local", "--days", "0.05", *argv]) == 2
    assert message in capsys.readouterr().err


def test_the_bench_reports_exactly_the_cases_simulate_accepts() -> None:
    from bench import bench_families

    assert bench_families.cases() == list(cases())
    assert case("steep-ramps + gangs on the ramps") == ("steep-ramps", RAMP_GANG_SHARE, 300.0, None)
    assert case("steep-ramps, 1-min samples") == ("steep-ramps", 0.0, 60.0, None)
