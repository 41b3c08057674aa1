"""The thin I/O shell: the user's kubeconfig and context, server-side apply, reads, logs and deletes.

Every API failure becomes a :class:`CliError` whose message says what to do (log in, ask for the role,
check the name); the decisions live in ``spec`` and ``views``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

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

APPLY_PATCH = "application/apply-patch+yaml"


class CliError(RuntimeError):
    """A failure to show the user as one message (exit code 1)."""


def _reason(exc: ApiException) -> str:
    try:
        return str(json.loads(exc.body or "{}").get("message") or exc.reason)
    except (ValueError, AttributeError):
        return str(exc.reason)


def explain(exc: ApiException, doing: str, namespace: str) -> CliError:
    """The API's refusal in the user's terms."""
    if "ValidatingAdmissionPolicy" in _reason(exc):
        # The guardrails answer 422 (Invalid), or 403 where a policy sets reason Forbidden: not a permission issue.
        return CliError(f"{doing}: refused by the cluster's training guardrails: {_reason(exc)}")
    if exc.status == 401:
        return CliError(f"{doing}: the cluster did not accept your credentials; log in again or check "
                        f"your kubeconfig context")
    if exc.status == 403:
        return CliError(f"{doing}: no permission ({_reason(exc)}); ask the cluster admins for the researcher "
                        f"role in namespace '{namespace}'")
    if exc.status in (400, 422):
        return CliError(f"{doing}: refused by the cluster: {_reason(exc)}")
    if exc.status == 409:
        return CliError(f"{doing}: conflict: {_reason(exc)}; another tool manages these fields "
                        f"(cancel the job first, or choose another name)")
    return CliError(f"{doing}: the API answered {exc.status}: {_reason(exc)}")


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
        try:
            api = config.new_client_from_config(config_file=kubeconfig, context=context)  # type: ignore[no-untyped-call]
        except (config.ConfigException, OSError) as exc:
            raise CliError(f"cannot load your kubeconfig{f' context {context!r}' if context else ''}: {exc}") from None
        return cls(api, namespace)

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
