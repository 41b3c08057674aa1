"""Asynchronous checkpoints: the step stalls only for the in-memory snapshot; the write runs in the background.

At 16k GPUs a 30-second blocking write every Young–Daly interval costs several points of effective
training time; here the caller pays the snapshot (copying state into memory it will not mutate) plus,
if the previous checkpoint is still being written, the wait for it to commit. One background thread
writes this rank's shard; rank 0 then waits for every rank's shard and commits. A failed write is
raised at the next checkpoint (or :meth:`AsyncCheckpointer.close`): a job that silently stopped
checkpointing would lose days at its next crash.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Protocol

from training_runtime.collective import Collective, broadcast
from training_runtime.metrics import TrainingMetrics
from training_runtime.settings import CheckpointSettings, DistEnv
from training_runtime.store import CheckpointStore

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


class AsyncCheckpointer:
    def __init__(self, store: CheckpointStore, settings: CheckpointSettings, dist: DistEnv, collective: Collective,
                 metrics: TrainingMetrics, *, timeout_seconds: float, start_step: int = 0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.store, self.settings, self.dist = store, settings, dist
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
        entries = self.store.write_shard(d.attempt_key, step, d.rank, snapshot.files())
        written = sum(e.size for e in entries)
        if d.rank == 0:
            published = self.store.commit(d.attempt_key, step, d.world_size, self.timeout)
            self.store.prune(self.settings.keep_last, current_attempt=d.attempt_key, newest=step)
            log.info("checkpoint step %d committed: %d files, %d bytes in %.3f s", step,
                     len(published.manifest.files), published.manifest.total_bytes, self.clock() - started)
        self.metrics.checkpoint_duration.set(self.clock() - started)
        self.metrics.checkpoint_bytes.set(written)
        self.metrics.checkpoint_last_step.set(step)
        self.last_durable_step = step

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
