"""Prometheus for the real nodes' pods, in a pod of its own, scraping what the stack's monitors ask for.

With real nodes the stack's exporters run for real (dcgm-exporter's stand-in and the InfiniBand exporter on the real
GPU nodes, the agents on the system node), but the local cluster has no prometheus-operator yet to turn the stack's
ServiceMonitors and PodMonitors into a Prometheus. This loop does the operator's part: it runs Prometheus (Debian's
binary in an image ``make images`` builds) as a Deployment in the monitoring namespace on the real system node, behind
the Service the operator would make (``prometheus-operated``, the stack's default ``prometheusUrl``), and every few
seconds reads the monitors (those the stack's ``monitorLabels`` select) and the real pods behind them (their
Services' endpoints for a ServiceMonitor, their named container ports for a PodMonitor), writes the configuration
the operator would generate (:mod:`tools.scrape_path`) into its ConfigMap and has it reload. So the health guard
reaches it through cluster DNS, a Service and the stack's NetworkPolicies, as in production.

kwok's pods have no real address and are left out: nothing answers there.
"""

from __future__ import annotations

import argparse
import ipaddress
import sys
import time
import urllib.request
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import yaml

from tools.image_local import PROMETHEUS_IMAGE
from tools.localcluster.realnodes import POD_SUPERNET
from tools.scrape_path import Target, prometheus_config, scrape_jobs, selected_monitors

PORT = 9090
NAME = "prometheus-local"
#: The Service prometheus-operator makes for every Prometheus, which the stack's prometheusUrl names by default.
SERVICE = "prometheus-operated"
LABELS = {"app.kubernetes.io/name": "prometheus", "app.kubernetes.io/instance": NAME}
REAL_PODS = ipaddress.ip_network(f"{POD_SUPERNET}.0.0/16")
MONITORS = (("servicemonitors", "ServiceMonitor"), ("podmonitors", "PodMonitor"))


def _real(ip: str | None) -> bool:
    return bool(ip) and ipaddress.ip_address(str(ip)) in REAL_PODS


def pod_targets(pods: Iterable[Mapping[str, Any]]) -> list[Target]:
    """Every named container port of a running real pod, as pod discovery reports it (PodMonitors)."""
    out: list[Target] = []
    for pod in pods:
        meta, spec, status = pod["metadata"], pod.get("spec") or {}, pod.get("status") or {}
        if not _real(status.get("podIP")):
            continue
        for container in spec.get("containers") or ():
            for port in container.get("ports") or ():
                if port.get("name"):
                    out.append(Target(f"{status['podIP']}:{port['containerPort']}", meta["namespace"], meta["name"],
                                      container["name"], spec.get("nodeName", ""), port["name"],
                                      dict(meta.get("labels") or {}), phase=status.get("phase", "")))
    return out


def endpoint_targets(pods: Iterable[Mapping[str, Any]], services: Iterable[Mapping[str, Any]],
                     endpoints: Iterable[Mapping[str, Any]]) -> list[Target]:
    """Every real pod address of a Service's endpoints with its port, as endpoints discovery reports it
    (ServiceMonitors)."""
    by_pod = {(p["metadata"]["namespace"], p["metadata"]["name"]): p for p in pods}
    by_service = {(s["metadata"]["namespace"], s["metadata"]["name"]): s for s in services}
    out: list[Target] = []
    for ep in endpoints:
        ns, name = ep["metadata"]["namespace"], ep["metadata"]["name"]
        service = by_service.get((ns, name))
        if service is None:
            continue
        for subset in ep.get("subsets") or ():
            for address in subset.get("addresses") or ():
                ref = address.get("targetRef") or {}
                pod = by_pod.get((ns, ref.get("name", "")))
                if pod is None or not _real(address.get("ip")):
                    continue
                for port in subset.get("ports") or ():
                    container = next((c["name"] for c in pod["spec"].get("containers") or ()
                                      for p in c.get("ports") or () if p.get("containerPort") == port.get("port")), "")
                    out.append(Target(f"{address['ip']}:{port['port']}", ns, pod["metadata"]["name"], container,
                                      pod["spec"].get("nodeName", ""), port.get("name", ""),
                                      dict(pod["metadata"].get("labels") or {}), service=name,
                                      service_labels=dict(service["metadata"].get("labels") or {}),
                                      phase=(pod.get("status") or {}).get("phase", "")))
    return out


def config(monitors: Sequence[Mapping[str, Any]], selector: Mapping[str, str], pods: Sequence[Mapping[str, Any]],
           services: Sequence[Mapping[str, Any]], endpoints: Sequence[Mapping[str, Any]],
           interval: str = "5s") -> dict[str, Any]:
    """The Prometheus configuration for the selected monitors over the real pods (pure)."""
    picked, _ = selected_monitors(monitors, selector)
    by_role = {"ServiceMonitor": endpoint_targets(pods, services, endpoints), "PodMonitor": pod_targets(pods)}
    jobs = [job for m in picked for job in scrape_jobs(m, by_role[str(m.get("kind"))])]
    return prometheus_config(jobs, [], interval=interval)


def _read(api: Any) -> tuple[list[dict[str, Any]], ...]:
    from kubernetes import client

    core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
    raw = api.sanitize_for_serialization
    listed: dict[str, Any] = {plural: custom.list_cluster_custom_object("monitoring.coreos.com", "v1", plural)
                              for plural, _ in MONITORS}
    monitors = [{**m, "kind": kind} for plural, kind in MONITORS for m in listed[plural]["items"]]
    return (monitors, raw(core.list_pod_for_all_namespaces().items), raw(core.list_service_for_all_namespaces().items),
            raw(core.list_endpoints_for_all_namespaces().items))


def manifests(namespace: str, node: str, config_text: str) -> list[dict[str, Any]]:
    """The ConfigMap, Deployment and Service of the local Prometheus (pure): restricted Pod Security, one replica on
    ``node`` (a real node: the images exist there), its data in an emptyDir."""
    meta = {"namespace": namespace, "labels": LABELS}
    pod = {
        "metadata": {"labels": LABELS},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "automountServiceAccountToken": False,
            "securityContext": {"runAsNonRoot": True, "runAsUser": 65534, "runAsGroup": 65534, "fsGroup": 65534,
                                "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [{
                "name": "prometheus", "image": PROMETHEUS_IMAGE, "imagePullPolicy": "Never",
                "args": ["--config.file=/etc/prometheus/prometheus.yml", "--storage.tsdb.path=/prometheus",
                         "--storage.tsdb.retention.time=1d", f"--web.listen-address=:{PORT}", "--web.enable-lifecycle"],
                "ports": [{"name": "web", "containerPort": PORT}],
                "readinessProbe": {"httpGet": {"path": "/-/ready", "port": "web"}, "periodSeconds": 5},
                "resources": {"requests": {"cpu": "100m", "memory": "256Mi"}, "limits": {"memory": "1Gi"}},
                "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                                    "capabilities": {"drop": ["ALL"]}},
                "volumeMounts": [{"name": "config", "mountPath": "/etc/prometheus"},
                                 {"name": "data", "mountPath": "/prometheus"}],
            }],
            "volumes": [{"name": "config", "configMap": {"name": NAME}},
                        {"name": "data", "emptyDir": {"sizeLimit": "2Gi"}}],
        },
    }
    return [
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {**meta, "name": NAME},
         "data": {"prometheus.yml": config_text}},
        {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {**meta, "name": NAME},
         "spec": {"replicas": 1, "selector": {"matchLabels": LABELS}, "template": pod}},
        {"apiVersion": "v1", "kind": "Service", "metadata": {**meta, "name": SERVICE},
         "spec": {"selector": LABELS, "ports": [{"name": "web", "port": PORT, "targetPort": "web"}]}},
    ]


def _apply(api: Any, doc: dict[str, Any]) -> None:
    """Create ``doc``, or replace what is there (the ConfigMap's data changes; the rest stays as made)."""
    from kubernetes import client

    ns, name = doc["metadata"]["namespace"], doc["metadata"]["name"]
    core: Any = client.CoreV1Api(api)
    apps: Any = client.AppsV1Api(api)
    create, replace = {
        "ConfigMap": (core.create_namespaced_config_map, core.replace_namespaced_config_map),
        "Deployment": (apps.create_namespaced_deployment, None),
        "Service": (core.create_namespaced_service, None),
    }[doc["kind"]]
    try:
        create(ns, doc)
    except client.ApiException as err:
        if err.status != 409:
            raise
        if replace is not None:
            replace(name, ns, doc)


def start(lay: Any, selector: Mapping[str, str], namespace: str, node: str) -> None:
    """The loop that deploys and feeds the local Prometheus, as a process ``down`` stops."""
    from tools.localcluster import control

    control.start_process(lay, "prometheus-config", [
        sys.executable, "-m", "tools.localcluster.prometheus_pod", f"--kubeconfig={lay.kubeconfig}",
        f"--namespace={namespace}", f"--node={node}",
        "--selector=" + ",".join(f"{k}={v}" for k, v in sorted(selector.items()))],
        env={"PYTHONPATH": str(control.ROOT)})
    control.say(f"Prometheus for the real pods: {SERVICE}.{namespace}:{PORT}, on {node}")


def _reload(api: Any, namespace: str) -> None:
    from kubernetes import client

    core: Any = client.CoreV1Api(api)
    for pod in core.list_namespaced_pod(namespace, label_selector=f"app.kubernetes.io/instance={NAME}").items:
        if pod.status and pod.status.pod_ip:
            urllib.request.urlopen(urllib.request.Request(f"http://{pod.status.pod_ip}:{PORT}/-/reload",
                                                          method="POST"), timeout=5).close()


def main(argv: Sequence[str] | None = None) -> int:
    from kubernetes import config as kube_config

    p = argparse.ArgumentParser(prog="localcluster-prometheus", description=__doc__.splitlines()[0])
    p.add_argument("--kubeconfig", required=True)
    p.add_argument("--namespace", required=True, help="the stack's monitoring namespace")
    p.add_argument("--node", required=True, help="the real node Prometheus runs on")
    p.add_argument("--selector", default="", help="the monitors' label selector, k=v[,k=v]")
    p.add_argument("--interval", type=float, default=5.0)
    args = p.parse_args(argv)
    selector = dict(kv.split("=", 1) for kv in args.selector.split(",") if kv)
    api = kube_config.new_client_from_config(config_file=args.kubeconfig)  # type: ignore[no-untyped-call]
    written, changed_at = "", 0.0
    while True:
        try:
            monitors, pods, services, endpoints = _read(api)
            text = yaml.safe_dump(config(monitors, selector, pods, services, endpoints), sort_keys=False)
            if text != written:
                for doc in manifests(args.namespace, args.node, text):
                    _apply(api, doc)
                written, changed_at = text, time.monotonic()
                print(f"prometheus-config: {text.count('job_name')} scrape jobs", flush=True)
            # The kubelet updates a mounted ConfigMap within its sync period: reload until that has surely happened.
            if time.monotonic() - changed_at < 90:
                _reload(api, args.namespace)
        except Exception as err:  # keep going through API and Prometheus restarts; the error is in the log
            print(f"prometheus-config: {err!r}", file=sys.stderr, flush=True)
        time.sleep(args.interval)


if __name__ == "__main__":
    sys.exit(main())
