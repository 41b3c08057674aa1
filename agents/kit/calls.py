"""How agents call the API: bounded retries with backoff, and the Events they leave for people."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from agents.kit.errors import ApiError, as_api_error
from agents.kit.lease import rfc3339

T = TypeVar("T")


@dataclass
class Retry:
    """Run a call with exponential backoff on retryable errors; on a conflict run ``on_conflict`` (re-read)
    and try again. Anything else, or the last failed attempt, raises :class:`ApiError`.

    Each attempt is a new call on the agent's fenced port, so an attempt after the lease lapsed is refused
    (``not_leader``, not retryable) before anything is sent.
    """

    attempts: int
    base_seconds: float
    max_seconds: float
    sleep: Callable[[float], None] = time.sleep
    #: Told the kind of every failure that is retried (for the agent's error counter).
    on_error: Callable[[str], None] = lambda kind: None

    def __call__(self, call: Callable[[], T], on_conflict: Callable[[], None] | None = None) -> T:
        last = "other"
        for attempt in range(self.attempts):
            try:
                return call()
            except Exception as exc:
                error = as_api_error(exc)
                last = error.kind
                if last == "conflict" and on_conflict is not None:
                    self.on_error(last)
                    on_conflict()
                    continue
                if not error.retryable:
                    raise error from None
                self.on_error(last)
                if attempt + 1 < self.attempts:
                    self.sleep(min(self.max_seconds, self.base_seconds * 2**attempt))
        raise ApiError(last, f"gave up after {self.attempts} attempts")


def unless_gone(retry: Retry, call: Callable[[], object], on_conflict: Callable[[], None] | None = None) -> bool:
    """Run `call` through `retry`; False when its object is already gone (404), True once it succeeded."""
    try:
        retry(call, on_conflict)
    except ApiError as exc:
        if exc.kind == "not_found":
            return False
        raise
    return True


def eviction_body(namespace: str, name: str, uid: str | None = None) -> dict[str, Any]:
    """A policy/v1 Eviction of one pod; with `uid`, the API server refuses (409) it for a new pod of that name."""
    body: dict[str, Any] = {"apiVersion": "policy/v1", "kind": "Eviction",
                            "metadata": {"name": name, "namespace": namespace}}
    if uid:
        body["deleteOptions"] = {"preconditions": {"uid": uid}}
    return body


#: Where an Event about a cluster-scoped object (a Node) lives: the API server's core/v1 validation refuses one in any
#: other namespace (422, ``involvedObject.namespace ... does not match event.namespace``).
CLUSTER_SCOPED_EVENT_NAMESPACE = "default"


def event_namespace(involved: dict[str, Any]) -> str:
    """The namespace an Event about ``involved`` must be created in: the object's own, or
    :data:`CLUSTER_SCOPED_EVENT_NAMESPACE` for a cluster-scoped one."""
    return str(involved.get("namespace") or CLUSTER_SCOPED_EVENT_NAMESPACE)


def event_problem(body: dict[str, Any]) -> str | None:
    """Why the API server would refuse this core/v1 Event (one without ``eventTime``) for its namespace, or None:
    the rule :func:`event` keeps, for the in-memory API to enforce as the real one does."""
    namespace = str((body.get("metadata") or {}).get("namespace") or "")
    involved = str((body.get("involvedObject") or {}).get("namespace") or "")
    if involved and involved != namespace:
        return f"involvedObject.namespace {involved!r} does not match event.namespace {namespace!r}"
    if not involved and namespace not in ("", CLUSTER_SCOPED_EVENT_NAMESPACE):
        return (f"involvedObject.namespace: an Event about a cluster-scoped object must be in namespace "
                f"{CLUSTER_SCOPED_EVENT_NAMESPACE!r}, not {namespace!r}")
    return None


def event(*, name_prefix: str, involved: dict[str, Any], reason: str, message: str,
          component: str, instance: str, warning: bool, now: float) -> dict[str, Any]:
    """A core/v1 Event about ``involved`` (``generateName`` so repeats never collide), in the namespace the API server
    accepts for it (:func:`event_namespace`)."""
    stamp = rfc3339(now)
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{name_prefix}.{component}.", "namespace": event_namespace(involved)},
        "involvedObject": involved,
        "reason": reason,
        "message": message[:1024],
        "type": "Warning" if warning else "Normal",
        "source": {"component": component},
        "reportingComponent": component,
        "reportingInstance": instance,
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
    }
