"""A gang-scheduled training job template: N workers × G GPUs that start together or not at all.

"Let it crash": any failed or evicted worker restarts the whole gang (a partial NCCL ring cannot make
progress), up to the retry budget; each restart resumes from the newest checkpoint in the job's own
sub-path of the checkpoint filesystem. NCCL's watchdog turns a silent hang into a crash.

Every environment variable set here has a reader: the training runtime (``training_runtime/settings.py``)
or PyTorch's NCCL watchdog and NCCL itself (``training_runtime.settings.FRAMEWORK_ENV``); a test checks
it. The workers expose the runtime's metrics on a ``metrics`` port that the job's PodMonitor scrapes, so
the step-heartbeat and checkpoint alerts watch series that exist.

The builders return plain dicts and import no Pulumi: the stack's ``GangTrainingJob``
(``components/training_job.py``) and the researcher CLI (``gpucluster_cli``) render the same objects from
them, and the CLI installs without the Pulumi SDK.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from components.config import (
    ClusterConfig,
    GpuPool,
    Nccl,
    RestartInPlace,
    SchedulingEngine,
    TopologyMode,
    TrainingJob,
    gang_tier,
    nodes_for,
)
from components.config.sizing import termination_grace_seconds
from components.config.training import VOLCANO_PYTORCH_PORT
from components.naming import (
    TRAINING,
    VOLCANO_PREEMPTABLE_ANNOTATION,
    Keys,
    checkpoint_claim_name,
    common_labels,
)
from components.pod_spec import gpu_resources_manifest, onprem_required_affinity, pool_tolerations_manifest
from training_runtime.settings import CHECKPOINT_LOCAL_CACHE, REPLACE_TIMEOUT, RESTARTS_BEFORE_REPLACE

#: Default port of the training runtime's /metrics endpoint (config: training.metricsPort).
DEFAULT_METRICS_PORT = 9318
METRICS_PORT_NAME = "metrics"
#: Volcano stamps these on every pod it creates for a Job (volcano.sh/apis batch/v1alpha1 labels.go and the
#: job controller's createJobPod): the job's retry count and the PodGroup name ``<job>-<job UID>``.
VOLCANO_RETRY_COUNT_ANNOTATION = "volcano.sh/job-retry-count"
VOLCANO_GROUP_NAME_ANNOTATION = "scheduling.k8s.io/group-name"


@dataclass(frozen=True)
class TrainingJobArgs:
    job: TrainingJob
    pool: GpuPool
    nccl: Nccl
    namespace: str
    engine: SchedulingEngine
    scheduler_name: str
    queue: str
    priority_class: str
    label_prefix: str
    gpu_resource: str
    #: The checkpoint claim to mount: the filesystem's stable object name (it survives renames).
    checkpoint_claim: str | None = None
    #: Workers start behind the handover scheduling gate (lifted by the burst controller; see config.Handover).
    handover_gate: bool = False
    #: Port of the training runtime's /metrics endpoint in every worker.
    metrics_port: int = DEFAULT_METRICS_PORT
    #: The step heartbeat's metric name the alert rules watch (observability.stepHeartbeatMetric).
    heartbeat_metric: str = "training_step_heartbeat_timestamp_seconds"
    scrape_interval_seconds: int = 15
    #: Labels the Prometheus Operator selects monitors by (observability.monitorLabels).
    monitor_labels: dict[str, str] = field(default_factory=dict)
    #: Whether the workers may be reclaim victims: only in a reclaimable team queue, where Volcano's
    #: capacity plugin takes back just what the team holds above its guarantee.
    preemptable: bool = False
    #: Seconds a worker gets between SIGTERM and SIGKILL: long enough for one emergency checkpoint
    #: (components.checkpoint_sizing.termination_grace_seconds); ``None`` keeps Kubernetes' 30 s.
    termination_grace_seconds: int | None = None
    #: How the gang is held to its pool's fabric (``scheduling.topologyMode``); ``None`` when the pool has no
    #: topology or the engine is not Volcano.
    topology_mode: TopologyMode | None = None
    #: The supervisor that restarts the gang in place (``training.restartInPlace``); ``None`` where it is off or
    #: the job lacks a command or a checkpoint (see :func:`restart_in_place`).
    restart_in_place: RestartInPlace | None = None

    @classmethod
    def from_config(cls, cfg: ClusterConfig, job: TrainingJob) -> TrainingJobArgs:
        team = cfg.scheduling.team(job.team) if job.team is not None else None
        return cls(
            job=job,
            pool=cfg.pool(job.pool),
            nccl=cfg.training.nccl,
            namespace=cfg.training_namespace,
            engine=cfg.scheduling.engine,
            scheduler_name=cfg.scheduling.scheduler_name,
            # The pool's own queue when training queues are per pool (see GangSchedulerArgs.queues).
            # A team's gangs go to the team's queue (see GangSchedulerArgs.team_queues).
            queue=team.queue if team is not None else cfg.scheduling.training_queue_names(
                p.name for p in cfg.pools)[job.pool],
            priority_class=cfg.priorities.training.name,
            label_prefix=cfg.label_prefix,
            gpu_resource=cfg.gpu_resource,
            checkpoint_claim=cfg.filesystem(job.checkpoint.filesystem).object_name if job.checkpoint else None,
            # kube-batch predates scheduling gates; only Volcano honours them.
            handover_gate=cfg.handover_active and cfg.scheduling.engine is SchedulingEngine.VOLCANO,
            metrics_port=cfg.training.metrics_port,
            heartbeat_metric=cfg.observability.step_heartbeat_metric,
            scrape_interval_seconds=cfg.observability.scrape_interval_seconds,
            monitor_labels=dict(cfg.observability.monitor_labels),
            preemptable=team is not None and team.reclaimable,
            termination_grace_seconds=job_grace_seconds(cfg, job),
            topology_mode=topology_mode(cfg.pool(job.pool), cfg.scheduling.engine, cfg.scheduling.topology_mode),
            restart_in_place=restart_in_place(job, cfg.training.restart_in_place),
        )


def restart_in_place(job: TrainingJob, settings: RestartInPlace | None) -> RestartInPlace | None:
    """The stack's restart-in-place settings for ``job``, or ``None``: the supervisor runs the job's own command
    and meets the other ranks on the job's checkpoint volume, from which the workers resume."""
    if settings is None or not settings.enabled or not job.command or job.checkpoint is None:
        return None
    return settings


#: What runs a worker's command under the training runtime's supervisor (the image carries the runtime); the policy
#: pack checks training Jobs for this prefix.
SUPERVISOR_COMMAND = ("python3", "-m", "training_runtime.supervisor", "--")


def supervised_command(command: list[str]) -> list[str]:
    """The worker's command under the training runtime's supervisor."""
    return [*SUPERVISOR_COMMAND, *command]


def supervisor_env(settings: RestartInPlace | None) -> list[dict[str, str]]:
    if settings is None:
        return []
    return [
        {"name": RESTARTS_BEFORE_REPLACE, "value": str(settings.restarts_before_replace)},
        {"name": REPLACE_TIMEOUT, "value": str(settings.replace_timeout_seconds)},
    ]


#: The pod's memory-backed ``/dev/shm`` (the ``dshm`` emptyDir): it outlives a worker process, not the pod.
SHM_MOUNT = "/dev/shm"
#: Where each rank keeps a copy of its newest shard for a restart in place (``training_runtime.local_cache``).
LOCAL_CACHE_PATH = f"{SHM_MOUNT}/checkpoint-cache"


def local_cache_env(settings: RestartInPlace | None) -> list[dict[str, str]]:
    """The local shard copy, only where the gang restarts in place: there the pod, and so its ``/dev/shm``, survives
    the restart; elsewhere every restart starts new pods, whose copy would be empty. The copy counts against the
    pod's memory limit (one shard per rank, two while a checkpoint is written; see docs/training.md)."""
    return [] if settings is None else [{"name": CHECKPOINT_LOCAL_CACHE, "value": LOCAL_CACHE_PATH}]


def topology_mode(pool: GpuPool, engine: SchedulingEngine, mode: TopologyMode) -> TopologyMode | None:
    """The stack's mode where the gang's pool has a topology Volcano places by; ``None`` otherwise."""
    return mode if pool.topology is not None and engine is SchedulingEngine.VOLCANO else None


def network_topology(args: TrainingJobArgs) -> dict[str, Any] | None:
    """The Volcano Job's ``networkTopology``: the lowest tier one switch of which holds the whole gang (one leaf,
    else one spine), in the stack's mode; ``None`` for a flat pool, or a gang no spine holds."""
    topology = args.pool.topology
    if args.topology_mode is None or topology is None:
        return None
    job = args.job
    tier = gang_tier(topology, nodes_for(job.workers, job.gpus_per_worker, args.pool.gpus_per_node))
    return None if tier is None else {"mode": args.topology_mode, "highestTierAllowed": tier}


def job_grace_seconds(cfg: ClusterConfig, job: TrainingJob) -> int | None:
    """The grace that holds one emergency checkpoint of ``job`` on its filesystem (``None``: no checkpoints)."""
    if job.checkpoint is None:
        return None
    budget = cfg.checkpoint.budget
    return termination_grace_seconds(budget.size_tb, job.workers * job.gpus_per_worker,
                                     cfg.filesystem(job.checkpoint.filesystem).write_gbps, budget.client_link_gbps)


def nccl_env(nccl: Nccl) -> list[dict[str, Any]]:
    """The NCCL watchdog (read by PyTorch's ProcessGroupNCCL) and the runtime's collective timeout.

    No environment variable sets the collective timeout in PyTorch or NCCL; the runtime's adapter passes
    ``TRAINING_COLLECTIVE_TIMEOUT_SECONDS`` to ``init_process_group(timeout=...)``.
    """
    return [
        {"name": "TORCH_NCCL_ASYNC_ERROR_HANDLING", "value": "1" if nccl.async_error_handling else "0"},
        {"name": "TORCH_NCCL_ENABLE_MONITORING", "value": "1"},
        {"name": "TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC", "value": str(nccl.heartbeat_timeout_seconds)},
        {"name": "NCCL_DEBUG", "value": nccl.debug},
        {"name": "TRAINING_COLLECTIVE_TIMEOUT_SECONDS", "value": str(nccl.collective_timeout_seconds)},
    ]


def _annotation(key: str) -> dict[str, Any]:
    return {"fieldRef": {"fieldPath": f"metadata.annotations['{key}']"}}


def runtime_env(args: TrainingJobArgs) -> list[dict[str, Any]]:
    """What the training runtime reads besides checkpoints: rank source, attempt, run, metrics."""
    env: list[dict[str, Any]] = []
    if args.engine is SchedulingEngine.VOLCANO:
        env += [
            # One task is both master and worker, for which the pytorch plugin numbers RANK 1..N; the env
            # plugin's task index is the rank (see training_runtime/settings.py).
            {"name": "TRAINING_RANK_SOURCE", "value": "VC_TASK_INDEX"},
            # The same on every pod of one attempt: Volcano stamps the job's retry count on each pod it creates.
            {"name": "TRAINING_ATTEMPT", "valueFrom": _annotation(VOLCANO_RETRY_COUNT_ANNOTATION)},
            # <job>-<job UID>: a recreated job under the same name is a different run.
            {"name": "TRAINING_RUN_ID", "valueFrom": _annotation(VOLCANO_GROUP_NAME_ANNOTATION)},
        ]
    return [
        *env,
        {"name": "TRAINING_METRICS_PORT", "value": str(args.metrics_port)},
        {"name": "TRAINING_HEARTBEAT_METRIC", "value": args.heartbeat_metric},
    ]


def checkpoint_env(job: TrainingJob) -> list[dict[str, str]]:
    if job.checkpoint is None:
        return []
    ck = job.checkpoint
    env = [
        # The mount's subPath is already the job's own directory on the filesystem.
        {"name": "CHECKPOINT_DIR", "value": ck.mount_path},
        {"name": "CHECKPOINT_INTERVAL_STEPS", "value": str(ck.interval_steps)},
        {"name": "CHECKPOINT_KEEP_LAST", "value": str(ck.keep_last)},
        {"name": "CHECKPOINT_RESUME", "value": "latest"},
    ]
    if ck.interval_seconds is not None:
        env.append({"name": "CHECKPOINT_INTERVAL_SECONDS", "value": str(ck.interval_seconds)})
    return env


def worker_pod_template(args: TrainingJobArgs) -> dict[str, Any]:
    """The worker pod template (plain dict: it sits inside a CRD whose schema the SDK does not type)."""
    keys = Keys(args.label_prefix)
    job = args.job
    labels = {**common_labels(job.name, "training-worker"), keys.workload: TRAINING, keys.job: job.name}
    # Rank, world size and the rendezvous address come from Volcano's pytorch plugin (MASTER_ADDR,
    # MASTER_PORT, WORLD_SIZE, RANK); setting them here too would give the pod two conflicting values.
    env = [*nccl_env(args.nccl), *runtime_env(args), *checkpoint_env(job), *supervisor_env(args.restart_in_place),
           *local_cache_env(args.restart_in_place)]
    mounts: list[dict[str, Any]] = [{"name": "dshm", "mountPath": SHM_MOUNT}]
    volumes: list[dict[str, Any]] = [{"name": "dshm", "emptyDir": {"medium": "Memory"}}]
    if job.checkpoint is not None:
        mounts.append({"name": "checkpoints", "mountPath": job.checkpoint.mount_path, "subPath": job.name})
        volumes.append({
            "name": "checkpoints",
            "persistentVolumeClaim": {
                "claimName": args.checkpoint_claim or checkpoint_claim_name(job.checkpoint.filesystem)
            },
        })
    resources = gpu_resources_manifest(args.gpu_resource, job.gpus_per_worker, job.cpu_per_worker,
                                       job.memory_per_worker)
    return {
        "metadata": {
            "labels": labels,
            "annotations": {VOLCANO_PREEMPTABLE_ANNOTATION: "true" if args.preemptable else "false"},
        },
        "spec": {
            "schedulerName": args.scheduler_name,
            "priorityClassName": args.priority_class,
            "restartPolicy": "Never",
            # SIGTERM (an eviction, a reclaim, a preemption) makes the runtime checkpoint and exit 0; the grace
            # holds that checkpoint, so a graceful stop loses no step.
            "terminationGracePeriodSeconds": args.termination_grace_seconds,
            "automountServiceAccountToken": False,  # the training runtime never calls the Kubernetes API
            # The runtime's default seccomp filter: NCCL, IB verbs and CUDA work through device ioctls, mmap and
            # sockets, which it allows. Users' images may run as root, so non-root is left to the namespace's
            # Pod Security admission; allowPrivilegeEscalation stays false on the container.
            "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}},
            "schedulingGates": [{"name": keys.handover_gate}] if args.handover_gate else None,
            "affinity": onprem_required_affinity(keys, job.pool),
            # The burst handover reserves the nodes it clears for waiting training: any gang may use them.
            "tolerations": [*pool_tolerations_manifest(keys, [job.pool]),
                            {"key": keys.reserved_taint, "operator": "Exists", "effect": "NoSchedule"}],
            "containers": [{
                "name": "trainer",
                "image": job.image,
                "command": (supervised_command(job.command) if args.restart_in_place is not None
                            else job.command or None),
                "env": env,
                # Volcano's pytorch plugin adds its own rendezvous port (VOLCANO_PYTORCH_PORT) next to this one.
                "ports": [{"name": METRICS_PORT_NAME, "containerPort": args.metrics_port, "protocol": "TCP"}],
                "resources": {"requests": resources["requests"], "limits": resources["limits"]},
                "volumeMounts": mounts,
                "securityContext": {"allowPrivilegeEscalation": False},
            }],
            "volumes": volumes,
        },
    }


def volcano_job_spec(args: TrainingJobArgs) -> dict[str, Any]:
    job = args.job
    template = worker_pod_template(args)
    template["spec"] = {k: v for k, v in template["spec"].items() if v is not None}
    template["spec"]["containers"] = [
        {k: v for k, v in c.items() if v is not None} for c in template["spec"]["containers"]
    ]
    spec: dict[str, Any] = {
        "schedulerName": args.scheduler_name,
        "queue": args.queue,
        "priorityClassName": args.priority_class,
        "minAvailable": job.workers,
        "maxRetry": job.max_retries,
        # One task is master and worker; the runtime takes the rank from the env plugin's task index.
        "plugins": {"pytorch": ["--master=worker", "--worker=worker", f"--port={VOLCANO_PYTORCH_PORT}"],
                    "svc": [], "env": []},
        # Any member failing or being evicted restarts the whole gang from the last checkpoint.
        # A pod that fails restarts the gang (under the supervisor: only once it gave up restarting in place). An
        # evicted pod (its node quarantined, a reclaim) is replaced alone where the gang restarts in place: the
        # others wait for it in their pods (training_runtime.supervisor), bounded by replaceTimeoutSeconds.
        "policies": [
            {"event": "PodFailed", "action": "RestartJob"},
            {"event": "PodEvicted", "action": "RestartPod" if args.restart_in_place is not None else "RestartJob"},
            {"event": "TaskCompleted", "action": "CompleteJob"},
        ],
        "tasks": [{"name": "worker", "replicas": job.workers, "minAvailable": job.workers, "template": template}],
    }
    placement = network_topology(args)
    if placement is not None:
        # Volcano's job controller copies it to the gang's PodGroup, which its scheduler places by.
        spec["networkTopology"] = placement
    return spec


def pod_monitor_spec(args: TrainingJobArgs) -> dict[str, Any]:
    """Scrape every worker of the job; ``job_name`` comes from the pod's job label.

    Pull, not a push gateway: the series go away with the pods instead of holding a dead job's last
    heartbeat forever, and there is no gateway to deploy, keep available and clean up. The alert rules
    group by ``namespace`` (the operator adds it) and ``job_name``; ``job`` is Prometheus's own label.
    """
    keys = Keys(args.label_prefix)
    return {
        "selector": {"matchLabels": {keys.workload: TRAINING, keys.job: args.job.name}},
        "namespaceSelector": {"matchNames": [args.namespace]},
        "podMetricsEndpoints": [{
            "port": METRICS_PORT_NAME,
            "path": "/metrics",
            "interval": f"{args.scrape_interval_seconds}s",
            "relabelings": [
                {"sourceLabels": [pod_label_meta(keys.job)], "targetLabel": "job_name", "action": "replace"},
            ],
        }],
    }


def pod_label_meta(key: str) -> str:
    """Prometheus's service-discovery name for a pod label (every character outside [a-zA-Z0-9_] becomes _)."""
    return "__meta_kubernetes_pod_label_" + re.sub(r"[^a-zA-Z0-9_]", "_", key)
