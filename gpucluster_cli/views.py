"""Pure summaries of what the API returned: the gang's state, pods per node, restarts, checkpoint step."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from components.config import LEAF_TIER, SPINE_TIER, GpuPool, TrainingJob, fewest_leaves
from components.published_settings import ClusterSettings
from components.training_spec import restart_in_place
from training_runtime.metrics import CHECKPOINT_LAST_STEP

UNSCHEDULED = "(not scheduled)"
#: Where each ``highestTierAllowed`` keeps a gang, in the user's words.
_TIER_PLACES = {LEAF_TIER: "inside one leaf switch", SPINE_TIER: "under one spine switch, in as few leaves as fit"}


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


def placement_line(job_spec: Mapping[str, Any]) -> str | None:
    """What the Job's ``networkTopology`` asks of Volcano, in words; None for a gang without one (a flat pool, or
    a gang larger than any spine)."""
    constraint = job_spec.get("networkTopology")
    if not isinstance(constraint, Mapping):
        return None
    tier, mode = constraint.get("highestTierAllowed"), constraint.get("mode")
    where = _TIER_PLACES.get(tier, f"within HyperNode tier {tier}") if isinstance(tier, int) else "by topology"
    how = ("it waits until it fits there" if mode == "hard"
           else "preferred: it is placed wherever it fits rather than wait")
    return f"placement: {where} ({mode}: {how})"


def restart_line(settings: ClusterSettings, job: TrainingJob) -> str | None:
    """How a crash restarts the gang, where the cluster restarts gangs in place and this job cannot (no command for
    the supervisor to run, or no checkpoint filesystem to meet on and resume from); None otherwise."""
    cluster = settings.restart_in_place
    if cluster is None or not cluster.enabled or restart_in_place(job, cluster) is not None:
        return None
    missing = [what for what, absent in (("command", not job.command), ("checkpoint filesystem",
                                                                        job.checkpoint is None)) if absent]
    return (f"restarts: the whole gang, pod by pod, at every crash (the spec has no {' and no '.join(missing)}: "
            "it cannot restart in place" + (", and starts again from step 0)" if job.checkpoint is None else ")"))


def fabric_pool(settings: ClusterSettings, nodes: list[str]) -> GpuPool | None:
    """The pool with a topology that holds any of ``nodes`` (a gang's nodes are all in its pool)."""
    wanted = set(nodes)
    for entry in settings.pools:
        if entry.pool.topology is not None and wanted.intersection(entry.pool.node_names):
            return entry.pool
    return None


def leaves_line(per_node: Mapping[str, list[str]], pool: GpuPool | None,
                leaf_label: Callable[[str], str | None]) -> str | None:
    """The leaves a placed gang spans (pods on each), beside the fewest its nodes could fill; None until a pod is
    placed or when its pool has no topology. A leaf comes from the stack's topology where it names its nodes, else
    from the node's leaf label (``leaf_label``; None where it cannot be read)."""
    placed = {node: pods for node, pods in per_node.items() if node != UNSCHEDULED}
    if not placed or pool is None or pool.topology is None:
        return None
    named = pool.topology.leaf_of()
    pods_on: dict[str, int] = {}
    unknown = 0
    for node, pods in placed.items():
        leaf = named.get(node) or leaf_label(node)
        if leaf is None:
            unknown += len(pods)
        else:
            pods_on[leaf] = pods_on.get(leaf, 0) + len(pods)
    shown = ", ".join(f"{leaf} ({n} pod{'' if n == 1 else 's'})" for leaf, n in sorted(pods_on.items()))
    text = f"leaves spanned: {len(pods_on)}{f' ({shown})' if shown else ''}; fewest possible for its " \
           f"{len(placed)} node(s): {fewest_leaves(pool.topology, len(placed))}"
    if unknown:
        text += f"; {unknown} pod(s) on nodes whose leaf is unknown (their leaf label cannot be read)"
    return text
