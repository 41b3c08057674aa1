"""Everything the runtime reads from its environment, in one place, with a clear error per bad value.

The training template (``components/training_job.py``) sets these; a test checks that every variable
the template sets is read here (or by PyTorch/NCCL themselves, listed in :data:`FRAMEWORK_ENV`).

Rank, world size and the rendezvous address come from Volcano's ``pytorch`` job plugin: it appends
``MASTER_ADDR`` (``<job>-<master task>-0.<job>``), ``MASTER_PORT`` (its ``--port``), ``WORLD_SIZE`` (the
replicas of the master and worker tasks) and ``RANK`` (master: 0, worker pod *i*: *i* + 1) to every
container. Our template runs one task that is both master and worker (``--master=worker
--worker=worker``), and then the plugin numbers ranks 1..N (it checks the worker name first), so the
template sets ``TRAINING_RANK_SOURCE=VC_TASK_INDEX``: the rank is the pod's index from Volcano's ``env``
plugin (0..N-1), and rank 0 is the pod ``MASTER_ADDR`` names. Outside Volcano (the local gang launcher)
``RANK`` is right and is the default. Under ``torchrun`` inside the pod (several processes per pod; pass it
``--node-rank=$(VC_TASK_INDEX) --master-addr=$(MASTER_ADDR)``) torchrun sets every child's ``RANK``,
``LOCAL_RANK`` and ``WORLD_SIZE``; a set ``LOCAL_RANK`` means exactly that, and ``RANK`` is then used.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

# Volcano's pytorch plugin (pkg/controllers/job/plugins/distributed-framework/pytorch) and env plugin.
RANK = "RANK"
WORLD_SIZE = "WORLD_SIZE"
MASTER_ADDR = "MASTER_ADDR"
MASTER_PORT = "MASTER_PORT"
VC_TASK_INDEX = "VC_TASK_INDEX"
#: Set by torchrun for each process it starts; the restart count goes up each time its agents restart the workers.
LOCAL_RANK = "LOCAL_RANK"
ELASTIC_RESTARTS = "TORCHELASTIC_RESTART_COUNT"
#: Set by the gang's supervisor (``training_runtime.supervisor``) for each worker it starts: the restart in place
#: round, so every round meets under its own rendezvous key and resumes from the newest complete checkpoint.
INPLACE_RESTARTS = "TRAINING_INPLACE_RESTARTS"
#: Exit code of a rank that stopped gracefully because another rank was asked to (an eviction of that rank's pod):
#: its own pod stays, and under the supervisor it restarts in place with the replacement (0 without a supervisor).
PEER_STOP_EXIT = 76
#: Set by the training template where the stack restarts gangs in place (``training.restartInPlace``), read by the
#: supervisor: worker deaths in one pod before the pod fails for real, and how long a restart waits for every rank.
RESTARTS_BEFORE_REPLACE = "TRAINING_RESTARTS_BEFORE_REPLACE"
REPLACE_TIMEOUT = "TRAINING_REPLACE_TIMEOUT_SECONDS"
DEFAULT_RESTARTS_BEFORE_REPLACE = 3
DEFAULT_REPLACE_TIMEOUT_SECONDS = 300.0
# Set by the training template.
RANK_SOURCE = "TRAINING_RANK_SOURCE"
#: The gang's attempt: Volcano's ``volcano.sh/job-retry-count`` pod annotation through the downward API.
ATTEMPT = "TRAINING_ATTEMPT"
#: This incarnation of the job: the ``scheduling.k8s.io/group-name`` annotation (``<job>-<job UID>``), so a
#: job deleted and recreated under the same name (its retry count starts again at 0) never meets the old
#: one's staging or rendezvous files.
RUN_ID = "TRAINING_RUN_ID"
#: The one collective timeout: passed to ``init_process_group(timeout=...)``; also bounds the file rendezvous
#: and the wait for every rank's shard at a checkpoint commit. No NCCL or PyTorch variable sets it.
COLLECTIVE_TIMEOUT = "TRAINING_COLLECTIVE_TIMEOUT_SECONDS"
#: How long a rank's heartbeat may be silent before the file collective's peers take it for dead and stop waiting
#: (the file rendezvous only; NCCL has its own watchdog, ``TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC``).
PEER_DEAD_AFTER = "TRAINING_PEER_DEAD_AFTER_SECONDS"
METRICS_PORT = "TRAINING_METRICS_PORT"
HEARTBEAT_METRIC = "TRAINING_HEARTBEAT_METRIC"
CHECKPOINT_DIR = "CHECKPOINT_DIR"
CHECKPOINT_INTERVAL_STEPS = "CHECKPOINT_INTERVAL_STEPS"
CHECKPOINT_INTERVAL_SECONDS = "CHECKPOINT_INTERVAL_SECONDS"
CHECKPOINT_KEEP_LAST = "CHECKPOINT_KEEP_LAST"
CHECKPOINT_RESUME = "CHECKPOINT_RESUME"
#: Where each rank keeps a copy of its newest shard for a restart in place (``training_runtime.local_cache``): set by
#: the template, under the pod's memory-backed ``/dev/shm``, where the gang restarts in place; unset, no copy.
CHECKPOINT_LOCAL_CACHE = "CHECKPOINT_LOCAL_CACHE"
#: The largest shard (GB, 10^9 bytes) a rank keeps a copy of: the copy is memory the pod's limit counts.
CHECKPOINT_LOCAL_CACHE_MAX_GB = "CHECKPOINT_LOCAL_CACHE_MAX_GB"
DEFAULT_LOCAL_CACHE_MAX_GB = 8.0

#: Read by PyTorch's ProcessGroupNCCL watchdog and by NCCL itself, not by this runtime.
FRAMEWORK_ENV = frozenset({
    "TORCH_NCCL_ASYNC_ERROR_HANDLING",
    "TORCH_NCCL_ENABLE_MONITORING",
    "TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC",
    "NCCL_DEBUG",
})

DEFAULT_HEARTBEAT_METRIC = "training_step_heartbeat_timestamp_seconds"
DEFAULT_COLLECTIVE_TIMEOUT_SECONDS = 600.0
#: Ten missed beats of one second: a stalled filesystem write or a long pause is not a death.
DEFAULT_PEER_DEAD_AFTER_SECONDS = 10.0


class SettingsError(ValueError):
    """A bad environment variable; the message names it and its value."""


def _get(env: Mapping[str, str], name: str) -> str | None:
    value = env.get(name)
    return value if value not in (None, "") else None


def _int(env: Mapping[str, str], name: str, default: int | None, minimum: int) -> int:
    raw = _get(env, name)
    if raw is None:
        if default is None:
            raise SettingsError(f"{name} is not set")
        return default
    try:
        value = int(raw)
    except ValueError:
        raise SettingsError(f"{name}={raw!r}: expected a whole number") from None
    if value < minimum:
        raise SettingsError(f"{name}={raw!r}: expected at least {minimum}")
    return value


def _positive(env: Mapping[str, str], name: str, default: float | None, *, unit: str = "seconds") -> float | None:
    """A positive finite number (of ``unit``)."""
    raw = _get(env, name)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise SettingsError(f"{name}={raw!r}: expected {unit}") from None
    if not math.isfinite(value) or value <= 0:
        raise SettingsError(f"{name}={raw!r}: expected a positive number of {unit}")
    return value


def _run_id(env: Mapping[str, str]) -> str:
    raw = _get(env, RUN_ID) or "run"
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9.-]{0,252}", raw):
        raise SettingsError(f"{RUN_ID}={raw!r}: expected letters, digits, '.' and '-'")
    return raw


@dataclass(frozen=True)
class DistEnv:
    """Where this process sits in the gang."""

    rank: int
    world_size: int
    master_addr: str
    master_port: int
    attempt: int
    run_id: str = "run"
    #: Worker restarts by torchrun inside the pods of this attempt (all agents restart together).
    elastic_restarts: int = 0
    #: Started by torchrun, which already runs a rendezvous store on ``MASTER_PORT``.
    under_torchrun: bool = False
    #: The supervisor's round (``training_runtime.supervisor``): every rank's worker of one round, whatever Volcano
    #: attempt its pod belongs to (a replaced pod's is one higher), meets under it.
    inplace_restarts: int = 0
    #: Started by the supervisor (it sets the round, 0 included).
    supervised: bool = False

    @property
    def attempt_key(self) -> str:
        """Names this attempt's staging and rendezvous directories. Under the supervisor its round names them: the
        rounds of one run never repeat (a new gang starts past the last one), and a pod that replaced one of the
        gang's carries a higher Volcano attempt than the ranks it meets."""
        if self.supervised:
            return f"{self.run_id}-s{self.inplace_restarts}-r{self.elastic_restarts}"
        return f"{self.run_id}-a{self.attempt}-r{self.elastic_restarts}"

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> DistEnv:
        world = _int(env, WORLD_SIZE, 1, 1)
        source = _get(env, RANK_SOURCE) or RANK
        if source not in (RANK, VC_TASK_INDEX):
            raise SettingsError(f"{RANK_SOURCE}={source!r}: expected {RANK} or {VC_TASK_INDEX}")
        under_torchrun = _get(env, LOCAL_RANK) is not None
        if under_torchrun:
            source = RANK
        rank = _int(env, source, 0 if world == 1 else None, 0)
        if rank >= world:
            raise SettingsError(f"{source}={rank} is not below {WORLD_SIZE}={world}")
        return cls(
            rank=rank,
            world_size=world,
            master_addr=_get(env, MASTER_ADDR) or "127.0.0.1",
            master_port=_int(env, MASTER_PORT, 23456, 1),
            attempt=_int(env, ATTEMPT, 0, 0),
            run_id=_run_id(env),
            elastic_restarts=_int(env, ELASTIC_RESTARTS, 0, 0) if under_torchrun else 0,
            under_torchrun=under_torchrun,
            inplace_restarts=_int(env, INPLACE_RESTARTS, 0, 0),
            supervised=_get(env, INPLACE_RESTARTS) is not None,
        )


@dataclass(frozen=True)
class CheckpointSettings:
    directory: Path
    interval_steps: int
    #: Also checkpoint when this much wall time passed since the last one (rank 0's clock decides).
    interval_seconds: float | None
    keep_last: int
    resume: bool
    #: This rank's copy of its newest shard (``None``: none kept), and the largest shard it keeps a copy of.
    local_cache: Path | None = None
    local_cache_max_bytes: int = int(DEFAULT_LOCAL_CACHE_MAX_GB * 1e9)

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> CheckpointSettings | None:
        directory = _get(env, CHECKPOINT_DIR)
        if directory is None:
            return None
        resume = _get(env, CHECKPOINT_RESUME) or "latest"
        if resume not in ("latest", "none"):
            raise SettingsError(f"{CHECKPOINT_RESUME}={resume!r}: expected 'latest' or 'none'")
        cache = _get(env, CHECKPOINT_LOCAL_CACHE)
        if cache is not None and not Path(cache).is_absolute():
            raise SettingsError(f"{CHECKPOINT_LOCAL_CACHE}={cache!r}: expected an absolute path")
        max_gb = _positive(env, CHECKPOINT_LOCAL_CACHE_MAX_GB, DEFAULT_LOCAL_CACHE_MAX_GB, unit="gigabytes")
        assert max_gb is not None
        return cls(
            directory=Path(directory),
            interval_steps=_int(env, CHECKPOINT_INTERVAL_STEPS, 500, 1),
            interval_seconds=_positive(env, CHECKPOINT_INTERVAL_SECONDS, None),
            keep_last=_int(env, CHECKPOINT_KEEP_LAST, 3, 1),
            resume=resume == "latest",
            local_cache=Path(cache) if cache is not None else None,
            local_cache_max_bytes=int(max_gb * 1e9),
        )


@dataclass(frozen=True)
class InPlaceSettings:
    """The supervisor's bounds (``training_runtime.supervisor``): past them the gang restarts through Volcano."""

    restarts_before_replace: int = DEFAULT_RESTARTS_BEFORE_REPLACE
    replace_timeout_seconds: float = DEFAULT_REPLACE_TIMEOUT_SECONDS

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> InPlaceSettings:
        timeout = _positive(env, REPLACE_TIMEOUT, DEFAULT_REPLACE_TIMEOUT_SECONDS)
        assert timeout is not None
        return cls(restarts_before_replace=_int(env, RESTARTS_BEFORE_REPLACE, DEFAULT_RESTARTS_BEFORE_REPLACE, 0),
                   replace_timeout_seconds=timeout)


@dataclass(frozen=True)
class Settings:
    dist: DistEnv
    checkpoint: CheckpointSettings | None
    collective_timeout_seconds: float
    #: 0: no /metrics endpoint (several ranks on one host in tests).
    metrics_port: int
    heartbeat_metric: str
    peer_dead_after_seconds: float = DEFAULT_PEER_DEAD_AFTER_SECONDS
    in_place: InPlaceSettings = InPlaceSettings()

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Settings:
        metric = _get(env, HEARTBEAT_METRIC) or DEFAULT_HEARTBEAT_METRIC
        if not metric.replace("_", "").replace(":", "").isalnum() or metric[0].isdigit():
            raise SettingsError(f"{HEARTBEAT_METRIC}={metric!r}: expected a Prometheus metric name")
        port = _int(env, METRICS_PORT, 0, 0)
        if port > 65535:
            raise SettingsError(f"{METRICS_PORT}={port}: expected a TCP port")
        timeout = _positive(env, COLLECTIVE_TIMEOUT, DEFAULT_COLLECTIVE_TIMEOUT_SECONDS)
        assert timeout is not None
        dead_after = _positive(env, PEER_DEAD_AFTER, DEFAULT_PEER_DEAD_AFTER_SECONDS)
        assert dead_after is not None
        return cls(
            dist=DistEnv.from_env(env),
            checkpoint=CheckpointSettings.from_env(env),
            collective_timeout_seconds=timeout,
            metrics_port=port,
            heartbeat_metric=metric,
            peer_dead_after_seconds=dead_after,
            in_place=InPlaceSettings.from_env(env),
        )
