"""Keep one control-plane process running, as the kubelet keeps a static pod and systemd a unit with
``Restart=always``: ``python -m tools.localcluster.supervise [--give-up-within S] -- <argv>``.

A real cluster never runs its controller manager, scheduler, API server or etcd bare: when one exits, whatever
started it starts it again. The local cluster ran them bare, and the chaos soak found what that costs: the
controller manager, restarted while the API server was restarting too, exited without a word during its start,
and the cluster stayed without one (docs/chaos.md). Under this supervisor a component that exits, for any reason,
starts again after a backoff that doubles from :data:`BACKOFF_S` to ``--backoff-max`` and starts over once a run
lasted :data:`STEADY_S` (the kubelet's crash-loop backoff, shortened for a cluster that lives minutes).

- A component that exits by itself within ``--give-up-within`` seconds of its *first* start is not restarted:
  the supervisor exits with its code, so ``make up`` fails at once with the component's log instead of waiting
  out a crash loop (a bad flag, a port in use). Later exits, and one by a signal (killed from outside), are
  always restarted.
- SIGTERM or SIGINT to the supervisor stops the component (SIGTERM, SIGKILL after ``--grace``) and ends the
  supervisor, without a restart. If the supervisor itself is killed, the kernel kills the component
  (``PR_SET_PDEATHSIG``), so nothing is left running unowned.
- A restart waits until every thread of the exited component is gone (the parent's wait returns only then), so
  its listening ports are free: the port race the soak found with etcd cannot recur here.
- Each exit and restart is one line in the component's log, prefixed ``supervise:``.

The pure part, :func:`next_backoff`, is what the tests hold by table and property.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Protocol

#: The first restart's wait (seconds); it doubles with each quick exit.
BACKOFF_S = 1.0
#: A run at least this long (seconds) counts as steady: the next exit restarts after :data:`BACKOFF_S` again.
STEADY_S = 60.0
#: Linux's prctl option that signals a child when its parent dies.
PR_SET_PDEATHSIG = 1


def next_backoff(previous: float | None, ran_s: float, most_s: float) -> float:
    """The wait before the next start after a run of ``ran_s`` seconds: :data:`BACKOFF_S` after a steady run or
    the first exit, else double the previous wait, never more than ``most_s`` (nor less than :data:`BACKOFF_S`)."""
    if previous is None or ran_s >= STEADY_S:
        return min(BACKOFF_S, most_s)
    return min(max(previous * 2, BACKOFF_S), max(most_s, BACKOFF_S))


def _die_with_parent() -> None:
    """In the child, before exec: SIGKILL when the supervisor dies (Linux; elsewhere a no-op)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def say(message: str) -> None:
    print(f"supervise: {message}", flush=True)


class Stop(Protocol):
    def is_set(self) -> bool: ...

    def wait(self, timeout: float) -> bool: ...


class SignalFlag:
    """A stop that a signal handler may set: only a plain assignment, where ``threading.Event.set`` takes a lock the
    interrupted main thread may hold inside its own ``wait`` (a deadlock the SIGTERM would then wait out into a
    SIGKILL). ``wait`` polls."""

    def __init__(self) -> None:
        self._set = False

    def set(self) -> None:
        self._set = True

    def is_set(self) -> bool:
        return self._set

    def wait(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while not self._set and (left := deadline - time.monotonic()) > 0:
            time.sleep(min(0.05, left))
        return self._set


def supervise(argv: Sequence[str], give_up_within_s: float, backoff_max_s: float, grace_s: float,
              stop: Stop) -> int:
    """Run ``argv`` until ``stop``; restart it whenever it exits. Returns the component's last exit code (0 when
    stopped), or its code when it failed its first start within ``give_up_within_s``."""
    name = os.path.basename(argv[0])
    backoff: float | None = None
    first = True
    restarts = 0
    while not stop.is_set():
        started = time.monotonic()
        child = subprocess.Popen(list(argv), preexec_fn=_die_with_parent)
        while child.poll() is None:
            if stop.wait(0.2):
                child.terminate()
                try:
                    child.wait(grace_s)
                except subprocess.TimeoutExpired:
                    child.kill()
                    child.wait()
                return 0
        ran = time.monotonic() - started
        code = child.returncode
        if first and ran < give_up_within_s and code >= 0:
            say(f"{name} exited (code {code}) {ran:.1f}s after its first start: not restarting")
            return code if code != 0 else 1
        first = False
        backoff = next_backoff(backoff, ran, backoff_max_s)
        restarts += 1
        say(f"{name} exited (code {code}) after {ran:.1f}s; restart {restarts} in {backoff:g}s")
        if stop.wait(backoff):
            return 0
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="supervise", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--give-up-within", type=float, default=10.0,
                        help="seconds: an exit this soon after the first start ends the supervisor too")
    parser.add_argument("--backoff-max", type=float, default=30.0, help="the longest wait before a restart")
    parser.add_argument("--grace", type=float, default=10.0, help="seconds between SIGTERM and SIGKILL on stop")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the component's command line")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command to supervise: give it after --")
    stop = SignalFlag()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    return supervise(command, args.give_up_within, args.backoff_max, args.grace, stop)


if __name__ == "__main__":
    sys.exit(main())
