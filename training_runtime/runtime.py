"""The facade a training script uses: resume, heartbeat per step, checkpoint when due, close."""

from __future__ import annotations

import logging
import os
import shutil
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from training_runtime.checkpointer import AsyncCheckpointer, Capture
from training_runtime.collective import Collective, FileCollective, LocalCollective, broadcast
from training_runtime.local_cache import LOCAL, SHARED, LocalShardCache
from training_runtime.metrics import TrainingMetrics
from training_runtime.settings import PEER_STOP_EXIT, Settings, SettingsError
from training_runtime.stopping import StopSignals
from training_runtime.store import CheckpointStore, Published, check_world_size, step_dir_name

log = logging.getLogger("training_runtime")

RENDEZVOUS = ".rendezvous"


@dataclass(frozen=True)
class Resumed:
    step: int
    #: This rank's files of that checkpoint, as the snapshot named them.
    files: dict[str, bytes]
    #: Where they were read: ``"local"`` (this pod's copy, after a restart in place) or ``"shared"`` (the filesystem).
    source: str = SHARED
    #: Seconds reading and verifying them took.
    load_seconds: float = 0.0


class TrainingRuntime:
    def __init__(self, settings: Settings, collective: Collective | None = None) -> None:
        self.settings = settings
        self.dist = settings.dist
        self.metrics = TrainingMetrics(settings.heartbeat_metric, self.dist.rank)
        self.metrics.restarts.set(self.dist.attempt + self.dist.elastic_restarts + self.dist.inplace_restarts)
        ck = settings.checkpoint
        self.store = CheckpointStore(ck.directory) if ck else None
        self.cache = LocalShardCache(ck.local_cache, self.dist.run_id, self.dist.rank, ck.local_cache_max_bytes) \
            if ck is not None and ck.local_cache is not None else None
        if collective is None:
            if self.dist.world_size == 1:
                collective = LocalCollective()
            elif ck is not None:
                collective = FileCollective(ck.directory / RENDEZVOUS, self.dist.rank, self.dist.world_size,
                                            self.dist.attempt_key, settings.collective_timeout_seconds,
                                            dead_after_seconds=settings.peer_dead_after_seconds)
            else:
                raise SettingsError("WORLD_SIZE > 1 without CHECKPOINT_DIR: pass a collective (the PyTorch "
                                    "adapter's) or set CHECKPOINT_DIR for the file rendezvous")
        self.collective = collective
        self.checkpointer: AsyncCheckpointer | None = None
        self._stop = threading.Event()
        self.signals = StopSignals(self._stop.set)
        if settings.metrics_port:
            self.metrics.serve(settings.metrics_port)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, collective: Collective | None = None) -> TrainingRuntime:
        return cls(Settings.from_env(os.environ if env is None else env), collective)

    @property
    def rank(self) -> int:
        return self.dist.rank

    @property
    def world_size(self) -> int:
        return self.dist.world_size

    def resume(self) -> Resumed | None:
        """Every rank gets the same step: rank 0 finds the newest complete checkpoint and shares its step.

        Rank 0 verifies every file's checksum (each skipped checkpoint is logged with its reason); the other
        ranks check sizes and then the checksums of the files they read, their own shard. Each rank reads its shard
        from its local copy when that holds exactly the agreed step and matches the manifest (after a restart in
        place, see ``training_runtime.local_cache``), else from the shared filesystem. A checkpoint written
        by a gang of another size is refused on every rank (:class:`~training_runtime.store.WorldSizeMismatch`,
        naming both sizes): its shards are opaque per rank, so no resharding is valid for it.
        """
        ck = self.settings.checkpoint
        found: Published | None = None
        if self.rank == 0 and ck is not None and ck.resume and self.store is not None:
            found = self.store.latest_complete()
            newer = [s for s in self.store.published_steps() if found is None or s > found.step]
            if newer:
                self.metrics.skipped.inc(len(newer))
        # The world size travels with the step, so that every rank refuses the same checkpoint at once.
        shared = broadcast(self.collective,
                           {"step": found.step, "worldSize": found.manifest.world_size} if found else None)
        step: int | None = None
        if shared is not None and self.store is not None:
            step = int(shared["step"])
            self._check_world_size(self.store.root / step_dir_name(step), step, int(shared["worldSize"]))
        if self.rank == 0 and ck is not None:
            self._drop_old_rendezvous(ck.directory / RENDEZVOUS)
        start = step or 0
        if self.store is not None and ck is not None:
            self.checkpointer = AsyncCheckpointer(
                self.store, ck, self.dist, self.collective, self.metrics,
                timeout_seconds=self.settings.collective_timeout_seconds, start_step=start, cache=self.cache)
        self.metrics.resumed_from.set(start)
        if step is None or self.store is None:
            log.info("rank %d: starting from scratch (attempt %d)", self.rank, self.dist.attempt)
            return None
        if found is None:
            path = self.store.root / step_dir_name(step)
            found = Published(step=step, path=path, manifest=self.store.verify(path, checksums=False))
            self._check_world_size(path, step, found.manifest.world_size)
        log.info("rank %d: resuming from step %d (attempt %d)", self.rank, step, self.dist.attempt)
        return self._load(found)

    def _load(self, found: Published) -> Resumed:
        """This rank's shard of ``found``: the local copy when it matches the shared manifest, else the shared one."""
        assert self.store is not None
        started = time.perf_counter()
        files, source = None, SHARED
        if self.cache is not None:
            local = self.cache.read(found)
            files, source = local.files, LOCAL
            if files is None:
                source = SHARED
                (log.warning if local.mismatch else log.info)(
                    "rank %d: not using its local copy: %s; reading step %d from the shared filesystem", self.rank,
                    local.reason, found.step)
        if files is None:
            files = self.store.read_shard(found, self.rank)
        seconds = time.perf_counter() - started
        self.metrics.loaded(source, seconds)
        where = self.cache.step_dir(found.step) if source == LOCAL and self.cache is not None else found.path
        log.info("rank %d: loaded its shard of step %d from the %s copy (%s): %d bytes in %.3f s", self.rank,
                 found.step, source, where, sum(len(v) for v in files.values()), seconds)
        return Resumed(step=found.step, files=files, source=source, load_seconds=seconds)

    def _check_world_size(self, path: Path, step: int, saved: int) -> None:
        try:
            check_world_size(path, step, saved, self.world_size)
        except Exception as exc:
            log.error("rank %d: %s", self.rank, exc)
            raise

    def _drop_old_rendezvous(self, root: Path) -> None:
        """Other attempts' rendezvous files: ``CHECKPOINT_DIR`` is this job's own, and only this attempt runs."""
        if root.is_dir():
            for old in root.iterdir():
                if old.name != self.dist.attempt_key:
                    shutil.rmtree(old, ignore_errors=True)

    def step_done(self, step: int) -> None:
        self.metrics.step_done(step)

    # ------------------------------------------------------------------ graceful stop

    def handle_sigterm(self) -> None:
        """The first SIGTERM asks for a graceful stop: the gang stops at the next step boundary, checkpoints that
        step and exits 0, so an eviction, a queue reclaim or a preemption loses nothing. The second SIGTERM (or
        the kubelet's SIGKILL when the grace period ends) takes the crash path: the default action, at once,
        and the next attempt resumes from the newest complete checkpoint. Once the stop checkpoint is committed,
        SIGTERM and SIGINT are ignored until the process exits (``stopping.py``)."""
        self.signals.install()

    def request_stop(self) -> None:
        """What the first SIGTERM does (for callers with their own signal handling)."""
        self._stop.set()

    def should_stop(self) -> bool:
        """True on every rank once any rank was asked to stop: one small allgather per step, so that the ranks
        that were not signalled (an eviction of one node's pods) stop at the same step as the ones that were."""
        return any(bool(x) for x in self.collective.allgather(self._stop.is_set()))

    def checkpoint_and_stop(self, step: int, capture: Capture) -> int:
        """Checkpoint ``step`` on every rank (unless it is the one already started), wait for the commit, and
        return the exit code: 0, or :data:`~training_runtime.settings.PEER_STOP_EXIT` for a rank under the
        supervisor that was not asked to stop itself (another rank's pod is being evicted: this one stays and
        restarts in place with the replacement). Call it on every rank when :meth:`should_stop` says so.

        From the moment this rank's part of that checkpoint is durable, SIGTERM and SIGINT are ignored: the stop
        is clean, and a signal on the way out must not make the pod read as failed. Before that moment they act
        as they did before the stop. A write that fails raises
        :class:`~training_runtime.checkpointer.CheckpointWriteError` and the stop is not clean."""
        checkpointer = self.checkpointer
        self.signals.stopping(lambda: checkpointer is None or checkpointer.last_durable_step == step)
        if checkpointer is not None and checkpointer.last_started_step != step:
            checkpointer.save(step, capture)
        self.close()
        self.signals.stopped()
        if self.dist.supervised and not self._stop.is_set():
            log.info("rank %d: stopped at step %d with its checkpoint committed, for another rank's stop; its "
                     "supervisor restarts it in place", self.rank, step)
            return PEER_STOP_EXIT
        log.info("rank %d: stopped gracefully at step %d with its checkpoint committed", self.rank, step)
        return 0

    def maybe_checkpoint(self, step: int, capture: Capture) -> bool:
        """Checkpoint at ``step`` when the step or time interval is reached; stalls only for ``capture()``."""
        if self.checkpointer is None:
            return False
        return self.checkpointer.maybe_save(step, capture)

    def close(self) -> None:
        if self.checkpointer is not None:
            self.checkpointer.close()
