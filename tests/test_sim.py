"""The cluster simulator: hand-checked scenarios, conservation, determinism and the controller's own core."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

import agents.burst_controller.decide as core
from agents.burst_controller.contract import BurstSettings
from bench.sim import controller_adapter
from bench.sim.engine import Outcome, Simulator, simulate
from bench.sim.model import (
    ClusterModel,
    DeschedulerLimits,
    Latencies,
    PoolModel,
    ProviderModel,
    ServiceModel,
    cron_interval_seconds,
)
from bench.sim.policies import CONTROLLER, Policy, all_policies, naive_burst, no_burst
from bench.sim.run import INFERENCE_ALONE, default_workload, inference_alone, load_stack
from bench.sim.workload import Gang, Spike, Workload, WorkloadSpec, generate, load_trace
from components.config import parse_config
from components.mockrt import raw_from_stack

# One 8-GPU node, one 16-GPU virtual node, one service pinned at 2 replicas of 1 GPU whose traffic is
# exactly one replica's worth, and one single-node training job from t=1000 s to t=4600 s.
FLAT = WorkloadSpec(floor_share=0.5, peak_share=0.5, spikes_per_day=0.0, training_load=0.0)
ONE = ClusterModel(
    pools=(PoolModel("gpu", 1, 8),),
    providers=(ProviderModel("cloud", "vk-cloud", 16, 100),),
    services=(ServiceModel("svc", 1, 2, 2, 1, 0.0, 300.0),),
    descheduler=DeschedulerLimits(60.0, 1, 1, 1, 0.0),
    latencies=Latencies(onprem_start_s=60.0, external_start_s=180.0, hpa_period_s=15.0),
)
JOB = Workload((Gang(1000.0, 1, 3600.0, "gpu"),), (), FLAT)
SETTINGS = BurstSettings(
    open_below_free_gpus=1, close_at_free_gpus=2, open_hold_seconds=60, close_hold_seconds=120,
    pending_grace_seconds=30, tick_seconds=5,
)
OURS = Policy("controller", CONTROLLER, SETTINGS, ONE.descheduler)


def test_one_node_one_service_one_job_with_the_controller() -> None:
    sim = Simulator(ONE, JOB, OURS, 6000.0, check=True)
    out = sim.run()
    # Pods Ready at 60 s; the gang preempts both at 1000 s; pending 30 s (grace) -> open at 1030 s;
    # external pods Ready at 1210 s. Job ends 4600 s; close holds 120 s -> closed at 4720 s; the descheduler
    # (every 60 s, one pod per cycle, PDB maxUnavailable 1) moves one pod at 4740 s and the other at 4800 s.
    assert out.inference_availability == pytest.approx((6000 - 60 - 210) / 6000)
    # The first 60 s are the HPA's replicas starting; the 210 s after the preemption are their replacements.
    assert (out.shortfall_starting, out.shortfall_replacing, out.shortfall_unasked) == pytest.approx(
        (60 / 6000, 210 / 6000, 0.0))
    assert out.worst_window_availability == pytest.approx(100 / 300)
    assert out.training_gpu_utilization == pytest.approx(8 * 3600 / (8 * 6000))
    assert out.onprem_gpu_utilization == pytest.approx((8 * 3600 + 2 * 1000 + 1 * 60 + 2 * 1200) / (8 * 6000))
    assert out.external_gpu_hours == pytest.approx((2 * 3710 + 60) / 3600)
    # Of those: 4600-4720 s open with the node free (movable), 4720-4800 s closed (returning).
    assert out.movable_gpu_hours == pytest.approx(2 * 120 / 3600)
    assert out.returning_gpu_hours == pytest.approx((2 * 20 + 60) / 3600)
    assert (out.preemptions, out.descheduler_evictions) == (2, 2)
    assert out.evictions_per_hour == pytest.approx(4 / (6000 / 3600))
    assert (out.taint_flips, out.node_taint_patches, out.surges) == (2, 2, 1)
    assert out.return_minutes_max == pytest.approx(80 / 60)
    assert sim.vn_taint == ["NoSchedule"]
    assert sim.onprem_inf_gpus == 2 and sim.ext_gpus == 0


@pytest.mark.parametrize(("providers", "used"), [
    # The cheaper provider first, wherever the stack lists it (the pods' preferred affinity ranks it).
    ((ProviderModel("dear", "vk-dear", 16, 100, 2.99), ProviderModel("cheap", "vk-cheap", 16, 100, 1.50)), [0, 2]),
    # It fills, and the rest goes to the next.
    ((ProviderModel("dear", "vk-dear", 16, 100, 2.99), ProviderModel("cheap", "vk-cheap", 1, 100, 1.50)), [1, 1]),
    # Without two prices nothing is ranked: the configured order.
    ((ProviderModel("a", "vk-a", 16, 100), ProviderModel("b", "vk-b", 16, 100, 1.50)), [2, 0]),
])
def test_a_burst_fills_the_cheaper_provider_first(providers: tuple[ProviderModel, ...], used: list[int]) -> None:
    two = replace(ONE, providers=providers)
    sim = Simulator(two, JOB, replace(OURS, descheduler=two.descheduler), 1300.0, check=True)
    sim.run()
    assert sim.cluster.vn_used == used  # both preempted replicas external, Ready since 1210 s


@pytest.mark.parametrize(("costs", "left"), [
    ({"first": -150, "second": -100}, [0, 1]),  # the lower cost goes first, although it is the older pod
    ({}, [1, 0]),  # one cost for every external replica: the newest goes first
])
def test_a_scale_down_removes_the_lower_deletion_cost_first(costs: dict[str, int], left: list[int]) -> None:
    """Unpriced providers fill in configured order: the first replacement lands on `first`, the second on
    `second`; the controller patches each pod with its provider's cost, and the ReplicaSet ranks by it."""
    first, second = ProviderModel("first", "vk-first", 1, 100), ProviderModel("second", "vk-second", 1, 100)
    two = replace(ONE, providers=(first, second))
    policy = Policy("controller", CONTROLLER, SETTINGS.replace(provider_deletion_costs=costs), two.descheduler)
    sim = Simulator(two, JOB, policy, 1300.0, check=True)
    sim.run()
    assert sim.cluster.vn_used == [1, 1]
    sim.services[0].replicas = 1
    sim.replicasets.reconcile(0)
    assert sim.cluster.vn_used == left


def test_the_stack_prices_reach_the_simulation() -> None:
    model = load_stack("prod").model
    assert {p.name: p.price_per_gpu_hour for p in model.providers} == {"lambda-east": 2.99, "dr-cluster": 1.50}


def test_room_that_queued_training_will_claim_is_not_counted_past_the_queue() -> None:
    """Two 8-GPU nodes. A 2-node gang preempts both replicas (external from 1210 s) until 4600 s; then a 1-node
    gang starts and a 2-node gang waits for enqueue (16 GPUs, 8 left in the queue). From 4600 s to the close at
    4720 s one node is free: the two external replicas are movable, but not past the queue, whose waiting gang
    will take that node as soon as the running one ends."""
    two = replace(ONE, pools=(PoolModel("gpu", 2, 8),))
    gangs = (Gang(1000.0, 2, 3600.0, "gpu"), Gang(4000.0, 1, 3600.0, "gpu"), Gang(4100.0, 2, 3600.0, "gpu"))
    sim = Simulator(two, Workload(gangs, (), FLAT), replace(OURS, descheduler=two.descheduler), 6000.0, check=True)
    out = sim.run()
    assert out.movable_gpu_hours == pytest.approx(2 * 120 / 3600)
    assert out.movable_past_queue_gpu_hours == 0.0
    assert sim.cluster.waiting_train_gpus == 16 and list(sim.waiting) == [2]
    # Without the waiting gang the same free node counts past the queue too.
    out = Simulator(two, Workload(gangs[:2], (), FLAT), replace(OURS, descheduler=two.descheduler), 6000.0,
                    check=True).run()
    assert out.movable_past_queue_gpu_hours == pytest.approx(out.movable_gpu_hours) == pytest.approx(2 * 120 / 3600)


def test_inference_alone_bounds_availability_by_the_on_prem_start_only() -> None:
    out = inference_alone(ONE, JOB, 6000.0 / 86400, 0.0)
    assert out.policy == INFERENCE_ALONE
    assert out.inference_availability == pytest.approx((6000 - 60) / 6000)  # Ready at 60 s, never preempted
    assert (out.shortfall_starting, out.shortfall_replacing) == pytest.approx((60 / 6000, 0.0))
    assert (out.training_gpu_utilization, out.external_gpu_hours, out.preemptions) == (0.0, 0.0, 0)


def test_a_spike_the_hpa_holds_back_is_unasked_then_starting() -> None:
    """One replica's worth of demand (2 replicas at headroom 1.15) jumps to 4 at the HPA's run at 1005 s; a
    60 s scale-up stabilisation window holds 2 replicas until 1065 s (2 unasked), then two start for 60 s."""
    four = replace(ONE, services=(ServiceModel("svc", 1, 1, 4, 1, 60.0, 300.0),))
    spike = Workload((), (Spike("svc", 1000.0, 600.0, 4.0),), replace(FLAT, floor_share=0.25, peak_share=0.25))
    out = simulate(four, spike, no_burst(), 2000.0, check=True)
    demand = 1 * 2000 + 3 * 600  # replica-seconds
    assert out.shortfall_unasked == pytest.approx(2 * 60 / demand)
    assert out.shortfall_starting == pytest.approx((1 * 60 + 2 * 60) / demand)  # the first 60 s, then the spike
    assert out.shortfall_replacing == 0.0


def test_prefer_onprem_affinity_moves_pods_home_while_the_burst_is_open() -> None:
    """descheduler.preferOnpremAffinity: the job ends at 4600 s and the burst stays open until 4720 s (close
    hold); the affinity plugin moves the external pods home from the open node at 4620 s and, once the first
    replacement is Ready (PDB), at 4680 s, two minutes before the taint plugin would start."""
    prefer = replace(ONE.descheduler, prefer_onprem=True)
    sim = Simulator(ONE, JOB, replace(OURS, descheduler=prefer), 6000.0, check=True)
    out = sim.run()
    assert out.external_gpu_hours == pytest.approx((2 * 3590 + 60) / 3600)
    assert out.movable_gpu_hours == pytest.approx((2 * 20 + 60) / 3600)
    assert out.returning_gpu_hours == 0.0
    assert out.descheduler_evictions == 2
    assert out.inference_availability == pytest.approx((6000 - 60 - 210) / 6000)  # nothing lost by moving
    assert out.return_minutes_max is None  # nothing left external when the burst closed
    assert sim.onprem_inf_gpus == 2 and sim.ext_gpus == 0


def test_prefer_onprem_affinity_reaches_the_simulation() -> None:
    raw = raw_from_stack("prod")
    raw["descheduler"] = {**raw["descheduler"], "preferOnpremAffinity": True}
    model = ClusterModel.from_config(parse_config(raw, "Pulumi.prod.yaml"))
    assert model.descheduler.prefer_onprem and not load_stack("prod").model.descheduler.prefer_onprem


def test_one_node_without_burst_inference_waits_for_the_job() -> None:
    out = simulate(ONE, JOB, Policy("no burst", "never"), 6000.0, check=True)
    # Preempted at 1000 s, nowhere to go until the job ends at 4600 s, Ready again at 4660 s.
    assert out.inference_availability == pytest.approx((6000 - 60 - 3660) / 6000)
    assert out.worst_window_availability == 0.0
    assert out.external_gpu_hours == 0.0
    assert (out.preemptions, out.taint_flips) == (2, 0)


def test_naive_burst_returns_at_once_and_flips_on_every_crossing() -> None:
    naive = naive_burst(ONE, SETTINGS)
    assert naive.settings is not None
    assert naive.settings.close_at_free_gpus == SETTINGS.open_below_free_gpus + 1
    assert (naive.settings.open_hold_seconds, naive.settings.close_hold_seconds) == (0, 0)
    out = simulate(ONE, JOB, naive, 6000.0, check=True)
    # Opens at the tick that sees pods pending (1000 s) and closes at the tick the job ends (4600 s). The
    # descheduler runs every tick without limits, but the PDB still lets only one pod go at a time: one
    # pod at 4605 s, the other once its replacement is Ready (4665 s).
    assert out.taint_flips == 2
    assert out.external_gpu_hours == pytest.approx((2 * (4605 - 1000) + (4665 - 4605)) / 3600)
    assert out.return_minutes_max == pytest.approx(65 / 60)
    assert out.inference_availability == pytest.approx((6000 - 60 - 180) / 6000)


def test_static_partition_keeps_inference_and_training_apart() -> None:
    model = replace(ONE, pools=(PoolModel("gpu", 2, 8),))
    policy = Policy("static partition", "never", reserved_inference_gpus=8)
    sim = Simulator(model, JOB, policy, 6000.0, check=True)
    out = sim.run()
    assert out.preemptions == 0
    assert out.inference_availability == pytest.approx((6000 - 60) / 6000)
    assert out.training_gpu_utilization == pytest.approx(8 * 3600 / (16 * 6000))


def test_the_decision_core_is_the_controllers_own() -> None:
    sim = Simulator(ONE, JOB, OURS, 100.0)
    assert sim.controller is not None
    assert sim.controller.decide_fn is core.decide
    assert controller_adapter.decide is core.decide
    assert controller_adapter.state_from_snapshot is core.state_from_snapshot
    assert controller_adapter.Snapshot is core.Snapshot
    assert controller_adapter.BurstSettings is BurstSettings


def test_the_core_is_called_and_its_decisions_applied(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[core.Decision] = []

    def spy(snapshot: core.Snapshot, state: core.BurstState, now: float, settings: BurstSettings) -> core.Decision:
        decision = core.decide(snapshot, state, now, settings)
        seen.append(decision)
        return decision

    sim = Simulator(ONE, JOB, OURS, 6000.0)
    assert sim.controller is not None
    monkeypatch.setattr(sim.controller, "decide_fn", spy)
    out = sim.run()
    flips = [(d.flipped, d.state.changed_at) for d in seen if d.flipped is not None]
    assert flips == [(core.Mode.OPEN, 1030.0), (core.Mode.CLOSED, 4720.0)]
    assert out.taint_flips == 2


def small_stack() -> tuple[ClusterModel, BurstSettings, Workload]:
    setup = load_stack("prod")
    model = setup.model.scaled_to(256)
    return model, setup.settings, default_workload(model, 0.75, seed=7, warmup_days=0.25)


def test_conservation_under_every_policy() -> None:
    model, settings, workload = small_stack()
    for policy in all_policies(model, settings, workload.spec):
        out = simulate(model, workload, policy, 0.5 * 86400, 0.25 * 86400, check=True)
        assert 0.0 <= out.onprem_gpu_utilization <= 1.0
        assert 0.0 <= out.worst_window_availability <= out.inference_availability <= 1.0
        # The shortfall's split by cause adds up to what is missing, each part non-negative.
        parts = (out.shortfall_replacing, out.shortfall_starting, out.shortfall_unasked)
        assert min(parts) >= 0.0 and sum(parts) == pytest.approx(1.0 - out.inference_availability, abs=1e-12)
        # The part lost while the virtual nodes were full is a part of that shortfall.
        assert 0.0 <= out.shortfall_external_full <= sum(parts) + 1e-12


def quiet_and_exact(model: ClusterModel, workload: Workload, policy: Policy,
                    check: bool = False) -> tuple[list[Simulator], Outcome, Outcome]:
    """The small stack's half day run twice, skipping quiet ticks and deciding on every one: the outcomes must be
    equal (but for the decision counts), and the quiet run must have skipped some. Returns the two simulators and
    their outcomes."""
    sims = [Simulator(model, workload, policy, 0.5 * 86400, 0.25 * 86400, check=check, exact_ticks=exact)
            for exact in (False, True)]
    quiet, exact = (sim.run() for sim in sims)
    keep = ("decide_calls", "decide_skipped", "runtime_s")
    assert {k: v for k, v in quiet.summary().items() if k not in keep} == {
        k: v for k, v in exact.summary().items() if k not in keep}
    assert quiet.decide_skipped > 0 and exact.decide_skipped == 0
    return sims, quiet, exact


def test_same_seed_same_outcome_and_quiet_ticks_change_nothing() -> None:
    model, settings, workload = small_stack()
    policy = Policy("controller", CONTROLLER, settings, model.descheduler)
    assert settings.handover_services  # the stack's default: the handover is on
    sims = [Simulator(model, workload, policy, 0.5 * 86400, 0.25 * 86400, exact_ticks=exact)
            for exact in (False, False, True)]
    runs = [sim.run() for sim in sims]
    keep = ("decide_calls", "decide_skipped", "runtime_s")
    a, b, c = ({k: v for k, v in r.summary().items() if k not in keep} for r in runs)
    assert a == b == c
    assert runs[0].samples == runs[2].samples
    assert runs[0].decide_skipped > 0 and runs[2].decide_skipped == 0
    # The handover was exercised, identically: gangs gated and released, standby scaled up and down.
    stats = [(sim.controller.stats.standby_scales, sim.controller.stats.ungates) for sim in sims if sim.controller]
    assert stats[0] == stats[1] == stats[2] and min(stats[0]) > 0 and runs[0].standby_gpu_hours > 0
    other = default_workload(model, 0.75, seed=8, warmup_days=0.25)
    assert generate([("p", 4)], ["s"], 86400.0, 7) == generate([("p", 4)], ["s"], 86400.0, 7)
    assert other.gangs != workload.gangs


def test_quiet_ticks_change_nothing_with_the_ramp_cover_on() -> None:
    """The ramp moves with the clock while a replica count changed within its window: the adapter then runs
    every tick, so skipping the others still gives the exact outcome, and the ramp's standby is exercised."""
    model, settings, workload = small_stack()
    ramping = settings.replace(handover=settings.handover.replace(ramp_seconds=180.0))
    policy = Policy("controller", CONTROLLER, ramping, model.descheduler)
    _, quiet, _ = quiet_and_exact(model, workload, policy)
    base = simulate(model, workload, Policy("controller", CONTROLLER, settings, model.descheduler), 0.5 * 86400,
                    0.25 * 86400)
    assert quiet.standby_gpu_hours > base.standby_gpu_hours  # the ramp's part of the standby ran


def test_prod_stack_settings_reach_the_simulation() -> None:
    setup = load_stack("prod")
    s = setup.settings
    assert (s.open_below_free_gpus, s.close_at_free_gpus, s.open_hold_seconds, s.close_hold_seconds) == (
        16, 64, 60.0, 900.0)
    assert setup.model.descheduler == DeschedulerLimits(60.0, 8, 16, 16, 600.0)
    assert setup.model.onprem_gpus == 2048
    assert setup.model.queue_per_pool  # two pools: one training queue each, as the stack deploys
    assert [(p.node_name, p.gpus) for p in setup.model.providers] == [("vk-lambda-east", 256), ("vk-dr-cluster", 128)]
    assert [s.name for s in setup.model.services] == ["sdxl-turbo", "llama-70b-chat", "whisper-large"]
    big = setup.model.scaled_to(4096)
    assert big.onprem_gpus == 4096 and big.providers[0].gpus == 512


def test_cron_intervals() -> None:
    assert cron_interval_seconds("*/2 * * * *") == 120.0
    assert cron_interval_seconds("* * * * *") == 60.0
    assert cron_interval_seconds("0,20,40 * * * *") == 1200.0
    with pytest.raises(ValueError, match=r"descheduler\.schedule: only minute-level"):
        cron_interval_seconds("0 */2 * * *")


def test_trace_file(tmp_path: Path) -> None:
    trace = tmp_path / "trace.json"
    trace.write_text(json.dumps({"gangs": [{"arrival_s": 1000, "nodes": 1, "duration_s": 3600, "pool": "gpu"}]}))
    workload = load_trace(trace, FLAT)
    assert workload.gangs == JOB.gangs
    out = simulate(ONE, workload, no_burst(), 6000.0)
    assert out.preemptions == 2
    trace.write_text(json.dumps({"gangs": [{"arrival_s": 1}]}))
    with pytest.raises(ValueError, match="bad trace entry"):
        load_trace(trace)


def test_bench_runner_reports_a_failing_benchmark(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import sys
    import types

    from bench import run as bench_run

    good = types.ModuleType("bench.bench_good")
    good.run = lambda: {"name": "good", "sizes": {"1": {"ms": 2.0}, "4": {"ms": 3.5}}}  # type: ignore[attr-defined]
    bad = types.ModuleType("bench.bench_bad")

    def boom() -> dict[str, object]:
        raise RuntimeError("exporter did not start")

    bad.run = boom  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "bench.bench_good", good)
    monkeypatch.setitem(sys.modules, "bench.bench_bad", bad)
    monkeypatch.setattr(bench_run, "discover", lambda: ["bench.bench_bad", "bench.bench_good"])
    assert bench_run.main(["--out-dir", str(tmp_path)]) == 1
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["benchmarks"]["bench_bad"]["status"] == "failed"
    assert report["benchmarks"]["bench_bad"]["error"] == "RuntimeError: exporter did not start"
    assert report["benchmarks"]["bench_good"]["result"]["sizes"]["4"] == {"ms": 3.5}
    md = (tmp_path / "report.md").read_text()
    assert "## bench_bad — failed" in md and "FAILED:\n\n```text\nRuntimeError: exporter did not start\n```" in md
    assert "| sizes | ms |" in md and "| 4 | 3.5 |" in md
    assert "failed: 1 (bench_bad)" in md


def test_bench_merge_reruns_only_the_named_modules_and_keeps_the_rest(monkeypatch: pytest.MonkeyPatch,
                                                                       tmp_path: Path) -> None:
    import sys
    import types

    from bench import run as bench_run

    runs = {"slow": 0, "e2e": 0}

    def module(name: str, value: int) -> types.ModuleType:
        mod = types.ModuleType(f"bench.bench_{name}")

        def run() -> dict[str, object]:
            runs[name] += 1
            return {"name": name, "value": value + runs[name]}

        mod.run = run  # type: ignore[attr-defined]
        return mod

    monkeypatch.setitem(sys.modules, "bench.bench_slow", module("slow", 10))
    monkeypatch.setitem(sys.modules, "bench.bench_e2e_x", module("e2e", 20))
    monkeypatch.setattr(bench_run, "discover", lambda: ["bench.bench_e2e_x", "bench.bench_slow"])
    assert bench_run.main(["--out-dir", str(tmp_path)]) == 0
    first = json.loads((tmp_path / "report.json").read_text())
    assert bench_run.main(["--out-dir", str(tmp_path), "--only", "bench_e2e_x", "--merge"]) == 0
    merged = json.loads((tmp_path / "report.json").read_text())
    assert runs == {"slow": 1, "e2e": 2}
    assert list(merged["benchmarks"]) == ["bench_e2e_x", "bench_slow"]  # the report's order, not the run's
    assert merged["benchmarks"]["bench_slow"] == first["benchmarks"]["bench_slow"]
    assert merged["benchmarks"]["bench_e2e_x"]["result"]["value"] == 22
    assert merged["benchmarks"]["bench_e2e_x"]["measured"] == merged["generated"]
    md = (tmp_path / "report.md").read_text()
    assert f"## bench_slow — ok ({first['benchmarks']['bench_slow']['seconds']} s, measured {first['generated']})" in md
    # Without --only there is nothing to keep, and without a report there is nothing to merge into.
    with pytest.raises(SystemExit):
        bench_run.main(["--out-dir", str(tmp_path), "--merge"])
    with pytest.raises(SystemExit):
        bench_run.main(["--out-dir", str(tmp_path / "empty"), "--only", "bench_e2e_x", "--merge"])


def test_bench_discovers_every_benchmark_module() -> None:
    from bench import run as bench_run

    names = bench_run.discover()
    assert "bench.bench_sim" in names
    assert names == sorted(names) and all(n.startswith("bench.bench_") for n in names)


def _training_only(pools: tuple[PoolModel, ...], gate: bool) -> ClusterModel:
    return ClusterModel(pools=pools, providers=(), services=(), descheduler=ONE.descheduler, enqueue_gate=gate)


def test_enqueue_gate_decides_which_queued_training_counts_as_pending() -> None:
    gangs = (Gang(0.0, 2, 1000.0, "gpu"), Gang(10.0, 1, 100.0, "gpu"))
    workload = Workload(gangs, (), FLAT)
    for gate, pending in ((True, 0), (False, 8)):
        sim = Simulator(_training_only((PoolModel("gpu", 2, 8),), gate), workload, no_burst(), 20.0, check=True)
        sim.run()
        # The second gang waits either way; only with pods created (no gate) does it count as pending.
        assert (sim.train_gpus, sim.pending_training_gpus()) == (16, pending)
    out = simulate(_training_only((PoolModel("gpu", 2, 8),), True), workload, no_burst(), 2000.0, check=True)
    assert out.gangs_admitted == 2
    assert out.gang_wait_hours_mean == pytest.approx((0 + 990) / 2 / 3600)


def test_one_training_queue_over_two_pools_idles_the_other_pool() -> None:
    # A-1 runs on pool a; A-2 (pool a) is Inqueue and holds the queue's room; B-1 (pool b) cannot be
    # enqueued although pool b is empty: the cost of one Volcano queue spanning two pools.
    gangs = (Gang(0.0, 1, 1000.0, "a"), Gang(1.0, 1, 1000.0, "a"), Gang(2.0, 1, 1000.0, "b"))
    model = _training_only((PoolModel("a", 1, 8), PoolModel("b", 1, 8)), True)
    sim = Simulator(model, Workload(gangs, (), FLAT), no_burst(), 500.0, check=True)
    sim.run()
    assert (sim.train_gpus, sim.pending_training_gpus(), list(sim.waiting)) == (8, 8, [2])
    ungated = Simulator(replace(model, enqueue_gate=False), Workload(gangs, (), FLAT), no_burst(), 500.0)
    ungated.run()
    assert (ungated.train_gpus, ungated.pending_training_gpus()) == (16, 8)


def test_one_training_queue_per_pool_admits_the_idle_pools_gang() -> None:
    # Same gangs, one queue per pool: B-1 has its own pool's room and starts at once; A-2 finds pool a's
    # queue full (A-1 holds its capability), so it is not Inqueue and has no pods yet.
    gangs = (Gang(0.0, 1, 1000.0, "a"), Gang(1.0, 1, 1000.0, "a"), Gang(2.0, 1, 1000.0, "b"))
    model = replace(_training_only((PoolModel("a", 1, 8), PoolModel("b", 1, 8)), True), queue_per_pool=True)
    sim = Simulator(model, Workload(gangs, (), FLAT), no_burst(), 500.0, check=True)
    sim.run()
    assert (sim.train_gpus, sim.pending_training_gpus(), list(sim.waiting)) == (16, 0, [1])
    assert sim.pool_gpus() == {"a": (0, 0), "b": (0, 0)}
    out = simulate(model, Workload(gangs, (), FLAT), no_burst(), 3000.0, check=True)
    assert out.gangs_admitted == 3
    assert out.gang_wait_hours_mean == pytest.approx((0 + 999 + 0) / 3 / 3600)


def test_the_core_sees_pending_training_per_pool() -> None:
    # One queue over two pools: A-2 is Inqueue for full pool a while pool b is idle. Fed per pool, the core
    # nets A-2 against pool a only (8 effective free GPUs); fed cluster-wide totals, against everything (0).
    gangs = (Gang(0.0, 1, 1000.0, "a"), Gang(1.0, 1, 1000.0, "a"), Gang(2.0, 1, 1000.0, "b"))
    model = _training_only((PoolModel("a", 1, 8), PoolModel("b", 1, 8)), True)
    for per_pool, pools, effective in ((True, {"a": core.PoolGpus(0, 8), "b": core.PoolGpus(8, 0)}, 8),
                                       (False, {}, 0)):
        policy = replace(OURS, pool_accounting=per_pool)
        sim = Simulator(model, Workload(gangs, (), FLAT), policy, 500.0, check=True)
        sim.run()
        assert sim.controller is not None
        snapshot = sim.controller.snapshot(500.0)
        assert (snapshot.onprem_free_gpus, snapshot.pending_training_gpus, dict(snapshot.pools)) == (8, 8, pools)
        assert core.effective_free_gpus(snapshot) == effective


def test_warm_up_is_not_measured() -> None:
    out = Simulator(ONE, JOB, OURS, 4000.0, warmup_s=2000.0, check=True).run()
    # Measured period 2000-6000 s: the preemption (1000 s) and the open flip (1030 s) fall in the warm-up.
    assert (out.preemptions, out.descheduler_evictions, out.taint_flips, out.node_taint_patches) == (0, 2, 1, 1)
    assert out.inference_availability == 1.0
    assert out.external_gpu_hours == pytest.approx((2 * (4740 - 2000) + 60) / 3600)
    assert out.training_gpu_utilization == pytest.approx(8 * (4600 - 2000) / (8 * 4000))


# The handover on the one-node cluster: the service (minReplicas 2) is protected, the gate times out after 300 s.
HANDOVER = SETTINGS.replace(handover_services={"svc": 2},
                            handover=SETTINGS.handover.replace(timeout_seconds=300.0))
WITH_HANDOVER = replace(OURS, settings=HANDOVER)


class LowestReady(Simulator):
    """Records the fewest ready replicas (main + standby) the service had after any event once it first started."""

    lowest = 1 << 30

    def check(self) -> None:
        super().check()
        if self.now > ONE.latencies.onprem_start_s:
            svc = self.services[0]
            self.lowest = min(self.lowest, len(svc.ready) + len(svc.sb_ready))


def _spied(sim: Simulator, monkeypatch: pytest.MonkeyPatch) -> list[tuple[float, core.Snapshot, core.Decision]]:
    seen: list[tuple[float, core.Snapshot, core.Decision]] = []

    def spy(snapshot: core.Snapshot, state: core.BurstState, now: float, settings: BurstSettings) -> core.Decision:
        decision = core.decide(snapshot, state, now, settings)
        seen.append((now, snapshot, decision))
        return decision

    assert sim.controller is not None
    monkeypatch.setattr(sim.controller, "decide_fn", spy)
    return seen


def _actions(seen: list[tuple[float, core.Snapshot, core.Decision]], kind: core.ActionKind) -> list[tuple[float, int]]:
    return [(now, a.replicas) for now, _, d in seen for a in d.actions if a.kind is kind]


def test_handover_keeps_min_ready_and_starts_the_gang_once_the_standby_is_ready(
        monkeypatch: pytest.MonkeyPatch) -> None:
    sim = LowestReady(ONE, JOB, WITH_HANDOVER, 6000.0, check=True)
    seen = _spied(sim, monkeypatch)
    out = sim.run()
    # 1000 s: the gang is Inqueue behind the gate and needs the node inference holds: standby 2 on the (still
    # tainted) virtual node, Ready at 1180 s; the core lifts the gate at that tick and the gang preempts both
    # main pods, whose external replacements are Ready at 1360 s, when the standby goes back to zero.
    # Closing waits the same way: close hold over at 4900 s, standby Ready at 5080 s, then the descheduler
    # moves the main pods home (5100 s, 5160 s; it leaves the standby alone) and the standby leaves at 5220 s.
    assert sim.lowest == ONE.services[0].min_replicas
    assert out.inference_availability == pytest.approx((6000 - 60) / 6000)  # only the very first start
    lat = ONE.latencies.external_start_s
    assert out.gang_wait_hours_mean * 3600 == pytest.approx(lat)
    ungated = [(now, snap.services["svc"]) for now, snap, d in seen
               if any(a.kind is core.ActionKind.UNGATE for a in d.actions)]
    assert [(now, s.standby_ready, s.main_ready_onprem) for now, s in ungated] == [(1000 + lat, 2, {"gpu": 2})]
    assert _actions(seen, core.ActionKind.SET_STANDBY) == [(1000.0, 2), (1360.0, 0), (4900.0, 2), (5160.0, 1),
                                                           (5220.0, 0)]
    # What the core saw when it asked for the standby: the node by node picture the view keeps.
    first = next(snap for now, snap, _ in seen if now == 1000.0)
    assert first.pools["gpu"] == core.PoolGpus(6, 8, free_nodes={6: 1}, unplaced_pods={8: 1})
    assert [(d.flipped, now) for now, _, d in seen if d.flipped] == [(core.Mode.OPEN, 1060.0),
                                                                     (core.Mode.CLOSED, 4900 + lat)]
    assert (out.preemptions, out.descheduler_evictions) == (2, 2)
    assert out.standby_gpu_hours == pytest.approx((2 * 360 + 260 + 320) / 3600)
    assert out.external_gpu_hours == pytest.approx((2 * (1360 - 1000) + 2 * (5100 - 1180) + 60) / 3600
                                                   + (260 + 320) / 3600)
    svc = sim.services[0]
    assert (svc.sb_replicas, svc.sb_count(), sim.sb_ext_gpus, sim.ext_gpus, list(sim.gated)) == (0, 0, 0, 0, [])
    # The same cluster without the handover: the gang deletes both replicas at once; none ready for 210 s.
    bare = LowestReady(ONE, JOB, OURS, 6000.0, check=True)
    dipped = bare.run()
    assert bare.lowest == 0 and dipped.gang_wait_hours_mean == 0.0
    assert dipped.inference_availability == pytest.approx((6000 - 60 - 210) / 6000)


@pytest.mark.parametrize("room", [(0, 100), (16, 0)], ids=["no-gpu-room", "no-pod-room"])
def test_the_gang_is_released_at_once_when_the_providers_have_no_room_for_the_standby(
        room: tuple[int, int], monkeypatch: pytest.MonkeyPatch) -> None:
    """A standby no provider can hold is as ready as it will ever be: the gate does not wait its timeout for it
    (it did: 300 s of a gang held for nothing, found at scale where the standby outgrew the providers)."""
    model = replace(ONE, providers=(ProviderModel("cloud", "vk-cloud", *room),))
    # Mid-way: the standby is asked for and finds no room; a waiting standby is not pending inference (it is no
    # reason to open the burst), and the gang, released, has taken the replicas' node.
    waiting = Simulator(model, JOB, WITH_HANDOVER, 1100.0, check=True)
    waiting.run()
    assert waiting.controller is not None
    snapshot = waiting.controller.snapshot(1100.0)
    assert snapshot.gated_pods == ()
    assert snapshot.pending_inference_gpus == 2 and snapshot.standby_external_gpus == 0
    assert snapshot.services["svc"] == core.ServiceReplicas(2, main_live=2, main_ready=0, standby_live=2,
                                                           standby_ready=0, standby_unschedulable=2)
    sim = Simulator(model, JOB, WITH_HANDOVER, 6000.0, check=True)
    seen = _spied(sim, monkeypatch)
    out = sim.run()
    released = [(now, d.reasons) for now, _, d in seen if any(a.kind is core.ActionKind.UNGATE for a in d.actions)]
    assert [now for now, _ in released] == [1005.0]  # the first decision after the standby found no room
    assert any("as large as the providers hold" in r for r in released[0][1])
    assert out.gang_wait_hours_mean * 3600 == pytest.approx(5.0)
    assert out.standby_gpu_hours == 0.0 and out.external_gpu_hours == 0.0
    # The replacements wait for the node too; then the standby is no longer wanted.
    assert _actions(seen, core.ActionKind.SET_STANDBY) == [(1000.0, 2), (4665.0, 0)]
    assert (sim.services[0].sb_count(), len(sim.sb_pending)) == (0, 0)


def test_quiet_ticks_match_exact_ticks_through_a_handover() -> None:
    model = replace(ONE, providers=(ProviderModel("cloud", "vk-cloud", 16, 100),))
    runs = [Simulator(model, JOB, WITH_HANDOVER, 6000.0, check=True, exact_ticks=exact) for exact in (False, True)]
    quiet, exact = (r.run() for r in runs)
    keep = ("decide_calls", "decide_skipped", "runtime_s")
    assert {k: v for k, v in quiet.summary().items() if k not in keep} == {
        k: v for k, v in exact.summary().items() if k not in keep}
    assert quiet.standby_gpu_hours > 0 and quiet.decide_skipped > 0 and exact.decide_skipped == 0
    stats = [r.controller.stats for r in runs if r.controller is not None]
    assert [(s.standby_scales, s.ungates, s.flips) for s in stats] == [(5, 1, 2)] * 2


def test_prod_stack_handover_reaches_the_simulation() -> None:
    from components.burst_controller import settings_from_config
    from components.config import parse_config
    from components.mockrt import raw_from_stack

    cfg = parse_config(raw_from_stack("prod"), "Pulumi.prod.yaml")
    deployed = settings_from_config(cfg)
    setup = load_stack("prod")
    s = setup.settings
    assert s.handover_services == deployed.handover_services == {"sdxl-turbo": 8, "llama-70b-chat": 4,
                                                                  "whisper-large": 2}
    assert s.handover.timeout_seconds == deployed.handover.timeout_seconds == 300.0
    policies = {p.name: p for p in all_policies(setup.model, s, WorkloadSpec())}
    assert list(policies) == ["static partition", "no burst", "naive burst", "controller without handover",
                              "controller", "oracle"]
    handed = {name: p.settings.handover_services for name, p in policies.items() if p.settings is not None}
    assert handed == {"naive burst": {}, "controller without handover": {}, "controller": s.handover_services}
    workload = Workload((), (), FLAT)
    sim = Simulator(setup.model, workload, policies["controller"], 30.0)
    sim.run()
    assert sim.handover and sim.controller is not None
    snapshot = sim.controller.snapshot(30.0)
    assert {name: r.min_replicas for name, r in snapshot.services.items()} == s.handover_services
    assert not Simulator(setup.model, workload, policies["controller without handover"], 30.0).handover


def test_the_controller_port_implements_every_method_the_adapter_reads_and_writes() -> None:
    """`port.ControllerPort` is the simulator side of `controller_adapter.ClusterPort` (as its docstring says)."""
    import inspect

    from bench.sim.port import ControllerPort

    wanted = {n for n, v in vars(controller_adapter.ClusterPort).items() if callable(v) and not n.startswith("_")}
    assert wanted, "ClusterPort lists no methods"
    for name in sorted(wanted):
        impl = getattr(ControllerPort, name, None)
        assert callable(impl), f"ControllerPort lacks {name}"
        proto = inspect.signature(getattr(controller_adapter.ClusterPort, name))
        assert list(inspect.signature(impl).parameters) == list(proto.parameters), name
