"""Asynchronous checkpoints: the step stalls only for the in-memory snapshot; the write runs in the background.

At 16k GPUs a 30-second blocking write every Young–Daly interval costs several points of effective
training time; here the caller pays the snapshot (copying state into memory it will not mutate) plus,
if the previous checkpoint is still being written, the wait for it to commit. One background thread
writes this rank's shard; rank 0 then waits for every rank's shard and commits. A failed write is
raised at the next checkpoint (or :meth:`AsyncCheckpointer.close`): a job that silently stopped
checkpointing would lose days at its next crash. It is raised as :class:`CheckpointWriteError`, naming the
directory, the step and the earlier checkpoint that is kept, because a bare ``[Errno 28]`` at an emergency
checkpoint tells the person paged neither what was lost nor what the restart will resume. Where a local copy is
configured, the same thread keeps this rank's shard in the pod's memory too (``training_runtime.local_cache``), so a
restart in place reads it back without the shared filesystem; that copy is best effort and never fails the write.
"""

from __future__ import annotations

import errno
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Protocol

from training_runtime.collective import Collective, broadcast
from training_runtime.local_cache import LocalShardCache
from training_runtime.metrics import TrainingMetrics
from training_runtime.settings import CheckpointSettings, DistEnv
from training_runtime.store import CheckpointStore, step_dir_name

log = logging.getLogger("training_runtime.checkpoint")

#: The most a crash can cost, in checkpoint intervals: the steps since the newest checkpoint started (at most
#: one interval) plus, when that checkpoint was still being written, the interval before it (the next
#: checkpoint waits for the previous write, so no more than one write is ever in flight).
LOSS_BOUND_INTERVALS = 2


class Snapshot(Protocol):
    """State already copied in memory; ``files()`` serialises it (runs in the background thread)."""

    def files(self) -> Iterable[tuple[str, bytes]]: ...


class BytesSnapshot:
    """The framework-free snapshot: file name → bytes (immutable, so holding them is the copy)."""

    def __init__(self, files: Mapping[str, bytes]) -> None:
        self._files = dict(files)

    def files(self) -> Iterable[tuple[str, bytes]]:
        return self._files.items()


Capture = Callable[[], Snapshot | Mapping[str, bytes]]


class CheckpointWriteError(OSError):
    """A checkpoint that could not be written or committed; nothing older was touched.

    An ``OSError`` (its ``errno`` is the cause's) so callers that caught the bare error still catch this one.
    """

    def __init__(self, message: str, *, directory: Path, step: int, cause: OSError) -> None:
        super().__init__(message)
        self.errno = cause.errno
        self.directory, self.step = directory, step


def write_failure(store: CheckpointStore, step: int, cause: OSError, *, commits: bool) -> CheckpointWriteError:
    """The error for a failed write of ``step``: where, which step, why, and what the job still has.

    ``commits``: this rank commits (rank 0), so it knows the step was not published unless it renamed it into
    place; another rank may have handed its shard over before failing, so it promises only what is kept.
    """
    why = str(cause)
    if cause.errno == errno.ENOSPC:
        why += " (the checkpoint filesystem is full)"
    name = step_dir_name(step)
    try:
        renamed = (store.root / name).is_dir()  # the failure came after the rename (the directory's fsync)
        kept = store.newest_complete_below(step)
    except OSError:
        renamed, kept = False, None
    if renamed:
        state = f"{name} was renamed into place but may not be durable (a restart verifies it before use)"
    else:
        state = f"{name} is not published" if commits else \
            f"{name} is published only if rank 0 received every rank's shard"
    certain = commits and not renamed
    if kept is not None:
        keeps = f"the previous complete checkpoint, step {kept.step} ({kept.path}), is kept"
        keeps += " and a restart resumes from it" if certain else ""
    else:
        keeps = "no earlier complete checkpoint exists" + (", so a restart starts from step 0" if certain else "")
    return CheckpointWriteError(f"checkpoint step {step} could not be written to {store.root}: {why}. {state}; "
                                f"{keeps}", directory=store.root, step=step, cause=cause)


class AsyncCheckpointer:
    def __init__(self, store: CheckpointStore, settings: CheckpointSettings, dist: DistEnv, collective: Collective,
                 metrics: TrainingMetrics, *, timeout_seconds: float, start_step: int = 0,
                 clock: Callable[[], float] = time.monotonic, cache: LocalShardCache | None = None) -> None:
        self.store, self.settings, self.dist = store, settings, dist
        #: Where this rank also keeps its newest shard for a restart in place (``None``: nowhere).
        self.cache = cache
        self.collective, self.metrics, self.timeout = collective, metrics, timeout_seconds
        self.clock = clock
        self.last_started_step = start_step
        self.last_started_at = clock()
        #: Step of the newest checkpoint this rank knows to be durable (rank 0: committed).
        self.last_durable_step: int | None = None
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="checkpoint-writer")
        self._inflight: Future[None] | None = None

    def due(self, step: int) -> bool:
        """Whether ``step`` is a checkpoint step; the same answer on every rank."""
        if step - self.last_started_step >= self.settings.interval_steps:
            return True
        if self.settings.interval_seconds is None:
            return False
        # Clocks and step times differ between ranks: rank 0's clock decides and every rank follows (one small
        # broadcast per step, only when a time interval is set).
        late = self.clock() - self.last_started_at >= self.settings.interval_seconds
        return bool(broadcast(self.collective, late))

    def maybe_save(self, step: int, capture: Capture) -> bool:
        if not self.due(step):
            return False
        self.save(step, capture)
        return True

    def save(self, step: int, capture: Capture) -> None:
        started = self.clock()
        self.wait()
        taken = capture()
        snapshot = BytesSnapshot(taken) if isinstance(taken, Mapping) else taken
        stall = self.clock() - started
        self.metrics.checkpoint_stall.set(stall)
        self.last_started_step, self.last_started_at = step, started
        self._inflight = self._executor.submit(self._write, step, snapshot, started)

    def _write(self, step: int, snapshot: Snapshot, started: float) -> None:
        d = self.dist
        copy = self.cache.copy(step) if self.cache is not None else None
        try:
            files = snapshot.files() if copy is None else copy.tee(snapshot.files())
            entries = self.store.write_shard(d.attempt_key, step, d.rank, files)
            if copy is not None:
                copy.finish()  # never raises: the copy is best effort, the shared shard is the checkpoint
            published = self.store.commit(d.attempt_key, step, d.world_size, self.timeout) if d.rank == 0 else None
        except BaseException as exc:
            if copy is not None:
                copy.abandon()
            # write_shard removed this rank's partial files; rank 0 drops the whole step, which can no longer be
            # committed (its parts were consumed or never came). Older checkpoints are never touched here.
            if d.rank == 0:
                self.store.discard(d.attempt_key, step)
            if isinstance(exc, OSError):
                raise write_failure(self.store, step, exc, commits=d.rank == 0) from exc
            raise
        # Durable before retention runs: from here the graceful stop counts as made (see stopping.py).
        self.last_durable_step = step
        written = sum(e.size for e in entries)
        if published is not None:
            self.store.prune(self.settings.keep_last, current_attempt=d.attempt_key, newest=step)
            log.info("checkpoint step %d committed: %d files, %d bytes in %.3f s", step,
                     len(published.manifest.files), published.manifest.total_bytes, self.clock() - started)
        self.metrics.checkpoint_duration.set(self.clock() - started)
        self.metrics.checkpoint_bytes.set(written)
        self.metrics.checkpoint_last_step.set(step)

    def wait(self) -> None:
        """Block until the in-flight write has committed; re-raise its failure."""
        inflight, self._inflight = self._inflight, None
        if inflight is not None:
            inflight.result()

    @property
    def writing(self) -> bool:
        return self._inflight is not None and not self._inflight.done()

    def close(self) -> None:
        try:
            self.wait()
        finally:
            self._executor.shutdown(wait=True)
