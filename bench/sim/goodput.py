"""Goodput of one training job spanning the cluster: ETTR and lost GPU·hours by cause, per policy.

A job runs compute intervals of ``T`` seconds, each followed by a checkpoint stall. Interruptions arrive
from ``bench.sim.failures`` (a seeded Poisson process in wall-clock time, the same for every policy). On
an interruption the job loses the compute since its newest *committed* checkpoint, then restarts. With
``Environment.restart`` set, the restart is ``bench.sim.restart``'s decomposition at the job's ranks
(detection, eviction, rescheduling, container start, rendezvous and NCCL init, checkpoint load: measured on
the local cluster where it wrote figures, scaled with named sources otherwise); without it, the earlier
guesses ``detect_s + reschedule_s`` plus the checkpoint load. The load is a read: each rank's shard at the
backend's read rate (the stack declares write bandwidth only; reads are taken at the write rate). An
interruption during a restart starts it over.

* **Blocking checkpoints** stall for the whole write and commit when the stall ends.
* **Asynchronous checkpoints** stall for the in-memory snapshot only; the write commits ``write_s`` later,
  so an interruption inside that window loses the interval before it too. The interval is never shorter
  than the write (one write in flight).
* **Bad-node recurrence.** When a node-bound fault crashed the job, the restarted job runs on that node
  again unless quarantine caught it; with probability ``recurrence_p`` it crashes again after an
  exponential delay. Only the most recent crash's node is tracked (a node that did not recur is cleared).
* **Warm spares.** Replacing one node needs a free node: the job's pool keeps spares sized as the stack sizes them
  by default, and a replacement finds one with the Poisson share of ``components.failure_rate``; one that finds
  none takes a node from inference, whose image was not pulled ahead, and the gang waits for that pull.

Wall time splits exactly into useful compute, lost work, restart, checkpoint stalls and the lost work plus
restart of recurrences; ETTR is useful compute over wall time. ``expected_ettr`` is the closed form of the
same process without recurrence (renewal-reward over Poisson failures), which the Monte Carlo must match.

Everything here is deterministic given the seed; nothing reads a clock.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from bench.sim.failures import LLAMA3_CAUSES, Cause, arrivals, node_bound_share
from bench.sim.restart import READ_TO_WRITE, RestartModel
from components.failure_rate import (
    DAY_S,
    DEFAULT_REPAIR_HOURS,
    DEFAULT_SPARE_COVERAGE,
    FAILURES_PER_GPU_SECOND,
    nodes_in_repair,
    sized_spares,
    spare_found_share,
)
from components.goodput_model import (
    job_mtbf_seconds,
    recommend,
    write_seconds,
)

if TYPE_CHECKING:
    from components.config import ClusterConfig

SIZES = (1_024, 4_096, 16_384)
CAUSE_KEYS = ("lost work", "restart", "checkpoint stalls", "bad-node recurrence")


@dataclass(frozen=True)
class Backend:
    """The checkpoint filesystem as the stack declares it: checkpoint size, one write's and one load's duration."""

    name: str
    size_tb: float
    write_s: float
    #: One checkpoint read back at the backend's read rate (every rank its shard); None: at the write rate.
    read_s: float | None = None

    @property
    def load_s(self) -> float:
        """Loading the checkpoint on a restart: a read, not a write."""
        return self.write_s if self.read_s is None else self.read_s

    @classmethod
    def from_config(cls, cfg: ClusterConfig) -> Backend:
        """The filesystem the stack's first checkpointing job mounts, else the first one declared."""
        mounted = [j.checkpoint.filesystem for j in cfg.training.jobs if j.checkpoint is not None]
        if mounted:
            name = mounted[0]
        elif cfg.checkpoint.filesystems:
            name = cfg.checkpoint.filesystems[0].name
        else:
            raise ValueError("the stack declares no checkpoint filesystem (checkpoint.filesystems)")
        write_s = write_seconds(cfg, name)
        return cls(name, cfg.checkpoint.budget.size_tb, write_s, read_s=write_s / READ_TO_WRITE)


@dataclass(frozen=True)
class Environment:
    """What the stack file does not say: restart latencies and how bad nodes behave (documented guesses)."""

    #: Without ``restart``: a crashed rank fails its pod; Volcano's RestartJob policy sees PodFailed within seconds.
    detect_s: float = 30.0
    #: Without ``restart``: gang torn down and recreated (images cached), rendezvous, communicator init.
    reschedule_s: float = 120.0
    #: The restart decomposed per step at the job's ranks (``bench.sim.restart``); None: the two guesses above.
    restart: RestartModel | None = None
    #: Chance that a node which crashed the job crashes the next run on it.
    recurrence_p: float = 0.3
    #: Mean delay from the restart to that recurrence.
    recurrence_mean_s: float = 3600.0
    #: Share of node-bound faults the health guard recognises and quarantines.
    quarantine_catches: float = 0.9
    #: Interval of the policies that do not use Young–Daly: hourly, a common fixed choice.
    baseline_interval_s: float = 3600.0
    causes: tuple[Cause, ...] = LLAMA3_CAUSES
    failures_per_gpu_second: float = FAILURES_PER_GPU_SECOND
    #: The job's pool keeps warm spares sized as a pool's are by default (``pools[].repairHours``,
    #: ``spareCoverage``): a caught node-bound fault that finds none left replaces its node on one taken from
    #: inference, without the image pulled ahead.
    repair_hours: float = DEFAULT_REPAIR_HOURS
    spare_coverage: float = DEFAULT_SPARE_COVERAGE

    def spares(self, gpus: int, gpus_per_node: int) -> tuple[int, float]:
        """The warm spares of a pool that holds a job of ``gpus`` GPUs, and the share of failures that find one."""
        nodes = max(1, gpus // gpus_per_node)
        rate = self.failures_per_gpu_second
        count = sized_spares(gpus, nodes, self.repair_hours, self.spare_coverage, rate)
        return count, spare_found_share(nodes_in_repair(gpus, self.repair_hours * 3600.0, rate), count)

    def restart_s(self, backend: Backend, gpus: int | None = None) -> float:
        """Seconds from an interruption to training again; the decomposition needs the job's ranks."""
        if self.restart is not None:
            if gpus is None:
                raise ValueError("a decomposed restart needs the job's GPUs (ranks)")
            return self.restart.total_s(gpus)
        return self.detect_s + self.reschedule_s + backend.load_s


@dataclass(frozen=True)
class Policy:
    name: str
    quarantine: bool
    young_daly: bool
    asynchronous: bool
    #: A crash that does not follow a node restarts the processes in their pods (``training.restartInPlace``);
    #: a node-bound fault still restarts the whole gang (the guard evicts it off the quarantined node).
    in_place: bool = False
    #: A node-bound fault the guard catches replaces that node's pod alone (PodEvicted → RestartPod); one it
    #: misses restarts in place on the same node.
    replace_one: bool = False


POLICIES: tuple[Policy, ...] = (
    Policy("keep node in service", quarantine=False, young_daly=False, asynchronous=False),
    Policy("let it crash + quarantine", quarantine=True, young_daly=False, asynchronous=False),
    Policy("+ Young–Daly interval", quarantine=True, young_daly=True, asynchronous=False),
    Policy("+ async checkpoints", quarantine=True, young_daly=True, asynchronous=True),
    Policy("+ restart in place", quarantine=True, young_daly=True, asynchronous=True, in_place=True),
    Policy("+ replace one node", quarantine=True, young_daly=True, asynchronous=True, in_place=True,
           replace_one=True),
)


@dataclass(frozen=True)
class Plan:
    """What one policy does at one job size: compute between checkpoints, stall, commit lag, restart."""

    gpus: int
    interval_s: float
    stall_s: float
    commit_lag_s: float
    restart_s: float
    failures_per_gpu_second: float
    #: The restart of a crash that does not follow a node when the policy restarts in place; else ``restart_s``.
    in_place_restart_s: float | None = None
    #: Share of interruptions that follow a node.
    node_bound_share: float = 1.0
    #: The restart of a node-bound fault the guard caught when the policy replaces one node; else ``restart_s``.
    replace_one_restart_s: float | None = None
    #: Share of node-bound faults the guard catches (``Environment.quarantine_catches`` under quarantine).
    caught_share: float = 0.0
    #: Share of replaced nodes that find a warm spare, and the restart of one that does not (a cold pull).
    spare_share: float = 1.0
    no_spare_restart_s: float | None = None

    def restart_for(self, node_bound: bool, caught: bool = True, spare: bool = True) -> float:
        """Seconds of the restart that follows an interruption of this kind (``caught``: the guard took the node;
        ``spare``: a warm spare was left for its replacement)."""
        if node_bound and caught and self.replace_one_restart_s is not None:
            if not spare and self.no_spare_restart_s is not None:
                return self.no_spare_restart_s
            return self.replace_one_restart_s
        if node_bound and (caught or self.in_place_restart_s is None):
            return self.restart_s
        return self.restart_s if self.in_place_restart_s is None else self.in_place_restart_s

    @property
    def effective_restart_s(self) -> float:
        """The one restart with the same mean cost in the closed form: ``ln E[e^(λR)] / λ`` over the mix of
        whole-gang and in-place restarts (a restart that starts over on every failure costs ``e^(λR)``)."""
        if self.in_place_restart_s is None:
            return self.restart_s
        lam, share, caught = self.rate, self.node_bound_share, self.caught_share
        spare = self.spare_share
        bound = (caught * spare * math.exp(lam * self.restart_for(True, True))
                 + caught * (1 - spare) * math.exp(lam * self.restart_for(True, True, spare=False))
                 + (1 - caught) * math.exp(lam * self.restart_for(True, False)))
        mean = share * bound + (1 - share) * math.exp(lam * self.in_place_restart_s)
        return math.log(mean) / lam

    @property
    def rate(self) -> float:
        return self.gpus * self.failures_per_gpu_second


def plan(policy: Policy, gpus: int, backend: Backend, env: Environment) -> Plan:
    rec = recommend(gpus, backend.size_tb, backend.write_s, env.failures_per_gpu_second)
    if policy.asynchronous:
        interval = rec.asynchronous_s if policy.young_daly else max(env.baseline_interval_s, backend.write_s)
        stall, lag = rec.snapshot_s, backend.write_s
    else:
        interval = rec.blocking_s if policy.young_daly else env.baseline_interval_s
        stall, lag = backend.write_s, 0.0
    # Without the decomposed restart there is nothing to tell an in-place restart's time by: the whole-gang one.
    in_place = env.restart.in_place_total_s(gpus) if policy.in_place and env.restart is not None else None
    replace_one = no_spare = None
    spare_share = 1.0
    if policy.replace_one and env.restart is not None:
        replace_one, no_spare = env.restart.replace_one_total_s(gpus), env.restart.no_spare_total_s(gpus)
        spare_share = env.spares(gpus, env.restart.assumptions.gpus_per_pod)[1]
    return Plan(gpus, interval, stall, lag, env.restart_s(backend, gpus), env.failures_per_gpu_second, in_place,
                node_bound_share(env.causes), replace_one, env.quarantine_catches if policy.quarantine else 0.0,
                spare_share, no_spare)


def expected_ettr(p: Plan, restart_s: float | None = None) -> float:
    """Closed-form ETTR without recurrence.

    A run lasts X ~ Exp(λ); cycle j (compute T, stall s) commits at ``j·(T+s) + lag``, so the useful work of
    a run is T times the number of commits before X: ``T · e^(−λ·lag) · q / (1 − q)`` with
    ``q = e^(−λ(T+s))``. A restart of R seconds that starts over on every failure takes
    ``(e^(λR) − 1) / λ``; a run plus its restart thus lasts ``e^(λR) / λ`` on average.
    """
    lam = p.rate
    r = p.effective_restart_s if restart_s is None else restart_s
    q = math.exp(-lam * (p.interval_s + p.stall_s))
    return p.interval_s * math.exp(-lam * p.commit_lag_s) * q / (1.0 - q) * lam * math.exp(-lam * r)


def expected_ettr_graceful(p: Plan, emergency_s: float) -> float:
    """Closed form if every interruption took the graceful path: a bound, since a crash cannot.

    Nothing computed is lost: a run of X ~ Exp(λ) keeps its compute share ``T / (T + s)``, then writes one
    emergency checkpoint of E seconds and restarts; a run, its checkpoint and its restart last
    ``(e^(λR) + λE) / λ`` on average (a failure during E is not modelled).
    """
    lam = p.rate
    return p.interval_s / (p.interval_s + p.stall_s) / (math.exp(lam * p.effective_restart_s) + lam * emergency_s)


def break_even_restart_s(p: Plan, target: float) -> float | None:
    """The longest restart at which the closed form still reaches ``target``; None if even 0 s does not."""
    ceiling = expected_ettr(p, restart_s=0.0)
    if ceiling < target:
        return None
    return math.log(ceiling / target) / p.rate


@dataclass
class Outcome:
    policy: str
    gpus: int
    days: float
    plan: Plan
    useful_s: float = 0.0
    lost_work_s: float = 0.0
    restart_lost_s: float = 0.0
    stall_s: float = 0.0
    recurrence_s: float = 0.0
    interruptions: int = 0
    recurrences: int = 0
    by_cause: dict[str, int] = field(default_factory=dict)

    @property
    def wall_s(self) -> float:
        return self.days * DAY_S

    @property
    def ettr(self) -> float:
        return self.useful_s / self.wall_s

    @property
    def interruptions_per_day(self) -> float:
        return self.interruptions / self.days

    def lost_gpu_hours_per_day(self) -> dict[str, float]:
        """GPU·hours lost per day by cause (the job's GPUs idle or redoing work for that time)."""
        per_day = self.gpus / 3600.0 / self.days
        return {
            "lost work": self.lost_work_s * per_day,
            "restart": self.restart_lost_s * per_day,
            "checkpoint stalls": self.stall_s * per_day,
            "bad-node recurrence": self.recurrence_s * per_day,
        }

    @property
    def accounted_s(self) -> float:
        return self.useful_s + self.lost_work_s + self.restart_lost_s + self.stall_s + self.recurrence_s


def _run(out: Outcome, p: Plan, elapsed: float, failed: bool, recurrence: bool) -> None:
    """Account one run of ``elapsed`` seconds: compute, stalls, and (if it failed) the uncommitted work."""
    cycle = p.interval_s + p.stall_s
    k = math.floor(elapsed / cycle)
    rest = elapsed - k * cycle
    compute = k * p.interval_s + min(rest, p.interval_s)
    out.stall_s += k * p.stall_s + max(0.0, rest - p.interval_s)
    lost = 0.0
    if failed:
        committed = min(k, math.floor((elapsed - p.commit_lag_s) / cycle)) if elapsed >= p.commit_lag_s else 0
        lost = compute - max(committed, 0) * p.interval_s
    out.useful_s += compute - lost
    if recurrence:
        out.recurrence_s += lost
    else:
        out.lost_work_s += lost


def simulate(policy: Policy, gpus: int, backend: Backend, env: Environment, days: float, seed: int) -> Outcome:
    """One job of ``gpus`` GPUs for ``days`` of wall time under ``policy``."""
    p = plan(policy, gpus, backend, env)
    horizon = days * DAY_S
    primary = arrivals(gpus, horizon, seed, env.causes, env.failures_per_gpu_second)
    rng = random.Random(seed * 1_000_003 + 7)  # recurrence and quarantine draws, apart from the arrivals
    spare_rng = random.Random(seed * 1_000_003 + 11)  # whether a replacement finds a spare: the draws above stay

    def found_spare(caught: bool) -> bool:
        return not (caught and p.replace_one_restart_s is not None) or spare_rng.random() < p.spare_share
    out = Outcome(policy.name, gpus, days, p)
    i, t, flagged = 0, 0.0, False

    def crashed(node_bound: bool) -> bool:
        """Whether the crashing node stays in the job: node-bound and not caught by quarantine."""
        if not node_bound:
            return False
        return not (policy.quarantine and rng.random() < env.quarantine_catches)

    while t < horizon:
        next_primary = primary[i].at_s if i < len(primary) else math.inf
        recur_at = math.inf
        if flagged and rng.random() < env.recurrence_p:
            recur_at = t + rng.expovariate(1.0 / env.recurrence_mean_s)
        end = min(next_primary, recur_at, horizon)
        failed = end < horizon
        is_recurrence = failed and recur_at < next_primary
        _run(out, p, end - t, failed, is_recurrence)
        if not failed:
            break
        out.interruptions += 1
        if is_recurrence:
            out.recurrences += 1
            flagged = crashed(True)
            bound = True
        else:
            cause = primary[i].cause
            out.by_cause[cause.name] = out.by_cause.get(cause.name, 0) + 1
            flagged = crashed(cause.node_bound)
            bound = cause.node_bound
            i += 1
        caught = bound and not flagged
        spare = found_spare(caught)
        t, restart_for_recurrence = end, is_recurrence
        while True:  # restart; a failure during it starts it over
            done = t + p.restart_for(bound, caught, spare)
            next_primary = primary[i].at_s if i < len(primary) else math.inf
            stop = min(done, next_primary, horizon)
            if restart_for_recurrence:
                out.recurrence_s += stop - t
            else:
                out.restart_lost_s += stop - t
            t = stop
            if stop >= horizon or stop == done:
                break
            cause = primary[i].cause
            out.interruptions += 1
            out.by_cause[cause.name] = out.by_cause.get(cause.name, 0) + 1
            flagged = crashed(cause.node_bound)
            bound = cause.node_bound
            caught = bound and not flagged
            spare = found_spare(caught)
            restart_for_recurrence = False
            i += 1
    return out


def compare(backend: Backend, env: Environment, days: float, seed: int,
            sizes: tuple[int, ...] = SIZES, policies: tuple[Policy, ...] = POLICIES) -> list[Outcome]:
    """Every policy at every size, each size on its own seeded arrivals shared by its policies."""
    return [simulate(policy, gpus, backend, env, days, seed) for gpus in sizes for policy in policies]


def largest_loss(out: Outcome) -> str:
    """The cause that costs the most GPU·hours: what bounds this policy's ETTR."""
    losses = out.lost_gpu_hours_per_day()
    return max(losses, key=lambda k: losses[k])


def mtbf_hours(gpus: int, env: Environment) -> float:
    return job_mtbf_seconds(gpus, env.failures_per_gpu_second) / 3600.0
