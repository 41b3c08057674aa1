"""A faster resume: each rank keeps its newest shard in the pod's memory and a restart in place reads it back, only
when it is exactly the agreed step of this run and rank and every file matches the shared manifest; the shared
filesystem stays the truth, and keeping the copy never breaks a checkpoint."""

from __future__ import annotations

import logging
import os
import signal
import tempfile
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.test_training_supervisor import WORLD, finish, mark, start_gang, wait_for
from training_runtime import TrainingRuntime
from training_runtime.examples.resume_drill import read_events
from training_runtime.local_cache import LOCAL, SHARED, LocalShardCache
from training_runtime.metrics import CHECKPOINT_LOAD
from training_runtime.settings import Settings, SettingsError
from training_runtime.store import CheckpointStore, Published, step_dir_name

RUN = "job-6f1c"


def _env(tmp: Path, cache: Path | None, **extra: str) -> dict[str, str]:
    env = {"CHECKPOINT_DIR": str(tmp / "shared"), "CHECKPOINT_INTERVAL_STEPS": "2", "CHECKPOINT_KEEP_LAST": "3",
           "TRAINING_RUN_ID": RUN, **extra}
    if cache is not None:
        env["CHECKPOINT_LOCAL_CACHE"] = str(cache)
    return env


def _train(env: dict[str, str], steps: int = 4, payload: bytes = b"ballast" * 100) -> None:
    rt = TrainingRuntime.from_env(env)
    rt.resume()
    for step in range(1, steps + 1):
        rt.maybe_checkpoint(step, lambda step=step: {"w.json": str(step).encode(),  # type: ignore[misc]
                                                    "ballast.bin": payload})
    rt.close()


def _resume(env: dict[str, str]) -> tuple[TrainingRuntime, str, int, dict[str, bytes]]:
    rt = TrainingRuntime.from_env(env)
    resumed = rt.resume()
    assert resumed is not None
    rt.close()
    return rt, resumed.source, resumed.step, resumed.files


def _cached(cache: Path, run: str = RUN, rank: int = 0) -> Path:
    return cache / run / f"rank-{rank:05d}"


def test_a_restart_reads_its_own_copy_of_the_agreed_step_and_keeps_only_the_newest(tmp_path: Path) -> None:
    cache = tmp_path / "shm"
    _train(_env(tmp_path, cache))
    assert sorted(p.name for p in _cached(cache).iterdir()) == [step_dir_name(4)]  # one step, no leftovers
    assert sorted(p.name for p in (_cached(cache) / step_dir_name(4)).iterdir()) == [
        "rank-00000.ballast.bin", "rank-00000.w.json"]  # the shared shard's names and bytes
    rt, source, step, files = _resume(_env(tmp_path, cache))
    assert (source, step, files["w.json"]) == (LOCAL, 4, b"4")
    assert rt.metrics.registry.get_sample_value(CHECKPOINT_LOAD, {"rank": "0", "source": LOCAL}) is not None
    assert rt.metrics.registry.get_sample_value(CHECKPOINT_LOAD, {"rank": "0", "source": SHARED}) is None


def test_without_the_variable_nothing_is_kept_and_the_shared_copy_is_read(tmp_path: Path) -> None:
    _train(_env(tmp_path, None))
    rt, source, step, files = _resume(_env(tmp_path, None))
    assert (source, step, files["w.json"]) == (SHARED, 4, b"4")
    assert rt.cache is None and rt.checkpointer is not None and rt.checkpointer.cache is None
    assert rt.metrics.registry.get_sample_value(CHECKPOINT_LOAD, {"rank": "0", "source": SHARED}) is not None


def test_a_tampered_copy_is_not_used_and_the_log_says_why(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    cache = tmp_path / "shm"
    _train(_env(tmp_path, cache))
    copy = _cached(cache) / step_dir_name(4) / "rank-00000.w.json"
    copy.write_bytes(b"5")  # same size, other bytes: only the checksum tells
    with caplog.at_level(logging.INFO, logger="training_runtime"):
        _, source, _, files = _resume(_env(tmp_path, cache))
    assert (source, files["w.json"]) == (SHARED, b"4")
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("rank-00000.w.json: its sha256 does not match the manifest's" in m and "shared filesystem" in m
               for m in warned), warned


def test_a_copy_of_another_step_or_another_run_is_never_read(tmp_path: Path,
                                                             caplog: pytest.LogCaptureFixture) -> None:
    cache = tmp_path / "shm"
    _train(_env(tmp_path, cache))
    # Another job under the same cache root: its run id names another directory, never looked at.
    with caplog.at_level(logging.INFO, logger="training_runtime"):
        _, source, _, _ = _resume(_env(tmp_path, cache, TRAINING_RUN_ID="other-job"))
    assert source == SHARED and "no local copy of step 4" in caplog.text
    # The newest shared checkpoint is gone (it failed verification): the gang agrees on step 2, the copy holds 4.
    (tmp_path / "shared" / step_dir_name(4) / "COMMITTED").unlink()
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="training_runtime"):
        _, source, step, files = _resume(_env(tmp_path, cache))
    assert (source, step, files["w.json"]) == (SHARED, 2, b"2")
    assert "no local copy of step 2 (it holds step 4, not the one the gang resumes)" in caplog.text


def test_a_failure_while_keeping_the_copy_never_breaks_the_checkpoint(tmp_path: Path,
                                                                      caplog: pytest.LogCaptureFixture) -> None:
    blocked = tmp_path / "not-a-directory"
    blocked.write_text("")  # the copy's directory cannot be made under a file
    with caplog.at_level(logging.WARNING, logger="training_runtime"):
        _train(_env(tmp_path, blocked))
    assert "no local copy of checkpoint step 4" in caplog.text
    assert CheckpointStore(tmp_path / "shared").published_steps() == [4, 2]
    _, source, step, _ = _resume(_env(tmp_path, blocked))
    assert (source, step) == (SHARED, 4)


def test_a_shard_over_the_size_limit_is_not_kept_and_says_so(tmp_path: Path,
                                                             caplog: pytest.LogCaptureFixture) -> None:
    cache = tmp_path / "shm"
    _train(_env(tmp_path, cache), steps=2)
    assert _cached(cache).is_dir()
    # The shard grows past the limit: not kept, and the older copy goes too (it is no longer the newest shard).
    with caplog.at_level(logging.INFO, logger="training_runtime"):
        _train(_env(tmp_path, cache, CHECKPOINT_LOCAL_CACHE_MAX_GB="0.000001", CHECKPOINT_RESUME="none"),
               steps=4, payload=b"x" * 2000)
    said = [r.getMessage() for r in caplog.records if "not keeping a local copy" in r.getMessage()]
    assert len(said) == 1 and "CHECKPOINT_LOCAL_CACHE_MAX_GB=1e-06 GB (1000 bytes)" in said[0], said
    assert list(_cached(cache).iterdir()) == []
    assert CheckpointStore(tmp_path / "shared").published_steps()[0] == 4


def test_the_settings_read_the_cache_and_refuse_bad_values(tmp_path: Path) -> None:
    ck = Settings.from_env({"CHECKPOINT_DIR": "/ck", "CHECKPOINT_LOCAL_CACHE": "/dev/shm/c"}).checkpoint
    assert ck is not None and ck.local_cache == Path("/dev/shm/c") and ck.local_cache_max_bytes == 8 * 10**9
    off = Settings.from_env({"CHECKPOINT_DIR": "/ck"}).checkpoint
    assert off is not None and off.local_cache is None
    with pytest.raises(SettingsError, match="CHECKPOINT_LOCAL_CACHE='shm': expected an absolute path"):
        Settings.from_env({"CHECKPOINT_DIR": "/ck", "CHECKPOINT_LOCAL_CACHE": "shm"})
    with pytest.raises(SettingsError, match="CHECKPOINT_LOCAL_CACHE_MAX_GB='-1': expected a positive number of "
                                            "gigabytes"):
        Settings.from_env({"CHECKPOINT_DIR": "/ck", "CHECKPOINT_LOCAL_CACHE_MAX_GB": "-1"})


# ------------------------------------------------------------------ the invariant, by property

NAMES = st.from_regex(r"[a-z][a-z0-9_]{0,8}\.bin", fullmatch=True)
SHARD = st.dictionaries(NAMES, st.binary(max_size=64), min_size=1, max_size=4)
DAMAGE = st.sampled_from(["none", "flip", "truncate", "extend", "delete", "rename-step", "other-rank"])


def _write(store: CheckpointStore, cache: LocalShardCache, step: int, files: dict[str, bytes]) -> Published:
    copy = cache.copy(step)
    store.write_shard("a", step, 0, copy.tee(files.items()))
    assert copy.finish()
    return store.commit("a", step, 1, timeout_seconds=5)


@settings(max_examples=60, deadline=None)
@given(first=SHARD, second=SHARD, damage=DAMAGE, which=st.integers(0, 3), at=st.integers(0, 63))
def test_the_copy_is_read_only_when_it_is_exactly_the_shared_shard(
        first: dict[str, bytes], second: dict[str, bytes], damage: str, which: int, at: int) -> None:
    """Whatever happened to the copy, a read gives the shared shard's bytes or nothing (a copy read under another step
    counts only where its bytes are that step's, byte for byte); an untouched copy of the agreed step is always read."""
    with tempfile.TemporaryDirectory() as tmp:
        store = CheckpointStore(Path(tmp) / "shared")
        cache = LocalShardCache(Path(tmp) / "shm", RUN, 0, max_bytes=10**6)
        older = _write(store, cache, 1, first)
        newest = _write(store, cache, 2, second)
        assert cache.cached_steps() == [2]
        files = sorted((cache.step_dir(2)).iterdir())
        target = files[which % len(files)]
        data = target.read_bytes()
        if damage == "flip" and data:
            target.write_bytes(data[:at % len(data)] + bytes([data[at % len(data)] ^ 1]) + data[at % len(data) + 1:])
        elif damage == "truncate" and data:
            target.write_bytes(data[:-1])
        elif damage == "extend":
            target.write_bytes(data + b"\0")
        elif damage == "delete":
            target.unlink()
        elif damage == "rename-step":  # a copy of step 2 presented as step 1
            os.replace(cache.step_dir(2), cache.step_dir(1))
        elif damage == "other-rank":
            os.replace(cache.dir, cache.dir.parent / "rank-00001")
        changed = damage in ("extend", "delete", "rename-step", "other-rank") or (
            damage in ("flip", "truncate") and bool(data))
        for published, shard in ((newest, second), (older, first)):
            got = cache.read(published)
            assert got.files is None or got.files == shard  # never other bytes than the shared shard's
            if published is newest and not changed:
                assert got.files is not None, got.reason
            assert store.read_shard(published, 0) == shard


# ------------------------------------------------------------------ real processes under the supervisor

CACHE_INTERVAL = 20


def _resumes(workdir: Path, round_: int) -> dict[int, dict[str, object]]:
    return {e["rank"]: e for e in read_events(workdir / "events", WORLD)
            if e["event"] == "resume" and e["inplace"] == round_}


def test_an_inplace_restart_reloads_every_rank_from_its_own_memory(tmp_path: Path) -> None:
    """Rank 1's worker is killed between two checkpoints: both supervisors restart their workers in the same pods,
    and each worker reads the agreed step from its own copy, none from the shared filesystem."""
    shm = tmp_path / "shm"
    procs = start_gang(tmp_path, extra={"CHECKPOINT_LOCAL_CACHE": str(shm),
                                        "CHECKPOINT_INTERVAL_STEPS": str(CACHE_INTERVAL)})

    def both_durable() -> bool:
        events = read_events(tmp_path / "events", WORLD)
        return {e["rank"] for e in events if e["event"] == "durable" and e["step"] == CACHE_INTERVAL} == {0, 1}

    wait_for(both_durable)  # rank 0's durable is its commit; rank 1's, its shard and its copy
    victim = mark(tmp_path, 1)["worker_pid"]
    assert isinstance(victim, int)
    os.kill(victim, signal.SIGKILL)
    results = finish(procs)
    assert [rc for rc, _ in results] == [0, 0], results
    first, again = _resumes(tmp_path, 0), _resumes(tmp_path, 1)
    assert {r: e["source"] for r, e in first.items()} == {0: None, 1: None}  # a new run: nothing to load
    assert {r: (e["step"], e["source"]) for r, e in again.items()} == {0: (CACHE_INTERVAL, LOCAL),
                                                                      1: (CACHE_INTERVAL, LOCAL)}, again
    assert all(f"loaded its shard of step {CACHE_INTERVAL} from the local copy" in out for _, out in results)
    assert all(isinstance(e["load_seconds"], float) for e in again.values())


def test_a_replacement_pod_reads_the_shared_copy_while_the_rank_that_stayed_reads_its_own(tmp_path: Path) -> None:
    """An evicted rank's pod is replaced on another node: its memory is new and empty, so it reads the shared
    filesystem; the rank whose pod stayed reads the stop checkpoint from its own copy."""
    procs = start_gang(tmp_path, steps=200, extra={"CHECKPOINT_LOCAL_CACHE": str(tmp_path / "shm-pod-a")})
    wait_for(lambda: any(e["event"] == "step" and e["step"] >= 15 for e in read_events(tmp_path / "events", WORLD)))
    procs[1].send_signal(signal.SIGTERM)
    assert procs[1].wait(timeout=60) == 0
    wait_for(lambda: mark(tmp_path, 0).get("round") == 1 and mark(tmp_path, 0).get("phase") == "ready")
    replacement = start_gang(tmp_path, steps=200, ranks=(1,), extra={
        "TRAINING_ATTEMPT": "1", "CHECKPOINT_LOCAL_CACHE": str(tmp_path / "shm-pod-b")})[0]
    started = time.monotonic()
    results = finish([procs[0], replacement], timeout=180)
    assert [rc for rc, _ in results] == [0, 0], (results, time.monotonic() - started)
    stopped = {e["step"] for e in read_events(tmp_path / "events", WORLD) if e["event"] == "graceful"}
    again = _resumes(tmp_path, 1)
    assert {r: (e["step"], e["source"]) for r, e in again.items()} == {0: (*stopped, LOCAL),
                                                                      1: (*stopped, SHARED)}, again
    assert f"no local copy of step {next(iter(stopped))}" in results[1][1]
