"""The local control plane: its plan (pure) and, when the binaries are built, a real start/stop.

The live test starts a private cluster in a temporary state folder (sharing only the built binaries),
so a developer's running `make up` cluster is left alone. xdist spreads tests of one module over
workers, so everything that needs the live cluster is one test.
"""

from __future__ import annotations

import os
import time
import warnings
from pathlib import Path

import pytest

from tools.localcluster import control
from tools.localcluster.plan import (
    KWOK_ANNOTATION,
    PORT_NAMES,
    VK_PROVIDER_TAINT,
    Layout,
    component_commands,
    default_plan,
    load_plan,
    load_stack_config,
)
from tools.localcluster.realcluster import BUILT, linked_state

ROOT = Path(__file__).resolve().parents[1]


# --------------------------------------------------------------------------- the plan (no processes)


def test_default_plan_has_gpu_pool_system_and_virtual_node():
    plan = default_plan()
    gpu = plan.by_kind("gpu")
    assert [n.name for n in gpu] == ["gpu-local-01", "gpu-local-02", "gpu-local-03", "gpu-local-04"]
    assert plan.onprem_gpus == 32
    (virtual,) = plan.by_kind("virtual")
    assert virtual.labels["gpucluster.io/location"] == "external"
    assert [(t.key, t.effect) for t in virtual.taints] == [(VK_PROVIDER_TAINT, "NoSchedule")]
    assert plan.by_kind("system")


def test_node_manifest_is_a_kwok_node_with_gpu_capacity():
    node = default_plan().by_kind("gpu")[0].manifest("nvidia.com/gpu")
    assert node["metadata"]["annotations"] == {KWOK_ANNOTATION: "fake"}
    assert node["status"]["capacity"]["nvidia.com/gpu"] == "8"
    assert node["status"]["allocatable"] == node["status"]["capacity"]
    assert node["metadata"]["labels"]["gpucluster.io/location"] == "onprem"


def test_every_local_node_reports_the_ephemeral_storage_our_pods_request():
    """Our pods request ephemeral storage (bounded scratch); a node that reports none schedules nothing."""
    from kubernetes.utils import parse_quantity

    from components.security import EPHEMERAL_REQUEST

    for spec in default_plan().nodes:
        capacity = spec.manifest("nvidia.com/gpu")["status"]["allocatable"]
        assert parse_quantity(capacity["ephemeral-storage"]) >= 8 * parse_quantity(EPHEMERAL_REQUEST), spec.name


def test_local_stack_plan_loads():
    """Pulumi.local.yaml (when present) yields on-prem GPU nodes and at least one virtual node."""
    plan = load_plan(ROOT, "local")
    assert plan.onprem_gpus > 0
    assert plan.by_kind("virtual"), f"no virtual node in the plan from {plan.source}"
    for node in plan.by_kind("virtual"):
        assert any(t.key == VK_PROVIDER_TAINT and t.effect == "NoSchedule" for t in node.taints)


def test_virtual_node_carries_the_taint_inference_tolerates():
    # The stack's virtual kubelet sets VKUBELET_TAINT_VALUE = the provider's name (not its --provider
    # binary name); a kwok node must carry the same, or inference can never burst onto it.
    from components.providers import provider_toleration

    cfg = load_stack_config(ROOT, "local")
    assert cfg is not None
    plan = load_plan(ROOT, "local")
    for prov in cfg.providers:
        [node] = [n for n in plan.by_kind("virtual") if n.name == prov.node_name]
        tol = provider_toleration(prov)
        assert [(t.key, t.value) for t in node.taints] == [(tol.key, tol.value)] == [(VK_PROVIDER_TAINT, prov.name)]


def test_local_volcano_runs_the_stack_scheduler_conf():
    # No fallback: the local scheduler decides exactly as the one the stack ships.
    from components.gang_scheduler import volcano_scheduler_conf
    from tools.localcluster.plan import volcano_conf

    assert volcano_conf() == volcano_scheduler_conf()


def test_csinode_registers_every_driver_on_a_node():
    # Volcano counts a pod's CSI volumes as attachable-volumes-csi-<driver>; only nodes with the driver
    # in their CSINode offer it, so the local nodes need the entry a CSI node plugin would register.
    from tools.localcluster.provisioner import csinode_for

    assert csinode_for("gpu-local-01", ["nfs.csi.k8s.io", "b.csi"]) == {
        "apiVersion": "storage.k8s.io/v1",
        "kind": "CSINode",
        "metadata": {"name": "gpu-local-01"},
        "spec": {"drivers": [{"name": "b.csi", "nodeID": "gpu-local-01"},
                             {"name": "nfs.csi.k8s.io", "nodeID": "gpu-local-01"}]},
    }


def test_every_component_listens_on_loopback_only(tmp_path):
    ports = {name: 20000 + i for i, name in enumerate(PORT_NAMES)}
    for name, argv in component_commands(Layout(tmp_path), ports).items():
        for arg in argv[1:]:
            if any(k in arg for k in ("address", "-urls", "bind")):
                assert "0.0.0.0" not in arg and "127.0.0.1" in arg, f"{name}: {arg}"
    apiserver = component_commands(Layout(tmp_path), ports)["kube-apiserver"]
    assert "--bind-address=127.0.0.1" in apiserver


# --------------------------------------------------------------------------- the live cluster


def _built() -> str | None:
    missing = control.binaries_missing(Layout(BUILT))
    if missing:
        return (f"local control plane not built ({', '.join(missing)} missing in {BUILT / 'bin'}); "
                f"`make localcluster` builds it, see .state/localcluster/build-make.log")
    return None


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    reason = _built()
    if reason:
        pytest.skip(reason)
    lay = linked_state(tmp_path_factory.mktemp("localcluster"))
    try:
        plan = control.up(lay, timeout=300)
        yield lay, plan
    finally:
        control.down(lay, quiet=True)
        assert not [p for p in control.recorded(lay) if p.alive()]


def _wait(what, check, timeout=90.0):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what} (last: {last!r})")


def test_control_plane_nodes_and_a_running_pod(cluster):
    from kubernetes import client

    lay, plan = cluster
    api_client = control.api_client(lay)
    core = client.CoreV1Api(api_client)

    # The API server answers on loopback with our certificates and reports the pinned version.
    version = client.VersionApi(api_client).get_code()
    assert version.git_version.startswith("v1.35."), version.git_version

    # kwok's nodes; virtual nodes appear when the stack's virtual kubelets register them (make up, make e2e).
    nodes = {n.metadata.name: n for n in core.list_node().items}
    assert set(nodes) == {n.name for n in plan.kwok_nodes}
    for spec in plan.kwok_nodes:
        node = nodes[spec.name]
        conds = {c.type: c.status for c in node.status.conditions}
        assert conds.get("Ready") == "True", spec.name
        got_gpus = int(node.status.allocatable.get(plan.gpu_resource, "0"))
        assert got_gpus == spec.gpus, spec.name
        for key, value in spec.labels.items():
            assert node.metadata.labels.get(key) == value, (spec.name, key)
        # The node lifecycle controller's own (node.kubernetes.io/not-ready) can outlive Ready=True by one of its
        # passes on a loaded machine; they are not the plan's.
        taints = {(t.key, t.value, t.effect) for t in node.spec.taints or []
                  if not t.key.startswith("node.kubernetes.io/")}
        assert taints == {(t.key, t.value, t.effect) for t in spec.taints}, spec.name
    assert sum(int(nodes[n.name].status.capacity.get(plan.gpu_resource, "0")) for n in plan.by_kind("gpu")) \
        == plan.onprem_gpus

    # A GPU pod lands on a kwok GPU node through kube-scheduler and kwok reports it Running.
    gpu_node = plan.by_kind("gpu")[0]
    tolerations = [client.V1Toleration(key=t.key, operator="Equal", value=t.value, effect=t.effect)
                   for t in gpu_node.taints]
    pod = client.V1Pod(
        metadata=client.V1ObjectMeta(name="gpu-smoke"),
        spec=client.V1PodSpec(
            containers=[client.V1Container(
                name="main", image="registry.invalid/smoke:1.0",
                resources=client.V1ResourceRequirements(limits={plan.gpu_resource: str(gpu_node.gpus)}),
            )],
            node_selector={f"{plan.label_prefix}/pool": gpu_node.pool},
            tolerations=tolerations,
        ),
    )
    core.create_namespaced_pod("default", pod)

    def running():
        p = core.read_namespaced_pod("gpu-smoke", "default")
        return p if p.status.phase == "Running" else None

    placed = _wait("gpu-smoke Running", running)
    assert placed.spec.node_name in {n.name for n in plan.by_kind("gpu")}

    if control.expected(lay) != control.CONTROL_PLANE:
        warnings.warn(f"Volcano not built ({control.binaries_missing(lay, control.VOLCANO)}); gang part skipped",
                      stacklevel=1)
        return

    # Volcano's CRDs are served: a Queue and a PodGroup can be created.
    custom = client.CustomObjectsApi(api_client)
    custom.create_cluster_custom_object("scheduling.volcano.sh", "v1beta1", "queues", {
        "apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "Queue",
        "metadata": {"name": "smoke"}, "spec": {"weight": 1, "reclaimable": True},
    })
    custom.create_namespaced_custom_object("scheduling.volcano.sh", "v1beta1", "default", "podgroups", {
        "apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "PodGroup",
        "metadata": {"name": "smoke"}, "spec": {"minMember": 2, "queue": "smoke"},
    })

    # A two-pod gang through the Volcano scheduler starts together.
    for i in range(2):
        gang_pod = client.V1Pod(
            metadata=client.V1ObjectMeta(
                name=f"gang-{i}", annotations={"scheduling.k8s.io/group-name": "smoke"}),
            spec=client.V1PodSpec(
                scheduler_name="volcano",
                containers=[client.V1Container(
                    name="main", image="registry.invalid/smoke:1.0",
                    resources=client.V1ResourceRequirements(limits={plan.gpu_resource: "1"}))],
                node_selector={f"{plan.label_prefix}/pool": gpu_node.pool},
                tolerations=tolerations,
            ),
        )
        core.create_namespaced_pod("default", gang_pod)

    def gang_running():
        pods = [core.read_namespaced_pod(f"gang-{i}", "default") for i in range(2)]
        return pods if all(p.status.phase == "Running" for p in pods) else None

    _wait("the Volcano gang Running", gang_running, timeout=120)

    if os.environ.get("LOCALCLUSTER_KEEP"):
        input("cluster kept; press enter to tear down")


def test_a_controller_manager_ended_while_the_api_server_restarts_is_started_again_and_works(cluster):
    """The two-hour soak's defect: the controller manager, restarted while the API server restarted too, exited
    without a word during its start, and nothing started it again. Under the supervisor it comes back, and its
    controllers act (a Deployment gets its ReplicaSet)."""
    import signal

    from kubernetes import client

    lay, _ = cluster
    kcm, apiserver = control.load_proc(lay, "kube-controller-manager"), control.load_proc(lay, "kube-apiserver")
    assert kcm is not None and apiserver is not None and kcm.supervised and apiserver.supervised
    before = {p.name: p.component() for p in (kcm, apiserver)}
    assert None not in before.values()
    os.kill(before[kcm.name][0], signal.SIGTERM)
    time.sleep(0.5)  # the controller manager is starting again when the API server goes
    os.kill(before[apiserver.name][0], signal.SIGTERM)
    for proc in (kcm, apiserver):
        _wait(f"{proc.name} started again by its supervisor",
              lambda p=proc: p.component() not in (None, before[p.name]), timeout=120)
    ports = control.load_ports(lay) or {}
    _wait("the API server ready again", lambda: control.api_get(lay, ports["apiserver"], "/readyz")[0] == 200, 120)
    assert "supervise: kube-controller-manager exited" in Path(kcm.log).read_text(errors="replace")
    apps = client.AppsV1Api(control.api_client(lay))
    labels = {"app": "after-restart"}
    apps.create_namespaced_deployment("default", client.V1Deployment(
        metadata=client.V1ObjectMeta(name="after-restart"),
        spec=client.V1DeploymentSpec(
            replicas=1, selector=client.V1LabelSelector(match_labels=labels),
            template=client.V1PodTemplateSpec(
                metadata=client.V1ObjectMeta(labels=labels),
                spec=client.V1PodSpec(containers=[client.V1Container(name="main",
                                                                     image="registry.invalid/smoke:1.0")])))))
    _wait("the Deployment's ReplicaSet, made by the controller manager",
          lambda: apps.list_namespaced_replica_set("default", label_selector="app=after-restart").items, 120)
