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


def event(*, namespace: str, name_prefix: str, involved: dict[str, Any], reason: str, message: str,
          component: str, instance: str, warning: bool, now: float) -> dict[str, Any]:
    """A core/v1 Event about ``involved`` (``generateName`` so repeats never collide)."""
    stamp = rfc3339(now)
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{name_prefix}.{component}.", "namespace": namespace},
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
