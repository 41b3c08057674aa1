"""The burst scenario end to end on real Kubernetes components (``make e2e``).

A private local cluster (own state folder and Pulumi backend) gets the local stack through the real
engine; the burst controller, the thermal guard and the descheduler run as local processes with the
configuration the stack deployed, the guard reading GPU temperatures through a real Prometheus that
scrapes a stand-in DCGM exporter. Then, with timeouts and in order: a training gang that needs every
on-prem GPU waits at the handover gate while the standby comes up on the virtual node, preempts
inference, the burst taint leaves the virtual node, inference becomes ready there, the gang starts
together and only on-prem, and the standby goes back to zero; after training ends the standby covers
the return, the taint returns as NoSchedule and the descheduler brings inference back no faster than
its per-cycle limit. A sampler checks throughout that no taint is ever NoExecute, that the gang never stays
partly placed, and that ready inference replicas never drop below the service's minReplicas.

Then the fault scenario (the health guard closing the let-it-crash loop): with a 4-node gang and inference
running, three nodes go bad at once — XID 79 on one (fatal), 80 °C on two (degraded) — under a limit of two
quarantined nodes. The fatal and one degraded node are quarantined (NoSchedule only), the third is refused and
the suppression alert fires in the real Prometheus; training leaves both quarantined nodes and Volcano restarts
the whole gang, which waits for room; inference stays on the degraded node and leaves the fatal one. The
signals clear, the fatal node gets its repair mark, both are released after probation, the gang runs again.

The external provider is the real upstream virtual-kubelet (mock provider) with a token of the provider's own
ServiceAccount: it is restarted mid-burst (its pods stay, Running as it reports them) and after the return (the
burst taint stays), its node lease must stay fresh throughout, and the audit log must show no request refused;
which of its grants it used goes to .state/localcluster/vk-rbac-usage.json.

Per-phase timings are printed and written to .state/localcluster/e2e-phases.json.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from tests.burst_e2e import (
    Cluster,
    Hooks,
    fencing_problems,
    restart_providers,
    run_burst_scenario,
    writes_by,
)
from tests.polling import wait
from tools.engine_runner import engine_available
from tools.localcluster import control, stackup, virtual_kubelet
from tools.localcluster.plan import VIRTUAL_KUBELET, Layout, load_stack_config, stack_config_values
from tools.localcluster.realcluster import BUILT, linked_state

ROOT = Path(__file__).resolve().parents[1]
PHASES_FILE = BUILT / "e2e-phases.json"
#: Phase timings of both scenarios, written together to PHASES_FILE.
PHASES: dict[str, float] = {}


def _prerequisites() -> str | None:
    missing = control.binaries_missing(Layout(BUILT))
    if missing:
        return f"local control plane not built ({', '.join(missing)}); run `make localcluster`"
    if control.binaries_missing(Layout(BUILT), control.VOLCANO):
        return "Volcano is not built (the gang scheduler); run `make localcluster`"
    if control.binaries_missing(Layout(BUILT), [VIRTUAL_KUBELET]):
        return "the virtual-kubelet (the external provider) is not built; run `make localcluster`"
    # Every engine binary, the kubernetes provider included: a build cut off by its per-run budget leaves
    # the CLI and the random provider behind, which must read as "not built", not as a failed scenario.
    if not engine_available():
        return "the Pulumi engine is not built (.state/engine: CLI and kubernetes provider); run `make engine`"
    cfg = load_stack_config(ROOT, "local")
    if cfg is None:
        return "Pulumi.local.yaml or the components package is missing"
    if not cfg.inference.services or not cfg.providers or not cfg.training.jobs:
        return "the local stack declares no inference service, provider or training job"
    return None


class FakeDcgmExporter:
    """Serves DCGM_FI_DEV_GPU_TEMP and DCGM_FI_DEV_XID_ERRORS per node (``Hostname``, as the pinned
    dcgm-exporter labels them) for Prometheus to scrape. InfiniBand series are deliberately absent: the
    guard must treat missing signals as unknown, never as unhealthy."""

    def __init__(self, nodes: list[str]) -> None:
        self.celsius = dict.fromkeys(nodes, 55.0)
        self.xid = dict.fromkeys(nodes, 0)
        exporter = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                lines = ["# TYPE DCGM_FI_DEV_GPU_TEMP gauge"]
                lines += [f'DCGM_FI_DEV_GPU_TEMP{{gpu="0",Hostname="{n}"}} {t}' for n, t in exporter.celsius.items()]
                lines += ["# TYPE DCGM_FI_DEV_XID_ERRORS gauge"]
                lines += [f'DCGM_FI_DEV_XID_ERRORS{{gpu="0",Hostname="{n}"}} {x}' for n, x in exporter.xid.items()]
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


@dataclass
class Rig:
    """The real Prometheus of the scenario, the fake exporter it scrapes, and the port the guard serves on."""

    url: str
    exporter: FakeDcgmExporter
    guard_port: int


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory) -> Iterator[Rig]:
    """A real Prometheus (the Debian package `make observability-tools` installs) scraping the fake exporter
    and the health guard, evaluating the stack's alert rules every second."""
    reason = _prerequisites()
    if reason:
        pytest.skip(reason)
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.fail("prometheus is not installed: run `make observability-tools`")
    from components.alert_rules import render_rules_yaml
    from components.observability import alert_thresholds

    cfg = load_stack_config(ROOT, "local")
    exporter = FakeDcgmExporter(cfg.pool(cfg.training.jobs[0].pool).node_names)
    guard_port = _free_port()
    home = tmp_path_factory.mktemp("prometheus")
    (home / "rules.yml").write_text(render_rules_yaml(alert_thresholds(cfg)))
    (home / "prometheus.yml").write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        f"rule_files: ['{home / 'rules.yml'}']\n"
        f"scrape_configs: [{{job_name: dcgm, static_configs: [{{targets: ['127.0.0.1:{exporter.port}']}}]}},\n"
        f"  {{job_name: health-guard, static_configs: [{{targets: ['127.0.0.1:{guard_port}']}}]}}]\n")
    port = _free_port()
    log = (home / "prometheus.log").open("w")
    proc = subprocess.Popen([binary, f"--config.file={home / 'prometheus.yml'}", f"--storage.tsdb.path={home / 'data'}",
                             f"--web.listen-address=127.0.0.1:{port}"], stdout=log, stderr=subprocess.STDOUT)
    try:
        yield Rig(f"http://127.0.0.1:{port}", exporter, guard_port)
    finally:
        proc.terminate()
        proc.wait(10)
        exporter.server.shutdown()
        log.close()


#: The guard in the scenario: polls every second, holds the temperature 3 s, probation 10 s, and may take at
#: most two nodes (of four) out: the third is the guard-rail case.
GUARD_LIMIT = 2
GUARD_PROBATION_S = 10


def guard_overrides(cfg: Any, prometheus_url: str) -> dict[str, Any]:
    from components.health_guard import settings_from_config

    signals = [s.model_dump(mode="json") | ({"hold_seconds": 3} if s.name == "gpu-temperature" else {})
               for s in settings_from_config(cfg).signals]
    return {"prometheus_url": prometheus_url, "poll_seconds": 1, "stale_after_seconds": 15,
            "probation_seconds": GUARD_PROBATION_S, "max_nodes_quarantined": GUARD_LIMIT,
            "max_nodes_per_hour": GUARD_LIMIT, "max_pool_percent_quarantined": 50,
            "max_pool_percent_per_hour": 50, "signals": signals}


@pytest.fixture(scope="module")
def stack(tmp_path_factory, prometheus):
    rig = prometheus  # the prerequisites were checked there
    lay = linked_state(tmp_path_factory.mktemp("e2e-cluster"))
    backend = tmp_path_factory.mktemp("e2e-backend")
    # The scenario submits its own gang (from the stack's job config); the stack's declared jobs stay off, or
    # one could take every GPU before inference exists and `pulumi up` would wait on the Deployment.
    raw = stack_config_values(ROOT / "Pulumi.local.yaml")
    training = dict(raw.get("training") or {})
    training["jobs"] = [{**job, "enabled": False} for job in training.get("jobs", [])]
    try:
        control.up(lay, timeout=300)
        stackup.pulumi_up(lay, "local", backend_url=f"file://{backend}", extra={"gpu-cluster:training": training})
        # The guard polls every second and holds 3 s, so the scenario need not wait minutes for a taint.
        notes = stackup.start_agents(lay, "local", guard_overrides=guard_overrides(load_stack_config(ROOT, "local"),
                                                                                   rig.url),
                                     guard_metrics_port=rig.guard_port)
        LEASES.append(LeaseWatch(lay, load_stack_config(ROOT, "local")))
        LEASES[0].start()
        yield lay, load_stack_config(ROOT, "local"), notes
    finally:
        for watch in LEASES:
            watch.stop.set()
        control.down(lay, quiet=True)


def test_burst_scenario(stack, prometheus):
    lay, cfg, notes = stack
    if any(n.startswith(("descheduler", "health-guard")) for n in notes):
        pytest.fail(f"an agent did not start: {notes}")
    c = Cluster(control.api_client(lay), cfg)
    log = lay.logs / "descheduler.log"
    hooks = Hooks(restart_provider=lambda taint, pods: restart_providers(
                      c, lambda t: virtual_kubelet.restart(lay, t), taint, pods),
                  descheduler_log=lambda: log.read_text(errors="replace") if log.exists() else "",
                  audit_log=lay.audit_log)
    run_burst_scenario(c, hooks, PHASES, _report)


def _alert_firing(url: str, name: str) -> bool:
    import urllib.request

    with urllib.request.urlopen(f"{url}/api/v1/alerts", timeout=5) as response:
        alerts = json.load(response)["data"]["alerts"]
    return any(a["labels"].get("alertname") == name and a["state"] == "firing" for a in alerts)


def _guard_metric(port: int, name: str) -> float | None:
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        for line in response.read().decode().splitlines():
            if line.startswith(name + " ") or line.startswith(name + "{"):
                return float(line.rsplit(" ", 1)[1])
    return None


def _pick_fault_nodes(nodes: list[str], inference_on: set[str]) -> tuple[str, str, str]:
    """(fatal, degraded, refused): fatal and degraded host inference, refused is any other node."""
    hosts = sorted(inference_on)
    assert len(hosts) >= 2, f"inference runs on {hosts} only; the scenario needs it on two nodes"
    fatal, degraded = hosts[0], hosts[1]
    refused = next(n for n in sorted(nodes) if n not in (fatal, degraded))
    return fatal, degraded, refused


def test_fault_scenario(stack, prometheus):
    """Fault → quarantine → gang restart from checkpoint → release, with the guard rail in between."""
    from components.training_job import TrainingJobArgs, volcano_job_spec

    lay, cfg, _ = stack
    rig: Rig = prometheus
    c = Cluster(control.api_client(lay), cfg)
    health = f"{c.prefix}/gpu-health"
    service = cfg.inference.services[0]
    job_cfg = cfg.training.jobs[0]
    pool = cfg.pool(job_cfg.pool)
    nodes = list(pool.node_names)
    assert len(nodes) == 4, "the local pool has four nodes"
    phases = PHASES
    for vcjob in c.custom.list_namespaced_custom_object(
            "batch.volcano.sh", "v1alpha1", cfg.training_namespace, "jobs")["items"]:
        c.custom.delete_namespaced_custom_object("batch.volcano.sh", "v1alpha1", cfg.training_namespace, "jobs",
                                                 vcjob["metadata"]["name"])

    def inference_nodes() -> set[str]:
        return {p.spec.node_name for p in c.inference_pods(service.name, "main")
                if c.ready(p) and p.spec.node_name in nodes}

    wait("inference ready on two or more on-prem nodes", lambda: len(inference_nodes()) >= 2, 600)

    # A 4-node gang beside inference: 5 GPUs per worker, so no two workers share a node (5 + 5 > 8).
    job = job_cfg.model_copy(update={"name": "e2e-fault-gang", "workers": 4, "gpus_per_worker": 5})
    # kwok runs no processes, so nothing restarts in place: the gang takes Volcano's whole-gang path (RestartJob on an
    # eviction), whose phases bench/sim/restart.py decomposes.
    spec = volcano_job_spec(replace(TrainingJobArgs.from_config(cfg, job), restart_in_place=None))
    c.custom.create_namespaced_custom_object("batch.volcano.sh", "v1alpha1", cfg.training_namespace, "jobs", {
        "apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job",
        "metadata": {"name": "e2e-fault-gang", "namespace": cfg.training_namespace}, "spec": spec})

    def live_gang() -> list[Any]:
        return [p for p in c.gang_pods("e2e-fault-gang") if p.metadata.deletion_timestamp is None]

    def gang_running() -> list[Any]:
        pods = live_gang()
        return pods if len(pods) == 4 and all(p.status.phase == "Running" for p in pods) else []

    wait("the 4-node gang Running", gang_running, 300)
    assert sorted(p.spec.node_name for p in gang_running()) == sorted(nodes), "one worker per node"
    first_uids = {p.metadata.uid for p in gang_running()}
    inference_before = {p.metadata.name: p.spec.node_name for p in c.inference_pods(service.name, "main")
                        if c.ready(p) and p.spec.node_name in nodes}
    fatal, degraded, refused = _pick_fault_nodes(nodes, set(inference_before.values()))

    def health_taints(node: str) -> list[tuple[str, str]]:
        return [(t.value, t.effect) for t in (c.core.read_node(node).spec.taints or []) if t.key == health]

    effects: set[str] = set()

    def sample_effects() -> None:
        for n in nodes:
            effects.update(effect for _, effect in health_taints(n))

    # Three nodes go bad within two seconds; the guard may take two. It takes the worst first, then the
    # longest firing: the refused node turns hot two polls after the degraded one.
    fault_at = time.monotonic()
    rig.exporter.xid[fatal] = 79
    rig.exporter.celsius[degraded] = 80.0
    time.sleep(2)
    rig.exporter.celsius[refused] = 80.0

    def quarantined() -> bool:
        sample_effects()
        return health_taints(fatal) == [("fatal", "NoSchedule")] and health_taints(degraded) == [
            ("degraded", "NoSchedule")]

    wait(f"{fatal} fatal and {degraded} degraded", quarantined, 120)
    phases["fault_time_to_quarantine_s"] = time.monotonic() - fault_at
    wait("the suppression alert firing", lambda: _alert_firing(rig.url, "GpuHealthGuardSuppressed"), 60)
    phases["fault_time_to_suppression_alert_s"] = time.monotonic() - fault_at
    assert health_taints(refused) == [], f"{refused} was quarantined past the limit of {GUARD_LIMIT}"
    assert _guard_metric(rig.guard_port, "gpucluster_health_breaker_tripped") == 1.0
    lease = c.coordination.read_namespaced_lease("health-guard", cfg.system_namespace)
    assert refused in (lease.metadata.annotations or {}).get(f"{c.prefix}/gpu-health-breaker", "")
    condition = next(x for x in c.core.read_node(fatal).status.conditions or [] if x.type == "GpuHealthy")
    assert (condition.status, condition.reason) == ("False", "GpuFatal"), condition

    # Training leaves both nodes at once; Volcano restarts the whole gang (new pods), which waits for room.
    def training_gone() -> bool:
        sample_effects()
        return all(p.spec.node_name not in (fatal, degraded) or p.metadata.uid not in first_uids
                   for p in live_gang())

    wait("training off the quarantined nodes", training_gone, 60)
    phases["fault_time_to_training_evicted_s"] = time.monotonic() - fault_at
    wait("the gang restarted (every first-run pod replaced)",
         lambda: not ({p.metadata.uid for p in c.gang_pods("e2e-fault-gang")} & first_uids), 120)
    phases["fault_time_to_gang_restarted_s"] = time.monotonic() - fault_at
    # Inference: it stays on the degraded node, and leaves the fatal one (through the Eviction API).
    wait(f"inference off fatal node {fatal}", lambda: fatal not in inference_nodes(), 120)
    on_degraded = [n for n, where in inference_before.items() if where == degraded]
    live = {p.metadata.name for p in c.inference_pods(service.name, "main") if p.spec.node_name == degraded}
    assert set(on_degraded) <= live, f"inference left degraded node {degraded}: {on_degraded} vs {live}"
    assert not [p for p in live_gang() if p.spec.node_name in (fatal, degraded)], "a gang pod landed on a bad node"

    # Repair: the signals clear, the fatal node gets its repair mark; both come back after probation.
    repaired_at = time.monotonic()
    rig.exporter.xid[fatal] = 0
    rig.exporter.celsius[degraded] = rig.exporter.celsius[refused] = 55.0
    c.core.patch_node(fatal, {"metadata": {"labels": {f"{c.prefix}/gpu-repaired": "e2e"}}})

    def released(node: str) -> bool:
        sample_effects()
        return health_taints(node) == []

    wait(f"{degraded} released after probation", lambda: released(degraded), 120)
    phases["fault_time_to_release_degraded_s"] = time.monotonic() - repaired_at
    wait(f"{fatal} released (repair mark + probation)", lambda: released(fatal), 120)
    phases["fault_time_to_release_fatal_s"] = time.monotonic() - repaired_at
    assert time.monotonic() - repaired_at >= GUARD_PROBATION_S - 1, "released before the probation ended"
    wait("the gang running again on all four nodes", gang_running, 300)
    phases["fault_time_to_gang_running_again_s"] = time.monotonic() - fault_at
    assert {p.spec.node_name for p in gang_running()} == set(nodes)
    assert effects == {"NoSchedule"}, f"health taint effects seen: {effects}"

    # A person resets the breaker (the documented command, as an API call): the guard acts again.
    c.coordination.patch_namespaced_lease("health-guard", cfg.system_namespace, {
        "metadata": {"annotations": {f"{c.prefix}/gpu-health-breaker": None}}})
    wait("the breaker reset", lambda: _guard_metric(rig.guard_port, "gpucluster_health_breaker_tripped") == 0.0, 30)
    c.custom.delete_namespaced_custom_object("batch.volcano.sh", "v1alpha1", cfg.training_namespace, "jobs",
                                             "e2e-fault-gang")
    _report(phases)


def _report(phases: dict[str, float]) -> None:
    PHASES_FILE.parent.mkdir(parents=True, exist_ok=True)
    PHASES_FILE.write_text(json.dumps(phases, indent=2, sort_keys=True) + "\n")
    print("\nscenario phases:", json.dumps(phases, indent=2, sort_keys=True))


# --------------------------------------------------------------------------- the provider's real virtual kubelet

#: Which grants of the providers' RBAC the real virtual kubelet used, never used, or lacked (written by make e2e).
RBAC_USAGE_FILE = BUILT / "vk-rbac-usage.json"
#: Grants the scenario does not exercise that the provider keeps (components/providers.py says why): client-go's
#: LIST fallback where the API server cannot stream a watch's initial list, and the patch of a repeated event.
KEPT_UNEXERCISED = {("list", "pods"), ("list", "configmaps"), ("list", "secrets"), ("list", "services"),
                    ("patch", "events")}
#: Taints the node lifecycle controller puts on a node that stops reading Ready.
CONDITION_TAINTS = ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable")
#: The watch over the virtual nodes, running from the stack's deployment to the end of the module.
LEASES: list[LeaseWatch] = []


class LeaseWatch(threading.Thread):
    """Twice a second: how old each virtual node's Lease is, whether the node reads Ready, and any taint the
    node lifecycle controller put on it."""

    def __init__(self, lay: Layout, cfg: Any) -> None:
        super().__init__(daemon=True)
        self.c = Cluster(control.api_client(lay), cfg)
        self.nodes = [p.node_name for p in cfg.providers]
        self.stop = threading.Event()
        self.max_age = 0.0
        self.duration = 0
        self.samples = 0
        self.not_ready = 0
        self.condition_taints: set[str] = set()
        self.errors: list[str] = []

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                for name in self.nodes:
                    lease = self.c.coordination.read_namespaced_lease(name, "kube-node-lease")
                    self.max_age = max(self.max_age, time.time() - lease.spec.renew_time.timestamp())
                    self.duration = lease.spec.lease_duration_seconds
                    node = self.c.core.read_node(name)
                    if not any(x.type == "Ready" and x.status == "True" for x in node.status.conditions or []):
                        self.not_ready += 1
                    self.condition_taints |= {f"{t.key}:{t.effect}" for t in node.spec.taints or []
                                              if t.key in CONDITION_TAINTS}
                self.samples += 1
            except Exception as err:  # keep watching through API hiccups, report them at the end
                self.errors.append(repr(err))
            self.stop.wait(0.5)


def test_virtual_kubelet_provider(stack):
    """The real virtual kubelet registered its node as the stack's provider config declares it, kept its node
    lease fresh through both scenarios (and its restarts), and was refused nothing: the provider's RBAC is
    enough. Which grants it used and never used is written to RBAC_USAGE_FILE."""
    from kubernetes.utils import parse_quantity

    from tools.localcluster.plan import plan_from_config
    from tools.localcluster.rbac_usage import parse_audit, usage

    lay, cfg, _ = stack
    c = Cluster(control.api_client(lay), cfg)
    plan = plan_from_config(cfg, "Pulumi.local.yaml")
    specs = {n.name: n for n in plan.by_kind("virtual")}
    for t in virtual_kubelet.targets(cfg):
        node, spec = c.core.read_node(t.node), specs[t.node]
        assert (VIRTUAL_KUBELET, "Update") in {(m.manager, m.operation) for m in node.metadata.managed_fields}
        assert {k: node.metadata.labels.get(k) for k in spec.labels} == dict(spec.labels)
        assert {(x.key, x.value, x.effect) for x in spec.taints} <= {
            (x.key, x.value, x.effect) for x in node.spec.taints or []}
        want = {"cpu": str(spec.cpu), "memory": f"{spec.memory_gi}Gi", "pods": str(spec.pods),
                "ephemeral-storage": f"{spec.ephemeral_storage_gi}Gi", plan.gpu_resource: str(spec.gpus)}
        assert {k: parse_quantity(node.status.allocatable.get(k, "0")) for k in want} == {
            k: parse_quantity(v) for k, v in want.items()}

    (watch,) = LEASES
    PHASES["vk_lease_max_age_s"] = round(watch.max_age, 1)
    PHASES["vk_not_ready_samples"] = watch.not_ready
    _report(PHASES)
    assert watch.samples > 60 and watch.duration > 0, (watch.samples, watch.errors[:3])
    assert watch.max_age < watch.duration, f"a lease {watch.max_age:.1f}s old (duration {watch.duration}s)"

    report: dict[str, Any] = {}
    text = lay.audit_log.read_text()
    denied: list[str] = []
    idle: dict[str, list[Any]] = {}
    used: set[tuple[str | None, str, str, str]] = set()
    pods_served: dict[str, int] = {}
    for t in virtual_kubelet.targets(cfg):
        requests = parse_audit(text, str(lay.audit_log), user=t.user)
        result = usage(virtual_kubelet.granted(lay, t), requests)
        report[t.provider] = result.report()
        denied += result.report()["denied"]
        # Who creates the virtual node is a race: the stack's label NodePatch (server-side apply) creates it when
        # the virtual kubelet has not registered yet. The kubelet first updates its node's status and creates the
        # node only on a 404, so a kubelet whose first request on its node succeeded found it there and never
        # needed ``create nodes``. The grant stays for the other order: a kubelet that starts first must create it.
        first = next((r for r in requests if r.resource in ("nodes", "nodes/status") and r.name == t.node), None)
        found_node = first is not None and 200 <= first.code < 300
        report[t.provider]["first_node_request"] = first.describe() if first else None
        idle[t.provider] = [g for g in result.unused if (g.verb, g.resource) not in KEPT_UNEXERCISED
                            and not ((g.verb, g.resource) == ("create", "nodes") and found_node)]
        used |= {_grant_kind(g) for g in result.used}
        pods_served[t.provider] = sum(1 for r in requests if r.resource == "pods/status" and r.allowed)
    report["lease"] = {"max_age_s": watch.max_age, "duration_s": watch.duration, "not_ready_samples": watch.not_ready,
                       "condition_taints": sorted(watch.condition_taints)}
    RBAC_USAGE_FILE.write_text(json.dumps(report, indent=2) + "\n")
    print("\nvirtual kubelet RBAC usage:", json.dumps(report, indent=2))
    assert not denied, f"the virtual kubelet was refused: {denied}"
    # Least privilege: every other grant was used by the real binary in these scenarios. Every provider gets the
    # same grants; the burst fills the cheapest first, so a dearer one may serve no pod and leave the pod grants
    # idle. Those are judged on the provider that served pods: a grant no provider used is one too many.
    busiest = max(pods_served, key=lambda p: pods_served[p])
    assert pods_served[busiest] > 0, pods_served
    never = sorted({g.describe() for gs in idle.values() for g in gs if _grant_kind(g) not in used})
    assert not never, f"grants no virtual kubelet used: {never}"
    assert not idle[busiest], f"grants the virtual kubelet that served the pods never used: {idle[busiest]}"
    idle_elsewhere = {p: [g.describe() for g in gs] for p, gs in idle.items() if gs}
    assert all(pods_served[p] == 0 for p in idle_elsewhere), (idle_elsewhere, pods_served)


def _grant_kind(grant: Any) -> tuple[str | None, str, str, str]:
    """A grant without the role that holds it or the names it is limited to (each provider's own node)."""
    return (grant.namespace, grant.group, grant.resource, grant.verb)


# --------------------------------------------------------------------------- fencing: a frozen leader writes nothing

def start_standby(lay: Layout, cfg: Any, agent: str, config: Path) -> control.Proc:
    """A second replica of an agent, as the same ServiceAccount, identity ``standby``."""
    from tools.localcluster import agent_identity

    script = stackup._console_script(agent)
    kubeconfig = agent_identity.agent_kubeconfig(lay, cfg.system_namespace, agent)
    assert script and kubeconfig, f"{agent}: console script or ServiceAccount missing"
    return control.start_process(lay, f"{agent}-standby", [
        script, "--config", str(config), "--kubeconfig", str(kubeconfig), "--metrics-port", str(_free_port()),
        "--identity", "standby"])


def freeze_leader_and_let_the_standby_act(lay: Layout, c: Cluster, agent: str, standby_config: Path,
                                          fault: Any, acted: Any, lease_s: float) -> tuple[list[str], list[str]]:
    """SIGSTOP the leader (identity ``localcluster``); raise ``fault`` once the standby leads; wait until it
    ``acted``; SIGCONT the old leader and let it run. Returns the writes of both after the fault."""
    leader = control.load_proc(lay, agent)
    assert leader is not None and leader.alive(), f"{agent} is not running"
    wait(f"{agent} leading", lambda: c.lease_holder(agent) == "localcluster", 60)
    standby = start_standby(lay, c.cfg, agent, standby_config)
    try:
        os.kill(leader.pid, signal.SIGSTOP)
        try:
            wait(f"the standby {agent} taking the lease", lambda: c.lease_holder(agent) == "standby",
                 lease_s * 3)
            fault_at = time.time()
            fault()
            wait(f"the standby {agent} acting on the fault", acted, 120)
        finally:
            woke_at = time.time()
            os.kill(leader.pid, signal.SIGCONT)
        time.sleep(6)  # several passes of the woken leader's loops (guard polls 1 s, controller ticks 5 s)
        audit = lay.audit_log
        assert fencing_problems(audit, agent, c.cfg.system_namespace) == []
        return writes_by(audit, agent, "localcluster", woke_at), writes_by(audit, agent, "standby", fault_at)
    finally:
        control.stop_process(lay, standby)
        wait(f"{agent} leading again after the standby released", lambda: c.lease_holder(agent) == "localcluster",
             lease_s * 3)


def test_a_frozen_health_guard_writes_nothing_after_the_standby_took_over(stack, prometheus):
    lay, cfg, _ = stack
    rig: Rig = prometheus
    c = Cluster(control.api_client(lay), cfg)
    node = cfg.pool(cfg.training.jobs[0].pool).node_names[0]
    health = f"{c.prefix}/gpu-health"
    settings = stackup.deployed_guard_settings(lay, {**guard_overrides(cfg, rig.url), "max_nodes_per_hour": 10,
                                                     "max_nodes_quarantined": 4, "max_pool_percent_per_hour": 100,
                                                     "max_pool_percent_quarantined": 100})
    assert settings is not None
    config = lay.state / "health-guard-standby.json"
    config.write_text(settings)

    def tainted() -> bool:
        return any(t.key == health for t in c.core.read_node(node).spec.taints or [])

    try:
        old, new = freeze_leader_and_let_the_standby_act(
            lay, c, "health-guard", config, lambda: rig.exporter.celsius.update({node: 80.0}), tainted, 30)
    finally:
        rig.exporter.celsius[node] = 55.0
    assert old == [], f"the woken leader wrote after losing its lease: {old}"
    assert new.count(f"patch nodes {node}") == 1, new  # the standby quarantined the node once
    wait(f"{node} released", lambda: not tainted(), 120)


def test_a_frozen_burst_controller_writes_nothing_after_the_standby_took_over(stack):
    lay, cfg, _ = stack
    c = Cluster(control.api_client(lay), cfg)
    wait("the burst closed", lambda: len(c.burst_taints()) == len(c.virtual_nodes()), 120)
    node = c.virtual_nodes()[0].metadata.name

    def opened_by_hand() -> None:  # a person lifts the taint while the burst is closed: the leader closes it
        taints = [{"key": t.key, "value": t.value, "effect": t.effect}
                  for t in c.core.read_node(node).spec.taints or [] if t.key != c.burst_key]
        c.core.patch_node(node, {"spec": {"taints": taints}})

    def closed_again() -> bool:
        return any(t.key == c.burst_key for t in c.core.read_node(node).spec.taints or [])

    old, new = freeze_leader_and_let_the_standby_act(
        lay, c, "burst-controller", lay.state / "burst-controller.yaml", opened_by_hand, closed_again, 15)
    assert old == [], f"the woken leader wrote after losing its lease: {old}"
    assert new.count(f"patch nodes {node}") == 1, new  # the standby closed it once
