"""A clean stop stays clean: once a rank's stop checkpoint is committed, no SIGTERM or SIGINT can fail its exit.

The real-process tests send the signals to a trainer that has stopped (while it is still running, and while the
interpreter finalizes, when CPython has already put Python-level handlers back to the default action). The
property drives the runtime in-process and lands signals at every moment of the stop, through a model of
delivery that reads the dispositions the runtime really installed.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import IO, Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from training_runtime import CheckpointStore, LocalCollective, TrainingRuntime
from training_runtime import checkpointer as checkpointer_module
from training_runtime.manifest import FileEntry
from training_runtime.settings import CheckpointSettings, DistEnv, Settings

REPO = Path(__file__).resolve().parents[1]
GUARDED = (signal.SIGTERM, signal.SIGINT)

# A trainer that stops gracefully at step 3 (its own SIGTERM, or a peer's request), then waits for the test
# (stdin) before it exits, and takes a second and a half to finalize (a framework's teardown).
TRAINER = textwrap.dedent("""
    import os, sys, time
    from training_runtime import TrainingRuntime

    mode = sys.argv[1]
    rt = TrainingRuntime.from_env()
    rt.handle_sigterm()
    rt.resume()

    def capture():
        if mode == "slow-capture":
            print("capturing", flush=True)
            time.sleep(3)
        return {"w": b"state"}

    step = 0
    while True:
        step += 1
        rt.step_done(step)
        if step == 3:
            print("step 3", flush=True)
            if mode == "peer":
                rt.request_stop()
        if rt.should_stop():
            break
        time.sleep(0.01)
    code = rt.checkpoint_and_stop(step, capture)
    print(f"stopped {step}", flush=True)
    sys.stdin.read()

    class Teardown:
        def __del__(self, write=os.write, sleep=time.sleep):
            write(1, b"finalizing\\n")
            sleep(1.5)

    sys.modules["zz_teardown"] = Teardown()
    sys.exit(code)
""")


def _start(tmp_path: Path, mode: str) -> subprocess.Popen[str]:
    script = tmp_path / "trainer.py"
    script.write_text(TRAINER)
    env = {**os.environ, "PYTHONPATH": str(REPO), "CHECKPOINT_DIR": str(tmp_path / "ckpt"),
           "CHECKPOINT_INTERVAL_STEPS": "1000"}
    return subprocess.Popen([sys.executable, str(script), mode], env=env, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _until(out: IO[str], prefix: str) -> str:
    for line in out:
        if line.startswith(prefix):
            return line
    raise AssertionError(f"the trainer never printed {prefix!r}")


@pytest.mark.parametrize("mode", ["signalled", "peer"])
@pytest.mark.parametrize("when", ["after-commit", "while-finalizing"])
def test_a_signal_after_the_stop_checkpoint_never_fails_the_exit(tmp_path: Path, mode: str, when: str) -> None:
    """``signalled``: the rank's own SIGTERM stopped it (the next one used to kill it: 143). ``peer``: a peer's
    stop reached it and its own SIGTERM comes on the way out (fatal once the interpreter finalizes)."""
    proc = _start(tmp_path, mode)
    try:
        assert proc.stdout is not None and proc.stdin is not None
        _until(proc.stdout, "step 3")
        if mode == "signalled":
            proc.send_signal(signal.SIGTERM)
        stopped = int(_until(proc.stdout, "stopped").split()[1])
        if when == "after-commit":
            for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGTERM):
                proc.send_signal(sig)
        proc.stdin.close()
        if when == "while-finalizing":
            _until(proc.stdout, "finalizing")
            proc.send_signal(signal.SIGTERM)
            proc.send_signal(signal.SIGINT)
        rc = proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert rc == 0, proc.stderr.read() if proc.stderr else rc
    found = CheckpointStore(tmp_path / "ckpt").latest_complete()
    assert found is not None and found.step == stopped


def test_a_second_sigterm_before_the_commit_still_takes_the_crash_path(tmp_path: Path) -> None:
    proc = _start(tmp_path, "slow-capture")
    try:
        assert proc.stdout is not None
        _until(proc.stdout, "step 3")
        proc.send_signal(signal.SIGTERM)
        _until(proc.stdout, "capturing")
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert rc == -signal.SIGTERM, "the default action, at once: the next attempt resumes the newest checkpoint"
    assert CheckpointStore(tmp_path / "ckpt").latest_complete() is None


# ---------------------------------------------------------------- the property, in-process

#: The moments a signal can land, in order. From COMMITTED on, the rank's stop checkpoint is durable.
RUNNING, ASKED, CAPTURE, WRITING, COMMITTED, RETURNED, FINALIZING = range(7)


class Died(BaseException):
    """The process ended by a signal's default action (or KeyboardInterrupt): a failed pod."""


def deliver(sig: int) -> None:
    """What the kernel and CPython do with ``sig`` given the disposition the runtime installed."""
    handler = signal.getsignal(sig)
    if handler == signal.SIG_IGN:
        return
    if not callable(handler):
        raise Died(sig)
    handler(sig, None)


def finalize() -> None:
    """CPython at interpreter finalization: every Python-level handler goes back to the default action."""
    for sig in GUARDED:
        if callable(signal.getsignal(sig)):
            signal.signal(sig, signal.SIG_DFL)


class SyncExecutor:
    """The writer thread run inline: a signal's Python handler runs on the main thread anyway, so a moment inside
    the write is a point in one sequence."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def submit(self, fn: Callable[..., None], *args: Any) -> Future[None]:
        future: Future[None] = Future()
        try:
            fn(*args)
        except BaseException as exc:  # what the real executor does: the failure waits in the future
            future.set_exception(exc)
        else:
            future.set_result(None)
        return future

    def shutdown(self, wait: bool = True) -> None:
        pass


class HookedStore(CheckpointStore):
    def __init__(self, root: Path, at: Callable[[int], None]) -> None:
        super().__init__(root)
        self.at = at

    def write_shard(self, *args: Any, **kwargs: Any) -> list[FileEntry]:
        self.at(WRITING)
        return super().write_shard(*args, **kwargs)

    def prune(self, *args: Any, **kwargs: Any) -> list[Path]:
        self.at(COMMITTED)  # after the commit, before the writer returns and the caller learns of it
        return super().prune(*args, **kwargs)


def expected_clean(landed: list[tuple[int, int]]) -> bool:
    """Before the commit, as without the fix: SIGINT is KeyboardInterrupt, a second SIGTERM the default action.
    From the commit on: nothing."""
    armed = False
    for moment, sig in landed:
        if moment >= COMMITTED:
            continue
        if sig == signal.SIGINT or armed:
            return False
        armed = True
    return True


def run_stop(root: Path, landed: list[tuple[int, int]]) -> bool:
    """One rank stopping at step 3 with ``landed`` signals; True if it exits 0."""
    pending = sorted(landed, key=lambda m: m[0])

    def at(moment: int) -> None:
        for when, sig in pending:
            if when == moment:
                deliver(sig)

    ck = CheckpointSettings(directory=root, interval_steps=1000, interval_seconds=None, keep_last=3, resume=True)
    rt = TrainingRuntime(Settings(dist=DistEnv(0, 1, "127.0.0.1", 1, 0), checkpoint=ck, collective_timeout_seconds=5,
                                  metrics_port=0, heartbeat_metric="hb"), LocalCollective())
    rt.store = HookedStore(root, at)
    rt.handle_sigterm()
    rt.resume()
    try:
        at(RUNNING)
        rt.request_stop()  # a peer's signal, if this rank's own has not come
        assert rt.should_stop()
        at(ASKED)

        def capture() -> dict[str, bytes]:
            at(CAPTURE)
            return {"w": b"3"}

        code = rt.checkpoint_and_stop(3, capture)
        at(RETURNED)
        finalize()
        at(FINALIZING)
    except (Died, KeyboardInterrupt):
        return False
    finally:
        if rt.checkpointer is not None:
            rt.checkpointer._executor.shutdown()
    return code == 0


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.integers(RUNNING, FINALIZING), st.sampled_from(GUARDED)), max_size=4))
def test_whenever_a_signal_lands_a_committed_stop_exits_zero(landed: list[tuple[int, int]]) -> None:
    before = {s: signal.getsignal(s) for s in GUARDED}
    real_kill = os.kill

    def kill(pid: int, sig: int) -> None:
        if pid != os.getpid():
            real_kill(pid, sig)
            return
        deliver(sig)  # the runtime re-raising a signal for its default action

    try:
        # SIGINT as a trainer gets it (KeyboardInterrupt), whatever this run inherited: a test run started in the
        # background by a shell starts with SIGINT ignored, and an ignored SIGINT would never interrupt anything.
        signal.signal(signal.SIGINT, signal.default_int_handler)
        with pytest.MonkeyPatch.context() as mp, tempfile.TemporaryDirectory() as tmp:
            mp.setattr(checkpointer_module, "ThreadPoolExecutor", SyncExecutor)
            mp.setattr(os, "kill", kill)
            clean = run_stop(Path(tmp), landed)
            stored = CheckpointStore(tmp).latest_complete()
    finally:
        for s, h in before.items():
            signal.signal(s, h)
    assert clean == expected_clean(sorted(landed, key=lambda m: m[0])), landed
    if clean:
        assert stored is not None and stored.step == 3, "exit 0 only with the stop checkpoint committed"
