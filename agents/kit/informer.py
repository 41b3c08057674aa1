"""List, then watch, one resource into a sink: the client-go informer's contract in a few lines.

- a full, paged list replaces what the sink holds and gives the resourceVersion to watch from;
- every event and bookmark the server sends moves the resourceVersion on and vouches for freshness;
- a watch that ends at its timeout is an expected end (watch again from where it stopped); 410 Gone means
  the history was compacted (re-list at once); any other failure marks the sink unsynced (events may have
  been missed) and re-lists after a backoff that only failures grow.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any, Protocol

from agents.kit.errors import ApiError, classify, kind_of_status
from agents.kit.port import KubePort, Resource

log = logging.getLogger("kit.informer")

LIST_PAGE = 500  # keeps each list response small on clusters with tens of thousands of pods


class Sink(Protocol):
    """Where an informer puts what it learns (the agent's view, under the agent's own lock)."""

    def replace(self, items: list[dict[str, Any]]) -> None: ...

    def apply(self, event_type: str, obj: dict[str, Any]) -> None: ...

    def fresh(self) -> None: ...

    def unsynced(self) -> None: ...


def object_key(obj: dict[str, Any]) -> str:
    """``namespace/name``, or ``name`` for a cluster-scoped object."""
    meta = obj.get("metadata") or {}
    return f"{meta['namespace']}/{meta.get('name')}" if meta.get("namespace") else str(meta.get("name"))


class Store:
    """A sink that keeps every object by key, for an agent that reads the whole set each pass (thread-safe).

    ``on_change`` hears each key that changed, and ``None`` after a full list (everything may have changed).
    """

    def __init__(self, on_change: Callable[[str | None], None] = lambda key: None) -> None:
        self._lock = threading.Lock()
        self._items: dict[str, dict[str, Any]] = {}
        self._synced = False
        self.on_change = on_change

    def replace(self, items: list[dict[str, Any]]) -> None:
        with self._lock:
            self._items = {object_key(o): o for o in items}
            self._synced = True
        self.on_change(None)

    def apply(self, event_type: str, obj: dict[str, Any]) -> None:
        key = object_key(obj)
        with self._lock:
            if event_type == "DELETED":
                self._items.pop(key, None)
            else:
                self._items[key] = obj
        self.on_change(key)

    def fresh(self) -> None:
        pass

    def unsynced(self) -> None:
        with self._lock:
            self._synced = False

    @property
    def synced(self) -> bool:
        return self._synced

    def snapshot(self) -> dict[str, dict[str, Any]] | None:
        """Every object by key, or ``None`` while the watch is not current (events may have been missed)."""
        with self._lock:
            return dict(self._items) if self._synced else None

    def get(self, key: str) -> dict[str, Any] | None:
        with self._lock:
            return self._items.get(key)


class WatchEnd:
    """How one :meth:`Informer.watch_once` ended: only FAILED grows the watch loop's backoff."""

    OK = "ok"
    FAILED = "failed"


class Informer:
    """One resource's list-watch; :meth:`run` in a thread, or :meth:`relist`/:meth:`watch_once` step by step."""

    def __init__(self, port: KubePort, resource: Resource, sink: Sink, *, watch_timeout_seconds: int,
                 on_error: Callable[[str], None] = lambda kind: None, page: int = LIST_PAGE,
                 namespace: str | None = None, label_selector: str | None = None,
                 field_selector: str | None = None) -> None:
        self.port = port
        self.resource = resource
        self.namespace = namespace
        self.label_selector = label_selector
        self.field_selector = field_selector
        self.sink = sink
        self.watch_timeout_seconds = watch_timeout_seconds
        self.on_error = on_error
        self.page = page
        self.resource_version = ""
        self.needs_list = True

    def relist(self) -> bool:
        """Full, paged list into the sink; False (the sink marked unsynced) when it fails."""
        items: list[dict[str, Any]] = []
        token: str | None = None
        try:
            while True:
                answer = self.port.list(self.resource, self.namespace, label_selector=self.label_selector,
                                        field_selector=self.field_selector, limit=self.page, continue_token=token)
                items.extend(answer.get("items") or ())
                meta = answer.get("metadata") or {}
                token = meta.get("continue") or None
                if token is None:
                    break
        except Exception as exc:
            error = classify(exc)
            self.on_error(f"list_{error}")
            self.sink.unsynced()
            log.warning("list %s failed: %s", self.resource.plural, error)
            return False
        self.sink.replace(items)
        self.resource_version, self.needs_list = str(meta.get("resourceVersion", "")), False
        return True

    def watch_once(self) -> str:
        """One watch from the saved resourceVersion (a re-list first when one is due)."""
        if self.needs_list and not self.relist():
            return WatchEnd.FAILED
        try:
            for event in self.port.watch(self.resource, self.resource_version, self.watch_timeout_seconds,
                                         self.namespace, label_selector=self.label_selector,
                                         field_selector=self.field_selector):
                self._apply(event)
        except Exception as exc:
            error = classify(exc)
            self.on_error(f"watch_{error}")
            self.needs_list = True
            self.sink.unsynced()  # events may have been missed: blind for this kind until the re-list
            log.info("watch %s ended (%s): re-listing", self.resource.plural, error)
            return WatchEnd.OK if error == "gone" else WatchEnd.FAILED
        return WatchEnd.OK

    def _apply(self, event: dict[str, Any]) -> None:
        etype = event.get("type")
        obj = event.get("object") or {}
        if etype == "ERROR":
            code = obj.get("code")
            status = int(code) if isinstance(code, int) else 500
            raise ApiError(kind_of_status(status), str(obj.get("reason")), status)
        if etype in ("ADDED", "MODIFIED", "DELETED"):
            self.sink.apply(str(etype), obj)
        rv = str((obj.get("metadata") or {}).get("resourceVersion", ""))
        if rv:  # the server vouched for this kind as of now (an object or a bookmark's resourceVersion)
            self.sink.fresh()
            self.resource_version = rv

    def run(self, stop: threading.Event, backoff_base_seconds: float, backoff_max_seconds: float) -> None:
        failures = 0
        while not stop.is_set():
            if self.watch_once() == WatchEnd.FAILED:
                failures += 1
                stop.wait(min(backoff_max_seconds, backoff_base_seconds * 2**failures))
            else:
                failures = 0
