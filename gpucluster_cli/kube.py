"""The thin I/O shell: the user's kubeconfig and context, server-side apply, reads, logs and deletes.

Every API failure becomes a :class:`CliError` whose message says what to do (log in, ask for the role,
check the name); the decisions live in ``spec`` and ``views``.
"""

from __future__ import annotations

import json
import os
import ssl
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TypeVar

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from urllib3 import exceptions as urllib3_errors

from components.published_settings import SETTINGS_CONFIGMAP, SETTINGS_KEY, ClusterSettings, parse_settings
from gpucluster_cli.render import (
    FIELD_MANAGER,
    MONITOR_GROUP,
    MONITOR_VERSION,
    MONITORS,
    VOLCANO_GROUP,
    VOLCANO_JOBS,
    VOLCANO_VERSION,
)
from gpucluster_cli.yamlfile import YamlFileError, read_yaml

APPLY_PATCH = "application/apply-patch+yaml"
#: Where the kubernetes client (and kubectl) looks when neither --kubeconfig nor $KUBECONFIG names a file.
DEFAULT_KUBECONFIG = "~/.kube/config"


class CliError(RuntimeError):
    """A failure to show the user as one message (exit code 1)."""


def _one_line(text: object) -> str:
    return " ".join(str(text).split())


def _reason(exc: ApiException) -> str:
    try:
        return _one_line(json.loads(exc.body or "{}").get("message") or exc.reason)
    except (ValueError, AttributeError):
        return _one_line(exc.reason)


def explain(exc: ApiException, doing: str, namespace: str) -> CliError:
    """The API's refusal in the user's terms, on one line with the HTTP status (what kubectl shows too)."""
    if not exc.status:  # the client's own (status 0): the request never got an answer
        return CliError(f"{doing}: no answer from the API: {_reason(exc)}")
    status = f"HTTP {exc.status} {_one_line(exc.reason or '')}".strip()
    if "ValidatingAdmissionPolicy" in _reason(exc):
        # The guardrails answer 422 (Invalid), or 403 where a policy sets reason Forbidden: not a permission issue.
        return CliError(f"{doing}: refused by the cluster's training guardrails: {_reason(exc)} ({status})")
    if exc.status == 401:
        return CliError(f"{doing}: the cluster did not accept your credentials; log in again or check "
                        f"your kubeconfig context ({status})")
    if exc.status == 403:
        return CliError(f"{doing}: no permission ({_reason(exc)}); ask the cluster admins for the researcher "
                        f"role in namespace '{namespace}' ({status})")
    if exc.status in (400, 422):
        return CliError(f"{doing}: refused by the cluster: {_reason(exc)} ({status})")
    if exc.status == 409:
        return CliError(f"{doing}: conflict: {_reason(exc)}; another tool manages these fields "
                        f"(cancel the job first, or choose another name) ({status})")
    return CliError(f"{doing}: the API answered {status}: {_reason(exc)}")


_E = TypeVar("_E", bound=BaseException)


def _inner(exc: BaseException, kind: type[_E]) -> _E | None:
    """The first ``kind`` in the exception, its arguments or its causes (urllib3 wraps the socket's error)."""
    todo: list[object] = [exc]
    seen: set[int] = set()
    while todo:
        found = todo.pop(0)
        if isinstance(found, kind):
            return found
        if isinstance(found, BaseException) and id(found) not in seen:
            seen.add(id(found))
            todo += [*found.args, found.__cause__, found.__context__]
    return None


def _why(reason: BaseException) -> str:
    """What went wrong on the wire, in a few words: the socket's or TLS's own reason where urllib3 wrapped one."""
    tls, sock = _inner(reason, ssl.SSLError), _inner(reason, OSError)
    if isinstance(reason, urllib3_errors.NameResolutionError):
        return "its host name does not resolve"
    if isinstance(reason, urllib3_errors.SSLError) or tls is not None:
        cert = tls.verify_message if isinstance(tls, ssl.SSLCertVerificationError) else None
        return f"TLS failed: {_one_line(cert or (tls.strerror if tls is not None else None) or reason)}"
    if isinstance(reason, urllib3_errors.NewConnectionError) and sock is not None and sock.strerror:  # refused
        return sock.strerror.lower()
    if isinstance(reason, urllib3_errors.TimeoutError):
        return "timed out"
    if isinstance(reason, urllib3_errors.ProtocolError):
        return f"the connection broke ({_one_line((sock.strerror or sock) if sock is not None else reason)})"
    return _one_line(reason)


def unreachable(exc: urllib3_errors.HTTPError, host: str) -> CliError:
    """No answer from the API server (refused, no such host, timed out, TLS refused, connection broken): one line
    naming the server, as kubectl's "The connection to the server ... was refused", not urllib3's traceback."""
    reason = exc.reason if isinstance(exc, urllib3_errors.MaxRetryError) and exc.reason is not None else exc
    return CliError(f"cannot reach the Kubernetes API at {host}: {_why(reason)}")


def kubeconfig_files(kubeconfig: str | None) -> tuple[list[Path], str]:
    """The files the client reads and who named them, in kubectl's order: --kubeconfig, else each file in
    $KUBECONFIG, else ~/.kube/config. Read here at each call (the client reads $KUBECONFIG once, at import)."""
    if kubeconfig:
        return [Path(kubeconfig).expanduser()], "--kubeconfig"
    listed = [Path(p).expanduser() for p in os.environ.get("KUBECONFIG", "").split(os.pathsep) if p]
    if listed:
        return listed, "$KUBECONFIG"
    return [Path(DEFAULT_KUBECONFIG).expanduser()], "the default location"


class Cluster:
    """The calls the CLI makes, over one ``ApiClient`` (the user's kubeconfig, or one a test provides)."""

    def __init__(self, api: client.ApiClient, namespace: str) -> None:
        self.api = api
        self.namespace = namespace
        #: How the user called us (``gpucluster`` or ``kubectl gpucluster``), for the hints in messages.
        self.prog = "gpucluster"
        self.core = client.CoreV1Api(api)
        self.custom = client.CustomObjectsApi(api)

    @classmethod
    def from_kubeconfig(cls, context: str | None, namespace: str, kubeconfig: str | None = None) -> Cluster:
        """The client for the kubeconfig's context; each file is checked first, so a missing or broken one is
        named with its path (and line), not left to the client's traceback or its "No configuration found"."""
        files, named_by = kubeconfig_files(kubeconfig)
        present = [f for f in files if f.exists()]
        if not present:
            missing = f"{files[0]} does not exist" if len(files) == 1 else \
                f"none of {', '.join(map(str, files))} exists"
            raise CliError(f"cannot load your kubeconfig: {missing} (from {named_by}); give --kubeconfig, set "
                           f"$KUBECONFIG, or get one from the cluster admins")
        for path in present:
            try:
                data = read_yaml(path, "the kubeconfig", strict=False)
            except YamlFileError as exc:
                raise CliError(f"cannot load your kubeconfig: {exc}") from None
            if not isinstance(data, dict):
                raise CliError(f"cannot load your kubeconfig: {path}: "
                               f"{'is empty' if data is None else 'must be a mapping (clusters, contexts, users)'}")
        where = f"{', '.join(map(str, present))}{f' context {context!r}' if context else ''}"
        try:
            api = config.new_client_from_config(  # type: ignore[no-untyped-call]
                config_file=os.pathsep.join(map(str, present)), context=context)
        except (config.ConfigException, OSError) as exc:
            raise CliError(f"cannot load your kubeconfig {where}: {_one_line(exc)}") from None
        except (TypeError, AttributeError, KeyError, ValueError) as exc:  # a shape the client did not expect
            raise CliError(f"cannot load your kubeconfig {where}: not a valid kubeconfig "
                           f"({type(exc).__name__}: {_one_line(exc)})") from None
        if not api.configuration.host:
            raise CliError(f"cannot load your kubeconfig {where}: the context's cluster has no server URL")
        return cls(api, namespace)

    @property
    def host(self) -> str:
        """The API server's URL, from the kubeconfig's cluster (what the errors name)."""
        return str(self.api.configuration.host)

    def _json(self, resp: Any) -> Any:
        return json.loads(resp.data)

    def settings(self) -> ClusterSettings:
        try:
            cm = self._json(self.core.read_namespaced_config_map(SETTINGS_CONFIGMAP, self.namespace,
                                                                   _preload_content=False))
        except ApiException as exc:
            if exc.status == 404:
                raise CliError(f"no ConfigMap {self.namespace}/{SETTINGS_CONFIGMAP}: this cluster does not publish "
                               f"its training settings (is the stack deployed, and is --namespace right?)") from None
            raise explain(exc, "reading the cluster settings", self.namespace) from None
        try:
            return parse_settings(cm.get("data", {})[SETTINGS_KEY])
        except (KeyError, ValueError) as exc:
            raise CliError(f"ConfigMap {self.namespace}/{SETTINGS_CONFIGMAP} is not valid cluster settings: "
                           f"{exc}") from None

    def apply(self, obj: dict[str, Any], dry_run: bool = False) -> dict[str, Any]:
        """Server-side apply under our own field manager (without force: a conflict is reported)."""
        group, version = obj["apiVersion"].split("/")
        plural = VOLCANO_JOBS if obj["kind"] == "Job" else MONITORS
        name = obj["metadata"]["name"]
        try:
            resp = self.custom.patch_namespaced_custom_object(
                group, version, self.namespace, plural, name, obj, field_manager=FIELD_MANAGER,
                dry_run="All" if dry_run else None, _content_type=APPLY_PATCH, _preload_content=False,
            )
        except ApiException as exc:
            if exc.status == 404 and plural == MONITORS:
                raise CliError("no PodMonitor resource on this cluster") from None
            raise explain(exc, f"applying {obj['kind']} {name}", self.namespace) from None
        result: dict[str, Any] = self._json(resp)
        return result

    def jobs(self, timeout: float | None = None) -> list[dict[str, Any]]:
        """The namespace's Volcano Jobs; ``timeout`` (seconds) bounds the call where a user waits on it (TAB)."""
        try:
            resp = self.custom.list_namespaced_custom_object(VOLCANO_GROUP, VOLCANO_VERSION, self.namespace,
                                                            VOLCANO_JOBS, _preload_content=False,
                                                            _request_timeout=timeout)
        except ApiException as exc:
            raise explain(exc, "listing training jobs", self.namespace) from None
        items: list[dict[str, Any]] = self._json(resp).get("items", [])
        return items

    def job(self, name: str) -> dict[str, Any]:
        try:
            resp = self.custom.get_namespaced_custom_object(VOLCANO_GROUP, VOLCANO_VERSION, self.namespace,
                                                           VOLCANO_JOBS, name, _preload_content=False)
        except ApiException as exc:
            if exc.status == 404:
                raise CliError(f"no training job '{name}' in namespace '{self.namespace}' "
                               f"(see `{self.prog} train list`)") from None
            raise explain(exc, f"reading job {name}", self.namespace) from None
        result: dict[str, Any] = self._json(resp)
        return result

    def pods(self, selector: str) -> list[dict[str, Any]]:
        try:
            resp = self.core.list_namespaced_pod(self.namespace, label_selector=selector, _preload_content=False)
        except ApiException as exc:
            raise explain(exc, "listing the job's pods", self.namespace) from None
        items: list[dict[str, Any]] = self._json(resp).get("items", [])
        return items

    def node_label(self, node: str, key: str) -> str | None:
        """One label of a node, or None where it is absent or cannot be read (researchers may not read nodes)."""
        try:
            found = self._json(self.core.read_node(node, _preload_content=False))
        except ApiException:
            return None
        value = ((found.get("metadata") or {}).get("labels") or {}).get(key)
        return value if isinstance(value, str) else None

    def metrics(self, pod: str, port: int) -> str | None:
        """The pod's /metrics through the API server's pod proxy, or None when it cannot be reached."""
        try:
            resp: Any = self.core.connect_get_namespaced_pod_proxy_with_path(
                f"{pod}:{port}", self.namespace, "metrics", _preload_content=False)
        except ApiException:
            return None
        data: bytes = resp.data
        return data.decode("utf-8", "replace")

    def logs(self, pod: str, container: str, follow: bool, tail: int | None = None, previous: bool = False,
             since_seconds: int | None = None) -> Iterator[str]:
        """The container's log (its last ``tail`` lines, the previous instance's, the last ``since_seconds``),
        streamed when following; CliError when the node keeps none."""
        options: dict[str, Any] = {k: v for k, v in (("tail_lines", tail), ("since_seconds", since_seconds)) if v
                                   is not None}
        if previous:
            options["previous"] = True
        try:
            resp: Any = self.core.read_namespaced_pod_log(pod, self.namespace, container=container, follow=follow,
                                                     _preload_content=False, **options)
        except ApiException as exc:
            if exc.status in (400, 404):
                raise CliError(f"no logs for pod {pod}: {_reason(exc)} (the container has not started, or its "
                               f"node keeps no logs)") from None
            if exc.status in (500, 502, 503):
                # The API server could not reach the node's kubelet (a virtual or simulated node keeps none).
                raise CliError(f"no logs for pod {pod}: its node's kubelet did not answer the API server "
                               f"({_reason(exc)})") from None
            raise explain(exc, f"reading logs of {pod}", self.namespace) from None
        if not follow:
            yield resp.data.decode("utf-8", "replace")
            return
        for chunk in resp.stream(4096):
            yield chunk.decode("utf-8", "replace")

    def delete(self, name: str) -> bool:
        """Delete the job (its pods go with it) and its PodMonitor; False if there was no job."""
        try:
            self.custom.delete_namespaced_custom_object(VOLCANO_GROUP, VOLCANO_VERSION, self.namespace,
                                                        VOLCANO_JOBS, name, propagation_policy="Background",
                                                        _preload_content=False)
        except ApiException as exc:
            if exc.status == 404:
                return False
            raise explain(exc, f"cancelling job {name}", self.namespace) from None
        try:
            self.custom.delete_namespaced_custom_object(MONITOR_GROUP, MONITOR_VERSION, self.namespace, MONITORS,
                                                        name, _preload_content=False)
        except ApiException as exc:
            if exc.status not in (403, 404):
                raise explain(exc, f"deleting the PodMonitor of {name}", self.namespace) from None
        return True
