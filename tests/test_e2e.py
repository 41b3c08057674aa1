"""The burst scenario end to end on real Kubernetes components (``make e2e``).

A private local cluster (own state folder and Pulumi backend) gets the local stack through the real
engine; the burst controller, the thermal guard and the descheduler run as local processes with the
configuration the stack deployed, the guard reading GPU temperatures through a real Prometheus that
scrapes a stand-in DCGM exporter. Then, with timeouts and in order: a training gang that needs every
on-prem GPU waits at the handover gate while the standby comes up on the virtual node, preempts
inference, the burst taint leaves the virtual node, inference becomes ready there, the gang starts
together and only on-prem, and the standby goes back to zero; after training ends the standby covers
the return, the taint returns as NoSchedule and the descheduler brings inference back no faster than
its per-cycle limit. Finally a GPU reported hot trips the thermal taint and a new pod cannot land there.
A sampler checks throughout that no taint is ever NoExecute, that the gang never stays partly placed, and
that ready inference replicas never drop below the service's minReplicas.

Per-phase timings are printed and written to .state/localcluster/e2e-phases.json.
"""

from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from tools.localcluster import control, stackup
from tools.localcluster.plan import Layout, load_stack_config, stack_config_values

ROOT = Path(__file__).resolve().parents[1]
BUILT = ROOT / ".state" / "localcluster"
PHASES_FILE = BUILT / "e2e-phases.json"
#: The longest a gang may look partly placed or running: one bind round plus kwok starting each pod.
GANG_SETTLE_S = 5.0


def _prerequisites() -> str | None:
    missing = control.binaries_missing(Layout(BUILT))
    if missing:
        return f"local control plane not built ({', '.join(missing)}); run `make localcluster`"
    if control.binaries_missing(Layout(BUILT), control.VOLCANO):
        return "Volcano is not built (the gang scheduler); run `make localcluster`"
    if not stackup.ENGINE_BIN.exists() or not any((stackup.ENGINE_BIN.parents[1] / "providers").iterdir()):
        return "the Pulumi engine is not built (.state/engine: CLI and kubernetes provider); run `make engine`"
    cfg = load_stack_config(ROOT, "local")
    if cfg is None:
        return "Pulumi.local.yaml or the components package is missing"
    if not cfg.inference.services or not cfg.providers or not cfg.training.jobs:
        return "the local stack declares no inference service, provider or training job"
    return None


class FakeDcgmExporter:
    """Serves DCGM_FI_DEV_GPU_TEMP per node (the label the pinned dcgm-exporter uses) for Prometheus to scrape."""

    def __init__(self, nodes: list[str]) -> None:
        self.celsius = dict.fromkeys(nodes, 55.0)
        exporter = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                lines = ["# TYPE DCGM_FI_DEV_GPU_TEMP gauge"]
                lines += [f'DCGM_FI_DEV_GPU_TEMP{{gpu="0",Hostname="{n}"}} {t}' for n, t in exporter.celsius.items()]
                body = ("\n".join(lines) + "\n").encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory) -> Iterator[tuple[str, FakeDcgmExporter]]:
    """A real Prometheus (the Debian package `make observability-tools` installs) scraping the fake exporter."""
    reason = _prerequisites()
    if reason:
        pytest.skip(reason)
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.fail("prometheus is not installed: run `make observability-tools`")
    cfg = load_stack_config(ROOT, "local")
    exporter = FakeDcgmExporter(cfg.pool(cfg.training.jobs[0].pool).node_names)
    home = tmp_path_factory.mktemp("prometheus")
    (home / "prometheus.yml").write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        f"scrape_configs: [{{job_name: dcgm, static_configs: [{{targets: ['127.0.0.1:{exporter.port}']}}]}}]\n")
    port = _free_port()
    log = (home / "prometheus.log").open("w")
    proc = subprocess.Popen([binary, f"--config.file={home / 'prometheus.yml'}", f"--storage.tsdb.path={home / 'data'}",
                             f"--web.listen-address=127.0.0.1:{port}"], stdout=log, stderr=subprocess.STDOUT)
    try:
        yield f"http://127.0.0.1:{port}", exporter
    finally:
        proc.terminate()
        proc.wait(10)
        exporter.server.shutdown()
        log.close()


@pytest.fixture(scope="module")
def stack(tmp_path_factory, prometheus):
    prometheus_url, _ = prometheus  # the prerequisites were checked there
    state = tmp_path_factory.mktemp("e2e-cluster")
    (state / "bin").symlink_to(BUILT / "bin")
    (state / "crd").symlink_to(BUILT / "crd")
    backend = tmp_path_factory.mktemp("e2e-backend")
    lay = Layout(state)
    # The scenario submits its own gang (from the stack's job config); the stack's declared jobs stay off, or
    # one could take every GPU before inference exists and `pulumi up` would wait on the Deployment.
    raw = stack_config_values(ROOT / "Pulumi.local.yaml")
    training = dict(raw.get("training") or {})
    training["jobs"] = [{**job, "enabled": False} for job in training.get("jobs", [])]
    try:
        control.up(lay, timeout=300)
        stackup.pulumi_up(lay, "local", backend_url=f"file://{backend}", extra={"gpu-cluster:training": training})
        # The guard polls every second and holds 3 s, so the scenario need not wait minutes for a taint.
        notes = stackup.start_agents(lay, "local", guard_overrides={
            "prometheus_url": prometheus_url, "poll_seconds": 1})
        yield lay, load_stack_config(ROOT, "local"), notes
    finally:
        control.down(lay, quiet=True)


class Cluster:
    """Thin reads over the API for the assertions."""

    def __init__(self, lay: Layout, cfg: Any) -> None:
        from kubernetes import client

        api = control.api_client(lay)
        self.core = client.CoreV1Api(api)
        self.custom = client.CustomObjectsApi(api)
        self.cfg = cfg
        self.prefix = cfg.label_prefix
        self.burst_key = f"{cfg.label_prefix}/burst"

    def location(self) -> dict[str, str]:
        return {n.metadata.name: (n.metadata.labels or {}).get(f"{self.prefix}/location", "")
                for n in self.core.list_node().items}

    def virtual_nodes(self) -> list[Any]:
        names = {p.node_name for p in self.cfg.providers}
        return [n for n in self.core.list_node().items if n.metadata.name in names]

    def inference_pods(self, service: str, role: str | None = None) -> list[Any]:
        """Live pods of the service: every replica, or only `main` (the HPA's) or `standby` ones."""
        sel = f"{self.prefix}/service={service}"
        if role == "standby":
            sel += f",{self.prefix}/role=standby"
        elif role == "main":
            sel += f",!{self.prefix}/role"
        pods = self.core.list_namespaced_pod(self.cfg.inference_namespace, label_selector=sel).items
        return [p for p in pods if p.metadata.deletion_timestamp is None]

    @staticmethod
    def ready(pod: Any) -> bool:
        return any(c.type == "Ready" and c.status == "True" for c in (pod.status.conditions or []))

    def ready_by_location(self, service: str, role: str | None = None) -> dict[str, int]:
        loc = self.location()
        out: dict[str, int] = {}
        for p in self.inference_pods(service, role):
            if self.ready(p):
                where = loc.get(p.spec.node_name or "", "?")
                out[where] = out.get(where, 0) + 1
        return out

    def burst_taints(self) -> list[Any]:
        return [t for n in self.virtual_nodes() for t in (n.spec.taints or []) if t.key == self.burst_key]

    def gang_pods(self, job: str) -> list[Any]:
        sel = f"volcano.sh/job-name={job}"
        return self.core.list_namespaced_pod(self.cfg.training_namespace, label_selector=sel).items


def wait(what: str, check, timeout: float) -> float:
    started = time.monotonic()
    last = None
    while time.monotonic() - started < timeout:
        last = check()
        if last:
            return time.monotonic() - started
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout:.0f}s: {what} (last: {last!r})")


class Sampler(threading.Thread):
    """Samples ready inference replicas, burst taint effects and gang start state twice a second."""

    def __init__(self, cluster: Cluster, service: str, job: str, workers: int) -> None:
        super().__init__(daemon=True)
        self.c, self.service, self.job, self.workers = cluster, service, job, workers
        self.stop = threading.Event()
        self.min_ready = 10**9
        #: The scenario's current phase (set by the test) and the fewest ready replicas sampled in each.
        self.phase = "preempt"
        self.min_by_phase: dict[str, int] = {}
        self.effects: set[str] = set()
        #: Samples with part of the gang placed or running: (seconds since it began, bound, running).
        self.partial_gang: list[tuple[float, int, int]] = []
        self.partial_since: float | None = None
        self.longest_partial = 0.0
        self.errors: list[str] = []
        #: When the standby first had minReplicas ready, and when a gang pod was first bound to a node.
        self.standby_ready_at: float | None = None
        self.gang_bound_at: float | None = None

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                now = time.monotonic()
                ready = sum(self.c.ready_by_location(self.service).values())
                standby = sum(self.c.ready_by_location(self.service, "standby").values())
                if self.standby_ready_at is None and standby >= self.c.cfg.handover_services.get(self.service, 0) > 0:
                    self.standby_ready_at = now
                gang = self.c.gang_pods(self.job)
                if self.gang_bound_at is None and any(p.spec.node_name for p in gang):
                    self.gang_bound_at = now
                self.min_ready = min(self.min_ready, ready)
                self.min_by_phase[self.phase] = min(self.min_by_phase.get(self.phase, ready), ready)
                self.effects |= {t.effect for t in self.c.burst_taints()}
                # Gang: never part of it placed or running for longer than a bind round and kwok's start of
                # each pod (the scheduler binds the whole gang in one session; kwok starts pods one by one).
                # Only until the job is ended: its pods then go away one by one.
                live = [p for p in gang if p.metadata.deletion_timestamp is None]
                bound = sum(1 for p in live if p.spec.node_name)
                running = sum(1 for p in live if p.status.phase == "Running")
                partial = self.phase == "preempt" and (0 < bound < self.workers or 0 < running < self.workers)
                if partial:
                    self.partial_since = now if self.partial_since is None else self.partial_since
                    self.partial_gang.append((round(now - self.partial_since, 1), bound, running))
                    self.longest_partial = max(self.longest_partial, now - self.partial_since)
                else:
                    self.partial_since = None
            except Exception as err:  # keep sampling through API hiccups, report them at the end
                self.errors.append(repr(err))
            time.sleep(0.5)


def _evictions_per_cycle(log: Path) -> list[int]:
    text = log.read_text(errors="replace") if log.exists() else ""
    return [int(m) for m in re.findall(r'"Number of evictions[^"]*"[^\n]*?totalEvicted=(\d+)', text)]


def test_burst_scenario(stack, prometheus):
    from components.training_job import TrainingJobArgs, volcano_job_spec

    lay, cfg, notes = stack
    _, exporter = prometheus
    c = Cluster(lay, cfg)
    service = cfg.inference.services[0]
    minimum = service.min_replicas
    job_cfg = cfg.training.jobs[0]
    phases: dict[str, float] = {}
    if any(n.startswith(("descheduler", "health-guard")) for n in notes):
        pytest.fail(f"an agent did not start: {notes}")
    assert cfg.handover_services == {service.name: minimum}, "the local stack runs the make-before-break handover"

    # The scenario starts with inference only (a gang left from elsewhere would skew it).
    for vcjob in c.custom.list_namespaced_custom_object(
            "batch.volcano.sh", "v1alpha1", cfg.training_namespace, "jobs")["items"]:
        c.custom.delete_namespaced_custom_object("batch.volcano.sh", "v1alpha1", cfg.training_namespace, "jobs",
                                                 vcjob["metadata"]["name"])

    phases["inference_ready_onprem_s"] = wait(
        f"{minimum} ready replicas of {service.name} on-prem",
        lambda: c.ready_by_location(service.name, "main").get("onprem", 0) >= minimum, 300)
    wait("the burst taint on every virtual node", lambda: len(c.burst_taints()) == len(cfg.providers), 120)

    # A gang that needs every on-prem GPU; its pods start behind the handover gate (the stack's template).
    nodes = len(cfg.pool(job_cfg.pool).node_names)
    job = job_cfg.model_copy(update={"name": "e2e-gang", "workers": nodes,
                                     "gpus_per_worker": cfg.pool(job_cfg.pool).gpus_per_node})
    spec = volcano_job_spec(TrainingJobArgs.from_config(cfg, job))
    assert spec["tasks"][0]["template"]["spec"]["schedulingGates"] == [{"name": f"{c.prefix}/handover"}]
    sampler = Sampler(c, service.name, "e2e-gang", nodes)
    sampler.start()
    started = time.monotonic()
    c.custom.create_namespaced_custom_object("batch.volcano.sh", "v1alpha1", cfg.training_namespace, "jobs", {
        "apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job",
        "metadata": {"name": "e2e-gang", "namespace": cfg.training_namespace}, "spec": spec})

    def standby_ready() -> int:
        return sum(c.ready_by_location(service.name, "standby").values())

    try:
        wait(f"{minimum} standby replicas ready on the virtual node",
             lambda: c.ready_by_location(service.name, "standby").get("external", 0) >= minimum, 180)
        phases["time_to_standby_ready_s"] = time.monotonic() - started
        wait("inference preempted from on-prem",
             lambda: c.ready_by_location(service.name, "main").get("onprem", 0) == 0, 180)
        phases["time_to_preempt_s"] = time.monotonic() - started
        wait("the burst taint leaves the virtual node", lambda: not c.burst_taints(), 180)
        phases["time_to_open_s"] = time.monotonic() - started
        wait("inference ready on the virtual node",
             lambda: c.ready_by_location(service.name, "main").get("external", 0) >= minimum, 180)
        phases["time_to_ready_external_s"] = time.monotonic() - started

        def gang_running():
            pods = c.gang_pods("e2e-gang")
            return len(pods) == nodes and all(p.status.phase == "Running" for p in pods) and pods

        wait("the whole gang Running", gang_running, 180)
        phases["time_to_gang_running_s"] = time.monotonic() - started
        loc = c.location()
        pods = c.gang_pods("e2e-gang")
        assert all(loc[p.spec.node_name] == "onprem" for p in pods), [p.spec.node_name for p in pods]
        # The standby only bridged the handover: it goes back to zero once the main replicas are ready.
        wait("the standby back to zero after the handover", lambda: not c.inference_pods(service.name, "standby"), 120)
        phases["time_to_standby_gone_s"] = time.monotonic() - started

        # Training ends: the standby covers the return, the taint comes back (NoSchedule), inference comes home.
        ended = time.monotonic()
        sampler.phase = "return"
        c.custom.delete_namespaced_custom_object("batch.volcano.sh", "v1alpha1", cfg.training_namespace, "jobs",
                                                 "e2e-gang")
        wait("the burst taint back on the virtual node", lambda: len(c.burst_taints()) == len(cfg.providers), 300)
        phases["time_to_close_s"] = time.monotonic() - ended
        assert {t.effect for t in c.burst_taints()} == {"NoSchedule"}
        assert standby_ready() >= minimum, "the burst closed before the standby covered the replicas going home"
        wait("inference back on-prem",
             lambda: c.ready_by_location(service.name, "main").get("external", 0) == 0
             and c.ready_by_location(service.name, "main").get("onprem", 0) >= minimum, 600)
        phases["time_to_return_s"] = time.monotonic() - ended
        wait("the standby back to zero after the return", lambda: not c.inference_pods(service.name, "standby"), 120)
        phases["time_to_return_standby_gone_s"] = time.monotonic() - ended
    finally:
        sampler.stop.set()
        sampler.join(5)
        for phase, fewest in sampler.min_by_phase.items():
            phases[f"min_ready_{phase}"] = fewest
        _report(phases)
        print("fewest ready inference replicas per phase:", sampler.min_by_phase)

    assert sampler.effects <= {"NoSchedule"}, f"burst taint effects seen: {sampler.effects}"
    phases["longest_partial_gang_s"] = sampler.longest_partial
    _report(phases)
    assert sampler.longest_partial <= GANG_SETTLE_S, (
        f"part of the gang placed or running for {sampler.longest_partial:.1f}s: {sampler.partial_gang[:10]}")
    # Make before break: no gang pod was bound before the standby had minReplicas ready.
    assert sampler.standby_ready_at is not None and sampler.gang_bound_at is not None
    assert sampler.gang_bound_at >= sampler.standby_ready_at, (
        f"a gang pod was bound {sampler.standby_ready_at - sampler.gang_bound_at:.1f}s before the standby was ready")
    cycles = _evictions_per_cycle(lay.logs / "descheduler.log")
    limit = min(cfg.descheduler.max_pods_total, cfg.descheduler.max_pods_per_node)
    assert cycles and max(cycles) <= limit, f"evictions per descheduler cycle {cycles}, limit {limit}"
    # Ready replicas never below the minimum, in either direction of the handover.
    assert sampler.min_ready >= minimum, (
        f"ready {service.name} replicas dropped to {sampler.min_ready} (minReplicas {minimum}); "
        f"fewest per phase: {sampler.min_by_phase}; sampler errors: {sampler.errors[:3]}")

    # A GPU reported hot: the guard taints its node, and a pod that does not tolerate it cannot land there.
    hot = cfg.pool(job_cfg.pool).node_names[0]
    exporter.celsius[hot] = float(cfg.observability.thermal_threshold_celsius + 10)
    reported = time.monotonic()
    thermal_key = f"{c.prefix}/thermal"

    def hot_taint() -> list[Any]:
        return [t for t in (c.core.read_node(hot).spec.taints or []) if t.key == thermal_key]

    wait(f"the thermal taint on {hot}", hot_taint, 120)
    phases["time_to_thermal_taint_s"] = time.monotonic() - reported
    assert [(t.value, t.effect) for t in hot_taint()] == [("hot", "NoSchedule")]
    probe = {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "e2e-hot-probe", "namespace": cfg.inference_namespace,
                     "annotations": {"scheduling.volcano.sh/queue-name": cfg.scheduling.inference_queue.name}},
        "spec": {
            "schedulerName": cfg.scheduling.scheduler_name,
            "priorityClassName": cfg.priorities.inference.name,
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [hot]}]}]}}},
            "tolerations": [{"key": f"{c.prefix}/pool", "operator": "Exists", "effect": "NoSchedule"}],
            "containers": [{"name": "probe", "image": "registry.gpucluster.io/probe:1.0.0",
                            "resources": {"limits": {cfg.gpu_resource: "1"}, "requests": {cfg.gpu_resource: "1"}}}],
        },
    }
    c.core.create_namespaced_pod(cfg.inference_namespace, probe)
    try:
        time.sleep(10)  # several scheduling cycles of both schedulers
        pod = c.core.read_namespaced_pod("e2e-hot-probe", cfg.inference_namespace)
        assert not pod.spec.node_name, f"a pod that does not tolerate {thermal_key} landed on hot node {hot}"
    finally:
        c.core.delete_namespaced_pod("e2e-hot-probe", cfg.inference_namespace, grace_period_seconds=0)
        _report(phases)


def _report(phases: dict[str, float]) -> None:
    PHASES_FILE.parent.mkdir(parents=True, exist_ok=True)
    PHASES_FILE.write_text(json.dumps(phases, indent=2, sort_keys=True) + "\n")
    print("\nburst scenario phases:", json.dumps(phases, indent=2, sort_keys=True))
