"""Polling for the end-to-end tests: wait for a condition on a live cluster and time it."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def wait(what: str, check: Callable[[], Any], timeout: float,
         ignore: tuple[type[Exception], ...] = ()) -> float:
    """Seconds until ``check()`` is truthy (polled every 0.5 s); fails naming ``what`` and the last answer.

    An exception of a type in ``ignore`` counts as not yet (an object not created yet, say)."""
    started = time.monotonic()
    last: Any = None
    while time.monotonic() - started < timeout:
        try:
            last = check()
        except ignore as err:
            last = err
        if last and not isinstance(last, Exception):
            return time.monotonic() - started
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout:.0f}s: {what} (last: {last!r})")
