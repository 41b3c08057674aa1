"""Checkpoints on a shared filesystem with an atomic commit.

Layout under ``CHECKPOINT_DIR`` (the job's own sub-path)::

    step-00001200/            published: manifest.json, COMMITTED, rank-00000.<file>, rank-00001.<file>, ...
    .staging/<run>-a3-r0-s00001300/  being written by attempt 3 (every rank writes its shard and a part list here)

Commit (rank 0, once every rank's part list is there): write ``manifest.json`` (step, files, sizes,
SHA-256), fsync it, write ``COMMITTED`` holding the manifest's SHA-256, fsync the files and the staging
directory, rename it to ``step-NNNNNNNN`` and fsync ``CHECKPOINT_DIR``. A crash at any point leaves either
no ``step-`` directory or a complete one; :meth:`CheckpointStore.latest_complete` still verifies every
file, because a filesystem can lose or truncate data that was never fsynced by a writer we do not control.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from training_runtime.manifest import (
    COMMIT_MARKER,
    MANIFEST_NAME,
    MAX_STEP,
    FileEntry,
    Manifest,
    ManifestError,
    parse_file_entry,
    parse_manifest,
    sha256_hex,
)

log = logging.getLogger("training_runtime.checkpoint")

STEP_PREFIX = "step-"
STAGING = ".staging"
TRASH = ".trash"


class CheckpointCorrupt(Exception):
    """A published checkpoint that does not match its manifest; the message says what differs."""


class CommitTimeout(TimeoutError):
    """Not every rank delivered its shard in time: the checkpoint stays unpublished."""


class WorldSizeMismatch(Exception):
    """A checkpoint written by a gang of another size: its shards are per rank, so no rank may resume from it."""

    def __init__(self, path: Path, step: int, saved: int, job: int) -> None:
        self.path, self.step, self.saved, self.job = path, step, saved, job
        super().__init__(
            f"checkpoint {path} (step {step}) was written by {_ranks(saved)} (its manifest's worldSize), but this "
            f"job runs {_ranks(job)} (WORLD_SIZE={job}): a checkpoint holds one opaque shard per rank, which the "
            f"runtime cannot reshard, so it is not resumed. Run the job with {_ranks(saved)}, or start afresh with "
            "CHECKPOINT_RESUME=none or another CHECKPOINT_DIR")


def _ranks(n: int) -> str:
    return f"{n} rank" if n == 1 else f"{n} ranks"


def check_world_size(path: Path, step: int, saved: int, job: int) -> None:
    """Refuse a resume across world sizes (:class:`WorldSizeMismatch`): under more ranks the extra ones would get
    the step with no files, under fewer the missing ranks' state would be dropped, both without a word."""
    if saved != job:
        raise WorldSizeMismatch(path, step, saved, job)


@dataclass(frozen=True)
class Published:
    step: int
    path: Path
    manifest: Manifest


def step_dir_name(step: int) -> str:
    return f"{STEP_PREFIX}{step:08d}"


def shard_prefix(rank: int) -> str:
    return f"rank-{rank:05d}."


def fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: Path) -> None:
    """Make a rename or a new entry durable: POSIX needs the directory itself fsynced."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_durable(path: Path, data: bytes) -> None:
    with open(path, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())


def _remove_quietly(path: Path) -> None:
    with contextlib.suppress(OSError):
        path.unlink(missing_ok=True)


def parse_step_dir(name: str) -> int | None:
    """The step of a checkpoint directory named exactly as :func:`step_dir_name` writes it, else ``None``.

    Only the canonical spelling counts: ``step-1200`` (no padding) would sort as step 1200 while resume
    looks for ``step-00001200``, so it is not a checkpoint of ours at all; neither is a name with thousands
    of digits or non-ASCII digits.
    """
    if not name.startswith(STEP_PREFIX):
        return None
    digits = name[len(STEP_PREFIX):]
    if not (digits.isascii() and digits.isdigit()) or len(digits) > len(str(MAX_STEP)):
        return None
    step = int(digits)
    return step if name == step_dir_name(step) else None


class CheckpointStore:
    """Write, commit, find and prune checkpoints under one directory."""

    def __init__(self, root: Path | str, *, poll_seconds: float = 0.01) -> None:
        self.root = Path(root)
        self.poll_seconds = poll_seconds

    # ------------------------------------------------------------------ writing (every rank)

    def staging_dir(self, attempt: str, step: int) -> Path:
        return self.root / STAGING / f"{attempt}-s{step:08d}"

    def write_shard(self, attempt: str, step: int, rank: int, files: Iterable[tuple[str, bytes]]) -> list[FileEntry]:
        """Write this rank's files into the staging directory, fsync them, then its part list (last).

        A failure before the part list is in place removes what this rank had written of the shard (where it can)
        before it is raised: on a full disk the partial files would otherwise keep it full for the next attempt.
        After that the shard is rank 0's to commit, so nothing of it is removed.
        """
        staging = self.staging_dir(attempt, step)
        staging.mkdir(parents=True, exist_ok=True)
        entries: list[FileEntry] = []
        written: list[Path] = []
        try:
            for name, data in files:
                entry = parse_file_entry({"name": shard_prefix(rank) + name, "size": len(data),
                                          "sha256": sha256_hex(data)}, f"rank {rank} file {name!r}")
                written.append(staging / entry.name)
                write_durable(staging / entry.name, data)
                entries.append(entry)
            part = json.dumps([e.to_json() for e in entries]).encode()
            tmp = staging / f".part-{rank:05d}.tmp"
            written.append(tmp)
            write_durable(tmp, part)
            os.replace(tmp, staging / f".part-{rank:05d}.json")
        except BaseException:
            for path in written:
                _remove_quietly(path)
            raise
        fsync_dir(staging)
        return entries

    def discard(self, attempt: str, step: int) -> None:
        """Remove a staging directory whose checkpoint will never be committed (rank 0, after a failure)."""
        shutil.rmtree(self.staging_dir(attempt, step), ignore_errors=True)

    # ------------------------------------------------------------------ commit (rank 0)

    def commit(self, attempt: str, step: int, world_size: int, timeout_seconds: float) -> Published:
        """Wait for every rank's part list, write the manifest and marker, publish by rename."""
        staging = self.staging_dir(attempt, step)
        parts = [staging / f".part-{r:05d}.json" for r in range(world_size)]
        deadline = time.monotonic() + timeout_seconds
        while not all(p.exists() for p in parts):
            if time.monotonic() > deadline:
                missing = [r for r, p in enumerate(parts) if not p.exists()]
                raise CommitTimeout(f"checkpoint step {step}: ranks {missing} did not deliver their shard "
                                    f"within {timeout_seconds:g} s; not published")
            time.sleep(self.poll_seconds)
        entries: list[FileEntry] = []
        for part in parts:
            raw = json.loads(part.read_bytes())
            entries += [parse_file_entry(e, f"{part.name}[{i}]") for i, e in enumerate(raw)]
            part.unlink()
        manifest = Manifest(step=step, world_size=world_size, files=tuple(sorted(entries, key=lambda e: e.name)))
        body = manifest.dumps()
        write_durable(staging / MANIFEST_NAME, body)
        write_durable(staging / COMMIT_MARKER, (sha256_hex(body) + "\n").encode())
        fsync_dir(staging)
        target = self.root / step_dir_name(step)
        moved: Path | None = None
        if target.exists():
            # Only a checkpoint that failed verification can be in the way (a good one would have been resumed),
            # unless CHECKPOINT_RESUME=none: so it goes back if the rename fails.
            trash = self.root / TRASH
            trash.mkdir(exist_ok=True)
            moved = trash / f"{target.name}-{time.time_ns()}"
            os.replace(target, moved)
        try:
            os.replace(staging, target)
        except OSError:
            if moved is not None:
                with contextlib.suppress(OSError):
                    os.replace(moved, target)
            raise
        fsync_dir(self.root)
        return Published(step=step, path=target, manifest=manifest)

    # ------------------------------------------------------------------ reading

    def published_steps(self) -> list[int]:
        """Steps of the checkpoint directories here, newest first (see :meth:`foreign_entries` for the rest)."""
        return sorted((step for step, _ in self._listing()[0]), reverse=True)

    def foreign_entries(self) -> list[Path]:
        """``step-*`` entries that are not checkpoints of ours: symbolic links (they may point out of the job's
        directory, at another job's state) and names not spelled as we write them. Never resumed, never
        counted by retention, never deleted."""
        return self._listing()[1]

    def _listing(self) -> tuple[list[tuple[int, Path]], list[Path]]:
        if not self.root.is_dir():
            return [], []
        ours: list[tuple[int, Path]] = []
        foreign: list[Path] = []
        for path in self.root.iterdir():
            if not path.name.startswith(STEP_PREFIX):
                continue
            step = parse_step_dir(path.name)
            if step is None or path.is_symlink() or not path.is_dir():
                foreign.append(path)
            else:
                ours.append((step, path))
        return ours, sorted(foreign)

    def verify(self, path: Path, *, checksums: bool = True) -> Manifest:
        """The checkpoint's manifest if every file matches it; :class:`CheckpointCorrupt` says what does not.

        Whatever state a crash or a person left the directory in, the answer is a manifest or
        :class:`CheckpointCorrupt`, never another exception: a resume that raises makes the gang crash-loop.
        """
        try:
            return self._verify(path, checksums)
        except OSError as exc:
            raise CheckpointCorrupt(f"unreadable: {exc.strerror or exc}") from None

    def _verify(self, path: Path, checksums: bool) -> Manifest:
        if path.is_symlink():
            raise CheckpointCorrupt("a symbolic link, not a checkpoint directory of this job")
        marker = path / COMMIT_MARKER
        if marker.is_symlink() or not marker.is_file():
            raise CheckpointCorrupt("no commit marker (partial write)")
        manifest_path = path / MANIFEST_NAME
        if manifest_path.is_symlink():
            raise CheckpointCorrupt("manifest is a symbolic link")
        try:
            body = manifest_path.read_bytes()
        except OSError as exc:
            raise CheckpointCorrupt(f"manifest unreadable: {exc.strerror}") from None
        try:
            recorded = marker.read_bytes().decode("ascii").strip()
        except UnicodeDecodeError:
            raise CheckpointCorrupt("commit marker is not a checksum (not text)") from None
        if recorded != sha256_hex(body):
            raise CheckpointCorrupt("manifest does not match the commit marker's checksum")
        try:
            manifest = parse_manifest(body)
        except ManifestError as exc:
            raise CheckpointCorrupt(f"manifest invalid: {exc}") from None
        expected_step = parse_step_dir(path.name)
        if expected_step is not None and manifest.step != expected_step:
            raise CheckpointCorrupt(f"manifest says step {manifest.step}, directory says {expected_step}")
        for entry in manifest.files:
            file = path / entry.name
            try:
                info = file.lstat()
            except OSError:
                raise CheckpointCorrupt(f"{entry.name}: missing") from None
            if file.is_symlink():
                raise CheckpointCorrupt(f"{entry.name}: a symbolic link, not a file of this checkpoint")
            if info.st_size != entry.size:
                raise CheckpointCorrupt(f"{entry.name}: {info.st_size} bytes, manifest says {entry.size} (truncated?)")
            if checksums:
                actual = sha256_hex(file.read_bytes())
                if actual != entry.sha256:
                    raise CheckpointCorrupt(
                        f"{entry.name}: sha256 {actual[:12]}… does not match the manifest's {entry.sha256[:12]}…")
        return manifest

    def latest_complete(self, *, checksums: bool = True) -> Published | None:
        """The newest checkpoint that verifies; each one skipped, and each foreign entry, is logged with why."""
        ours, foreign = self._listing()
        for path in foreign:
            log.warning("ignoring %s: not a checkpoint of this job (a symbolic link, or not named "
                        "step-<8 digits>)", path)
        return self._newest(ours, checksums=checksums, quiet=False)

    def newest_complete_below(self, step: int) -> Published | None:
        """The newest checkpoint before ``step`` that is whole by its sizes, without logging: what a failed write
        can promise the job still has (checksums are left to the resume that reads it)."""
        ours = [(s, p) for s, p in self._listing()[0] if s < step]
        return self._newest(ours, checksums=False, quiet=True)

    def _newest(self, ours: list[tuple[int, Path]], *, checksums: bool, quiet: bool) -> Published | None:
        for step, path in sorted(ours, reverse=True):
            try:
                manifest = self.verify(path, checksums=checksums)
            except CheckpointCorrupt as exc:
                if not quiet:
                    log.warning("skipping checkpoint %s: %s", path, exc)
                continue
            return Published(step=step, path=path, manifest=manifest)
        return None

    def read_shard(self, published: Published, rank: int) -> dict[str, bytes]:
        """This rank's files of a published checkpoint, checked against the manifest as they are read."""
        prefix = shard_prefix(rank)
        out: dict[str, bytes] = {}
        for entry in published.manifest.files:
            if not entry.name.startswith(prefix):
                continue
            data = (published.path / entry.name).read_bytes()
            if len(data) != entry.size or sha256_hex(data) != entry.sha256:
                raise CheckpointCorrupt(f"{published.path / entry.name}: does not match the manifest")
            out[entry.name.removeprefix(prefix)] = data
        return out

    # ------------------------------------------------------------------ retention (rank 0)

    def prune(self, keep_last: int, *, current_attempt: str | None = None, newest: int | None = None) -> list[Path]:
        """Retention: keep the newest ``keep_last`` complete checkpoints, drop the rest and leftovers.

        ``newest`` is the step this attempt has just committed. It is never removed. Checkpoints above it come
        from a timeline the job has left: resume skipped them as incomplete, and a later resume must not
        jump back to them, so they are removed. Completeness is judged on the directories themselves
        (marker, manifest, sizes), never on step order alone. A corrupt checkpoint therefore never holds a
        slot, and retention never leaves fewer complete checkpoints than ``keep_last`` allows. Also removed:
        corrupt checkpoints, other attempts' staging directories (never this attempt's: it may be writing)
        and the trash. :meth:`foreign_entries` are left alone.
        """
        if keep_last < 1:
            raise ValueError(f"keep_last must be at least 1, got {keep_last}")
        removed: list[Path] = []
        complete: list[int] = []
        for step in self.published_steps():
            path = self.root / step_dir_name(step)
            if step == newest:
                complete.append(step)
            elif newest is not None and step > newest:
                removed.append(path)
            else:
                try:
                    self.verify(path, checksums=False)
                except CheckpointCorrupt:
                    removed.append(path)
                    continue
                complete.append(step)
        removed += [self.root / step_dir_name(step) for step in complete[keep_last:] if step != newest]
        staging = self.root / STAGING
        if staging.is_dir() and current_attempt is not None:
            removed += [p for p in staging.iterdir() if not p.name.startswith(f"{current_attempt}-s")]
        trash = self.root / TRASH
        if trash.is_dir():
            removed += list(trash.iterdir())
        for path in removed:
            if path.is_symlink():
                path.unlink()
            else:
                shutil.rmtree(path, ignore_errors=True)
        return removed
