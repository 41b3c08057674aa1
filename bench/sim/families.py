"""Families of demand shapes, so a change is judged on every shape production can take, not on the two
traces the simulator happens to know.

Each family is a seeded generator of one inference demand shape (peak 1.0, in `bin_s` bins) over the whole
horizon, levelled by the stack exactly as a trace is (`bench/sim/demand.py`: the peak needs `peak_share` of
each service's maxReplicas). The families are the shapes that break burst controllers in the field:

* ``diurnal``: a daily cycle with a weekend dip and noise (the shape the generator already knows);
* ``steep-ramps``: several rises of 55–67 % of the mean rate within 5 minutes, held, then eased off (the
  held-out gateway series that acceptance testing replayed);
* ``flash-crowds``: short jumps to 2–3× the level, gone within half an hour;
* ``plateaus``: long days at a high level, then long days low;
* ``decays``: a jump, then an exponential decay back to the base;
* ``loop-seam`` / ``loop-smooth``: a 6-hour series looped with a step at the seam, and the same mirrored so
  that the ends meet.

`ramp_aligned_gangs` moves training arrivals onto the ramps, the coincidence that makes preemption remove
replicas while demand grows. Pure and deterministic for a seed.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import NamedTuple

from bench.sim.demand import ALL, DEFAULT_BIN_S, apply_traces, trace_workload
from bench.sim.model import ClusterModel
from bench.sim.workload import DAY, HOUR, Gang, Workload

Shape = tuple[float, ...]
_Generator = Callable[[random.Random, int, float], list[float]]


def _normalised(values: Sequence[float]) -> Shape:
    """The series with its peak at 1.0 and nothing below zero."""
    clipped = [max(0.0, v) for v in values]
    peak = max(clipped, default=0.0)
    if peak <= 0:
        raise ValueError("a demand shape needs some demand")
    return tuple(v / peak for v in clipped)


def _diurnal_base(rng: random.Random, n: int, bin_s: float, noise: float = 0.05) -> list[float]:
    phase = rng.uniform(0, 2 * math.pi)
    out = []
    for i in range(n):
        t = i * bin_s
        day = 0.6 + 0.4 * math.sin(2 * math.pi * t / DAY + phase)
        weekend = 0.75 if (t // DAY) % 7 in (5, 6) else 1.0
        out.append(day * weekend * (1 + rng.gauss(0, noise)))
    return out


def diurnal(rng: random.Random, n: int, bin_s: float) -> list[float]:
    return _diurnal_base(rng, n, bin_s)


def ramp_starts(rng: random.Random, n: int, bin_s: float, per_day: float = 3.0) -> list[int]:
    """Bins where a ramp begins: a Poisson process of ``per_day`` ramps a day, at least 2 hours apart."""
    starts: list[int] = []
    i = 0
    mean_gap = DAY / per_day / bin_s
    while True:
        i += max(int(2 * HOUR / bin_s), int(rng.expovariate(1 / mean_gap)))
        if i >= n:
            return starts
        starts.append(i)


def _events_on_a_base(rng: random.Random, n: int, bin_s: float, level: float,
                      per_day: float) -> tuple[list[float], list[int]]:
    """A quiet diurnal base at ``level`` and the bins where its events (ramps, crowds, jumps) begin."""
    base = [level * v for v in _diurnal_base(rng, n, bin_s, noise=0.03)]
    return base, ramp_starts(random.Random(rng.random()), n, bin_s, per_day)


def steep_ramps(rng: random.Random, n: int, bin_s: float) -> list[float]:
    base, starts = _events_on_a_base(rng, n, bin_s, 0.5, per_day=3.0)
    mean = sum(base) / len(base)
    out = list(base)
    for start in starts:
        rise = mean * rng.uniform(0.55, 0.67)
        ramp = max(1, int(5 * 60 / bin_s))  # the whole rise within 5 minutes
        hold = int(rng.uniform(0.5, 2.0) * HOUR / bin_s)
        ease = int(HOUR / bin_s)
        for k in range(ramp + hold + ease):
            if start + k >= n:
                break
            if k < ramp:
                level = rise * (k + 1) / ramp
            elif k < ramp + hold:
                level = rise
            else:
                level = rise * (1 - (k - ramp - hold) / ease)
            out[start + k] += level
    return out


def flash_crowds(rng: random.Random, n: int, bin_s: float) -> list[float]:
    base, starts = _events_on_a_base(rng, n, bin_s, 0.35, per_day=2.0)
    out = list(base)
    for start in starts:
        factor = rng.uniform(2.0, 3.0)
        length = int(rng.uniform(10, 30) * 60 / bin_s) or 1
        for k in range(length):
            if start + k < n:
                out[start + k] = base[start + k] * factor
    return out


def plateaus(rng: random.Random, n: int, bin_s: float) -> list[float]:
    out, i, high = [], 0, rng.random() < 0.5
    while i < n:
        length = int(rng.uniform(1.0, 3.0) * DAY / bin_s)
        level = rng.uniform(0.85, 1.0) if high else rng.uniform(0.3, 0.45)
        out += [level * (1 + rng.gauss(0, 0.02)) for _ in range(min(length, n - i))]
        i += length
        high = not high
    return out


def decays(rng: random.Random, n: int, bin_s: float) -> list[float]:
    base, starts = _events_on_a_base(rng, n, bin_s, 0.3, per_day=1.5)
    out = list(base)
    for start in starts:
        jump = rng.uniform(0.5, 0.7)
        tau = rng.uniform(0.5, 2.0) * HOUR / bin_s
        for k in range(int(6 * tau)):
            if start + k < n:
                out[start + k] += jump * math.exp(-k / tau)
    return out


def _loop(rng: random.Random, n: int, bin_s: float, smooth: bool) -> list[float]:
    piece = steep_ramps(rng, int(6 * HOUR / bin_s), bin_s)
    # Mirrored, the end meets the start; with a drift, it steps back at every seam.
    piece = piece + piece[::-1] if smooth else [v + 0.4 * i / len(piece) for i, v in enumerate(piece)]
    return [piece[i % len(piece)] for i in range(n)]


def loop_seam(rng: random.Random, n: int, bin_s: float) -> list[float]:
    return _loop(rng, n, bin_s, smooth=False)


def loop_smooth(rng: random.Random, n: int, bin_s: float) -> list[float]:
    return _loop(rng, n, bin_s, smooth=True)


FAMILIES: dict[str, _Generator] = {
    "diurnal": diurnal,
    "steep-ramps": steep_ramps,
    "flash-crowds": flash_crowds,
    "plateaus": plateaus,
    "decays": decays,
    "loop-seam": loop_seam,
    "loop-smooth": loop_smooth,
}


#: The share of the gangs the ramp-aligned case moves onto the steepest rises.
RAMP_GANG_SHARE = 1 / 3
#: The demand bin of the case that samples the steep ramps every minute.
FINE_BIN_S = 60.0


#: The production traces the repository carries (bench/traces/README.md).
TRACES = Path(__file__).resolve().parent.parent / "traces"


class Case(NamedTuple):
    """One row of the families report: a generated family (with a share of its gangs moved onto its ramps and
    its demand bin), or a carried inference trace replayed in its place (`trace`)."""

    family: str
    ramp_gangs: float = 0.0
    bin_s: float = DEFAULT_BIN_S
    trace: Path | None = None


def cases() -> dict[str, Case]:
    """Every case the bench reports, by name. Each family as generated, plus the coincidence that makes
    preemption take replicas while demand ramps (a third of the gangs on the steepest rises), the same ramps
    sampled every minute (a rise within 5 minutes is then a slope over five samples, not one step, which is
    what a trend can follow), and the two production traces the simulator knows, as inference demand with
    the same synthetic training."""
    rows = {name: Case(name) for name in FAMILIES}
    rows["steep-ramps + gangs on the ramps"] = Case("steep-ramps", RAMP_GANG_SHARE)
    rows["steep-ramps, 1-min samples"] = Case("steep-ramps", bin_s=FINE_BIN_S)
    rows["GenTD26 trace"] = Case("GenTD26 trace", trace=TRACES / "gentd26-sd-requests.csv.gz")
    rows["Alibaba 2023 trace"] = Case("Alibaba 2023 trace", trace=TRACES / "alibaba-gpu-2023-pods.csv.gz")
    return rows


def case(name: str) -> Case:
    """One case by its name in the report (a family's own name included); an unknown one names the known."""
    known = cases()
    if name not in known:
        raise ValueError(f"unknown demand family {name!r}; known: {', '.join(repr(n) for n in known)}")
    return known[name]


def case_workload(stack: str, model: ClusterModel, base: Workload, name: str, horizon_s: float, seed: int,
                  peak_share: float) -> tuple[Workload, list[str]]:
    """``base`` with case ``name``'s inference demand (and gangs on its ramps), and the lines that describe it."""
    c = case(name)
    if c.trace is not None:
        workload, lines = apply_traces(stack, model, base, c.trace, None, horizon_s, peak_share, seed=seed)
        return workload, [f"demand family {name!r}: the carried trace {c.trace.name}", *lines]
    workload = family_workload(base, c.family, horizon_s, seed, peak_share, ramp_gangs=c.ramp_gangs, bin_s=c.bin_s)
    return workload, [f"demand family {name!r}: {c.family}, {c.bin_s:g} s bins, {c.ramp_gangs:.0%} of the gangs on "
                      f"its ramps, peak {peak_share:.0%} of each service's maxReplicas"]


def shape(family: str, horizon_s: float, seed: int, bin_s: float = DEFAULT_BIN_S) -> Shape:
    """One family's demand shape over ``horizon_s`` (peak 1.0), the same for the same seed."""
    if family not in FAMILIES:
        raise ValueError(f"unknown demand family {family!r}; known: {sorted(FAMILIES)}")
    if horizon_s < bin_s or bin_s <= 0:
        raise ValueError(f"the horizon ({horizon_s} s) must hold at least one bin of {bin_s} s")
    n = int(horizon_s // bin_s)
    return _normalised(FAMILIES[family](random.Random(f"{family}:{seed}"), n, bin_s))


def ramp_aligned_gangs(gangs: Sequence[Gang], demand: Shape, bin_s: float, share: float, seed: int) -> tuple[Gang, ...]:
    """``gangs`` with ``share`` of them (seeded) moved to arrive where demand rises fastest, so that training
    takes its GPUs while inference ramps. Sizes, durations and pools stay."""
    if not 0.0 <= share <= 1.0:
        raise ValueError(f"share must be in [0, 1], got {share}")
    rises = sorted(range(1, len(demand)), key=lambda i: demand[i - 1] - demand[i])[: max(1, len(demand) // 50)]
    rng = random.Random(seed)
    out = []
    for gang in gangs:
        if rng.random() < share:
            gang = replace(gang, arrival_s=rng.choice(rises) * bin_s)
        out.append(gang)
    return tuple(sorted(out, key=lambda g: g.arrival_s))


def family_workload(base: Workload, family: str, horizon_s: float, seed: int, peak_share: float,
                    ramp_gangs: float = 0.0, bin_s: float = DEFAULT_BIN_S) -> Workload:
    """``base`` with its inference demand replaced by one family's shape for every service (in ``bin_s`` bins),
    and optionally a share of its gangs moved onto the ramps."""
    demand = shape(family, horizon_s, seed, bin_s)
    gangs = ramp_aligned_gangs(base.gangs, demand, bin_s, ramp_gangs, seed) if ramp_gangs else None
    return trace_workload(base, {ALL: demand}, bin_s=bin_s, peak_share=peak_share, gangs=gangs)
