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


def first_times(conditions: dict[str, Callable[[], Any]], timeout: float, started: float | None = None,
                ignore: tuple[type[Exception], ...] = ()) -> dict[str, float]:
    """Seconds from ``started`` (now by default) to the first time each condition held, all polled together every
    0.5 s, so each is timed on its own whatever order they come true in; fails naming those that never held."""
    started = time.monotonic() if started is None else started
    seen: dict[str, float] = {}
    while time.monotonic() - started < timeout:
        for what, check in conditions.items():
            if what in seen:
                continue
            try:
                held = check()
            except ignore:
                held = False
            if held:
                seen[what] = round(time.monotonic() - started, 1)
        if len(seen) == len(conditions):
            return seen
        time.sleep(0.5)
    missing = [what for what in conditions if what not in seen]
    raise AssertionError(f"timed out after {timeout:.0f}s: {', '.join(missing)} (held: {seen})")
