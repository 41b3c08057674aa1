"""Checkpoint interval: each training job's Young–Daly optimum from published failure rates.

Pure arithmetic, no Pulumi and nothing from ``bench/``: the preview summary, the checkpoint component's
warnings, ``make simulate`` and the goodput simulator (``bench/sim/goodput.py``) all call it.

* **Failure rate.** Llama 3 405B saw 419 unexpected interruptions in 54 days on 16,384 H100 GPUs. Taken as
  a per-GPU rate, a job's MTBF shrinks in proportion to the GPUs it spans: 3.1 h at 16,384 GPUs, 49.5 h at
  1,024, 4.1 days at 512.
* **Checkpoint cost.** A blocking write stalls training for the whole write, whose time the checkpoint
  sizing code derives from the filesystem's declared bandwidth and the budget's checkpoint size. An
  asynchronous checkpoint stalls only for the in-memory snapshot (a fixed coordination cost plus each
  GPU's shard copied to pinned host memory); the write then runs in the background and the next
  checkpoint waits for its commit, so the interval never drops below the write time.
* **Optimum.** Young–Daly: ``√(2 · C · MTBF)`` with C the stall. The ETTR curve is flat around it (2×
  off costs 25 % more checkpoint-related loss), so the stack check only warns beyond 2×.

The interval a job declares in seconds (``checkpoint.intervalSeconds``, the runtime's
``CHECKPOINT_INTERVAL_SECONDS``) is compared with the optimum for the job's GPUs and filesystem (the
steps interval may still fire first; it only shortens the interval). An interval in steps alone cannot
be compared: its length in seconds depends on the step time, which the stack does not know; the preview
row says so.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from components.config.sizing import GB_PER_TB, assess_filesystem
from components.failure_rate import FAILURES_PER_GPU_SECOND

if TYPE_CHECKING:
    from components.config import ClusterConfig, TrainingJob


#: Asynchronous snapshot: coordination (every rank agrees, tensors are staged) before the copy starts.
SNAPSHOT_FIXED_S = 1.0
#: Device-to-host copy into pinned memory, per GPU (GB/s); well under PCIe Gen5's peak on purpose.
HOST_COPY_GBPS = 10.0
#: The stack check warns when a declared interval is more than this factor away from the optimum.
WARN_FACTOR = 2.0


def job_mtbf_seconds(gpus: int, failures_per_gpu_second: float = FAILURES_PER_GPU_SECOND) -> float:
    """Mean time between interruptions of one job spanning ``gpus`` GPUs."""
    if gpus <= 0 or failures_per_gpu_second <= 0:
        raise ValueError("GPUs and failure rate must be positive")
    return 1.0 / (gpus * failures_per_gpu_second)


def young_daly_seconds(cost_s: float, mtbf_s: float) -> float:
    """Checkpoint interval that minimises stall plus lost work: ``√(2 · C · MTBF)``."""
    if cost_s <= 0 or mtbf_s <= 0:
        raise ValueError("checkpoint cost and MTBF must be positive")
    return math.sqrt(2.0 * cost_s * mtbf_s)


def snapshot_seconds(size_tb: float, gpus: int, fixed_s: float = SNAPSHOT_FIXED_S,
                     host_copy_gbps: float = HOST_COPY_GBPS) -> float:
    """Stall of an asynchronous checkpoint: every GPU copies its shard of the state to host memory at once."""
    if size_tb <= 0 or gpus <= 0 or host_copy_gbps <= 0 or fixed_s < 0:
        raise ValueError("size, GPUs and copy bandwidth must be positive")
    return fixed_s + size_tb * GB_PER_TB / gpus / host_copy_gbps


@dataclass(frozen=True)
class Recommendation:
    """The optimum interval for one job size and one filesystem, blocking and asynchronous."""

    gpus: int
    mtbf_s: float
    write_s: float
    snapshot_s: float

    @property
    def blocking_s(self) -> float:
        """Blocking writes: the stall is the whole write."""
        return young_daly_seconds(self.write_s, self.mtbf_s)

    @property
    def asynchronous_s(self) -> float:
        """Asynchronous writes: the stall is the snapshot; one write in flight at a time."""
        return max(young_daly_seconds(self.snapshot_s, self.mtbf_s), self.write_s)


def recommend(gpus: int, size_tb: float, write_s: float,
              failures_per_gpu_second: float = FAILURES_PER_GPU_SECOND) -> Recommendation:
    if write_s <= 0:
        raise ValueError("write time must be positive")
    return Recommendation(gpus, job_mtbf_seconds(gpus, failures_per_gpu_second), write_s,
                          snapshot_seconds(size_tb, gpus))


def write_seconds(cfg: ClusterConfig, filesystem: str) -> float:
    """One checkpoint of the budget's size at the filesystem's declared bandwidth (the sizing code's number)."""
    return assess_filesystem(cfg.filesystem(filesystem), cfg.checkpoint.budget).seconds_at_declared


def recommend_for_job(cfg: ClusterConfig, job: TrainingJob) -> Recommendation | None:
    """The job's optimum on its own filesystem; None for a job without checkpoints."""
    if job.checkpoint is None:
        return None
    return recommend(job.workers * job.gpus_per_worker, cfg.checkpoint.budget.size_tb,
                     write_seconds(cfg, job.checkpoint.filesystem))


def declared_interval_seconds(job: TrainingJob) -> float | None:
    """The job's interval in seconds when the stack declares one (``checkpoint.intervalSeconds``)."""
    if job.checkpoint is None:
        return None
    value = getattr(job.checkpoint, "interval_seconds", None)
    return float(value) if value is not None else None


def off_factor(declared_s: float, optimum_s: float) -> float:
    """How far a declared interval is from the optimum, as a factor ≥ 1 in either direction."""
    if declared_s <= 0 or optimum_s <= 0:
        raise ValueError("intervals must be positive")
    return max(declared_s / optimum_s, optimum_s / declared_s)


def _hours(seconds: float) -> str:
    return f"{seconds / 3600:.1f} h"


def interval_findings(cfg: ClusterConfig, factor: float = WARN_FACTOR) -> list[tuple[str, str, Any]]:
    """``(key path, message, value)`` for every job whose declared interval is more than ``factor`` off.

    Warnings, never errors: the optimum rests on a published failure rate, not on this cluster's own.
    """
    found: list[tuple[str, str, Any]] = []
    for index, job in enumerate(cfg.training.jobs):
        rec = recommend_for_job(cfg, job)
        declared = declared_interval_seconds(job)
        if rec is None or declared is None or job.checkpoint is None:
            continue
        optimum = rec.asynchronous_s
        off = off_factor(declared, optimum)
        if off <= factor:
            continue
        direction = "longer" if declared > optimum else "shorter"
        found.append((
            f"training.jobs[{index}].checkpoint.intervalSeconds",
            f"job '{job.name}' intervalSeconds {declared:g} is {off:.1f}× {direction} than the optimum "
            f"{optimum:.0f} s for {rec.gpus:,} GPUs (MTBF {_hours(rec.mtbf_s)}, snapshot stall "
            f"{rec.snapshot_s:.1f} s, write {rec.write_s:.0f} s to '{job.checkpoint.filesystem}'); "
            f"with blocking writes the optimum is {rec.blocking_s:.0f} s",
            declared,
        ))
    return found


def interval_warnings(cfg: ClusterConfig) -> list[str]:
    """The findings as warning lines (``path: message``), as the checkpoint component logs them."""
    return [f"{path}: {message}" for path, message, _ in interval_findings(cfg)]


def summary_rows(cfg: ClusterConfig) -> list[tuple[str, str]]:
    """Preview lines: per training job with checkpoints, the optimum and how the declared interval compares."""
    rows = []
    for job in cfg.training.jobs:
        rec = recommend_for_job(cfg, job)
        if rec is None or job.checkpoint is None:
            continue
        declared = declared_interval_seconds(job)
        if declared is None:
            verdict = (f"declares {job.checkpoint.interval_steps} steps: set intervalSeconds "
                       "(CHECKPOINT_INTERVAL_SECONDS) to compare")
        else:
            off = off_factor(declared, rec.asynchronous_s)
            verdict = (f"declares {declared:g} s ({off:.1f}× off): "
                       + ("WARN more than 2× off" if off > WARN_FACTOR else "within 2×"))
        rows.append((
            f"checkpoint interval {job.name}",
            f"{rec.gpus:,} GPUs, MTBF {_hours(rec.mtbf_s)}, '{job.checkpoint.filesystem}' write "
            f"{rec.write_s:.0f} s: asynchronous {rec.asynchronous_s:.0f} s (snapshot {rec.snapshot_s:.1f} s), "
            f"blocking {rec.blocking_s:.0f} s; {verdict}",
        ))
    return rows


def cluster_rows(cfg: ClusterConfig) -> list[tuple[str, str]]:
    """The optimum for one job spanning every on-prem GPU, on each declared filesystem."""
    gpus = cfg.onprem_gpus
    rows = []
    for fs in cfg.checkpoint.filesystems:
        rec = recommend(gpus, cfg.checkpoint.budget.size_tb, write_seconds(cfg, fs.name))
        rows.append((
            f"checkpoint interval, whole cluster on {fs.name}",
            f"{gpus:,} GPUs, MTBF {_hours(rec.mtbf_s)}, write {rec.write_s:.0f} s: asynchronous "
            f"{rec.asynchronous_s:.0f} s (snapshot {rec.snapshot_s:.1f} s), blocking {rec.blocking_s:.0f} s",
        ))
    return rows
