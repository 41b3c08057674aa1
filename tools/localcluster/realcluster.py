"""Helpers on a local cluster with real nodes that the e2e tests and the chaos soak share: why this machine cannot
run one, a private state folder, a container's host PID, an app's Ready pods and who holds a Lease."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tools.localcluster import control, hostcheck, nodehost, processes
from tools.localcluster.dcgm_standin import FAULTS
from tools.localcluster.plan import Layout
from tools.localcluster.realnodes import node_paths

ROOT = Path(__file__).resolve().parents[2]
BUILT = ROOT / ".state" / "localcluster"


def why_not(images: Sequence[str]) -> str | None:
    """Why real nodes cannot run here with ``images`` (``make images`` archive names), or None."""
    lay = Layout(BUILT)
    missing = control.binaries_missing(lay) + control.binaries_missing(lay, nodehost.NODE_BINARIES)
    if missing:
        return f"the local cluster's real-node binaries are not built ({', '.join(missing)}); run `make localcluster`"
    found = hostcheck.problems(nodehost.read_host(lay))
    if found:
        return "this host cannot run real nodes: " + "; ".join(found)
    absent = [f"{n}.tar" for n in images if not (nodehost.IMAGES_DIR / f"{n}.tar").exists()]
    if absent:
        return f"images not built ({', '.join(absent)} in {nodehost.IMAGES_DIR}); run `make images`"
    return None


def sweep_stale(parent: Path, prefix: str) -> list[Path]:
    """Remove ``<prefix>-<pid>`` folders of sessions killed before their teardown (gigabytes each: etcd, the nodes'
    containerd stores): the pid gone, no process of the folder running, nothing mounted under it (a killed session's
    real nodes are reclaimed first, by the next ``up``). Returns what went."""
    gone: list[Path] = []
    for folder in sorted(parent.glob(f"{prefix}-*")):
        pid = folder.name.rsplit("-", 1)[1]
        if not (pid.isdigit() and folder.is_dir()) or processes.start_ticks(int(pid)) is not None:
            continue
        if any(p.alive() for p in processes.recorded(Layout(folder))) or nodehost.mounts_under([folder]):
            continue
        shutil.rmtree(folder, ignore_errors=True)
        gone.append(folder)
    return gone


def private_state(prefix: str) -> Path:
    """A fresh state folder sharing the built binaries and CRDs. Short, under /tmp: unix sockets (containerd, the
    device plugins) must stay under 108 bytes. Folders that killed sessions left under the same prefix go first."""
    sweep_stale(Path("/tmp"), prefix)
    state = Path(f"/tmp/{prefix}-{os.getpid()}")
    state.mkdir()
    return linked_state(state).state


def linked_state(state: Path) -> Layout:
    """``state`` (an empty folder) as a local cluster's state that shares the built binaries and CRDs: a cluster of
    its own without building again."""
    (state / "bin").symlink_to(BUILT / "bin")
    (state / "crd").symlink_to(BUILT / "crd")
    return Layout(state)


def container_pid(lay: Layout, node: str, container_id: str) -> int:
    """The host PID of a container's first process, from the node's containerd."""
    by_name = {n.name: n for n in nodehost.recorded_nodes(lay)}
    sock = node_paths(lay.state, by_name[node]).containerd_socket
    cid = container_id.split("://", 1)[1]
    out = subprocess.run(["ctr", "--address", str(sock), "-n", "k8s.io", "task", "ls"], capture_output=True,
                         text=True, check=True).stdout
    for line in out.splitlines()[1:]:
        fields = line.split()
        if fields and fields[0] == cid:
            return int(fields[1])
    raise AssertionError(f"container {cid} has no task on {node}:\n{out}")


def child_pids(pid: int) -> list[int]:
    """The host PIDs of ``pid``'s children (every thread's list), e.g. the worker a container's supervisor runs."""
    out: list[int] = []
    for children in Path(f"/proc/{pid}/task").glob("*/children"):
        out += [int(c) for c in children.read_text().split()]
    return sorted(set(out))


def ready_pods(lay: Layout, namespace: str, app: str) -> list[Any]:
    """The Ready, not terminating pods of ``app`` (its ``app.kubernetes.io/name`` label)."""
    from kubernetes import client

    core: Any = client.CoreV1Api(control.api_client(lay))
    pods = core.list_namespaced_pod(namespace, label_selector=f"app.kubernetes.io/name={app}").items
    return [p for p in pods if p.metadata.deletion_timestamp is None
            and any(c.type == "Ready" and c.status == "True" for c in p.status.conditions or [])]


def lease_holder(lay: Layout, namespace: str, lease: str) -> str:
    """Who holds the Lease ("" for nobody)."""
    from kubernetes import client

    spec = client.CoordinationV1Api(control.api_client(lay)).read_namespaced_lease(lease, namespace).spec
    return str(spec.holder_identity or "") if spec is not None else ""


def serve_gpu_readings(lay: Layout, namespace: str, node: str, readings: Mapping[str, Mapping[str, float]]) -> None:
    """Have the dcgm-exporter stand-in on ``node`` serve ``readings`` (per GPU index, DCGM field → value; ``{}``
    clears them) at its next scrape (tools/localcluster/dcgm_standin.py), through ``kubectl exec``."""
    from kubernetes import client

    core: Any = client.CoreV1Api(control.api_client(lay))
    pods = [p for p in core.list_namespaced_pod(namespace, label_selector="app.kubernetes.io/name=dcgm-exporter").items
            if p.spec.node_name == node and p.metadata.deletion_timestamp is None]
    if not pods:
        raise RuntimeError(f"no dcgm-exporter pod on {node}")
    subprocess.run(["kubectl", "--kubeconfig", str(lay.kubeconfig), "exec", "-n", namespace, pods[0].metadata.name,
                    "--", "python3", "-c", f"open({str(FAULTS)!r}, 'w').write({json.dumps(dict(readings))!r})"],
                   check=True, timeout=60, capture_output=True)


def prometheus_get(lay: Layout, namespace: str, path: str, **params: str) -> Any:
    """``data`` of a Prometheus API answer from the operator's Prometheus pod (tools/localcluster/prometheus_operator):
    the host reaches the real pods' addresses."""
    import urllib.parse
    import urllib.request

    from kubernetes import client

    from tools.localcluster import prometheus_operator

    core: Any = client.CoreV1Api(control.api_client(lay))
    pod = core.read_namespaced_pod(f"prometheus-{prometheus_operator.NAME}-0", namespace)
    query = f"?{urllib.parse.urlencode(params)}" if params else ""
    url = f"http://{pod.status.pod_ip}:{prometheus_operator.PORT}{path}{query}"
    with urllib.request.urlopen(url, timeout=10) as resp:
        return json.load(resp)["data"]
