"""The local control plane's supervisor (tools/localcluster/supervise.py): a component that exits starts again
after a bounded, doubling backoff; one that fails its first start ends the supervisor with its code; a stop ends
both; a killed supervisor takes its component with it; and the process records find the component under it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from tools.localcluster.plan import Layout
from tools.localcluster.processes import ROOT, exited, start_process, start_ticks, stop_process
from tools.localcluster.supervise import BACKOFF_S, STEADY_S, SignalFlag, next_backoff

#: A component that notes each start in a file, then lives ``argv[2]`` seconds and exits with ``argv[3]``.
COMPONENT = """
import sys, time
with open(sys.argv[1], "a") as f:
    f.write("start\\n")
time.sleep(float(sys.argv[2]))
sys.exit(int(sys.argv[3]))
"""


def until(check: Callable[[], bool], timeout: float = 15.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.05)
    return check()


def supervisor(starts: Path, lives: float, code: int, *flags: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tools.localcluster.supervise", *flags, "--",
         sys.executable, "-c", COMPONENT, str(starts), str(lives), str(code)],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def starts_in(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


# --------------------------------------------------------------------------- the backoff, pure


def test_the_backoff_doubles_on_quick_exits_is_capped_and_starts_over_after_a_steady_run() -> None:
    waits, previous = [], None
    for _ in range(7):
        previous = next_backoff(previous, ran_s=1.0, most_s=30.0)
        waits.append(previous)
    assert waits == [1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0]
    assert next_backoff(30.0, ran_s=STEADY_S, most_s=30.0) == BACKOFF_S


@given(st.one_of(st.none(), st.floats(0, 1e4)), st.floats(0, 1e5), st.floats(0, 1e4))
def test_the_backoff_is_never_below_the_first_nor_above_the_cap(previous: float | None, ran: float,
                                                                most: float) -> None:
    wait = next_backoff(previous, ran, most)
    assert wait <= max(most, BACKOFF_S)
    assert wait >= min(BACKOFF_S, most)
    if previous is not None and ran < STEADY_S:
        assert wait >= min(previous, max(most, BACKOFF_S))  # never shorter than the last, short of the cap


# --------------------------------------------------------------------------- the supervisor, for real


def test_the_stop_a_signal_sets_is_a_plain_flag_that_a_wait_sees_at_once() -> None:
    """The handler only assigns (a ``threading.Event`` takes a lock the interrupted main thread may hold inside its
    own wait, and the supervisor would hang on its SIGTERM until SIGKILLed)."""
    import threading

    flag = SignalFlag()
    assert not flag.is_set() and flag.wait(0.05) is False
    threading.Timer(0.1, flag.set).start()
    started = time.monotonic()
    assert flag.wait(10) is True and time.monotonic() - started < 2
    assert flag.is_set() and flag.wait(0) is True


def test_a_component_that_exits_is_started_again_and_a_stop_ends_both(tmp_path: Path) -> None:
    starts = tmp_path / "starts"
    sup = supervisor(starts, 0.6, 3, "--give-up-within", "0.3", "--backoff-max", "0.5")
    try:
        assert until(lambda: starts_in(starts) >= 3), "the component was not started again after it exited"
        assert sup.poll() is None
        sup.send_signal(signal.SIGTERM)
        assert sup.wait(10) == 0
        after = starts_in(starts)
        time.sleep(1.5)
        assert starts_in(starts) == after  # stopped: no restart after the stop
        assert sup.stdout is not None
        log = sup.stdout.read()
        assert "exited (code 3)" in log and "restart 1 in" in log and "restart 2 in" in log
    finally:
        sup.kill()


def test_a_component_that_fails_its_first_start_ends_the_supervisor_with_its_code(tmp_path: Path) -> None:
    starts = tmp_path / "starts"
    sup = supervisor(starts, 0.0, 7, "--give-up-within", "5")
    assert sup.wait(10) == 7
    assert starts_in(starts) == 1
    assert sup.stdout is not None and "after its first start: not restarting" in sup.stdout.read()


def test_a_killed_supervisor_takes_its_component_with_it(tmp_path: Path) -> None:
    starts = tmp_path / "starts"
    sup = supervisor(starts, 60.0, 0)
    try:
        assert until(lambda: starts_in(starts) == 1)
        children = [int(p) for p in Path(f"/proc/{sup.pid}/task/{sup.pid}/children").read_text().split()]
        assert len(children) == 1
        ticks = start_ticks(children[0])
        assert ticks is not None
        os.kill(sup.pid, signal.SIGKILL)
        sup.wait(5)
        assert until(lambda: exited(children[0], ticks), 5), "the component outlived its supervisor"
    finally:
        sup.kill()


def test_a_supervised_record_finds_its_component_which_comes_back_when_killed_and_stops_with_it(
        tmp_path: Path) -> None:
    lay = Layout(tmp_path / "state")
    lay.state.mkdir()
    starts = tmp_path / "starts"
    proc = start_process(lay, "component", [sys.executable, "-c", COMPONENT, str(starts), "60", "0"],
                         supervised=True)
    try:
        assert until(lambda: proc.component() is not None and starts_in(starts) == 1)
        first = proc.component()
        assert first is not None and first[0] != proc.pid
        os.kill(first[0], signal.SIGKILL)
        assert until(lambda: proc.component() not in (None, first)), "the supervisor did not start it again"
        second = proc.component()
        assert second is not None and until(lambda: starts_in(starts) == 2)
        assert "restart 1 in" in Path(proc.log).read_text()
        stop_process(lay, proc)
        assert proc.exited() and exited(*second)
        assert not (lay.run / "component.json").exists()
    finally:
        if proc.alive():
            os.kill(proc.pid, signal.SIGKILL)
