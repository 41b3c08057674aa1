"""What the real-node end-to-end tests share: why this machine cannot run them, and a private state folder."""

from __future__ import annotations

import json
import os
import subprocess
import urllib.parse
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tools.localcluster import control, hostcheck, nodehost
from tools.localcluster.plan import Layout
from tools.localcluster.realnodes import node_paths

ROOT = Path(__file__).resolve().parents[1]
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


def private_state(prefix: str) -> Path:
    """A fresh state folder sharing the built binaries and CRDs. Short, under /tmp: unix sockets (containerd, the
    device plugins) must stay under 108 bytes."""
    state = Path(f"/tmp/{prefix}-{os.getpid()}")
    state.mkdir()
    (state / "bin").symlink_to(BUILT / "bin")
    (state / "crd").symlink_to(BUILT / "crd")
    return state


def prometheus_get(lay: Layout, namespace: str, path: str, **params: str) -> Any:
    """``data`` of a Prometheus API answer from the operator's Prometheus pod (tools/localcluster/prometheus_operator):
    the host reaches the real pods' addresses."""
    from kubernetes import client

    from tools.localcluster import prometheus_operator

    core: Any = client.CoreV1Api(control.api_client(lay))
    pod = core.read_namespaced_pod(f"prometheus-{prometheus_operator.NAME}-0", namespace)
    query = f"?{urllib.parse.urlencode(params)}" if params else ""
    url = f"http://{pod.status.pod_ip}:{prometheus_operator.PORT}{path}{query}"
    with urllib.request.urlopen(url, timeout=10) as resp:
        return json.load(resp)["data"]


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
