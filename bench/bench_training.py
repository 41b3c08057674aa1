"""Training runtime: what a crash costs the reference trainer, and what an asynchronous checkpoint stalls.

Resume loss: the framework-free tiny trainer runs as a gang of OS processes under the gang launcher
(Volcano's RestartJob in miniature); at a seeded random step one worker gets SIGKILL, the whole gang
restarts and resumes from the newest complete checkpoint. Lost steps = the furthest step reached before
the kill minus the resume step. With asynchronous checkpoints a kill while the newest checkpoint is still
being written falls back to the one before: the loss is at most one interval plus the steps that write had
been running, and since the next checkpoint waits for the previous write, that is at most two intervals
(:data:`training_runtime.checkpointer.LOSS_BOUND_INTERVALS`). Target: within that bound, every run.

Stall vs write: one rank checkpoints a 128 MiB state; the step waits for the in-memory copy only, the
write (SHA-256, write, fsync, commit, rename) runs in the background.

Load, local vs shared: one rank's 256 MiB shard, written once through the store with its local copy kept in
``/dev/shm`` (``training_runtime.local_cache``), is loaded both ways as a resume does (read, then every file's
SHA-256 checked against the manifest): from the checkpoint directory with its pages dropped from the page cache first,
and from the copy. The checkpoint directory here is this machine's own disk, the best case for a shared filesystem,
whose per-rank rate at scale is its aggregate read rate shared by every rank of the gang.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from training_runtime.checkpointer import LOSS_BOUND_INTERVALS, AsyncCheckpointer
from training_runtime.collective import LocalCollective
from training_runtime.examples.resume_drill import kill_and_resume
from training_runtime.local_cache import LocalShardCache
from training_runtime.manifest import sha256_hex
from training_runtime.metrics import TrainingMetrics
from training_runtime.settings import CheckpointSettings, DistEnv
from training_runtime.store import CheckpointStore

RUNS = 6
WORKERS = 3
INTERVAL = 10
STEPS = 70
SEED = 14
STATE_BYTES = 128 * 1024 * 1024
LOAD_BYTES = 256 * 1024 * 1024
LOAD_REPEATS = 3
SHM = Path("/dev/shm")


def resume_loss(runs: int = RUNS, seed: int = SEED) -> dict[str, Any]:
    rng = random.Random(seed)
    rows: dict[str, dict[str, Any]] = {}
    for i in range(runs):
        kill_at = rng.randint(INTERVAL + 1, STEPS - 2 * INTERVAL)
        victim = rng.randrange(WORKERS)
        work = Path(tempfile.mkdtemp(prefix="bench-training-"))
        try:
            drill = kill_and_resume(work, workers=WORKERS, steps=STEPS, interval_steps=INTERVAL, kill_at_step=kill_at,
                                    victim=victim, step_seconds=0.02)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        agreed = len(set(drill.resume_steps.values())) == 1 and len(drill.resume_steps) == WORKERS
        rows[f"run {i + 1}"] = {
            "killed rank": victim,
            "reached step": drill.reached_step,
            "resumed from": min(drill.resume_steps.values(), default=None),
            "lost steps": drill.lost_steps,
            "in-flight write (steps)": drill.inflight_steps,
            "ranks agreed": agreed,
            "restarts": drill.attempts - 1,
            "finished": sorted(set(drill.final_steps.values())) == [STEPS],
        }
    lost = [r["lost steps"] for r in rows.values()]
    return {
        "runs": rows,
        "interval_steps": INTERVAL,
        "max_lost_steps": max(lost),
        "mean_lost_steps": round(statistics.mean(lost), 2),
        "runs_within_one_interval": sum(x <= INTERVAL for x in lost),
        "runs_within_bound": sum(x <= LOSS_BOUND_INTERVALS * INTERVAL for x in lost),
        "runs_within_interval_plus_inflight": sum(r["lost steps"] <= INTERVAL + r["in-flight write (steps)"]
                                                  for r in rows.values()),
        "all_resumed_and_agreed": all(r["ranks agreed"] and r["finished"] and r["restarts"] == 1
                                      for r in rows.values()),
    }


class _CopyState:
    """A mutable training state: the checkpoint must copy it before the next step changes it."""

    def __init__(self, size: int) -> None:
        self.buffer = bytearray(os.urandom(size))

    def capture(self) -> dict[str, bytes]:
        return {"state.bin": bytes(self.buffer)}


def stall_vs_write(size: int = STATE_BYTES, checkpoints: int = 3) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="bench-ckpt-"))
    try:
        store = CheckpointStore(root)
        metrics = TrainingMetrics("hb", 0)
        ck = CheckpointSettings(directory=root, interval_steps=1, interval_seconds=None, keep_last=2, resume=True)
        writer = AsyncCheckpointer(store, ck, DistEnv(0, 1, "127.0.0.1", 1, 0), LocalCollective(), metrics,
                                   timeout_seconds=60)
        state = _CopyState(size)
        stalls, writes = [], []
        for step in range(1, checkpoints + 1):
            began = time.perf_counter()
            writer.save(step, state.capture)
            stalls.append(time.perf_counter() - began)
            writer.wait()
            writes.append(time.perf_counter() - began)
        writer.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    stall, write = statistics.median(stalls), statistics.median(writes)
    return {"state_mib": size // 2**20, "median_stall_s": round(stall, 3), "median_write_s": round(write, 3),
            "stall_share_of_write": round(stall / write, 3)}


def _drop_cached_pages(directory: Path) -> None:
    """Make the next read come from the disk, not from the page cache (clean pages only: they were fsynced)."""
    for path in directory.iterdir():
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            if hasattr(os, "posix_fadvise"):
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def local_vs_shared_load(size: int = LOAD_BYTES, repeats: int = LOAD_REPEATS) -> dict[str, Any]:
    shared_root = Path(tempfile.mkdtemp(prefix="bench-load-"))
    local_root = Path(tempfile.mkdtemp(prefix="bench-load-", dir=SHM if SHM.is_dir() else None))
    try:
        store = CheckpointStore(shared_root)
        cache = LocalShardCache(local_root, "bench", 0, max_bytes=2 * size)
        state = os.urandom(size)
        copy = cache.copy(1)
        store.write_shard("bench", 1, 0, copy.tee([("state.bin", state)]))
        if not copy.finish():
            raise RuntimeError(f"the local copy could not be kept under {local_root}: {copy.skipped}")
        published = store.commit("bench", 1, 1, timeout_seconds=60)
        shared, local, verify = [], [], []
        for _ in range(repeats):
            _drop_cached_pages(published.path)
            began = time.perf_counter()
            store.read_shard(published, 0)
            shared.append(time.perf_counter() - began)
            began = time.perf_counter()
            if cache.read(published).files is None:
                raise RuntimeError("the local copy did not match its own checkpoint")
            local.append(time.perf_counter() - began)
            began = time.perf_counter()
            sha256_hex(state)
            verify.append(time.perf_counter() - began)
    finally:
        shutil.rmtree(shared_root, ignore_errors=True)
        shutil.rmtree(local_root, ignore_errors=True)
    shared_s, local_s, verify_s = (statistics.median(x) for x in (shared, local, verify))
    return {"shard_mib": size // 2**20, "shared_dir": str(shared_root.parent), "local_dir": str(local_root.parent),
            "shared_load_s": round(shared_s, 3), "local_load_s": round(local_s, 3),
            "shared_mb_per_s": round(size / shared_s / 1e6), "local_mb_per_s": round(size / local_s / 1e6),
            "shared_over_local": round(shared_s / local_s, 2), "sha256_s": round(verify_s, 3)}


def run() -> dict[str, Any]:
    loss = resume_loss()
    return {**loss, "stall": stall_vs_write(), "load": local_vs_shared_load(),
            "meets_target": loss["runs_within_bound"] == RUNS and loss["all_resumed_and_agreed"]}


def to_markdown(result: dict[str, Any]) -> str:
    lines = [f"### Resume loss: kill one of {WORKERS} workers at a random step ({len(result['runs'])} runs, "
             f"checkpoint every {result['interval_steps']} steps)", "",
             "| run | killed rank | reached | resumed from | lost steps | in-flight write | ranks agreed | finished |",
             "|---|---|---|---|---|---|---|---|"]
    for name, r in result["runs"].items():
        lines.append(f"| {name} | {r['killed rank']} | {r['reached step']} | {r['resumed from']} | {r['lost steps']} "
                     f"| {r['in-flight write (steps)']} | {r['ranks agreed']} | {r['finished']} |")
    verdict = "meets" if result["meets_target"] else "MISSES"
    s = result["stall"]
    lines += ["", f"Lost at most {result['max_lost_steps']} steps (mean {result['mean_lost_steps']}); within one "
              f"interval in {result['runs_within_one_interval']} of {len(result['runs'])} runs, within one interval "
              f"plus the in-flight write in {result['runs_within_interval_plus_inflight']}. Target (≤ "
              f"{LOSS_BOUND_INTERVALS} intervals, the hard bound of asynchronous checkpoints, every run; every rank "
              f"resumes from the same step): {verdict}.", "",
              f"Asynchronous checkpoint of a {s['state_mib']} MiB state: the step stalls {s['median_stall_s']} s "
              f"(in-memory copy) of the {s['median_write_s']} s the checkpoint takes to commit "
              f"({s['stall_share_of_write'] * 100:.1f} %).", ""]
    if "load" in result:  # absent from a report written before the local copy
        ld = result["load"]
        lines += [f"Resume load of one rank's {ld['shard_mib']} MiB shard (read, then SHA-256 against the manifest; "
                  f"median of {LOAD_REPEATS}):", "",
                  "| source | directory | seconds | MB/s |", "|---|---|---|---|",
                  f"| shared filesystem (this machine's disk, pages dropped first) | {ld['shared_dir']} | "
                  f"{ld['shared_load_s']} | {ld['shared_mb_per_s']} |",
                  f"| local copy (restart in place) | {ld['local_dir']} | {ld['local_load_s']} | "
                  f"{ld['local_mb_per_s']} |", "",
                  f"Shared over local: {ld['shared_over_local']}×; the SHA-256 check alone takes {ld['sha256_s']} s "
                  "of either. A local disk is the best case for the shared read: at scale a rank reads at its share "
                  "of the filesystem's aggregate rate.", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    outcome = run()
    print(json.dumps(outcome, indent=2))
    print(to_markdown(outcome))
