"""Our pods, for real: the stack's own objects on real kubelets (containerd + runc), not kwok.

The local cluster starts with its real nodes (tools/localcluster/realnodes.py): a system node and a GPU node
whose GPUs come from our device plugin. The stack's rendered health-guard objects (namespace with its Pod
Security level, ServiceAccount, RBAC, settings, the Deployment with its probes and securityContext) are applied
as rendered; only the image is the one ``make images`` built here, and the pods are pinned to the real system
node. Then the host is asked what the kubelet really did: the container's user, capabilities, seccomp, no new
privileges, read-only root and the mounted token; the guard reaches the API server through the ``kubernetes``
Service (it takes its Lease); the standby takes over when the leader's pod is deleted; a frozen guard is
restarted by the kubelet's liveness probe. A GPU pod gets the devices the plugin granted.

Figures go to ``.state/localcluster/e2e-realnodes.json`` for ``bench_e2e``.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.polling import wait
from tools.image_local import LOCAL_REGISTRY
from tools.localcluster import control, hostcheck, nodehost
from tools.localcluster.plan import Layout
from tools.localcluster.realnodes import REAL_NODE_TAINT

ROOT = Path(__file__).resolve().parents[1]
BUILT = ROOT / ".state" / "localcluster"
IMAGES = nodehost.IMAGES_DIR
FIGURES = BUILT / "e2e-realnodes.json"
NS = "gpu-system"
SYSTEM_NODE, GPU_NODE = "real-system-01", "real-gpu-01"
GUARD = "health-guard"
#: The rendered objects the guard needs, by manifest file (tools.render's names).
GUARD_MANIFESTS = (
    "namespace-gpu-system.yaml", "priorityclass-platform-critical.yaml",
    "serviceaccount-gpu-system-health-guard.yaml", "clusterrole-gpu-cluster:health-guard.yaml",
    "clusterrolebinding-gpu-cluster:health-guard.yaml", "role-gpu-system-health-guard-lease.yaml",
    "rolebinding-gpu-system-health-guard-lease.yaml", "configmap-gpu-system-health-guard-settings.yaml",
    "deployment-gpu-system-health-guard.yaml",
)
figures: dict[str, Any] = {}


def _why_not() -> str | None:
    lay = Layout(BUILT)
    missing = control.binaries_missing(lay) + control.binaries_missing(lay, nodehost.NODE_BINARIES)
    if missing:
        return f"the local cluster's real-node binaries are not built ({', '.join(missing)}); run `make localcluster`"
    found = hostcheck.problems(nodehost.read_host(lay))
    if found:
        return "this host cannot run real nodes: " + "; ".join(found)
    wanted = [f"{n}.tar" for n in ("pause", GUARD, "ib-exporter")]
    if not all((IMAGES / w).exists() for w in wanted):
        return f"images not built ({', '.join(wanted)} in {IMAGES}); run `make images`"
    return None


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Layout]:
    reason = _why_not()
    if reason:
        pytest.skip(reason)
    # A short state path: unix sockets (containerd, the device plugins) must stay under 108 bytes.
    state = Path(f"/tmp/gpucl-e2e-{os.getpid()}")
    state.mkdir()
    (state / "bin").symlink_to(BUILT / "bin")
    (state / "crd").symlink_to(BUILT / "crd")
    lay = Layout(state)
    with nodehost.host_lock():
        sysctls_before = nodehost.read_sysctls()
        rules_before = {c: hostcheck.strip_counters(nodehost.iptables_dump(c)) for c in nodehost.IPTABLES}
        try:
            started = time.monotonic()
            control.up(lay, timeout=300, real_nodes=True)
            figures["cluster_up_s"] = round(time.monotonic() - started, 1)
            yield lay
        finally:
            control.down(lay, quiet=True)
            figures["host_restored"] = {
                "sysctls": nodehost.read_sysctls() == sysctls_before,
                "iptables": {c: hostcheck.strip_counters(nodehost.iptables_dump(c)) == rules_before[c]
                             for c in nodehost.IPTABLES},
            }
            FIGURES.parent.mkdir(parents=True, exist_ok=True)
            FIGURES.write_text(json.dumps(figures, indent=2, sort_keys=True))
            shutil.rmtree(state, ignore_errors=True)
    # Host hygiene: what the kubelets, kube-proxy and the bridge CNI changed is back as it was.
    assert figures["host_restored"] == {"sysctls": True, "iptables": dict.fromkeys(nodehost.IPTABLES, True)}


def _core(lay: Layout) -> Any:
    from kubernetes import client

    return client.CoreV1Api(control.api_client(lay))


def _rendered(tmp: Path) -> Path:
    out = tmp / "render"
    subprocess.run([sys.executable, "-m", "tools.render", "--stack", "local", "--out", str(out)], cwd=ROOT,
                   check=True, capture_output=True, timeout=300)
    return out / "manifests"


def _on_real_node(pod_spec: dict[str, Any], node: str) -> None:
    """What a stack running its agents on these nodes would add: the real-node toleration, and the node."""
    pod_spec.setdefault("tolerations", []).append({**REAL_NODE_TAINT, "operator": "Equal"})
    pod_spec.setdefault("nodeSelector", {})["kubernetes.io/hostname"] = node


def _local_image(image: str) -> str:
    name_tag = image.split("@", 1)[0].rsplit("/", 1)[-1]
    return f"{LOCAL_REGISTRY}/{name_tag}"


def _apply(lay: Layout, doc: dict[str, Any]) -> None:
    from kubernetes import client, utils

    try:
        utils.create_from_dict(control.api_client(lay), doc)
    except utils.FailToCreateError as err:
        if not all(isinstance(e, client.ApiException) and e.status == 409 for e in err.api_exceptions):
            raise


@pytest.fixture(scope="module")
def guard(cluster: Layout, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    manifests = _rendered(tmp_path_factory.mktemp("guard"))
    deployment: dict[str, Any] = {}
    settings: dict[str, Any] = {}
    for name in GUARD_MANIFESTS:
        doc = yaml.safe_load((manifests / name).read_text())
        if doc["kind"] == "ConfigMap":
            settings = json.loads(next(iter(doc["data"].values())))
        if doc["kind"] == "Deployment":
            doc = copy.deepcopy(doc)
            spec = doc["spec"]["template"]["spec"]
            _on_real_node(spec, SYSTEM_NODE)
            for c in spec["containers"]:
                c["image"] = _local_image(c["image"])
                c["imagePullPolicy"] = "Never"
            deployment = doc
        _apply(cluster, doc)
    started = time.monotonic()
    replicas = deployment["spec"]["replicas"]
    _wait("both health-guard pods Ready on the real system node",
          lambda: len(_ready_pods(cluster, GUARD)) == replicas, 180)
    figures["guard_ready_s"] = round(time.monotonic() - started, 1)
    return {"deployment": deployment, "settings": settings}


def _wait(what: str, check: Any, timeout: float) -> float:
    """:func:`tests.polling.wait`, reading an API error (a Lease not made yet) as not yet."""
    from kubernetes.client import ApiException

    return wait(what, check, timeout, ignore=(ApiException,))


def _ready_pods(lay: Layout, app: str) -> list[Any]:
    pods = _core(lay).list_namespaced_pod(NS, label_selector=f"app.kubernetes.io/name={app}").items
    out = []
    for p in pods:
        conds = {c.type: c.status for c in (p.status.conditions or [])}
        if p.metadata.deletion_timestamp is None and conds.get("Ready") == "True":
            out.append(p)
    return out


def _container_pid(lay: Layout, node: str, container_id: str) -> int:
    """The host PID of a container's first process, from the node's containerd."""
    from tools.localcluster.plan import default_plan
    from tools.localcluster.realnodes import node_paths, real_nodes_for

    by_name = {n.name: n for n in real_nodes_for(default_plan())}
    sock = node_paths(lay.state, by_name[node]).containerd_socket
    cid = container_id.split("://", 1)[1]
    out = subprocess.run(["ctr", "--address", str(sock), "-n", "k8s.io", "task", "ls"], capture_output=True,
                         text=True, check=True).stdout
    for line in out.splitlines()[1:]:
        fields = line.split()
        if fields and fields[0] == cid:
            return int(fields[1])
    raise AssertionError(f"container {cid} has no task on {node}:\n{out}")


def _status_fields(pid: int) -> dict[str, str]:
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        fields[key] = value.strip()
    return fields


def test_real_kubelets_registered_their_nodes_with_the_plugins_gpus(cluster: Layout) -> None:
    core = _core(cluster)
    nodes = {n.metadata.name: n for n in core.list_node().items}
    for name in (SYSTEM_NODE, GPU_NODE):
        info = nodes[name].status.node_info
        assert info.kubelet_version == "v1.35.3", info
        assert info.container_runtime_version.startswith("containerd://1.6"), info
        assert any(t.key == REAL_NODE_TAINT["key"] for t in nodes[name].spec.taints or [])
    assert nodes[GPU_NODE].status.allocatable["nvidia.com/gpu"] == "8"
    assert "nvidia.com/gpu" not in (nodes[SYSTEM_NODE].status.allocatable or {})
    figures["real_nodes"] = [SYSTEM_NODE, GPU_NODE]


def test_the_rendered_guard_runs_as_its_security_context_says(cluster: Layout, guard: dict[str, Any]) -> None:
    """The kubelet applied runAsNonRoot/65532, no capabilities, RuntimeDefault seccomp, no new privileges, a
    read-only root filesystem and the projected ServiceAccount token: read from the process itself."""
    pods = _ready_pods(cluster, GUARD)
    assert {p.spec.node_name for p in pods} == {SYSTEM_NODE}
    figures["agent_pods_running"] = sorted(p.metadata.name for p in pods)
    for pod in pods:
        cid = pod.status.container_statuses[0].container_id
        pid = _container_pid(cluster, SYSTEM_NODE, cid)
        status = _status_fields(pid)
        assert status["Uid"].split()[:2] == ["65532", "65532"], status["Uid"]
        assert status["Gid"].split()[0] == "65532"
        assert int(status["CapEff"], 16) == 0 and int(status["CapBnd"], 16) == 0
        assert status["NoNewPrivs"] == "1"
        assert status["Seccomp"] == "2"  # filter mode: the runtime's default profile
        root = next(line for line in Path(f"/proc/{pid}/mountinfo").read_text().splitlines()
                    if line.split()[4] == "/")
        assert "ro" in root.split()[5].split(","), root
        # The kubelet's projected token, where the container sees /var/run/secrets (a link to /run in Debian).
        mounts = [line.split()[4] for line in Path(f"/proc/{pid}/mountinfo").read_text().splitlines()]
        token_dir = next(m for m in mounts if m.endswith("/secrets/kubernetes.io/serviceaccount"))
        token = Path(f"/proc/{pid}/root{token_dir}/token")
        assert token.read_text().count(".") == 2  # a JWT


def test_the_guard_reaches_the_api_server_and_holds_its_lease(cluster: Layout, guard: dict[str, Any]) -> None:
    """In a real pod, through the ``kubernetes`` Service (kube-proxy) with its own token and RBAC."""
    from kubernetes import client

    coord = client.CoordinationV1Api(control.api_client(cluster))
    names = {p.metadata.name for p in _ready_pods(cluster, GUARD)}
    _wait("one health-guard pod holding the Lease",
          lambda: coord.read_namespaced_lease(GUARD, NS).spec.holder_identity in names, 90)


def test_the_standby_takes_over_when_the_leader_pod_is_deleted(cluster: Layout, guard: dict[str, Any]) -> None:
    from kubernetes import client

    coord = client.CoordinationV1Api(control.api_client(cluster))
    _wait("a leader", lambda: coord.read_namespaced_lease(GUARD, NS).spec.holder_identity, 90)
    leader = coord.read_namespaced_lease(GUARD, NS).spec.holder_identity
    standby = {p.metadata.name for p in _ready_pods(cluster, GUARD)} - {leader}
    assert len(standby) == 1
    started = time.monotonic()
    _core(cluster).delete_namespaced_pod(leader, NS)
    _wait("the standby holding the Lease",
          lambda: coord.read_namespaced_lease(GUARD, NS).spec.holder_identity in standby, 120)
    figures["leader_failover_s"] = {GUARD: round(time.monotonic() - started, 1)}
    # The deleted leader's lease expires, then the standby's next election takes it.
    lease_s = guard["settings"]["lease_duration_seconds"]
    assert figures["leader_failover_s"][GUARD] <= lease_s + 2 * guard["settings"]["poll_seconds"] + 10


def test_a_frozen_guard_is_restarted_by_the_kubelets_liveness_probe(cluster: Layout, guard: dict[str, Any]) -> None:
    probe = guard["deployment"]["spec"]["template"]["spec"]["containers"][0]["livenessProbe"]
    budget = probe.get("periodSeconds", 10) * probe.get("failureThreshold", 3) + probe.get("timeoutSeconds", 1)
    _wait("two guards Ready again", lambda: len(_ready_pods(cluster, GUARD)) == 2, 180)
    pod = _ready_pods(cluster, GUARD)[0]
    before = pod.status.container_statuses[0].restart_count
    pid = _container_pid(cluster, SYSTEM_NODE, pod.status.container_statuses[0].container_id)
    started = time.monotonic()
    os.kill(pid, signal.SIGSTOP)

    def restarted() -> bool:
        p = _core(cluster).read_namespaced_pod(pod.metadata.name, NS)
        return bool(p.status.container_statuses[0].restart_count > before)

    _wait(f"the kubelet restarting the frozen guard (probe budget {budget}s)", restarted, budget + 60)
    figures["liveness_restart_s"] = round(time.monotonic() - started, 1)
    figures["liveness_budget_s"] = budget
    assert figures["liveness_restart_s"] <= budget + probe.get("periodSeconds", 10) + 15


def test_a_gpu_pod_gets_the_devices_the_plugin_granted(cluster: Layout) -> None:
    core = _core(cluster)
    ns = "real-gpu-test"
    _apply(cluster, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    pod = {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "gpu-env", "namespace": ns},
        "spec": {
            "restartPolicy": "Never",
            "tolerations": [{**REAL_NODE_TAINT, "operator": "Equal"}],
            "nodeSelector": {"kubernetes.io/hostname": GPU_NODE},
            "containers": [{
                "name": "env", "image": f"{LOCAL_REGISTRY}/ib-exporter:0.1.0", "imagePullPolicy": "Never",
                "command": ["python3", "-c", "import os; print(os.environ['NVIDIA_VISIBLE_DEVICES'])"],
                "resources": {"limits": {"nvidia.com/gpu": "2", "cpu": "100m", "memory": "64Mi"}},
                "securityContext": {"runAsNonRoot": True, "runAsUser": 65532, "allowPrivilegeEscalation": False,
                                    "capabilities": {"drop": ["ALL"]}, "seccompProfile": {"type": "RuntimeDefault"}},
            }],
        },
    }
    core.create_namespaced_pod(ns, pod)
    _wait("the GPU pod to finish", lambda: core.read_namespaced_pod("gpu-env", ns).status.phase == "Succeeded",
          120)
    devices = core.read_namespaced_pod_log("gpu-env", ns).strip().split(",")
    assert len(devices) == 2 and all(d.startswith(f"{GPU_NODE}-gpu-") for d in devices), devices
