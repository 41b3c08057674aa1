"""Goodput model: Young–Daly, MTBF scaling, calibration, policy effects and the interval check."""

from __future__ import annotations

import itertools
import math
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bench.sim.failures import LLAMA3_CAUSES, Cause, arrivals, node_bound_share
from bench.sim.goodput import (
    POLICIES,
    Backend,
    Environment,
    Policy,
    break_even_restart_s,
    expected_ettr,
    plan,
    simulate,
)
from bench.sim.restart import IN_PLACE_TERMS, RestartModel
from components.config import ClusterConfig, parse_config
from components.failure_rate import LLAMA3_DAYS, LLAMA3_INTERRUPTIONS
from components.goodput_model import (
    interval_findings,
    job_mtbf_seconds,
    off_factor,
    recommend,
    snapshot_seconds,
    summary_rows,
    write_seconds,
    young_daly_seconds,
)
from components.mockrt import raw_from_stack

BACKEND = Backend("weka-ckpt", size_tb=1.0, write_s=1000.0 / 60.0)
KEEP, QUARANTINE, YOUNG_DALY, ASYNC, IN_PLACE, REPLACE_ONE = POLICIES


@pytest.mark.parametrize(("cost_s", "mtbf_s", "expected"), [
    (2.0, 100.0, 20.0),
    (8.0, 400.0, 80.0),
    (0.5, 10_000.0, 100.0),
    (30.0, 3_600.0, math.sqrt(216_000.0)),
])
def test_young_daly_is_sqrt_of_twice_cost_times_mtbf(cost_s: float, mtbf_s: float, expected: float) -> None:
    assert young_daly_seconds(cost_s, mtbf_s) == pytest.approx(expected)


@pytest.mark.parametrize(("cost_s", "mtbf_s"), [(0.0, 100.0), (1.0, 0.0), (-1.0, 100.0)])
def test_young_daly_refuses_non_positive_inputs(cost_s: float, mtbf_s: float) -> None:
    with pytest.raises(ValueError, match="must be positive"):
        young_daly_seconds(cost_s, mtbf_s)


@pytest.mark.parametrize(("gpus", "hours"), [
    (16_384, LLAMA3_DAYS * 24 / LLAMA3_INTERRUPTIONS),  # the calibration run itself: ~3.1 h
    (4_096, 4 * LLAMA3_DAYS * 24 / LLAMA3_INTERRUPTIONS),
    (1_024, 16 * LLAMA3_DAYS * 24 / LLAMA3_INTERRUPTIONS),
    (512, 32 * LLAMA3_DAYS * 24 / LLAMA3_INTERRUPTIONS),
])
def test_job_mtbf_shrinks_in_proportion_to_its_gpus(gpus: int, hours: float) -> None:
    assert job_mtbf_seconds(gpus) / 3600 == pytest.approx(hours)


def _first_order_overhead(interval_s: float, cost_s: float, mtbf_s: float) -> float:
    """Stall share plus expected lost work per failure (half an interval) over the MTBF."""
    return cost_s / interval_s + interval_s / (2 * mtbf_s)


@given(cost_s=st.floats(0.1, 600.0), mtbf_s=st.floats(600.0, 1e7), factor=st.floats(0.05, 20.0))
def test_young_daly_minimises_the_first_order_overhead(cost_s: float, mtbf_s: float, factor: float) -> None:
    best = young_daly_seconds(cost_s, mtbf_s)
    assert _first_order_overhead(best, cost_s, mtbf_s) <= _first_order_overhead(best * factor, cost_s, mtbf_s) * (
        1 + 1e-12)
    # The check's 2× window: at exactly 2× off either way the overhead is 25 % above the optimum's.
    for off in (2.0, 0.5):
        ratio = _first_order_overhead(best * off, cost_s, mtbf_s) / _first_order_overhead(best, cost_s, mtbf_s)
        assert ratio == pytest.approx(1.25)


def test_asynchronous_interval_never_drops_below_one_write() -> None:
    # A checkpoint so large its write outlasts the snapshot optimum: one write in flight at a time.
    rec = recommend(16_384, size_tb=50.0, write_s=900.0)
    assert young_daly_seconds(rec.snapshot_s, rec.mtbf_s) < 900.0
    assert rec.asynchronous_s == 900.0
    assert rec.blocking_s == pytest.approx(math.sqrt(2 * 900.0 * rec.mtbf_s))


def test_snapshot_stall_shrinks_with_more_gpus_sharing_the_state() -> None:
    assert snapshot_seconds(1.0, 1_024) > snapshot_seconds(1.0, 16_384) > 1.0


def test_cause_mix_is_llama3s() -> None:
    shares = {c.name: c.share for c in LLAMA3_CAUSES}
    assert shares["faulty GPU"] == 0.301
    assert shares["HBM3"] == 0.172
    assert shares["network switch/cable"] == 0.084
    assert sum(shares.values()) == pytest.approx(1.0)
    assert node_bound_share() == pytest.approx(0.587 + 0.084)


def test_cause_shares_must_sum_to_one() -> None:
    with pytest.raises(ValueError, match="sum to 1"):
        arrivals(8, 86_400.0, 1, (Cause("a", 0.5, True),))


def test_calibration_interruptions_per_day_at_16384_gpus() -> None:
    days = 3_650.0
    out = simulate(QUARANTINE, 16_384, BACKEND, Environment(), days, seed=1)
    primary = sum(out.by_cause.values())
    assert primary / days == pytest.approx(LLAMA3_INTERRUPTIONS / LLAMA3_DAYS, rel=0.03)  # 7.8 a day
    assert out.interruptions == primary + out.recurrences
    assert out.by_cause["faulty GPU"] / primary == pytest.approx(0.301, abs=0.02)
    assert out.by_cause["HBM3"] / primary == pytest.approx(0.172, abs=0.02)
    found = arrivals(16_384, 30 * 86_400.0, seed=1)
    assert all(a.at_s < b.at_s for a, b in itertools.pairwise(found))


def test_failures_scale_with_gpus() -> None:
    days = 3_650
    small = len(arrivals(1_024, days * 86_400.0, seed=2)) / days
    assert small == pytest.approx(LLAMA3_INTERRUPTIONS / LLAMA3_DAYS / 16, rel=0.06)


def test_same_seed_same_outcome_and_policies_meet_the_same_failures() -> None:
    env = Environment()
    first = simulate(ASYNC, 4_096, BACKEND, env, 120.0, seed=5)
    again = simulate(ASYNC, 4_096, BACKEND, env, 120.0, seed=5)
    assert (first.useful_s, first.interruptions, first.by_cause) == (again.useful_s, again.interruptions,
                                                                     again.by_cause)
    other = simulate(KEEP, 4_096, BACKEND, env, 120.0, seed=5)
    assert other.by_cause == first.by_cause  # primary failures do not depend on the policy


@pytest.mark.parametrize("policy", POLICIES, ids=lambda p: p.name)
def test_wall_time_splits_exactly_into_useful_and_lost(policy: Policy) -> None:
    out = simulate(policy, 16_384, BACKEND, Environment(), 60.0, seed=3)
    assert out.accounted_s == pytest.approx(out.wall_s, rel=1e-9)
    losses = out.lost_gpu_hours_per_day()
    lost_share = sum(losses.values()) / (out.gpus * 24)
    assert lost_share == pytest.approx(1 - out.ettr, rel=1e-6)


@pytest.mark.parametrize("gpus", [1_024, 4_096, 16_384])
@pytest.mark.parametrize("policy", POLICIES, ids=lambda p: p.name)
def test_monte_carlo_matches_the_closed_form_without_recurrence(policy: Policy, gpus: int) -> None:
    env = replace(Environment(), recurrence_p=0.0)
    out = simulate(policy, gpus, BACKEND, env, 730.0, seed=11)
    assert out.recurrences == 0
    assert out.ettr == pytest.approx(expected_ettr(out.plan), abs=0.005)


DECOMPOSED = Environment(restart=RestartModel())


@pytest.mark.parametrize("gpus", [1_024, 4_096, 16_384])
def test_restart_in_place_matches_its_closed_form_and_beats_the_whole_gang_restart(gpus: int) -> None:
    env = replace(DECOMPOSED, recurrence_p=0.0)
    whole = simulate(ASYNC, gpus, BACKEND, env, 730.0, seed=11)
    in_place = simulate(IN_PLACE, gpus, BACKEND, env, 730.0, seed=11)
    assert in_place.by_cause == whole.by_cause  # the same failures
    assert in_place.ettr == pytest.approx(expected_ettr(in_place.plan), abs=0.005)
    assert in_place.ettr > whole.ettr and in_place.restart_lost_s < whole.restart_lost_s
    p = in_place.plan
    assert p.in_place_restart_s is not None and p.in_place_restart_s < p.restart_s
    assert p.in_place_restart_s < p.effective_restart_s < p.restart_s


@pytest.mark.parametrize("gpus", [1_024, 16_384])
def test_replacing_one_node_matches_its_closed_form_and_beats_restarting_the_gang(gpus: int) -> None:
    env = replace(DECOMPOSED, recurrence_p=0.0)
    in_place = simulate(IN_PLACE, gpus, BACKEND, env, 730.0, seed=11)
    one = simulate(REPLACE_ONE, gpus, BACKEND, env, 730.0, seed=11)
    assert one.ettr == pytest.approx(expected_ettr(one.plan), abs=0.005)
    assert one.ettr > in_place.ettr and one.restart_lost_s < in_place.restart_lost_s
    p = one.plan
    assert p.replace_one_restart_s is not None and p.replace_one_restart_s < p.restart_s
    assert p.restart_for(node_bound=True, caught=True) == p.replace_one_restart_s
    assert p.restart_for(node_bound=True, caught=False) == p.in_place_restart_s  # the node stays: in place there
    names = [t.name for t in RestartModel().replace_one_terms(gpus)]
    assert names == ["detection", "eviction", "rescheduling", "container start", "rendezvous + NCCL init",
                     "checkpoint load"]


def test_only_crashes_that_do_not_follow_a_node_restart_in_place() -> None:
    p = plan(IN_PLACE, 16_384, BACKEND, DECOMPOSED)
    assert p.restart_for(node_bound=True) == p.restart_s
    assert p.restart_for(node_bound=False) == p.in_place_restart_s
    assert p.node_bound_share == pytest.approx(node_bound_share(LLAMA3_CAUSES))
    assert plan(ASYNC, 16_384, BACKEND, DECOMPOSED).restart_for(node_bound=False) == p.restart_s
    # Without the decomposed restart nothing tells an in-place restart's time: the whole-gang one.
    assert plan(IN_PLACE, 16_384, BACKEND, Environment()).in_place_restart_s is None


@given(share=st.floats(0.0, 1.0), full=st.floats(1.0, 3_600.0), fraction=st.floats(0.0, 1.0))
def test_the_effective_restart_lies_between_the_two_paths(share: float, full: float, fraction: float) -> None:
    p = replace(plan(IN_PLACE, 16_384, BACKEND, DECOMPOSED), restart_s=full, in_place_restart_s=full * fraction,
                node_bound_share=share)
    assert full * fraction - 1e-6 <= p.effective_restart_s <= full + 1e-6


def test_an_in_place_restart_has_no_eviction_rescheduling_or_container_start() -> None:
    model = RestartModel()
    names = [t.name for t in model.in_place_terms(16_384)]
    assert names == list(IN_PLACE_TERMS)
    whole = {t.name: t.seconds for t in model.terms(16_384)}
    a = model.assumptions
    shard_gb = a.size_tb * 1000 / 16_384
    assert model.in_place_total_s(16_384) == pytest.approx(
        a.inplace_detect_s + a.worker_start_s + whole["rendezvous + NCCL init"] + shard_gb / a.memory_read_gbps)
    assert model.in_place_total_s(16_384) < model.total_s(16_384)


def test_a_gang_whose_pods_stay_reads_its_shards_from_their_memory_and_a_replaced_pod_from_the_shared_copy() -> None:
    model = RestartModel().with_assumptions(memory_read_gbps=0.7, memory_read_basis="measured")
    a = model.assumptions
    shared = {t.name: t for t in model.terms(16_384)}["checkpoint load"]
    kept = {t.name: t for t in model.in_place_terms(16_384)}["checkpoint load"]
    assert kept.seconds == pytest.approx(a.size_tb * 1000 / 16_384 / 0.7) and kept.seconds < shared.seconds
    assert kept.basis == "measured" and "pod's memory" in kept.source
    one = {t.name: t for t in model.replace_one_terms(16_384)}["checkpoint load"]
    new_pod = a.size_tb * 1000 / 16_384 / min(a.read_gbps / a.gpus_per_pod, a.client_link_gbps)
    assert one.seconds == pytest.approx(max(kept.seconds, new_pod)) and one.basis == "measured + scaled"
    # 10 TB over 1,024 ranks is a 9.8 GB shard, over the 8 GB cache: no copy is kept, every rank reads shared.
    big = model.with_assumptions(size_tb=10.0)
    over = {t.name: t for t in big.in_place_terms(1_024)}["checkpoint load"]
    assert over.seconds == {t.name: t for t in big.terms(1_024)}["checkpoint load"].seconds
    assert "over the pod's 8 GB cache" in over.source


def test_a_replacement_that_finds_no_warm_spare_waits_for_a_cold_pull() -> None:
    p = plan(REPLACE_ONE, 16_384, BACKEND, DECOMPOSED)
    assert p.no_spare_restart_s is not None and p.replace_one_restart_s is not None
    assert p.no_spare_restart_s > p.replace_one_restart_s + 400  # a 15 GB image at 30 MB/s
    assert p.restart_for(node_bound=True, caught=True, spare=False) == p.no_spare_restart_s
    assert p.restart_for(node_bound=True, caught=True, spare=True) == p.replace_one_restart_s
    assert p.restart_for(node_bound=False, spare=False) == p.in_place_restart_s  # no node to replace
    count, share = DECOMPOSED.spares(16_384, 8)
    assert (count, round(share, 3)) == (23, 0.955) and p.spare_share == share
    env = replace(DECOMPOSED, recurrence_p=0.0)
    sized = simulate(REPLACE_ONE, 16_384, BACKEND, env, 730.0, seed=3)
    no_spares = simulate(REPLACE_ONE, 16_384, BACKEND, replace(env, spare_coverage=0.01), 730.0, seed=3)
    assert no_spares.plan.spare_share < sized.plan.spare_share
    assert no_spares.ettr < sized.ettr and no_spares.restart_lost_s > sized.restart_lost_s
    for out in (sized, no_spares):
        assert out.ettr == pytest.approx(expected_ettr(out.plan), abs=0.005)


def test_async_checkpoints_cut_stall_loss_and_raise_ettr() -> None:
    env = Environment()
    blocking = simulate(YOUNG_DALY, 16_384, BACKEND, env, 365.0, seed=1)
    asynchronous = simulate(ASYNC, 16_384, BACKEND, env, 365.0, seed=1)
    assert asynchronous.plan.stall_s < blocking.plan.stall_s
    assert (asynchronous.lost_gpu_hours_per_day()["checkpoint stalls"]
            < blocking.lost_gpu_hours_per_day()["checkpoint stalls"])
    assert asynchronous.ettr > blocking.ettr


def test_async_loses_the_uncommitted_interval_when_a_failure_lands_during_the_write() -> None:
    # Same interval and stall, only the commit lag differs: the lag can only add lost work.
    env = replace(Environment(), recurrence_p=0.0)
    p = plan(ASYNC, 16_384, BACKEND, env)
    assert p.commit_lag_s == BACKEND.write_s
    assert expected_ettr(p) < expected_ettr(replace(p, commit_lag_s=0.0))


def test_quarantine_cuts_bad_node_recurrence() -> None:
    env = Environment()
    kept = simulate(KEEP, 4_096, BACKEND, env, 365.0, seed=1)
    quarantined = simulate(QUARANTINE, 4_096, BACKEND, env, 365.0, seed=1)
    assert quarantined.recurrences < kept.recurrences / 4
    assert (quarantined.lost_gpu_hours_per_day()["bad-node recurrence"]
            < kept.lost_gpu_hours_per_day()["bad-node recurrence"] / 4)
    assert quarantined.ettr > kept.ettr


def test_young_daly_beats_an_hourly_interval_at_16384_gpus() -> None:
    env = Environment()
    hourly = simulate(QUARANTINE, 16_384, BACKEND, env, 365.0, seed=1)
    optimum = simulate(YOUNG_DALY, 16_384, BACKEND, env, 365.0, seed=1)
    assert optimum.plan.interval_s == pytest.approx(young_daly_seconds(BACKEND.write_s, job_mtbf_seconds(16_384)))
    assert optimum.ettr > hourly.ettr
    assert optimum.lost_gpu_hours_per_day()["lost work"] < hourly.lost_gpu_hours_per_day()["lost work"]


def test_break_even_restart_reproduces_the_target() -> None:
    p = plan(ASYNC, 16_384, BACKEND, Environment())
    limit = break_even_restart_s(p, 0.97)
    assert limit is not None
    assert expected_ettr(p, restart_s=limit) == pytest.approx(0.97)
    hourly = plan(QUARANTINE, 16_384, BACKEND, Environment())
    assert break_even_restart_s(hourly, 0.97) is None  # not even an instant restart reaches it


# --------------------------------------------------------------------------- the stack check


def _prod(interval_seconds: float | None = None, **job: Any) -> ClusterConfig:
    raw = raw_from_stack("prod")
    jobs = [dict(j) for j in raw["training"]["jobs"]]
    checkpoint = dict(jobs[0]["checkpoint"])
    if interval_seconds is not None:
        checkpoint["intervalSeconds"] = interval_seconds
    jobs[0] = {**jobs[0], **job, "checkpoint": checkpoint}
    raw["training"] = {**raw["training"], "jobs": jobs}
    return parse_config(raw, "Pulumi.prod.yaml")


def _optimum(cfg: ClusterConfig) -> float:
    job = cfg.training.jobs[0]
    assert job.checkpoint is not None
    rec = recommend(job.workers * job.gpus_per_worker, cfg.checkpoint.budget.size_tb,
                    write_seconds(cfg, job.checkpoint.filesystem))
    return rec.asynchronous_s


def test_write_time_comes_from_the_sizing_code() -> None:
    cfg = _prod()
    assert write_seconds(cfg, "weka-ckpt") == pytest.approx(1000.0 / 60.0)  # 1 TB at 60 GB/s
    assert write_seconds(cfg, "vast-ckpt") == pytest.approx(1000.0 / 40.0)


@pytest.mark.parametrize("factor", [0.55, 1.0, 1.9])
def test_no_warning_within_twice_the_optimum(factor: float) -> None:
    optimum = _optimum(_prod())
    assert interval_findings(_prod(interval_seconds=round(optimum * factor))) == []


@pytest.mark.parametrize(("factor", "direction"), [(2.5, "longer"), (0.4, "shorter"), (6.0, "longer")])
def test_warning_beyond_twice_the_optimum(factor: float, direction: str) -> None:
    optimum = _optimum(_prod())
    declared = round(optimum * factor)
    [(path, message, value)] = interval_findings(_prod(interval_seconds=declared))
    assert path == "training.jobs[0].checkpoint.intervalSeconds"
    assert value == declared
    assert message.startswith(f"job 'llm-pretrain-70b' intervalSeconds {declared} is ")
    assert f"× {direction} than the optimum {optimum:.0f} s for 512 GPUs" in message
    assert "write 17 s to 'weka-ckpt'" in message


def test_optimum_follows_the_jobs_size() -> None:
    small, large = _optimum(_prod()), _optimum(_prod(workers=124))  # the pool but its warm spares
    assert large < small  # twice the GPUs: shorter MTBF, shorter interval


def test_off_factor_is_symmetric() -> None:
    assert off_factor(200.0, 100.0) == off_factor(50.0, 100.0) == 2.0


def test_preview_row_says_what_is_needed_when_only_steps_are_declared() -> None:
    rows = dict(summary_rows(_prod()))
    row = rows["checkpoint interval llm-pretrain-70b"]
    assert row.startswith("512 GPUs, MTBF 99.0 h, 'weka-ckpt' write 17 s: asynchronous ")
    assert row.endswith("declares 250 steps: set intervalSeconds (CHECKPOINT_INTERVAL_SECONDS) to compare")


def test_preview_row_flags_an_interval_far_off() -> None:
    optimum = _optimum(_prod())
    rows = dict(summary_rows(_prod(interval_seconds=round(optimum * 4))))
    assert rows["checkpoint interval llm-pretrain-70b"].endswith("WARN more than 2× off")


def test_checkpoint_component_logs_the_interval_warning() -> None:
    from components.checkpoint import CheckpointStorageArgs

    optimum = _optimum(_prod())
    warned = CheckpointStorageArgs.from_config(_prod(interval_seconds=round(optimum * 3))).warnings
    assert next(w for w in warned if "intervalSeconds" in w).startswith(
        "training.jobs[0].checkpoint.intervalSeconds: job 'llm-pretrain-70b' intervalSeconds ")
    assert not [w for w in CheckpointStorageArgs.from_config(_prod()).warnings if "intervalSeconds" in w]
