"""The published failure rate every size is scaled from, and what it implies for a pool of nodes.

Llama 3 405B (Meta, 2024) saw 419 unexpected interruptions in 54 days on 16,384 H100 GPUs. Taken as a per-GPU
rate it sizes a job's MTBF (``components.goodput_model``), the simulator's failures (``bench/sim``) and a pool's
warm spares (``components.config.pools``). Standard library only, so the stack's config can read it.
"""

from __future__ import annotations

import math

#: Llama 3 405B: unexpected interruptions, days and GPUs of the run they were counted on.
LLAMA3_INTERRUPTIONS = 419
LLAMA3_DAYS = 54.0
LLAMA3_GPUS = 16_384
DAY_S = 86_400.0
#: Interruptions per GPU-second: the calibration every size is scaled from.
FAILURES_PER_GPU_SECOND = LLAMA3_INTERRUPTIONS / (LLAMA3_DAYS * DAY_S * LLAMA3_GPUS)


#: How long a quarantined node is out (diagnosis, repair, probation), and the share of node failures that should
#: find a warm spare: the defaults a pool's spares are sized by (``pools[].repairHours``, ``spareCoverage``).
DEFAULT_REPAIR_HOURS = 48.0
DEFAULT_SPARE_COVERAGE = 0.95
#: A sized spare count never holds back more than one node in this many: a small pool's gangs need its nodes more
#: than a spare (4 nodes: none; 128: up to 8).
SIZED_SPARE_SHARE = 16


def nodes_in_repair(gpus: int, repair_seconds: float,
                    failures_per_gpu_second: float = FAILURES_PER_GPU_SECOND) -> float:
    """Nodes of a pool of ``gpus`` GPUs out at any time, each failure holding its node ``repair_seconds``
    (Little's law: arrival rate × time in the system). Every interruption is counted as a node's, an upper bound:
    Llama 3 traced 78 % of them to hardware."""
    return gpus * failures_per_gpu_second * repair_seconds


def spares_for(mean_in_repair: float, coverage: float) -> int:
    """The fewest spares for which a failure finds one with probability ``coverage``: nodes go into repair as a
    Poisson process, so the number out at a failure's arrival is Poisson with the mean (arrivals see time averages),
    and the failure finds a spare unless ``k`` or more are out already. Sizing at the mean instead leaves a pool of
    128 nodes (0.97 out on average) without its one spare at 62 % of its failures."""
    if mean_in_repair < 0 or not 0 < coverage < 1:
        raise ValueError("the mean must be >= 0 and the coverage between 0 and 1")
    if mean_in_repair == 0:
        return 0  # nothing ever fails: nothing to cover
    k, below = 0, 0.0  # P(N < k)
    while 1.0 - below > 1.0 - coverage:
        below += math.exp(-mean_in_repair + k * math.log(mean_in_repair) - math.lgamma(k + 1))
        k += 1
    return k


def spare_found_share(mean_in_repair: float, spares: int) -> float:
    """The share of node failures that find a spare: ``P(N < spares)`` for ``N`` Poisson with the mean in repair
    (the coverage ``spares_for`` sizes to, for any spare count)."""
    if mean_in_repair < 0 or spares < 0:
        raise ValueError("the mean and the spares must be >= 0")
    if mean_in_repair == 0:
        return 1.0
    return sum(math.exp(-mean_in_repair + k * math.log(mean_in_repair) - math.lgamma(k + 1)) for k in range(spares))


def sized_spares(gpus: int, nodes: int, repair_hours: float = DEFAULT_REPAIR_HOURS,
                 coverage: float = DEFAULT_SPARE_COVERAGE,
                 failures_per_gpu_second: float = FAILURES_PER_GPU_SECOND) -> int:
    """A pool's warm spares when the stack does not name a count: sized for ``coverage`` at the failure rate (the
    published one by default), capped at one node in ``SIZED_SPARE_SHARE``."""
    mean = nodes_in_repair(gpus, repair_hours * 3600.0, failures_per_gpu_second)
    return min(spares_for(mean, coverage), nodes // SIZED_SPARE_SHARE)
