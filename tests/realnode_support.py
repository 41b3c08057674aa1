"""What the real-node end-to-end tests share: why this machine cannot run them, and a private state folder."""

from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tests.polling import wait
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


def ready_pods(lay: Layout, namespace: str, app: str) -> list[Any]:
    """The Ready, not terminating pods of ``app`` (its ``app.kubernetes.io/name`` label)."""
    from kubernetes import client

    core: Any = client.CoreV1Api(control.api_client(lay))
    pods = core.list_namespaced_pod(namespace, label_selector=f"app.kubernetes.io/name={app}").items
    return [p for p in pods if p.metadata.deletion_timestamp is None
            and any(c.type == "Ready" and c.status == "True" for c in p.status.conditions or [])]


def lease_holder(lay: Layout, namespace: str, lease: str) -> str:
    from kubernetes import client

    spec = client.CoordinationV1Api(control.api_client(lay)).read_namespaced_lease(lease, namespace).spec
    return str(spec.holder_identity or "")


def delete_the_leader(lay: Layout, namespace: str, app: str, settings: dict[str, Any]) -> tuple[str, str, float]:
    """Delete the pod of ``app`` that holds its Lease (``settings``: the agent's deployed settings); the old leader,
    the new one and the seconds until another Ready replica held the Lease. Fails when that took longer than the
    Lease allows: the deleted leader's lease running out, then the standby's next attempt."""
    from kubernetes import client
    from kubernetes.client import ApiException

    lease = settings["lease_name"]
    wait(f"a {app} leader", lambda: lease_holder(lay, namespace, lease), 90, ignore=(ApiException,))
    leader = lease_holder(lay, namespace, lease)
    assert leader in {p.metadata.name for p in ready_pods(lay, namespace, app)}, f"{app}'s leader {leader} not Ready"
    started = time.monotonic()
    client.CoreV1Api(control.api_client(lay)).delete_namespaced_pod(leader, namespace)

    def new_leader() -> str:
        # The deleted leader releases its Lease on SIGTERM, so the next replica to try takes it at once: the
        # standby, or the Deployment's replacement pod if that one starts and tries first. Either is a leader.
        holder = lease_holder(lay, namespace, lease)
        ready = {p.metadata.name for p in ready_pods(lay, namespace, app)}
        return holder if holder and holder != leader and holder in ready else ""

    wait(f"another {app} replica holding the Lease", new_leader, 120, ignore=(ApiException,))
    failover = round(time.monotonic() - started, 1)
    successor = new_leader()
    time.sleep(3)
    assert lease_holder(lay, namespace, lease) != leader, "the deleted leader took its Lease back"
    attempt = settings.get("retry_period_seconds") or settings["poll_seconds"]
    assert failover <= settings["lease_duration_seconds"] + 2 * attempt + 10, failover
    return leader, successor, failover


def deployed_settings(lay: Layout, namespace: str, app: str) -> dict[str, Any]:
    """The settings document of ``app`` as the stack deployed it (its ``<app>-settings`` ConfigMap, JSON or YAML)."""
    import yaml
    from kubernetes import client

    core: Any = client.CoreV1Api(control.api_client(lay))
    cm = core.read_namespaced_config_map(f"{app}-settings", namespace)
    raw = next(iter((cm.data or {}).values()))
    loaded: dict[str, Any] = json.loads(raw) if raw.lstrip().startswith("{") else yaml.safe_load(raw)
    return loaded
