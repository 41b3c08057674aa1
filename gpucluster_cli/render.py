"""The objects a submission applies, built by the stack's own template functions (one source)."""

from __future__ import annotations

from typing import Any

from components.config import TrainingJob
from components.naming import Keys, common_labels
from components.published_settings import ClusterSettings
from components.training_spec import pod_monitor_spec, volcano_job_spec

FIELD_MANAGER = "gpucluster-cli"
MANAGED_BY = "gpucluster-cli"
VOLCANO_GROUP, VOLCANO_VERSION, VOLCANO_JOBS = "batch.volcano.sh", "v1alpha1", "jobs"
MONITOR_GROUP, MONITOR_VERSION, MONITORS = "monitoring.coreos.com", "v1", "podmonitors"


def team_label(settings: ClusterSettings) -> str:
    return f"{settings.label_prefix}/team"


def job_labels(settings: ClusterSettings, name: str, component: str, team: str | None) -> dict[str, str]:
    labels = {**common_labels(name, component), "app.kubernetes.io/managed-by": MANAGED_BY}
    if team is not None:
        labels[team_label(settings)] = team
    return labels


def volcano_job(settings: ClusterSettings, job: TrainingJob, team: str | None) -> dict[str, Any]:
    """The Volcano Job, its spec from ``volcano_job_spec`` exactly as the stack renders it."""
    args = settings.training_args(job)
    return {
        "apiVersion": f"{VOLCANO_GROUP}/{VOLCANO_VERSION}",
        "kind": "Job",
        "metadata": {"name": job.name, "namespace": settings.training_namespace,
                     "labels": job_labels(settings, job.name, "training-job", team)},
        "spec": volcano_job_spec(args),
    }


def pod_monitor(settings: ClusterSettings, job: TrainingJob, team: str | None) -> dict[str, Any]:
    """The job's PodMonitor, so the step-heartbeat and checkpoint alerts watch CLI jobs too."""
    args = settings.training_args(job)
    return {
        "apiVersion": f"{MONITOR_GROUP}/{MONITOR_VERSION}",
        "kind": "PodMonitor",
        "metadata": {"name": job.name, "namespace": settings.training_namespace,
                     "labels": {**job_labels(settings, job.name, "training-metrics", team), **args.monitor_labels}},
        "spec": pod_monitor_spec(args),
    }


def worker_selector(settings: ClusterSettings, name: str) -> str:
    """Label selector of a job's worker pods (the template's job label)."""
    return f"{Keys(settings.label_prefix).job}={name}"
