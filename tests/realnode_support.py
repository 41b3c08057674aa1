"""What the real-node end-to-end tests share: why this machine cannot run them, and a private state folder."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from tests.polling import wait
from tools.localcluster import control
from tools.localcluster.plan import Layout
from tools.localcluster.realcluster import (  # noqa: F401 - shared with the chaos soak, re-exported for the tests
    BUILT,
    child_pids,
    container_pid,
    lease_holder,
    private_state,
    prometheus_get,
    ready_pods,
    why_not,
)

ROOT = Path(__file__).resolve().parents[1]


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
