"""A watch that resumes where it stopped, for the scale runs' observers (pods of a gang, taints on nodes)."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any


def follow(list_call: Callable[..., Any], on_event: Callable[[str, Any], None], stop: threading.Event,
           **kwargs: Any) -> None:
    """Call ``on_event(type, object)`` for every event of ``list_call``'s watch until ``stop`` is set.

    Each request is short (5 s) so ``stop`` is noticed; the next one resumes from the last resourceVersion seen,
    so no event falls between two requests (a fresh list would show what is there now and miss what was deleted
    meanwhile). Only after 410 Gone does it start again from a list.
    """
    from kubernetes import client, watch

    version: str | None = None
    while not stop.is_set():
        w: Any = watch.Watch()  # type: ignore[no-untyped-call]
        try:
            for event in w.stream(list_call, timeout_seconds=5, _request_timeout=15, resource_version=version,
                                  **kwargs):
                obj = event["object"]
                version = obj.metadata.resource_version
                on_event(event["type"], obj)
                if stop.is_set():
                    return
        except client.ApiException as exc:
            if exc.status == 410:
                version = None
            time.sleep(0.2)
        except Exception:  # a dropped connection: reopened where it stopped
            time.sleep(0.2)


@contextlib.contextmanager
def following(list_call: Callable[..., Any], on_event: Callable[[str, Any], None], **kwargs: Any) -> Iterator[None]:
    """:func:`follow` in a thread of its own for the body of the ``with``; stopped (and joined) when it ends."""
    stop = threading.Event()
    thread = threading.Thread(target=follow, args=(list_call, on_event, stop), kwargs=kwargs, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=20)
