"""Failure model: job interruptions as a seeded Poisson process with Llama 3's cause mix.

The rate is per GPU (``components.failure_rate.FAILURES_PER_GPU_SECOND``: 419 interruptions in 54 days on
16,384 GPUs), so a job spanning N GPUs is interrupted N times as often as one GPU. Causes keep Llama 3's
shares: 58.7 % GPU-related (faulty GPU 30.1 %, HBM3 17.2 %, the other GPU faults 11.4 %), network switches
and cables 8.4 %, the rest (host, software, storage, maintenance) 32.9 %.

A cause is *node-bound* when the fault stays with one node, so the next job placed on it can crash again:
the GPU faults, and network faults on the node's own links. The health guard's quarantine acts only on
those. The other causes do not follow a node.

Arrivals are drawn once per (GPUs, horizon, seed), independent of any policy: every policy meets the same
failures at the same wall-clock times (common random numbers), so their differences are theirs alone.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from components.failure_rate import FAILURES_PER_GPU_SECOND


@dataclass(frozen=True)
class Cause:
    name: str
    share: float
    node_bound: bool


#: Llama 3 405B's unexpected interruptions by cause (shares of 419).
LLAMA3_CAUSES: tuple[Cause, ...] = (
    Cause("faulty GPU", 0.301, True),
    Cause("HBM3", 0.172, True),
    Cause("other GPU", 0.587 - 0.301 - 0.172, True),
    Cause("network switch/cable", 0.084, True),
    Cause("other", 1.0 - 0.587 - 0.084, False),
)


@dataclass(frozen=True)
class Interruption:
    at_s: float
    cause: Cause


def node_bound_share(causes: tuple[Cause, ...] = LLAMA3_CAUSES) -> float:
    return sum(c.share for c in causes if c.node_bound)


def arrivals(gpus: int, horizon_s: float, seed: int, causes: tuple[Cause, ...] = LLAMA3_CAUSES,
             failures_per_gpu_second: float = FAILURES_PER_GPU_SECOND) -> list[Interruption]:
    """Every interruption of a job spanning ``gpus`` GPUs in ``[0, horizon_s)``, in time order."""
    if gpus <= 0 or horizon_s <= 0:
        raise ValueError("GPUs and horizon must be positive")
    total = sum(c.share for c in causes)
    if abs(total - 1.0) > 1e-9:
        raise ValueError(f"cause shares must sum to 1, got {total:g}")
    rng = random.Random(seed)
    rate = gpus * failures_per_gpu_second
    weights = [c.share for c in causes]
    out: list[Interruption] = []
    t = rng.expovariate(rate)
    while t < horizon_s:
        out.append(Interruption(t, rng.choices(causes, weights)[0]))
        t += rng.expovariate(rate)
    return out
