"""Restart decomposition: each term's formula, its scaling, the measured files and their fallbacks, the report."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bench.sim import restart_inputs
from bench.sim.goodput import POLICIES, Backend, Environment, expected_ettr, expected_ettr_graceful, plan
from bench.sim.restart import (
    ASSUMED,
    MEASURED,
    MEASURED_SCALED,
    SCALED,
    TERMS,
    Assumptions,
    Graceful,
    RestartModel,
    delete_seconds,
    load_seconds,
    nccl_init_seconds,
    pods,
    pull_seconds,
    recreate_seconds,
)
from bench.sim.restart_inputs import (
    EVICTED_KEY,
    FIRST_STEP_KEY,
    LOCAL_GANG_PODS,
    POD_START_KEY,
    QUARANTINE_KEY,
    RESTARTED_KEY,
    Measurements,
    read_measurements,
)
from components.config import parse_config
from components.mockrt import raw_from_stack

A = Assumptions()
ASYNC = POLICIES[-1]


def _write(tmp_path: Path, name: str, content: Any) -> Path:
    path = tmp_path / name
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    return path


def _phases(q: Any = 6.0, e: Any = 9.5, r: Any = 14.0, **extra: Any) -> dict[str, Any]:
    return {QUARANTINE_KEY: q, EVICTED_KEY: e, RESTARTED_KEY: r, **extra}


# --------------------------------------------------------------------------- the formulas


@pytest.mark.parametrize(("ranks", "expected"), [(1, 1), (8, 1), (9, 2), (1_024, 128), (16_384, 2_048)])
def test_one_pod_per_eight_gpus(ranks: int, expected: int) -> None:
    assert pods(ranks, A) == expected


@pytest.mark.parametrize(("n_pods", "delete_s", "recreate_s"), [
    (4, 0.0, 4 / 50 + 1.0),          # the local gang: inside the burst
    (100, 0.0, 2.0 + 1.0),           # exactly the burst
    (128, 28 / 50, 128 / 50 + 1.0),  # 1,024 GPUs
    (2_048, 1_948 / 50, 2_048 / 50 + 1.0),  # 16,384 GPUs
])
def test_volcano_api_rate_terms(n_pods: int, delete_s: float, recreate_s: float) -> None:
    assert delete_seconds(n_pods, A) == pytest.approx(delete_s)
    assert recreate_seconds(n_pods, A) == pytest.approx(recreate_s)


@pytest.mark.parametrize(("ranks", "expected"), [(1, 5.002), (1_024, 7.048), (4_096, 13.192), (16_384, 37.768),
                                                 (100_000, 205.0)])
def test_nccl_init_is_linear_in_ranks(ranks: int, expected: float) -> None:
    assert nccl_init_seconds(ranks, A) == pytest.approx(expected)


def test_nccl_init_at_meta_scale_stays_inside_the_published_synchronous_restart() -> None:
    assert nccl_init_seconds(100_000, A) < 600.0  # ~10 min per failure at ~100,000 GPUs (DESIGN anchors)


@pytest.mark.parametrize(("ranks", "size_tb", "read_gbps", "expected"), [
    (16_384, 1.0, 60.0, 1000 / 60),   # aggregate-bound: the whole checkpoint at the read rate
    (1_024, 1.0, 60.0, 1000 / 60),
    (1, 1.0, 60.0, 1000 / 50),        # one reader: one client link is the limit
    (16_384, 2.0, 40.0, 2000 / 40),
])
def test_checkpoint_load_is_the_shard_at_the_per_reader_rate(ranks: int, size_tb: float, read_gbps: float,
                                                            expected: float) -> None:
    a = Assumptions(size_tb=size_tb, read_gbps=read_gbps)
    assert load_seconds(ranks, a) == pytest.approx(expected)


def test_image_pull_is_size_over_node_throughput() -> None:
    assert pull_seconds(Assumptions(image_gb=15.0, pull_gbps=0.03)) == pytest.approx(500.0)


@pytest.mark.parametrize("bad", [{"ranks": 0}, {"size_tb": 0.0}, {"read_gbps": -1.0}])
def test_load_refuses_non_positive_inputs(bad: dict[str, Any]) -> None:
    ranks = bad.pop("ranks", 8)
    with pytest.raises(ValueError, match="must be positive"):
        load_seconds(ranks, Assumptions(**bad))


@given(small=st.integers(1, 200_000), extra=st.integers(0, 200_000))
def test_rank_scaled_terms_never_shrink_with_more_ranks(small: int, extra: int) -> None:
    model = RestartModel()
    lo, hi = model.terms(small), model.terms(small + extra)
    for a, b in zip(lo, hi, strict=True):
        if a.name in ("eviction", "rescheduling", "rendezvous + NCCL init"):
            assert b.seconds >= a.seconds, a.name
    assert hi[TERMS.index("rendezvous + NCCL init")].seconds > lo[TERMS.index("rendezvous + NCCL init")].seconds \
        or extra == 0


@given(ranks=st.integers(1, 100_000), size=st.floats(0.01, 50.0), factor=st.floats(1.0, 10.0))
def test_load_grows_with_the_shard(ranks: int, size: float, factor: float) -> None:
    assert load_seconds(ranks, Assumptions(size_tb=size * factor)) >= load_seconds(ranks, Assumptions(size_tb=size))


def test_assumptions_come_from_the_prod_stack() -> None:
    cfg = parse_config(raw_from_stack("prod"), "Pulumi.prod.yaml")
    a = Assumptions.from_config(cfg, "weka-ckpt")
    assert a.detect_s == pytest.approx(5.0 + 15 + 2)  # dcgmIntervalMs 5000 + scrape 15 s + guard poll 2 s
    assert (a.schedule_period_s, a.gpus_per_pod, a.size_tb, a.read_gbps, a.write_gbps) == (1.0, 8, 1.0, 60.0, 60.0)
    assert Assumptions.from_config(cfg, "vast-ckpt").read_gbps == 40.0


# --------------------------------------------------------------------------- the files and their fallbacks


def test_missing_files_fall_back_to_the_documented_values(tmp_path: Path) -> None:
    m = read_measurements(tmp_path / "e2e-phases.json", tmp_path / "e2e-realnodes.json",
                          tmp_path / "e2e-stack-in-pods.json", tmp_path / "results.json")
    assert (m.detect_s, m.evict_s, m.reschedule_s, m.pod_start_s, m.fault_to_first_step_s) == (None,) * 5
    assert not m.any
    assert m.notes == ("e2e-phases.json: absent (run `make e2e`)", "e2e-realnodes.json: absent (run `make e2e`)",
                       "e2e-stack-in-pods.json: absent (run `make e2e`)",
                       "results.json: absent (run `make bench-scale`)")
    terms = {t.name: t for t in RestartModel(A, m).terms(16_384)}
    assert [t.basis for t in terms.values()] == [ASSUMED, SCALED, SCALED, ASSUMED, SCALED, SCALED]
    assert terms["detection"].seconds == A.detect_s
    assert terms["detection"].note == "no e2e-phases.json figure"
    assert terms["container start"].seconds == A.cached_start_s
    assert terms["eviction"].seconds == pytest.approx(delete_seconds(2_048, A))
    assert terms["checkpoint load"].seconds == pytest.approx(1000 / 60)


def test_measured_phases_become_terms_scaled_to_the_job(tmp_path: Path) -> None:
    phases = _write(tmp_path, "e2e-phases.json", _phases(6.0, 9.5, 14.0, **{FIRST_STEP_KEY: 40.0, "other": "x"}))
    real = _write(tmp_path, "e2e-realnodes.json", {POD_START_KEY: 12.5, "host_restored": {}})
    pods = _write(tmp_path, "e2e-stack-in-pods.json", {"guard_fault_loop": {FIRST_STEP_KEY: 14.9},
                                                       "guard_fatal_loop": {FIRST_STEP_KEY: 21.5},
                                                       "real_gang": {"inplace_fault_to_first_step_s": 6.2}})
    no_scale = tmp_path / "results.json"
    m = read_measurements(phases, real, pods, no_scale)
    # The real-process loop's figure wins over the phases file's.
    assert (m.detect_s, m.evict_s, m.reschedule_s, m.pod_start_s, m.fault_to_first_step_s) == (6.0, 3.5, 4.5,
                                                                                                12.5, 14.9)
    assert m.fatal_fault_to_first_step_s == 21.5
    assert m.inplace_fault_to_first_step_s == 6.2
    assert m.notes == ("results.json: absent (run `make bench-scale`)",)
    # A file from before the fatal loop: the degraded figure stands, and the note names the missing loop.
    older = _write(tmp_path, "old-in-pods.json", {"guard_fault_loop": {FIRST_STEP_KEY: 14.9}})
    m = read_measurements(phases, real, older, no_scale)
    assert (m.fault_to_first_step_s, m.fatal_fault_to_first_step_s) == (14.9, None)
    assert m.notes == ("old-in-pods.json: key guard_fatal_loop is not an object of phases",
                       "old-in-pods.json: key real_gang is not an object of phases",
                       "results.json: absent (run `make bench-scale`)")
    assert read_measurements(phases, real, tmp_path / "absent.json", no_scale).fault_to_first_step_s == 40.0
    terms = {t.name: t for t in RestartModel(A, m).terms(16_384)}
    # The local 1 s scrape + 1 s poll give way to the stack's own sampling path.
    assert terms["detection"].seconds == pytest.approx(6.0 - restart_inputs.LOCAL_DETECT_PATH_S + A.detect_s)
    assert terms["detection"].basis == MEASURED_SCALED
    assert terms["detection"].source.startswith(f"e2e-phases.json: {QUARANTINE_KEY} less its 2 s local")
    # The local gang's measure plus the API calls of the 2,044 extra pods at Volcano's rate.
    extra = delete_seconds(2_048, A) - delete_seconds(LOCAL_GANG_PODS, A)
    assert terms["eviction"].seconds == pytest.approx(3.5 + extra)
    assert terms["rescheduling"].seconds == pytest.approx(4.5 + (2_048 - LOCAL_GANG_PODS) / 50)
    assert terms["eviction"].basis == terms["rescheduling"].basis == MEASURED_SCALED
    assert terms["container start"].seconds == 12.5 and terms["container start"].basis == MEASURED
    at_local = {t.name: t for t in RestartModel(A, m).terms(LOCAL_GANG_PODS * 8)}
    assert at_local["eviction"].seconds == pytest.approx(3.5)  # no scaling at the local gang's own size


@pytest.mark.parametrize(("content", "note"), [
    ("{not json", "e2e-phases.json: not JSON (JSONDecodeError)"),
    ("[1, 2]", "e2e-phases.json: not a JSON object (list)"),
    ({EVICTED_KEY: 9.5, RESTARTED_KEY: 14.0}, f"e2e-phases.json: key {QUARANTINE_KEY} absent"),
    (_phases(q="6"), f"e2e-phases.json: key {QUARANTINE_KEY} is not a number (str)"),
    (_phases(q=True), f"e2e-phases.json: key {QUARANTINE_KEY} is not a number (bool)"),
    (_phases(q=-1.0), f"e2e-phases.json: key {QUARANTINE_KEY} = -1.0 is not a phase in seconds"),
    ('{"fault_time_to_quarantine_s": NaN}', f"e2e-phases.json: key {QUARANTINE_KEY} = nan is not a phase"),
    (_phases(q=1e9), f"e2e-phases.json: key {QUARANTINE_KEY} = 1000000000.0 is not a phase"),
    (_phases(q=10.0, e=9.5), f"e2e-phases.json: key {EVICTED_KEY} (9.5) is before {QUARANTINE_KEY} (10)"),
    (_phases(r=1.0), f"e2e-phases.json: key {RESTARTED_KEY} (1) is before {EVICTED_KEY} (9.5)"),
])
def test_bad_phases_name_the_file_and_key_and_fall_back(tmp_path: Path, content: Any, note: str) -> None:
    m = read_measurements(_write(tmp_path, "e2e-phases.json", content), tmp_path / "absent.json",
                          tmp_path / "absent.json", tmp_path / "absent.json")
    assert any(n.startswith(note) for n in m.notes), m.notes
    terms = RestartModel(A, m).terms(1_024)
    assert all(math.isfinite(t.seconds) and t.seconds >= 0 for t in terms)


def test_undecodable_file_is_a_fallback_not_a_crash(tmp_path: Path) -> None:
    path = tmp_path / "e2e-realnodes.json"
    path.write_bytes(b"\xff\xfe\x00{")
    m = read_measurements(tmp_path / "absent.json", path, tmp_path / "absent.json", tmp_path / "absent.json")
    assert m.pod_start_s is None
    assert "e2e-realnodes.json: unreadable (UnicodeDecodeError)" in m.notes


_JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
                     lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner,
                                                                                  max_size=3), max_leaves=8)
_KEYS = st.sampled_from([QUARANTINE_KEY, EVICTED_KEY, RESTARTED_KEY, FIRST_STEP_KEY, POD_START_KEY,
                        "inplace_fault_to_first_step_s", "x"])


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture], max_examples=150)
@given(phases=st.one_of(st.dictionaries(_KEYS, _JSON | st.floats(-10, 1e6)), _JSON, st.binary(max_size=20)),
       real=st.one_of(st.dictionaries(_KEYS, _JSON | st.floats(-10, 1e6)), _JSON),
       pods=st.one_of(st.dictionaries(st.sampled_from(["guard_fault_loop", "guard_fatal_loop", "real_gang"]),
                                      st.dictionaries(_KEYS, _JSON | st.floats(-10, 1e6))
                                      | _JSON), _JSON))
def test_reader_never_raises_and_keeps_only_valid_phases(tmp_path: Path, phases: Any, real: Any, pods: Any) -> None:
    p, r, q = tmp_path / "e2e-phases.json", tmp_path / "e2e-realnodes.json", tmp_path / "e2e-stack-in-pods.json"
    if isinstance(phases, bytes):
        p.write_bytes(phases)
    else:
        p.write_text(json.dumps(phases))
    r.write_text(json.dumps(real))
    q.write_text(json.dumps(pods))
    m = read_measurements(p, r, q, tmp_path / "absent.json")
    for value in (m.detect_s, m.evict_s, m.reschedule_s, m.pod_start_s, m.fault_to_first_step_s,
                  m.fatal_fault_to_first_step_s, m.inplace_fault_to_first_step_s):
        assert value is None or (math.isfinite(value) and 0 <= value <= restart_inputs.MAX_PHASE_S)
    if isinstance(phases, dict):
        q, e, s = (phases.get(k) for k in (QUARANTINE_KEY, EVICTED_KEY, RESTARTED_KEY))
        q, e, s = (v if isinstance(v, int | float) else math.nan for v in (q, e, s))
        if m.detect_s is not None:
            assert m.detect_s == q
        else:
            assert any(QUARANTINE_KEY in n for n in m.notes)
        if m.evict_s is not None:
            assert m.evict_s == pytest.approx(e - q)
        if m.reschedule_s is not None:
            assert m.reschedule_s == pytest.approx(s - e)
    elif m.detect_s is None:
        assert any(n.startswith("e2e-phases.json: ") for n in m.notes)
    if m.pod_start_s is None:
        assert any(n.startswith("e2e-realnodes.json: ") for n in m.notes)
    model = RestartModel(A, m)
    assert model.total_s(2_048) == pytest.approx(sum(t.seconds for t in model.terms(2_048)))
    assert all(t.source for t in model.terms(2_048))


# --------------------------------------------------------------------------- the goodput model and the graceful path


def test_load_is_a_read_at_the_backends_read_rate() -> None:
    slow_reads = Backend("b", size_tb=1.0, write_s=10.0, read_s=25.0)
    assert Environment().restart_s(slow_reads) == pytest.approx(30 + 120 + 25.0)
    assert Environment().restart_s(Backend("b", 1.0, 10.0)) == pytest.approx(30 + 120 + 10.0)  # no read rate: write
    cfg = parse_config(raw_from_stack("prod"), "Pulumi.prod.yaml")
    assert Backend.from_config(cfg).load_s == pytest.approx(1000 / 60)


def test_decomposed_restart_is_the_sum_at_the_jobs_ranks() -> None:
    model = RestartModel(A, Measurements())
    env = Environment(restart=model)
    backend = Backend("weka-ckpt", 1.0, 1000 / 60)
    for gpus in (1_024, 16_384):
        assert plan(ASYNC, gpus, backend, env).restart_s == pytest.approx(model.total_s(gpus))
    assert model.total_s(16_384) > model.total_s(1_024)
    with pytest.raises(ValueError, match="needs the job's GPUs"):
        env.restart_s(backend)


def test_a_cold_pull_and_held_survivors_lengthen_the_restart() -> None:
    base = RestartModel(A, Measurements())
    cold = base.with_assumptions(cold_pull=True)
    held = base.with_assumptions(survivor_hold_s=34.0)
    assert cold.total_s(4_096) - base.total_s(4_096) == pytest.approx(500.0 - A.cached_start_s)
    assert held.total_s(4_096) - base.total_s(4_096) == pytest.approx(34.0)


@pytest.mark.parametrize(("ranks", "grace"), [(1_024, 34), (16_384, 34), (8, 59)])
def test_graceful_path_follows_the_sizing_code(ranks: int, grace: int) -> None:
    g = Graceful.at(ranks, A)
    assert g.grace_s == grace
    assert g.grace_s >= 2 * g.emergency_s
    assert g.net_saving_s(100.0) == pytest.approx(100.0 - g.emergency_s)


def test_all_graceful_bound_beats_the_crash_path() -> None:
    p = plan(ASYNC, 16_384, Backend("weka-ckpt", 1.0, 1000 / 60), Environment(restart=RestartModel()))
    assert expected_ettr_graceful(p, Graceful.at(16_384, A).emergency_s) > expected_ettr(p)


# --------------------------------------------------------------------------- the report


def _crash(evict: float, reschedule: float) -> dict[str, Any]:
    return {"evict_s": {"n": 1, "p50": evict, "p99": evict}, "reschedule_s": {"n": 1, "p50": reschedule}}


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], str]:
    from bench import bench_goodput

    tmp = tmp_path_factory.mktemp("measured")
    phases = _write(tmp, "e2e-phases.json", _phases(6.0, 9.5, 14.0))
    real = tmp / "e2e-realnodes.json"
    scale = _write(tmp, "results.json", {"shapes": {"llama3": {"crash": {
        "256": _crash(3.0, 20.0), "1024": _crash(8.0, 90.0), "2040": _crash(15.0, 200.0)}}}})
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(bench_goodput, "read_measurements",
                   lambda: read_measurements(phases, real, phases.parent / "no.json", scale))
        result = bench_goodput.run()
    return result, bench_goodput.to_markdown(result)


def test_report_carries_the_decomposition_with_basis_and_source(report: tuple[dict[str, Any], str]) -> None:
    result, text = report
    terms = result["restart_decomposition"]["terms"]
    assert list(terms) == list(TERMS)
    assert terms["detection"]["basis"] == MEASURED_SCALED
    assert terms["detection"]["seconds"]["16384"] == pytest.approx(6.0 - 2.0 + 22.0)
    # Eviction and rescheduling come from the scale runs: at 2,048 pods the 2,040-pod gang's own figures (within
    # 1 %), at 512 pods between 256 and 1,024, at 128 the 256-pod gang's scaled by pods.
    assert (terms["eviction"]["basis"], terms["eviction"]["seconds"]["16384"]) == (MEASURED, 15.0)
    assert terms["rescheduling"]["seconds"]["4096"] == pytest.approx(20.0 + (512 - 256) / (1024 - 256) * 70.0, abs=0.1)
    assert terms["eviction"]["seconds"]["1024"] == pytest.approx(3.0 * 128 / 256, abs=0.1)
    assert terms["eviction"]["source"].startswith("results.json: taint → every pod of the gang marked for deletion")
    assert any("scaled from 4 pods by Volcano's client rate" in row for row in result["restart_comparison"])
    assert terms["container start"]["basis"] == ASSUMED
    assert "e2e-realnodes.json: absent (run `make e2e`)" in result["restart_measurement_notes"]
    assert "Restart decomposition" in text
    for name in TERMS:
        assert f"| {name} | " in text
    assert f"e2e-phases.json: {QUARANTINE_KEY}" in text
    assert result["restart_measured_any"]


def test_report_puts_the_measured_terms_beside_todays_assumed(report: tuple[dict[str, Any], str]) -> None:
    result, text = report
    rows = result["restart_comparison"]
    assumed = rows["today's assumed (detect 30 s + reschedule 120 s + load)"]
    assert {r["restart_s"] for r in assumed.values()} == {round(30 + 120 + 1000 / 60, 1)}
    measured = rows["decomposed, measured terms"]
    assert set(measured) == {"1024", "4096", "16384"}
    assert measured["16384"]["restart_s"] == result["restart_s"]["16384"]
    graceful = result["graceful_path"]["16384"]
    assert graceful["ettr_crash_holds_grace_pct"] <= graceful["ettr_pct"] <= graceful["ettr_all_graceful_bound_pct"]
    assert "Graceful path" in text and "| policy |" in text  # the policy table is still there


def test_report_reads_the_kept_shards_at_the_rate_measured_here_and_prices_a_replacement_without_a_spare(
        report: tuple[dict[str, Any], str]) -> None:
    result, text = report
    for gpus, paths in result["restart_paths"].items():
        load = paths["in_place"]["terms"]["checkpoint load"]
        assert load["basis"] == MEASURED and "measured here: a 64 MiB shard read back from" in load["source"]
        assert load["seconds"] < result["restart_decomposition"]["terms"]["checkpoint load"]["seconds"][gpus]
        assert paths["replace_one"]["terms"]["checkpoint load"]["basis"] == MEASURED_SCALED
        spares = paths["spares"]
        assert spares["no_spare_restart_s"] > paths["replace_one"]["restart_s"] and 95 <= spares["found_pct"] <= 100
    assert result["restart_paths"]["16384"]["spares"]["count"] == 23
    assert "| 16,384 | 23 | " in text and "replacements that find one %" in text


# --------------------------------------------------------------------------- the scale runs' crashes


@pytest.mark.parametrize(("content", "note"), [
    ("{not json", "results.json: not JSON (JSONDecodeError)"),
    ({"shapes": []}, "results.json: key shapes is not an object"),
    ({"shapes": {"p": {"crash": [1]}}}, "results.json: shapes.p.crash is not an object"),
    ({"shapes": {"p": {"crash": {"-3": _crash(1, 1)}}}}, "results.json shapes.p.crash.-3: not a gang size"),
    ({"shapes": {"p": {"crash": {"64": {"evict_s": 3}}}}},
     "results.json shapes.p.crash.64: key evict_s is not an object of percentiles"),
    ({"shapes": {"p": {"crash": {"64": _crash(-1, 2)}}}},
     "results.json shapes.p.crash.64.evict_s: key p50 = -1 is not a phase in seconds"),
])
def test_bad_scale_results_name_the_shape_and_size_and_fall_back(tmp_path: Path, content: Any, note: str) -> None:
    absent = tmp_path / "absent.json"
    m = read_measurements(absent, absent, absent, _write(tmp_path, "results.json", content))
    assert m.at_scale == ()
    assert any(n.startswith(note) for n in m.notes), m.notes
    assert RestartModel(A, m).terms(16_384)[1].basis == SCALED


def test_scale_figures_are_read_by_size_and_a_later_shape_wins_a_tie(tmp_path: Path) -> None:
    absent = tmp_path / "absent.json"
    scale = _write(tmp_path, "results.json", {"shapes": {
        "prod": {"crash": {"64": _crash(2.0, 9.0)}, "nodes": 268},
        "llama3": {"crash": {"256": _crash(3.0, 20.0), "64": _crash(2.5, 9.5)}},
        "small": {"gangs": {}}}})
    m = read_measurements(absent, absent, absent, scale)
    assert m.at_scale == ((64, 2.5, 9.5), (256, 3.0, 20.0))


_POINTS = st.lists(st.tuples(st.integers(1, 4096), st.floats(0, 1000), st.floats(0, 1000)), min_size=1,
                   max_size=5, unique_by=lambda p: p[0]).map(lambda ps: tuple(sorted(ps)))


@given(points=_POINTS, n_pods=st.integers(1, 8192))
def test_at_scale_is_the_measured_figure_at_a_measured_size_and_never_negative(
        points: tuple[tuple[int, float, float], ...], n_pods: int) -> None:
    evict, reschedule, how = restart_inputs.at_scale(points, n_pods)
    assert math.isfinite(evict) and math.isfinite(reschedule) and evict >= 0 and reschedule >= 0
    near = [p for p in points if abs(p[0] - n_pods) <= 0.01 * n_pods]
    if near:
        assert (evict, reschedule) == (near[0][1], near[0][2]) and how.startswith("measured at")
    below = [p for p in points if p[0] < n_pods]
    above = [p for p in points if p[0] > n_pods]
    if not near and below and above:  # between two measured sizes: between their figures
        lo, hi = below[-1], above[0]
        assert min(lo[1], hi[1]) - 1e-9 <= evict <= max(lo[1], hi[1]) + 1e-9
    if not near and below and not above:  # past the largest: never less than it took there
        assert evict >= below[-1][1] - 1e-9 and reschedule >= below[-1][2] - 1e-9
