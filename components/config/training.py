"""Training jobs and NCCL watchdogs; a job must fit its pool and name a declared checkpoint filesystem."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Literal

from pydantic import Field, field_validator

from components.config.base import (
    AbsolutePath,
    ConfigModel,
    DnsLabel,
    NonNegativeInt,
    PinnedImage,
    PositiveInt,
    Problem,
    Quantity,
    dns_1035,
    unique_names,
)

#: Room in a job name for Volcano's pod names (``<job>-worker-<index>``, also the pods' host names).
JOB_NAME_ROOM = 16

if TYPE_CHECKING:
    from components.config.cluster import ClusterConfig


#: The rendezvous port the training template passes to Volcano's pytorch plugin (``--port``).
VOLCANO_PYTORCH_PORT = 23456


class Nccl(ConfigModel):
    """Watchdog settings so a silent NCCL hang turns into a crash the gang restarts from."""

    async_error_handling: bool = True
    heartbeat_timeout_seconds: PositiveInt = 480
    collective_timeout_seconds: PositiveInt = 600
    debug: Literal["WARN", "INFO", "VERSION"] = "WARN"


class CheckpointMount(ConfigModel):
    filesystem: DnsLabel
    mount_path: AbsolutePath = "/checkpoints"
    interval_steps: PositiveInt = 500
    #: Also checkpoint when this many seconds passed since the last one (whichever comes first; env
    #: CHECKPOINT_INTERVAL_SECONDS). The goodput model compares it with the job's Young–Daly optimum.
    interval_seconds: PositiveInt | None = None
    keep_last: PositiveInt = 3


class TrainingJob(ConfigModel):
    name: Annotated[DnsLabel, dns_1035(JOB_NAME_ROOM)]
    enabled: bool = False
    image: PinnedImage
    pool: DnsLabel
    workers: PositiveInt
    gpus_per_worker: PositiveInt = 8
    #: Per-worker CPU and memory requests; size them below the pool's allocatable or the gang never fits.
    cpu_per_worker: Quantity = "64"
    memory_per_worker: Quantity = "1024Gi"
    max_retries: NonNegativeInt = 5
    command: list[str] = Field(default_factory=list)
    checkpoint: CheckpointMount | None = None
    #: The team (``scheduling.teams``) whose queue the gang goes to; the pool's training queue when unset.
    team: DnsLabel | None = None


class Training(ConfigModel):
    nccl: Nccl = Nccl()
    #: Port of the training runtime's /metrics endpoint in every worker (scraped by the job's PodMonitor);
    #: not Volcano's pytorch rendezvous port (23456).
    metrics_port: Annotated[int, Field(ge=1024, le=65535)] = 9318
    jobs: list[TrainingJob] = Field(default_factory=list)

    @field_validator("metrics_port")
    @classmethod
    def _not_the_rendezvous_port(cls, port: int) -> int:
        if port == VOLCANO_PYTORCH_PORT:
            raise ValueError(f"{port} is Volcano's pytorch rendezvous port; choose another metrics port")
        return port



def training_problems(cfg: ClusterConfig) -> list[Problem]:
    """Job names are distinct; each job fits its pool (nodes, GPUs per node) and names a declared filesystem."""
    problems = unique_names(enumerate(j.name for j in cfg.training.jobs), "training.jobs", "job")
    pool_names = {p.name for p in cfg.pools}
    fs_names = {f.name for f in cfg.checkpoint.filesystems}
    for index, job in enumerate(cfg.training.jobs):
        if job.pool not in pool_names:
            problems.append(
                Problem(f"training.jobs[{index}].pool", f"unknown pool; expected one of {sorted(pool_names)}",
                        job.pool)
            )
        elif job.workers > len(cfg.pool(job.pool).node_names):
            problems.append(
                Problem(f"training.jobs[{index}].workers",
                        f"pool '{job.pool}' has only {len(cfg.pool(job.pool).node_names)} nodes", job.workers)
            )
        elif job.gpus_per_worker > cfg.pool(job.pool).gpus_per_node:
            problems.append(
                Problem(f"training.jobs[{index}].gpusPerWorker",
                        f"pool '{job.pool}' nodes have {cfg.pool(job.pool).gpus_per_node} GPUs",
                        job.gpus_per_worker)
            )
        if job.team is not None and cfg.scheduling.team(job.team) is None:
            problems.append(
                Problem(f"training.jobs[{index}].team",
                        f"unknown team; expected one of {[t.name for t in cfg.scheduling.teams]} "
                        "(scheduling.teams)", job.team)
            )
        if job.checkpoint is not None and job.checkpoint.filesystem not in fs_names:
            problems.append(
                Problem(f"training.jobs[{index}].checkpoint.filesystem",
                        f"unknown filesystem; expected one of {sorted(fs_names)}", job.checkpoint.filesystem)
            )
    return problems
