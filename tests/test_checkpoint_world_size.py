"""A checkpoint resumes whole or not at all: one written by a gang of another size is refused on every rank.

Ranks run as threads over an in-memory collective, each with the real runtime and store.
"""

from __future__ import annotations

import json
import logging
import tempfile
import threading
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from training_runtime import CheckpointStore, Resumed, TrainingRuntime, WorldSizeMismatch
from training_runtime.manifest import sha256_hex
from training_runtime.settings import CheckpointSettings, DistEnv, Settings
from training_runtime.store import step_dir_name


class ThreadGang:
    """An allgather for ranks that are threads of one process."""

    def __init__(self, size: int) -> None:
        self.barrier = threading.Barrier(size, timeout=10)
        self.slots: list[Any] = [None] * size


class ThreadCollective:
    def __init__(self, gang: ThreadGang, rank: int) -> None:
        self.gang, self.rank = gang, rank

    def allgather(self, obj: Any) -> list[Any]:
        self.gang.slots[self.rank] = obj
        self.gang.barrier.wait()
        out = list(self.gang.slots)
        self.gang.barrier.wait()
        return out

    def broadcast(self, obj: Any, src: int = 0) -> Any:
        return self.allgather(obj)[src]


def shard(rank: int, count: int) -> dict[str, bytes]:
    """What rank ``rank`` saves: ``count`` files (a rank may save none)."""
    return {f"part{i}.bin": bytes([rank, i]) * 8 for i in range(count)}


def save(root: Path, step: int, files_per_rank: list[int]) -> None:
    store = CheckpointStore(root)
    for rank, count in enumerate(files_per_rank):
        store.write_shard("old-a0", step, rank, shard(rank, count).items())
    store.commit("old-a0", step, len(files_per_rank), timeout_seconds=5)


def resume_gang(root: Path, world: int) -> list[Resumed | BaseException | None]:
    """Every rank's answer from ``resume()``: what it resumed, or what it raised."""
    gang = ThreadGang(world)
    out: list[Resumed | BaseException | None] = [None] * world

    def rank_main(rank: int) -> None:
        ck = CheckpointSettings(directory=root, interval_steps=100, interval_seconds=None, keep_last=3, resume=True)
        rt = TrainingRuntime(Settings(dist=DistEnv(rank, world, "127.0.0.1", 1, 1), checkpoint=ck,
                                      collective_timeout_seconds=5, metrics_port=0, heartbeat_metric="hb"),
                             ThreadCollective(gang, rank))
        try:
            out[rank] = rt.resume()
        except BaseException as exc:
            out[rank] = exc
        finally:
            rt.close()

    threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    return out


@pytest.mark.parametrize(("saved", "job"), [(1, 2), (2, 1)])
def test_a_checkpoint_of_another_world_size_is_refused_on_every_rank_naming_both(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, saved: int, job: int) -> None:
    save(tmp_path, 40, [1] * saved)
    with caplog.at_level(logging.ERROR, "training_runtime"):
        answers = resume_gang(tmp_path, job)
    path = tmp_path / "step-00000040"
    for answer in answers:
        assert isinstance(answer, WorldSizeMismatch), answers
        text = str(answer)
        assert f"checkpoint {path} (step 40) was written by {saved} rank" in text
        assert f"this job runs {job} rank" in text and f"WORLD_SIZE={job}" in text
        assert (answer.saved, answer.job, answer.step, answer.path) == (saved, job, 40, path)
    assert len([r for r in caplog.records if "was written by" in r.getMessage()]) == job, "every rank says why"
    assert (tmp_path / "step-00000040").is_dir(), "a refused checkpoint is kept"


def test_the_same_world_size_resumes_every_rank_with_its_own_shard(tmp_path: Path) -> None:
    save(tmp_path, 40, [2, 0, 1])
    answers = resume_gang(tmp_path, 3)
    assert [(a.step, a.files) for a in answers if isinstance(a, Resumed)] == [
        (40, shard(0, 2)), (40, {}), (40, shard(2, 1))]


def test_a_manifest_without_its_world_size_is_skipped_with_the_reason(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Every manifest this runtime writes records ``worldSize`` (it is required since version 1). One without it
    was not written by us: which ranks it was for cannot be told from its files (a rank may save none), so it is
    skipped like any invalid checkpoint, with the reason, never resumed on a guess."""
    save(tmp_path, 10, [1])
    save(tmp_path, 20, [1])
    newest = tmp_path / step_dir_name(20)
    raw = json.loads((newest / "manifest.json").read_text())
    del raw["worldSize"]
    body = (json.dumps(raw, indent=1, sort_keys=True) + "\n").encode()
    (newest / "manifest.json").write_bytes(body)
    (newest / "COMMITTED").write_text(sha256_hex(body) + "\n")  # consistent, so only the missing field counts
    with caplog.at_level(logging.WARNING, "training_runtime.checkpoint"):
        [answer] = resume_gang(tmp_path, 1)
    assert isinstance(answer, Resumed) and answer.step == 10
    assert f"skipping checkpoint {newest}: manifest invalid: worldSize: expected a whole number >= 1, got None" \
        in caplog.text


@settings(max_examples=40, deadline=None)
@given(saved=st.lists(st.integers(0, 2), min_size=1, max_size=4).filter(any), job=st.integers(1, 4),
       step=st.integers(1, 10**6))
def test_resume_is_whole_or_refused_for_any_pair_of_world_sizes(saved: list[int], job: int, step: int) -> None:
    """``saved`` is the files each rank of the saving gang wrote (some rank writes one: a manifest lists at least
    one file); ``job`` the resuming gang's size."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        save(root, step, saved)
        answers = resume_gang(root, job)
    if len(saved) == job:
        assert all(isinstance(a, Resumed) and a.step == step for a in answers), answers
        assert [a.files for a in answers if isinstance(a, Resumed)] == [shard(r, n) for r, n in enumerate(saved)]
    else:
        assert all(isinstance(a, WorldSizeMismatch) for a in answers), answers
        for a in answers:
            assert f"written by {len(saved)} rank" in str(a) and f"this job runs {job} rank" in str(a)
            assert f"{root / step_dir_name(step)} (step {step})" in str(a)
