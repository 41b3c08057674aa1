"""Goodput benchmark: ETTR and lost GPU·hours per day by cause at 1,024 / 4,096 / 16,384 GPUs, per policy.

One job spans the whole cluster, writes the prod stack's checkpoint (the budget's size) to the filesystem
its training job mounts, and meets interruptions calibrated on Llama 3 405B (``bench/sim/failures.py``).
The four policies run side by side on the same seeded failures: keep the node in service (hourly blocking
checkpoints, the baseline), let it crash with quarantine, that plus the Young–Daly interval, that plus
asynchronous checkpoints. Target, measured here and never asserted in tests: ETTR ≥ 97 % at 16,384 GPUs
with the prod backend and the recommended interval. Every number comes from the model; the closed form
(no recurrence) is printed next to the Monte Carlo as a cross-check, with the longest restart at which
each policy still reaches the target, and a restart-time sensitivity for the best policy.

The restart is decomposed per step (``bench/sim/restart.py``): detection, eviction, rescheduling, container
start, rendezvous and NCCL init, checkpoint load, each measured on the local cluster where `make e2e` wrote
figures and scaled or assumed with its source otherwise. The policy table uses that decomposition; the best
policy's ETTR is shown under today's assumed restart (detect 30 s + reschedule 120 s + load), the decomposed
assumed terms and the measured terms side by side, with a cold image pull as a sensitivity, and what the
graceful path (SIGTERM → emergency checkpoint within the grace) adds to or saves from a restart.

A gang whose pods stay (restart in place, one node replaced) reads its shards back from the pods' memory: the rate
is measured here, through ``training_runtime.local_cache`` as ``bench_training`` measures it. Replacing one node
takes a warm spare when one is left (the pool's default sizing) and a cold image pull when none is.
"""

from __future__ import annotations

import json
import time
from dataclasses import replace
from typing import Any

from bench.bench_training import local_vs_shared_load
from bench.sim.failures import node_bound_share
from bench.sim.goodput import (
    CAUSE_KEYS,
    POLICIES,
    SIZES,
    Backend,
    Environment,
    Outcome,
    break_even_restart_s,
    compare,
    expected_ettr,
    expected_ettr_graceful,
    largest_loss,
    mtbf_hours,
    plan,
    simulate,
)
from bench.sim.restart import MEASURED, Assumptions, Graceful, RestartModel, Term
from bench.sim.restart_inputs import read_measurements
from components.config import load_stack, stack_path
from components.goodput_model import recommend

STACK = "prod"
DAYS = 730.0
SEED = 1
TARGET = 0.97
#: Restart without leaving the nodes (issue: restart in place, replace one node, warm spares) aims higher.
RESTART_TARGET = 0.98
TARGET_GPUS = 16_384
#: Restart-time sensitivity of the best policy at the target size (detection + rescheduling, seconds).
RESCHEDULE_SWEEP_S = (60.0, 120.0, 300.0, 600.0)
#: The shard the memory read rate is measured on (MiB) and the repeats (the median is taken).
MEMORY_READ_MIB = 64
MEMORY_READ_REPEATS = 3


def memory_read(assumptions: Assumptions) -> Assumptions:
    """The rate a rank reads its shard back from its pod's memory, measured on this machine: a shard written
    through the store with its copy kept in ``/dev/shm``, read and checked as a resume does."""
    load = local_vs_shared_load(MEMORY_READ_MIB * 2**20, MEMORY_READ_REPEATS)
    return replace(assumptions, memory_read_gbps=load["local_mb_per_s"] / 1000.0, memory_read_basis=MEASURED,
                   memory_read_source=f"measured here: a {load['shard_mib']} MiB shard read back from "
                                      f"{load['local_dir']} and checked, median of {MEMORY_READ_REPEATS}")


def _pct(x: float) -> float:
    return round(100.0 * x, 2)


def decomposition(model: RestartModel) -> dict[str, Any]:
    """Each term at every size with its basis and source (the 16,384-GPU source: its pod count is the largest)."""
    rows: dict[str, dict[str, Any]] = {}
    for gpus in SIZES:
        for term in model.terms(gpus):
            row = rows.setdefault(term.name, {"seconds": {}, "basis": term.basis, "source": term.source,
                                              "note": term.note})
            row["seconds"][str(gpus)] = round(term.seconds, 1)
            row.update(source=term.source, basis=term.basis)
    totals = {str(gpus): round(model.total_s(gpus), 1) for gpus in SIZES}
    return {"terms": rows, "total_s": totals}


def _best_at(policy_name: str, gpus: int, backend: Backend, env: Environment) -> dict[str, Any]:
    policy = next(p for p in POLICIES if p.name == policy_name)
    out = simulate(policy, gpus, backend, env, DAYS, SEED)
    be = break_even_restart_s(out.plan, TARGET)
    return {"restart_s": round(out.plan.restart_s, 1), "ettr_pct": _pct(out.ettr),
            "closed_form_pct": _pct(expected_ettr(out.plan)), "target_restart_s": None if be is None else round(be),
            "outcome": out}


def restart_comparison(backend: Backend, model: RestartModel, policy_name: str) -> dict[str, Any]:
    """The best policy at each size: today's assumed restart, the decomposed assumed terms, the measured terms."""
    measured = "decomposed, measured terms" + ("" if model.measured.any else " (none measured here: the assumed)")
    variants = {
        "today's assumed (detect 30 s + reschedule 120 s + load)": Environment(),
        "decomposed, assumed terms": Environment(restart=model.assumed_only()),
        measured: Environment(restart=model),
        **({"decomposed, eviction and rescheduling scaled from 4 pods by Volcano's client rate (before the scale "
            "runs)": Environment(restart=model.without_scale())} if model.measured.at_scale else {}),
        "decomposed, one node pulls the image": Environment(restart=model.with_assumptions(cold_pull=True)),
    }
    out: dict[str, Any] = {}
    for name, env in variants.items():
        out[name] = {str(g): {k: v for k, v in _best_at(policy_name, g, backend, env).items() if k != "outcome"}
                     for g in SIZES}
    return out


def graceful_effect(backend: Backend, model: RestartModel, policy_name: str) -> dict[str, Any]:
    """Per interruption at each size: what a graceful eviction saves, and what a crash costs when its survivors
    (blocked in a collective, unable to reach a step boundary) hold SIGTERM until the grace ends."""
    env = Environment(restart=model)
    policy = next(p for p in POLICIES if p.name == policy_name)
    rows: dict[str, Any] = {}
    for gpus in SIZES:
        g = Graceful.at(gpus, model.assumptions)
        out = simulate(policy, gpus, backend, env, DAYS, SEED)
        primary = max(1, sum(out.by_cause.values()))
        lost = out.lost_work_s / primary
        held = model.with_assumptions(survivor_hold_s=float(g.grace_s))
        hold_out = simulate(policy, gpus, backend, Environment(restart=held), DAYS, SEED)
        rows[str(gpus)] = {
            "emergency_checkpoint_s": round(g.emergency_s, 1), "grace_s": g.grace_s,
            "lost_work_per_crash_s": round(lost, 1), "graceful_saves_s": round(g.net_saving_s(lost), 1),
            "crash_survivors_hold_grace_adds_s": g.grace_s,
            "ettr_pct": _pct(out.ettr), "ettr_crash_holds_grace_pct": _pct(hold_out.ettr),
            "ettr_all_graceful_bound_pct": _pct(expected_ettr_graceful(plan(policy, gpus, backend, env),
                                                                       g.emergency_s)),
        }
    return rows


def restart_paths(model: RestartModel, outcomes: list[Outcome]) -> dict[str, Any]:
    """Per size: each restart path's seconds and terms, the share of interruptions it takes, and the ETTR of the
    whole-gang policy beside the ones that restart in place and replace one node (the policy table's runs: same
    seeded failures, nothing simulated again)."""
    whole_policy = next(p for p in POLICIES if p.asynchronous and not p.in_place)
    in_place_policy = next(p for p in POLICIES if p.in_place and not p.replace_one)
    one_policy = next(p for p in POLICIES if p.replace_one)
    env = Environment(restart=model)
    share = node_bound_share(env.causes)
    caught = share * env.quarantine_catches

    def terms(found: tuple[Term, ...]) -> dict[str, Any]:
        return {t.name: {"seconds": round(t.seconds, 1), "basis": t.basis, "source": t.source} for t in found}

    ran = {(o.gpus, o.policy): o for o in outcomes}
    rows: dict[str, Any] = {}
    for gpus in SIZES:
        whole, in_place, one = (ran[gpus, p.name] for p in (whole_policy, in_place_policy, one_policy))
        spares, found = env.spares(gpus, model.assumptions.gpus_per_pod)
        rows[str(gpus)] = {
            "whole_gang": {"restart_s": round(model.total_s(gpus), 1), "share_pct": _pct(share),
                           "ettr_pct": _pct(whole.ettr)},
            "in_place": {"restart_s": round(model.in_place_total_s(gpus), 1), "share_pct": _pct(1 - share),
                         "ettr_pct": _pct(in_place.ettr), "terms": terms(model.in_place_terms(gpus))},
            "replace_one": {"restart_s": round(model.replace_one_total_s(gpus), 1), "share_pct": _pct(caught),
                            "ettr_pct": _pct(one.ettr), "terms": terms(model.replace_one_terms(gpus))},
            "spares": {"count": spares, "found_pct": _pct(found),
                       "no_spare_restart_s": round(model.no_spare_total_s(gpus), 1)},
        }
    return rows


def run() -> dict[str, Any]:
    cfg = load_stack(stack_path(STACK))
    backend = Backend.from_config(cfg)
    model = RestartModel(memory_read(Assumptions.from_config(cfg, backend.name)), read_measurements())
    legacy = Environment()
    env = Environment(restart=model)
    started = time.process_time()
    outcomes = compare(backend, env, DAYS, SEED)
    cpu = time.process_time() - started
    table: dict[str, dict[str, Any]] = {}
    for out in outcomes:
        p = out.plan
        be = break_even_restart_s(p, TARGET)
        row: dict[str, Any] = {
            "GPUs": out.gpus, "policy": out.policy, "interval_s": round(p.interval_s), "stall_s": round(p.stall_s, 2),
            "ettr_pct": _pct(out.ettr), "closed_form_pct": _pct(expected_ettr(p)),
            "interruptions_per_day": round(out.interruptions_per_day, 2), "recurrences": out.recurrences,
        }
        row.update({f"lost_gpu_h_day {k}": round(v) for k, v in out.lost_gpu_hours_per_day().items()})
        row.update(bounded_by=largest_loss(out), break_even_restart_s=None if be is None else round(be))
        table[f"{out.gpus} {out.policy}"] = row
    at_target = [o for o in outcomes if o.gpus == TARGET_GPUS]
    reaching = [o.policy for o in at_target if o.ettr >= TARGET]
    best = max(at_target, key=lambda o: o.ettr)
    best_policy = next(p for p in POLICIES if p.name == best.policy)
    sweep: dict[str, dict[str, Any]] = {}
    for reschedule in RESCHEDULE_SWEEP_S:
        varied = replace(legacy, reschedule_s=reschedule)
        out = simulate(best_policy, TARGET_GPUS, backend, varied, DAYS, SEED)
        sweep[f"{reschedule:g} s"] = {"restart_s": round(varied.restart_s(backend)), "ettr_pct": _pct(out.ettr),
                                      "target_met": out.ettr >= TARGET}
    intervals = {}
    for gpus in SIZES:
        rec = recommend(gpus, backend.size_tb, backend.write_s)
        intervals[str(gpus)] = {"mtbf_h": round(mtbf_hours(gpus, env), 2), "blocking_s": round(rec.blocking_s),
                                "asynchronous_s": round(rec.asynchronous_s), "snapshot_s": round(rec.snapshot_s, 2),
                                "write_gb_s_sustained": round(backend.size_tb * 1000 / rec.asynchronous_s, 1)}
    measured = model.measured
    return {
        "stack": STACK, "backend": backend.name, "checkpoint_tb": backend.size_tb,
        "write_s": round(backend.write_s, 1), "load_s": round(backend.load_s, 1),
        "restart_s": {str(g): round(env.restart_s(backend, g), 1) for g in SIZES},
        "restart_s_assumed_before": round(legacy.restart_s(backend), 1),
        "days": DAYS, "seed": SEED, "environment": {
            "detect_s": legacy.detect_s, "reschedule_s": legacy.reschedule_s, "recurrence_p": env.recurrence_p,
            "recurrence_mean_s": env.recurrence_mean_s, "quarantine_catches": env.quarantine_catches,
            "baseline_interval_s": env.baseline_interval_s},
        "restart_decomposition": decomposition(model),
        "restart_measured_any": measured.any,
        "restart_measurement_notes": list(measured.notes),
        "fault_to_first_step_s_local": measured.fault_to_first_step_s,
        "fatal_fault_to_first_step_s_local": measured.fatal_fault_to_first_step_s,
        "restart_comparison": restart_comparison(backend, model, best.policy),
        "graceful_path": graceful_effect(backend, model, best.policy),
        "restart_paths": restart_paths(model, outcomes),
        "inplace_fault_to_first_step_s_local": measured.inplace_fault_to_first_step_s,
        "table": table,
        "intervals": intervals,
        "restart_sensitivity": sweep,
        "targets": {f"ETTR >= {t:.0%} at {TARGET_GPUS:,} GPUs ({best.policy})": best.ettr >= t
                    for t in (TARGET, RESTART_TARGET)},
        "policies_reaching_target": reaching,
        "best_bounded_by": largest_loss(best),
        "runtime_cpu_s": round(cpu, 2),
    }


def restart_markdown(result: dict[str, Any]) -> list[str]:
    """The restart decomposition, the best policy's ETTR under each restart, and the graceful path."""
    dec = result["restart_decomposition"]
    sizes = list(dec["total_s"])
    lines = ["Restart decomposition (seconds per interruption, sources as at 16,384 GPUs; `bench/sim/restart.py`):",
             "",
             "| term | " + " | ".join(f"{int(g):,} GPUs" for g in sizes) + " | basis | source |",
             "|" + "---|" * (len(sizes) + 3)]
    for name, row in dec["terms"].items():
        basis = row["basis"] + (f" ({row['note']})" if row["note"] else "")
        lines.append(f"| {name} | " + " | ".join(f"{row['seconds'][g]:g}" for g in sizes)
                     + f" | {basis} | {row['source']} |")
    lines.append("| **total** | " + " | ".join(f"**{dec['total_s'][g]:g}**" for g in sizes) + " | | |")
    notes = result["restart_measurement_notes"]
    measured = "some terms measured" if result["restart_measured_any"] else "nothing measured here"
    lines += ["", f"Local measurements: {measured}" + (f" ({'; '.join(notes)})" if notes else "") + "."]
    if result["fault_to_first_step_s_local"] is not None:
        lines.append(f"Local fault to first training step after resume: {result['fault_to_first_step_s_local']:g} s.")
    if result.get("fatal_fault_to_first_step_s_local") is not None:
        lines.append("Local fatal fault (the rank dies with its GPU: the crash path) to first training step: "
                     f"{result['fatal_fault_to_first_step_s_local']:g} s.")
    lines += ["", "Best policy under each restart (Monte Carlo ETTR %, restart s, 97 % needs restart ≤ s):", "",
              "| restart | " + " | ".join(f"{int(g):,} GPUs" for g in sizes) + " |", "|" + "---|" * (len(sizes) + 1)]
    for name, by_size in result["restart_comparison"].items():
        cells = []
        for g in sizes:
            r = by_size[g]
            limit = "unreachable" if r["target_restart_s"] is None else f"{r['target_restart_s']:,}"
            cells.append(f"{r['ettr_pct']:.2f} % ({r['restart_s']:g} s; ≤ {limit})")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines += ["", "Restart paths (the crash that does not follow a node restarts in place; a node-bound fault restarts "
              "the whole gang; Llama 3's cause mix), restart s / share of interruptions / ETTR %:", "",
              "| GPUs | whole gang (every node-bound fault) | in place (the rest) | + replace one node (node-bound, "
              "caught) | in-place terms (s, basis) | replace-one terms (s, basis) |", "|---|---|---|---|---|---|"]
    for g, r in result["restart_paths"].items():
        w, i, o = r["whole_gang"], r["in_place"], r["replace_one"]
        cells = [f"{x['restart_s']:g} s / {x['share_pct']:g} % / {x['ettr_pct']:.2f} %" for x in (w, i, o)]
        terms = ["; ".join(f"{name} {t['seconds']:g} ({t['basis']})" for name, t in x["terms"].items())
                 for x in (i, o)]
        lines.append(f"| {int(g):,} | " + " | ".join(cells + terms) + " |")
    lines += ["", "Warm spares of the job's pool (sized as the stack sizes them by default) for replacing one node: a "
              "replacement that finds none left takes a node from inference without the image pulled ahead:", "",
              "| GPUs | spares | replacements that find one % | restart without one s |", "|---|---|---|---|"]
    for g, r in result["restart_paths"].items():
        if "spares" in r:  # absent from a report written before the spares were modelled
            sp = r["spares"]
            lines.append(f"| {int(g):,} | {sp['count']} | {sp['found_pct']:g} | {sp['no_spare_restart_s']:g} |")
    if result.get("inplace_fault_to_first_step_s_local") is not None:
        lines.append(f"\nLocal restart in place (a worker killed under its supervisor → the gang's first step): "
                     f"{result['inplace_fault_to_first_step_s_local']:g} s.")
    lines += ["", "Graceful path (SIGTERM → emergency checkpoint within the grace), per interruption:", "",
              "| GPUs | emergency checkpoint s | grace s | lost work per crash s | graceful eviction saves s | "
              "crash, survivors hold the grace: adds s | ETTR % | ETTR % if crashes hold the grace | "
              "ETTR % bound if every interruption were graceful |", "|" + "---|" * 9]
    for g, r in result["graceful_path"].items():
        lines.append(f"| {int(g):,} | {r['emergency_checkpoint_s']:g} | {r['grace_s']} "
                     f"| {r['lost_work_per_crash_s']:g} | {r['graceful_saves_s']:g} "
                     f"| {r['crash_survivors_hold_grace_adds_s']} | {r['ettr_pct']:.2f} | "
                     f"{r['ettr_crash_holds_grace_pct']:.2f} | {r['ettr_all_graceful_bound_pct']:.2f} |")
    return lines


def to_markdown(result: dict[str, Any]) -> str:
    env = result["environment"]
    restart = ", ".join(f"{int(g):,} GPUs {s:g} s" for g, s in result["restart_s"].items())
    lines = [
        f"### Goodput ({result['stack']} backend '{result['backend']}': {result['checkpoint_tb']:g} TB checkpoint, "
        f"{result['write_s']:g} s write, {result['load_s']:g} s load; restart {restart}; {result['days']:g} days, "
        f"seed {result['seed']})",
        "",
        f"Assumptions: the restart decomposed per step (below; before: detect {env['detect_s']:g} s + reschedule "
        f"{env['reschedule_s']:g} s + load = {result['restart_s_assumed_before']:g} s at every size); a node that "
        f"crashed the job crashes the next run with p = {env['recurrence_p']:g} (mean delay "
        f"{env['recurrence_mean_s']:g} s); quarantine catches {env['quarantine_catches']:.0%} of node-bound "
        f"faults; baseline interval {env['baseline_interval_s']:g} s.",
        "",
        *restart_markdown(result),
        "",
        "| GPUs | policy | interval s | stall s | ETTR % | closed form % | interruptions/day | "
        + " | ".join(f"lost GPU·h/day: {k}" for k in CAUSE_KEYS) + " | bounded by | 97 % needs restart ≤ s |",
        "|" + "---|" * (9 + len(CAUSE_KEYS)),
    ]
    for row in result["table"].values():
        be = row["break_even_restart_s"]
        lines.append(
            f"| {row['GPUs']:,} | {row['policy']} | {row['interval_s']:,} | {row['stall_s']:g} | "
            f"{row['ettr_pct']:.2f} | {row['closed_form_pct']:.2f} | {row['interruptions_per_day']:.2f} | "
            + " | ".join(f"{row[f'lost_gpu_h_day {k}']:,}" for k in CAUSE_KEYS)
            + f" | {row['bounded_by']} | {'unreachable' if be is None else f'{be:,}'} |")
    lines += ["", "Recommended intervals (prod backend, checkpoint size from the budget):", "",
              "| GPUs | job MTBF h | blocking s | asynchronous s | snapshot s | sustained write GB/s (async) |",
              "|---|---|---|---|---|---|"]
    for gpus, rec in result["intervals"].items():
        lines.append(f"| {int(gpus):,} | {rec['mtbf_h']} | {rec['blocking_s']:,} | {rec['asynchronous_s']:,} | "
                     f"{rec['snapshot_s']} | {rec['write_gb_s_sustained']} |")
    lines += ["", "Restart-time sensitivity of the best policy at 16,384 GPUs (today's assumed restart):", "",
              "| detect + reschedule | restart s | ETTR % | ≥ 97 % |", "|---|---|---|---|"]
    for name, row in result["restart_sensitivity"].items():
        lines.append(f"| {env['detect_s']:g} s + {name} | {row['restart_s']} | {row['ettr_pct']:.2f} | "
                     f"{'yes' if row['target_met'] else 'no'} |")
    lines += ["", "| target | met |", "|---|---|"]
    lines += [f"| {k} | {'yes' if v else 'NO'} |" for k, v in result["targets"].items()]
    reaching = ", ".join(result["policies_reaching_target"]) or "none"
    lines += ["", f"Policies reaching 97 % at 16,384 GPUs: {reaching}. The best one is bounded by "
              f"{result['best_bounded_by']}. Model run: {result['runtime_cpu_s']} CPU s."]
    return "\n".join(lines)


if __name__ == "__main__":
    print(json.dumps(run(), indent=2))
