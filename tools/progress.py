"""A heartbeat for long Python steps (the captured engine preview of ``make preview``), like ``tools/progress.sh``.

``with heartbeat("preview: pulumi preview --stack prod"):`` prints ``<label>: still running after 1m30s`` every 30
seconds (``PROGRESS_EVERY_S``) while the block runs, and ``<label>: done in …`` at the end when it beat
at least once; a block faster than one interval prints nothing, so quick warm runs stay quiet.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TextIO


def every_s_from_env(default: float = 30.0) -> float:
    """``PROGRESS_EVERY_S`` as a positive number of seconds; the default when unset or not one."""
    raw = os.environ.get("PROGRESS_EVERY_S", "")
    try:
        value = float(raw)
    except ValueError:
        return default
    return value if value > 0 else default


def format_elapsed(seconds: float) -> str:
    """``45s`` or ``4m30s``: the form both heartbeat helpers print."""
    whole = int(seconds)
    return f"{whole // 60}m{whole % 60}s" if whole >= 60 else f"{whole}s"


@contextmanager
def heartbeat(
    label: str,
    every_s: float | None = None,
    stream: TextIO | None = None,
    detail: Callable[[], str | None] | None = None,
) -> Iterator[None]:
    """Print a line every ``every_s`` seconds while the block runs; ``detail()`` adds what it is doing now."""
    interval = every_s if every_s is not None else every_s_from_env()
    if interval <= 0:
        raise ValueError(f"heartbeat {label!r}: every_s must be > 0 seconds, not {interval}")
    out = stream or sys.stderr
    started = time.monotonic()
    stop = threading.Event()
    beats = 0

    def beat() -> None:
        nonlocal beats
        while not stop.wait(interval):
            extra = detail() if detail else None
            line = f"{label}: still running after {format_elapsed(time.monotonic() - started)}"
            print(f"{line}; {extra}" if extra else line, file=out, flush=True)
            beats += 1

    thread = threading.Thread(target=beat, name=f"heartbeat {label}", daemon=True)
    thread.start()
    failed = True
    try:
        yield
        failed = False
    finally:
        stop.set()
        thread.join()
        if beats:
            took = format_elapsed(time.monotonic() - started)
            print(f"{label}: failed after {took}" if failed else f"{label}: done in {took}", file=out, flush=True)
