"""The workload the simulator replays: training gangs and inference demand, from a seed or a trace file.

The model is deliberately simple and every knob is named here, so a platform team can see what the
numbers rest on and replace the generator with their own trace (`load_trace`).

- Training: Poisson gang arrivals; sizes in whole nodes (a gang worker takes a full node, as the stack's
  training template does); log-normal durations. The arrival rate is derived from `training_load`, the
  offered training work as a share of on-prem GPU time, so the same spec scales with cluster size.
- Inference: per service, demand (in replicas' worth of traffic) follows a diurnal curve between a night
  floor and a daily peak, with spikes (a multiplier for minutes to an hour) at random times.
"""

from __future__ import annotations

import bisect
import json
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

DAY = 86_400.0
HOUR = 3_600.0


@dataclass(frozen=True)
class Gang:
    """One training job: `nodes` whole nodes of one pool for `duration_s` once admitted."""

    arrival_s: float
    nodes: int
    duration_s: float
    pool: str


@dataclass(frozen=True)
class Spike:
    """Demand of one service multiplied by `factor` during [start_s, start_s + duration_s)."""

    service: str
    start_s: float
    duration_s: float
    factor: float


@dataclass(frozen=True)
class WorkloadSpec:
    """Knobs of the generated workload; defaults describe a busy shared cluster."""

    training_load: float = 0.97
    # Submissions are not stationary (deadlines, release cycles): the arrival rate swings by ±load_swing
    # around the mean over load_period_days, so backlogs build and drain as they do in shared clusters.
    load_swing: float = 0.2
    load_period_days: float = 7.0
    gang_nodes: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)
    gang_weights: tuple[float, ...] = (0.25, 0.2, 0.2, 0.15, 0.1, 0.07, 0.03)
    duration_median_h: float = 4.0
    duration_sigma: float = 1.0
    duration_min_h: float = 0.25
    duration_max_h: float = 72.0
    # Inference demand as a share of each service's maxReplicas (night floor, daily peak at peak_hour).
    floor_share: float = 0.15
    peak_share: float = 0.45
    peak_hour: float = 15.0
    spikes_per_day: float = 2.0  # per service
    spike_factor: tuple[float, float] = (1.3, 2.0)
    spike_minutes: tuple[float, float] = (5.0, 60.0)
    # HPA target headroom: replicas = ceil(demand * headroom), as a utilisation target of ~85 % does.
    hpa_headroom: float = 1.15


@dataclass(frozen=True)
class Workload:
    """A concrete, replayable workload."""

    gangs: tuple[Gang, ...]
    spikes: tuple[Spike, ...] = ()
    spec: WorkloadSpec = field(default_factory=WorkloadSpec)
    _starts: dict[str, list[float]] = field(default_factory=dict, init=False, repr=False, compare=False)
    _by_service: dict[str, list[Spike]] = field(default_factory=dict, init=False, repr=False, compare=False)
    _longest: float = field(default=0.0, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        for spike in sorted(self.spikes, key=lambda s: s.start_s):
            self._by_service.setdefault(spike.service, []).append(spike)
        for service, spikes in self._by_service.items():
            self._starts[service] = [s.start_s for s in spikes]
        object.__setattr__(self, "_longest", max((s.duration_s for s in self.spikes), default=0.0))

    def demand(self, service: str, max_replicas: int, t: float) -> float:
        """Replicas' worth of traffic for `service` at time `t` (the quantity availability is measured on)."""
        s = self.spec
        phase = 2.0 * math.pi * ((t / HOUR - s.peak_hour) / 24.0)
        diurnal = 0.5 + 0.5 * math.cos(phase)  # 1 at the peak hour, 0 twelve hours later
        share = s.floor_share + (s.peak_share - s.floor_share) * diurnal
        factor = 1.0
        starts = self._starts.get(service)
        if starts:
            spikes = self._by_service[service]
            i = bisect.bisect_right(starts, t) - 1
            while i >= 0 and starts[i] > t - self._longest:
                spike = spikes[i]
                if t < spike.start_s + spike.duration_s:
                    factor = max(factor, spike.factor)
                i -= 1
        return max(min(share * factor * max_replicas, float(max_replicas)), 0.0)


def _gang_work_per_arrival(spec: WorkloadSpec, pool_nodes: int) -> float:
    """Expected node-seconds one arrival brings (size capped by the pool, duration clipped)."""
    weights = sum(spec.gang_weights)
    nodes = sum(min(n, pool_nodes) * w for n, w in zip(spec.gang_nodes, spec.gang_weights, strict=True)) / weights
    # Mean of a clipped log-normal, by numeric integration over quantiles (cheap, deterministic).
    mu, sigma = math.log(spec.duration_median_h), spec.duration_sigma
    steps = 2_000
    total = 0.0
    for i in range(steps):
        z = _normal_quantile((i + 0.5) / steps)
        total += min(max(math.exp(mu + sigma * z), spec.duration_min_h), spec.duration_max_h)
    return nodes * (total / steps) * HOUR


def _normal_quantile(p: float) -> float:
    """Inverse standard normal CDF (Acklam's rational approximation; |error| < 1.2e-9)."""
    a = (-39.69683028665376, 220.9460984245205, -275.9285104469687, 138.3577518672690, -30.66479806614716,
         2.506628277459239)
    b = (-54.47609879822406, 161.5858368580409, -155.6989798598866, 66.80131188771972, -13.28068155288572)
    c = (-0.007784894002430293, -0.3223964580411365, -2.400758277161838, -2.549732539343734, 4.374664141464968,
         2.938163982698783)
    d = (0.007784695709041462, 0.3224671290700398, 2.445134137142996, 3.754408661907416)
    lo = 0.02425
    if p < lo:
        q = math.sqrt(-2 * math.log(p))
        return (((((c[0] * q + c[1]) * q + c[2]) * q + c[3]) * q + c[4]) * q + c[5]) / (
            (((d[0] * q + d[1]) * q + d[2]) * q + d[3]) * q + 1)
    if p > 1 - lo:
        return -_normal_quantile(1 - p)
    q = p - 0.5
    r = q * q
    return (((((a[0] * r + a[1]) * r + a[2]) * r + a[3]) * r + a[4]) * r + a[5]) * q / (
        ((((b[0] * r + b[1]) * r + b[2]) * r + b[3]) * r + b[4]) * r + 1)


def generate(
    pools: Sequence[tuple[str, int]],
    services: Sequence[str],
    seconds: float,
    seed: int,
    spec: WorkloadSpec | None = None,
) -> Workload:
    """A seeded workload for `pools` ((name, node count) pairs) and `services` over `seconds`."""
    spec = spec or WorkloadSpec()
    rng = random.Random(seed)
    total_nodes = sum(n for _, n in pools)
    gangs: list[Gang] = []
    if total_nodes > 0 and spec.training_load > 0:
        largest = max(n for _, n in pools)
        rate = spec.training_load * total_nodes / _gang_work_per_arrival(spec, largest)
        peak = rate * (1.0 + abs(spec.load_swing))
        period = spec.load_period_days * DAY
        t = 0.0
        names = [p for p, _ in pools]
        sizes = [n for _, n in pools]
        while True:
            t += rng.expovariate(peak)  # thinning: candidates at the peak rate, kept with rate(t)/peak
            if t >= seconds:
                break
            if rng.random() * peak > rate * (1.0 + spec.load_swing * math.sin(2.0 * math.pi * t / period)):
                continue
            pool_index = rng.choices(range(len(pools)), weights=sizes)[0]
            nodes = min(rng.choices(spec.gang_nodes, weights=spec.gang_weights)[0], sizes[pool_index])
            hours = min(max(rng.lognormvariate(math.log(spec.duration_median_h), spec.duration_sigma),
                            spec.duration_min_h), spec.duration_max_h)
            gangs.append(Gang(round(t, 3), nodes, round(hours * HOUR, 3), names[pool_index]))
    spikes: list[Spike] = []
    for service in services:
        t = 0.0
        while spec.spikes_per_day > 0:
            t += rng.expovariate(spec.spikes_per_day / DAY)
            if t >= seconds:
                break
            spikes.append(
                Spike(service, round(t, 3), round(rng.uniform(*spec.spike_minutes) * 60.0, 3),
                      round(rng.uniform(*spec.spike_factor), 3))
            )
    return Workload(tuple(gangs), tuple(spikes), spec)


def load_trace(path: str | Path, spec: WorkloadSpec | None = None) -> Workload:
    """A workload from a JSON trace: {"gangs": [{arrival_s, nodes, duration_s, pool}], "spikes": [...]}."""
    p = Path(path)
    data = json.loads(p.read_text(encoding="utf-8"))
    if not isinstance(data, dict):
        raise ValueError(f"{p}: top level must be an object with 'gangs' and optional 'spikes'")
    try:
        gangs = tuple(
            Gang(float(g["arrival_s"]), int(g["nodes"]), float(g["duration_s"]), str(g["pool"]))
            for g in data.get("gangs", [])
        )
        spikes = tuple(
            Spike(str(s["service"]), float(s["start_s"]), float(s["duration_s"]), float(s["factor"]))
            for s in data.get("spikes", [])
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"{p}: bad trace entry: {exc}") from None
    return Workload(tuple(sorted(gangs, key=lambda g: g.arrival_s)), spikes, spec or WorkloadSpec())
