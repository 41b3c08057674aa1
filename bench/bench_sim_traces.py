"""Trace replay (issue 17): every policy on the synthetic workload and on the GenTD26 trace, side by side.

4,096 on-prem GPUs (the prod stack's shape scaled), 30 measured days after one warm-up day. Both workloads
share the seeded synthetic training gangs; the trace row replaces the generated inference demand by the
GenTD26 Stable Diffusion request log carried in bench/traces/ (shape from the trace, peak at 80 % of each
service's maxReplicas; 23 days looped to 31). Targets of issue 17 are measured here, never asserted in
tests: availability >= 99.95 %, worst 5 minutes >= 95 %, external GPU·h <= 1.3x the oracle's, on-prem
utilisation within 1 point of the oracle's, taint flips <= half the naive burst's.

Where no policy can meet a target, the report says so. The zero-lag oracle bounds the GPU·h; for
availability its zero start time makes it no bound, so the services alone (no training, every replica on
idle on-prem GPUs, the same HPAs) bound it instead: a target they miss is out of reach of every policy that
reacts to demand with the replicas the HPAs ask for. A second oracle row keeps the HPA headroom of the
other policies (bench/sim/cost.py), the fairer bound for the external GPU·h. Each target the controller
misses names what bounds it: availability and the worst 5 minutes the external start (a second controller
run with a 60 s start shows how far that moves them) and the services' own bound, the external GPU·h and
on-prem utilisation the HPA headroom and where the controller's external GPU·h go.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from agents.burst_controller.contract import BurstSettings
from bench.sim.cost import ORACLE_AT_HEADROOM, bill_lines, oracle_at_headroom, prices_from_config, run_costed
from bench.sim.demand import apply_traces, outcomes_json
from bench.sim.engine import Outcome
from bench.sim.model import ClusterModel, Latencies
from bench.sim.policies import all_policies, controller
from bench.sim.report import markdown_table
from bench.sim.run import INFERENCE_ALONE, default_workload, inference_alone, load_stack
from bench.sim.workload import Workload
from components.config import load_stack as validated_stack
from components.config import stack_path

STACK = "prod"
GPUS = 4_096
DAYS = 30.0
WARMUP_DAYS = 1.0
SEED = 1
TRACE = Path(__file__).resolve().parent / "traces" / "gentd26-sd-requests.csv.gz"
#: The external start the bound run assumes (the model's default is 180 s).
FAST_START_S = 60.0
DEFAULT_START_S = Latencies().external_start_s
ONPREM_START_S = Latencies().onprem_start_s


def targets(policies: dict[str, dict[str, Any]], fast: dict[str, Any] | None = None,
            alone: dict[str, Any] | None = None) -> dict[str, dict[str, Any]]:
    """Each issue-17 target for the controller: its figure, the bound, met, whether it is possible at all, and
    for a miss what bounds it (`fast`: the controller's figures with a FAST_START_S external start; `alone`:
    the services without training, which bounds availability for every policy that reacts to demand)."""
    ours, oracle, naive = policies["controller"], policies["oracle"], policies["naive burst"]
    fair = policies.get(ORACLE_AT_HEADROOM, {})
    out: dict[str, dict[str, Any]] = {}

    def put(name: str, value: float, bound: float, met: bool, possible: bool, why: str = "") -> None:
        out[name] = {"controller": round(value, 6), "bound": round(bound, 6), "met": met,
                     "possible": possible, "bounded_by": "" if met else why}

    start = (f"the {DEFAULT_START_S:g} s external start: with {FAST_START_S:g} s the controller reaches "
             f"{fast['inference_availability']:.3%} availability, {fast['worst_window_availability']:.1%} in "
             "its worst 5 minutes") if fast else f"the {DEFAULT_START_S:g} s external start"
    if "shortfall_starting" in ours:
        start += (f"; of the {1 - ours['inference_availability']:.3%} missing, {ours['shortfall_starting']:.3%} wait "
                  f"for scale-ups to start, {ours['shortfall_replacing']:.3%} for replacements of replicas taken "
                  f"away, {ours['shortfall_unasked']:.3%} were not asked for")
    if alone is not None:
        start += (f"; the demand's jumps beyond the HPA headroom during a {ONPREM_START_S:g} s on-prem start: the "
                  f"services alone on idle GPUs reach {alone['inference_availability']:.3%}, "
                  f"{alone['worst_window_availability']:.1%} in their worst 5 minutes")

    def reachable(key: str, bound: float) -> bool:
        # The zero-lag oracle meets every availability target; a policy whose pods take time to start meets
        # one at the services' HPA settings only if the services alone, without training, do.
        return oracle[key] >= bound and (alone is None or alone[key] >= bound)

    put("availability >= 99.95 %", ours["inference_availability"], 0.9995,
        ours["inference_availability"] >= 0.9995, reachable("inference_availability", 0.9995), start)
    put("worst 5 min >= 95 %", ours["worst_window_availability"], 0.95,
        ours["worst_window_availability"] >= 0.95, reachable("worst_window_availability", 0.95), start)
    oracle_ext = oracle["external_gpu_hours"]
    ratio = ours["external_gpu_hours"] / oracle_ext if oracle_ext else 0.0
    headroom = fair.get("external_gpu_hours", 0.0) / oracle_ext if oracle_ext else 0.0
    where = (f"HPA headroom: the oracle at the same headroom needs {headroom:.2f}x; of the controller's "
             f"{ours['external_gpu_hours']:,.0f} GPU·h, {ours.get('movable_gpu_hours', 0.0):,.0f} wait on open "
             f"virtual nodes while on-prem has room (of it, {ours.get('movable_past_queue_gpu_hours', 0.0):,.0f} "
             "past the training still queued, which claims the rest), "
             f"{ours.get('standby_gpu_hours', 0.0):,.0f} are the standby, "
             f"{ours.get('returning_gpu_hours', 0.0):,.0f} wait for the descheduler")
    put("external GPU·h <= 1.3x oracle", ratio, 1.3, ratio <= 1.3, True, where)
    gap = oracle["onprem_gpu_utilization"] - ours["onprem_gpu_utilization"]
    put("on-prem util within 1 point of oracle", gap, 0.01, gap <= 0.01, True,
        "the replicas that stay external while on-prem has room (above)")
    put("taint flips <= half naive", ours["taint_flips"], naive["taint_flips"] / 2,
        ours["taint_flips"] <= naive["taint_flips"] / 2, True, "hysteresis band and holds")
    return out


def price_ranking(model: ClusterModel, settings: BurstSettings, workload: Workload,
                  prices: Mapping[str, float | None], ranked: dict[str, Any]) -> dict[str, dict[str, float]]:
    """What each half of the provider ranking saves: the controller with no ranking at all (providers filled
    in configured order, one deletion cost), with the placement ranking only, and with both (`ranked`)."""
    unpriced = replace(model, providers=tuple(replace(p, price_per_gpu_hour=None) for p in model.providers))
    one_cost = settings.replace(provider_deletion_costs={})
    runs = {"unranked": (unpriced, one_cost), "placement only": (model, one_cost)}
    keys = ("inference_availability", "external_gpu_hours")
    out: dict[str, dict[str, float]] = {}
    for label, (m, s) in runs.items():
        (outcome, bill), = run_costed(m, workload, [controller(m, s)], DAYS * 86400, WARMUP_DAYS * 86400, prices)
        out[label] = {k: round(getattr(outcome, k), 6) for k in keys} | {"cost_usd": round(bill.cost, 2)}
    out["placement and deletion order"] = {k: ranked[k] for k in keys} | {"cost_usd": round(ranked["cost_usd"], 2)}
    return out


def run() -> dict[str, Any]:
    setup = load_stack(STACK)
    model = setup.model.scaled_to(GPUS)
    synthetic = default_workload(model, DAYS, SEED, WARMUP_DAYS)
    prices = prices_from_config(validated_stack(stack_path(STACK)))
    trace = Path(os.path.relpath(TRACE))  # the report names the carried file as a reader finds it
    replay, lines = apply_traces(STACK, model, synthetic, trace, None, (DAYS + WARMUP_DAYS) * 86400.0)
    workloads: dict[str, Any] = {}
    tables: dict[str, str] = {}
    for name, workload in (("synthetic", synthetic), ("GenTD26 trace", replay)):
        policies_run = [*all_policies(model, setup.settings, workload.spec), oracle_at_headroom(model)]
        results = run_costed(model, workload, policies_run, DAYS * 86400, WARMUP_DAYS * 86400, prices)
        outcomes: list[Outcome] = [o for o, _ in results]
        figures = outcomes_json(outcomes)
        for o, b in results:
            figures[o.policy] |= {"cost_usd": b.cost, "external_gpu_hours_by_provider": dict(b.gpu_hours)}
        policies: dict[str, dict[str, Any]] = {
            k: {f: (round(v, 6) if isinstance(v, float) else v) for f, v in row.items()} for k, row in figures.items()}
        oracle_ext = policies["oracle"]["external_gpu_hours"]
        fair_ext = policies[ORACLE_AT_HEADROOM]["external_gpu_hours"]
        for row in policies.values():
            row["external_vs_oracle"] = round(row["external_gpu_hours"] / oracle_ext, 3) if oracle_ext else None
            row["external_vs_oracle_at_headroom"] = (
                round(row["external_gpu_hours"] / fair_ext, 3) if fair_ext else None)
        tables[name + " (cost)"] = "\n".join(["```text", *bill_lines(results), "```"])
        quick = replace(model, latencies=replace(model.latencies, external_start_s=FAST_START_S))
        (fast_outcome, _), = run_costed(quick, workload, [controller(quick, setup.settings)], DAYS * 86400,
                                        WARMUP_DAYS * 86400, prices)
        fast = outcomes_json([fast_outcome])["controller"]
        alone = outcomes_json([inference_alone(model, workload, DAYS, WARMUP_DAYS)])[INFERENCE_ALONE]
        bounds = ("inference_availability", "worst_window_availability")
        workloads[name] = {"policies": policies, "targets": targets(policies, fast, alone),
                           "controller_at_fast_start": {k: fast[k] for k in (*bounds, "external_gpu_hours")},
                           "inference_alone": {k: alone[k] for k in bounds},
                           "price_ranking": price_ranking(model, setup.settings, workload, prices,
                                                          policies["controller"])}
        tables[name] = markdown_table(outcomes) + "\n\n" + tables.pop(name + " (cost)")
    return {
        "name": "cluster_simulation_traces",
        "stack": STACK,
        "gpus": model.onprem_gpus,
        "days": DAYS,
        "warmup_days": WARMUP_DAYS,
        "seed": SEED,
        "trace": str(TRACE.relative_to(TRACE.parent.parent.parent)),
        "trace_report": lines,
        "workloads": workloads,
        "tables_md": tables,
    }


def to_markdown(result: dict[str, Any]) -> str:
    lines = [f"### Synthetic vs production trace ({result['gpus']:,} on-prem GPUs, {result['days']:g} days after "
             f"{result['warmup_days']:g} warm-up day, seed {result['seed']})", "", "```text",
             *result["trace_report"], "```"]
    for name, table in result["tables_md"].items():
        lines += ["", f"**{name}**", "", table, "",
                  "| target (controller) | figure | bound | met | reachable | bounded by |",
                  "|---|---|---|---|---|---|"]
        for target, t in result["workloads"][name]["targets"].items():
            lines.append(f"| {target} | {t['controller']:g} | {t['bound']:g} | {'yes' if t['met'] else 'NO'} | "
                         f"{'yes' if t['possible'] else 'no: the workload and the HPA headroom bound it'} | "
                         f"{t.get('bounded_by') or '–'} |")
        ranking = result["workloads"][name].get("price_ranking")
        if ranking:
            lines += ["", "| controller, providers ranked by price | availability | external GPU·h | cost USD |",
                      "|---|---|---|---|"]
            lines += [f"| {label} | {r['inference_availability']:.3%} | {r['external_gpu_hours']:,.0f} | "
                      f"{r['cost_usd']:,.0f} |" for label, r in ranking.items()]
    return "\n".join(lines)


if __name__ == "__main__":
    print(json.dumps(run(), indent=2))
