"""``make up REAL_NODES=1`` end to end: ``pulumi up`` of the local stack with every agent in the stack's own pods.

The local cluster starts with its real nodes (the stack's system node is a real kubelet), and the real engine
deploys the local stack to it. Nothing runs beside it as a harness process: the burst controller, the health guard,
the provider's virtual-kubelet (its serving-cert init container first) and the descheduler's CronJob run from the
images ``make images`` built, on the real system node. The test then asks the cluster what they did: every
Deployment's replicas are Ready there with the images the stack names, the virtual kubelet registered its node with
the capacity the stack gave it (GPUs included) and the provider's taint, renews that node's lease, and runs the
standby; a Job made from the descheduler's CronJob runs to completion; ``kubectl logs`` of the virtual kubelet comes
through the API server from the real kubelet.

The burst scenario of the process harness runs on top (tests/burst_e2e.py), with its agents in these pods: the burst
controller's leading pod is deleted while the standby comes up for the gang, and the provider is restarted by deleting
its pod. The health guard's leading pod is deleted while a released node waits out its probation. Each time the other
replica takes the Lease and carries on, and no action is done twice (the audit log and the controller's Events).

The real GPU nodes are the stack's pool ``real-gpu`` there (``realnodes.stack_overrides``): a researcher's
``gpucluster train submit`` puts the reference trainer (the ``training-runtime`` image) on both as one Volcano gang,
checkpointing to the stack's own checkpoint claim, each rank under the training runtime's supervisor. A rank's worker
is killed (restarted in place: same pods), a rank's container is killed (Volcano restarts the whole gang) and a pod is
evicted (Volcano replaces that pod alone, the others wait in theirs); each time the gang resumes from its newest
complete checkpoint.

Figures go to ``.state/localcluster/e2e-stack-in-pods.json`` for ``bench_e2e``.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agents.node_taints import spare_taint_key
from components import images
from tests.burst_e2e import Cluster, Hooks, fencing_problems, restart_providers, run_burst_scenario, writes_by
from tests.polling import first_times, wait
from tests.realnode_support import (
    BUILT,
    child_pids,
    container_pid,
    delete_the_leader,
    deployed_settings,
    private_state,
    prometheus_get,
    ready_pods,
    why_not,
)
from tests.test_controller_isolation import restricted_problems
from tools.chaos.training import INTERVAL, STEP_S, gang_spec, read_events, round_of
from tools.engine_runner import engine_available
from tools.image_local import (
    LOCAL_REGISTRY,
    PROMETHEUS_CONFIG_RELOADER_IMAGE,
    PROMETHEUS_IMAGE,
    PROMETHEUS_OPERATOR_IMAGE,
)
from tools.localcluster import control, nodehost, prometheus_operator, stackup, virtual_kubelet
from tools.localcluster.plan import Layout, load_plan, load_stack_config
from tools.localcluster.realcluster import serve_gpu_readings
from tools.localcluster.realnodes import (
    IMAGES_BY_KIND,
    POD_SUPERNET,
    REAL_GPU_NODES,
    REAL_GPU_POOL,
    REAL_GPU_SPARES,
    REAL_GPUS_PER_NODE,
    real_nodes_for,
)

ROOT = Path(__file__).resolve().parents[1]
FIGURES = BUILT / "e2e-stack-in-pods.json"
SYSTEM_NODE = real_nodes_for(load_plan(ROOT, "local"))[0].name
#: Harness processes that would stand in for a pod; none may run.
STAND_INS = ("burst-controller", "health-guard", "descheduler", "virtual-kubelet")
figures: dict[str, Any] = {}


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Layout]:
    with nodehost.host_lock():  # held before the host is judged: another holder's nodes are not "another cluster"
        reason = why_not((*IMAGES_BY_KIND["system"], *IMAGES_BY_KIND["gpu"])) or (
            None if engine_available() else "the Pulumi engine is not built (.state/engine); run `make engine`")
        if reason:
            pytest.skip(reason)
        state = private_state("gpucl-pods")
        backend = tmp_path_factory.mktemp("stack-in-pods-backend")
        lay = Layout(state)
        try:
            started = time.monotonic()
            control.up(lay, timeout=300, real_nodes=True)
            figures["cluster_up_s"] = round(time.monotonic() - started, 1)
            started = time.monotonic()
            stackup.pulumi_up(lay, "local", backend_url=f"file://{backend}", in_pods=True)
            figures["pulumi_up_s"] = round(time.monotonic() - started, 1)
            yield lay
        finally:
            control.down(lay, quiet=True)
            FIGURES.parent.mkdir(parents=True, exist_ok=True)
            FIGURES.write_text(json.dumps(figures, indent=2, sort_keys=True))
            shutil.rmtree(state, ignore_errors=True)


def _apis(lay: Layout) -> tuple[Any, Any, Any]:
    from kubernetes import client

    api = control.api_client(lay)
    return client.CoreV1Api(api), client.AppsV1Api(api), client.BatchV1Api(api)


def _system_namespace() -> str:
    cfg = load_stack_config(ROOT, "local")
    assert cfg is not None
    return cfg.system_namespace


def test_pulumi_up_runs_every_agent_in_its_pods_and_nothing_beside_them(stack: Layout) -> None:
    core, apps, _ = _apis(stack)
    ns = _system_namespace()
    deployments = {d.metadata.name: d for d in apps.list_namespaced_deployment(ns).items}
    providers = {t.app for t in virtual_kubelet.targets(load_stack_config(ROOT, "local"))}
    assert len(providers) >= 2 and {"burst-controller", "health-guard", *providers} <= set(deployments), sorted(
        deployments)
    for name, dep in deployments.items():
        assert dep.status.ready_replicas == dep.spec.replicas, (name, dep.status)
    pods = [p for p in core.list_namespaced_pod(ns).items if p.status.phase == "Running"]
    assert {p.spec.node_name for p in pods} == {SYSTEM_NODE}
    ran = {c.image for p in pods for c in p.spec.containers}
    assert images.VIRTUAL_KUBELET_MOCK in ran, ran
    figures["agent_pods_running"] = sorted(p.metadata.name.rsplit("-", 2)[0] for p in pods)
    alive = [p.name for p in control.recorded(stack) if p.alive() and p.name.startswith(STAND_INS)]
    assert alive == [], f"harness processes standing in for pods: {alive}"


def _prom_get(stack: Layout, path: str, **params: str) -> Any:
    return prometheus_get(stack, _monitoring_namespace(), path, **params)


def _monitoring_namespace() -> str:
    cfg = load_stack_config(ROOT, "local")
    assert cfg is not None
    return cfg.monitoring_namespace


def test_prometheus_operator_runs_prometheus_on_the_stacks_monitors_and_rules(stack: Layout) -> None:
    """prometheus-operator, in its pod, turned the Prometheus resource into a StatefulSet (admitted under the monitoring
    namespace's restricted level) behind ``prometheus-operated``, and its generated configuration scrapes the stack's
    ServiceMonitors' real pods and loads the stack's PrometheusRules, which Prometheus evaluates."""
    from kubernetes import client

    core, apps, _ = _apis(stack)
    ns = _monitoring_namespace()
    started = time.monotonic()
    wait("the operator's Prometheus StatefulSet Ready",
         lambda: (apps.read_namespaced_stateful_set_status(f"prometheus-{prometheus_operator.NAME}", ns).status
                  .ready_replicas or 0) >= 1, 300, ignore=(client.ApiException,))
    figures["prometheus_ready_after_up_s"] = round(time.monotonic() - started, 1)
    operator = apps.read_namespaced_deployment(prometheus_operator.OPERATOR, ns)
    assert operator.status.ready_replicas == 1
    assert operator.spec.template.spec.containers[0].image == PROMETHEUS_OPERATOR_IMAGE
    pod = core.read_namespaced_pod(f"prometheus-{prometheus_operator.NAME}-0", ns)
    assert pod.spec.node_name == SYSTEM_NODE
    raw = control.api_client(stack).sanitize_for_serialization(pod.spec)
    assert restricted_problems(raw) == [], raw
    images_ran = {c.image for c in pod.spec.containers}
    assert images_ran == {PROMETHEUS_IMAGE, PROMETHEUS_CONFIG_RELOADER_IMAGE}, images_ran
    service = core.read_namespaced_service(prometheus_operator.SERVICE, ns)
    assert service.metadata.labels.get("operated-prometheus") == "true", service.metadata.labels

    # Every ServiceMonitor of the stack has its real pods' endpoints scraped, up, through the operator's jobs.
    custom = client.CustomObjectsApi(control.api_client(stack))
    monitors = custom.list_cluster_custom_object("monitoring.coreos.com", "v1", "servicemonitors")["items"]
    jobs = {f"serviceMonitor/{m['metadata']['namespace']}/{m['metadata']['name']}/0" for m in monitors}
    assert len(jobs) >= 4, jobs

    seen: dict[str, Any] = {}

    def real_targets_up() -> dict[str, list[str]]:
        active = _prom_get(stack, "/api/v1/targets", state="active")["activeTargets"]
        up: dict[str, list[str]] = {}
        for t in active:
            if t["scrapePool"] in jobs and t["labels"]["instance"].startswith(f"{POD_SUPERNET}.") \
                    and t["health"] == "up":
                up.setdefault(t["scrapePool"], []).append(t["labels"]["instance"])
        seen["last"] = sorted((t["scrapePool"], t["labels"].get("instance"), t["health"], t.get("lastError", ""))
                              for t in active if t["labels"].get("instance", "").startswith(f"{POD_SUPERNET}."))
        return up if set(up) == jobs else {}

    try:
        wait("every ServiceMonitor's real pods scraped and up", real_targets_up, 300, ignore=(OSError,))
    except AssertionError as err:
        raise AssertionError(f"{err}; jobs {sorted(jobs)}; real targets {seen.get('last')}") from None
    figures["prometheus_jobs_up"] = sorted(real_targets_up())

    # The stack's PrometheusRules are loaded, as the operator wrote them, and evaluated without errors.
    rules = custom.list_cluster_custom_object("monitoring.coreos.com", "v1", "prometheusrules")["items"]
    declared = {g["name"] for r in rules for g in r["spec"]["groups"]}
    assert declared, rules

    def evaluated() -> list[dict[str, Any]]:
        groups = [g for g in _prom_get(stack, "/api/v1/rules")["groups"] if g["name"] in declared]
        done = {g["name"] for g in groups if all(not r["lastEvaluation"].startswith("0001") for r in g["rules"])}
        return groups if done == declared else []

    wait("Prometheus evaluates every rule group of the stack", evaluated, 120, ignore=(OSError,))
    groups = evaluated()
    unhealthy = [(g["name"], r["name"], r.get("lastError")) for g in groups for r in g["rules"] if r["health"] != "ok"]
    assert unhealthy == []
    figures["prometheus_rules_loaded"] = sum(len(g["rules"]) for g in groups)


@pytest.mark.parametrize("index", [0, 1])
def test_each_virtual_kubelet_pod_registers_its_node_with_the_stacks_capacity(stack: Layout, index: int) -> None:
    core, _, _ = _apis(stack)
    cfg = load_stack_config(ROOT, "local")
    assert cfg is not None
    provider = cfg.providers[index]
    target = virtual_kubelet.targets(cfg)[index]
    node = core.read_node(provider.node_name)
    assert node.status.allocatable["nvidia.com/gpu"] == str(provider.gpus), node.status.allocatable
    taints = {(t.key, t.value, t.effect) for t in node.spec.taints or []}
    assert ("virtual-kubelet.io/provider", provider.name, "NoSchedule") in taints, taints
    assert node.metadata.labels["gpucluster.io/location"] == "external"
    ready = next(c for c in node.status.conditions if c.type == "Ready")
    assert ready.status == "True", ready
    # The node's heartbeat lease is renewed by the pod: its renew time moves.
    from kubernetes import client

    leases = client.CoordinationV1Api(control.api_client(stack))
    first = leases.read_namespaced_lease(provider.node_name, "kube-node-lease").spec.renew_time
    wait("the virtual kubelet pod renews its node lease",
         lambda: leases.read_namespaced_lease(provider.node_name, "kube-node-lease").spec.renew_time != first, 60)
    # Its log comes through the API server from the real kubelet that runs it.
    ns = _system_namespace()
    (pod,) = [p for p in core.list_namespaced_pod(ns, label_selector=f"app.kubernetes.io/name={target.app}").items
              if p.status.phase == "Running"]
    log = core.read_namespaced_pod_log(pod.metadata.name, ns, container="virtual-kubelet", tail_lines=200)
    assert "provider=mock" in log, log[-2000:]


def test_a_descheduler_job_from_its_cronjob_runs_to_completion(stack: Layout) -> None:
    from kubernetes import client

    _, _, batch = _apis(stack)
    ns = _system_namespace()
    (cron,) = [c for c in batch.list_namespaced_cron_job(ns).items if c.metadata.name == "descheduler"]
    job = client.V1Job(metadata=client.V1ObjectMeta(name="descheduler-now", namespace=ns),
                       spec=cron.spec.job_template.spec)
    batch.create_namespaced_job(ns, job)
    started = time.monotonic()
    wait("the descheduler Job succeeds on the real system node",
         lambda: (batch.read_namespaced_job_status("descheduler-now", ns).status.succeeded or 0) >= 1, 180)
    figures["descheduler_job_s"] = round(time.monotonic() - started, 1)
    failed = batch.read_namespaced_job_status("descheduler-now", ns).status.failed
    assert not failed, f"{failed} descheduler pods failed"


class DeschedulerLogs(threading.Thread):
    """The log of every descheduler Job pod the stack's CronJob ran, read as each one ends (the CronJob keeps only
    its last three Jobs, fewer than the scenario's cycles)."""

    def __init__(self, lay: Layout, namespace: str) -> None:
        super().__init__(daemon=True)
        self.core, self.namespace = _apis(lay)[0], namespace
        self.logs: dict[str, str] = {}
        self.stop = threading.Event()

    def collect(self) -> None:
        for pod in self.core.list_namespaced_pod(self.namespace).items:
            name = pod.metadata.name
            if name.startswith("descheduler-") and name not in self.logs and pod.status.phase in ("Succeeded",
                                                                                                  "Failed"):
                self.logs[name] = self.core.read_namespaced_pod_log(name, self.namespace)

    def run(self) -> None:
        while not self.stop.wait(10):
            try:
                self.collect()
            except Exception:  # an API hiccup or a pod gone between list and read: the next pass reads the rest
                continue

    def text(self) -> str:
        self.collect()
        return "\n".join(self.logs[name] for name in sorted(self.logs))


def _restart_provider_pod(stack: Layout, target: Any) -> float:
    """Delete the provider's virtual-kubelet pod; seconds until its replacement is Ready and renewed the node's
    lease (its Deployment is one replica, Recreate: one process owns a node)."""
    from kubernetes import client

    core, _, _ = _apis(stack)
    leases = client.CoordinationV1Api(control.api_client(stack))
    old = {p.metadata.name for p in core.list_namespaced_pod(
        target.namespace, label_selector=f"app.kubernetes.io/name={target.app}").items}
    started, after = time.monotonic(), time.time()
    for name in old:
        core.delete_namespaced_pod(name, target.namespace)

    def renewed() -> bool:
        fresh = [p for p in ready_pods(stack, target.namespace, target.app) if p.metadata.name not in old]
        lease = leases.read_namespaced_lease(target.node, "kube-node-lease").spec
        return bool(fresh) and bool(lease.renew_time) and lease.renew_time.timestamp() > after

    wait(f"a new {target.app} pod Ready, renewing {target.node}'s lease", renewed, 120)
    return time.monotonic() - started


def test_the_burst_scenario_with_every_agent_in_its_pod_and_the_burst_controllers_leader_deleted_mid_handover(
        stack: Layout) -> None:
    """The burst scenario of the process harness (tests/burst_e2e.py), with the burst controller, the descheduler
    (its CronJob's Jobs) and the provider's virtual kubelet in the stack's pods: the burst controller's leading pod
    is deleted while the standby is coming up for the gang, and the other replica carries the handover on (nothing
    done twice, no replica lost); the provider is restarted by deleting its pod, mid-burst and after the return."""
    cfg = load_stack_config(ROOT, "local", real_nodes=True)
    assert cfg is not None
    c = Cluster(control.api_client(stack), cfg)
    ns = cfg.system_namespace
    logs = DeschedulerLogs(stack, ns)
    logs.start()

    def delete_the_burst_leader() -> dict[str, float]:
        old, new, failover = delete_the_leader(stack, ns, "burst-controller", deployed_settings(stack, ns,
                                                                                                "burst-controller"))
        figures["burst_leaders_mid_handover"] = [old, new]
        return {"burst_leader_failover_s": failover}

    phases: dict[str, float] = {}
    hooks = Hooks(restart_provider=lambda taint, pods: restart_providers(
                      c, lambda t: _restart_provider_pod(stack, t), taint, pods),
                  descheduler_log=logs.text, audit_log=stack.audit_log, mid_handover=delete_the_burst_leader)
    try:
        run_burst_scenario(c, hooks, phases, lambda ph: figures.update(burst_scenario=dict(ph)))
    finally:
        logs.stop.set()
    figures.setdefault("leader_failover_s", {})["burst-controller"] = phases["burst_leader_failover_s"]


GPUCLUSTER = ROOT / ".venv" / "bin" / "gpucluster"
GANG = "real-gang"
#: The reference trainer: long enough to be crashed and evicted mid-run (a checkpoint every INTERVAL steps).
STEPS = 240


#: Workers of the gang: the pool but its warm spare, which replaces the node the guard takes out.
WORKERS = len(REAL_GPU_NODES) - REAL_GPU_SPARES


def _gang_spec(path: Path, name: str = GANG, steps: int = STEPS) -> Path:
    path.write_text(json.dumps(gang_spec(name, f"{LOCAL_REGISTRY}/training-runtime:{images.AGENT_VERSION}", steps,
                                         WORKERS, REAL_GPUS_PER_NODE, REAL_GPU_POOL, max_retries=5)))
    return path


def _events(stack: Layout, gang: str = GANG) -> list[dict[str, Any]]:
    return read_events(stack.volumes, gang)


def _gang_pods(core: Any, ns: str, gang: str = GANG) -> list[Any]:
    items = core.list_namespaced_pod(ns, label_selector=f"volcano.sh/job-name={gang}").items
    return [p for p in items if p.metadata.deletion_timestamp is None]


def _steps(events: list[dict[str, Any]], round_: int, kind: str = "step") -> list[dict[str, Any]]:
    return [e for e in events if e["event"] == kind and round_of(e) == round_]


def _training(stack: Layout, round_: int, gang: str = GANG) -> bool:
    """Every rank stepped in ``round_``."""
    return len({e["rank"] for e in _steps(_events(stack, gang), round_)}) == WORKERS


def _first_training_after(stack: Layout, after: int, gang: str = GANG) -> int | None:
    """The first round past ``after`` in which every rank stepped, if any."""
    rounds = sorted({round_of(e) for e in _events(stack, gang)} - set(range(after + 1)))
    return next((r for r in rounds if _training(stack, r, gang)), None)


def _gang_diagnosis(stack: Layout, gang: str) -> str:
    """What a gang that does not train again looks like: its supervisors' files, its events' tail, its pods and
    the Volcano Job's status, and each pod's log tail."""
    from kubernetes import client

    out = [f"supervisor {path.name}: {path.read_text()}"
           for path in sorted(stack.volumes.glob(f"*/{gang}/.supervise/*/r*.json"))]
    out += [f"event {json.dumps(e)}" for e in _events(stack, gang)[-12:]]
    core, _, _ = _apis(stack)
    ns = "training"
    for pod in core.list_namespaced_pod(ns, label_selector=f"volcano.sh/job-name={gang}").items:
        out.append(f"pod {pod.metadata.name} {pod.status.phase} node={pod.spec.node_name} "
                   f"deleting={pod.metadata.deletion_timestamp is not None} "
                   f"attempt={(pod.metadata.annotations or {}).get('volcano.sh/job-retry-count')}")
        try:
            out.append(core.read_namespaced_pod_log(pod.metadata.name, ns, tail_lines=15))
        except client.ApiException as exc:
            out.append(f"(no log: {exc.reason})")
    job = client.CustomObjectsApi(control.api_client(stack)).get_namespaced_custom_object(
        "batch.volcano.sh", "v1alpha1", ns, "jobs", gang)
    out.append(f"job status: {json.dumps(job.get('status'))}")
    return "\n".join(out)


def _restart(stack: Layout, after: int, cause: str, gang: str = GANG,
             started: float | None = None) -> dict[str, float | int]:
    """Wait for the gang to train in a round past ``after`` (every rank stepped); what the restart cost since
    ``started`` (now by default): the steps between the furthest any rank reached since ``after`` began and the
    resume, and the round."""
    started = time.monotonic() if started is None else started
    try:
        wait(f"the gang trains again after the {cause}",
             lambda: _first_training_after(stack, after, gang) is not None, 300)
    except AssertionError as timed_out:
        raise AssertionError(f"{timed_out}\n{_gang_diagnosis(stack, gang)}") from None
    new = _first_training_after(stack, after, gang)
    assert new is not None
    events = _events(stack, gang)
    # The work this fault undid: from the furthest step of the round it broke (and of any round that started but
    # never trained whole) back to the resume. A round before it may have reached further, but that work was
    # already lost to the restart that ended it, and counted there.
    reached = [e["step"] for e in events if e["event"] == "step" and after <= round_of(e) < new]
    before = max(reached or [e["step"] for e in events if e["event"] == "step" and round_of(e) <= after])
    (resumed,) = {e["step"] for e in events if e["event"] == "resume" and round_of(e) == new}
    return {"lost_steps": before - resumed, "resumed_at_step": resumed, "round": new,
            "waited_s": round(time.monotonic() - started, 1)}


def test_a_researchers_gang_trains_on_both_real_gpu_nodes_and_resumes_after_a_crash_and_an_eviction(
        stack: Layout, tmp_path: Path) -> None:
    from kubernetes import client

    core, _, _ = _apis(stack)
    cfg = load_stack_config(ROOT, "local")
    assert cfg is not None
    ns = cfg.training_namespace
    env = {**os.environ, "KUBECONFIG": str(stack.kubeconfig), "NO_COLOR": "1", "COLUMNS": "200"}
    out = subprocess.run([str(GPUCLUSTER), "train", "submit", str(_gang_spec(tmp_path / "gang.json"))], env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    submitted = time.monotonic()
    assert f"in pool {REAL_GPU_POOL}" in out.stdout, out.stdout

    wait("every rank of the gang trains on the real GPU nodes", lambda: _training(stack, 0), 300)
    gang = {"first_step_s": round(time.monotonic() - submitted, 1)}
    pods = _gang_pods(core, ns)
    nodes = [p.spec.node_name for p in pods]
    assert len(set(nodes)) == WORKERS and set(nodes) <= set(REAL_GPU_NODES), nodes
    # The device plugin's GPUs, one node's worth per worker.
    for pod in pods:
        assert pod.spec.containers[0].resources.limits[cfg.gpu_resource] == str(REAL_GPUS_PER_NODE)

    # A crash that is not the node's (an application error, an OOM): SIGKILL rank 1's worker process under its
    # supervisor; every rank's supervisor restarts its worker in place: the same pods, Volcano's attempt unchanged.
    wait("a durable checkpoint", lambda: bool(_steps(_events(stack), 0, "durable")), 120)
    (victim,) = [p for p in pods if p.metadata.name.endswith("-1")]  # <job>-<task>-<index>: rank 1
    supervisor = container_pid(stack, victim.spec.node_name, victim.status.container_statuses[0].container_id)
    (worker,) = child_pids(supervisor)
    uids = {p.metadata.uid for p in pods}
    os.kill(worker, signal.SIGKILL)
    in_place = _restart(stack, 0, "worker crash (in place)")
    gang["inplace_fault_to_first_step_s"] = in_place["waited_s"]
    gang["inplace_lost_steps"] = in_place["lost_steps"]
    gang["pods_recreated_inplace"] = len(uids - {p.metadata.uid for p in _gang_pods(core, ns)})
    assert gang["pods_recreated_inplace"] == 0, "a restart in place recreated pods"
    assert {e["attempt"] for e in _events(stack)} == {0}, "Volcano restarted the gang"
    assert 0 <= in_place["lost_steps"] <= 2 * INTERVAL, in_place

    # A crash that takes the pod (what a fatal XID does): SIGKILL rank 1's container; Volcano restarts the gang.
    pods = _gang_pods(core, ns)
    (victim,) = [p for p in pods if p.metadata.name.endswith("-1")]
    pid = container_pid(stack, victim.spec.node_name, victim.status.container_statuses[0].container_id)
    os.kill(pid, signal.SIGKILL)
    crashed = _restart(stack, int(in_place["round"]), "crash")
    gang["fault_to_first_step_s"] = crashed["waited_s"]
    gang["lost_steps_fatal"] = crashed["lost_steps"]
    # The newest complete checkpoint at the crash is at most one interval behind, plus the one being written.
    assert 0 <= crashed["lost_steps"] <= 2 * INTERVAL, crashed

    # A graceful eviction (a degraded node, a reclaim): SIGTERM, an emergency checkpoint, nothing lost; Volcano
    # replaces the evicted pod alone (PodEvicted → RestartPod) and the others wait for it in their pods.
    pods = _gang_pods(core, ns)
    uids = {p.metadata.uid for p in pods}
    (victim,) = [p for p in pods if p.metadata.name.endswith("-0")]
    core.create_namespaced_pod_eviction(victim.metadata.name, ns, client.V1Eviction(
        metadata=client.V1ObjectMeta(name=victim.metadata.name, namespace=ns)))
    evicted = _restart(stack, int(crashed["round"]), "eviction")
    gang["replace_one_fault_to_first_step_s"] = evicted["waited_s"]
    gang["replace_one_lost_steps"] = evicted["lost_steps"]
    gang["pods_recreated_replace_one"] = len(uids - {p.metadata.uid for p in _gang_pods(core, ns)})
    graceful = _steps(_events(stack), int(crashed["round"]), "graceful")
    assert graceful, "the evicted rank took no emergency checkpoint"
    assert evicted["lost_steps"] == 0, evicted
    assert gang["pods_recreated_replace_one"] == 1, "more than the evicted pod was recreated"

    # The gang finishes: every rank reaches the last step and the model fits (the averaged gradients were right).
    wait("the gang completes", lambda: len([e for e in _events(stack) if e["event"] == "done"]) == WORKERS,
         STEPS * STEP_S + 300)
    done = [e for e in _events(stack) if e["event"] == "done"]
    assert {e["step"] for e in done} == {STEPS} and max(e["error"] for e in done) < 1e-3, done
    gang["attempts"] = 1 + max(e["attempt"] for e in done)
    figures["real_gang"] = gang


def _training_from(stack: Layout, first: int, gang: str) -> int | None:
    """The newest round from ``first`` on in which every rank stepped, if any."""
    ready = [r for r in {round_of(e) for e in _events(stack, gang)} if r >= first and _training(stack, r, gang)]
    return max(ready, default=None)


def _steps_redone(stack: Layout, gang: str, before: int, upto: int) -> int:
    """Steps trained again from round ``before`` to ``upto``: at every restart, the last step a round reached less
    the step the next round that resumed resumed at (a round that never stepped redoes nothing)."""
    events = _events(stack, gang)
    rounds = sorted(r for r in {round_of(e) for e in events} if before <= r <= upto)
    redone = 0
    for this, following in itertools.pairwise(rounds):
        reached = [e["step"] for e in _steps(events, this)]
        resumed = [e["step"] for e in events if e["event"] == "resume" and round_of(e) == following]
        if reached and resumed:
            redone += max(reached) - min(resumed)
    return redone


def test_the_health_guard_takes_a_degraded_then_a_fatal_real_node_out_and_the_gang_trains_on_the_others(
        stack: Layout, tmp_path: Path) -> None:
    """The let-it-crash loop with real processes, both classes of fault.

    Degraded: the dcgm-exporter stand-in on one node the gang runs on serves XID 94 (contained ECC error), scraped
    by the operator's Prometheus and seen by the guard in its pod; the guard taints the node (and the stack's
    GpuNodeQuarantined alert fires) and evicts the gang's pod
    there (gracefully); Volcano replaces that pod alone on the third node (PodEvicted → RestartPod) and the others,
    still in their pods, resume with it from the checkpoint the eviction took.
    The fault clears and the guard releases the node after its probation.

    Fatal: another node of the gang serves XID 79 (fallen off the bus) and its rank dies with it (SIGKILL, what the
    lost GPU does to the process); the guard quarantines that node awaiting repair, and the gang restarts on the
    released node and the third one from the newest complete checkpoint."""
    from agents.health_guard.contract import HealthClass, Names

    core, _, _ = _apis(stack)
    cfg = load_stack_config(ROOT, "local", real_nodes=True)
    assert cfg is not None
    ns, name = cfg.training_namespace, "guarded-gang"
    env = {**os.environ, "KUBECONFIG": str(stack.kubeconfig), "NO_COLOR": "1"}
    out = subprocess.run([str(GPUCLUSTER), "train", "submit", str(_gang_spec(tmp_path / "g.json", name, 4000))],
                         env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    wait("the guarded gang trains", lambda: _training(stack, 0, name), 300)
    taint = Names(cfg.label_prefix).taint
    spare_key = spare_taint_key(cfg.label_prefix)

    def spares() -> set[str]:
        """The real pool's nodes that carry the node-pool agent's warm-spare taint."""
        return {n for n in REAL_GPU_NODES if any(t.key == spare_key for t in core.read_node(n).spec.taints or [])}

    # The pool keeps its one warm spare beside the gang: the node the gang does not use.
    wait("the real pool keeps one warm spare", lambda: len(spares()) == REAL_GPU_SPARES, 60)
    (spare_node,) = spares()
    assert spare_node not in {p.spec.node_name for p in _gang_pods(core, ns, name)}

    def quarantine(node: str) -> str | None:
        return next((t.value for t in core.read_node(node).spec.taints or [] if t.key == taint), None)

    def inject(node: str, fault: dict[str, dict[str, int]]) -> None:
        """Serve ``fault`` from the dcgm-exporter stand-in on ``node`` (``{}`` clears it)."""
        serve_gpu_readings(stack, cfg.telemetry_namespace, node, fault)

    def running_off(node: str) -> bool:
        pods = _gang_pods(core, ns, name)
        return (len(pods) == WORKERS and all(p.spec.node_name != node for p in pods)
                and all(p.status.phase == "Running" for p in pods))

    def loop(node: str, health_class: HealthClass, started: float, first: int) -> dict[str, float | int]:
        """Time each step from the fault on ``node`` to the gang's first step elsewhere, each on its own: on the
        fatal path Volcano restarts the gang for the crash, which may come before the guard's quarantine."""
        figures_: dict[str, float | int] = dict(first_times({
            "fault_to_quarantine_s": lambda: quarantine(node) == health_class,
            "fault_to_pods_gone_s": lambda: all(p.spec.node_name != node for p in _gang_pods(core, ns, name)),
            "fault_to_gang_running_s": lambda: running_off(node),
            "fault_to_first_step_s": lambda: running_off(node) and _training_from(stack, first, name),
        }, 300, started))
        # Whatever came first, the node ends quarantined and the gang trains elsewhere.
        assert quarantine(node) == health_class and running_off(node), (node, quarantine(node))
        final = _training_from(stack, first, name)
        assert final is not None
        figures_["lost_steps"] = _steps_redone(stack, name, first - 1, final)
        figures_["restarts"] = len({round_of(e) for e in _events(stack, name)
                                    if e["event"] == "resume" and first <= round_of(e) <= final})
        return figures_

    # Degraded: the pod of rank 1 is evicted gracefully and nothing is lost.
    (victim,) = [p for p in _gang_pods(core, ns, name) if p.metadata.name.endswith("-1")]
    degraded_node = victim.spec.node_name
    started = time.monotonic()
    inject(degraded_node, {"0": {"DCGM_FI_DEV_XID_ERRORS": 94}})
    degraded = loop(degraded_node, HealthClass.DEGRADED, started, 1)
    # The quarantine used the spare up: the agent released it and the replacement pod runs there.
    assert spares() == set(), spares()
    assert spare_node in {p.spec.node_name for p in _gang_pods(core, ns, name)}, spare_node

    # The stack's alert on it fires in the operator's Prometheus, from the guard's own metrics.
    def quarantine_alert() -> bool:
        alerts = _prom_get(stack, "/api/v1/alerts")["alerts"]
        return any(a["labels"].get("alertname") == "GpuNodeQuarantined" and a["labels"].get("node") == degraded_node
                   and a["state"] == "firing" for a in alerts)

    wait(f"GpuNodeQuarantined firing for {degraded_node}", quarantine_alert, 120, ignore=(OSError,))
    degraded["fault_to_alert_s"] = round(time.monotonic() - started, 1)
    assert _steps(_events(stack, name), 0, "graceful"), "the guard's eviction took no emergency checkpoint"
    assert degraded["lost_steps"] == 0, degraded
    figures["guard_fault_loop"] = {**{k: v for k, v in degraded.items() if k != "lost_steps"},
                                   "lost_steps_degraded": degraded["lost_steps"]}

    # The fault clears; the node comes back after its probation, with no repair mark (degraded needs none).
    cleared, cleared_at = time.monotonic(), time.time()
    inject(degraded_node, {})
    # The guard's leading pod is deleted while the node waits out its probation: the other replica takes the Lease
    # and releases the node, once (the quarantine lives on the node, not in the deleted process).
    ns_guard = cfg.system_namespace
    _, _, failover = delete_the_leader(stack, ns_guard, "health-guard", deployed_settings(stack, ns_guard,
                                                                                          "health-guard"))
    figures.setdefault("leader_failover_s", {})["health-guard"] = failover
    probation = cfg.observability.health.probation_seconds
    wait(f"the guard releases {degraded_node} after {probation}s clear",
         lambda: quarantine(degraded_node) is None, probation + 180)
    release_s = round(time.monotonic() - cleared, 1)
    # Repaired and through probation, the released node is the pool's idle one: it becomes the spare.
    wait(f"{degraded_node} becomes the pool's spare", lambda: spares() == {degraded_node}, 60)
    assert release_s >= probation, f"released {release_s}s after the fault cleared, before the {probation}s probation"
    time.sleep(5)  # a few passes of the new leader's loop: a second release would show now
    released = writes_by(stack.audit_log, "health-guard", "", cleared_at).count(f"patch nodes {degraded_node}")
    assert released == 1, f"{degraded_node} released by {released} writes"
    assert fencing_problems(stack.audit_log, "health-guard", ns_guard) == []

    # Fatal, on another node of the gang: the GPU is gone and the rank's process with it (the crash path).
    last_round = max(round_of(e) for e in _events(stack, name))
    pods = _gang_pods(core, ns, name)
    victim = next(p for p in pods if p.spec.node_name != degraded_node)
    fatal_node = victim.spec.node_name
    pid = container_pid(stack, fatal_node, victim.status.container_statuses[0].container_id)
    started = time.monotonic()
    inject(fatal_node, {"0": {"DCGM_FI_DEV_XID_ERRORS": 79}})
    os.kill(pid, signal.SIGKILL)
    fatal = loop(fatal_node, HealthClass.FATAL, started, last_round + 1)
    # The newest complete checkpoint at the crash is at most one interval behind, plus the one being written.
    assert 0 <= fatal["lost_steps"] <= 2 * INTERVAL, fatal
    nodes = {p.spec.node_name for p in _gang_pods(core, ns, name)}
    # The released node, the spare since, is used again: the fatal quarantine released it.
    assert degraded_node in nodes and fatal_node not in nodes, nodes
    assert spares() == set(), spares()
    figures["guard_fatal_loop"] = {**{k: v for k, v in fatal.items() if k != "lost_steps"},
                                   "lost_steps_fatal": fatal["lost_steps"], "clear_to_release_s": release_s}

    # The guard rail: both nodes it took out count against the hour, so a fault on the third real node would be the
    # third quarantine within the hour, past the stack's limit. The guard refuses it and trips its breaker: the node
    # keeps serving, the breaker's note on the Lease names it, the stack's GpuHealthGuardSuppressed alert fires in
    # the operator's Prometheus, and nothing more is quarantined until a person resets the breaker.
    (third,) = set(REAL_GPU_NODES) - {degraded_node, fatal_node}
    rail = _guard_rail_and_repair(stack, cfg, inject, quarantine, third, fatal_node, degraded_node)
    figures["guard_rail"] = rail


def _guard_rail_and_repair(stack: Layout, cfg: Any, inject: Any, quarantine: Any, third: str, fatal_node: str,
                           degraded_node: str) -> dict[str, float]:
    """Past the hourly limit: refused, breaker tripped, alert firing; then a person clears the cause, resets the
    breaker and marks the fatal node repaired, and the guard releases it after its probation, with one write."""
    from kubernetes import client

    from agents.health_guard.contract import Names

    names, ns_guard = Names(cfg.label_prefix), cfg.system_namespace
    settings = deployed_settings(stack, ns_guard, "health-guard")
    assert settings["max_nodes_per_hour"] == 2, settings  # realnodes.REAL_GPU_NODES_PER_HOUR, what this counts on
    leases = client.CoordinationV1Api(control.api_client(stack))
    core, _, _ = _apis(stack)

    def breaker_note() -> str:
        lease = leases.read_namespaced_lease(settings["lease_name"], ns_guard)
        return str((lease.metadata.annotations or {}).get(names.breaker, ""))

    def breaker_metric() -> float | None:
        result = _prom_get(stack, "/api/v1/query", query="max(gpucluster_health_breaker_tripped)")["result"]
        return float(result[0]["value"][1]) if result else None

    def suppression_firing() -> bool:
        return any(a["labels"].get("alertname") == "GpuHealthGuardSuppressed" and a["state"] == "firing"
                   for a in _prom_get(stack, "/api/v1/alerts")["alerts"])

    figures_: dict[str, float] = {}
    started = time.monotonic()
    inject(third, {"0": {"DCGM_FI_DEV_XID_ERRORS": 94}})
    wait(f"the breaker tripped on {third}", lambda: third in breaker_note(), 120, ignore=(client.ApiException,))
    figures_["fault_to_breaker_s"] = round(time.monotonic() - started, 1)
    wait("GpuHealthGuardSuppressed firing", suppression_firing, 120, ignore=(OSError,))
    figures_["fault_to_suppression_alert_s"] = round(time.monotonic() - started, 1)
    assert quarantine(third) is None, f"{third} was quarantined past the hourly limit"
    assert quarantine(fatal_node) is not None and quarantine(degraded_node) is None

    # A person decides: the cause clears, the breaker is reset (the alert's documented command, as an API call) and
    # the fatal node is marked repaired. The guard acts again: it releases the fatal node after its probation.
    cleared = time.monotonic()
    inject(third, {})
    inject(fatal_node, {})

    def xids_cleared() -> bool:
        query = f'max(DCGM_FI_DEV_XID_ERRORS{{Hostname=~"{third}|{fatal_node}"}})'
        result = _prom_get(stack, "/api/v1/query", query=query)["result"]
        return bool(result) and float(result[0]["value"][1]) == 0.0

    wait("the cleared XIDs scraped", xids_cleared, 60, ignore=(OSError,))
    reset, reset_at = time.monotonic(), time.time()
    leases.patch_namespaced_lease(settings["lease_name"], ns_guard,
                                  {"metadata": {"annotations": {names.breaker: None}}})
    wait("the breaker reads reset in Prometheus", lambda: breaker_metric() == 0.0, 120, ignore=(OSError,))
    figures_["reset_to_breaker_metric_zero_s"] = round(time.monotonic() - reset, 1)
    assert breaker_note() == "" and quarantine(third) is None
    core.patch_node(fatal_node, {"metadata": {"labels": {names.repaired: "e2e"}}})
    probation = cfg.observability.health.probation_seconds
    wait(f"the guard releases {fatal_node} after its repair and {probation}s clear",
         lambda: quarantine(fatal_node) is None, probation + 180)
    figures_["reset_to_release_s"] = round(time.monotonic() - reset, 1)
    # Probation runs from the clear the guard saw, never from before it.
    figures_["clear_to_release_s"] = round(time.monotonic() - cleared, 1)
    assert figures_["clear_to_release_s"] >= probation, figures_
    time.sleep(5)
    writes = writes_by(stack.audit_log, "health-guard", "", reset_at)
    assert writes.count(f"patch nodes {fatal_node}") == 1, writes
    assert f"patch nodes {third}" not in writes, writes
    assert names.repaired not in (core.read_node(fatal_node).metadata.labels or {}), "the repair mark stayed"
    return figures_


# --------------------------------------------------------------------------- last: the chaos soak, short

#: The short soak's faults: four, one every 30 s, drawn with this seed (``make chaos`` draws as many as its
#: duration holds, with any seed): a rank's worker killed, the guard's leader deleted, XID 94 on a real GPU node,
#: the agents' calls to the API server left unanswered — one of each family the long soak adds to the
#: control-plane faults (those run in `make chaos`).
SOAK_SEED, SOAK_S, SOAK_EVERY_S = 2018, 150.0, 30.0


def test_the_stack_soaks_under_faults_and_its_history_holds(stack: Layout) -> None:
    """``make chaos`` in short, the same code on this module's stack (last, since it restarts what the others use):
    a fault every 30 s drawn from leaders deleted, killed and frozen past their Lease, a virtual kubelet killed, the
    API server, etcd, the controller manager, Volcano's scheduler and controllers and the real kubelets restarted,
    network faults on the agents' path to the API server, the gang's ranks killed or evicted, while a researcher's
    gang trains; after each the cluster (and the gang) is whole again within the bound, and the history check over
    the whole audit log (every test of this module included) finds no write out of turn, no pod evicted twice, no
    PDB floor broken, no NoExecute burst taint, and no training step lost past a fault's bound."""
    from tools.chaos.gang import GANG
    from tools.chaos.soak import Soak, write_report

    cfg = load_stack_config(ROOT, "local", real_nodes=True)
    assert cfg is not None
    kubelets = tuple(n.name for n in real_nodes_for(load_plan(ROOT, "local", real_nodes=True)))
    # The soak's gang takes the real pool, as `make chaos` submits it: the module's gangs leave it first.
    env = {**os.environ, "KUBECONFIG": str(stack.kubeconfig), "NO_COLOR": "1"}
    core, _, _ = _apis(stack)
    gangs = ("guarded-gang", GANG)
    for job in gangs:
        subprocess.run([str(GPUCLUSTER), "train", "cancel", job], env=env, capture_output=True, timeout=60)
    wait("the module's gangs gone", lambda: not core.list_namespaced_pod(
        cfg.training_namespace, label_selector=f"volcano.sh/job-name in ({','.join(gangs)})").items, 180)
    soak = Soak(stack, cfg, SOAK_SEED, SOAK_S, SOAK_EVERY_S, kubelets, training=GPUCLUSTER)
    assert {"burst-controller", "health-guard"} <= set(soak.agents), soak.agents
    assert soak.gang is not None
    try:
        report = soak.run()
    finally:
        soak.gang.cancel()
    write_report(report, BUILT / "chaos-short.json")
    figures["chaos_short"] = {k: report[k] for k in ("faults_by_kind", "worst_recovery_s_by_kind",
                                                     "inference_availability", "training_steps_lost",
                                                     "api_calls_faulted")}
    assert sum(report["faults_by_kind"].values()) == len(soak.plan) == 4, report["faults_not_injected"]
    assert set(report["faults_by_kind"]) == {"trainer-killed", "leader-deleted", "gpu-xid-degraded", "api-hang"}
    assert not any(report["violations"].values()), (report["violations"], report["violation_details"])
    # The XID was queryable, so the guard had to answer it (fault-not-quarantined is among the violations above).
    assert [g["seen"] is not None for g in report["gpu_faults"]] == [True], report["gpu_faults"]
    assert report["violations"]["fault-not-quarantined"] == 0 and report["quarantines"] >= 1, report
    assert report["inference_samples"] > 0, report
    # The gang trained through the soak, and what it lost is measured, not assumed.
    assert report["training_step_reached"] > 0 and report["training_steps_lost"] is not None, report
