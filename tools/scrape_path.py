"""What prometheus-operator makes of the stack's ServiceMonitors and PodMonitors: a Prometheus scrape config.

The alert rules and dashboards only see series after the scrape path has relabelled them, and that is where
labels get lost: the operator always sets ``namespace``, ``pod``, ``container`` (and ``service``,
``endpoint``, ``job``) as target labels, and with ``honorLabels: false`` an exporter's own labels of those
names become ``exported_*``. To test the rules on the series that really arrive, this module rebuilds the
operator's generated scrape job for each monitor endpoint, following its documented output (the
``serviceMonitor/<ns>/<name>/<i>`` and ``podMonitor/<ns>/<name>/<i>`` jobs in its configuration
generator's golden files):

* a ServiceMonitor endpoint (``role: endpoints``): keep the Service's selector labels and the endpoint port
  by name; ``pod`` (or ``node``) from the endpoint's target; ``namespace``, ``service``, ``pod``,
  ``container`` from discovery; drop pods in phase Failed/Succeeded; ``job`` = the Service name (or its
  ``jobLabel`` label); ``endpoint`` = the port name; then the endpoint's ``relabelings``;
* a PodMonitor endpoint (``role: pod``): keep the pod's selector labels and the container port by name;
  ``namespace``, ``container``, ``pod``; ``job`` = ``<namespace>/<monitor name>`` (or its ``jobLabel``);
  ``endpoint`` = the port name; then the endpoint's ``relabelings``;
* ``honorLabels`` → ``honor_labels``; ``metricRelabelings`` → ``metric_relabel_configs``.

Kubernetes discovery is replaced by static targets that carry the same ``__meta_kubernetes_*`` labels, so
Prometheus itself runs every relabelling (the operator's and ours) exactly as in a cluster.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

MONITORING_GROUP = "monitoring.coreos.com/v1"

#: The relabel fields of the monitoring CRDs, as Prometheus spells them.
_RELABEL_KEYS = {
    "sourceLabels": "source_labels",
    "separator": "separator",
    "targetLabel": "target_label",
    "regex": "regex",
    "modulus": "modulus",
    "replacement": "replacement",
    "action": "action",
}


class ScrapePathError(ValueError):
    """A monitor the operator would refuse, named by kind, namespace and name."""


@dataclass(frozen=True)
class Target:
    """One discovered pod endpoint: what Kubernetes discovery would tell Prometheus about it."""

    address: str
    namespace: str
    pod: str
    container: str
    node: str
    port_name: str
    pod_labels: Mapping[str, str] = field(default_factory=dict)
    #: The Service whose endpoints list the pod (ServiceMonitors only).
    service: str = ""
    service_labels: Mapping[str, str] = field(default_factory=dict)
    phase: str = "Running"


def sd_label(prefix: str, key: str) -> str:
    """A Kubernetes label key as discovery names it: every character outside [a-zA-Z0-9_] becomes ``_``."""
    return prefix + re.sub(r"[^a-zA-Z0-9_]", "_", key)


def meta_labels(target: Target, role: str) -> dict[str, str]:
    """The ``__meta_kubernetes_*`` labels discovery attaches to ``target`` in ``role`` (endpoints or pod)."""
    meta = {
        "__meta_kubernetes_namespace": target.namespace,
        "__meta_kubernetes_pod_name": target.pod,
        "__meta_kubernetes_pod_container_name": target.container,
        "__meta_kubernetes_pod_node_name": target.node,
        "__meta_kubernetes_pod_phase": target.phase,
        "__meta_kubernetes_pod_container_port_name": target.port_name,
    }
    for key, value in target.pod_labels.items():
        meta[sd_label("__meta_kubernetes_pod_label_", key)] = value
        meta[sd_label("__meta_kubernetes_pod_labelpresent_", key)] = "true"
    if role == "endpoints":
        meta.update({
            "__meta_kubernetes_service_name": target.service,
            "__meta_kubernetes_endpoint_port_name": target.port_name,
            "__meta_kubernetes_endpoint_address_target_kind": "Pod",
            "__meta_kubernetes_endpoint_address_target_name": target.pod,
        })
        for key, value in target.service_labels.items():
            meta[sd_label("__meta_kubernetes_service_label_", key)] = value
            meta[sd_label("__meta_kubernetes_service_labelpresent_", key)] = "true"
    return meta


def relabel_config(rule: Mapping[str, Any], where: str) -> dict[str, Any]:
    """One CRD relabeling (camelCase) as a Prometheus relabel config; unknown fields are refused."""
    unknown = sorted(set(rule) - set(_RELABEL_KEYS))
    if unknown:
        raise ScrapePathError(f"{where}: unknown relabeling field(s) {unknown}")
    out = {_RELABEL_KEYS[key]: value for key, value in rule.items()}
    if "action" in out:
        out["action"] = str(out["action"]).lower()
    return out


def _keep_selector(match_labels: Mapping[str, str], prefix: str, present_prefix: str) -> list[dict[str, Any]]:
    return [
        {"action": "keep", "source_labels": [sd_label(prefix, key), sd_label(present_prefix, key)],
         "regex": f"({re.escape(value)});true"}
        for key, value in sorted(match_labels.items())
    ]


def _endpoints_relabels(labels: Mapping[str, str], port: str, job_label: str | None,
                        meta: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The operator's chain for a ServiceMonitor endpoint, before the endpoint's own relabelings."""
    target = ["__meta_kubernetes_endpoint_address_target_kind", "__meta_kubernetes_endpoint_address_target_name"]
    return [
        *_keep_selector(labels, "__meta_kubernetes_service_label_", "__meta_kubernetes_service_labelpresent_"),
        {"action": "keep", "source_labels": ["__meta_kubernetes_endpoint_port_name"], "regex": port},
        *({"source_labels": target, "separator": ";", "regex": f"{kind};(.*)", "replacement": "${1}",
           "target_label": label} for kind, label in (("Node", "node"), ("Pod", "pod"))),
        {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
        {"source_labels": ["__meta_kubernetes_service_name"], "target_label": "service"},
        {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
        {"source_labels": ["__meta_kubernetes_pod_container_name"], "target_label": "container"},
        {"action": "drop", "source_labels": ["__meta_kubernetes_pod_phase"], "regex": "(Failed|Succeeded)"},
        {"source_labels": [sd_label("__meta_kubernetes_service_label_", job_label)], "target_label": "job",
         "regex": "(.+)", "replacement": "${1}"} if job_label else
        {"source_labels": ["__meta_kubernetes_service_name"], "target_label": "job", "replacement": "${1}"},
    ]


def _pod_relabels(labels: Mapping[str, str], port: str, job_label: str | None,
                  meta: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The operator's chain for a PodMonitor endpoint, before the endpoint's own relabelings."""
    return [
        *_keep_selector(labels, "__meta_kubernetes_pod_label_", "__meta_kubernetes_pod_labelpresent_"),
        {"action": "keep", "source_labels": ["__meta_kubernetes_pod_container_port_name"], "regex": port},
        {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
        {"source_labels": ["__meta_kubernetes_pod_container_name"], "target_label": "container"},
        {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
        {"source_labels": [sd_label("__meta_kubernetes_pod_label_", job_label)], "target_label": "job",
         "regex": "(.+)", "replacement": "${1}"} if job_label else
        {"target_label": "job", "replacement": f"{meta['namespace']}/{meta['name']}"},
    ]


def _selector(monitor: Mapping[str, Any], where: str) -> Mapping[str, str]:
    selector = monitor.get("spec", {}).get("selector", {})
    if set(selector) - {"matchLabels"}:
        raise ScrapePathError(f"{where}: only selector.matchLabels is modelled, got {sorted(selector)}")
    labels = selector.get("matchLabels") or {}
    if not labels:
        raise ScrapePathError(f"{where}: an empty selector would scrape every pod of the namespace")
    return labels


def _namespaces(monitor: Mapping[str, Any]) -> list[str]:
    spec = monitor.get("spec", {})
    names = spec.get("namespaceSelector", {}).get("matchNames")
    return list(names) if names else [monitor["metadata"]["namespace"]]


def _where(monitor: Mapping[str, Any]) -> str:
    meta = monitor.get("metadata", {})
    return f"{monitor.get('kind')} {meta.get('namespace')}/{meta.get('name')}"


def scrape_jobs(monitor: Mapping[str, Any], targets: Iterable[Target]) -> list[dict[str, Any]]:
    """The scrape jobs the operator generates for one ServiceMonitor or PodMonitor, over ``targets``.

    Targets outside the monitor's namespaces are not discovered (the operator restricts discovery to them);
    the rest are all handed to Prometheus, whose keep rules select by labels and port as in a cluster.
    """
    kind = monitor.get("kind")
    where = _where(monitor)
    meta = monitor["metadata"]
    spec = monitor.get("spec", {})
    if kind == "ServiceMonitor":
        role, endpoints_key, prefix = "endpoints", "endpoints", "serviceMonitor"
    elif kind == "PodMonitor":
        role, endpoints_key, prefix = "pod", "podMetricsEndpoints", "podMonitor"
    else:
        raise ScrapePathError(f"{where}: not a ServiceMonitor or PodMonitor")
    labels = _selector(monitor, where)
    namespaces = _namespaces(monitor)
    discovered = [t for t in targets if t.namespace in namespaces and (role == "pod" or t.service)]
    static = [{"targets": [t.address], "labels": meta_labels(t, role)} for t in discovered]
    jobs: list[dict[str, Any]] = []
    for index, endpoint in enumerate(spec.get(endpoints_key) or []):
        ep_where = f"{where} {endpoints_key}[{index}]"
        port = endpoint.get("port")
        if not port:
            raise ScrapePathError(f"{ep_where}: needs a named port")
        relabel: list[dict[str, Any]] = [{"source_labels": ["job"], "target_label": "__tmp_prometheus_job_name"},
                                         *(_endpoints_relabels if role == "endpoints" else _pod_relabels)(
                                             labels, port, spec.get("jobLabel"), meta)]
        relabel.append({"target_label": "endpoint", "replacement": port})
        relabel += [relabel_config(r, f"{ep_where}.relabelings[{i}]")
                    for i, r in enumerate(endpoint.get("relabelings") or [])]
        job: dict[str, Any] = {
            "job_name": f"{prefix}/{meta['namespace']}/{meta['name']}/{index}",
            "honor_labels": bool(endpoint.get("honorLabels", False)),
            "metrics_path": endpoint.get("path", "/metrics"),
            "static_configs": static,
            "relabel_configs": relabel,
        }
        if endpoint.get("interval"):
            job["scrape_interval"] = endpoint["interval"]
        metric = [relabel_config(r, f"{ep_where}.metricRelabelings[{i}]")
                  for i, r in enumerate(endpoint.get("metricRelabelings") or [])]
        if metric:
            job["metric_relabel_configs"] = metric
        jobs.append(job)
    return jobs


def selected_monitors(monitors: Iterable[Mapping[str, Any]], selector: Mapping[str, str]
                      ) -> tuple[list[Mapping[str, Any]], list[str]]:
    """The monitors a Prometheus with ``serviceMonitorSelector``/``podMonitorSelector`` ``selector`` picks up,
    and the names of those it ignores (the operator skips them silently: a monitor without the stack's
    ``monitorLabels`` is never scraped)."""
    picked: list[Mapping[str, Any]] = []
    ignored: list[str] = []
    for monitor in monitors:
        labels = monitor.get("metadata", {}).get("labels") or {}
        if all(labels.get(k) == v for k, v in selector.items()):
            picked.append(monitor)
        else:
            ignored.append(_where(monitor))
    return picked, ignored


def prometheus_config(jobs: Sequence[Mapping[str, Any]], rule_files: Sequence[str], *,
                      interval: str = "1s") -> dict[str, Any]:
    """A Prometheus configuration with ``jobs``; ``interval`` overrides every job's own (tests run in seconds)."""
    return {
        "global": {"scrape_interval": interval, "evaluation_interval": interval, "scrape_timeout": interval},
        "rule_files": list(rule_files),
        "scrape_configs": [{**job, "scrape_interval": interval} for job in jobs],
    }
