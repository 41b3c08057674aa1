"""Let it crash, for real: N trainer processes as one gang, a worker killed mid-run, the whole gang restarted.

Framework-free (the runtime's core and its file collective), so it runs in ``make test`` without PyTorch's
3 GB of CUDA wheels; the PyTorch path is ``make train-demo``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from training_runtime.checkpointer import LOSS_BOUND_INTERVALS
from training_runtime.examples.resume_drill import kill_and_resume, read_events, run_gang_once, terminate_and_resume
from training_runtime.gang import Action, decide

WORKERS = 3
INTERVAL = 10


@pytest.mark.parametrize(("codes", "restarts", "expected"), [
    ([None, None, None], 0, Action.WAIT),
    ([0, None, 0], 0, Action.WAIT),
    ([0, 0, 0], 0, Action.DONE),
    ([None, -9, None], 0, Action.RESTART),
    ([0, 1, None], 2, Action.RESTART),
    ([None, -9, None], 3, Action.GIVE_UP),
])
def test_gang_policy_restarts_everyone_on_any_failure(codes: list[int | None], restarts: int,
                                                      expected: Action) -> None:
    assert decide(codes, restarts, max_restarts=3) is expected


def test_killed_worker_restarts_the_gang_which_resumes_from_the_newest_checkpoint(tmp_path: Path) -> None:
    drill = kill_and_resume(tmp_path / "killed", workers=WORKERS, steps=60, interval_steps=INTERVAL,
                            kill_at_step=25, victim=1)
    assert drill.launcher_rc == 0, drill.output
    assert drill.attempts == 2, "exactly one whole-gang restart"
    assert "rank(s) [1] exited with [-9]; restarting the whole gang" in drill.output
    # Every rank of the new attempt agreed on one step, and it is a checkpoint step.
    assert len(drill.resume_steps) == WORKERS and len(set(drill.resume_steps.values())) == 1, drill.resume_steps
    resume = drill.resume_steps[0]
    # The newest complete checkpoint: never older than one the gang saw committed; the newest one started,
    # or the one before it when the kill came while the newest was still being written (asynchronous).
    assert resume >= drill.newest_durable_seen > 0, drill
    assert resume in (drill.newest_started, drill.newest_started - INTERVAL), drill
    # So at most one interval lost beyond the steps that in-flight write had been running; and since the next
    # checkpoint waits for the previous write, that write spans at most one interval: the hard bound is two
    # intervals (a kill of rank 0 while the previous checkpoint still commits loses up to 2 x INTERVAL).
    assert 0 <= drill.lost_steps - drill.inflight_steps <= INTERVAL, drill
    assert drill.lost_steps <= LOSS_BOUND_INTERVALS * INTERVAL, drill
    assert drill.final_steps == dict.fromkeys(range(WORKERS), 60)
    # The restored state is exact: the same weights as a run that never crashed.
    clean = run_gang_once(tmp_path / "clean", workers=WORKERS, steps=60, interval_steps=INTERVAL)
    assert clean.returncode == 0, clean.stderr
    errors = {e["error"] for d in ("killed", "clean")
              for e in read_events(tmp_path / d / "events", WORKERS) if e["event"] == "done"}
    assert len(errors) == 1, errors


def test_truncated_and_tampered_checkpoints_are_skipped_on_resume(tmp_path: Path) -> None:
    first = run_gang_once(tmp_path, workers=WORKERS, steps=40, interval_steps=INTERVAL)
    assert first.returncode == 0, first.stderr
    ckpt = tmp_path / "checkpoints"
    assert sorted(p.name for p in ckpt.glob("step-*")) == ["step-00000020", "step-00000030", "step-00000040"]
    # A shard cut off mid-write (the filesystem lost the tail) and a shard whose bytes changed under it.
    cut = ckpt / "step-00000040" / "rank-00002.ballast.bin"
    cut.write_bytes(cut.read_bytes()[:1000])
    flipped = ckpt / "step-00000030" / "rank-00001.weights.json"
    flipped.write_bytes(flipped.read_bytes().replace(b"0", b"1", 1))
    # A staging directory a crash left behind is never a candidate.
    (ckpt / ".staging" / "old-a0-s00000050").mkdir(parents=True)

    second = run_gang_once(tmp_path, workers=WORKERS, steps=50, interval_steps=INTERVAL)
    assert second.returncode == 0, second.stderr
    log = second.stderr
    assert "skipping checkpoint" in log and "step-00000040: rank-00002.ballast.bin: 1000 bytes" in log
    assert "(truncated?)" in log
    assert "step-00000030: rank-00001.weights.json: sha256" in log and "does not match the manifest's" in log
    resumes = [e for e in read_events(tmp_path / "events", WORKERS) if e["event"] == "resume"]
    assert sorted(e["step"] for e in resumes) == [0, 0, 0, 20, 20, 20]
    manifest = json.loads((ckpt / "step-00000050" / "manifest.json").read_text())
    assert manifest["step"] == 50 and manifest["worldSize"] == WORKERS
    assert not (ckpt / ".staging" / "old-a0-s00000050").exists()


def test_sigterm_checkpoints_every_rank_at_one_step_and_loses_nothing(tmp_path: Path) -> None:
    """The graceful path: one worker gets SIGTERM (its node's pods evicted); every rank stops at the same step,
    commits that step's checkpoint and exits 0; the next attempt resumes exactly there."""
    drill = terminate_and_resume(tmp_path, workers=WORKERS, steps=60, interval_steps=INTERVAL, stop_at_step=23,
                                 victim=1)
    assert drill.first_rc == 0, drill.output
    assert len(drill.stopped_steps) == WORKERS and len(set(drill.stopped_steps.values())) == 1, drill
    stopped = drill.stopped_steps[0]
    assert stopped >= 23, "the gang stopped after the signal, at the step it had reached"
    assert set(drill.resume_steps.values()) == {stopped}, drill
    assert drill.lost_steps == 0, drill
