"""A watch that resumes where it stopped, for the scale runs' observers (pods of a gang, taints on nodes)."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any


def follow(list_call: Callable[..., Any], on_event: Callable[[str, Any], None], stop: threading.Event,
           **kwargs: Any) -> None:
    """Call ``on_event(type, object)`` for every object of ``list_call`` and every later event, until ``stop``.

    A list first (each item as ADDED), then watches from the list's resourceVersion: each request is short (5 s)
    so ``stop`` is noticed, and the next one resumes from the last event's resourceVersion, so no event falls
    between two requests. (Resuming from the last item of a watch's initial ADDED burst would not do: those come
    in no order, and the watch cache would replay the older changes of every other object.) After 410 Gone it
    lists again.
    """
    from kubernetes import client, watch

    version: str | None = None
    while not stop.is_set():
        try:
            if version is None:
                listing = list_call(**kwargs)
                for obj in listing.items:
                    on_event("ADDED", obj)
                version = listing.metadata.resource_version
            w: Any = watch.Watch()  # type: ignore[no-untyped-call]
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
