"""One Kubernetes port for every agent: raw JSON in and out, a timeout on every call, one error taxonomy.

Agents speak to the API only through :class:`KubePort`: a handful of verbs on a :class:`Resource`, the way
the API itself is shaped, so one in-memory implementation (:mod:`fakes.kube_api`) serves the tests of
every agent and one HTTP implementation (:class:`HttpPort`) serves production. No typed models: an agent
that lists tens of thousands of pods keeps plain dicts.

Writes are fenced by construction: an agent wraps its port in :class:`Fenced` with its elector's
``can_write``, so every create, patch and replace — retries and conflict re-reads included, because each is
a new call — is refused (``not_leader``) unless this replica may still write when the call could finish. Only
the elector itself, which must write its Lease to become leader, holds the unfenced port. The fenced port also
gives every call but a watch a deadline of its own, whatever the transport beneath does: a call that never
answers ends as ``timeout`` and the agent's cycle goes on.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar
from urllib.parse import quote

import urllib3

from agents.kit.errors import ApiError, as_api_error, kind_of_status

MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"


@dataclass(frozen=True)
class Resource:
    """One API resource: where its objects live (``/api/v1/...`` for the core group, ``/apis/g/v/...`` else)."""

    plural: str
    group: str = ""
    version: str = "v1"
    namespaced: bool = True

    def path(self, namespace: str | None = None, name: str | None = None, subresource: str | None = None) -> str:
        base = f"/api/{self.version}" if not self.group else f"/apis/{self.group}/{self.version}"
        if self.namespaced and namespace:
            base += f"/namespaces/{quote(namespace, safe='')}"
        base += f"/{self.plural}"
        if name is not None:
            base += f"/{quote(name, safe='')}"
            if subresource:
                base += f"/{subresource}"
        return base


NODES = Resource("nodes", namespaced=False)
PODS = Resource("pods")
EVENTS = Resource("events")
LEASES = Resource("leases", "coordination.k8s.io")
DEPLOYMENTS = Resource("deployments", "apps")
VOLCANO_JOBS = Resource("jobs", "batch.volcano.sh", "v1alpha1")


class KubePort(Protocol):
    """Every call an agent makes. Each raises :class:`ApiError` on failure and answers a JSON object."""

    def get(self, resource: Resource, name: str, namespace: str | None = None) -> dict[str, Any]: ...

    def list(self, resource: Resource, namespace: str | None = None, *, label_selector: str | None = None,
             field_selector: str | None = None, limit: int | None = None,
             continue_token: str | None = None) -> dict[str, Any]: ...

    def watch(self, resource: Resource, resource_version: str, timeout_seconds: int, namespace: str | None = None, *,
              label_selector: str | None = None, field_selector: str | None = None) -> Iterator[dict[str, Any]]: ...

    def create(self, resource: Resource, body: dict[str, Any], namespace: str | None = None,
               name: str | None = None, subresource: str | None = None) -> dict[str, Any]: ...

    def patch(self, resource: Resource, name: str, body: dict[str, Any], namespace: str | None = None,
              content_type: str = MERGE_PATCH, subresource: str | None = None) -> dict[str, Any]: ...

    def replace(self, resource: Resource, name: str, body: dict[str, Any],
                namespace: str | None = None) -> dict[str, Any]: ...


T = TypeVar("T")


def bounded(what: str, call: Callable[[], T], seconds: float | None) -> T:
    """``call()``, given up after ``seconds`` (``None``: no bound) with ``timeout``. The call runs in a thread of
    its own, so one that never answers is left behind instead of holding its caller."""
    if seconds is None:
        return call()
    box: list[tuple[bool, Any]] = []

    def run() -> None:
        try:
            box.append((True, call()))
        except BaseException as exc:  # handed to the caller as it is
            box.append((False, exc))

    worker = threading.Thread(target=run, name=f"call {what}", daemon=True)
    worker.start()
    worker.join(seconds)
    if not box:
        raise ApiError("timeout", f"{what}: no answer within {seconds:g}s")
    ok, value = box[0]
    if ok:
        return value  # type: ignore[no-any-return]
    raise value


class Fenced:
    """A port whose writes happen only while ``may_write()`` says so; reads and watches pass through. With
    ``call_timeout_seconds``, every call but a watch ends within it (:func:`bounded`)."""

    def __init__(self, port: KubePort, may_write: Callable[[], bool],
                 call_timeout_seconds: float | None = None) -> None:
        self.inner = port
        self._may_write = may_write
        self.call_timeout = call_timeout_seconds
        #: Writes refused here, before anything was sent.
        self.refused = 0

    def _fence(self, verb: str, resource: Resource, name: str | None) -> None:
        if not self._may_write():
            self.refused += 1
            raise ApiError("not_leader", f"{verb} {resource.plural}/{name or ''}: this replica may not write now")

    def get(self, resource: Resource, name: str, namespace: str | None = None) -> dict[str, Any]:
        return bounded(f"get {resource.plural}/{name}", lambda: self.inner.get(resource, name, namespace),
                       self.call_timeout)

    def list(self, resource: Resource, namespace: str | None = None, *, label_selector: str | None = None,
             field_selector: str | None = None, limit: int | None = None,
             continue_token: str | None = None) -> dict[str, Any]:
        return bounded(f"list {resource.plural}", lambda: self.inner.list(
            resource, namespace, label_selector=label_selector, field_selector=field_selector, limit=limit,
            continue_token=continue_token), self.call_timeout)

    def watch(self, resource: Resource, resource_version: str, timeout_seconds: int, namespace: str | None = None, *,
              label_selector: str | None = None, field_selector: str | None = None) -> Iterator[dict[str, Any]]:
        return self.inner.watch(resource, resource_version, timeout_seconds, namespace, label_selector=label_selector,
                                field_selector=field_selector)

    def create(self, resource: Resource, body: dict[str, Any], namespace: str | None = None,
               name: str | None = None, subresource: str | None = None) -> dict[str, Any]:
        self._fence("create", resource, name)
        return bounded(f"create {resource.plural}/{name or ''}",
                       lambda: self.inner.create(resource, body, namespace, name, subresource), self.call_timeout)

    def patch(self, resource: Resource, name: str, body: dict[str, Any], namespace: str | None = None,
              content_type: str = MERGE_PATCH, subresource: str | None = None) -> dict[str, Any]:
        self._fence("patch", resource, name)
        return bounded(f"patch {resource.plural}/{name}", lambda: self.inner.patch(
            resource, name, body, namespace, content_type, subresource), self.call_timeout)

    def replace(self, resource: Resource, name: str, body: dict[str, Any],
                namespace: str | None = None) -> dict[str, Any]:
        self._fence("replace", resource, name)
        return bounded(f"replace {resource.plural}/{name}",
                       lambda: self.inner.replace(resource, name, body, namespace), self.call_timeout)


#: Calls every agent has in flight besides its own watches and writes: its loop, its Lease's renewal and the
#: Lease's watch.
BASE_CONNECTIONS = 3
#: Connections an agent that declares none gets: the base and one watch.
DEFAULT_CONNECTIONS = BASE_CONNECTIONS + 1
#: Above what an agent declares: calls given up by :func:`bounded` whose threads still hold a connection.
SPARE_CONNECTIONS = 4
#: The longest silence a watch is read through before it ends (seconds); the informer then watches again from its
#: resourceVersion on a new connection, where a black-holed path (a hung proxy, a half-open connection) fails to
#: answer at all: a failure, and a re-list once it answers. Before, such a watch was read for its whole timeout plus
#: the request timeout, five minutes of a stale view. The API server bookmarks a quiet watch about every minute
#: (measured on the local control plane: at 0 s, 120 s, then every 60 s), but not a kind its cache has seen no event
#: of since it started, so a silent watch ends as an expected end, not as a failure that re-lists.
WATCH_SILENCE_SECONDS = 150.0


def _object(data: bytes) -> dict[str, Any]:
    try:
        obj = json.loads(data) if data else {}
    except ValueError as exc:
        raise ApiError("bad_response", f"not JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise ApiError("bad_response", f"expected a JSON object, got {type(obj).__name__}")
    return obj


class HttpPort:
    """:class:`KubePort` over the kubernetes client's ``ApiClient`` (its auth, TLS and connection pool).

    Every call carries ``request_timeout_seconds`` (a watch: that to connect, and to read, its own timeout or
    :data:`WATCH_SILENCE_SECONDS` if shorter, plus that), so a call that never answers ends as ``timeout`` instead
    of hanging the agent's loop, and a watch gone silent ends, as at its own timeout, well before it.
    """

    def __init__(self, api_client: Any, request_timeout_seconds: float,
                 watch_silence_seconds: float = WATCH_SILENCE_SECONDS) -> None:
        self.client = api_client
        self.timeout = request_timeout_seconds
        self.watch_silence = watch_silence_seconds

    @classmethod
    def connect(cls, kubeconfig: str | None, request_timeout_seconds: float, user_agent: str | None = None,
                connections: int = DEFAULT_CONNECTIONS) -> HttpPort:
        """From a kubeconfig file, else the pod's in-cluster service account (see :meth:`on`)."""
        from kubernetes import client, config

        cfg = client.Configuration()
        loader: Any = config
        if kubeconfig:
            loader.load_kube_config(config_file=kubeconfig, client_configuration=cfg)
        else:
            loader.load_incluster_config(client_configuration=cfg)
        return cls.on(cfg, request_timeout_seconds, user_agent, connections)

    @classmethod
    def on(cls, cfg: Any, request_timeout_seconds: float, user_agent: str | None = None,
           connections: int = DEFAULT_CONNECTIONS) -> HttpPort:
        """The port on a client ``Configuration``; urllib3 retries off (the agent's own backoff is the one retry
        policy). ``user_agent`` (``<agent>/<identity>``) tells replicas that share a ServiceAccount apart in the
        API server's audit log. ``connections`` sizes the connection pool to the calls the agent has in flight at
        once (its watches, its Lease, its side-by-side writes): the client's default is five per CPU of the *host*,
        and each call past the pool opens a TLS connection of its own and throws it away afterwards."""
        from kubernetes import client

        if connections < 1:
            raise ValueError(f"connections: must be at least 1 (got {connections})")
        cfg.retries = False
        cfg.connection_pool_maxsize = connections + SPARE_CONNECTIONS
        api_client = client.ApiClient(cfg)
        if user_agent:
            api_client.user_agent = user_agent
        return cls(api_client, request_timeout_seconds)

    def _send(self, method: str, path: str, query: list[tuple[str, Any]] | None = None,
              body: dict[str, Any] | None = None, content_type: str = "application/json",
              timeout: Any = None) -> Any:
        headers = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = content_type
        try:
            request = self.client.param_serialize(method, path, query_params=query or None, header_params=headers,
                                                  body=body, auth_settings=["BearerToken"])
            response = self.client.call_api(*request, _request_timeout=timeout or self.timeout)
        except Exception as exc:
            raise as_api_error(exc) from None
        status = int(response.status)
        if not 200 <= status <= 299:
            try:
                detail = response.read().decode("utf-8", "replace")[:500]
            except Exception:
                detail = ""
            finally:
                response.response.release_conn()
            raise ApiError(kind_of_status(status), f"{method} {path}: HTTP {status} {detail}", status)
        return response

    def _json(self, method: str, path: str, query: list[tuple[str, Any]] | None = None,
              body: dict[str, Any] | None = None, content_type: str = "application/json") -> dict[str, Any]:
        response = self._send(method, path, query, body, content_type)
        try:
            return _object(response.read())
        except ApiError:
            raise
        except Exception as exc:  # the answer broke off mid-body
            raise as_api_error(exc) from None
        finally:
            response.response.release_conn()

    def get(self, resource: Resource, name: str, namespace: str | None = None) -> dict[str, Any]:
        return self._json("GET", resource.path(namespace, name))

    def list(self, resource: Resource, namespace: str | None = None, *, label_selector: str | None = None,
             field_selector: str | None = None, limit: int | None = None,
             continue_token: str | None = None) -> dict[str, Any]:
        query: list[tuple[str, Any]] = [(k, v) for k, v in (
            ("labelSelector", label_selector), ("fieldSelector", field_selector), ("limit", limit),
            ("continue", continue_token)) if v]
        return self._json("GET", resource.path(namespace), query)

    def watch(self, resource: Resource, resource_version: str, timeout_seconds: int, namespace: str | None = None, *,
              label_selector: str | None = None, field_selector: str | None = None) -> Iterator[dict[str, Any]]:
        query: list[tuple[str, Any]] = [("watch", "true"), ("allowWatchBookmarks", "true"),
                                        ("timeoutSeconds", timeout_seconds)]
        if resource_version:
            query.append(("resourceVersion", resource_version))
        if label_selector:
            query.append(("labelSelector", label_selector))
        if field_selector:
            query.append(("fieldSelector", field_selector))
        # The read timeout bounds each wait for the next bytes, not the watch: bookmarks keep a live one talking.
        response = self._send("GET", resource.path(namespace), query,
                              timeout=(self.timeout, min(timeout_seconds, self.watch_silence) + self.timeout))
        raw = response.response  # the urllib3 response, streamed
        try:
            buffer = b""
            for chunk in raw.stream(amt=None, decode_content=False):
                buffer += chunk
                *lines, buffer = buffer.split(b"\n")
                for line in lines:
                    if line.strip():
                        yield _object(line)
        except urllib3.exceptions.ReadTimeoutError:
            # Silent past the bound once streaming: it ends as at its own timeout, and the caller watches again from
            # its resourceVersion on a new connection (a black-holed path then fails to answer: a failure). The API
            # server does not bookmark a kind its cache has seen no event of since it started, so a quiet kind's
            # watch may well be this silent: not a reason to re-list it.
            return
        except ApiError:
            raise
        except Exception as exc:
            raise as_api_error(exc) from None
        finally:
            raw.release_conn()

    def create(self, resource: Resource, body: dict[str, Any], namespace: str | None = None,
               name: str | None = None, subresource: str | None = None) -> dict[str, Any]:
        path = resource.path(namespace, name, subresource) if name is not None else resource.path(namespace)
        return self._json("POST", path, body=body)

    def patch(self, resource: Resource, name: str, body: dict[str, Any], namespace: str | None = None,
              content_type: str = MERGE_PATCH, subresource: str | None = None) -> dict[str, Any]:
        return self._json("PATCH", resource.path(namespace, name, subresource), body=body, content_type=content_type)

    def replace(self, resource: Resource, name: str, body: dict[str, Any],
                namespace: str | None = None) -> dict[str, Any]:
        return self._json("PUT", resource.path(namespace, name), body=body)
