"""A small GPU cluster's exporters behind the scrape path the stack declares, scraped by a real Prometheus.

The monitors (ServiceMonitors, PodMonitors), Services and pod templates come from the rendered local stack;
:mod:`tools.scrape_path` turns the monitors into the scrape jobs prometheus-operator would generate, with
targets that carry the Kubernetes discovery labels of the pods the stack's workloads would create. Behind
each target runs the real exporter code where we own it — the ib-exporter on a fake sysfs tree, the health
guard's, the burst controller's and the training runtime's registries — and, for what we do not own, a
stand-in that serves the upstream exposition exactly: dcgm-exporter 4.2 (its label set, the types of our
counters CSV, values with DCGM's units) and kube-state-metrics (scraped with ``honorLabels`` as
kube-prometheus declares it). Debian's Prometheus scrapes them every second; :class:`World` then holds
the label sets that arrived.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from threading import Thread
from typing import Any

import yaml
from prometheus_client import CollectorRegistry, start_http_server

from agents.burst_controller.metrics import Metrics as BurstMetrics
from agents.health_guard.metrics import GuardMetrics
from agents.ib_exporter.collector import InfiniBandCollector
from agents.ib_exporter.exposition import serve as serve_ib
from components import dcgm_counters
from components.mockrt import RunResult
from components.naming import Keys
from components.observability import kube_state_label
from fakes.ib_sysfs import full_node
from tools.localcluster.dcgm_standin import Gpu, dcgm_exposition, label_text
from tools.scrape_path import Target, prometheus_config, scrape_jobs, selected_monitors
from training_runtime.metrics import TrainingMetrics

MONITOR_LABELS = {"release": "platform"}
"""The stack's ``observability.monitorLabels`` in this world: the Prometheus selects monitors by them."""
GPU_NODES = ("gpu-a", "gpu-b")
SYSTEM_NODES = ("cpu-1", "cpu-2")
#: The local stack's GPU pool, and the system pool's default name (the ``<prefix>/pool`` label of the nodes).
GPU_POOL, SYSTEM_POOL = "local-gpu", "system"
EXTERNAL_NODE = "vk-ext-1"
INFERENCE = ("inference", "sd-0")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# ---------------------------------------------------------------------------------------------- stand-ins


def serve_text(text: str, port: int) -> ThreadingHTTPServer:
    """Serve ``text`` as ``/metrics`` (the Prometheus text format 0.0.4)."""
    body = text.encode()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            return

    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    Thread(target=server.serve_forever, daemon=True).start()
    return server


def kube_state_exposition(keys: Keys, taint_key: str, pods: list[tuple[str, str, str, str, str]]) -> str:
    """kube-state-metrics' series the rules, panels and dashboard variables join on; ``pods`` are (namespace,
    pod, node, workload, job or ""). The node and pod labels are the ones the stack asks kube-state-metrics to allow:
    pool and location on nodes, workload and (training) job on pods."""
    workload, location = kube_state_label(keys.workload), kube_state_label(keys.location)
    pool, job = kube_state_label(keys.pool), kube_state_label(keys.job)
    lines = ["# TYPE kube_pod_labels gauge", "# TYPE kube_pod_info gauge", "# TYPE kube_node_labels gauge",
             "# TYPE kube_node_spec_taint gauge"]
    for namespace, pod, node, kind, gang in pods:
        uid = f"uid-{pod}"
        pod_labels = {"namespace": namespace, "pod": pod, "uid": uid, workload: kind, **({job: gang} if gang else {})}
        lines.append(f"kube_pod_labels{label_text(pod_labels)} 1")
        lines.append("kube_pod_info" + label_text({
            "namespace": namespace, "pod": pod, "uid": uid, "host_ip": "10.0.0.1", "pod_ip": "10.88.0.9",
            "node": node, "created_by_kind": "ReplicaSet", "created_by_name": pod.rsplit("-", 1)[0],
            "priority_class": "", "host_network": "false"}) + " 1")
    pools = {**dict.fromkeys(GPU_NODES, GPU_POOL), **dict.fromkeys(SYSTEM_NODES, SYSTEM_POOL)}
    for node, where in [*((n, "onprem") for n in (*GPU_NODES, *SYSTEM_NODES)), (EXTERNAL_NODE, "external")]:
        in_pool = {pool: pools[node]} if node in pools else {}
        lines.append(f"kube_node_labels{label_text({'node': node, location: where, **in_pool})} 1")
    lines.append("kube_node_spec_taint" + label_text(
        {"node": EXTERNAL_NODE, "key": taint_key, "value": "true", "effect": "NoSchedule"}) + " 1")
    return "\n".join(lines) + "\n"


def kube_state_monitor(namespace: str) -> dict[str, Any]:
    """kube-state-metrics' ServiceMonitor as kube-prometheus declares it (``honorLabels``: its labels are the
    objects it describes)."""
    return {"apiVersion": "monitoring.coreos.com/v1", "kind": "ServiceMonitor",
            "metadata": {"name": "kube-state-metrics", "namespace": namespace, "labels": dict(MONITOR_LABELS)},
            "spec": {"selector": {"matchLabels": {"app.kubernetes.io/name": "kube-state-metrics"}},
                     "endpoints": [{"port": "http-metrics", "honorLabels": True, "interval": "30s"}]}}


# ---------------------------------------------------------------------------------------------- the world


@dataclass(frozen=True)
class PodShape:
    labels: dict[str, str]
    container: str
    port_name: str


def pod_shape(template: Mapping[str, Any]) -> PodShape:
    """Labels, and the container and port named ``metrics`` (or the first named port), of a pod template."""
    labels = dict(template.get("metadata", {}).get("labels") or {})
    for container in template["spec"]["containers"]:
        for port in container.get("ports") or []:
            if port.get("name") == "metrics":
                return PodShape(labels, container["name"], "metrics")
    raise LookupError(f"no container port named metrics in the template with labels {labels}")


def service_for(result: RunResult, namespace: str, pod_labels: Mapping[str, str]) -> tuple[str, dict[str, str]]:
    """The stack's Service in ``namespace`` whose selector picks pods with ``pod_labels``, and its labels."""
    for svc in result.by_kind("Service"):
        selector = (svc.inputs.get("spec") or {}).get("selector") or {}
        if svc.metadata.get("namespace") == namespace and selector and all(
                pod_labels.get(k) == v for k, v in selector.items()):
            return str(svc.metadata["name"]), dict(svc.metadata.get("labels") or {})
    return "", {}


@dataclass
class World:
    result: RunResult
    prometheus_url: str
    jobs: list[dict[str, Any]]
    ignored_monitors: list[str]
    series: list[dict[str, str]] = field(default_factory=list)
    targets: list[dict[str, Any]] = field(default_factory=list)

    def query(self, promql: str) -> list[dict[str, Any]]:
        url = f"{self.prometheus_url}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
        with urllib.request.urlopen(url, timeout=10) as response:
            payload = json.load(response)
        assert payload["status"] == "success", payload
        return list(payload["data"]["result"])

    def arrived(self, metric: str) -> list[dict[str, str]]:
        """Label sets (without ``__name__``) of ``metric`` as they arrived."""
        return [{k: v for k, v in s.items() if k != "__name__"} for s in self.series if s["__name__"] == metric]


def _workload(result: RunResult, kind: str, name: str) -> tuple[str, Mapping[str, Any]]:
    obj = result.one(kind, name)
    spec = obj.inputs["spec"]
    template = spec["tasks"][0]["template"] if kind == "Job" else spec["template"]
    return str(obj.metadata["namespace"]), template


def build(result: RunResult, workdir: Path, keys: Keys, heartbeat_metric: str, taint_key: str
          ) -> Iterator[World]:
    """Start every exporter and Prometheus; yield the world once every target has been scraped; stop all."""
    servers: list[Any] = []
    targets: list[Target] = []

    def add(kind: str, name: str, pods: list[tuple[str, str]], start: Any) -> None:
        namespace, template = _workload(result, kind, name)
        shape = pod_shape(template)
        service, service_labels = service_for(result, namespace, shape.labels)
        for index, (pod, node) in enumerate(pods):
            port = free_port()
            servers.append(start(index, pod, node, port))
            targets.append(Target(address=f"127.0.0.1:{port}", namespace=namespace, pod=pod,
                                  container=shape.container, node=node, port_name=shape.port_name,
                                  pod_labels=shape.labels, service=service, service_labels=service_labels))

    train_ns, train_template = _workload(result, "Job", "smoke-gang")
    train_container = pod_shape(train_template).container
    workers = [(f"smoke-gang-worker-{i}", GPU_NODES[i]) for i in range(2)]
    owners = {
        GPU_NODES[0]: (Gpu(0, (train_ns, workers[0][0], train_container)),
                       Gpu(1, (train_ns, workers[0][0], train_container)),
                       Gpu(2, (INFERENCE[0], INFERENCE[1], "server")), Gpu(3)),
        GPU_NODES[1]: (Gpu(0, (train_ns, workers[1][0], train_container)), Gpu(1)),
    }
    counters = dcgm_counters.render()
    add("DaemonSet", "dcgm-exporter", [(f"dcgm-exporter-{n}", n) for n in GPU_NODES],
        lambda i, pod, node, port: serve_text(dcgm_exposition(
            node, owners[node], counters, {g.index: {"xid": 94} for g in owners[node]}), port))

    def ib(i: int, pod: str, node: str, port: int) -> Any:
        root = workdir / f"sysfs-{node}"
        full_node(str(root), hcas=1)
        return serve_ib(InfiniBandCollector(str(root)), "127.0.0.1", port)[0]

    add("DaemonSet", "ib-exporter", [(f"ib-exporter-{n}", n) for n in GPU_NODES], ib)

    def guard(i: int, pod: str, node: str, port: int) -> Any:
        m = GuardMetrics()
        m.leader.set(1 if i == 0 else 0)
        if i == 0:
            m.node_quarantined.labels(node=GPU_NODES[0], **{"class": "degraded"}).set(1)
            m.node_quarantined.labels(node=GPU_NODES[1], **{"class": "fatal"}).set(1)
            m.quarantined.labels(**{"class": "degraded", "pool": GPU_POOL}).set(1)
            m.pool_share.labels(pool=GPU_POOL).set(0.5)
            m.gang_restarts.labels(namespace=train_ns, job="smoke-gang", pool=GPU_POOL, node=GPU_NODES[0],
                                   cause="guard").inc()
            m.gang_restarts.labels(namespace=train_ns, job="other-gang", pool=GPU_POOL, node=GPU_NODES[1],
                                   cause="guard").inc()
            m.gang_restarts.labels(namespace=train_ns, job="smoke-gang", pool=GPU_POOL, node="",
                                   cause="application").inc()
            m.firing.labels(signal="gpu-temperature").set(1)
            m.evictions.labels(workload="training", result="evicted").inc()
            m.suppressed.labels(pool=GPU_POOL).inc()
            m.taints.labels(**{"class": "degraded", "pool": GPU_POOL}).inc()
            m.between_failures.labels(pool=GPU_POOL).observe(3600)
            m.switch_faults.labels(leaf="leaf-l1").set(1)
        return start_http_server(port, addr="127.0.0.1", registry=m.registry)[0]

    add("Deployment", "health-guard", [(f"health-guard-7d9f-{c}", SYSTEM_NODES[k]) for k, c in enumerate("ab")],
        guard)

    def burst(i: int, pod: str, node: str, port: int) -> Any:
        m = BurstMetrics(CollectorRegistry())
        m.leader.set(1 if i == 0 else 0)
        return start_http_server(port, addr="127.0.0.1", registry=m.registry)[0]

    add("Deployment", "burst-controller", [(f"burst-controller-5c6b-{c}", SYSTEM_NODES[k])
                                          for k, c in enumerate("ab")], burst)

    def trainer(i: int, pod: str, node: str, port: int) -> Any:
        m = TrainingMetrics(heartbeat_metric, rank=i, clock=lambda: 1_700_000_000.0)
        m.step_done(100)
        m.checkpoint_duration.set(12.5)
        return start_http_server(port, addr="127.0.0.1", registry=m.registry)[0]

    add("Job", "smoke-gang", workers, trainer)

    ksm_port = free_port()
    pods = [*((train_ns, w, n, "training", "smoke-gang") for w, n in workers),
            (INFERENCE[0], INFERENCE[1], GPU_NODES[0], "inference", ""),
            (INFERENCE[0], "sd-1", EXTERNAL_NODE, "inference", "")]
    servers.append(serve_text(kube_state_exposition(keys, taint_key, pods), ksm_port))
    ksm_labels = {"app.kubernetes.io/name": "kube-state-metrics"}
    targets.append(Target(address=f"127.0.0.1:{ksm_port}", namespace="monitoring", pod="kube-state-metrics-0",
                          container="kube-state-metrics", node=SYSTEM_NODES[0], port_name="http-metrics",
                          pod_labels=ksm_labels, service="kube-state-metrics", service_labels=ksm_labels))

    monitors = [r.inputs for r in (*result.by_kind("ServiceMonitor"), *result.by_kind("PodMonitor"))]
    picked, ignored = selected_monitors([*monitors, kube_state_monitor("monitoring")], MONITOR_LABELS)
    jobs = [job for monitor in picked for job in scrape_jobs(monitor, targets)]
    config = workdir / "prometheus.yml"
    config.write_text(yaml.safe_dump(prometheus_config(jobs, []), sort_keys=False))
    binary = shutil.which("prometheus")
    assert binary is not None, "prometheus missing: run `make observability-tools` (Debian's prometheus package)"
    port = free_port()
    log = (workdir / "prometheus.log").open("w")
    proc = subprocess.Popen([binary, f"--config.file={config}", f"--storage.tsdb.path={workdir / 'tsdb'}",
                             f"--web.listen-address=127.0.0.1:{port}"], stdout=log, stderr=subprocess.STDOUT)
    world = World(result, f"http://127.0.0.1:{port}", jobs, ignored)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                active = _get(world, "/api/v1/targets")["activeTargets"]
                # Three scrapes each: rate() over the panels' windows needs at least two samples.
                if active and all(t["health"] == "up" for t in active) and _scrapes_done(world, 3):
                    break
            except OSError:
                pass
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError(f"Prometheus did not scrape every target; log {workdir / 'prometheus.log'}")
            time.sleep(0.5)
        world.targets = _get(world, "/api/v1/targets")["activeTargets"]
        world.series = [s["metric"] for s in world.query('{__name__=~".+"}')]
        yield world
    finally:
        proc.terminate()
        proc.wait(timeout=20)
        log.close()
        for server in servers:
            server.shutdown()


def _get(world: World, path: str) -> Any:
    with urllib.request.urlopen(world.prometheus_url + path, timeout=5) as response:
        return json.load(response)["data"]


def _scrapes_done(world: World, count: int) -> bool:
    samples = world.query(f"min(count_over_time(up[1m])) >= {count}")
    return bool(samples)
