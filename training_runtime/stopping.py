"""SIGTERM and SIGINT around the graceful stop.

Before the stop checkpoint is made, signals mean what they always did: the first SIGTERM asks the gang to stop
at the next step boundary and arms the default action for the next one (the crash path, which acts at once even
inside a blocked collective). Once this rank's part of the stop checkpoint is durable (rank 0: committed), the
stop is clean and nothing may turn it into a failure: a rank on its way out still gets SIGTERMs (its own
eviction when a peer's signal stopped it, Volcano deleting the gang's pods, the launcher stopping survivors),
and a pod that dies of one reads as failed after a clean stop. So from the commit to the exit both signals are
ignored.

They are ignored with ``SIG_IGN``, not a Python handler: CPython resets every Python-level handler to
``SIG_DFL`` while the interpreter finalizes (thread joins, framework teardown), which is exactly when the
signal tends to land; an ignored signal stays ignored until the process is gone.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

#: The signals the graceful stop guards: Kubernetes' SIGTERM, and SIGINT (a terminal, a launcher's Ctrl-C).
GUARDED = (signal.SIGTERM, signal.SIGINT)

Handler = Callable[[int, FrameType | None], Any] | int | None


def _on_main_thread() -> bool:
    # signal.signal() works on the main thread only; elsewhere the caller's own handling stands.
    return threading.current_thread() is threading.main_thread()


class StopSignals:
    """The signal side of :meth:`TrainingRuntime.handle_sigterm` and :meth:`TrainingRuntime.checkpoint_and_stop`."""

    def __init__(self, request_stop: Callable[[], None]) -> None:
        self._request_stop = request_stop
        self._committed: Callable[[], bool] | None = None
        #: While stopping: what each guarded signal would have done had the stop not begun.
        self._before: dict[int, Handler] = {}

    # ------------------------------------------------------------------ before the stop

    def install(self) -> None:
        """First SIGTERM: ask for a graceful stop; the second takes the default action (the crash path)."""
        if _on_main_thread():
            signal.signal(signal.SIGTERM, self._first_sigterm)

    def _first_sigterm(self, signum: int, frame: FrameType | None) -> None:
        self._request_stop()
        self._set(signal.SIGTERM, signal.SIG_DFL)

    def _set(self, signum: int, handler: Handler) -> None:
        if self._committed is not None:
            self._before[signum] = handler  # the stop's handler stays in place and will act as this one
        elif _on_main_thread():
            signal.signal(signum, handler)

    # ------------------------------------------------------------------ the stop checkpoint

    def stopping(self, committed: Callable[[], bool]) -> None:
        """The stop checkpoint begins: a signal that lands before ``committed()`` is handled as it was before the
        stop; one that lands after is ignored (``committed`` is read when the signal lands, so the moment the
        writer commits counts, not the moment the caller learns of it)."""
        if not _on_main_thread():
            return
        self._before = {s: signal.getsignal(s) for s in GUARDED}
        self._committed = committed
        for s in GUARDED:
            signal.signal(s, self._while_stopping)

    def _while_stopping(self, signum: int, frame: FrameType | None) -> None:
        if self._committed is not None and self._committed():
            return
        before = self._before.get(signum)
        if before == signal.SIG_IGN:
            return
        if callable(before):
            before(signum, frame)
            return
        # SIG_DFL, or a disposition set outside Python: the default action, as without the stop.
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)

    def stopped(self) -> None:
        """The stop checkpoint is committed: ignore both signals until the process exits."""
        if _on_main_thread():
            for s in GUARDED:
                signal.signal(s, signal.SIG_IGN)
