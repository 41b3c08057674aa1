"""Resume and retention over any state a crash or a person can leave in a job's checkpoint directory.

Each test below started as a defect found by acceptance testing; the property tests hold the invariant
behind it over generated directory states:

* resume never raises: a damaged checkpoint is skipped with its reason (a resume that raises makes the
  gang crash-loop until someone deletes the directory);
* only directories named exactly as we write them, and not symbolic links, are checkpoints: a link out of
  the job's directory is never resumed from, never holds a retention slot and is never followed to delete;
* retention never removes the checkpoint just written nor one being written, never keeps a corrupt one in
  a slot, and never leaves fewer complete checkpoints than ``keep_last`` allows.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from training_runtime.manifest import COMMIT_MARKER, MANIFEST_NAME, sha256_hex
from training_runtime.store import CheckpointStore, parse_step_dir, step_dir_name

ATTEMPT = "job-a2"


def publish(store: CheckpointStore, step: int, attempt: str = "job-a1", data: bytes | None = None) -> Path:
    store.write_shard(attempt, step, 0, [("model", data if data is not None else f"state {step}".encode())])
    return store.commit(attempt, step, 1, timeout_seconds=5).path


def remarker(path: Path, body: bytes) -> None:
    """Replace the manifest and write the marker that matches it (damage a checksum cannot catch)."""
    (path / MANIFEST_NAME).write_bytes(body)
    (path / COMMIT_MARKER).write_text(sha256_hex(body) + "\n")


DAMAGE = {
    "complete": lambda p: None,
    "no-marker": lambda p: (p / COMMIT_MARKER).unlink(),
    "truncated": lambda p: (p / "rank-00000.model").write_bytes(b"st"),
    "marker-not-text": lambda p: (p / COMMIT_MARKER).write_bytes(b"\xff\xfe\x00\x81"),
    "absurd-step": lambda p: remarker(p, json.dumps({"version": 1, "step": int("9" * 3000), "worldSize": 1,
                                                     "files": []}).encode()),
    "manifest-not-json": lambda p: remarker(p, b"\xff{not json"),
    "bit-flip": lambda p: (p / "rank-00000.model").write_bytes(b"X" + (p / "rank-00000.model").read_bytes()[1:]),
}
#: What retention can see without reading every byte: a bit flip inside a shard is found by resume (which then
#: falls back), not by retention.
RETENTION_COMPLETE = {"complete", "bit-flip"}


# ---------------------------------------------------------------------------------------------- the defects


def test_corrupt_newest_checkpoints_never_cost_the_one_just_written(tmp_path: Path) -> None:
    """Defect: resumed from 400 past corrupt 500 and 600, the first commit kept those two and removed 410 and 400."""
    store = CheckpointStore(tmp_path)
    for step in (400, 500, 600):
        publish(store, step)
    DAMAGE["no-marker"](tmp_path / step_dir_name(500))
    DAMAGE["truncated"](tmp_path / step_dir_name(600))
    found = store.latest_complete()
    assert found is not None and found.step == 400
    publish(store, 410, ATTEMPT)
    store.prune(2, current_attempt=ATTEMPT, newest=410)
    assert store.published_steps() == [410, 400]
    assert store.latest_complete() is not None and store.latest_complete().step == 410  # type: ignore[union-attr]


def test_a_name_spelled_another_way_is_not_a_checkpoint_and_never_costs_one(tmp_path: Path,
                                                                           caplog: pytest.LogCaptureFixture) -> None:
    """Defect: ``step-1200`` sorted as step 1200, was never tried for resume, and retention deleted the fresh one."""
    store = CheckpointStore(tmp_path)
    publish(store, 1200)
    os.rename(tmp_path / step_dir_name(1200), tmp_path / "step-1200")
    publish(store, 1000)
    with caplog.at_level(logging.WARNING):
        found = store.latest_complete()
    assert found is not None and found.step == 1000
    assert "step-1200: not a checkpoint of this job" in caplog.text
    publish(store, 1010, ATTEMPT)
    store.prune(1, current_attempt=ATTEMPT, newest=1010)
    assert store.published_steps() == [1010]
    assert (tmp_path / "step-1200").is_dir(), "not ours: never deleted"


@pytest.mark.parametrize("damage", ["marker-not-text", "absurd-step", "manifest-not-json"])
def test_a_damaged_marker_or_manifest_is_skipped_not_raised(tmp_path: Path, damage: str,
                                                            caplog: pytest.LogCaptureFixture) -> None:
    """Defect: a marker that is not UTF-8 or a step of thousands of digits made resume raise."""
    store = CheckpointStore(tmp_path)
    publish(store, 10)
    DAMAGE[damage](publish(store, 20))
    with caplog.at_level(logging.WARNING):
        found = store.latest_complete()
    assert found is not None and found.step == 10
    assert f"skipping checkpoint {tmp_path / step_dir_name(20)}" in caplog.text


def test_a_directory_with_hundreds_of_digits_is_not_a_step(tmp_path: Path) -> None:
    (tmp_path / ("step-" + "7" * 250)).mkdir()  # as long as a file name can be
    store = CheckpointStore(tmp_path)
    publish(store, 5)
    assert store.published_steps() == [5]
    assert parse_step_dir("step-" + "7" * 5000) is None
    assert parse_step_dir("step-００００００１２") is None  # full-width digits
    assert parse_step_dir(step_dir_name(12)) == 12


def test_a_symlink_out_of_the_job_directory_is_never_resumed_never_counted_never_followed(tmp_path: Path) -> None:
    """Defect: a ``step-`` link to another job's checkpoint was resumed from and held a retention slot forever."""
    other = CheckpointStore(tmp_path / "other-job")
    foreign = publish(other, 900)
    store = CheckpointStore(tmp_path / "job")
    publish(store, 100)
    (store.root / step_dir_name(900)).symlink_to(foreign, target_is_directory=True)
    found = store.latest_complete()
    assert found is not None and found.step == 100
    assert store.published_steps() == [100]
    publish(store, 110, ATTEMPT)
    store.prune(1, current_attempt=ATTEMPT, newest=110)
    assert store.published_steps() == [110]
    assert (store.root / step_dir_name(900)).is_symlink(), "left alone"
    assert other.latest_complete() is not None, "the other job's checkpoint is intact"


def test_a_shard_that_is_a_symlink_fails_verification(tmp_path: Path) -> None:
    store = CheckpointStore(tmp_path / "job")
    path = publish(store, 10)
    outside = tmp_path / "outside"
    outside.write_bytes((path / "rank-00000.model").read_bytes())
    (path / "rank-00000.model").unlink()
    (path / "rank-00000.model").symlink_to(outside)
    assert store.latest_complete() is None


def test_retention_refuses_to_keep_nothing(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="keep_last must be at least 1, got 0"):
        CheckpointStore(tmp_path).prune(0)


# ---------------------------------------------------------------------------------------------- properties

steps_and_damage = st.dictionaries(st.integers(1, 60).map(lambda s: s * 10), st.sampled_from(sorted(DAMAGE)),
                                   max_size=6)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(state=steps_and_damage, foreign=st.sets(st.sampled_from(["unpadded", "symlink", "huge"])),
       keep_last=st.integers(1, 4), advance=st.integers(1, 10), writing=st.booleans())
def test_resume_then_commit_then_retention_hold_the_invariants(tmp_path_factory: pytest.TempPathFactory,
                                                              state: dict[int, str], foreign: set[str],
                                                              keep_last: int, advance: int, writing: bool) -> None:
    root = tmp_path_factory.mktemp("ckpt")
    store = CheckpointStore(root / "job")
    store.root.mkdir()
    for step, damage in sorted(state.items()):
        DAMAGE[damage](publish(store, step))
    outside = publish(CheckpointStore(root / "other"), 10_000)
    if "unpadded" in foreign:
        shutil.copytree(outside, store.root / "step-7")
    if "symlink" in foreign:
        (store.root / step_dir_name(9_999)).symlink_to(outside, target_is_directory=True)
    if "huge" in foreign:
        (store.root / ("step-" + "1" * 250)).mkdir(parents=True)
    foreign_before = sorted(p.name for p in store.root.iterdir() if p.name.startswith("step-")
                            and parse_step_dir(p.name) not in state)

    # Resume: the newest complete checkpoint of ours, whatever else is there; never an exception.
    found = store.latest_complete()
    complete = sorted((s for s, d in state.items() if d == "complete"), reverse=True)
    assert (found.step if found else None) == (complete[0] if complete else None)

    # The next checkpoint of this attempt, and (maybe) the one after it still being written: a kill point.
    new = (found.step if found else 0) + advance
    publish(store, new, ATTEMPT)
    if writing:
        store.write_shard(ATTEMPT, new + advance, 0, [("model", b"half")])
    store.prune(keep_last, current_attempt=ATTEMPT, newest=new)

    survivors = sorted((s for s, d in state.items() if s < new and d in RETENTION_COMPLETE), reverse=True)
    assert store.published_steps() == [new, *survivors][:keep_last]
    assert store.verify(store.root / step_dir_name(new)).step == new, "the checkpoint just written stays whole"
    assert sorted(p.name for p in store.foreign_entries()) == foreign_before, "foreign entries left alone"
    assert CheckpointStore(root / "other").latest_complete() is not None, "nothing followed out of the job"
    if writing:
        assert store.staging_dir(ATTEMPT, new + advance).is_dir(), "a checkpoint being written is never removed"
    # And a resume now lands on the checkpoint just written.
    resumed = store.latest_complete()
    assert resumed is not None and resumed.step == new
