"""Gangs placed by the InfiniBand fabric (issue 51): fragmentation, leaves spanned and the wait hard mode adds.

The prod stack's two pools (128 nodes × 8 GPUs each) declared with a fabric, validated as ``pulumi up`` validates
it: leaves of 32 nodes, two leaves to a spine (the example of docs/scheduling.md). Training only (no inference
services, no providers): what moves between the rows is the gang placement alone. Each workload runs three ways
on the same gangs: flat (the fabric ignored, as without the network-topology-aware plugin: the emptiest nodes
anywhere), soft and hard (``bench/sim/topology.py``: one leaf for a gang that fits one, else the fewest leaves
under one spine; hard waits for that room, soft takes the tightest leaves it finds).

Workloads: the Alibaba GPU 2023 trace's best-effort and burstable pods (each a one-node gang, as the simulator
replays them: ``bench/sim/demand.py`` ``training_gangs``, arrivals copied to reach the load), and the synthetic
generator's gangs of 1–64 nodes; each at the generator's default training load and at a lighter one.

Figures: ``stranded_gpus``, the free GPUs on leaves neither empty nor full (fragments no whole-leaf gang can
use), averaged over 5-minute samples of the measured days, with their share of all free GPUs; ``leaves_spanned``
per gang size, measured (mean, max) against the fewest the gang could span (``fewest_leaves``); the gangs'
pending time (mean, p99) per placement and what hard mode adds over soft.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from bench.sim.demand import apply_traces
from bench.sim.engine import Simulator
from bench.sim.model import ClusterModel
from bench.sim.policies import NEVER, Policy
from bench.sim.run import default_workload
from bench.sim.topology import GangPlacement
from bench.sim.workload import Workload, WorkloadSpec
from components.config import ClusterConfig, TopologyMode, load_stack, stack_path
from components.config.loading import plain_values

STACK = "prod"
LEAF_NODES = 32
LEAVES_PER_SPINE = 2
DAYS = 7.0
WARMUP_DAYS = 1.0
SEED = 1
#: The generator's default training load, and a lighter one that leaves free GPUs to fragment.
LOADS = (WorkloadSpec().training_load, 0.8)
TRACE = Path(__file__).resolve().parent / "traces" / "alibaba-gpu-2023-pods.csv.gz"
FLAT = "flat"
MODES: dict[str, TopologyMode | None] = {FLAT: None, "soft": "soft", "hard": "hard"}


def fabric_stack(stack: str = STACK, leaf_nodes: int = LEAF_NODES,
                 leaves_per_spine: int = LEAVES_PER_SPINE) -> ClusterConfig:
    """``stack`` with every GPU pool cut into leaves of ``leaf_nodes`` nodes (in name order) under spines of
    ``leaves_per_spine`` leaves, checked by every rule the stack's own topology passes."""
    path = stack_path(stack)
    raw = plain_values(path)
    flat = load_stack(path)
    pools = []
    for entry, pool in zip(raw["pools"], flat.pools, strict=True):
        names = pool.node_names
        leaves = [{"name": f"leaf-{pool.name}-{i + 1}", "nodes": names[start:start + leaf_nodes]}
                  for i, start in enumerate(range(0, len(names), leaf_nodes))]
        spines = [{"name": f"spine-{pool.name}-{j + 1}",
                   "leaves": [leaf["name"] for leaf in leaves[start:start + leaves_per_spine]]}
                  for j, start in enumerate(range(0, len(leaves), leaves_per_spine))]
        pools.append({**entry, "topology": {"leaves": leaves, "spines": spines}})
    return load_stack(path, {"pools": pools})


def percentile(values: Sequence[float], q: float) -> float:
    """The nearest-rank percentile (0 for no values)."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def measure(model: ClusterModel, workload: Workload, mode: TopologyMode | None) -> dict[str, Any]:
    """One run: stranded GPUs, leaves spanned per gang size and pending time, over the measured days."""
    sim = Simulator(replace(model, topology_mode=mode), workload, Policy(f"topology {mode}", NEVER),
                    DAYS * 86400, WARMUP_DAYS * 86400)
    outcome = sim.run()
    samples = sim.counters.stranded
    placements = sim.counters.gang_placements
    stranded = sum(s for s, _ in samples)
    free = sum(f for _, f in samples)
    waits = [p.wait_s / 3600 for p in placements]
    return {
        "stranded_gpus": {"mean": round(stranded / len(samples), 1), "free_gpus_mean": round(free / len(samples), 1),
                          "share_of_free": round(stranded / free, 4) if free else 0.0},
        "leaves_spanned": spans(placements),
        "wait_hours": {"mean": round(sum(waits) / len(waits), 3) if waits else 0.0,
                       "p99": round(percentile(waits, 0.99), 3), "gangs": len(waits),
                       "training_gpu_utilization": round(outcome.training_gpu_utilization, 4)},
    }


def spans(placements: Sequence[GangPlacement]) -> dict[str, dict[str, float | int]]:
    """Per gang size: the gangs, the fewest leaves it could span, and the leaves it spanned (mean, max)."""
    sizes: dict[int, list[GangPlacement]] = {}
    for p in placements:
        sizes.setdefault(p.nodes, []).append(p)
    return {str(n): {"gangs": len(ps), "minimum": ps[0].fewest,
                     "mean": round(sum(p.leaves for p in ps) / len(ps), 3), "max": max(p.leaves for p in ps)}
            for n, ps in sorted(sizes.items())}


def workloads(model: ClusterModel) -> tuple[dict[str, Workload], list[str]]:
    """The trace's and the generator's gangs at each load, with the lines that say how the trace was replayed."""
    out: dict[str, Workload] = {}
    lines: list[str] = []
    horizon = (DAYS + WARMUP_DAYS) * 86400
    for load in LOADS:
        synthetic = default_workload(model, DAYS, SEED, WARMUP_DAYS, WorkloadSpec(training_load=load))
        trace = Path(os.path.relpath(TRACE))  # the report names the carried file as a reader finds it
        replay, report = apply_traces(STACK, model, synthetic, None, trace, horizon, training_load=load, seed=SEED)
        out[f"Alibaba 2023 trace, load {load:g}"] = replay
        out[f"synthetic, load {load:g}"] = synthetic
        lines += [f"load {load:g}:", *report]
    return out, lines


def run() -> dict[str, Any]:
    started = time.process_time()
    cfg = fabric_stack()
    model = replace(ClusterModel.from_config(cfg), services=(), providers=())
    chosen, lines = workloads(model)
    results: dict[str, Any] = {}
    for name, workload in chosen.items():
        rows = {label: measure(model, workload, mode) for label, mode in MODES.items()}
        hard, soft = rows["hard"]["wait_hours"], rows["soft"]["wait_hours"]
        results[name] = {
            "stranded_gpus": {label: row["stranded_gpus"] for label, row in rows.items()},
            "leaves_spanned": {label: row["leaves_spanned"] for label, row in rows.items()},
            "wait_hours": {label: row["wait_hours"] for label, row in rows.items()},
            "hard_extra_wait_hours": {"mean": round(hard["mean"] - soft["mean"], 3),
                                      "p99": round(hard["p99"] - soft["p99"], 3)},
        }
    pools = [p for p in model.pools if p.fabric is not None]
    return {
        "name": "topology",
        "stack": STACK,
        "nodes": sum(p.nodes for p in model.pools),
        "gpus": model.onprem_gpus,
        "fabric": f"{len(pools)} pools, leaves of {LEAF_NODES} nodes, {LEAVES_PER_SPINE} leaves per spine",
        "days": DAYS,
        "warmup_days": WARMUP_DAYS,
        "seed": SEED,
        "trace": str(TRACE.relative_to(TRACE.parent.parent.parent)),
        "trace_report": lines,
        "workloads": results,
        "cpu_s": round(time.process_time() - started, 1),
    }


def to_markdown(result: dict[str, Any]) -> str:
    lines = [f"### Gangs on the InfiniBand fabric ({result['nodes']} nodes, {result['gpus']:,} GPUs; "
             f"{result['fabric']}; {result['days']:g} days after {result['warmup_days']:g} warm-up day, seed "
             f"{result['seed']}; training only)", "", "```text", *result["trace_report"], "```"]
    for name, w in result["workloads"].items():
        lines += ["", f"**{name}**", "",
                  "| placement | stranded GPUs (mean) | free GPUs (mean) | stranded share | gangs | wait mean h | "
                  "wait p99 h | training GPU util |", "|---|---|---|---|---|---|---|---|"]
        for label, s in w["stranded_gpus"].items():
            t = w["wait_hours"][label]
            lines.append(f"| {label} | {s['mean']:g} | {s['free_gpus_mean']:g} | {s['share_of_free']:.1%} | "
                         f"{t['gangs']} | {t['mean']:.2f} | {t['p99']:.2f} | {t['training_gpu_utilization']:.1%} |")
        extra = w["hard_extra_wait_hours"]
        head = " | ".join(f"{m} mean / max" for m in MODES)
        lines += ["", f"Hard mode adds {extra['mean']:+.2f} h mean, {extra['p99']:+.2f} h p99 of pending time over "
                  "soft.", "", f"| gang nodes | gangs | fewest leaves | {head} |",
                  "|---|---|---|" + "---|" * len(MODES)]
        spanned = w["leaves_spanned"]
        for size, row in spanned[FLAT].items():
            cells = [f"{spanned[m][size]['mean']:.2f} / {spanned[m][size]['max']}" if size in spanned[m] else "–"
                     for m in MODES]
            lines.append(f"| {size} | {row['gangs']} | {row['minimum']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(json.dumps(run(), indent=2))
