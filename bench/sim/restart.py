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

Parsing of the two files is defensive (they are outside input): a missing file, unreadable text, JSON that is
not an object, a value that is not a finite non-negative number, or phases out of order leave the affected
term on its fallback with a note naming the file and the key. Nothing here reads a clock.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from components.config.sizing import GB_PER_TB, emergency_checkpoint_seconds, termination_grace_seconds
from training_runtime.settings import DEFAULT_LOCAL_CACHE_MAX_GB

if TYPE_CHECKING:
    from components.config import ClusterConfig

ROOT = Path(__file__).resolve().parent.parent.parent
PHASES_FILE = ROOT / ".state" / "localcluster" / "e2e-phases.json"
REALNODES_FILE = ROOT / ".state" / "localcluster" / "e2e-realnodes.json"
#: tests/test_e2e_stack_in_pods.py: the guard's loop with real processes (its ``guard_fault_loop`` object).
IN_PODS_FILE = ROOT / ".state" / "localcluster" / "e2e-stack-in-pods.json"
GUARD_LOOP_KEY = "guard_fault_loop"
#: ``make bench-scale``: a fatal fault under a running gang at 256-2,048 pods (``tools/localcluster/scalecrash.py``),
#: per shape ``crash`` → gang size → ``evict_s`` / ``reschedule_s`` percentiles.
SCALE_FILE = ROOT / ".state" / "scale" / "results.json"
#: The same loop for a fatal fault: the rank dies with its GPU and the gang takes the crash path.
GUARD_FATAL_LOOP_KEY = "guard_fatal_loop"

#: Keys of tests/test_e2e.py's fault scenario, seconds from the fault.
QUARANTINE_KEY = "fault_time_to_quarantine_s"
EVICTED_KEY = "fault_time_to_training_evicted_s"
RESTARTED_KEY = "fault_time_to_gang_restarted_s"
#: The end-to-end figure the real-process fault loop reports (fault → first training step after resume).
FIRST_STEP_KEY = "fault_to_first_step_s"
PHASE_KEYS = (QUARANTINE_KEY, EVICTED_KEY, RESTARTED_KEY, FIRST_STEP_KEY)
#: tests/test_e2e_realnodes.py: the agents' pods Ready on a real kubelet, image cached (imagePullPolicy Never).
POD_START_KEY = "agents_ready_s"
#: The fault scenario's gang: 4 workers, one pod each (tests/test_e2e.py, e2e-fault-gang).
LOCAL_GANG_PODS = 4
#: The fault scenario's detection path: Prometheus scrapes every 1 s, the guard polls every 1 s and the fake
#: exporter has no sampling interval (tests/test_e2e.py); the stack's own path replaces it at scale.
LOCAL_DETECT_PATH_S = 2.0
#: Reads at this multiple of the declared write bandwidth (the stack declares no read rate).
READ_TO_WRITE = 1.0
#: A figure above this is not a restart phase of the local cluster (seconds): refused as bad input.
MAX_PHASE_S = 86_400.0

TERMS = ("detection", "eviction", "rescheduling", "container start", "rendezvous + NCCL init", "checkpoint load")
#: A restart in place (``training_runtime.supervisor``): no eviction, rescheduling or container start.
IN_PLACE_TERMS = ("supervisors see the failure", "worker process start", "rendezvous + NCCL init", "checkpoint load")
#: tests/test_e2e_stack_in_pods.py's researcher gang (``real_gang``): a worker killed under its supervisor.
REAL_GANG_KEY = "real_gang"
IN_PLACE_FIRST_STEP_KEY = "inplace_fault_to_first_step_s"
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
class Measurements:
    """What the local cluster's end-to-end runs wrote, already checked; None where a figure is absent or bad."""

    detect_s: float | None = None
    evict_s: float | None = None
    reschedule_s: float | None = None
    pod_start_s: float | None = None
    fault_to_first_step_s: float | None = None
    #: Fault to first step when the fault is fatal (the crash path, ``guard_fatal_loop``).
    fatal_fault_to_first_step_s: float | None = None
    #: A worker killed under its supervisor to the gang's first step after the restart in place (``real_gang``).
    inplace_fault_to_first_step_s: float | None = None
    #: Eviction and rescheduling at scale (pods, evict_s, reschedule_s), medians, by pods; empty when not run.
    at_scale: tuple[tuple[int, float, float], ...] = ()
    #: Why each absent figure is absent, naming the file and the key.
    notes: tuple[str, ...] = ()
    phases_file: str = ""
    realnodes_file: str = ""
    scale_file: str = ""

    @property
    def any(self) -> bool:
        return any(v is not None for v in (self.detect_s, self.evict_s, self.reschedule_s, self.pod_start_s))


def _load_object(path: Path) -> tuple[dict[str, Any] | None, str]:
    """The file's JSON object, or None and why not."""
    if not path.is_file():
        return None, f"{path.name}: absent (run `make e2e`)"
    try:
        loaded = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        return None, f"{path.name}: unreadable ({type(exc).__name__})"
    except (json.JSONDecodeError, RecursionError) as exc:
        return None, f"{path.name}: not JSON ({type(exc).__name__})"
    if not isinstance(loaded, dict):
        return None, f"{path.name}: not a JSON object ({type(loaded).__name__})"
    return loaded, ""


def _seconds(data: dict[str, Any], key: str, file: str) -> tuple[float | None, str]:
    """``data[key]`` as a finite number of seconds in [0, MAX_PHASE_S], or None and a note naming file and key."""
    if key not in data:
        return None, f"{file}: key {key} absent"
    value = data[key]
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None, f"{file}: key {key} is not a number ({type(value).__name__})"
    seconds = float(value)
    if not math.isfinite(seconds) or seconds < 0 or seconds > MAX_PHASE_S:
        return None, f"{file}: key {key} = {value!r} is not a phase in seconds (0 to {MAX_PHASE_S:g})"
    return seconds, ""


def _loop_first_step(pods: dict[str, Any], key: str, file: str, notes: list[str],
                     figure: str = FIRST_STEP_KEY) -> float | None:
    """A loop's fault to first step from the real-process file, or None with a note naming file and key."""
    loop = pods.get(key)
    if not isinstance(loop, dict):
        notes.append(f"{file}: key {key} is not an object of phases")
        return None
    seconds, why = _seconds(loop, figure, f"{file} {key}")
    if why:
        notes.append(why)
    return seconds


def read_scale_crashes(path: Path, notes: list[str]) -> tuple[tuple[int, float, float], ...]:
    """(pods, evict_s, reschedule_s) medians of every shape's crash runs, by pods (a later shape's figure replaces
    an earlier one's at the same size); anything malformed is skipped with a note naming the shape and the size."""
    data, why = _load_object(path)
    if data is None:
        notes.append(why.replace("make e2e", "make bench-scale"))
        return ()
    shapes = data.get("shapes")
    if not isinstance(shapes, dict):
        notes.append(f"{path.name}: key shapes is not an object")
        return ()
    found: dict[int, tuple[float, float]] = {}
    for shape, entry in shapes.items():
        crash = entry.get("crash") if isinstance(entry, dict) else None
        if crash is None:
            continue
        if not isinstance(crash, dict):
            notes.append(f"{path.name}: shapes.{shape}.crash is not an object")
            continue
        for size, figures in crash.items():
            where = f"{path.name} shapes.{shape}.crash.{size}"
            if not (isinstance(size, str) and size.isdigit() and 0 < int(size) <= 100_000):
                notes.append(f"{where}: not a gang size")
                continue
            terms = []
            for key in ("evict_s", "reschedule_s"):
                stats = figures.get(key) if isinstance(figures, dict) else None
                value, why = _seconds(stats, "p50", f"{where}.{key}") if isinstance(stats, dict) else (
                    None, f"{where}: key {key} is not an object of percentiles")
                if why:
                    notes.append(why)
                terms.append(value)
            if terms[0] is not None and terms[1] is not None:
                found[int(size)] = (terms[0], terms[1])
    return tuple((p, e, r) for p, (e, r) in sorted(found.items()))


def at_scale(points: tuple[tuple[int, float, float], ...], n_pods: int) -> tuple[float, float, str]:
    """Eviction and rescheduling seconds at ``n_pods`` from the scale runs: the measured figure at that size (within
    1 %); else linear between the two measured sizes around it; below the smallest, that one scaled by pods; above
    the largest, along the line through the two largest (never below the largest's figures)."""
    if not points:
        raise ValueError("no scale measurement")
    exact = next((pt for pt in points if abs(pt[0] - n_pods) <= 0.01 * n_pods), None)
    if exact is not None:
        return exact[1], exact[2], f"measured at {exact[0]:,} pods"
    below = [pt for pt in points if pt[0] < n_pods]
    above = [pt for pt in points if pt[0] > n_pods]
    if not below or len(points) == 1:
        p, e, r = above[0] if not below else below[-1]
        return e * n_pods / p, r * n_pods / p, f"measured at {p:,} pods, scaled by pods"
    if above:
        lo, hi = below[-1], above[0]
    else:
        lo, hi = points[-2], points[-1]
    f = (n_pods - lo[0]) / (hi[0] - lo[0])
    evict = max(0.0, lo[1] + f * (hi[1] - lo[1]))
    resched = max(0.0, lo[2] + f * (hi[2] - lo[2]))
    if not above:  # past the largest measured size: at least what it took
        evict, resched = max(evict, hi[1]), max(resched, hi[2])
    how = "between" if lo[0] < n_pods < hi[0] else "along the line through"
    return evict, resched, f"{how} {lo[0]:,} and {hi[0]:,} pods measured"


def read_measurements(phases: Path = PHASES_FILE, realnodes: Path = REALNODES_FILE,
                      in_pods: Path = IN_PODS_FILE, scale: Path = SCALE_FILE) -> Measurements:
    """The measured terms from the three files; never raises on their content (see the module docstring). The fault
    to the first step after resume comes from the guard's loop with real processes (``in_pods``) when it ran,
    else from the phases file."""
    notes: list[str] = []
    got: dict[str, float | None] = dict.fromkeys(PHASE_KEYS)
    data, why = _load_object(phases)
    if data is None:
        notes.append(why)
    else:
        for key in PHASE_KEYS:
            got[key], why = _seconds(data, key, phases.name)
            if why and key != FIRST_STEP_KEY:
                notes.append(why)
    quarantine, evicted, restarted = got[QUARANTINE_KEY], got[EVICTED_KEY], got[RESTARTED_KEY]
    evict_s = reschedule_s = None
    if quarantine is not None and evicted is not None:
        if evicted >= quarantine:
            evict_s = evicted - quarantine
        else:
            notes.append(f"{phases.name}: key {EVICTED_KEY} ({evicted:g}) is before {QUARANTINE_KEY} "
                         f"({quarantine:g}): eviction not measured")
    if evicted is not None and restarted is not None:
        if restarted >= evicted:
            reschedule_s = restarted - evicted
        else:
            notes.append(f"{phases.name}: key {RESTARTED_KEY} ({restarted:g}) is before {EVICTED_KEY} "
                         f"({evicted:g}): rescheduling not measured")
    pod_start_s = None
    real, why = _load_object(realnodes)
    if real is None:
        notes.append(why)
    else:
        pod_start_s, why = _seconds(real, POD_START_KEY, realnodes.name)
        if why:
            notes.append(why)
    first_step = got[FIRST_STEP_KEY]
    pods, why = _load_object(in_pods)
    fatal_first_step = inplace_first_step = None
    if pods is None:
        notes.append(why)
    else:
        measured = _loop_first_step(pods, GUARD_LOOP_KEY, in_pods.name, notes)
        first_step = measured if measured is not None else first_step
        fatal_first_step = _loop_first_step(pods, GUARD_FATAL_LOOP_KEY, in_pods.name, notes)
        inplace_first_step = _loop_first_step(pods, REAL_GANG_KEY, in_pods.name, notes, IN_PLACE_FIRST_STEP_KEY)
    crashes = read_scale_crashes(scale, notes)
    return Measurements(detect_s=quarantine, evict_s=evict_s, reschedule_s=reschedule_s, pod_start_s=pod_start_s,
                        fault_to_first_step_s=first_step, fatal_fault_to_first_step_s=fatal_first_step,
                        inplace_fault_to_first_step_s=inplace_first_step,
                        at_scale=crashes, notes=tuple(notes),
                        phases_file=phases.name, realnodes_file=realnodes.name, scale_file=scale.name)


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
