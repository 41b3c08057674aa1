"""Resume from host memory: each rank keeps its newest checkpoint shard where its worker process's death does not
reach, and a restart in place reads it back instead of the shared filesystem.

Why: at a restart every rank reloads its shard at once, each at its slice of the filesystem's read rate, and that
load is a term of every restart. A restart in place keeps the pod (the supervisor restarts the worker process, not
the pod), and with it the pod's memory-backed ``/dev/shm``: a copy kept there is read at memory speed. A replaced
pod starts with an empty one and reads the shared copy, as every rank did before.

Trust: the shared checkpoint stays the truth. Rank 0 picks the step from the shared filesystem as before; a rank
reads its local copy only when the copy is of this run and rank, holds exactly that step, and every file of the
rank's shard in the shared manifest is there with its size and SHA-256. Anything else reads the shared copy, and
the log says why. Keeping the copy is best effort: a failure, or a shard over the size limit, skips the copy and
never touches the checkpoint.

Layout: ``<root>/<run id>/rank-<rank>/step-<step>/<file as the manifest names it>``. One step per rank, the newest
written: the next one is written beside it under a temporary name and renamed into place once whole, and only
then is the older one removed (so the cache needs room for two shards while a checkpoint is written).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from training_runtime.manifest import sha256_hex
from training_runtime.settings import CHECKPOINT_LOCAL_CACHE_MAX_GB
from training_runtime.store import Published, parse_step_dir, shard_prefix, step_dir_name

log = logging.getLogger("training_runtime.local_cache")

#: The two places a shard is loaded from (the ``source`` label of the load metric, and :class:`Resumed`'s field).
LOCAL = "local"
SHARED = "shared"
_TMP_PREFIX = ".tmp-"


@dataclass(frozen=True)
class CacheRead:
    """A local copy read back: its files when every one matched the manifest, else ``None`` and why not."""

    files: dict[str, bytes] | None
    reason: str = ""
    #: The copy was there for this step but did not match: memory or a person changed it (worth a warning).
    mismatch: bool = False


class LocalShardCache:
    """One rank's copy of its newest shard under ``root`` (the pod's ``/dev/shm``: outlives the worker, not the pod)."""

    def __init__(self, root: Path | str, run_id: str, rank: int, max_bytes: int) -> None:
        self.root = Path(root)
        self.dir = self.root / run_id / f"rank-{rank:05d}"
        self.rank, self.max_bytes = rank, max_bytes
        self._said_too_big = False

    def step_dir(self, step: int) -> Path:
        return self.dir / step_dir_name(step)

    def cached_steps(self) -> list[int]:
        """Steps held, newest first (one, normally)."""
        try:
            names = [p.name for p in self.dir.iterdir() if p.is_dir() and not p.is_symlink()]
        except OSError:
            return []
        return sorted((s for s in map(parse_step_dir, names) if s is not None), reverse=True)

    def copy(self, step: int) -> ShardCopy:
        """Start keeping ``step``: pass the shard's files through :meth:`ShardCopy.tee`, then call ``finish``."""
        return ShardCopy(self, step)

    def read(self, published: Published) -> CacheRead:
        """This rank's files of ``published`` from the local copy, each checked against the shared manifest.

        Never raises: whatever state the copy is in, the answer is its files or the reason to read the shared copy.
        """
        step, prefix = published.step, shard_prefix(self.rank)
        entries = [e for e in published.manifest.files if e.name.startswith(prefix)]
        where = self.step_dir(step)
        try:
            if where.is_symlink() or not where.is_dir():
                held = self.cached_steps()
                return CacheRead(None, f"no local copy of step {step}" + (
                    f" (it holds step {held[0]}, not the one the gang resumes)" if held else ""))
            if not entries:
                return CacheRead(None, f"the manifest of step {step} lists no file of rank {self.rank}")
            out: dict[str, bytes] = {}
            for entry in entries:
                path = where / entry.name
                info = path.lstat()
                if path.is_symlink() or info.st_size != entry.size:
                    return CacheRead(None, f"local {entry.name}: {info.st_size} bytes, the manifest says {entry.size}",
                                     mismatch=True)
                data = path.read_bytes()
                if len(data) != entry.size or sha256_hex(data) != entry.sha256:
                    return CacheRead(None, f"local {entry.name}: its sha256 does not match the manifest's",
                                     mismatch=True)
                out[entry.name.removeprefix(prefix)] = data
        except OSError as exc:
            return CacheRead(None, f"local copy of step {step} unreadable: {exc.strerror or exc}", mismatch=True)
        return CacheRead(out)

    def drop_all_but(self, keep: Path | None) -> None:
        """Free the memory of every other step and of temporary copies a killed worker left behind."""
        try:
            others = [p for p in self.dir.iterdir() if p != keep]
        except OSError:
            return
        for path in others:
            if path.is_symlink() or not path.is_dir():
                with contextlib.suppress(OSError):
                    path.unlink(missing_ok=True)
            else:
                shutil.rmtree(path, ignore_errors=True)

    def _too_big(self) -> None:
        if not self._said_too_big:
            log.info("rank %d: not keeping a local copy of its checkpoint shard: it is over %s=%g GB (%d bytes); "
                     "restarts in place read it from the shared filesystem", self.rank, CHECKPOINT_LOCAL_CACHE_MAX_GB,
                     self.max_bytes / 1e9, self.max_bytes)
            self._said_too_big = True


class ShardCopy:
    """One step's local copy, written from the same bytes as the shared shard while the store writes it."""

    def __init__(self, cache: LocalShardCache, step: int) -> None:
        self.cache, self.step = cache, step
        self.tmp = cache.dir / f"{_TMP_PREFIX}{step_dir_name(step)}-{os.getpid()}"
        self.bytes = 0
        self.skipped: str | None = None
        self.done = False

    def tee(self, files: Iterable[tuple[str, bytes]]) -> Iterator[tuple[str, bytes]]:
        """The files unchanged; each is copied once the store has taken it (its name checked, its shared write
        done), so a copy never holds a file the shared shard lacks."""
        for name, data in files:
            yield name, data
            self._keep(name, data)

    def _keep(self, name: str, data: bytes) -> None:
        if self.skipped is not None:
            return
        self.bytes += len(data)
        if self.bytes > self.cache.max_bytes:
            self.cache._too_big()
            self._skip("over the size limit")
            return
        try:
            if not self.tmp.is_dir():
                self.tmp.mkdir(parents=True)
            target = self.tmp / (shard_prefix(self.cache.rank) + name)
            if target.parent != self.tmp:
                raise OSError(f"{name!r} is not a plain file name")
            target.write_bytes(data)
        except Exception as exc:  # best effort: nothing here may fail the checkpoint
            self._skip(str(exc))
            log.warning("rank %d: no local copy of checkpoint step %d (%s); restarts in place read it from the "
                        "shared filesystem", self.cache.rank, self.step, exc)

    def _skip(self, why: str) -> None:
        """Give this step up; an older copy goes too, since the shard it holds is no longer the newest."""
        self.skipped = why
        self.cache.drop_all_but(None)

    def finish(self) -> bool:
        """Put the copy in place of the older one (after this rank's shared shard is durable). Never raises."""
        if self.skipped is not None:
            return False
        try:
            self.tmp.mkdir(parents=True, exist_ok=True)  # a shard of no files
            target = self.cache.step_dir(self.step)
            if target.exists():  # the same step again (a checkpoint rewritten after CHECKPOINT_RESUME=none)
                shutil.rmtree(target)
            os.replace(self.tmp, target)
        except Exception as exc:
            self._skip(str(exc))
            log.warning("rank %d: no local copy of checkpoint step %d (%s)", self.cache.rank, self.step, exc)
            return False
        self.done = True
        self.cache.drop_all_but(target)
        return True

    def abandon(self) -> None:
        """The shared write failed: drop what was copied of it (never a finished copy)."""
        if not self.done:
            shutil.rmtree(self.tmp, ignore_errors=True)
