"""Shape from the trace, level from the stack: a trace becomes the simulator's workload for a given stack.

Inference: the trace's concurrency L(t) (Little's law: busy request-seconds per second) in `bin_s` bins,
smoothed over `window_s` (a published trace is a sample of the real service, so its short peaks are mostly
sampling noise). Replicas needed are L(t) / target concurrency (the service's HPA target for queue-depth and
in-flight; 1 for cpu/memory), then scaled so the trace's peak needs `peak_share` of the service's
maxReplicas. The scale is reported: it says how many times the sample's volume the stack is sized for.
A trace shorter than the simulated horizon loops; the report says how often.

Training: a job becomes a gang of whole nodes (ceil(workers × GPUs per worker / GPUs per node), as the
stack's training template places a worker per node), in its pool or, without one, in a pool drawn by node
count. With `training_load` set, jobs are thinned or repeated (seeded) so the offered work is that share of
the on-prem GPU time, the level the synthetic workload uses; the shape (arrivals, sizes, durations) stays
the trace's.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from bench.sim.engine import Outcome
from bench.sim.model import ClusterModel
from bench.sim.traces import (
    HOUR,
    InferenceTrace,
    TraceError,
    TraceStats,
    TrainingTrace,
    concurrency,
    rate_concurrency,
    read_inference,
    read_training,
    smooth,
    stats,
)
from bench.sim.workload import Gang, Workload, WorkloadSpec
from components.config import ClusterConfig, load_stack, stack_path

DEFAULT_PEAK_SHARE = 0.8
DEFAULT_BIN_S = 300.0
DEFAULT_WINDOW_S = HOUR
ALL = ""  # the shape of every row together, for stack services the trace does not name


@dataclass(frozen=True)
class TraceWorkload(Workload):
    """A workload whose inference demand replays per-service shapes (peak 1.0) in a loop of `period_s`."""

    shapes: Mapping[str, tuple[float, ...]] = field(default_factory=dict)
    bin_s: float = DEFAULT_BIN_S
    peak_share: float = DEFAULT_PEAK_SHARE

    def demand(self, service: str, max_replicas: int, t: float) -> float:
        shape = self.shapes.get(service) or self.shapes[ALL]
        value = shape[int(t // self.bin_s) % len(shape)]
        return min(self.peak_share * value * max_replicas, float(max_replicas))

    @property
    def period_s(self) -> float:
        return len(next(iter(self.shapes.values()))) * self.bin_s


@dataclass(frozen=True)
class ServiceMapping:
    """How one stack service's demand was derived (Little's law, then the level)."""

    service: str
    source: str  # the trace's service name, or "all rows"
    peak_concurrency: float
    target_concurrency: int
    max_replicas: int

    @property
    def trace_peak_replicas(self) -> float:
        return self.peak_concurrency / self.target_concurrency

    def scale(self, peak_share: float) -> float:
        """Stack peak replicas / trace peak replicas: how many times the trace's volume the stack serves."""
        return peak_share * self.max_replicas / self.trace_peak_replicas if self.peak_concurrency else 0.0


@dataclass(frozen=True)
class InferenceReport:
    path: str
    kind: str
    stats: TraceStats
    period_s: float
    horizon_s: float
    peak_share: float
    bin_s: float
    window_s: float
    services: tuple[ServiceMapping, ...]

    @property
    def loops(self) -> float:
        return self.horizon_s / self.period_s

    def lines(self) -> list[str]:
        out = [f"inference trace {self.path} ({self.kind}):", *("  " + x for x in self.stats.lines())]
        if self.loops > 1.0:
            out.append(f"  the trace ({self.period_s / 86400:.2f} days) is shorter than the simulated "
                       f"{self.horizon_s / 86400:.2f} days: it loops {self.loops:.2f} times")
        else:
            out.append(f"  replays the first {self.horizon_s / 86400:.2f} of {self.period_s / 86400:.2f} days")
        out.append(f"  level: the trace's peak ({self.bin_s / 60:g}-min bins, {self.window_s / 60:g}-min moving "
                   f"average) = {self.peak_share:.0%} of each service's maxReplicas")
        for m in self.services:
            out.append(f"  {m.service} ← {m.source}: peak concurrency {m.peak_concurrency:.3g} / target "
                       f"{m.target_concurrency} = {m.trace_peak_replicas:.3g} replicas at the trace's volume; "
                       f"scaled ×{m.scale(self.peak_share):.3g} to {self.peak_share * m.max_replicas:.0f} of "
                       f"{m.max_replicas}")
        return out


def target_concurrency(cfg: ClusterConfig) -> dict[str, int]:
    """Requests one replica serves at its HPA target (queue-depth, in-flight); 1 for cpu/memory targets."""
    out: dict[str, int] = {}
    for s in cfg.inference.services:
        metric = str(s.scaling.metric)
        out[s.name] = s.scaling.target if metric in ("queue-depth", "in-flight") else 1
    return out


def inference_shapes(trace: InferenceTrace, model: ClusterModel, targets: Mapping[str, int], horizon_s: float, *,
                     peak_share: float = DEFAULT_PEAK_SHARE, bin_s: float = DEFAULT_BIN_S,
                     window_s: float = DEFAULT_WINDOW_S, service_seconds: float = 1.0,
                     ) -> tuple[dict[str, tuple[float, ...]], InferenceReport]:
    """Per-service demand shapes (peak 1.0) and the report of how they were made."""
    if not 0.0 < peak_share <= 1.0:
        raise ValueError(f"peak share must be in (0, 1], got {peak_share}")
    if bin_s <= 0 or window_s < bin_s:
        raise ValueError(f"bin ({bin_s} s) must be positive and the window ({window_s} s) at least one bin")
    times = [r.time_s for r in trace.requests] or [r.time_s for r in trace.rates]
    start = times[0]
    span = max(times[-1] - start, bin_s)
    bins = max(1, math.ceil(span / bin_s))
    hour_bins = max(1, math.ceil(span / HOUR))
    names = {r.service for r in trace.requests} | {r.service for r in trace.rates}
    names.discard(None)
    known = {s.name for s in model.services}
    unknown = sorted(str(n) for n in names - known)
    if unknown:
        raise TraceError(trace.path, f"services {unknown} are not in the stack (its services: {sorted(known)})")

    def series(name: str | None, n: int, width: float) -> list[float]:
        if trace.requests:
            reqs = [r for r in trace.requests if name is None or r.service == name]
            return concurrency(reqs, start, n, width)
        rates = [r for r in trace.rates if name is None or r.service == name]
        return rate_concurrency(rates, start, n, width, service_seconds)

    window = max(1, round(window_s / bin_s))
    raw: dict[str, list[float]] = {ALL: smooth(series(None, bins, bin_s), window)}
    for name in sorted(str(n) for n in names):
        raw[name] = smooth(series(name, bins, bin_s), window)
    peaks = {k: max(v) for k, v in raw.items()}
    if peaks[ALL] <= 0:
        raise TraceError(trace.path, "no request is ever in service (all service times or rates are zero)")
    shapes = {k: tuple(x / peaks[k] for x in v) for k, v in raw.items() if peaks[k] > 0}
    mappings = tuple(
        ServiceMapping(s.name, s.name if s.name in shapes and s.name != ALL else "all rows",
                       peaks[s.name] if s.name in shapes else peaks[ALL], targets.get(s.name, 1), s.max_replicas)
        for s in model.services
    )
    hourly = series(None, hour_bins, HOUR)
    report = InferenceReport(trace.path, trace.kind.value,
                             stats(len(trace.requests) or len(trace.rates), span, hourly, raw[ALL]),
                             bins * bin_s, horizon_s, peak_share, bin_s, window * bin_s, mappings)
    return shapes, report


@dataclass(frozen=True)
class TrainingReport:
    path: str
    kind: str
    jobs: int
    gangs: int
    clipped: int
    period_s: float
    horizon_s: float
    offered_load: float
    factor: float

    def lines(self) -> list[str]:
        loops = self.horizon_s / self.period_s if self.period_s else 0.0
        out = [f"training trace {self.path} ({self.kind}): {self.jobs:,} jobs over {self.period_s / 86400:.2f} days"]
        if loops > 1.0:
            out.append(f"  shorter than the simulated {self.horizon_s / 86400:.2f} days: it loops {loops:.2f} times")
        out.append(f"  offered work {self.offered_load:.1%} of on-prem GPU time as whole-node gangs; "
                   f"arrivals ×{self.factor:.3g} → {self.gangs:,} gangs; {self.clipped} gangs capped at their pool")
        return out


def training_gangs(trace: TrainingTrace, model: ClusterModel, horizon_s: float, *,
                   training_load: float | None = None, seed: int = 1) -> tuple[tuple[Gang, ...], TrainingReport]:
    """Whole-node gangs from a job log, looped to the horizon and (optionally) levelled to `training_load`."""
    pools = {p.name: p for p in model.pools}
    if not pools:
        raise ValueError("the stack has no on-prem pools to run training on")
    rng = random.Random(seed)
    names = list(pools)
    weights = [pools[n].nodes for n in names]
    start = trace.jobs[0].submit_s
    # The loop lasts the span plus one mean gap, so the last job and the first of the next loop keep the spacing.
    n = len(trace.jobs)
    span = trace.jobs[-1].submit_s - start
    period = span * n / (n - 1) if n > 1 and span > 0 else horizon_s
    base: list[Gang] = []
    clipped = 0
    for job in trace.jobs:
        pool = job.pool if job.pool is not None else rng.choices(names, weights=weights)[0]
        if pool not in pools:
            raise TraceError(trace.path, f"job submitted at {job.submit_s:g} names pool {pool!r}, not in the "
                             f"stack (its pools: {sorted(pools)})")
        p = pools[pool]
        nodes = math.ceil(job.workers * job.gpus_per_worker / p.gpus_per_node)
        if nodes > p.nodes:
            clipped += 1
            nodes = p.nodes
        base.append(Gang(job.submit_s - start, nodes, job.duration_s, pool))
    looped: list[Gang] = []
    offset = 0.0
    while offset < horizon_s:
        looped += [replace(g, arrival_s=g.arrival_s + offset) for g in base if g.arrival_s + offset < horizon_s]
        offset += period
    total_nodes = sum(p.nodes for p in model.pools)
    # Work inside the horizon only: a job running past its end offers no more than the time left.
    offered = sum(g.nodes * min(g.duration_s, horizon_s - g.arrival_s) for g in looped) / (total_nodes * horizon_s)
    factor = 1.0 if training_load is None or offered == 0 else training_load / offered
    gangs: list[Gang] = []
    for g in looped:
        copies = int(factor) + (1 if rng.random() < factor - int(factor) else 0)
        gangs += [g] * copies
    gangs.sort(key=lambda g: g.arrival_s)
    report = TrainingReport(trace.path, trace.kind.value, len(trace.jobs), len(gangs), clipped, period, horizon_s,
                            offered, factor)
    return tuple(gangs), report


def trace_workload(base: Workload, shapes: Mapping[str, tuple[float, ...]] | None, *, bin_s: float = DEFAULT_BIN_S,
                   peak_share: float = DEFAULT_PEAK_SHARE, gangs: tuple[Gang, ...] | None = None) -> Workload:
    """`base` with its inference demand replaced by `shapes` and/or its gangs by `gangs`.

    With shapes, the base's synthetic spikes are dropped (the trace brings its own bursts) and the spec's
    peak share becomes the trace's, so the static partition is sized to the trace's peak as it is to the
    generator's.
    """
    chosen = base.gangs if gangs is None else gangs
    if shapes is None:
        return Workload(chosen, base.spikes, base.spec)
    spec: WorkloadSpec = replace(base.spec, peak_share=peak_share)
    return TraceWorkload(chosen, (), spec, shapes=dict(shapes), bin_s=bin_s, peak_share=peak_share)


def apply_traces(stack: str, model: ClusterModel, base: Workload, inference: str | Path | None,
                 training: str | Path | None, horizon_s: float, peak_share: float = DEFAULT_PEAK_SHARE,
                 training_load: float | None = None, seed: int = 1) -> tuple[Workload, list[str]]:
    """`base` with the traces given replacing its inference demand and/or its gangs; the report lines."""
    lines: list[str] = []
    shapes = None
    gangs = None
    if inference is not None:
        cfg = load_stack(stack_path(stack))
        shapes, report = inference_shapes(read_inference(inference), model, target_concurrency(cfg), horizon_s,
                                          peak_share=peak_share)
        lines += report.lines()
    if training is not None:
        gangs, treport = training_gangs(read_training(training), model, horizon_s, training_load=training_load,
                                        seed=seed)
        lines += treport.lines()
    return trace_workload(base, shapes, peak_share=peak_share, gangs=gangs), lines


#: The figures scripts read from `make simulate JSON=...` (and more: every scalar of the outcome).
JSON_KEYS = ("inference_availability", "worst_window_availability", "external_gpu_hours",
             "onprem_gpu_utilization", "taint_flips")


def outcomes_json(outcomes: Sequence[Outcome]) -> dict[str, dict[str, object]]:
    """Policy name → its figures (the `JSON_KEYS` first, then the rest of the outcome's scalars)."""
    out: dict[str, dict[str, object]] = {}
    for o in outcomes:
        summary = o.summary()
        out[o.policy] = {k: summary[k] for k in JSON_KEYS} | {
            k: v for k, v in summary.items() if k not in JSON_KEYS and k != "policy"}
    return out
