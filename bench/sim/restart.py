"""Restart time of a training gang, one term per step, each measured or scaled and carrying its source.

A restart runs, in order: **detection** (fault → the guard's quarantine taint), **eviction** (quarantine → the
gang's pods gone), **rescheduling** (pods gone → the new gang created and bound), **container start** (image
cached, or pulled on a node that lacks it), **rendezvous and NCCL communicator init** at N ranks, and the
**checkpoint load** (each rank reads its shard). The goodput model charges the sum on every interruption.

Where a term comes from:

* **Measured** on the local cluster, when the end-to-end tests wrote their figures:
  ``.state/localcluster/e2e-phases.json`` (``tests/test_e2e.py``'s fault scenario: seconds from the fault to
  ``fault_time_to_quarantine_s``, ``fault_time_to_training_evicted_s``, ``fault_time_to_gang_restarted_s``) gives
  detection, eviction and rescheduling as differences (detection ran at a 1 s scrape and a 1 s guard poll, so
  the stack's own sampling path replaces that part); ``.state/localcluster/e2e-realnodes.json``
  (``tests/test_e2e_realnodes.py``: ``agents_ready_s``, Deployments' pods Ready on a real kubelet with the image
  cached) gives the cached container start, an upper bound since it includes the readiness probe;
  ``.state/localcluster/e2e-stack-in-pods.json`` (``tests/test_e2e_stack_in_pods.py``'s ``guard_fault_loop``: a
  DCGM fault on a real GPU node, the guard in its pod, the trainer in real pods) gives the fault to the first
  training step after resume, reported beside the terms. The local
  gang has :data:`LOCAL_GANG_PODS` pods; eviction and rescheduling at N ranks add the API calls of the extra
  pods at Volcano's client rate (below); these three are *measured + scaled*. ``bench/bench_training.py``
  records lost steps, not resume seconds, so no term is read from it.
* **Scaled** with a named formula otherwise:
  - eviction and rescheduling: Volcano's controller deletes and recreates one pod per API call, and its
    scheduler binds one per call, each client limited to ``defaultQPS = 50`` after a ``defaultBurst = 100``
    (volcano ``cmd/*/app/options``); the scheduler's session runs every ``schedulePeriodSeconds`` (stack key,
    Volcano's default 1 s). Deletes spend the burst, so recreating P pods takes ``P / QPS`` and the last bind
    lands about one period later; binding runs beside creation on its own client.
  - rendezvous and NCCL init: NCCL's bootstrap with one ``ncclUniqueId`` is a ring over all ranks whose root
    serialises the exchange (the NCCL user guide, "Creating a communicator using multiple ncclUniqueIds", is
    why ``ncclCommInitRankScalable`` exists), and torchrun's c10d store on rank 0 takes one connection per
    node: linear in ranks, ``base + per_rank · N``. The coefficients are assumed; at ~100,000 ranks the line
    gives about 3.4 minutes, inside the ~10-minute synchronous restart Meta reported at that scale
    (``../shared/DESIGN.md`` anchors), a consistency check rather than a calibration.
  - checkpoint load: ``shard = size / N`` per rank at ``min(read / N, client link)`` per reader (the sizing
    code's emergency write, read the other way: ``components/checkpoint_sizing.py``). The stack declares only
    ``writeGbps``; reads are taken at the write rate (:data:`READ_TO_WRITE`), conservative for WEKA and VAST,
    whose reads are not slower than their writes.
  - checkpoint load on a restart in place or one node replaced: a rank whose pod stays reads its shard back from
    the pod's memory (``training_runtime.local_cache``: read, then SHA-256 against the manifest) when the shard fits
    the cache (``CHECKPOINT_LOCAL_CACHE_MAX_GB``), at a rate ``bench/bench_goodput.py`` measures on this machine
    the way ``bench_training`` does; the replaced pod's ranks read the shared copy alone, at
    ``min(read / ranks per pod, client link)``; the gang waits for the slower of the two.
  - image pull: image size over a per-node pull throughput, both stated (:class:`Assumptions`); a gang restart
    waits for its slowest pod, so one node without the image makes the whole gang wait for the pull.
* **Assumed**, documented, when neither a file nor a formula applies: detection falls back to the guard's
  worst-case path from the stack (one DCGM sample, one scrape, one guard poll, each just missed), container
  start to ~4 s warm (llm-d's warm pod start, ``../shared/DESIGN.md`` anchors).

What the end-to-end and scale runs wrote is read, defensively, by ``bench/sim/restart_inputs.py``. Nothing here
reads a clock.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from bench.sim.restart_inputs import (
    EVICTED_KEY,
    LOCAL_DETECT_PATH_S,
    LOCAL_GANG_PODS,
    PHASES_FILE,
    POD_START_KEY,
    QUARANTINE_KEY,
    REALNODES_FILE,
    RESTARTED_KEY,
    SCALE_FILE,
    Measurements,
    at_scale,
)
from components.config.sizing import GB_PER_TB, emergency_checkpoint_seconds, termination_grace_seconds
from training_runtime.settings import DEFAULT_LOCAL_CACHE_MAX_GB

if TYPE_CHECKING:
    from components.config import ClusterConfig

#: Reads at this multiple of the declared write bandwidth (the stack declares no read rate).
READ_TO_WRITE = 1.0
TERMS = ("detection", "eviction", "rescheduling", "container start", "rendezvous + NCCL init", "checkpoint load")
#: A restart in place (``training_runtime.supervisor``): no eviction, rescheduling or container start.
IN_PLACE_TERMS = ("supervisors see the failure", "worker process start", "rendezvous + NCCL init", "checkpoint load")
MEASURED, MEASURED_SCALED, SCALED, ASSUMED = "measured", "measured + scaled", "scaled", "assumed"


@dataclass(frozen=True)
class Term:
    """One step of a restart: its seconds, how it was obtained and from where."""

    name: str
    seconds: float
    basis: str
    source: str
    note: str = ""


@dataclass(frozen=True)
class Assumptions:
    """The scaled and assumed inputs, each with its source in the comment above it."""

    #: Guard path from the stack: one DCGM sample + one scrape + one guard poll, each just missed (seconds).
    detect_s: float = 35.0
    detect_source: str = ("stack observability: dcgmIntervalMs + scrapeIntervalSeconds + healthGuardPollSeconds "
                          "(each just missed)")
    #: Volcano controller and scheduler clients (cmd/*/app/options: defaultQPS 50, defaultBurst 100).
    api_qps: float = 50.0
    api_burst: int = 100
    #: Volcano's scheduling session period (stack key scheduling.schedulePeriodSeconds).
    schedule_period_s: float = 1.0
    #: GPUs per training pod (a node's eight; the prod job's gpusPerWorker).
    gpus_per_pod: int = 8
    #: Survivors of a crash that cannot reach a step boundary hold SIGTERM this long before the kubelet's SIGKILL.
    survivor_hold_s: float = 0.0
    #: Warm pod start, image cached (llm-d: 4.0 s warm, DESIGN anchors).
    cached_start_s: float = 4.0
    #: The training image and the pull throughput of one node; ``cold_pull`` makes the gang wait for one pull.
    image_gb: float = 15.0
    pull_gbps: float = 0.03
    cold_pull: bool = False
    #: Rendezvous + NCCL init: ``base + per_rank · N`` (linear bootstrap; coefficients assumed).
    nccl_base_s: float = 5.0
    nccl_per_rank_s: float = 0.002
    #: Restart in place: each supervisor polls its worker and its peers' files every 0.2 s (supervisor.py), so
    #: the failure is seen within two polls; a worker process starts (Python, the framework, its CUDA context)
    #: in ``worker_start_s`` (assumed: tens of seconds for PyTorch with CUDA on a loaded node).
    inplace_detect_s: float = 0.4
    worker_start_s: float = 20.0
    #: Checkpoint load: the budget's size, the backend's read rate (aggregate) and one client link (GB/s).
    size_tb: float = 1.0
    read_gbps: float = 60.0
    client_link_gbps: float = 50.0
    backend: str = "weka-ckpt"
    write_gbps: float = 60.0
    #: A rank whose pod stays reads its shard from the pod's memory (``training_runtime.local_cache``) at this rate
    #: (GB/s: read, then SHA-256 on one core) when the shard fits the cache; ``bench_goodput`` measures it.
    memory_read_gbps: float = 0.5
    memory_read_basis: str = ASSUMED
    memory_read_source: str = "read + SHA-256 on one core (assumed)"
    local_cache_max_gb: float = DEFAULT_LOCAL_CACHE_MAX_GB

    @classmethod
    def from_config(cls, cfg: ClusterConfig, filesystem: str) -> Assumptions:
        """The stack's figures: detection path, schedule period, GPUs per pod, checkpoint size and bandwidths."""
        obs = cfg.observability
        jobs = [j for j in cfg.training.jobs if j.checkpoint is not None]
        fs = cfg.filesystem(filesystem)
        return cls(
            detect_s=obs.dcgm_interval_ms / 1000.0 + obs.scrape_interval_seconds + obs.health_guard_poll_seconds,
            schedule_period_s=float(cfg.scheduling.schedule_period_seconds),
            gpus_per_pod=jobs[0].gpus_per_worker if jobs else 8,
            size_tb=cfg.checkpoint.budget.size_tb,
            read_gbps=READ_TO_WRITE * fs.write_gbps,
            client_link_gbps=cfg.checkpoint.budget.client_link_gbps,
            backend=fs.name,
            write_gbps=fs.write_gbps,
        )


def pods(ranks: int, a: Assumptions) -> int:
    return max(1, math.ceil(ranks / a.gpus_per_pod))


def delete_seconds(n_pods: int, a: Assumptions) -> float:
    """Deleting the gang's pods: the burst, then one call per pod at the client's QPS."""
    return max(0, n_pods - a.api_burst) / a.api_qps


def recreate_seconds(n_pods: int, a: Assumptions) -> float:
    """Recreating and binding the gang: the burst is spent on the deletes; the last bind follows one period on."""
    return n_pods / a.api_qps + a.schedule_period_s


def nccl_init_seconds(ranks: int, a: Assumptions) -> float:
    """Rendezvous and communicator init: linear in ranks (NCCL's single-root bootstrap, torchrun's c10d store)."""
    if ranks <= 0:
        raise ValueError("ranks must be positive")
    return a.nccl_base_s + a.nccl_per_rank_s * ranks


def shard_gb(ranks: int, a: Assumptions) -> float:
    if ranks <= 0:
        raise ValueError("ranks must be positive")
    return a.size_tb * GB_PER_TB / ranks


def load_seconds(ranks: int, a: Assumptions) -> float:
    """Each rank reads its shard at its share of the aggregate read bandwidth, capped by one client link."""
    if ranks <= 0 or a.size_tb <= 0 or a.read_gbps <= 0 or a.client_link_gbps <= 0:
        raise ValueError("ranks, size and bandwidths must be positive")
    return shard_gb(ranks, a) / min(a.read_gbps / ranks, a.client_link_gbps)


def memory_load_seconds(ranks: int, a: Assumptions) -> float | None:
    """A rank's shard read back from its pod's memory; None when the shard is over the cache's limit (no copy is
    kept, the shared copy is read)."""
    if a.memory_read_gbps <= 0:
        raise ValueError("the memory read rate must be positive")
    shard = shard_gb(ranks, a)
    return None if shard > a.local_cache_max_gb else shard / a.memory_read_gbps


def replaced_load_seconds(ranks: int, a: Assumptions) -> float:
    """The replaced pod's ranks read their shards from the shared copy, the only readers of it."""
    readers = min(ranks, a.gpus_per_pod)
    return shard_gb(ranks, a) / min(a.read_gbps / readers, a.client_link_gbps)


def pull_seconds(a: Assumptions) -> float:
    return a.image_gb / a.pull_gbps


@dataclass(frozen=True)
class RestartModel:
    """The assumptions and whatever was measured; ``terms(N)`` is the decomposition at N ranks."""

    assumptions: Assumptions = field(default_factory=Assumptions)
    measured: Measurements = field(default_factory=Measurements)

    def terms(self, ranks: int) -> tuple[Term, ...]:
        a, m = self.assumptions, self.measured
        n_pods = pods(ranks, a)
        phases, real = m.phases_file or PHASES_FILE.name, m.realnodes_file or REALNODES_FILE.name
        volcano = f"Volcano defaultQPS {a.api_qps:g} / defaultBurst {a.api_burst}, {n_pods:,} pods"
        hold = f"; + {a.survivor_hold_s:g} s survivors holding SIGTERM" if a.survivor_hold_s else ""

        if m.detect_s is not None:
            detection = Term(TERMS[0], max(0.0, m.detect_s - LOCAL_DETECT_PATH_S) + a.detect_s, MEASURED_SCALED,
                             f"{phases}: {QUARANTINE_KEY} less its {LOCAL_DETECT_PATH_S:g} s local scrape + poll; "
                             f"+ {a.detect_source}")
        else:
            detection = Term(TERMS[0], a.detect_s, ASSUMED, a.detect_source, f"no {phases} figure")

        if m.at_scale:
            eviction, rescheduling = self._at_scale(n_pods, hold)
        else:
            eviction, rescheduling = self._scaled_from_local(n_pods, volcano, hold)

        if a.cold_pull:
            start = Term(TERMS[3], pull_seconds(a), SCALED,
                         f"image pull: {a.image_gb:g} GB at {a.pull_gbps:g} GB/s per node (one node without the "
                         "image; DESIGN anchors: 7-10 min for a cold 10-20 GB pull)")
        elif m.pod_start_s is not None:
            start = Term(TERMS[3], m.pod_start_s, MEASURED,
                         f"{real}: {POD_START_KEY} (real kubelet, image cached; includes readiness)")
        else:
            start = Term(TERMS[3], a.cached_start_s, ASSUMED, "warm pod start, image cached (llm-d 4.0 s, DESIGN "
                         "anchors)", f"no {real} figure")

        rendezvous = Term(TERMS[4], nccl_init_seconds(ranks, a), SCALED,
                          f"linear in ranks: {a.nccl_base_s:g} s + {a.nccl_per_rank_s * 1000:g} ms × {ranks:,} "
                          "(NCCL single-root bootstrap, user guide 'multiple ncclUniqueIds'; coefficients assumed)")
        load = Term(TERMS[5], load_seconds(ranks, a), SCALED,
                    f"{a.size_tb * GB_PER_TB / ranks:.3g} GB shard per rank at min({a.read_gbps:g} GB/s / {ranks:,}, "
                    f"{a.client_link_gbps:g} GB/s link) ('{a.backend}' writeGbps × read/write {READ_TO_WRITE:g}; "
                    "components/checkpoint_sizing.py)")
        return (detection, eviction, rescheduling, start, rendezvous, load)

    def _at_scale(self, n_pods: int, hold: str) -> tuple[Term, Term]:
        """Eviction and rescheduling from the scale runs' crashes (``make bench-scale``)."""
        m, a = self.measured, self.assumptions
        evict_s, reschedule_s, how = at_scale(m.at_scale, n_pods)
        basis = MEASURED if how.startswith("measured at") else MEASURED_SCALED
        source = m.scale_file or SCALE_FILE.name
        bound = "2-core machine: an upper bound"
        return (Term(TERMS[1], evict_s + a.survivor_hold_s, basis,
                     f"{source}: taint → every pod of the gang marked for deletion (Volcano's RestartJob deletes "
                     f"them one by one), {how}; {bound}{hold}"),
                Term(TERMS[2], reschedule_s, basis,
                     f"{source}: old pods gone → the whole new gang bound, {how}; {bound}"))

    def _scaled_from_local(self, n_pods: int, volcano: str, hold: str) -> tuple[Term, Term]:
        """Eviction and rescheduling from the local four-pod gang, plus the extra pods at Volcano's client rate."""
        m, a = self.measured, self.assumptions
        local, phases = LOCAL_GANG_PODS, m.phases_file or PHASES_FILE.name
        extra_delete = delete_seconds(n_pods, a) - delete_seconds(local, a)
        if m.evict_s is not None:
            eviction = Term(TERMS[1], m.evict_s + extra_delete + a.survivor_hold_s, MEASURED_SCALED,
                            f"{phases}: {EVICTED_KEY} − {QUARANTINE_KEY} at {local} pods; + {volcano}{hold}")
        else:
            eviction = Term(TERMS[1], delete_seconds(n_pods, a) + a.survivor_hold_s, SCALED,
                            f"{volcano}: deletes past the burst at QPS{hold}", f"no {phases} figure")
        extra_create = recreate_seconds(n_pods, a) - recreate_seconds(local, a)
        if m.reschedule_s is not None:
            rescheduling = Term(TERMS[2], m.reschedule_s + extra_create, MEASURED_SCALED,
                                f"{phases}: {RESTARTED_KEY} − {EVICTED_KEY} at {local} pods; + {volcano}")
        else:
            rescheduling = Term(TERMS[2], recreate_seconds(n_pods, a), SCALED,
                                f"{volcano}: creates at QPS + schedulePeriodSeconds {a.schedule_period_s:g}",
                                f"no {phases} figure")
        return eviction, rescheduling

    def total_s(self, ranks: int) -> float:
        return sum(t.seconds for t in self.terms(ranks))

    def in_place_terms(self, ranks: int) -> tuple[Term, ...]:
        """A restart in place at N ranks: the supervisors see the failure, every worker starts again in its pod,
        the gang meets and loads its newest checkpoint; nothing is evicted, rescheduled or pulled."""
        a = self.assumptions
        whole = {t.name: t for t in self.terms(ranks)}
        return (
            Term(IN_PLACE_TERMS[0], a.inplace_detect_s, ASSUMED,
                 "two supervisor polls (0.2 s each: training_runtime/supervisor.py)"),
            Term(IN_PLACE_TERMS[1], a.worker_start_s, ASSUMED,
                 "a worker process: interpreter, framework import, CUDA context (assumed)"),
            whole[TERMS[4]],
            self._kept_load(ranks, whole[TERMS[5]], replaced=False),
        )

    def _kept_load(self, ranks: int, shared: Term, replaced: bool) -> Term:
        """The checkpoint load of a gang whose pods stay: each rank from its pod's memory when its shard fits the
        cache, the replaced pod's ranks from the shared copy; the slower one is the gang's."""
        a = self.assumptions
        shard, memory = shard_gb(ranks, a), memory_load_seconds(ranks, a)
        if memory is None:
            return replace(shared, source=f"{shard:.3g} GB shard over the pod's {a.local_cache_max_gb:g} GB cache "
                                          f"(CHECKPOINT_LOCAL_CACHE_MAX_GB): the shared copy; {shared.source}")
        source = (f"{shard:.3g} GB shard from the pod's memory at {a.memory_read_gbps:.3g} GB/s "
                  f"({a.memory_read_source}; training_runtime/local_cache.py)")
        if not replaced:
            return Term(TERMS[5], memory, a.memory_read_basis, source)
        new = replaced_load_seconds(ranks, a)
        readers = min(ranks, a.gpus_per_pod)
        source += (f"; the new pod's {readers} ranks from the shared copy at min({a.read_gbps:g} GB/s / {readers}, "
                   f"{a.client_link_gbps:g} GB/s link): {new:.2g} s; the slower of the two")
        basis = MEASURED_SCALED if a.memory_read_basis == MEASURED else SCALED
        return Term(TERMS[5], max(memory, new), basis, source)

    def in_place_total_s(self, ranks: int) -> float:
        return sum(t.seconds for t in self.in_place_terms(ranks))

    def replace_one_terms(self, ranks: int) -> tuple[Term, ...]:
        """One node replaced at N ranks (PodEvicted → RestartPod): the guard's detection, one pod evicted and one
        recreated and bound, its container started (on a node that may lack the image: see the cold-pull row), and
        the whole gang's rendezvous and checkpoint load; the other pods stay."""
        a, m = self.assumptions, self.measured
        whole = {t.name: t for t in self.terms(ranks)}
        phases = m.phases_file or PHASES_FILE.name
        if m.evict_s is not None:
            evict = Term(TERMS[1], m.evict_s, MEASURED, f"{phases}: {EVICTED_KEY} − {QUARANTINE_KEY} at "
                         f"{LOCAL_GANG_PODS} pods (an upper bound for one)")
        else:
            evict = Term(TERMS[1], delete_seconds(1, a), SCALED, "one delete, inside the client's burst")
        if m.reschedule_s is not None:
            bind = Term(TERMS[2], m.reschedule_s, MEASURED, f"{phases}: {RESTARTED_KEY} − {EVICTED_KEY} at "
                        f"{LOCAL_GANG_PODS} pods (an upper bound for one)")
        else:
            bind = Term(TERMS[2], recreate_seconds(1, a), SCALED,
                        f"one create and bind + schedulePeriodSeconds {a.schedule_period_s:g}")
        return (whole[TERMS[0]], evict, bind, whole[TERMS[3]], whole[TERMS[4]],
                self._kept_load(ranks, whole[TERMS[5]], replaced=True))

    def replace_one_total_s(self, ranks: int) -> float:
        return sum(t.seconds for t in self.replace_one_terms(ranks))

    def no_spare_terms(self, ranks: int) -> tuple[Term, ...]:
        """One node replaced when no warm spare is left: the replacement lands on a node training takes from
        inference, whose image was not pulled ahead (the pre-pull runs on the spares only), so the gang waits for
        one cold pull."""
        return self.with_assumptions(cold_pull=True).replace_one_terms(ranks)

    def no_spare_total_s(self, ranks: int) -> float:
        return sum(t.seconds for t in self.no_spare_terms(ranks))

    def without_scale(self) -> RestartModel:
        """The same model with eviction and rescheduling scaled from the local gang by Volcano's client rate, as
        before the scale runs: the side-by-side row."""
        return replace(self, measured=replace(self.measured, at_scale=()))

    def assumed_only(self) -> RestartModel:
        """The same model with nothing measured: every term on its scaled or assumed value."""
        return replace(self, measured=Measurements(notes=("assumed terms only",)))

    def with_assumptions(self, **changes: Any) -> RestartModel:
        return replace(self, assumptions=replace(self.assumptions, **changes))


@dataclass(frozen=True)
class Graceful:
    """What the SIGTERM path does to one interruption at N ranks (components/checkpoint_sizing.py)."""

    ranks: int
    #: One emergency checkpoint: every rank snapshots and writes its shard before exiting 0.
    emergency_s: float
    #: The job's terminationGracePeriodSeconds (the emergency checkpoint doubled, never under 30 s).
    grace_s: int

    @classmethod
    def at(cls, ranks: int, a: Assumptions) -> Graceful:
        return cls(ranks, emergency_checkpoint_seconds(a.size_tb, ranks, a.write_gbps, a.client_link_gbps),
                   termination_grace_seconds(a.size_tb, ranks, a.write_gbps, a.client_link_gbps))

    def net_saving_s(self, lost_work_s: float) -> float:
        """Seconds a graceful eviction saves over a crash: the lost work it keeps minus the checkpoint it writes."""
        return lost_work_s - self.emergency_s
