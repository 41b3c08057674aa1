"""Pure summaries of what the API returned: the gang's state, pods per node, restarts, checkpoint step."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from training_runtime.metrics import CHECKPOINT_LAST_STEP

UNSCHEDULED = "(not scheduled)"


@dataclass(frozen=True)
class JobStatus:
    name: str
    phase: str
    queue: str
    min_available: int
    #: Gang restarts (Volcano's retry count) and container restarts summed over the current pods.
    gang_restarts: int
    container_restarts: int
    pods_per_node: dict[str, list[str]] = field(default_factory=dict)
    pod_phases: dict[str, str] = field(default_factory=dict)


def summarize(job: dict[str, Any], pods: list[dict[str, Any]]) -> JobStatus:
    spec, status = job.get("spec", {}), job.get("status", {})
    per_node: dict[str, list[str]] = {}
    phases: dict[str, str] = {}
    restarts = 0
    for pod in sorted(pods, key=lambda p: rank_of(p["metadata"]["name"]) or 0):
        name = pod["metadata"]["name"]
        node = pod.get("spec", {}).get("nodeName") or UNSCHEDULED
        per_node.setdefault(node, []).append(name)
        phases[name] = pod.get("status", {}).get("phase", "Unknown")
        restarts += sum(int(c.get("restartCount", 0)) for c in pod.get("status", {}).get("containerStatuses", []))
    return JobStatus(
        name=job["metadata"]["name"],
        phase=status.get("state", {}).get("phase", "Pending"),
        queue=spec.get("queue", ""),
        min_available=int(spec.get("minAvailable", 0)),
        gang_restarts=int(status.get("retryCount", 0)),
        container_restarts=restarts,
        pods_per_node=per_node,
        pod_phases=phases,
    )


def rank_of(pod_name: str) -> int | None:
    """Volcano names a task's pods ``<job>-<task>-<index>``; the index is the rank."""
    m = re.search(r"-(\d+)$", pod_name)
    return int(m.group(1)) if m else None


def worker_pod(job_name: str, rank: int) -> str:
    return f"{job_name}-worker-{rank}"


def checkpoint_step(metrics_text: str) -> int | None:
    """The newest durable checkpoint step the runtime reports (max over ranks), or None if absent."""
    steps: list[float] = []
    try:
        for family in text_string_to_metric_families(metrics_text):
            if family.name == CHECKPOINT_LAST_STEP:
                steps += [s.value for s in family.samples if s.name == CHECKPOINT_LAST_STEP]
    except ValueError:
        return None
    return int(max(steps)) if steps else None


def job_row(job: dict[str, Any], team_label: str) -> tuple[str, str, str, str, str, str]:
    """name, phase, queue, team, workers running/wanted, creator (the managing tool)."""
    meta, spec, status = job["metadata"], job.get("spec", {}), job.get("status", {})
    labels = meta.get("labels", {})
    return (
        meta["name"],
        status.get("state", {}).get("phase", "Pending"),
        spec.get("queue", ""),
        labels.get(team_label, "-"),
        f"{status.get('running', 0)}/{spec.get('minAvailable', 0)}",
        labels.get("app.kubernetes.io/managed-by", "-"),
    )
