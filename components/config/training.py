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
from training_runtime.settings import DEFAULT_REPLACE_TIMEOUT_SECONDS, DEFAULT_RESTARTS_BEFORE_REPLACE

#: Room in a job name for Volcano's pod names (``<job>-worker-<index>``, also the pods' host names).
JOB_NAME_ROOM = 16

if TYPE_CHECKING:
    from components.config.cluster import ClusterConfig


#: The rendezvous port the training template passes to Volcano's pytorch plugin (``--port``).
VOLCANO_PYTORCH_PORT = 23456


class Nccl(ConfigModel):
    """Watchdog settings so a silent NCCL hang turns into a crash the gang restarts from."""

    async_error_handling: bool = True
    """`TORCH_NCCL_ASYNC_ERROR_HANDLING`: a failed or timed-out collective ends the process, so the gang
    restarts instead of hanging."""
    heartbeat_timeout_seconds: PositiveInt = 480
    """`TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC`: PyTorch's monitor ends a rank whose NCCL watchdog has been stuck this
    long (seconds)."""
    collective_timeout_seconds: PositiveInt = 600
    """Timeout of every collective (seconds), which the training runtime passes to `init_process_group`
    (`TRAINING_COLLECTIVE_TIMEOUT_SECONDS`)."""
    debug: Literal["WARN", "INFO", "VERSION"] = "WARN"
    """`NCCL_DEBUG`: how much NCCL logs."""


class CheckpointMount(ConfigModel):
    filesystem: DnsLabel
    """The `checkpoint.filesystems` entry whose claim the workers mount."""
    mount_path: AbsolutePath = "/checkpoints"
    """Where the job's own directory of that filesystem is mounted (`CHECKPOINT_DIR`)."""
    interval_steps: PositiveInt = 500
    """Checkpoint every this many steps (`CHECKPOINT_INTERVAL_STEPS`)."""
    interval_seconds: PositiveInt | None = None
    """Also checkpoint when this many seconds passed since the last one (whichever comes first;
    `CHECKPOINT_INTERVAL_SECONDS`). The goodput model compares it with the job's Young–Daly optimum."""
    keep_last: PositiveInt = 3
    """How many of the newest complete checkpoints the runtime keeps; it deletes older ones (`CHECKPOINT_KEEP_LAST`)."""


class TrainingJob(ConfigModel):
    name: Annotated[DnsLabel, dns_1035(JOB_NAME_ROOM)]
    """Name of the job (its pods are `<name>-worker-<index>`) and of its directory on the checkpoint
    filesystem."""
    enabled: bool = False
    """Create the job in the cluster; a disabled one is still validated but not created."""
    image: PinnedImage
    """Pinned image of the trainer."""
    pool: DnsLabel
    """GPU pool the workers are held to (on-prem only)."""
    workers: PositiveInt
    """Worker pods of the gang, all scheduled together or not at all; at most the pool's nodes."""
    gpus_per_worker: PositiveInt = 8
    """GPUs each worker requests (limit = request); at most the pool's GPUs per node."""
    cpu_per_worker: Quantity = "64"
    """CPU request of each worker; size it below the pool's allocatable or the gang never fits."""
    memory_per_worker: Quantity = "1024Gi"
    """Memory request and limit of each worker; size it below the pool's allocatable or the gang never fits."""
    max_retries: NonNegativeInt = 5
    """Restarts of the whole gang (from its last checkpoint) before the job fails (Volcano `maxRetry`)."""
    command: list[str] = Field(default_factory=list)
    """Command of the trainer container; the image's entrypoint when empty."""
    checkpoint: CheckpointMount | None = None
    """The checkpoint filesystem the workers mount and how often they write; none when unset."""
    team: DnsLabel | None = None
    """The team (`scheduling.teams`) whose queue the gang goes to; the pool's training queue when unset."""


class RestartInPlace(ConfigModel):
    """Restart in place: a supervisor in every worker pod restarts the gang's processes inside their pods when a
    rank dies for a reason that is not its node's (an application crash, an NCCL timeout, an OOM), so the pods,
    their nodes and their bindings stay and Volcano sees no pod failure. Needs the job's `command` (the
    supervisor runs it) and a `checkpoint` (the supervisors meet on it, the workers resume from it); a job
    without either restarts as a whole gang through Volcano, as does a pod that gives up."""

    enabled: bool = True
    """Wrap every training job's command in the supervisor (`python3 -m training_runtime.supervisor --`)."""
    restarts_before_replace: Annotated[int, Field(ge=0, le=100)] = DEFAULT_RESTARTS_BEFORE_REPLACE
    """Worker deaths in one pod after which that pod fails for real (its node may be the cause after all) and
    the gang restarts through Volcano; 0: never restart in place."""
    replace_timeout_seconds: Annotated[int, Field(ge=10, le=3600)] = int(DEFAULT_REPLACE_TIMEOUT_SECONDS)
    """How long the ranks of a restart wait for every rank (a pod that is gone and being replaced) before the
    whole gang restarts through Volcano (seconds)."""


class Training(ConfigModel):
    nccl: Nccl = Nccl()
    """NCCL watchdog settings every worker gets, so a silent hang becomes a crash the gang restarts from."""
    metrics_port: Annotated[int, Field(ge=1024, le=65535)] = 9318
    """Port of the training runtime's /metrics endpoint in every worker (scraped by the job's PodMonitor);
    not Volcano's pytorch rendezvous port (23456)."""
    jobs: list[TrainingJob] = Field(default_factory=list)
    """Training jobs the stack runs, each a gang (a Volcano Job, or a PodGroup and Job with kube-batch)."""
    restart_in_place: RestartInPlace = RestartInPlace()
    """Restart a crashed gang inside its pods instead of recreating them (docs/training.md)."""
    prepull_images: list[PinnedImage] = Field(default_factory=list)
    """Images pulled ahead onto every warm spare (`pools[].spareNodes`), beside the images of the jobs declared on
    its pool: those of the gangs researchers submit, so a replacement on a spare starts without a pull."""

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
        elif job.workers > len(cfg.pool(job.pool).node_names) - cfg.pool(job.pool).spares:
            pool = cfg.pool(job.pool)
            held = f", {pool.spares} of them warm spares training never uses" if pool.spares else ""
            problems.append(
                Problem(f"training.jobs[{index}].workers",
                        f"pool '{job.pool}' has only {len(pool.node_names)} nodes{held}", job.workers)
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
