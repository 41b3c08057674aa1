"""Trace replay (issue 17): the canonical formats and the two public traces read as documented, a broken
trace fails naming file, line and column, and shape-from-trace/level-from-stack holds for any trace."""

from __future__ import annotations

import gzip
import math
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bench.sim.cost import ORACLE_AT_HEADROOM, bill_lines, oracle_at_headroom, prices_from_config, run_costed
from bench.sim.demand import (
    ALL,
    TraceWorkload,
    inference_shapes,
    outcomes_json,
    trace_workload,
    training_gangs,
)
from bench.sim.engine import simulate
from bench.sim.model import ClusterModel, DeschedulerLimits, PoolModel, ProviderModel, ServiceModel
from bench.sim.policies import oracle
from bench.sim.run import default_workload, inference_alone, load_stack
from bench.sim.traces import (
    InferenceTrace,
    Request,
    TraceError,
    TraceKind,
    autocorrelation,
    concurrency,
    parse_time,
    read_inference,
    read_training,
)
from bench.sim.workload import Workload
from components.config import ConfigError, parse_config
from components.mockrt import raw_from_stack

ROOT = Path(__file__).resolve().parent.parent
CORPUS = Path(__file__).resolve().parent / "corpus" / "traces"
CARRIED = ROOT / "bench" / "traces"

MODEL = ClusterModel(
    pools=(PoolModel("a", 4, 8), PoolModel("b", 2, 8)),
    providers=(ProviderModel("cloud", "vk-cloud", 64, 64),),
    services=(ServiceModel("img", 1, 2, 100, 1, 0.0, 300.0), ServiceModel("chat", 4, 1, 10, 1, 0.0, 300.0)),
    descheduler=DeschedulerLimits(60.0, 1, 5, 10, 300.0),
)
TARGETS = {"img": 4, "chat": 32}


def write(tmp_path: Path, text: str, name: str = "t.csv") -> Path:
    p = tmp_path / name
    p.write_text(text, encoding="utf-8")
    return p


# --- Broken input corpus: every file fails with its own message and position -----------------------------

#: file → (reader, expected (line, column), words the message must contain)
BROKEN: dict[str, tuple[str, tuple[int | None, int | None], str]] = {
    "unknown-columns.csv": ("inference", (1, None), "unknown columns ['when', 'service_seconds']"),
    "empty.csv": ("inference", (1, None), "empty file"),
    "header-only.csv": ("inference", (None, None), "no rows"),
    "service-time-not-a-number.csv": ("inference", (3, 2), "service_seconds: expected a number, got 'fast'"),
    "negative-service-time.csv": ("inference", (3, 2), "service_seconds: expected a finite number at least 0"),
    "nan-service-time.csv": ("inference", (3, 2), "finite number"),
    "bad-time.csv": ("inference", (3, 1), "time: expected epoch seconds or ISO 8601, got 'yesterday'"),
    "extra-field.csv": ("inference", (3, None), "3 fields, the header has 2"),
    "infinite-rate.csv": ("inference", (3, 2), "rps: expected a finite number"),
    "unterminated-quote.csv": ("inference", (3, None), "bad CSV"),
    "fractional-workers.csv": ("training", (3, 2), "workers: expected a whole number >= 1, got '1.5'"),
    "zero-gpus.csv": ("training", (3, 3), "gpus_per_worker: expected a whole number >= 1, got '0'"),
    "zero-duration.csv": ("training", (2, 4), "duration_s: expected a finite number above 0"),
    "gentd26-bad-month.csv": ("inference", (3, 1), "gmt_create: expected epoch seconds or ISO 8601"),
    "alibaba-deleted-before-scheduled.csv": ("inference", (2, 6), "deletion_time 5 is before scheduled_time 10"),
    "not-utf8.csv": ("inference", (3, None), "not UTF-8"),
    "truncated.csv.gz": ("inference", (None, None), "not a readable gzip file"),
}


def test_corpus_is_covered() -> None:
    assert sorted(p.name for p in CORPUS.iterdir()) == sorted(BROKEN)


@pytest.mark.parametrize("name", sorted(BROKEN))
def test_broken_trace_names_file_line_and_column(name: str) -> None:
    reader, (line, column), words = BROKEN[name]
    path = CORPUS / name
    with pytest.raises(TraceError) as info:
        (read_inference if reader == "inference" else read_training)(path)
    err = info.value
    assert (err.path, err.line, err.column) == (str(path), line, column)
    where = str(path) + "".join(f":{x}" for x in (line, column) if x is not None)
    assert str(err).startswith(f"{where}: ")
    assert words in str(err)


def test_missing_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match=r"nope\.csv: cannot read"):
        read_inference(tmp_path / "nope.csv")


def test_a_job_log_is_not_an_inference_trace(tmp_path: Path) -> None:
    p = write(tmp_path, "submit_time,workers,gpus_per_worker,duration_s\n0,1,8,60\n")
    with pytest.raises(TraceError, match="expected one of — GenTD26 request log: gmt_create"):
        read_inference(p)


# --- Canonical formats -----------------------------------------------------------------------------------


def test_request_log_with_iso_and_epoch_times_and_services(tmp_path: Path) -> None:
    p = write(tmp_path, "service,time,service_seconds,note\nimg,2024-11-15T00:00:10Z,3,x\n"
                        "chat,1731628800,2.5,\nimg,2024-11-15 00:00:05+00:00,1,\n")
    trace = read_inference(p)
    assert trace.kind is TraceKind.REQUEST_LOG
    assert trace.requests == (Request(1731628800.0, 2.5, "chat"), Request(1731628805.0, 1.0, "img"),
                              Request(1731628810.0, 3.0, "img"))


def test_rate_series_gzip_detected_by_content(tmp_path: Path) -> None:
    p = tmp_path / "rates.txt"
    p.write_bytes(gzip.compress(b"time,rps\n0,2\n60,4\n"))
    trace = read_inference(p)
    assert trace.kind is TraceKind.RATE_SERIES
    assert [(r.time_s, r.rps) for r in trace.rates] == [(0.0, 2.0), (60.0, 4.0)]


def test_time_without_offset_is_utc() -> None:
    assert parse_time("1970-01-02 00:00:00") == 86_400.0
    assert parse_time("1970-01-01T08:00:00+08:00") == 0.0


def test_job_log_becomes_whole_node_gangs_in_their_pools(tmp_path: Path) -> None:
    p = write(tmp_path, "submit_time,workers,gpus_per_worker,duration_s,pool\n100,2,8,3600,a\n"
                        "160,3,2,60,b\n200,9,8,60,b\n")
    gangs, report = training_gangs(read_training(p), MODEL, 200.0)
    # The loop is the span (100 s) plus one mean gap (50 s): the first job comes back at 150 s.
    assert [(g.arrival_s, g.nodes, g.duration_s, g.pool) for g in gangs] == [
        (0.0, 2, 3600.0, "a"), (60.0, 1, 60.0, "b"), (100.0, 2, 60.0, "b"), (150.0, 2, 3600.0, "a")]
    assert report.clipped == 1  # 72 GPUs asked of pool b's 16: capped at its 2 nodes
    assert any("loops" in line for line in report.lines())


def test_job_in_an_unknown_pool_is_refused(tmp_path: Path) -> None:
    p = write(tmp_path, "submit_time,workers,gpus_per_worker,duration_s,pool\n0,1,8,60,gpu-z\n")
    with pytest.raises(TraceError, match=r"names pool 'gpu-z', not in the stack \(its pools: \['a', 'b'\]\)"):
        training_gangs(read_training(p), MODEL, 3600.0)


def test_training_level_from_the_stack(tmp_path: Path) -> None:
    rows = "".join(f"{i * 600},1,8,600,a\n" for i in range(144))  # one node busy all day
    p = write(tmp_path, "submit_time,workers,gpus_per_worker,duration_s,pool\n" + rows)
    gangs, report = training_gangs(read_training(p), MODEL, 86_400.0, training_load=0.5, seed=3)
    assert report.offered_load == pytest.approx(1 / 6, rel=0.01)
    assert report.factor == pytest.approx(3.0, rel=0.01)
    work = sum(g.nodes * g.duration_s for g in gangs) / (6 * 86_400.0)
    assert work == pytest.approx(0.5, rel=0.02)


def test_training_level_counts_only_work_inside_the_horizon(tmp_path: Path) -> None:
    """A month-long job submitted near the end of a day's run offers an hour of work to it, not a month."""
    p = write(tmp_path, "submit_time,workers,gpus_per_worker,duration_s,pool\n0,1,8,3600,a\n"
                        "82800,1,8,2592000,a\n")
    _, report = training_gangs(read_training(p), MODEL, 86_400.0)
    assert report.offered_load == pytest.approx(2 * 3_600.0 / (6 * 86_400.0))


def test_unknown_service_in_the_trace_is_refused(tmp_path: Path) -> None:
    p = write(tmp_path, "time,service_seconds,service\n0,10,img\n5,10,video\n")
    with pytest.raises(TraceError, match=r"services \['video'\] are not in the stack"):
        inference_shapes(read_inference(p), MODEL, TARGETS, 3600.0)


# --- The carried public traces ---------------------------------------------------------------------------


def test_gentd26_as_carried() -> None:
    trace = read_inference(CARRIED / "gentd26-sd-requests.csv.gz")
    assert trace.kind is TraceKind.GENTD26
    assert len(trace.requests) == 26_823
    _, report = inference_shapes(trace, MODEL, TARGETS, 31 * 86_400.0)
    assert 23.0 < report.stats.span_days < 23.1
    assert report.loops == pytest.approx(31 / 23.03, rel=0.01)
    assert "it loops 1.35 times" in "\n".join(report.lines())
    assert report.stats.daily_autocorrelation is not None and report.stats.daily_autocorrelation > 0.5
    assert report.stats.weekly_autocorrelation is not None and report.stats.weekly_autocorrelation > 0.3
    assert report.stats.peak_to_mean_hourly > 5  # a bursty service: the weekend and growth show


def test_alibaba_pods_split_by_qos() -> None:
    path = CARRIED / "alibaba-gpu-2023-pods.csv.gz"
    inference, training = read_inference(path), read_training(path)
    assert inference.kind is training.kind is TraceKind.ALIBABA_2023
    assert 0 < len(inference.requests) <= 4_647  # scheduled LS pods
    assert 0 < len(training.jobs) <= 3_498  # scheduled BE/Burstable pods that held GPUs
    assert all(j.workers == 1 and j.gpus_per_worker >= 1 for j in training.jobs)


# --- Properties over any trace ---------------------------------------------------------------------------

requests_st = st.lists(
    st.tuples(st.floats(0, 5 * 86_400.0), st.floats(0, 4 * 3_600.0), st.sampled_from(["img", "chat", None])),
    min_size=1, max_size=60,
)


@given(requests_st, st.floats(0.05, 1.0))
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_shape_from_trace_level_from_stack(rows: list[tuple[float, float, str | None]], share: float) -> None:
    requests = tuple(sorted((Request(t, s, svc) for t, s, svc in rows), key=lambda r: r.time_s))
    trace = InferenceTrace("mem.csv", TraceKind.REQUEST_LOG, requests)
    if all(r.service_seconds == 0 for r in requests) or requests[-1].time_s == requests[0].time_s:
        return
    try:
        shapes, report = inference_shapes(trace, MODEL, TARGETS, 7 * 86_400.0, peak_share=share)
    except TraceError as exc:
        assert "no request is ever in service" in str(exc)
        return
    workload = trace_workload(Workload(()), shapes, peak_share=share)
    assert isinstance(workload, TraceWorkload)
    for svc in MODEL.services:
        values = [workload.demand(svc.name, svc.max_replicas, i * 300.0) for i in range(len(shapes[ALL]))]
        assert max(values) == pytest.approx(share * svc.max_replicas)  # the trace's peak → share × max
        assert min(values) >= 0.0
        # A trace shorter than the horizon loops: the same demand one period later.
        t = 1234.5
        assert workload.demand(svc.name, svc.max_replicas, t) == workload.demand(
            svc.name, svc.max_replicas, t + workload.period_s)
    assert report.period_s >= report.bin_s


@given(requests_st, st.floats(30.0, 7_200.0))
@settings(max_examples=60, deadline=None)
def test_concurrency_conserves_busy_seconds(rows: list[tuple[float, float, str | None]], bin_s: float) -> None:
    """Little's law by construction: the bins hold exactly the busy seconds that fall inside them."""
    requests = [Request(t, s) for t, s, _ in rows]
    bins = math.ceil(6 * 86_400.0 / bin_s)
    end = bins * bin_s
    got = sum(concurrency(requests, 0.0, bins, bin_s)) * bin_s
    want = sum(max(0.0, min(r.time_s + r.service_seconds, end) - r.time_s) for r in requests)
    assert got == pytest.approx(want, rel=1e-9, abs=1e-6)


@given(st.text(max_size=300))
@settings(max_examples=150, deadline=None)
def test_any_text_is_read_or_refused_with_a_trace_error(tmp_path_factory: pytest.TempPathFactory, text: str) -> None:
    p = tmp_path_factory.mktemp("fuzz") / "x.csv"
    p.write_text(text, encoding="utf-8")
    for reader in (read_inference, read_training):
        try:
            reader(p)
        except TraceError as exc:
            assert str(exc).startswith(str(p))


@given(st.lists(st.tuples(st.integers(0, 10**6), st.integers(1, 64), st.integers(1, 8), st.integers(1, 10**5)),
                min_size=1, max_size=30))
@settings(max_examples=40, deadline=None)
def test_job_log_round_trip(tmp_path_factory: pytest.TempPathFactory, jobs: list[tuple[int, int, int, int]]) -> None:
    p = tmp_path_factory.mktemp("jobs") / "jobs.csv"
    p.write_text("submit_time,workers,gpus_per_worker,duration_s\n" + "".join(
        f"{a},{w},{g},{d}\n" for a, w, g, d in jobs), encoding="utf-8")
    trace = read_training(p)
    assert sorted((j.submit_s, j.workers, j.gpus_per_worker, j.duration_s) for j in trace.jobs) == sorted(
        (float(a), w, g, float(d)) for a, w, g, d in jobs)


def test_autocorrelation_finds_a_daily_cycle() -> None:
    hourly = [1.0 + math.sin(2 * math.pi * h / 24) for h in range(24 * 14)]
    daily = autocorrelation(hourly, 24)
    half = autocorrelation(hourly, 12)
    assert daily is not None and daily > 0.9
    assert half is not None and half < -0.9
    assert autocorrelation(hourly[:30], 24) is None  # shorter than two periods


def test_trace_drives_the_simulator_and_json_has_the_keys(tmp_path: Path) -> None:
    """The oracle on a trace that asks for a full burst then nothing: availability and external use follow it."""
    p = write(tmp_path, "time,rps\n0,0\n3600,10\n7200,0\n14400,0\n")
    shapes, _ = inference_shapes(read_inference(p), MODEL, TARGETS, 4 * 3_600.0, window_s=300.0)
    workload = trace_workload(Workload(()), shapes, peak_share=0.5)
    out = simulate(MODEL, workload, oracle(MODEL), 4 * 3_600.0, 0.0)
    assert out.inference_availability == pytest.approx(1.0)
    figures = outcomes_json([out])["oracle"]
    assert list(figures)[:5] == ["inference_availability", "worst_window_availability", "external_gpu_hours",
                                 "onprem_gpu_utilization", "taint_flips"]
    # Peak demand (50 img replicas + 5 chat × 4 GPUs) exceeds the 48 on-prem GPUs by 22 for one hour.
    assert figures["external_gpu_hours"] == pytest.approx(50 + 20 - 48, rel=0.1)


def test_cost_per_provider_follows_the_stack_price(tmp_path: Path) -> None:
    p = write(tmp_path, "time,rps\n0,0\n3600,10\n7200,0\n14400,0\n")
    shapes, _ = inference_shapes(read_inference(p), MODEL, TARGETS, 4 * 3_600.0, window_s=300.0)
    workload = trace_workload(Workload(()), shapes, peak_share=0.5)
    [(out, priced)] = run_costed(MODEL, workload, [oracle(MODEL)], 4 * 3_600.0, 0.0, {"cloud": 2.5})
    assert priced.gpu_hours["cloud"] == pytest.approx(out.external_gpu_hours)
    assert priced.cost == pytest.approx(2.5 * out.external_gpu_hours)
    assert priced.unpriced == ()
    [(_, unpriced)] = run_costed(MODEL, workload, [oracle(MODEL)], 4 * 3_600.0, 0.0, {})
    assert unpriced.cost == 0.0 and unpriced.unpriced == ("cloud",)
    assert "no pricePerGpuHour in the stack for ['cloud']" in "\n".join(bill_lines([(out, unpriced)]))


def test_stack_prices_are_read_and_a_negative_one_is_refused() -> None:
    raw = raw_from_stack("prod")
    prices = prices_from_config(parse_config(raw, "Pulumi.prod.yaml"))
    assert set(prices) == {"lambda-east", "dr-cluster"} and all(v is not None and v > 0 for v in prices.values())
    providers = raw["providers"]
    assert isinstance(providers, list)
    broken = dict(raw) | {"providers": [dict(providers[0], pricePerGpuHour=-1), *providers[1:]]}
    with pytest.raises(ConfigError, match="pricePerGpuHour"):
        parse_config(broken, "Pulumi.prod.yaml")


def test_oracle_at_headroom_asks_for_the_replicas_a_real_hpa_would(tmp_path: Path) -> None:
    p = write(tmp_path, "time,rps\n0,0\n3600,10\n7200,0\n14400,0\n")
    shapes, _ = inference_shapes(read_inference(p), MODEL, TARGETS, 4 * 3_600.0, window_s=300.0)
    workload = trace_workload(Workload(()), shapes, peak_share=0.5)
    (plain, _), (fair, _) = run_costed(MODEL, workload, [oracle(MODEL), oracle_at_headroom(MODEL)],
                                       4 * 3_600.0, 0.0, {})
    assert fair.policy == ORACLE_AT_HEADROOM
    # Headroom 1.15: ceil(50 × 1.15) = 58 img + ceil(5 × 1.15) = 6 chat × 4 GPUs = 82 GPUs, 34 beyond on-prem.
    assert fair.external_gpu_hours == pytest.approx(82 - 48, rel=0.1)
    assert plain.external_gpu_hours == pytest.approx(70 - 48, rel=0.1)
    assert fair.inference_availability == pytest.approx(1.0)


def test_simulate_cli_rejects_a_malformed_trace(capsys: pytest.CaptureFixture[str]) -> None:
    from tools.simulate import main

    path = CORPUS / "bad-time.csv"
    assert main(["--stack", "local", "--days", "0.1", "--inference-trace", str(path)]) == 2
    assert f"simulate: {path}:3:1: time: expected epoch seconds or ISO 8601" in capsys.readouterr().err


def test_simulate_cli_prints_the_availability_bound_of_the_services_alone(capsys: pytest.CaptureFixture[str]) -> None:
    from tools.simulate import main

    assert main(["--stack", "local", "--days", "0.05", "--warmup-days", "0", "--policies", "controller",
                 "--out", str(Path(".state/simulate/test-bound.png"))]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("availability bound")]
    assert len(lines) == 1
    assert lines[0].startswith("availability bound (inference alone: no training, every replica on idle on-prem "
                               "GPUs, the same HPAs): ")
    setup = load_stack("local")
    alone = inference_alone(setup.model, default_workload(setup.model, 0.05, 1, 0.0), 0.05, 0.0)
    assert lines[0].endswith(f": {alone.inference_availability:.3%}, worst 5 min {alone.worst_window_availability:.1%}")
    assert alone.training_gpu_utilization == 0.0
