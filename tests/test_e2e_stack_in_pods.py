"""``make up REAL_NODES=1`` end to end: ``pulumi up`` of the local stack with every agent in the stack's own pods.

The local cluster starts with its real nodes (the stack's system node is a real kubelet), and the real engine
deploys the local stack to it. Nothing runs beside it as a harness process: the burst controller, the health guard,
the provider's virtual-kubelet (its serving-cert init container first) and the descheduler's CronJob run from the
images ``make images`` built, on the real system node. The test then asks the cluster what they did: every
Deployment's replicas are Ready there with the images the stack names, the virtual kubelet registered its node with
the capacity the stack gave it (GPUs included) and the provider's taint, renews that node's lease, and runs the
standby; a Job made from the descheduler's CronJob runs to completion; ``kubectl logs`` of the virtual kubelet comes
through the API server from the real kubelet.

Figures go to ``.state/localcluster/e2e-stack-in-pods.json`` for ``bench_e2e``.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from components import images
from tests.polling import wait
from tests.realnode_support import BUILT, private_state, why_not
from tools.engine_runner import engine_available
from tools.localcluster import control, nodehost, stackup
from tools.localcluster.plan import Layout, load_plan, load_stack_config
from tools.localcluster.realnodes import IMAGES_BY_KIND, real_nodes_for

ROOT = Path(__file__).resolve().parents[1]
FIGURES = BUILT / "e2e-stack-in-pods.json"
SYSTEM_NODE = real_nodes_for(load_plan(ROOT, "local"))[0].name
#: Harness processes that would stand in for a pod; none may run.
STAND_INS = ("burst-controller", "health-guard", "descheduler", "virtual-kubelet")
figures: dict[str, Any] = {}


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Layout]:
    reason = why_not(IMAGES_BY_KIND["system"]) or (None if engine_available() else
                                                   "the Pulumi engine is not built (.state/engine); run `make engine`")
    if reason:
        pytest.skip(reason)
    state = private_state("gpucl-pods")
    backend = tmp_path_factory.mktemp("stack-in-pods-backend")
    lay = Layout(state)
    with nodehost.host_lock():
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
    assert {"burst-controller", "health-guard", "vk-local-cloud"} <= set(deployments), sorted(deployments)
    for name, dep in deployments.items():
        assert dep.status.ready_replicas == dep.spec.replicas, (name, dep.status)
    pods = [p for p in core.list_namespaced_pod(ns).items if p.status.phase == "Running"]
    assert {p.spec.node_name for p in pods} == {SYSTEM_NODE}
    ran = {c.image for p in pods for c in p.spec.containers}
    assert images.VIRTUAL_KUBELET_MOCK in ran, ran
    figures["agent_pods_running"] = sorted(p.metadata.name.rsplit("-", 2)[0] for p in pods)
    alive = [p.name for p in control.recorded(stack) if p.alive() and p.name.startswith(STAND_INS)]
    assert alive == [], f"harness processes standing in for pods: {alive}"


def test_the_virtual_kubelet_pod_registers_its_node_with_the_stacks_capacity(stack: Layout) -> None:
    core, _, _ = _apis(stack)
    cfg = load_stack_config(ROOT, "local")
    assert cfg is not None
    (provider,) = cfg.providers
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
    (pod,) = [p for p in core.list_namespaced_pod(ns, label_selector="app.kubernetes.io/name=vk-local-cloud").items
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
