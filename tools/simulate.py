"""`make simulate STACK=s [DAYS=n SEED=k OUT=path FAMILY=name]`: the policy comparison on the stack's own config.

Reads the stack file exactly as `pulumi up` does (a bad config fails here with the same message), scales
nothing, generates a seeded workload for its pools and services (or replays `--trace`, or replaces the
inference demand with one demand family of `bench_families` by its name in the report), runs every policy
on it, prints the outcome table and writes a plot of the controller policy's run.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

from bench.sim.entry import (
    INFERENCE_ALONE,
    WorkloadSpec,
    all_policies,
    apply_traces,
    bill_lines,
    case_workload,
    cases,
    default_workload,
    inference_alone,
    load_stack,
    load_trace,
    outcomes_json,
    plot,
    prices_from_config,
    print_table,
    run_costed,
)
from components.config import ConfigError, parse_config
from components.goodput_model import cluster_rows, summary_rows
from components.mockrt import raw_from_stack


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="simulate", description=__doc__)
    parser.add_argument("--stack", default="prod")
    parser.add_argument("--days", type=float, default=7.0, help="measured simulated days (after warm-up)")
    parser.add_argument("--warmup-days", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--training-load", type=float, default=WorkloadSpec.training_load,
                        help="offered training work as a share of on-prem GPU time")
    parser.add_argument("--no-enqueue-gate", action="store_true",
                        help="create every gang's pods on submission instead of at Volcano's enqueue")
    parser.add_argument("--trace", type=Path, help="JSON trace of gangs/spikes instead of the generator")
    parser.add_argument("--inference-trace", type=Path,
                        help="request log, rate series, GenTD26 or Alibaba 2023 pod list (bench/sim/traces.py)")
    parser.add_argument("--training-trace", type=Path, help="job log or Alibaba 2023 pod list (BE pods)")
    parser.add_argument("--family", help="replace the inference demand with this demand family (bench_families' "
                        f"names: {', '.join(cases())})")
    parser.add_argument("--peak-share", type=float, default=0.8,
                        help="the inference trace's peak as a share of each service's maxReplicas")
    parser.add_argument("--json", type=Path, help="also write the outcomes as JSON (policy name → figures)")
    parser.add_argument("--out", type=Path, help="PNG path (default .state/simulate/<stack>.png)")
    parser.add_argument("--policies", help="comma-separated policy names to run (default: all)")
    args = parser.parse_args(argv)
    try:
        setup = load_stack(args.stack)
    except (ConfigError, ValueError) as exc:
        print(f"simulate: {exc}", file=sys.stderr)
        return 2
    if args.no_enqueue_gate:
        setup = replace(setup, model=replace(setup.model, enqueue_gate=False))
    spec = WorkloadSpec(training_load=args.training_load)
    if args.trace:
        workload = load_trace(args.trace, spec)
    else:
        workload = default_workload(setup.model, args.days, args.seed, args.warmup_days, spec)
    if args.family is not None:
        if args.inference_trace or args.trace:
            print("simulate: --family replaces the inference demand; give it without --inference-trace and --trace",
                  file=sys.stderr)
            return 2
        try:
            workload, lines = case_workload(args.stack, setup.model, workload, args.family,
                                            (args.days + args.warmup_days) * 86400.0, args.seed, args.peak_share)
        except ValueError as exc:
            print(f"simulate: {exc}", file=sys.stderr)
            return 2
        print("\n".join(lines))
    if args.inference_trace or args.training_trace:
        try:
            workload, lines = apply_traces(args.stack, setup.model, workload, args.inference_trace,
                                           args.training_trace, (args.days + args.warmup_days) * 86400.0,
                                           args.peak_share, args.training_load, args.seed)
        except ValueError as exc:
            print(f"simulate: {exc}", file=sys.stderr)
            return 2
        print("\n".join(lines))
    policies = all_policies(setup.model, setup.settings, spec)
    if args.policies:
        wanted = {p.strip() for p in args.policies.split(",")}
        unknown = wanted - {p.name for p in policies}
        if unknown:
            print(f"simulate: unknown policies {sorted(unknown)}; known: {[p.name for p in policies]}",
                  file=sys.stderr)
            return 2
        policies = [p for p in policies if p.name in wanted]
    prices = prices_from_config(parse_config(raw_from_stack(args.stack), f"Pulumi.{args.stack}.yaml"))
    results = run_costed(setup.model, workload, policies, args.days * 86400.0, args.warmup_days * 86400.0, prices)
    outcomes = [o for o, _ in results]
    gpus = setup.model.onprem_gpus
    print_table(outcomes, f"stack {args.stack}: {gpus:,} on-prem GPUs, {args.days:g} days, seed {args.seed}")
    print("\n".join(bill_lines(results)))
    alone = inference_alone(setup.model, workload, args.days, args.warmup_days)
    print(f"availability bound ({INFERENCE_ALONE}: no training, every replica on idle on-prem GPUs, the same HPAs): "
          f"{alone.inference_availability:.3%}, worst 5 min {alone.worst_window_availability:.1%}")
    shown = next((o for o in outcomes if o.policy == "controller"), outcomes[0])
    out = args.out or Path(".state/simulate") / f"{args.stack}.png"
    path = plot(shown, gpus, out, f"{args.stack}: {shown.policy} — GPU use and burst taint")
    total = sum(o.runtime_s for o in outcomes)
    events = sum(o.events for o in outcomes)
    print(f"plot: {path}   ({events:,} events in {total:.1f} s)")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        figures = outcomes_json(outcomes)
        for o, b in results:
            figures[o.policy] |= {"cost_usd": b.cost, "external_gpu_hours_by_provider": dict(b.gpu_hours)}
        args.json.write_text(json.dumps(figures, indent=2) + "\n", encoding="utf-8")
        print(f"outcomes: {args.json}")
    print_intervals(args.stack)
    return 0


def print_intervals(stack: str) -> None:
    """The recommended checkpoint interval per training job and for the whole cluster (components/goodput_model)."""
    cfg = parse_config(raw_from_stack(stack), f"Pulumi.{stack}.yaml")
    print("recommended checkpoint intervals (Young–Daly on Llama 3's failure rate per GPU; "
          f"{cfg.checkpoint.budget.size_tb:g} TB checkpoints):")
    for key, value in summary_rows(cfg) + cluster_rows(cfg):
        print(f"  {key}: {value}")


if __name__ == "__main__":
    sys.exit(main())
