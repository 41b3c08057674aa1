"""Typed stack configuration: one schema for the whole cluster, validated before any resource exists.

Every key of ``Pulumi.<stack>.yaml`` under the ``gpu-cluster:`` namespace maps onto a field of
:class:`ClusterConfig`. Defaults encode the operating lessons (78 °C thermal limit, NoSchedule-only
burst taint, gradual return, Retain for checkpoints); cross-field rules reject configurations that
would break the design (inference outranking training, a gang scheduler the cluster version no longer
serves, a node claimed by two pools). :func:`load_config` turns every problem into a
:class:`ConfigError` naming the key path, the bad value, what was expected and the stack file.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Annotated, Any, Literal, Self

from pulumi import RunError
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_camel

PROJECT = "gpu-cluster"

#: Highest PriorityClass value a user class may take (the API server reserves larger ones).
MAX_PRIORITY_VALUE = 1_000_000_000

#: Temperatures (°C) at which each GPU model starts hardware slowdown; a thermal guard threshold
#: at or above these never fires before the GPU throttles itself.
GPU_HARDWARE_LIMITS_CELSIUS: dict[str, int] = {
    "H100-SXM5-80GB": 87,
    "H100-PCIe-80GB": 85,
    "H200-SXM5-141GB": 87,
    "B200-SXM6-180GB": 87,
    "A100-SXM4-80GB": 85,
    "L40S-48GB": 88,
    "L4-24GB": 85,
}

#: Kubernetes minor versions each gang scheduler supports (inclusive bounds).
SCHEDULER_K8S_SUPPORT: dict[str, tuple[tuple[int, int], tuple[int, int]]] = {
    # kube-batch v0.5 watches policy/v1beta1 PDBs (gone in 1.25) and scheduling/v1beta1 classes.
    "kube-batch": ((1, 13), (1, 24)),
    # Volcano v1.15 supports Kubernetes 1.24–1.35.
    "volcano": ((1, 24), (1, 35)),
}

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
_NODE_RANGE = re.compile(r"^(?P<prefix>[a-z0-9.-]*)\[(?P<lo>\d+)-(?P<hi>\d+)\](?P<suffix>[a-z0-9.-]*)$")
_IMAGE_PINNED = re.compile(r"^[^\s:@]+(:[\w][\w.-]{0,127})?(@sha256:[0-9a-f]{64})?$")


def _dns_label(value: str) -> str:
    if not _DNS_LABEL.match(value):
        raise ValueError("must be a DNS-1123 label (lowercase letters, digits and '-', at most 63 chars)")
    return value


def _label_prefix(value: str) -> str:
    if not _DNS_SUBDOMAIN.match(value) or "." not in value:
        raise ValueError("must be a DNS subdomain such as 'gpucluster.io'")
    return value


def _pinned_image(value: str) -> str:
    last = value.rsplit("/", 1)[-1]
    if not _IMAGE_PINNED.match(value) or (":" not in last and "@sha256:" not in value):
        raise ValueError("must be pinned by tag or digest, e.g. 'registry/name:1.2.3' or 'name@sha256:…'")
    if last.endswith(":latest"):
        raise ValueError("must not use the 'latest' tag; pin a version or digest")
    return value


DnsLabel = Annotated[str, AfterValidator(_dns_label)]
PinnedImage = Annotated[str, AfterValidator(_pinned_image)]
PositiveInt = Annotated[int, Field(gt=0)]
NonNegativeInt = Annotated[int, Field(ge=0)]


class _Model(BaseModel):
    """Base: camelCase keys as in the stack file, unknown keys rejected, immutable."""

    model_config = ConfigDict(
        extra="forbid", alias_generator=to_camel, populate_by_name=True, frozen=True, strict=False
    )


def expand_node_names(patterns: Iterable[str]) -> list[str]:
    """Expand ``gpu-[001-004]``-style ranges (zero padding kept) into node names."""
    names: list[str] = []
    for pattern in patterns:
        match = _NODE_RANGE.match(pattern)
        if not match:
            names.append(pattern)
            continue
        lo_text, hi_text = match["lo"], match["hi"]
        lo, hi = int(lo_text), int(hi_text)
        if lo > hi:
            raise ValueError(f"range '{pattern}' runs backwards ({lo} > {hi})")
        width = len(lo_text) if lo_text.startswith("0") else 0
        names.extend(f"{match['prefix']}{i:0{width}d}{match['suffix']}" for i in range(lo, hi + 1))
    return names


def _node_patterns(value: list[str]) -> list[str]:
    if not value:
        raise ValueError("must list at least one node name or range")
    for pattern in value:
        if "[" in pattern and not _NODE_RANGE.match(pattern):
            raise ValueError(f"'{pattern}' is not a node name or a range like 'gpu-[001-256]'")
        for name in expand_node_names([pattern]):
            if not _DNS_SUBDOMAIN.match(name):
                raise ValueError(f"node name '{name}' is not a valid DNS subdomain")
    return value


NodePatterns = Annotated[list[str], AfterValidator(_node_patterns)]


# --------------------------------------------------------------------------- pools and tiers


class GpuPool(_Model):
    """A set of on-prem GPU nodes that share a model and a taint."""

    name: DnsLabel
    nodes: NodePatterns
    gpu_model: str = "H100-SXM5-80GB"
    gpus_per_node: PositiveInt = 8
    hardware_limit_celsius: PositiveInt | None = None
    taint: bool = True
    ib_hcas_per_node: NonNegativeInt = 8

    @property
    def node_names(self) -> list[str]:
        return expand_node_names(self.nodes)

    @property
    def gpu_count(self) -> int:
        return len(self.node_names) * self.gpus_per_node

    @property
    def hardware_limit(self) -> int:
        """The slowdown temperature: explicit override, else the model table, else a safe 85 °C."""
        if self.hardware_limit_celsius is not None:
            return self.hardware_limit_celsius
        return GPU_HARDWARE_LIMITS_CELSIUS.get(self.gpu_model, 85)


class SystemPool(_Model):
    """CPU nodes for platform components (schedulers, controllers, exporters' backends)."""

    name: DnsLabel = "system"
    nodes: NodePatterns

    @property
    def node_names(self) -> list[str]:
        return expand_node_names(self.nodes)


class PriorityTier(_Model):
    name: DnsLabel
    value: Annotated[int, Field(ge=-MAX_PRIORITY_VALUE, le=MAX_PRIORITY_VALUE)]
    description: str = ""


class TierName(StrEnum):
    SYSTEM = "system"
    TRAINING = "training"
    INFERENCE = "inference"
    DEFAULT = "default"


class Priorities(_Model):
    """PriorityClasses. Training outranks inference so a gang can take GPUs from inference pods."""

    system: PriorityTier = PriorityTier(
        name="platform-critical", value=100_000_000, description="GPU platform agents and schedulers"
    )
    training: PriorityTier = PriorityTier(
        name="gpu-training", value=1_000_000, description="Gang-scheduled training; preempts inference"
    )
    inference: PriorityTier = PriorityTier(
        name="gpu-inference", value=10_000, description="Production inference; never preempts others"
    )
    default: PriorityTier = PriorityTier(
        name="standard", value=0, description="Pods that name no class"
    )
    global_default: TierName = TierName.DEFAULT

    @model_validator(mode="after")
    def _order(self) -> Self:
        if not self.training.value > self.inference.value:
            raise ValueError(
                f"training.value ({self.training.value}) must be greater than inference.value "
                f"({self.inference.value}): training has to outrank inference to take its GPUs"
            )
        if not self.system.value > self.training.value:
            raise ValueError(
                f"system.value ({self.system.value}) must be greater than training.value "
                f"({self.training.value}) so platform agents are never preempted by a gang"
            )
        if self.global_default in (TierName.TRAINING, TierName.SYSTEM):
            raise ValueError(
                f"globalDefault '{self.global_default}' would give every unlabelled pod the power to "
                "preempt; use 'default' or 'inference'"
            )
        names = [t.name for t in self.tiers().values()]
        if len(set(names)) != len(names):
            raise ValueError(f"tier names must be distinct, got {names}")
        return self

    def tiers(self) -> dict[TierName, PriorityTier]:
        return {
            TierName.SYSTEM: self.system,
            TierName.TRAINING: self.training,
            TierName.INFERENCE: self.inference,
            TierName.DEFAULT: self.default,
        }


# --------------------------------------------------------------------------- scheduling


class Queue(_Model):
    """A Volcano queue; inference's queue is reclaimable so training can take its GPUs back."""

    name: DnsLabel
    weight: PositiveInt = 1
    gpu_capability: PositiveInt | None = None
    reclaimable: bool = True


class SchedulingEngine(StrEnum):
    VOLCANO = "volcano"
    KUBE_BATCH = "kube-batch"


class Scheduling(_Model):
    engine: SchedulingEngine = SchedulingEngine.VOLCANO
    #: Install Volcano from its pinned chart; off where the cluster already runs it (local cluster).
    install: bool = True
    training_queue: Queue = Queue(name="training", weight=8, reclaimable=False)
    inference_queue: Queue = Queue(name="inference", weight=2, reclaimable=True)
    #: Volcano scheduling period; short enough that a pending gang is reconsidered quickly.
    schedule_period_seconds: PositiveInt = 1

    @model_validator(mode="after")
    def _queues(self) -> Self:
        if self.training_queue.name == self.inference_queue.name:
            raise ValueError("trainingQueue and inferenceQueue must have different names")
        if self.training_queue.reclaimable:
            raise ValueError(
                "trainingQueue.reclaimable must be false: a training gang that loses members stalls"
            )
        return self

    @property
    def scheduler_name(self) -> str:
        return "volcano" if self.engine is SchedulingEngine.VOLCANO else "kube-batch"


# --------------------------------------------------------------------------- external providers


class ProviderKind(StrEnum):
    VIRTUAL_KUBELET = "virtual-kubelet"
    ADMIRALTY = "admiralty"
    LIQO = "liqo"


class ExternalProvider(_Model):
    """External GPU capacity exposed as one virtual-kubelet node."""

    name: DnsLabel
    kind: ProviderKind
    node_name: DnsLabel
    gpu_model: str = "H100-SXM5-80GB"
    gpus: PositiveInt
    cpu: PositiveInt = 512
    memory_gi: PositiveInt = 4096
    pods: PositiveInt = 500
    image: PinnedImage | None = None
    #: Name of a *secret* config key (``pulumi config set --secret <key> …``) holding the credentials.
    credentials_secret: str
    extra_args: list[str] = Field(default_factory=list)
    region: str = ""


# --------------------------------------------------------------------------- inference


class TrafficShape(StrEnum):
    QUEUE_WORKER = "queue-worker"
    GATEWAY = "gateway"


class Traffic(_Model):
    """How requests reach replicas wherever they run; without this a burst adds idle pods."""

    shape: TrafficShape
    queue_url: str | None = None
    queue_credentials_secret: str | None = None
    gateway_host: str | None = None
    external_weight_percent: Annotated[int, Field(ge=0, le=100)] = 50

    @model_validator(mode="after")
    def _shape_fields(self) -> Self:
        if self.shape is TrafficShape.QUEUE_WORKER and not self.queue_url:
            raise ValueError("shape 'queue-worker' needs queueUrl (the broker every location can reach)")
        if self.shape is TrafficShape.GATEWAY and not self.gateway_host:
            raise ValueError("shape 'gateway' needs gatewayHost")
        return self


class ScalingMetric(StrEnum):
    CPU = "cpu"
    MEMORY = "memory"
    QUEUE_DEPTH = "queue-depth"
    IN_FLIGHT = "in-flight"


class Scaling(_Model):
    metric: ScalingMetric = ScalingMetric.QUEUE_DEPTH
    target: PositiveInt = 4
    scale_up_stabilization_seconds: NonNegativeInt = 0
    scale_down_stabilization_seconds: NonNegativeInt = 300


class InferenceService(_Model):
    name: DnsLabel
    image: PinnedImage
    gpus_per_replica: PositiveInt = 1
    min_replicas: PositiveInt = 2
    max_replicas: PositiveInt = 16
    port: Annotated[int, Field(ge=1, le=65535)] = 8080
    cpu: str = "8"
    memory: str = "64Gi"
    max_unavailable: PositiveInt = 1
    readiness_path: str = "/healthz"
    pool: DnsLabel | None = None
    traffic: Traffic
    scaling: Scaling = Scaling()
    args: list[str] = Field(default_factory=list)

    @model_validator(mode="after")
    def _replicas(self) -> Self:
        if self.max_replicas < self.min_replicas:
            raise ValueError(
                f"maxReplicas ({self.max_replicas}) must be at least minReplicas ({self.min_replicas})"
            )
        return self


class Inference(_Model):
    services: list[InferenceService] = Field(default_factory=list)


# --------------------------------------------------------------------------- burst and return


class Burst(_Model):
    """Thresholds of the burst controller. The close threshold sits above the open one (hysteresis)."""

    taint_value: DnsLabel = "closed"
    open_below_free_gpus: NonNegativeInt = 8
    close_at_free_gpus: PositiveInt = 32
    open_hold_seconds: NonNegativeInt = 60
    close_hold_seconds: NonNegativeInt = 600
    pending_grace_seconds: NonNegativeInt = 30
    external_deletion_cost: int = -100
    resync_seconds: PositiveInt = 30
    stale_after_seconds: PositiveInt = 120

    @model_validator(mode="after")
    def _band(self) -> Self:
        if self.close_at_free_gpus <= self.open_below_free_gpus:
            raise ValueError(
                f"closeAtFreeGpus ({self.close_at_free_gpus}) must be greater than openBelowFreeGpus "
                f"({self.open_below_free_gpus}); otherwise the taint flaps"
            )
        return self


class Descheduler(_Model):
    """Gradual return: a few pods per cycle move back on-prem once the burst taint returns."""

    image: PinnedImage = "registry.k8s.io/descheduler/descheduler:v0.34.0"
    schedule: str = "*/2 * * * *"
    max_pods_per_node: PositiveInt = 4
    max_pods_per_namespace: PositiveInt = 8
    max_pods_total: PositiveInt = 16
    min_pod_age_seconds: NonNegativeInt = 300

    @field_validator("schedule")
    @classmethod
    def _cron(cls, value: str) -> str:
        if len(value.split()) != 5:
            raise ValueError("must be a five-field cron expression such as '*/2 * * * *'")
        return value


# --------------------------------------------------------------------------- observability


class Observability(_Model):
    dcgm_interval_ms: Annotated[int, Field(ge=1000, le=30000)] = 5000
    thermal_threshold_celsius: PositiveInt = 78
    thermal_hold_seconds: PositiveInt = 120
    thermal_warning_band_celsius: PositiveInt = 5
    inference_tolerates_thermal: bool = True
    step_heartbeat_metric: str = "training_step_heartbeat_timestamp_seconds"
    hang_window_minutes: PositiveInt = 10
    dashboards: bool = True


# --------------------------------------------------------------------------- checkpoints


class CheckpointBackend(StrEnum):
    NFS = "nfs"
    LUSTRE = "lustre"
    WEKA = "weka"
    VAST = "vast"
    STATIC = "static"


class Filesystem(_Model):
    """A shared filesystem for checkpoints. Backend-specific fields are checked per backend."""

    name: DnsLabel
    backend: CheckpointBackend
    capacity_gi: PositiveInt = 102_400
    #: Sustained aggregate write bandwidth the backend is sized for (GB/s).
    write_gbps: Annotated[float, Field(gt=0)]
    mount_options: list[str] = Field(default_factory=list)
    # nfs
    server: str | None = None
    share: str | None = None
    # lustre (FSx for Lustre)
    subnet_id: str | None = None
    security_group_ids: list[str] = Field(default_factory=list)
    deployment_type: str | None = None
    per_unit_storage_throughput: PositiveInt | None = None
    # weka
    filesystem_name: str | None = None
    # vast
    vip_pool: str | None = None
    root_export: str | None = None
    # static
    driver: str | None = None
    volume_handle: str | None = None
    volume_attributes: dict[str, str] = Field(default_factory=dict)


class CheckpointBudget(_Model):
    size_tb: Annotated[float, Field(gt=0)] = 1.0
    seconds: Annotated[float, Field(gt=0)] = 30.0
    writers: PositiveInt = 256


class ThroughputCheck(_Model):
    enabled: bool = False
    filesystem: DnsLabel | None = None
    nodes: PositiveInt = 8
    size_per_writer_gi: PositiveInt = 16
    image: PinnedImage = "docker.io/library/debian:12.7-slim"


class Checkpoint(_Model):
    filesystems: list[Filesystem] = Field(default_factory=list)
    budget: CheckpointBudget = CheckpointBudget()
    strict: bool = False
    throughput_check: ThroughputCheck = ThroughputCheck()


# --------------------------------------------------------------------------- training


class Nccl(_Model):
    """Watchdog settings so a silent NCCL hang turns into a crash the gang restarts from."""

    async_error_handling: bool = True
    heartbeat_timeout_seconds: PositiveInt = 480
    collective_timeout_seconds: PositiveInt = 600
    debug: Literal["WARN", "INFO", "VERSION"] = "WARN"


class CheckpointMount(_Model):
    filesystem: DnsLabel
    mount_path: str = "/checkpoints"
    interval_steps: PositiveInt = 500
    keep_last: PositiveInt = 3


class TrainingJob(_Model):
    name: DnsLabel
    enabled: bool = False
    image: PinnedImage
    pool: DnsLabel
    workers: PositiveInt
    gpus_per_worker: PositiveInt = 8
    max_retries: NonNegativeInt = 5
    command: list[str] = Field(default_factory=list)
    checkpoint: CheckpointMount | None = None


class Training(_Model):
    nccl: Nccl = Nccl()
    jobs: list[TrainingJob] = Field(default_factory=list)


# --------------------------------------------------------------------------- the whole stack


class ClusterConfig(_Model):
    """The whole stack, as declared in ``Pulumi.<stack>.yaml``."""

    kubernetes_version: Annotated[str, Field(pattern=r"^1\.\d+(\.\d+)?$")] = "1.34"
    label_prefix: Annotated[str, AfterValidator(_label_prefix)] = "gpucluster.io"
    gpu_resource: str = "nvidia.com/gpu"
    system_namespace: DnsLabel = "gpu-system"
    training_namespace: DnsLabel = "training"
    inference_namespace: DnsLabel = "inference"
    monitoring_namespace: DnsLabel = "monitoring"
    pools: list[GpuPool]
    system_pool: SystemPool
    priorities: Priorities = Priorities()
    scheduling: Scheduling = Scheduling()
    providers: list[ExternalProvider] = Field(default_factory=list)
    inference: Inference = Inference()
    burst: Burst = Burst()
    descheduler: Descheduler = Descheduler()
    observability: Observability = Observability()
    checkpoint: Checkpoint = Checkpoint()
    training: Training = Training()

    @field_validator("pools")
    @classmethod
    def _some_pools(cls, value: list[GpuPool]) -> list[GpuPool]:
        if not value:
            raise ValueError("must declare at least one on-prem GPU pool")
        return value

    @property
    def k8s_minor(self) -> tuple[int, int]:
        major, minor = self.kubernetes_version.split(".")[:2]
        return int(major), int(minor)

    @property
    def onprem_gpus(self) -> int:
        return sum(p.gpu_count for p in self.pools)

    def pool(self, name: str) -> GpuPool:
        return next(p for p in self.pools if p.name == name)

    def filesystem(self, name: str) -> Filesystem:
        return next(f for f in self.checkpoint.filesystems if f.name == name)


# --------------------------------------------------------------------------- cross-field rules


@dataclass(frozen=True)
class Problem:
    """One configuration problem: where, what was found, what was expected."""

    path: str
    message: str
    value: Any = None

    def render(self) -> str:
        shown = "" if self.value is None else f" (got {json.dumps(self.value, default=str)})"
        return f"{self.path}: {self.message}{shown}"


def _unique(items: Iterable[tuple[int, str]], path: str, what: str) -> list[Problem]:
    seen: dict[str, int] = {}
    problems = []
    for index, name in items:
        if name in seen:
            problems.append(
                Problem(f"{path}[{index}].name", f"duplicate {what} name; first used at index {seen[name]}", name)
            )
        else:
            seen[name] = index
    return problems


def cross_check(cfg: ClusterConfig) -> list[Problem]:
    """Rules that span sections; each returns a Problem rather than raising so all are reported."""
    problems: list[Problem] = []
    problems += _unique(enumerate(p.name for p in cfg.pools), "pools", "pool")
    problems += _unique(enumerate(p.name for p in cfg.providers), "providers", "provider")
    problems += _unique(enumerate(s.name for s in cfg.inference.services), "inference.services", "service")
    problems += _unique(
        enumerate(f.name for f in cfg.checkpoint.filesystems), "checkpoint.filesystems", "filesystem"
    )
    problems += _unique(enumerate(j.name for j in cfg.training.jobs), "training.jobs", "job")

    owner: dict[str, str] = {}
    for index, pool in enumerate(cfg.pools):
        seen_here: set[str] = set()
        for node in pool.node_names:
            if node in seen_here:
                problems.append(Problem(f"pools[{index}].nodes", "node listed twice in the pool", node))
            elif node in owner:
                problems.append(
                    Problem(f"pools[{index}].nodes", f"node is already in pool '{owner[node]}'", node)
                )
            seen_here.add(node)
            owner.setdefault(node, pool.name)
    for node in expand_node_names(cfg.system_pool.nodes):
        if node in owner:
            problems.append(Problem("systemPool.nodes", f"node is already in GPU pool '{owner[node]}'", node))

    virtual_names = {p.node_name for p in cfg.providers}
    for index, provider in enumerate(cfg.providers):
        if provider.node_name in owner:
            problems.append(
                Problem(f"providers[{index}].nodeName", "virtual node name collides with an on-prem node",
                        provider.node_name)
            )
    if len(virtual_names) != len(cfg.providers):
        problems.append(Problem("providers", "each provider needs its own nodeName"))

    engine = cfg.scheduling.engine.value
    (lo, hi) = SCHEDULER_K8S_SUPPORT[engine]
    if not lo <= cfg.k8s_minor <= hi:
        hint = (
            " kube-batch v0.5 needs policy/v1beta1 and scheduling/v1beta1, which Kubernetes no longer "
            "serves from 1.25; use engine 'volcano'"
            if engine == "kube-batch"
            else ""
        )
        problems.append(
            Problem(
                "scheduling.engine",
                f"'{engine}' supports Kubernetes {lo[0]}.{lo[1]}–{hi[0]}.{hi[1]}, "
                f"but kubernetesVersion is {cfg.kubernetes_version}.{hint}",
                engine,
            )
        )

    threshold = cfg.observability.thermal_threshold_celsius
    for index, pool in enumerate(cfg.pools):
        if threshold >= pool.hardware_limit:
            problems.append(
                Problem(
                    "observability.thermalThresholdCelsius",
                    f"must be below the hardware slowdown limit of pool '{pool.name}' "
                    f"({pool.gpu_model}: {pool.hardware_limit} °C, pools[{index}]); "
                    "the GPU would throttle before the guard pulls it",
                    threshold,
                )
            )

    pool_names = {p.name for p in cfg.pools}
    for index, service in enumerate(cfg.inference.services):
        if service.pool is not None and service.pool not in pool_names:
            problems.append(
                Problem(f"inference.services[{index}].pool", f"unknown pool; expected one of {sorted(pool_names)}",
                        service.pool)
            )
    fs_names = {f.name for f in cfg.checkpoint.filesystems}
    for index, job in enumerate(cfg.training.jobs):
        if job.pool not in pool_names:
            problems.append(
                Problem(f"training.jobs[{index}].pool", f"unknown pool; expected one of {sorted(pool_names)}",
                        job.pool)
            )
        elif job.workers > len(cfg.pool(job.pool).node_names):
            problems.append(
                Problem(f"training.jobs[{index}].workers",
                        f"pool '{job.pool}' has only {len(cfg.pool(job.pool).node_names)} nodes", job.workers)
            )
        elif job.gpus_per_worker > cfg.pool(job.pool).gpus_per_node:
            problems.append(
                Problem(f"training.jobs[{index}].gpusPerWorker",
                        f"pool '{job.pool}' nodes have {cfg.pool(job.pool).gpus_per_node} GPUs",
                        job.gpus_per_worker)
            )
        if job.checkpoint is not None and job.checkpoint.filesystem not in fs_names:
            problems.append(
                Problem(f"training.jobs[{index}].checkpoint.filesystem",
                        f"unknown filesystem; expected one of {sorted(fs_names)}", job.checkpoint.filesystem)
            )
    check = cfg.checkpoint.throughput_check
    if check.enabled and check.filesystem not in fs_names:
        problems.append(
            Problem("checkpoint.throughputCheck.filesystem",
                    f"must name a declared filesystem; expected one of {sorted(fs_names)}", check.filesystem)
        )
    return problems


# --------------------------------------------------------------------------- loading


class ConfigError(RunError):
    """A stack configuration that cannot be deployed; the message lists every problem found."""

    def __init__(self, stack_file: str, problems: list[Problem]) -> None:
        self.stack_file = stack_file
        self.problems = problems
        lines = "\n".join(f"  - {p.render()}" for p in problems)
        super().__init__(f"invalid stack configuration in {stack_file}:\n{lines}")


def _path(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


def _expected(error: Mapping[str, Any]) -> str:
    kind = error["type"]
    if kind == "extra_forbidden":
        return "unknown key; check the spelling against the configuration reference in README.md"
    if kind == "missing":
        return "required key is missing"
    message = str(error["msg"])
    return message.removeprefix("Value error, ")


def problems_from_validation(error: ValidationError) -> list[Problem]:
    problems = []
    for item in error.errors():
        loc = tuple(part for part in item["loc"] if not (isinstance(part, str) and part.startswith("function-")))
        value = None if item["type"] in ("missing",) else item.get("input")
        if isinstance(value, dict | list) and item["type"] != "extra_forbidden":
            value = None
        problems.append(Problem(_path(loc) or "(stack)", _expected(item), value))
    return problems


def parse_config(raw: Mapping[str, Any], stack_file: str) -> ClusterConfig:
    """Validate a ``{key: value}`` mapping (keys without the project prefix) into a ClusterConfig."""
    try:
        cfg = ClusterConfig.model_validate(dict(raw))
    except ValidationError as error:
        raise ConfigError(stack_file, problems_from_validation(error)) from None
    problems = cross_check(cfg)
    if problems:
        raise ConfigError(stack_file, problems)
    return cfg


def raw_from_pulumi_config(config: Mapping[str, Any], project: str = PROJECT) -> dict[str, Any]:
    """Select this project's keys from the engine's flat ``project:key`` map and decode JSON values."""
    raw: dict[str, Any] = {}
    prefix = f"{project}:"
    for key, value in config.items():
        if not key.startswith(prefix):
            continue
        name = key[len(prefix):]
        # The engine passes every value as a string; structured values arrive as JSON. Scalars stay
        # strings and pydantic converts them ("8" -> 8), so "1.34" is never read as a float.
        if isinstance(value, str) and value.lstrip().startswith(("{", "[")):
            with contextlib.suppress(json.JSONDecodeError):
                value = json.loads(value)
        raw[name] = value
    return raw


#: Config keys that hold secrets rather than cluster shape; validated by their consumers.
def secret_key_names(cfg: ClusterConfig) -> set[str]:
    names = {p.credentials_secret for p in cfg.providers}
    names |= {s.traffic.queue_credentials_secret for s in cfg.inference.services if s.traffic.queue_credentials_secret}
    return names
