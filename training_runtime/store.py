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


def _parse_step(name: str) -> int | None:
    digits = name.removeprefix(STEP_PREFIX)
    return int(digits) if name.startswith(STEP_PREFIX) and digits.isdigit() else None


class CheckpointStore:
    """Write, commit, find and prune checkpoints under one directory."""

    def __init__(self, root: Path | str, *, poll_seconds: float = 0.01) -> None:
        self.root = Path(root)
        self.poll_seconds = poll_seconds

    # ------------------------------------------------------------------ writing (every rank)

    def staging_dir(self, attempt: str, step: int) -> Path:
        return self.root / STAGING / f"{attempt}-s{step:08d}"

    def write_shard(self, attempt: str, step: int, rank: int, files: Iterable[tuple[str, bytes]]) -> list[FileEntry]:
        """Write this rank's files into the staging directory, fsync them, then its part list (last)."""
        staging = self.staging_dir(attempt, step)
        staging.mkdir(parents=True, exist_ok=True)
        entries: list[FileEntry] = []
        for name, data in files:
            entry = parse_file_entry({"name": shard_prefix(rank) + name, "size": len(data),
                                      "sha256": sha256_hex(data)}, f"rank {rank} file {name!r}")
            write_durable(staging / entry.name, data)
            entries.append(entry)
        part = json.dumps([e.to_json() for e in entries]).encode()
        tmp = staging / f".part-{rank:05d}.tmp"
        write_durable(tmp, part)
        os.replace(tmp, staging / f".part-{rank:05d}.json")
        fsync_dir(staging)
        return entries

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
        if target.exists():
            # Only a checkpoint that failed verification can be in the way (a good one would have been resumed).
            trash = self.root / TRASH
            trash.mkdir(exist_ok=True)
            os.replace(target, trash / f"{target.name}-{time.time_ns()}")
        os.replace(staging, target)
        fsync_dir(self.root)
        return Published(step=step, path=target, manifest=manifest)

    # ------------------------------------------------------------------ reading

    def published_steps(self) -> list[int]:
        if not self.root.is_dir():
            return []
        steps = [_parse_step(p.name) for p in self.root.iterdir() if p.is_dir()]
        return sorted((s for s in steps if s is not None), reverse=True)

    def verify(self, path: Path, *, checksums: bool = True) -> Manifest:
        """The checkpoint's manifest if every file matches it; :class:`CheckpointCorrupt` says what does not."""
        marker = path / COMMIT_MARKER
        if not marker.is_file():
            raise CheckpointCorrupt("no commit marker (partial write)")
        try:
            body = (path / MANIFEST_NAME).read_bytes()
        except OSError as exc:
            raise CheckpointCorrupt(f"manifest unreadable: {exc.strerror}") from None
        if marker.read_text().strip() != sha256_hex(body):
            raise CheckpointCorrupt("manifest does not match the commit marker's checksum")
        try:
            manifest = parse_manifest(body)
        except ManifestError as exc:
            raise CheckpointCorrupt(f"manifest invalid: {exc}") from None
        expected_step = _parse_step(path.name)
        if expected_step is not None and manifest.step != expected_step:
            raise CheckpointCorrupt(f"manifest says step {manifest.step}, directory says {expected_step}")
        for entry in manifest.files:
            file = path / entry.name
            try:
                size = file.stat().st_size
            except OSError:
                raise CheckpointCorrupt(f"{entry.name}: missing") from None
            if size != entry.size:
                raise CheckpointCorrupt(f"{entry.name}: {size} bytes, manifest says {entry.size} (truncated?)")
            if checksums:
                actual = sha256_hex(file.read_bytes())
                if actual != entry.sha256:
                    raise CheckpointCorrupt(
                        f"{entry.name}: sha256 {actual[:12]}… does not match the manifest's {entry.sha256[:12]}…")
        return manifest

    def latest_complete(self, *, checksums: bool = True) -> Published | None:
        """The newest checkpoint that verifies; each one skipped is logged with the reason."""
        for step in self.published_steps():
            path = self.root / step_dir_name(step)
            try:
                manifest = self.verify(path, checksums=checksums)
            except CheckpointCorrupt as exc:
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

    def prune(self, keep_last: int, *, current_attempt: str | None = None) -> list[Path]:
        """Keep the newest ``keep_last`` published checkpoints; drop older ones, other attempts' staging, trash."""
        removed: list[Path] = []
        for step in self.published_steps()[keep_last:]:
            removed.append(self.root / step_dir_name(step))
        staging = self.root / STAGING
        if staging.is_dir() and current_attempt is not None:
            removed += [p for p in staging.iterdir() if not p.name.startswith(f"{current_attempt}-s")]
        trash = self.root / TRASH
        if trash.is_dir():
            removed += list(trash.iterdir())
        for path in removed:
            shutil.rmtree(path, ignore_errors=True)
        return removed
