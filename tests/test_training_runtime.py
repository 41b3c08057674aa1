"""The training runtime's core: settings, manifest, atomic commit, verification, async checkpoints, metrics."""

from __future__ import annotations

import json
import logging
import threading
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from training_runtime import (
    BytesSnapshot,
    CheckpointStore,
    LocalCollective,
    ManifestError,
    SettingsError,
    TrainingRuntime,
    parse_manifest,
)
from training_runtime.checkpointer import AsyncCheckpointer
from training_runtime.manifest import MAX_STEP, FileEntry, Manifest, sha256_hex
from training_runtime.metrics import CHECKPOINT_DURATION, TrainingMetrics
from training_runtime.settings import CheckpointSettings, DistEnv, Settings

# ---------------------------------------------------------------- settings


def test_rank_from_volcano_task_index_when_the_template_says_so() -> None:
    # A single task that is both master and worker: the pytorch plugin numbers RANK 1..N; the index is 0..N-1.
    env = {"RANK": "4", "WORLD_SIZE": "4", "VC_TASK_INDEX": "3", "TRAINING_RANK_SOURCE": "VC_TASK_INDEX",
           "MASTER_ADDR": "job-worker-0.job", "MASTER_PORT": "23456", "TRAINING_ATTEMPT": "2"}
    d = DistEnv.from_env(env)
    assert (d.rank, d.world_size, d.master_addr, d.master_port, d.attempt) == (3, 4, "job-worker-0.job", 23456, 2)
    with pytest.raises(SettingsError, match=r"RANK=4 is not below WORLD_SIZE=4"):
        DistEnv.from_env({**env, "TRAINING_RANK_SOURCE": "RANK"})


def test_torchrun_children_keep_torchruns_rank() -> None:
    env = {"RANK": "13", "LOCAL_RANK": "5", "WORLD_SIZE": "16", "VC_TASK_INDEX": "1",
           "TRAINING_RANK_SOURCE": "VC_TASK_INDEX", "TRAINING_ATTEMPT": "3", "TRAINING_RUN_ID": "job-0f3c",
           "TORCHELASTIC_RESTART_COUNT": "2"}
    d = DistEnv.from_env(env)
    assert d.rank == 13 and d.under_torchrun
    # torchrun restarting its workers inside the pods is a new attempt too: its files must not mix with the last.
    assert d.attempt_key == "job-0f3c-a3-r2"


@pytest.mark.parametrize(("env", "message"), [
    ({"WORLD_SIZE": "2"}, "RANK is not set"),
    ({"WORLD_SIZE": "two"}, "WORLD_SIZE='two': expected a whole number"),
    ({"TRAINING_RANK_SOURCE": "POD"}, "TRAINING_RANK_SOURCE='POD'"),
    ({"CHECKPOINT_DIR": "/c", "CHECKPOINT_INTERVAL_STEPS": "0"}, "CHECKPOINT_INTERVAL_STEPS='0': expected at least 1"),
    ({"CHECKPOINT_DIR": "/c", "CHECKPOINT_INTERVAL_SECONDS": "-5"}, "CHECKPOINT_INTERVAL_SECONDS='-5'"),
    ({"CHECKPOINT_DIR": "/c", "CHECKPOINT_RESUME": "newest"}, "CHECKPOINT_RESUME='newest'"),
    ({"TRAINING_COLLECTIVE_TIMEOUT_SECONDS": "inf"}, "TRAINING_COLLECTIVE_TIMEOUT_SECONDS='inf'"),
    ({"TRAINING_HEARTBEAT_METRIC": "9lives"}, "TRAINING_HEARTBEAT_METRIC='9lives'"),
])
def test_bad_environment_is_named(env: dict[str, str], message: str) -> None:
    with pytest.raises(SettingsError, match=message.replace("(", r"\(")):
        Settings.from_env(env)


def test_defaults_without_a_gang() -> None:
    s = Settings.from_env({})
    assert (s.dist.rank, s.dist.world_size, s.checkpoint, s.metrics_port) == (0, 1, None, 0)
    assert s.collective_timeout_seconds == 600


# ---------------------------------------------------------------- manifest (outside input)

names = st.from_regex(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,20}", fullmatch=True).filter(
    lambda n: n not in ("manifest.json", "COMMITTED"))
entries = st.builds(FileEntry, name=names, size=st.integers(0, 2**50),
                    sha256=st.text("0123456789abcdef", min_size=64, max_size=64))
manifests = st.builds(Manifest, step=st.integers(0, MAX_STEP), world_size=st.integers(1, 20_000),
                      files=st.lists(entries, min_size=1, max_size=8, unique_by=lambda e: e.name).map(tuple))


@given(manifests)
def test_manifest_round_trips(manifest: Manifest) -> None:
    assert parse_manifest(manifest.dumps()) == manifest


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)


@given(st.binary(max_size=200) | json_values.map(lambda v: json.dumps(v).encode()))
def test_any_input_parses_or_fails_with_a_manifest_error(data: bytes) -> None:
    try:
        manifest = parse_manifest(data)
    except ManifestError:
        return
    assert parse_manifest(manifest.dumps()) == manifest


@settings(max_examples=50)
@given(manifests, st.sampled_from([
    ("step", -1, "step"), ("step", True, "step"), ("worldSize", 0, "worldSize"), ("version", 2, "version"),
    ("files", [], "files"), ("extra", 1, "unknown keys"),
]))
def test_a_wrong_field_is_named(manifest: Manifest, change: tuple[str, Any, str]) -> None:
    key, value, named = change
    raw = json.loads(manifest.dumps())
    raw[key] = value
    with pytest.raises(ManifestError, match=named):
        parse_manifest(json.dumps(raw))


@pytest.mark.parametrize(("entry", "named"), [
    ({"name": "../etc/passwd", "size": 1, "sha256": "0" * 64}, "files[0].name"),
    ({"name": "a", "size": -1, "sha256": "0" * 64}, "files[0].size"),
    ({"name": "a", "size": 1, "sha256": "XYZ"}, "files[0].sha256"),
    ({"name": "a", "size": 1}, "files[0].sha256"),
])
def test_a_wrong_file_entry_is_named(entry: dict[str, Any], named: str) -> None:
    raw = {"version": 1, "step": 1, "worldSize": 1, "files": [entry]}
    with pytest.raises(ManifestError, match=named.replace("[", r"\[")):
        parse_manifest(json.dumps(raw))


# ---------------------------------------------------------------- store


def _publish(store: CheckpointStore, step: int, world: int = 2, size: int = 1000) -> None:
    for rank in range(world):
        store.write_shard("r-a0", step, rank, [("state.bin", bytes([rank, step % 256]) * (size // 2))])
    store.commit("r-a0", step, world, timeout_seconds=5)


def test_commit_publishes_a_verified_checkpoint(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    _publish(store, 10)
    found = store.latest_complete()
    assert found is not None and found.step == 10 and found.manifest.world_size == 2
    assert [f.name for f in found.manifest.files] == ["rank-00000.state.bin", "rank-00001.state.bin"]
    assert store.read_shard(found, 1) == {"state.bin": bytes([1, 10]) * 500}
    assert sorted(p.name for p in found.path.iterdir()) == [
        "COMMITTED", "manifest.json", "rank-00000.state.bin", "rank-00001.state.bin"]
    assert not any((tmp_path / ".staging").iterdir()), "the staging directory was renamed, not copied"


def test_commit_waits_for_every_rank_and_times_out_naming_the_missing(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    store.write_shard("r-a0", 5, 0, [("s", b"x")])
    with pytest.raises(TimeoutError, match=r"ranks \[1\] did not deliver"):
        store.commit("r-a0", 5, 2, timeout_seconds=0.05)
    assert store.latest_complete() is None


def test_partial_and_corrupt_checkpoints_are_skipped_with_the_reason(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    store = CheckpointStore(tmp_path)
    for step in (10, 20, 30, 40):
        _publish(store, step)
    truncated = tmp_path / "step-00000040" / "rank-00001.state.bin"
    truncated.write_bytes(truncated.read_bytes()[:300])
    flipped = tmp_path / "step-00000030" / "rank-00000.state.bin"
    data = bytearray(flipped.read_bytes())
    data[7] ^= 0xFF
    flipped.write_bytes(bytes(data))
    (tmp_path / "step-00000020" / "COMMITTED").unlink()
    with caplog.at_level(logging.WARNING, "training_runtime.checkpoint"):
        found = store.latest_complete()
    assert found is not None and found.step == 10
    lines = [r.getMessage() for r in caplog.records]
    assert any("step-00000040: rank-00001.state.bin: 300 bytes, manifest says 1000 (truncated?)" in m for m in lines)
    assert any("step-00000030: rank-00000.state.bin: sha256" in m and "does not match the manifest" in m
               for m in lines)
    assert any("step-00000020: no commit marker (partial write)" in m for m in lines)


def test_an_edited_manifest_is_caught_by_the_marker(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    store = CheckpointStore(tmp_path)
    _publish(store, 10)
    manifest = tmp_path / "step-00000010" / "manifest.json"
    manifest.write_text(manifest.read_text().replace('"step": 10', '"step": 11'))
    with caplog.at_level(logging.WARNING):
        assert store.latest_complete() is None
    assert "does not match the commit marker" in caplog.text


def test_retention_keeps_the_newest_and_drops_other_attempts_staging(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    for step in (10, 20, 30, 40):
        _publish(store, step)
    store.write_shard("r-a7", 50, 0, [("s", b"stale")])
    store.write_shard("old-a8", 50, 0, [("s", b"other incarnation")])
    store.prune(2, current_attempt="r-a8")
    assert store.published_steps() == [40, 30]
    assert not any((tmp_path / ".staging").iterdir())


def test_a_corrupt_checkpoint_at_the_same_step_is_replaced(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path)
    _publish(store, 10)
    (tmp_path / "step-00000010" / "COMMITTED").unlink()
    _publish(store, 10)
    assert store.latest_complete() is not None


# ---------------------------------------------------------------- async checkpointer


class GatedStore(CheckpointStore):
    """Holds every shard write until released, to watch what the training step waits for."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.release = threading.Event()
        self.entered = threading.Event()

    def write_shard(self, *args: Any, **kwargs: Any) -> list[FileEntry]:
        self.entered.set()
        assert self.release.wait(10)
        return super().write_shard(*args, **kwargs)


def _checkpointer(store: CheckpointStore, *, steps: int = 10, seconds: float | None = None,
                  clock: Any = None) -> AsyncCheckpointer:
    ck = CheckpointSettings(directory=store.root, interval_steps=steps, interval_seconds=seconds, keep_last=3,
                            resume=True)
    kwargs = {"clock": clock} if clock else {}
    return AsyncCheckpointer(store, ck, DistEnv(0, 1, "127.0.0.1", 1, 0), LocalCollective(),
                             TrainingMetrics("hb", 0), timeout_seconds=5, **kwargs)


def test_the_step_returns_while_the_write_runs_and_the_next_checkpoint_waits(tmp_path: Path) -> None:
    store = GatedStore(tmp_path)
    ckpt = _checkpointer(store)
    ckpt.save(10, lambda: {"w": b"first"})
    assert store.entered.wait(5)
    assert ckpt.writing and store.latest_complete() is None, "save returned before the write"
    second = threading.Thread(target=ckpt.save, args=(20, lambda: {"w": b"second"}))
    second.start()
    second.join(0.2)
    assert second.is_alive(), "the next checkpoint must wait for the previous commit"
    store.release.set()
    second.join(5)
    ckpt.close()
    assert store.published_steps() == [20, 10]


def test_a_failed_write_is_raised_at_the_next_checkpoint(tmp_path: Path) -> None:
    class Broken(CheckpointStore):
        def commit(self, *args: Any, **kwargs: Any) -> Any:
            raise OSError(28, "No space left on device")

    ckpt = _checkpointer(Broken(tmp_path))
    ckpt.save(10, lambda: {"w": b"x"})
    with pytest.raises(OSError, match="No space left"):
        ckpt.save(20, lambda: {"w": b"y"})


def test_due_on_steps_or_on_time_whichever_first(tmp_path: Path) -> None:
    now = [0.0]
    ckpt = _checkpointer(CheckpointStore(tmp_path), steps=100, seconds=60, clock=lambda: now[0])
    assert not ckpt.due(5)
    now[0] = 61
    assert ckpt.due(6)
    ckpt.save(6, lambda: BytesSnapshot({"w": b"x"}))
    assert not ckpt.due(7)
    assert ckpt.due(106)
    ckpt.close()


# ---------------------------------------------------------------- runtime and metrics


def test_single_process_runtime_resumes_and_exposes_the_watched_metrics(tmp_path: Path) -> None:
    env = {"CHECKPOINT_DIR": str(tmp_path), "CHECKPOINT_INTERVAL_STEPS": "2", "TRAINING_ATTEMPT": "1",
           "TRAINING_HEARTBEAT_METRIC": "my_heartbeat"}
    rt = TrainingRuntime.from_env(env)
    assert rt.resume() is None
    for step in range(1, 6):
        rt.step_done(step)
        rt.maybe_checkpoint(step, lambda step=step: {"w": str(step).encode()})  # type: ignore[misc]
    rt.close()
    again = TrainingRuntime.from_env({**env, "TRAINING_ATTEMPT": "2"})
    resumed = again.resume()
    assert resumed is not None and resumed.step == 4 and resumed.files == {"w": b"4"}
    names = rt.metrics.exposed_names()
    assert {"my_heartbeat", CHECKPOINT_DURATION, "gpucluster_checkpoint_bytes", "training_steps_per_second",
            "training_restarts", "gpucluster_checkpoints_skipped_total"} <= names
    assert rt.metrics.checkpoint_bytes._value.get() == 1
    assert again.metrics.restarts._value.get() == 2


def test_steps_per_second_over_the_window() -> None:
    now = [100.0]
    m = TrainingMetrics("hb", 0, clock=lambda: now[0], rate_window_seconds=10)
    m.step_done(1)
    now[0] = 110.0
    m.step_done(21)
    assert m.steps_per_second._value.get() == 2.0
    assert m.heartbeat._value.get() == 110.0


def test_sha256_helper_is_the_standard_digest() -> None:
    assert sha256_hex(b"") == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"


def test_a_step_past_the_bound_is_named_not_raised() -> None:
    body = json.dumps({"version": 1, "step": MAX_STEP + 1, "worldSize": 1, "files": []}).encode()
    with pytest.raises(ManifestError, match=r"step: expected a whole number >= 0 and <= 999999999999, got"):
        parse_manifest(body)
    huge = b'{"version": 1, "step": ' + b"9" * 5000 + b', "worldSize": 1, "files": []}'
    with pytest.raises(ManifestError, match="not JSON"):
        parse_manifest(huge)
