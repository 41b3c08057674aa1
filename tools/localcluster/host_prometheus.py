"""Prometheus for the real nodes' pods, on the host, scraping what the stack's monitors ask for.

With real nodes the stack's exporters run for real (dcgm-exporter's stand-in and the InfiniBand exporter on the real
GPU nodes, the agents on the system node), but the local cluster has no prometheus-operator yet to turn the stack's
ServiceMonitors and PodMonitors into a scrape configuration. This loop does its part: every few seconds it reads
the monitors (those the stack's ``monitorLabels`` select) and the real pods behind them (their Services' endpoints
for a ServiceMonitor, their named container ports for a PodMonitor) from the API server, writes the configuration
the operator would generate (:mod:`tools.scrape_path`), and has Prometheus (Debian's package) reload it when it
changed. Prometheus listens on the API server's address, which the real nodes' pods reach (their own node), so the
health guard queries it as it would the in-cluster one (``realnodes.stack_overrides`` points the stack at it).

kwok's pods have no real address and are left out: nothing answers there.
"""

from __future__ import annotations

import argparse
import ipaddress
import sys
import time
import urllib.request
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from tools.localcluster.realnodes import APISERVER_IP, HOST_PROMETHEUS_PORT, POD_SUPERNET
from tools.scrape_path import Target, prometheus_config, scrape_jobs, selected_monitors

PORT = HOST_PROMETHEUS_PORT
URL = f"http://{APISERVER_IP}:{PORT}"
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


def start(lay: Any, selector: Mapping[str, str]) -> bool:
    """Prometheus on :data:`URL` and the loop that keeps its configuration, as processes ``down`` stops; False (and a
    warning) where Debian's prometheus is not installed (``make observability-tools``): then nothing is scraped."""
    import shutil

    from tools.localcluster import control

    binary = shutil.which("prometheus")
    if binary is None:
        control.say("warning: prometheus is not installed (make observability-tools); the real pods are not scraped "
                    "and the health guard sees no signal")
        return False
    conf = lay.run / "host-prometheus.yml"
    conf.write_text(yaml.safe_dump(prometheus_config([], [], interval="5s"), sort_keys=False))
    control.start_process(lay, "host-prometheus", [
        binary, f"--config.file={conf}", f"--web.listen-address={APISERVER_IP}:{PORT}", "--web.enable-lifecycle",
        f"--storage.tsdb.path={lay.state / 'host-prometheus'}", "--storage.tsdb.retention.time=1d"])
    control.start_process(lay, "host-prometheus-config", [
        sys.executable, "-m", "tools.localcluster.host_prometheus", f"--kubeconfig={lay.kubeconfig}",
        f"--config={conf}", "--selector=" + ",".join(f"{k}={v}" for k, v in sorted(selector.items()))],
        env={"PYTHONPATH": str(control.ROOT)})
    control.say(f"host Prometheus on {URL}, scraping the real pods the stack's monitors select")
    return True


def main(argv: Sequence[str] | None = None) -> int:
    from kubernetes import config as kube_config

    p = argparse.ArgumentParser(prog="localcluster-host-prometheus", description=__doc__.splitlines()[0])
    p.add_argument("--kubeconfig", required=True)
    p.add_argument("--config", type=Path, required=True, help="the Prometheus configuration file to keep current")
    p.add_argument("--selector", default="", help="the monitors' label selector, k=v[,k=v]")
    p.add_argument("--interval", type=float, default=5.0)
    args = p.parse_args(argv)
    selector = dict(kv.split("=", 1) for kv in args.selector.split(",") if kv)
    api = kube_config.new_client_from_config(config_file=args.kubeconfig)  # type: ignore[no-untyped-call]
    while True:
        try:
            monitors, pods, services, endpoints = _read(api)
            text = yaml.safe_dump(config(monitors, selector, pods, services, endpoints), sort_keys=False)
            if not args.config.exists() or args.config.read_text() != text:
                args.config.write_text(text)
                urllib.request.urlopen(urllib.request.Request(f"{URL}/-/reload", method="POST"), timeout=5).close()
                print(f"host-prometheus: configuration reloaded ({text.count('job_name')} jobs)", flush=True)
        except Exception as err:  # keep going through API and Prometheus restarts; the error is in the log
            print(f"host-prometheus: {err!r}", file=sys.stderr, flush=True)
        time.sleep(args.interval)


if __name__ == "__main__":
    sys.exit(main())
