"""Cluster simulator benchmark: the policy comparison at 4,096 GPUs over 30 simulated days, and run time.

The prod stack's shape (pools, providers, services, burst thresholds, descheduler limits) scaled to 4,096
on-prem GPUs; every policy on the same seeded workload (one warm-up day not measured). Targets, measured
here and never asserted in tests: the controller keeps inference availability >= 99.9 % with on-prem GPU
utilisation >= 97 % and fewer flips and evictions than the naive burst; one 4,096-GPU × 30-day run takes
under 60 s. Run time is reported as wall and CPU seconds: the machine is shared, CPU time is what the
simulator itself costs.

The policy rows run the stack as it deploys (one training queue per pool; the core fed per-pool free and
pending-training GPUs; the make-before-break handover on), and "controller without handover" the same without the
handover, so the two rows show what the standby buys and costs. The "before" row is the product without the
two per-pool changes (handover on), and two rows show each change alone; the HPA headroom row is a
sensitivity (a per-service HPA target), not a stack default.
"""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from bench.sim.engine import Outcome, Simulator
from bench.sim.model import ClusterModel
from bench.sim.policies import all_policies, controller, naive_burst
from bench.sim.report import markdown_table, plot
from bench.sim.run import default_workload, load_stack

STACK = "prod"
GPUS = 4_096
DAYS = 30.0
WARMUP_DAYS = 1.0
SEED = 1
LIGHTER_LOAD = 0.8  # a second workload the scheduler can keep up with: the burst closes and returns
SCALING_SIZES = (1_024, 4_096, 16_384)
SCALING_DAYS = 7.0
PLOT = Path(".state/simulate/bench.png")
KEYS = ("onprem_gpu_utilization", "training_gpu_utilization", "inference_availability",
        "worst_window_availability", "external_gpu_hours", "evictions_per_hour", "taint_flips",
        "preemptions", "descheduler_evictions", "burst_open_share", "return_minutes_mean", "return_minutes_max",
        "gang_wait_hours_mean", "standby_gpu_hours", "events", "decide_calls", "decide_skipped")


def _timed(sim: Simulator) -> tuple[Outcome, float, float]:
    wall, cpu = time.perf_counter(), time.process_time()
    out = sim.run()
    return out, time.perf_counter() - wall, time.process_time() - cpu


def _round(value: Any) -> Any:
    return round(value, 6) if isinstance(value, float) else value


def run() -> dict[str, Any]:
    setup = load_stack(STACK)
    model = setup.model.scaled_to(GPUS)
    workload = default_workload(model, DAYS, SEED, WARMUP_DAYS)
    policies: dict[str, Any] = {}
    controller_outcome: Outcome | None = None
    outcomes: list[Outcome] = []
    for policy in all_policies(model, setup.settings, workload.spec):
        sim = Simulator(model, workload, policy, DAYS * 86400, WARMUP_DAYS * 86400)
        out, wall, cpu = _timed(sim)
        outcomes.append(out)
        row = {k: _round(getattr(out, k)) for k in KEYS}
        row.update(runtime_wall_s=round(wall, 2), runtime_cpu_s=round(cpu, 2),
                   events_per_cpu_second=round(out.events / cpu) if cpu else None)
        policies[policy.name] = row
        if policy.name == "controller":
            controller_outcome = out
    # Before/after: the same workload with one training queue over both pools and the core fed cluster-wide
    # totals (the product before per-pool queues and per-pool accounting), and each change alone.
    one_queue = replace(model, queue_per_pool=False)
    variants: tuple[tuple[str, ClusterModel, bool, float | None], ...] = (
        ("controller (before: one training queue, cluster-wide accounting)", one_queue, False, None),
        ("controller (one training queue, per-pool accounting)", one_queue, True, None),
        ("controller (per-pool queues, cluster-wide accounting)", model, False, None),
        ("controller (HPA headroom 1.3)", model, True, 1.3),
    )
    before: dict[str, Any] = {}
    for label, m, per_pool, headroom in variants:
        w = workload if headroom is None else default_workload(
            m, DAYS, SEED, WARMUP_DAYS, replace(workload.spec, hpa_headroom=headroom))
        policy = replace(controller(m, setup.settings), pool_accounting=per_pool)
        out, wall, cpu = _timed(Simulator(m, w, policy, DAYS * 86400, WARMUP_DAYS * 86400))
        row = {k: _round(getattr(out, k)) for k in KEYS}
        row.update(runtime_wall_s=round(wall, 2), runtime_cpu_s=round(cpu, 2))
        before[label] = row
        outcomes.append(replace(out, policy=label, samples=[]))
    # Sensitivity: the same workload when every queued gang's pods exist at once (no enqueue gate), so the
    # controller sees all queued training as pending.
    ungated_model = replace(model, enqueue_gate=False)
    ungated: dict[str, Any] = {}
    for policy in (naive_burst(ungated_model, setup.settings), controller(ungated_model, setup.settings)):
        out, wall, cpu = _timed(Simulator(ungated_model, workload, policy, DAYS * 86400, WARMUP_DAYS * 86400))
        row = {k: _round(getattr(out, k)) for k in KEYS}
        row.update(runtime_wall_s=round(wall, 2), runtime_cpu_s=round(cpu, 2))
        ungated[policy.name] = row
        outcomes.append(replace(out, policy=f"{policy.name} (no enqueue gate)", samples=[]))
    # A lighter training load on the same cluster: backlogs drain, so hysteresis and return show.
    lighter = default_workload(model, DAYS, SEED, WARMUP_DAYS, replace(workload.spec, training_load=LIGHTER_LOAD))
    light: dict[str, Any] = {}
    for policy in all_policies(model, setup.settings, lighter.spec):
        out, wall, cpu = _timed(Simulator(model, lighter, policy, DAYS * 86400, WARMUP_DAYS * 86400))
        row = {k: _round(getattr(out, k)) for k in KEYS}
        row.update(runtime_wall_s=round(wall, 2), runtime_cpu_s=round(cpu, 2))
        light[policy.name] = row
        outcomes.append(replace(out, policy=f"{policy.name} (training load {LIGHTER_LOAD})", samples=[]))
    scaling: dict[str, Any] = {}
    for gpus in SCALING_SIZES:
        m = setup.model.scaled_to(gpus)
        w = default_workload(m, SCALING_DAYS, SEED, WARMUP_DAYS)
        out, wall, cpu = _timed(Simulator(m, w, controller(m, setup.settings), SCALING_DAYS * 86400,
                                          WARMUP_DAYS * 86400))
        scaling[str(gpus)] = {"days": SCALING_DAYS + WARMUP_DAYS, "events": out.events,
                              "runtime_wall_s": round(wall, 2), "runtime_cpu_s": round(cpu, 2),
                              "events_per_cpu_second": round(out.events / cpu) if cpu else None}
    ours = policies["controller"]
    naive = policies["naive burst"]
    plot_path = None
    if controller_outcome is not None:
        plot_path = str(plot(controller_outcome, model.onprem_gpus, PLOT,
                             f"{GPUS:,} GPUs, {DAYS:g} days: controller (prod settings)"))
    return {
        "name": "cluster_simulation",
        "stack": STACK,
        "gpus": model.onprem_gpus,
        "days": DAYS,
        "warmup_days": WARMUP_DAYS,
        "seed": SEED,
        "training_load": workload.spec.training_load,
        "gangs": len(workload.gangs),
        "policies": policies,
        "queue_per_pool": model.queue_per_pool,
        "variants": before,
        "without_enqueue_gate": ungated,
        "lighter_training_load": {"training_load": LIGHTER_LOAD, "policies": light},
        "scaling": scaling,
        "table_md": markdown_table(outcomes),
        "targets": {
            "availability_at_least_99_9": ours["inference_availability"] >= 0.999,
            "utilization_at_least_97": ours["onprem_gpu_utilization"] >= 0.97,
            "fewer_flips_than_naive": ours["taint_flips"] < naive["taint_flips"],
            "fewer_evictions_than_naive": ours["evictions_per_hour"] < naive["evictions_per_hour"],
            "handover_raises_availability": ours["inference_availability"]
            > policies["controller without handover"]["inference_availability"],
            "run_under_60s_cpu": ours["runtime_cpu_s"] < 60.0,
            "run_under_60s_wall": ours["runtime_wall_s"] < 60.0,
        },
        "plot": plot_path,
    }


def to_markdown(result: dict[str, Any]) -> str:
    lines = [
        f"### Cluster simulation ({result['gpus']:,} on-prem GPUs, {result['days']:g} days after "
        f"{result['warmup_days']:g} warm-up day, seed {result['seed']}, training load {result['training_load']}, "
        f"training queue per pool: {'yes' if result.get('queue_per_pool') else 'no'})",
        "",
        result["table_md"],
        "",
        "| target | met |",
        "|---|---|",
    ]
    lines += [f"| {k} | {'yes' if v else 'NO'} |" for k, v in result["targets"].items()]
    lines += ["", "| policy | events | wall s | CPU s | events/CPU s |", "|---|---|---|---|---|"]
    for name, row in result["policies"].items():
        lines.append(f"| {name} | {row['events']:,} | {row['runtime_wall_s']} | {row['runtime_cpu_s']} | "
                     f"{row['events_per_cpu_second']:,} |")
    lines += ["", f"Run time of the controller policy by cluster size ({SCALING_DAYS:g} + {WARMUP_DAYS:g} days):",
              "", "| GPUs | events | wall s | CPU s | events/CPU s |", "|---|---|---|---|---|"]
    for gpus, row in result["scaling"].items():
        lines.append(f"| {int(gpus):,} | {row['events']:,} | {row['runtime_wall_s']} | {row['runtime_cpu_s']} | "
                     f"{row['events_per_cpu_second']:,} |")
    if result.get("plot"):
        lines += ["", "![GPU use over time](sim.png)"]
    return "\n".join(lines)


if __name__ == "__main__":
    print(json.dumps(run(), indent=2))
