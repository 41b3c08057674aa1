"""One error taxonomy for every Kubernetes answer an agent sees.

Every port raises :class:`ApiError` with one of :data:`KINDS`; agents decide on the kind alone (retry,
re-read, give up, treat as done), and the kind is the label of their error counters. :func:`classify` maps
anything else (the client's own exceptions, urllib3's, OS errors) onto the same kinds.
"""

from __future__ import annotations

import urllib3

KINDS = (
    "conflict",  # 409: the object changed since it was read (or a precondition failed): re-read, try again
    "gone",  # 410: the watch history was compacted: re-list
    "not_found",  # 404: the object is not there (often: already done)
    "forbidden",  # 401/403: RBAC says no; retrying cannot fix it
    "invalid",  # any other 4xx (400, 422): the request is wrong; retrying cannot fix it
    "throttled",  # 429: the API server's or a PodDisruptionBudget's "not now"
    "server_error",  # 5xx
    "timeout",  # no answer within the request timeout
    "unreachable",  # no connection
    "bad_response",  # an answer that is not the JSON object it should be
    "not_leader",  # a write refused before it was sent: this replica may not write (see ``port.Fenced``)
    "other",
)

#: Kinds that a later attempt may fix by itself.
RETRYABLE = frozenset({"server_error", "timeout", "unreachable", "throttled"})


class ApiError(Exception):
    """A Kubernetes call that failed, with its kind (one of :data:`KINDS`) and the HTTP status if any."""

    def __init__(self, kind: str, detail: str = "", status: int = 0) -> None:
        super().__init__(f"{kind}: {detail}" if detail else kind)
        self.kind = kind
        self.status = status
        self.detail = detail

    @property
    def retryable(self) -> bool:
        return self.kind in RETRYABLE


def kind_of_status(status: int) -> str:
    """The kind of an HTTP status (a 2xx is not an error and has no kind)."""
    if status == 409:
        return "conflict"
    if status == 410:
        return "gone"
    if status == 404:
        return "not_found"
    if status in (401, 403):
        return "forbidden"
    if status == 429:
        return "throttled"
    if status >= 500:
        return "server_error"
    if status >= 400:
        return "invalid"
    return "other"


def classify(exc: BaseException) -> str:
    """The kind of any exception a call can raise."""
    if isinstance(exc, ApiError):
        return exc.kind
    status = getattr(exc, "status", None)
    if isinstance(status, int) and status >= 400:  # the client's ApiException and look-alikes
        return kind_of_status(status)
    if isinstance(exc, urllib3.exceptions.MaxRetryError) and exc.reason is not None:
        return classify(exc.reason)
    # Checked before timeouts: urllib3 derives NewConnectionError from ConnectTimeoutError.
    if isinstance(exc, urllib3.exceptions.NewConnectionError | ConnectionRefusedError):
        return "unreachable"
    if isinstance(exc, urllib3.exceptions.TimeoutError | TimeoutError):
        return "timeout"
    if isinstance(exc, urllib3.exceptions.HTTPError | OSError):
        return "unreachable"
    if isinstance(exc, ValueError):
        return "bad_response"
    return "other"


def as_api_error(exc: BaseException) -> ApiError:
    """``exc`` as an :class:`ApiError` (itself when it already is one)."""
    if isinstance(exc, ApiError):
        return exc
    status = getattr(exc, "status", None)
    return ApiError(classify(exc), str(exc)[:500], status if isinstance(status, int) else 0)
