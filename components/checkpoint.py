"""Checkpoint storage: shared filesystems that no infrastructure change can delete, and a fio check.

Per filesystem in ``checkpoint.filesystems``:

* dynamic backends (NFS ``nfs.csi.k8s.io``, FSx for Lustre ``fsx.csi.aws.com``, WEKA ``csi.weka.io``,
  VAST ``csi.vastdata.com``; each backend's model in ``components/config/checkpoint.py`` names its driver
  and builds its parameters): a StorageClass with ``reclaimPolicy: Retain`` and those parameters, and
  one ReadWriteMany PersistentVolumeClaim in the training namespace; the driver creates the
  PersistentVolume, which keeps the class's Retain policy.
* ``static`` (a pre-provisioned volume of any CSI driver): a PersistentVolume with
  ``persistentVolumeReclaimPolicy: Retain``, pre-bound to the claim through ``claimRef``, and the claim.

No data loss by construction: claims and volumes are registered with ``protect`` (Pulumi refuses to
delete or replace them: ``pulumi destroy`` stops, a diff that would replace one fails) and
``retainOnDelete`` (if someone lifts protection, Pulumi still only forgets the object). Retain on the
Kubernetes side keeps the data even if a claim is deleted by hand.

Renames: a PVC cannot be renamed, so Kubernetes names come from the filesystem's oldest name
(``renamedFrom[0]``). Renaming an entry in the stack file — ``name: weka-main`` with
``renamedFrom: [weka-ckpt]`` — keeps the objects and gives each resource ``aliases`` to its earlier
logical names, so the preview shows no change. Renaming or re-parenting this component in code works
the same way: pass ``pulumi.Alias(name="<old name>")`` (or ``parent=``) in its options; children
inherit their parent's aliases.

The throughput check (``checkpoint.throughputCheck``) is an Indexed Job — or, with ``weekly``, a
CronJob at a minute/hour/day drawn once per stack by ``pulumi_random`` so many stacks do not hammer
shared storage at the same moment — whose pods each take a whole GPU node, wait at a barrier on the
shared volume, run fio (``bs=16m``, ``direct=1``, ``end_fsync=1``, one file per writer, JSON results
on the volume) and delete their data; index 0 then sums every node's result with ``checkpoint-reduce``
and its exit status is the verdict.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from typing import Any, cast

import pulumi
import pulumi_kubernetes as k8s
import pulumi_random as random

from agents.checkpoint_check.contract import APP as CHECK_APP
from agents.checkpoint_check.contract import ReduceSettings
from components import images
from components.config import (
    CheckpointBudget,
    ClusterConfig,
    Filesystem,
    StaticFilesystem,
    ThroughputCheck,
)
from components.config.sizing import (
    assess_filesystem,
    sizing_problems,
)
from components.goodput_model import interval_warnings
from components.naming import VOLCANO_PREEMPTABLE_ANNOTATION, VOLCANO_QUEUE_ANNOTATION, Keys, common_labels
from components.security import EPHEMERAL_LIMIT, EPHEMERAL_REQUEST, container_security_context, pod_security_context
from components.workloads import onprem_required_affinity, pool_tolerations

#: fio's block size for checkpoint-like writes: large sequential I/O, as a framework flushes tensors.
FIO_BLOCK_SIZE = "16m"
#: Outstanding I/Os per writer with libaio; enough to keep a 16 MiB stream busy without a big queue.
FIO_IODEPTH = 4
#: Sub-directory of the checkpoint volume the check may write to; it never sees training data.
CHECK_SUBPATH = ".throughput-check"
CHECK_MOUNT = "/work"
#: How long a writer waits at the barrier for its peers before giving up (seconds).
BARRIER_SECONDS = 900

#: Logical-name suffix of each object kind (aliases are built from the same suffixes).
SUFFIXES = {"StorageClass": "class", "PersistentVolume": "volume", "PersistentVolumeClaim": "claim"}


def claim_spec(fs: Filesystem) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "accessModes": ["ReadWriteMany"],
        "resources": {"requests": {"storage": f"{fs.capacity_gi}Gi"}},
    }
    if not fs.dynamic:
        # Empty class: no provisioner may step in; the claim binds only to its own volume.
        spec.update(storageClassName="", volumeName=fs.object_name)
    else:
        spec["storageClassName"] = fs.object_name
    return spec


def volume_spec(fs: StaticFilesystem, namespace: str) -> dict[str, Any]:
    """A pre-provisioned volume, reserved for its claim by ``claimRef`` so no other claim can take it."""
    spec: dict[str, Any] = {
        "capacity": {"storage": f"{fs.capacity_gi}Gi"},
        "accessModes": ["ReadWriteMany"],
        "persistentVolumeReclaimPolicy": "Retain",
        "storageClassName": "",
        "volumeMode": "Filesystem",
        "claimRef": {"namespace": namespace, "name": fs.object_name},
        "csi": {"driver": fs.driver, "volumeHandle": fs.volume_handle},
    }
    if fs.volume_attributes:
        spec["csi"]["volumeAttributes"] = dict(fs.volume_attributes)
    if fs.mount_options:
        spec["mountOptions"] = list(fs.mount_options)
    return spec


def aliases(fs: Filesystem, kind: str) -> list[pulumi.Alias]:
    """Earlier logical names of one object, from the filesystem's ``renamedFrom``."""
    return [pulumi.Alias(name=f"{old}-{SUFFIXES[kind]}") for old in fs.renamed_from]


# --------------------------------------------------------------------------- throughput check


def fio_command(check: ThroughputCheck, directory: str, output: str) -> list[str]:
    """fio as the check runs it: one file per writer, direct I/O, fsync at the end, files removed after."""
    return [
        "fio", "--name=checkpoint", f"--directory={directory}", "--rw=write", f"--bs={FIO_BLOCK_SIZE}",
        "--direct=1", "--end_fsync=1", "--ioengine=libaio", f"--iodepth={FIO_IODEPTH}",
        f"--numjobs={check.writers_per_node}", f"--size={check.size_per_writer_gi}g", "--unlink=1",
        "--output-format=json", f"--output={output}",
    ]


def writer_script(check: ThroughputCheck, reduce: ReduceSettings) -> str:
    """The pod's shell: barrier, fio, atomic result, and on index 0 the reducer (its exit is the verdict)."""
    run = f'{CHECK_MOUNT}/"$RUN_ID"'
    result = f'{run}/results/"$JOB_COMPLETION_INDEX".json'
    fio = " ".join(shlex.quote(a) for a in fio_command(check, "DIR", "OUT"))
    fio = fio.replace("DIR", f'{run}/data/"$JOB_COMPLETION_INDEX"').replace("OUT", f"{result}.tmp")
    return "\n".join([
        "set -eu",
        f'mkdir -p {run}/ready {run}/results {run}/data/"$JOB_COMPLETION_INDEX"',
        f'touch {run}/ready/"$JOB_COMPLETION_INDEX"',
        f"deadline=$(( $(date +%s) + {BARRIER_SECONDS} ))",
        f'until [ "$(ls {run}/ready | wc -l)" -ge {check.nodes} ]; do',
        '  [ "$(date +%s)" -lt "$deadline" ] || { echo "barrier: peers missing" >&2; exit 2; }',
        "  sleep 1",
        "done",
        # The reducer's exit is the verdict (0 within budget, 1 below, 2 invalid input): a failed fio measured
        # nothing, so it must read as invalid input, never as "below budget" with fio's own status 1.
        f'{fio} || {{ echo "fio failed (exit $?): no measurement" >&2; exit 2; }}',
        f"mv {result}.tmp {result}",
        f'if [ "$JOB_COMPLETION_INDEX" = 0 ]; then exec {reduce.command(f"{run}/results")}; fi',
    ])


def weekly_schedule(minute: int, hour: int, weekday: int) -> str:
    """The CronJob schedule for one stack's draw; ranges are checked because a bad draw would never fire."""
    if not (0 <= minute <= 59 and 0 <= hour <= 23 and 0 <= weekday <= 6):
        raise ValueError(f"no such time: minute {minute}, hour {hour}, weekday {weekday}")
    return f"{minute} {hour} * * {weekday}"


@dataclass(frozen=True)
class CheckArgs:
    check: ThroughputCheck
    filesystem: Filesystem
    namespace: str
    pool: str
    gpus_per_node: int
    gpu_resource: str
    label_prefix: str
    scheduler_name: str
    queue: str
    priority_class: str
    reduce: ReduceSettings
    registry: str = images.AGENT_REGISTRY

    @property
    def image(self) -> str:
        return self.check.image or images.agent_image(CHECK_APP, self.registry)

    @property
    def name(self) -> str:
        return f"{CHECK_APP}-{self.filesystem.name}"


def check_job_spec(args: CheckArgs) -> k8s.batch.v1.JobSpecArgs:
    """The Indexed Job: one pod per node, each holding the node's GPUs so nothing else shares its links."""
    check, keys = args.check, Keys(args.label_prefix)
    labels = {**common_labels(CHECK_APP, CHECK_APP), keys.job: args.name}
    gpus = str(args.gpus_per_node)
    affinity = {
        **onprem_required_affinity(keys, args.pool),
        "podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{
            "labelSelector": {"matchLabels": {keys.job: args.name}},
            "topologyKey": "kubernetes.io/hostname",
        }]},
    }
    container = k8s.core.v1.ContainerArgs(
        name="fio",
        image=args.image,
        command=["/bin/sh", "-c", writer_script(check, args.reduce)],
        env=[k8s.core.v1.EnvVarArgs(
            name="RUN_ID",
            # A fresh directory per run: the reducer never reads an earlier run's results.
            value_from=k8s.core.v1.EnvVarSourceArgs(field_ref=k8s.core.v1.ObjectFieldSelectorArgs(
                field_path="metadata.labels['batch.kubernetes.io/controller-uid']")),
        )],
        resources=k8s.core.v1.ResourceRequirementsArgs(
            requests={args.gpu_resource: gpus, "cpu": "8", "memory": "16Gi", "ephemeral-storage": EPHEMERAL_REQUEST},
            limits={args.gpu_resource: gpus, "memory": "16Gi", "ephemeral-storage": EPHEMERAL_LIMIT},
        ),
        security_context=container_security_context(),
        volume_mounts=[
            k8s.core.v1.VolumeMountArgs(name="checkpoints", mount_path=CHECK_MOUNT, sub_path=CHECK_SUBPATH),
            k8s.core.v1.VolumeMountArgs(name="tmp", mount_path="/tmp"),
        ],
    )
    pod = k8s.core.v1.PodSpecArgs(
        scheduler_name=args.scheduler_name,
        priority_class_name=args.priority_class,
        restart_policy="Never",
        affinity=cast(Any, affinity),
        tolerations=pool_tolerations(keys, [args.pool]),
        # fio and the reducer only touch the shared volume; they never call the Kubernetes API.
        automount_service_account_token=False,
        security_context=pod_security_context(),
        containers=[container],
        volumes=[
            k8s.core.v1.VolumeArgs(name="checkpoints", persistent_volume_claim=k8s.core.v1.
                                   PersistentVolumeClaimVolumeSourceArgs(claim_name=args.filesystem.object_name)),
            k8s.core.v1.VolumeArgs(name="tmp", empty_dir=k8s.core.v1.EmptyDirVolumeSourceArgs(size_limit="64Mi")),
        ],
    )
    return k8s.batch.v1.JobSpecArgs(
        completion_mode="Indexed",
        completions=check.nodes,
        parallelism=check.nodes,
        # A retried writer would measure a different moment; one run, one verdict.
        backoff_limit=0,
        active_deadline_seconds=check.deadline_seconds,
        template=k8s.core.v1.PodTemplateSpecArgs(
            metadata=k8s.meta.v1.ObjectMetaArgs(
                labels=labels,
                # The inference queue is reclaimable: a training gang takes these nodes back at once.
                annotations={VOLCANO_QUEUE_ANNOTATION: args.queue, VOLCANO_PREEMPTABLE_ANNOTATION: "true"},
            ),
            spec=pod,
        ),
    )


# --------------------------------------------------------------------------- component


@dataclass(frozen=True)
class CheckpointStorageArgs:
    filesystems: tuple[Filesystem, ...]
    budget: CheckpointBudget
    namespace: str
    check: CheckArgs | None
    warnings: tuple[str, ...]

    @classmethod
    def from_config(cls, cfg: ClusterConfig) -> CheckpointStorageArgs:
        tc = cfg.checkpoint.throughput_check
        check = None
        if tc.enabled:
            assert tc.filesystem is not None
            pool = cfg.pool(tc.pool or cfg.pools[0].name)
            check = CheckArgs(
                check=tc, filesystem=cfg.filesystem(tc.filesystem), namespace=cfg.training_namespace,
                pool=pool.name, gpus_per_node=pool.gpus_per_node, gpu_resource=cfg.gpu_resource,
                label_prefix=cfg.label_prefix, scheduler_name=cfg.scheduling.scheduler_name,
                queue=cfg.scheduling.inference_queue.name, priority_class=cfg.priorities.inference.name,
                reduce=reduce_settings(cfg), registry=cfg.agent_registry,
            )
        # Strict mode already failed validation; otherwise the same findings become preview warnings.
        warnings = tuple(f"{path}: {message}" for path, message, _ in sizing_problems(cfg))
        warnings += tuple(interval_warnings(cfg))  # interval far from the Young–Daly optimum (goodput_model)
        return cls(tuple(cfg.checkpoint.filesystems), cfg.checkpoint.budget, cfg.training_namespace, check, warnings)


class CheckpointStorage(pulumi.ComponentResource):
    """Per filesystem its class/volume and a protected RWX claim; optionally the fio throughput check."""

    claims: dict[str, pulumi.Output[str]]

    def __init__(self, name: str, args: CheckpointStorageArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("gpu-cluster:checkpoint:CheckpointStorage", name, None, opts)
        for warning in args.warnings:
            pulumi.log.warn(warning, self)
        self.storage_classes: dict[str, k8s.storage.v1.StorageClass] = {}
        self.volumes: dict[str, k8s.core.v1.PersistentVolume] = {}
        self.claim_resources: dict[str, k8s.core.v1.PersistentVolumeClaim] = {}
        for fs in args.filesystems:
            self._filesystem(fs, args.namespace)
        self.check: pulumi.CustomResource | None = None
        if args.check is not None:
            self.check = self._throughput_check(args.check)
        self.claims = {fs.name: pulumi.Output.from_input(fs.object_name) for fs in args.filesystems}
        self.register_outputs({
            "claims": self.claims,
            "margins_gbps": {fs.name: round(assess_filesystem(fs, args.budget).margin_gbps, 3)
                             for fs in args.filesystems},
        })

    def _keep(self, fs: Filesystem, kind: str, depends_on: list[pulumi.Resource]) -> pulumi.ResourceOptions:
        """Options for objects that hold checkpoint data: never deleted, never replaced, renames aliased."""
        return pulumi.ResourceOptions(parent=self, protect=True, retain_on_delete=True,
                                      aliases=aliases(fs, kind), depends_on=depends_on)

    def _filesystem(self, fs: Filesystem, namespace: str) -> None:
        labels = common_labels(fs.name, "checkpoint-storage")
        depends: list[pulumi.Resource] = []
        if isinstance(fs, StaticFilesystem):
            volume = k8s.core.v1.PersistentVolume(
                f"{fs.name}-volume",
                metadata=k8s.meta.v1.ObjectMetaArgs(name=fs.object_name, labels=labels),
                spec=cast(Any, volume_spec(fs, namespace)),
                opts=self._keep(fs, "PersistentVolume", []),
            )
            self.volumes[fs.name] = volume
            depends.append(volume)
        else:
            # Parameters are immutable: a change replaces the class, which leaves bound volumes untouched.
            storage_class = k8s.storage.v1.StorageClass(
                f"{fs.name}-class",
                metadata=k8s.meta.v1.ObjectMetaArgs(name=fs.object_name, labels=labels),
                provisioner=fs.driver_name,
                parameters=fs.storage_class_parameters(),
                reclaim_policy="Retain",
                volume_binding_mode="Immediate",
                allow_volume_expansion=True,
                mount_options=list(fs.mount_options) or None,
                opts=pulumi.ResourceOptions(parent=self, aliases=aliases(fs, "StorageClass")),
            )
            self.storage_classes[fs.name] = storage_class
            depends.append(storage_class)
        self.claim_resources[fs.name] = k8s.core.v1.PersistentVolumeClaim(
            f"{fs.name}-claim",
            metadata=k8s.meta.v1.ObjectMetaArgs(
                name=fs.object_name, namespace=namespace, labels=labels,
                # Shared filesystems bind at once; do not let `pulumi up` wait on a consumer pod.
                annotations={"pulumi.com/skipAwait": "true"},
            ),
            spec=cast(Any, claim_spec(fs)),
            opts=self._keep(fs, "PersistentVolumeClaim", depends),
        )

    def _throughput_check(self, args: CheckArgs) -> pulumi.CustomResource:
        labels = common_labels(CHECK_APP, CHECK_APP)
        # A measurement can take many minutes and may fail on purpose; `pulumi up` must not wait on it.
        meta = k8s.meta.v1.ObjectMetaArgs(name=args.name, namespace=args.namespace, labels=labels,
                                          annotations={"pulumi.com/skipAwait": "true"})
        claim = self.claim_resources[args.filesystem.name]
        spec = check_job_spec(args)
        if not args.check.weekly:
            return k8s.batch.v1.Job(f"{args.name}-job", metadata=meta, spec=spec,
                                    opts=pulumi.ResourceOptions(parent=self, depends_on=[claim]))
        # One draw per stack and filesystem, kept in state: stacks spread over the week and never move.
        keepers = {"stack": pulumi.get_stack(), "filesystem": args.filesystem.object_name}
        seed = f"{pulumi.get_stack()}/{args.filesystem.object_name}"
        draws = [
            random.RandomInteger(f"{args.name}-{unit}", min=0, max=top, keepers=keepers, seed=f"{seed}/{unit}",
                                 opts=pulumi.ResourceOptions(parent=self))
            for unit, top in (("minute", 59), ("hour", 23), ("weekday", 6))
        ]
        schedule = pulumi.Output.all(*(d.result for d in draws)).apply(lambda v: weekly_schedule(*v))
        return k8s.batch.v1.CronJob(
            f"{args.name}-cron", metadata=meta,
            spec=k8s.batch.v1.CronJobSpecArgs(
                schedule=schedule,
                time_zone="Etc/UTC",
                concurrency_policy="Forbid",
                starting_deadline_seconds=3600,
                successful_jobs_history_limit=3,
                failed_jobs_history_limit=3,
                job_template=k8s.batch.v1.JobTemplateSpecArgs(
                    metadata=k8s.meta.v1.ObjectMetaArgs(labels=labels), spec=spec),
            ),
            opts=pulumi.ResourceOptions(parent=self, depends_on=[claim]),
        )


def reduce_settings(cfg: ClusterConfig) -> ReduceSettings:
    """The reducer's settings for the stack's throughput check: every node's result, the budget's bandwidth."""
    check = cfg.checkpoint.throughput_check
    return ReduceSettings(expect=check.nodes, budget_gbps=cfg.checkpoint.budget.aggregate_gbps,
                          wait_seconds=check.deadline_seconds)
