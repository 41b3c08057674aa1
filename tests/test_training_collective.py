"""The file collective: every rank gets every rank's value, and a rank that died ends the wait at once."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from training_runtime.collective import CollectiveTimeout, FileCollective, PeerLost
from training_runtime.settings import DEFAULT_PEER_DEAD_AFTER_SECONDS, PEER_DEAD_AFTER, Settings, SettingsError


def _gang(root: Path, n: int, **kw: Any) -> list[FileCollective]:
    return [FileCollective(root, r, n, "run-a0", 30.0, heartbeat_seconds=0.1, dead_after_seconds=1.0, **kw)
            for r in range(n)]


def test_every_rank_gets_every_ranks_value_in_rank_order(tmp_path: Path) -> None:
    ranks = _gang(tmp_path, 3)
    out: dict[int, list[Any]] = {}
    threads = [threading.Thread(target=lambda c=c: out.__setitem__(c.rank, c.allgather({"r": c.rank})))
               for c in ranks]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert out == {r: [{"r": 0}, {"r": 1}, {"r": 2}] for r in range(3)}


def test_a_rank_whose_heartbeat_stopped_ends_the_wait_long_before_the_timeout(tmp_path: Path) -> None:
    alive, dead = _gang(tmp_path, 2)
    dead.stop_beating()  # what SIGKILL does to its process: no more beats, never arrives
    started = time.monotonic()
    with pytest.raises(PeerLost, match=r"collective 0: rank 1 silent for \d+ s \(over 1 s\): its process died"):
        alive.allgather(1)
    assert time.monotonic() - started < 10  # the collective timeout is 30 s
    assert issubclass(PeerLost, CollectiveTimeout)  # callers that handle the timeout handle this too


def test_a_slow_rank_that_still_beats_is_waited_for(tmp_path: Path) -> None:
    first, slow = _gang(tmp_path, 2)
    got: list[Any] = []
    waiter = threading.Thread(target=lambda: got.append(first.allgather("a")))
    waiter.start()
    time.sleep(2.5)  # past dead_after: only silence counts, not lateness
    assert waiter.is_alive()
    assert slow.allgather("b") == ["a", "b"]
    waiter.join(5)
    assert got == [["a", "b"]]


def test_a_rank_that_has_not_started_yet_is_not_dead(tmp_path: Path) -> None:
    (only,) = [FileCollective(tmp_path, 0, 2, "run-a0", 1.5, heartbeat_seconds=0.1, dead_after_seconds=0.5)]
    with pytest.raises(CollectiveTimeout) as err:
        only.allgather(1)
    assert not isinstance(err.value, PeerLost)
    assert "ranks [1] did not arrive within 1.5 s" in str(err.value)


def test_the_heartbeat_must_be_shorter_than_the_silence_that_means_death(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="must be positive and shorter than"):
        FileCollective(tmp_path, 0, 2, "run-a0", 30.0, heartbeat_seconds=2.0, dead_after_seconds=2.0)


@pytest.mark.parametrize(("raw", "want"), [(None, DEFAULT_PEER_DEAD_AFTER_SECONDS), ("3", 3.0)])
def test_the_silence_that_means_death_is_a_setting(raw: str | None, want: float) -> None:
    env = {} if raw is None else {PEER_DEAD_AFTER: raw}
    assert Settings.from_env(env).peer_dead_after_seconds == want


@pytest.mark.parametrize("raw", ["0", "-1", "nan", "soon"])
def test_a_bad_silence_setting_is_named(raw: str) -> None:
    with pytest.raises(SettingsError, match=PEER_DEAD_AFTER):
        Settings.from_env({PEER_DEAD_AFTER: raw})


def test_a_peer_whose_clock_is_far_behind_is_alive_while_it_beats(tmp_path: Path) -> None:
    """Only the waiter's own clock counts: a beat stamped an hour ago (another node's clock) that keeps changing
    is a live peer."""
    waiter = FileCollective(tmp_path, 0, 2, "run-a0", 30.0, heartbeat_seconds=0.1, dead_after_seconds=1.0)
    alive = tmp_path / "run-a0" / "alive-r1"
    got: list[Any] = []
    thread = threading.Thread(target=lambda: got.append(waiter.allgather("a")))
    thread.start()
    for beat in range(30):  # 3 s of beats, each stamped an hour behind
        alive.write_text(f"{beat} {time.time() - 3600!r}")
        time.sleep(0.1)
    assert thread.is_alive(), "a peer that beats was taken for dead"
    peer = FileCollective(tmp_path, 1, 2, "run-a0", 30.0, heartbeat_seconds=0.1, dead_after_seconds=1.0)
    assert peer.allgather("b") == ["a", "b"]
    thread.join(5)
    assert got == [["a", "b"]]
