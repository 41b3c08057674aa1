"""Restart in place: the supervisor's decision by tables and properties, then real trainer processes whose
workers are killed, restarted inside the same supervisors, and resumed from the newest checkpoint."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from training_runtime.examples.resume_drill import read_events, trainer_env
from training_runtime.settings import DistEnv
from training_runtime.supervisor import (
    FALLBACK_EXIT,
    SUPERVISE_DIR,
    Act,
    Me,
    Peer,
    Phase,
    decide,
    first_round,
)

LIMIT, TIMEOUT = 3, 300.0


def me(phase: Phase, round_: int = 0, **kw: object) -> Me:
    return Me(rank=0, world_size=3, round=round_, phase=phase, **kw)  # type: ignore[arg-type]


def run(m: Me, peers: dict[int, Peer | None], now: float = 10.0) -> tuple[Act, Phase, int, int]:
    d = decide(m, peers, now, restarts_before_replace=LIMIT, replace_timeout=TIMEOUT)
    return d.act, d.phase, d.round, d.exit_code


R, RUN, F = Phase.READY, Phase.RUNNING, Phase.FAILED


@pytest.mark.parametrize(("case", "mine", "peers", "expected"), [
    ("all ready: start", me(R), {1: Peer(0, R), 2: Peer(0, R)}, (Act.START, RUN, 0, 0)),
    ("a peer already running this round: start", me(R), {1: Peer(0, RUN), 2: Peer(0, R)}, (Act.START, RUN, 0, 0)),
    ("a rank not there yet: wait", me(R), {1: Peer(0, R), 2: None}, (Act.WAIT, R, 0, 0)),
    ("a rank whose beat stopped is not there", me(R), {1: Peer(0, R), 2: Peer(0, R, alive=False)},
     (Act.WAIT, R, 0, 0)),
    ("others are in a later round: join it", me(R), {1: Peer(2, R), 2: Peer(1, F)}, (Act.JOIN, R, 2, 0)),
    ("running, nobody failed: wait", me(RUN, worker_running=True), {1: Peer(0, RUN), 2: Peer(0, RUN)},
     (Act.WAIT, RUN, 0, 0)),
    ("running, a peer failed this round: stop ours", me(RUN, worker_running=True),
     {1: Peer(0, F), 2: Peer(0, RUN)}, (Act.STOP_WORKER, RUN, 0, 0)),
    ("running, a peer is ready for the next round: stop ours", me(RUN, worker_running=True),
     {1: Peer(1, R), 2: Peer(0, RUN)}, (Act.STOP_WORKER, RUN, 0, 0)),
    ("our worker crashed: mark the round failed", me(RUN, worker_exit=-9), {1: Peer(0, RUN), 2: Peer(0, RUN)},
     (Act.NEXT_ROUND, F, 0, -9)),
    ("our worker was stopped for another's failure: next round, not our failure", me(RUN, worker_exit=-9),
     {1: Peer(0, F), 2: Peer(0, RUN)}, (Act.NEXT_ROUND, R, 1, 0)),
    ("our worker died of a dead peer: not our failure", me(RUN, worker_exit=1, failures=LIMIT),
     {1: Peer(0, RUN, alive=False), 2: Peer(0, RUN)}, (Act.NEXT_ROUND, R, 1, 0)),
    ("failed: ready for the next round", me(F), {1: Peer(0, RUN), 2: Peer(0, RUN)}, (Act.NEXT_ROUND, R, 1, 0)),
    ("the worker finished", me(RUN, worker_exit=0), {1: Peer(0, RUN), 2: Peer(0, F)}, (Act.EXIT, Phase.DONE, 0, 0)),
    ("one failure too many: the pod fails for real", me(RUN, worker_exit=1, failures=LIMIT),
     {1: Peer(0, RUN), 2: Peer(0, RUN)}, (Act.EXIT, Phase.GAVE_UP, 0, FALLBACK_EXIT)),
    ("a round that never fills: fall back to Volcano", me(R, 2, ready_since=0.0), {1: Peer(2, R), 2: None},
     (Act.WAIT, R, 2, 0)),
    ("a peer gave up, our worker runs: stop it", me(RUN, worker_running=True),
     {1: Peer(0, Phase.GAVE_UP), 2: Peer(0, RUN)}, (Act.STOP_WORKER, RUN, 0, 0)),
    ("a peer gave up, our worker is gone: fall back too", me(R, 1),
     {1: Peer(0, Phase.GAVE_UP), 2: Peer(1, R)}, (Act.EXIT, Phase.GAVE_UP, 1, FALLBACK_EXIT)),
    ("asked to stop, worker still stopping: wait", me(Phase.STOPPING, worker_running=True), {1: Peer(0, F)},
     (Act.WAIT, Phase.STOPPING, 0, 0)),
    ("asked to stop, worker stopped cleanly: exit 0, no restart", me(Phase.STOPPING, worker_exit=0),
     {1: Peer(0, F)}, (Act.EXIT, Phase.STOPPING, 0, 0)),
])
def test_the_supervisors_decision(case: str, mine: Me, peers: dict[int, Peer | None],
                                  expected: tuple[Act, Phase, int, int]) -> None:
    assert run(mine, peers) == expected, case


def test_a_round_that_never_fills_falls_back_after_the_replace_timeout() -> None:
    waiting = me(R, 2, ready_since=0.0)
    assert run(waiting, {1: Peer(2, R), 2: None}, now=TIMEOUT + 1)[::3] == (Act.EXIT, FALLBACK_EXIT)


def test_a_replacement_joins_the_round_under_way_and_a_new_gang_starts_past_the_last() -> None:
    assert first_round({}) == 0
    assert first_round({1: Peer(3, RUN), 2: Peer(3, R)}) == 3
    assert first_round({1: Peer(3, F), 2: Peer(3, RUN)}) == 4
    assert first_round({1: Peer(9, R, alive=False), 2: Peer(2, R)}) == 2
    # Nobody alive: the files of a gang that is gone; the new one never reuses their rounds' rendezvous.
    assert first_round({1: Peer(4, RUN, alive=False), 2: Peer(5, F, alive=False)}) == 6
    # The gang before a whole restart, still terminating: its pods are no round to join.
    assert first_round({1: Peer(1, Phase.STOPPING), 2: Peer(1, Phase.GAVE_UP)}) == 2


def test_a_clean_stop_for_another_ranks_eviction_waits_for_the_replacement() -> None:
    from training_runtime.settings import PEER_STOP_EXIT

    stopped = me(RUN, 2, worker_exit=PEER_STOP_EXIT, failures=LIMIT)  # not a failure, however many before
    assert run(stopped, {1: Peer(2, Phase.STOPPING), 2: Peer(2, RUN)}) == (Act.NEXT_ROUND, R, 3, 0)
    # Asked to stop itself meanwhile: the pod goes, cleanly.
    assert run(me(Phase.STOPPING, 2, worker_exit=PEER_STOP_EXIT), {1: Peer(2, Phase.STOPPING)}) == (
        Act.EXIT, Phase.STOPPING, 2, 0)


PEER = st.one_of(st.none(), st.builds(Peer, st.integers(0, 4), st.sampled_from(list(Phase)), st.booleans()))


@given(phase=st.sampled_from(list(Phase)), round_=st.integers(0, 4), running=st.booleans(),
       exit_code=st.one_of(st.none(), st.integers(-15, 3)), failures=st.integers(0, 5),
       peers=st.dictionaries(st.integers(1, 3), PEER, min_size=3, max_size=3), now=st.floats(0, 1000))
def test_the_decision_never_starts_a_round_alone_and_never_hides_a_failure(
        phase: Phase, round_: int, running: bool, exit_code: int | None, failures: int,
        peers: dict[int, Peer | None], now: float) -> None:
    mine = Me(rank=0, world_size=4, round=round_, phase=phase, worker_running=running,
              worker_exit=None if running else exit_code, failures=failures, ready_since=0.0)
    d = decide(mine, peers, now, restarts_before_replace=LIMIT, replace_timeout=TIMEOUT)
    if d.act is Act.START:  # only when every other rank is alive and in this round
        assert all(p is not None and p.alive and p.round == round_ and p.phase in (R, RUN) for p in peers.values())
        assert phase is R
    if d.act is Act.EXIT and d.exit_code == 0:  # success only from a worker that finished (or stopped cleanly)
        assert not running and mine.worker_exit in (0, None) and phase in (RUN, Phase.STOPPING, Phase.DONE)
    if d.act in (Act.START, Act.NEXT_ROUND, Act.JOIN):  # rounds only go forward
        assert d.round >= round_
    if d.phase is Phase.GAVE_UP and d.act is Act.EXIT:
        assert d.exit_code == FALLBACK_EXIT
    assert not (running and d.act is Act.EXIT)  # never leaves a worker behind


@given(peers=st.dictionaries(st.integers(1, 3), PEER, max_size=3))
def test_a_starting_supervisor_joins_only_a_live_round_and_otherwise_starts_past_every_known_one(
        peers: dict[int, Peer | None]) -> None:
    start = first_round(peers)
    known = [p for p in peers.values() if p is not None]
    joinable = [p for p in known if p.alive and p.phase in (R, RUN, F)]
    if joinable:  # the newest round a live rank is in, or is about to start (after its failure)
        assert start == max(p.round + (p.phase is F) for p in joinable)
    else:  # never a round a gone gang used: its rendezvous may still be on disk
        assert all(start > p.round for p in known)


# ------------------------------------------------------------------ real processes

WORLD, STEPS, INTERVAL = 2, 60, 10


def start_gang(workdir: Path, *, steps: int = STEPS, crash_every: bool = False,
               extra: dict[str, str] | None = None, ranks: tuple[int, ...] = tuple(range(WORLD))
               ) -> list[subprocess.Popen[str]]:
    env = {**trainer_env(workdir, INTERVAL), "WORLD_SIZE": str(WORLD), "TRAINING_RUN_ID": "drill",
           "TRAINING_PEER_DEAD_AFTER_SECONDS": "3", "TRAINING_REPLACE_TIMEOUT_SECONDS": "20", **(extra or {})}
    trainer = [sys.executable, "-m", "training_runtime.examples.tiny_trainer", "--steps", str(steps),
               "--step-seconds", "0.05", "--payload-bytes", "4096", "--events", str(workdir / "events")]
    procs = []
    for rank in ranks:
        cmd = [sys.executable, "-m", "training_runtime.supervisor", "--", *trainer]
        if crash_every and rank == 1:
            cmd = [sys.executable, "-m", "training_runtime.supervisor", "--", sys.executable, "-c",
                   "import sys, time; time.sleep(0.3); sys.exit(3)"]
        procs.append(subprocess.Popen(cmd, env={**env, "RANK": str(rank)}, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    return procs


def mark(workdir: Path, rank: int) -> dict[str, object]:
    path = workdir / "checkpoints" / SUPERVISE_DIR / "drill" / f"r{rank}.json"
    try:
        return dict(json.loads(path.read_text()))
    except (FileNotFoundError, json.JSONDecodeError):
        return {}


def wait_for(predicate: object, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if callable(predicate) and predicate():
            return
        time.sleep(0.05)
    raise AssertionError("timed out")


def finish(procs: list[subprocess.Popen[str]], timeout: float = 120) -> list[tuple[int, str]]:
    return [(p.wait(timeout=timeout), p.stdout.read() if p.stdout else "") for p in procs]


def test_a_killed_worker_restarts_in_place_and_the_gang_resumes_from_its_newest_checkpoint(tmp_path: Path) -> None:
    procs = start_gang(tmp_path)
    supervisors = [p.pid for p in procs]

    def reached(step: int) -> bool:
        return any(e["event"] == "step" and e["step"] >= step for e in read_events(tmp_path / "events", WORLD))

    wait_for(lambda: reached(25))
    victim = mark(tmp_path, 1)["worker_pid"]
    assert isinstance(victim, int)
    killed_at = time.time()
    os.kill(victim, signal.SIGKILL)
    results = finish(procs)
    assert [rc for rc, _ in results] == [0, 0], results
    assert [p.pid for p in procs] == supervisors  # the same supervisors (pods) throughout
    events = read_events(tmp_path / "events", WORLD)
    resumes = [e for e in events if e["event"] == "resume" and e["inplace"] == 1]
    assert sorted(e["rank"] for e in resumes) == [0, 1], events  # every rank restarted once, in place
    assert len({e["step"] for e in resumes}) == 1 and resumes[0]["step"] >= INTERVAL  # from a checkpoint
    assert all(e["attempt"] == 0 for e in events)  # Volcano's attempt never moved
    done = [e for e in events if e["event"] == "done"]
    assert sorted(e["step"] for e in done) == [STEPS, STEPS]
    first_step_after = min(e["t"] for e in events if e["event"] == "step" and e["inplace"] == 1)
    assert first_step_after > killed_at
    assert "restart in place" in results[1][1] and "restart round 1" in results[0][1]


def test_an_evicted_pod_is_replaced_alone_and_the_gang_resumes_where_it_stopped(tmp_path: Path) -> None:
    """What PodEvicted → RestartPod gives: rank 1's pod is evicted (SIGTERM to its supervisor), every worker stops
    at one step with its checkpoint, rank 0 stays in its pod, a replacement pod of rank 1 (Volcano's attempt one
    higher) starts and joins; nothing is lost."""
    procs = start_gang(tmp_path, steps=200)
    wait_for(lambda: any(e["event"] == "step" and e["step"] >= 15 for e in read_events(tmp_path / "events", WORLD)))
    procs[1].send_signal(signal.SIGTERM)
    assert procs[1].wait(timeout=60) == 0  # the evicted pod ends cleanly
    wait_for(lambda: mark(tmp_path, 0).get("round") == 1 and mark(tmp_path, 0).get("phase") == "ready")
    replacement = start_gang(tmp_path, steps=200, ranks=(1,), extra={"TRAINING_ATTEMPT": "1"})[0]
    results = finish([procs[0], replacement], timeout=180)
    assert [rc for rc, _ in results] == [0, 0], results
    events = read_events(tmp_path / "events", WORLD)
    stopped = {e["step"] for e in events if e["event"] == "graceful"}
    assert len(stopped) == 1, events  # both ranks stopped at the same step
    resumes = [e for e in events if e["event"] == "resume" and e["inplace"] == 1]
    assert sorted(e["rank"] for e in resumes) == [0, 1] and {e["step"] for e in resumes} == stopped  # nothing lost
    assert {e["attempt"] for e in resumes} == {0, 1}  # the replacement came from Volcano's next attempt
    assert sorted(e["step"] for e in events if e["event"] == "done") == [200, 200]
    assert "waiting for its replacement" in results[0][1]


def test_a_gang_restarted_whole_at_once_starts_past_every_round_its_killed_pods_were_in(tmp_path: Path) -> None:
    """Volcano's RestartJob after a container was killed: the new pods can start within a second of the old ones'
    last beat. Their fresh-looking files must not pass for live supervisors, or the new gang would reuse the
    round, and the rendezvous, of the gang that is gone."""
    procs = start_gang(tmp_path, steps=400)
    wait_for(lambda: any(e["event"] == "step" and e["step"] >= 5 for e in read_events(tmp_path / "events", WORLD)))
    workers = [mark(tmp_path, rank)["worker_pid"] for rank in range(WORLD)]
    for proc, worker in zip(procs, workers, strict=True):  # the containers die with everything in them
        proc.kill()
        assert isinstance(worker, int)
        os.killpg(worker, signal.SIGKILL)
        proc.wait(timeout=10)
    assert all(mark(tmp_path, rank)["round"] == 0 for rank in range(WORLD))
    again = start_gang(tmp_path, steps=30, extra={"TRAINING_ATTEMPT": "1"})
    results = finish(again)
    assert [rc for rc, _ in results] == [0, 0], results
    events = read_events(tmp_path / "events", WORLD)
    assert {e["inplace"] for e in events if e["attempt"] == 1} == {1}, events  # one round, past the last
    assert not [e for e in events if e["attempt"] == 1 and e["inplace"] == 0]


def test_a_worker_that_keeps_dying_makes_its_pod_fail_and_the_gang_falls_back(tmp_path: Path) -> None:
    procs = start_gang(tmp_path, crash_every=True, extra={"TRAINING_RESTARTS_BEFORE_REPLACE": "2"})
    results = finish(procs)
    assert [rc for rc, _ in results] == [FALLBACK_EXIT, FALLBACK_EXIT], results
    assert "the worker died 3 times in this pod (restartsBeforeReplace 2)" in results[1][1]
    assert "gave up restarting in place; Volcano restarts the gang" in results[0][1]


def test_sigterm_stops_the_worker_gracefully_and_nothing_restarts(tmp_path: Path) -> None:
    procs = start_gang(tmp_path, steps=400)
    wait_for(lambda: any(e["event"] == "step" and e["step"] >= 5 for e in read_events(tmp_path / "events", WORLD)))
    for p in procs:
        p.send_signal(signal.SIGTERM)
    results = finish(procs)
    assert [rc for rc, _ in results] == [0, 0], results
    events = read_events(tmp_path / "events", WORLD)
    assert sorted(e["rank"] for e in events if e["event"] == "graceful") == [0, 1]
    assert not [e for e in events if e.get("inplace")]


def test_the_inplace_round_names_its_own_rendezvous() -> None:
    base = DistEnv.from_env({"WORLD_SIZE": "2", "RANK": "1", "TRAINING_RUN_ID": "job-uid"})
    again = DistEnv.from_env({"WORLD_SIZE": "2", "RANK": "1", "TRAINING_RUN_ID": "job-uid",
                              "TRAINING_INPLACE_RESTARTS": "2"})
    assert base.attempt_key == "job-uid-a0-r0"  # without the supervisor: Volcano's attempt names it
    assert again.attempt_key == "job-uid-s2-r0"  # under it: the run's round, whatever the pod's attempt
    replaced = DistEnv.from_env({"WORLD_SIZE": "2", "RANK": "1", "TRAINING_RUN_ID": "job-uid", "TRAINING_ATTEMPT": "3",
                                 "TRAINING_INPLACE_RESTARTS": "2"})
    assert replaced.attempt_key == again.attempt_key
