"""A gang-scheduled training job as a Pulumi component: N workers × G GPUs that start together or not at all.

The objects come from ``components.training_spec`` (no Pulumi), which the researcher CLI renders from too;
the builders are re-exported here for the stack's modules and the tests.
"""

from __future__ import annotations

from typing import Any, cast

import pulumi
import pulumi_kubernetes as k8s

from components.config import SchedulingEngine
from components.naming import common_labels
from components.training_spec import (
    DEFAULT_METRICS_PORT,
    METRICS_PORT_NAME,
    VOLCANO_GROUP_NAME_ANNOTATION,
    VOLCANO_RETRY_COUNT_ANNOTATION,
    TrainingJobArgs,
    checkpoint_env,
    job_grace_seconds,
    nccl_env,
    pod_label_meta,
    pod_monitor_spec,
    runtime_env,
    volcano_job_spec,
    worker_pod_template,
)

__all__ = [
    "DEFAULT_METRICS_PORT",
    "METRICS_PORT_NAME",
    "VOLCANO_GROUP_NAME_ANNOTATION",
    "VOLCANO_RETRY_COUNT_ANNOTATION",
    "GangTrainingJob",
    "TrainingJobArgs",
    "checkpoint_env",
    "job_grace_seconds",
    "nccl_env",
    "pod_label_meta",
    "pod_monitor_spec",
    "runtime_env",
    "volcano_job_spec",
    "worker_pod_template",
]


class GangTrainingJob(pulumi.ComponentResource):
    """One training job as a gang: a Volcano Job (or a kube-batch PodGroup + Indexed Job)."""

    gpus: pulumi.Output[int]
    job: pulumi.CustomResource
    monitor: pulumi.CustomResource

    def __init__(self, name: str, args: TrainingJobArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("gpu-cluster:training:GangTrainingJob", name, None, opts)
        job = args.job
        meta = k8s.meta.v1.ObjectMetaArgs(
            name=job.name, namespace=args.namespace, labels=common_labels(job.name, "training-job")
        )
        child = pulumi.ResourceOptions(parent=self)
        if args.engine is SchedulingEngine.VOLCANO:
            self.job = k8s.apiextensions.CustomResource(
                f"{name}-job", api_version="batch.volcano.sh/v1alpha1", kind="Job",
                metadata=meta, spec=volcano_job_spec(args), opts=child,
            )
        else:
            self._kube_batch(args, meta, child)
        self.monitor = k8s.apiextensions.CustomResource(
            f"{name}-podmonitor", api_version="monitoring.coreos.com/v1", kind="PodMonitor",
            metadata=k8s.meta.v1.ObjectMetaArgs(
                name=job.name, namespace=args.namespace,
                labels={**common_labels(job.name, "training-metrics"), **args.monitor_labels},
            ),
            spec=pod_monitor_spec(args), opts=child,
        )
        self.gpus = pulumi.Output.from_input(job.workers * job.gpus_per_worker)
        self.register_outputs({"gpus": self.gpus})

    def _kube_batch(self, args: TrainingJobArgs, meta: k8s.meta.v1.ObjectMetaArgs,
                    child: pulumi.ResourceOptions) -> None:
        """Legacy path: kube-batch has no job CRD, so a PodGroup gangs an Indexed Job's pods."""
        job = args.job
        k8s.apiextensions.CustomResource(
            f"{job.name}-podgroup", api_version="scheduling.incubator.k8s.io/v1alpha1", kind="PodGroup",
            metadata=meta,
            spec={"minMember": job.workers, "queue": args.queue, "priorityClassName": args.priority_class},
            opts=child,
        )
        template = worker_pod_template(args)
        template["metadata"]["annotations"]["scheduling.k8s.io/group-name"] = job.name
        self.job = k8s.batch.v1.Job(
            f"{job.name}-job", metadata=meta,
            spec=cast(Any, {"completionMode": "Indexed", "completions": job.workers, "parallelism": job.workers,
                            "backoffLimit": job.max_retries * job.workers, "template": template}),
            opts=child,
        )
