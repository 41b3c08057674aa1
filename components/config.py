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
    #: GPUs the queue deserves (Volcano ``capacity`` plugin): what it may reclaim up to from reclaimable
    #: queues, and above which its own pods are reclaim victims. Unset: a training queue deserves every GPU
    #: of its pool(s); the inference queue deserves none, so all of its pods stay reclaimable.
    gpu_deserved: NonNegativeInt | None = None

    @model_validator(mode="after")
    def _deserved_within_capability(self) -> Self:
        if (self.gpu_deserved is not None and self.gpu_capability is not None
                and self.gpu_deserved > self.gpu_capability):
            raise ValueError(f"gpuDeserved ({self.gpu_deserved}) exceeds gpuCapability ({self.gpu_capability})")
        return self


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
    #: One training queue per GPU pool (``<trainingQueue.name>-<pool>``, capability = that pool's GPUs)
    #: instead of one queue over all pools. Volcano's enqueue admits a gang only while its queue has room,
    #: so with one queue a gang waiting for a full pool holds the room that a gang for an idle pool needs
    #: (head-of-line blocking across pools). Unset means: per pool whenever the stack has more than one.
    training_queue_per_pool: bool | None = None

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

    def queue_per_pool(self, pool_count: int) -> bool:
        """Whether training gets one queue per pool: the explicit setting, else more than one pool."""
        return pool_count > 1 if self.training_queue_per_pool is None else self.training_queue_per_pool

    def training_queue_names(self, pools: Iterable[str]) -> dict[str, str]:
        """Pool name → the training queue its gangs go to."""
        names = list(pools)
        base = self.training_queue.name
        if not self.queue_per_pool(len(names)):
            return {pool: base for pool in names}
        return {pool: f"{base}-{pool}" for pool in names}


def scheduling_problems(cfg: ClusterConfig) -> list[Problem]:
    """Per-pool training queue names (two DNS labels joined by '-', so valid) must not hit the inference queue."""
    sched = cfg.scheduling
    return [
        Problem("scheduling.inferenceQueue.name",
                f"collides with the training queue of pool '{pool}'; choose another name", name)
        for pool, name in sched.training_queue_names(p.name for p in cfg.pools).items()
        if name == sched.inference_queue.name
    ]


# --------------------------------------------------------------------------- external providers


class ProviderKind(StrEnum):
    VIRTUAL_KUBELET = "virtual-kubelet"
    ADMIRALTY = "admiralty"
    LIQO = "liqo"


#: Provider kinds whose preset cannot pin the virtual node name, its labels and the burst taint, and why.
UNSUPPORTED_PROVIDER_KINDS: dict[ProviderKind, str] = {
    ProviderKind.ADMIRALTY: (
        "kind 'admiralty' has no preset: Admiralty's shared agent names its virtual nodes itself "
        "(admiralty-<namespace>-<target>-<hash>), so nodeName, the external labels and the burst taint "
        "cannot be pinned; use 'liqo' for a peered cluster or 'virtual-kubelet' for a GPU cloud"
    ),
}


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
    #: virtual-kubelet: the ``--provider`` name compiled into the provider binary (e.g. ``azure``).
    vk_provider: DnsLabel | None = None
    #: Whether pods on this node get cluster-routable IPs (a Service can reach them). Default per kind:
    #: liqo yes (its network fabric), virtual-kubelet no (a GPU cloud behind its own API).
    pods_routable: bool | None = None
    #: liqo: the peered cluster's ID, this cluster's ID, and this cluster's pod CIDR.
    foreign_cluster_id: DnsLabel | None = None
    home_cluster_id: DnsLabel | None = None
    local_pod_cidr: Annotated[str, Field(pattern=r"^\d{1,3}(\.\d{1,3}){3}/\d{1,2}$")] | None = None
    liqo_namespace: DnsLabel = "liqo"
    #: liqo: the namespace `liqoctl peer` created for this peering; default ``liqo-tenant-<foreignClusterId>``.
    tenant_namespace: DnsLabel | None = None

    @model_validator(mode="after")
    def _kind_fields(self) -> Self:
        if self.kind in UNSUPPORTED_PROVIDER_KINDS:
            raise ValueError(UNSUPPORTED_PROVIDER_KINDS[self.kind])
        if self.kind is ProviderKind.VIRTUAL_KUBELET:
            missing = [k for k, v in (("image", self.image), ("vkProvider", self.vk_provider)) if v is None]
            if missing:
                raise ValueError(
                    f"kind 'virtual-kubelet' needs {' and '.join(missing)}: each virtual-kubelet provider ships "
                    "its own binary, so name the pinned image and its --provider"
                )
        if self.kind is ProviderKind.LIQO:
            missing = [
                k
                for k, v in (
                    ("foreignClusterId", self.foreign_cluster_id),
                    ("homeClusterId", self.home_cluster_id),
                    ("localPodCidr", self.local_pod_cidr),
                )
                if not v
            ]
            if missing:
                raise ValueError(f"kind 'liqo' needs {', '.join(missing)} (see `liqoctl info`)")
        for arg in self.extra_args:
            if not arg.startswith("--"):
                raise ValueError(f"extraArgs entry '{arg}' must be a --flag or --flag=value")
        return self

    @property
    def routable(self) -> bool:
        if self.pods_routable is not None:
            return self.pods_routable
        return self.kind is ProviderKind.LIQO


# --------------------------------------------------------------------------- inference


class TrafficShape(StrEnum):
    QUEUE_WORKER = "queue-worker"
    GATEWAY = "gateway"


class Traffic(_Model):
    """How requests reach replicas wherever they run; without this a burst adds idle pods.

    ``queue-worker``: replicas pull from a broker every location reaches (queueUrl, credentials).
    ``gateway``: an HTTPRoute for gatewayHost sends requests to one Service spanning every ready replica,
    so each location gets traffic in proportion to its ready replicas; the service bursts only onto
    providers whose pod IPs the cluster can route to.
    """

    shape: TrafficShape
    queue_url: str | None = None
    queue_credentials_secret: str | None = None
    gateway_host: str | None = None

    @model_validator(mode="after")
    def _shape_fields(self) -> Self:
        if self.shape is TrafficShape.QUEUE_WORKER and not self.queue_url:
            raise ValueError("shape 'queue-worker' needs queueUrl (the broker every location can reach)")
        if self.shape is TrafficShape.GATEWAY and not self.gateway_host:
            raise ValueError("shape 'gateway' needs gatewayHost")
        if self.shape is TrafficShape.GATEWAY and (self.queue_url or self.queue_credentials_secret):
            raise ValueError("shape 'gateway' takes no queueUrl/queueCredentialsSecret; use 'queue-worker'")
        return self


class ScalingMetric(StrEnum):
    CPU = "cpu"
    MEMORY = "memory"
    QUEUE_DEPTH = "queue-depth"
    IN_FLIGHT = "in-flight"


class Scaling(_Model):
    """HPA target. cpu/memory: average utilization percent; queue-depth: waiting jobs per replica
    (an external metric); in-flight: concurrent requests per replica (a pods metric)."""

    metric: ScalingMetric = ScalingMetric.QUEUE_DEPTH
    target: PositiveInt = 4
    scale_up_stabilization_seconds: NonNegativeInt = 0
    scale_down_stabilization_seconds: NonNegativeInt = 300
    #: Scale-down never removes more than this share of replicas per minute (a gentle return).
    scale_down_percent_per_minute: Annotated[int, Field(ge=1, le=100)] = 10
    #: Prometheus series the adapter serves for queue-depth/in-flight; default per metric.
    prometheus_series: Annotated[str, Field(pattern=r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")] | None = None

    @model_validator(mode="after")
    def _target(self) -> Self:
        if self.metric in (ScalingMetric.CPU, ScalingMetric.MEMORY) and self.target > 100:
            raise ValueError(f"target for metric '{self.metric}' is a utilization percent (1-100), got {self.target}")
        if self.metric in (ScalingMetric.CPU, ScalingMetric.MEMORY) and self.prometheus_series:
            raise ValueError(f"prometheusSeries applies to queue-depth/in-flight, not '{self.metric}'")
        return self


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
    #: How long a replica may take to load its model before the readiness path must answer; until then the
    #: liveness probe (same path) does not run, so a slow load is never killed as a hang.
    startup_timeout_seconds: Annotated[int, Field(ge=30, le=7200)] = 1800
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
        if self.max_unavailable >= self.min_replicas:
            raise ValueError(
                f"maxUnavailable ({self.max_unavailable}) must be below minReplicas ({self.min_replicas}); "
                "otherwise a drain may take the whole service down"
            )
        if not self.readiness_path.startswith("/"):
            raise ValueError(f"readinessPath must start with '/', got '{self.readiness_path}'")
        return self


class GatewayRef(_Model):
    """The Gateway (Gateway API) that gateway-shaped services attach their HTTPRoute to."""

    name: DnsLabel = "inference-gateway"
    #: Defaults to the inference namespace.
    namespace: DnsLabel | None = None
    section_name: DnsLabel | None = None


class MetricsAdapter(_Model):
    """prometheus-adapter serving custom.metrics.k8s.io and external.metrics.k8s.io from Prometheus."""

    image: PinnedImage = "registry.k8s.io/prometheus-adapter/prometheus-adapter:v0.12.0"
    #: Defaults to the Prometheus Operator's governing Service in the monitoring namespace.
    prometheus_url: Annotated[str, Field(pattern=r"^https?://\S+$")] | None = None
    relist_interval_seconds: PositiveInt = 60
    replicas: PositiveInt = 2


class Inference(_Model):
    services: list[InferenceService] = Field(default_factory=list)
    gateway: GatewayRef = GatewayRef()
    adapter: MetricsAdapter = MetricsAdapter()


# --------------------------------------------------------------------------- burst and return


class Handover(_Model):
    """Make before break: inference a gang (or the return home) takes away is replaced first.

    Training pods start behind a scheduling gate; the burst controller scales each inference service's
    standby Deployment on virtual nodes to cover the replicas at risk, then lifts the gate (or closes the
    burst). Ready replicas stay at or above minReplicas throughout; `timeoutSeconds` bounds how long
    training waits for the standby, because training outranks inference.
    """

    enabled: bool = True
    timeout_seconds: Annotated[int, Field(ge=1, le=3600)] = 300
    #: ``current``: the standby replaces every replica at risk, up to the service's current count (capacity
    #: survives the handover); ``minimum``: only up to minReplicas (the floor survives, fewer external GPUs).
    cover: Literal["current", "minimum"] = "current"


class Burst(_Model):
    """Thresholds of the burst controller. The close threshold sits above the open one (hysteresis)."""

    taint_value: DnsLabel = "closed"
    open_below_free_gpus: NonNegativeInt = 8
    close_at_free_gpus: PositiveInt = 32
    open_hold_seconds: NonNegativeInt = 60
    close_hold_seconds: NonNegativeInt = 600
    pending_grace_seconds: NonNegativeInt = 30
    external_deletion_cost: Annotated[int, Field(ge=-(2**31), le=2**31 - 1)] = -100
    resync_seconds: PositiveInt = 30
    stale_after_seconds: PositiveInt = 120
    replicas: Annotated[int, Field(ge=1, le=5)] = 2
    metrics_port: Annotated[int, Field(ge=1024, le=65535)] = 9102
    handover: Handover = Handover()

    @model_validator(mode="after")
    def _band(self) -> Self:
        if self.close_at_free_gpus <= self.open_below_free_gpus:
            raise ValueError(
                f"closeAtFreeGpus ({self.close_at_free_gpus}) must be greater than openBelowFreeGpus "
                f"({self.open_below_free_gpus}); otherwise the taint flaps"
            )
        if self.external_deletion_cost >= 0:
            raise ValueError(
                f"externalDeletionCost ({self.external_deletion_cost}) must be negative so HPA scale-down "
                "removes external replicas before on-prem ones (unannotated pods count as 0)"
            )
        # The controller's watches time out after 60 s; a shorter staleness limit reads a quiet cluster as blind.
        if self.stale_after_seconds <= 60:
            raise ValueError(
                f"staleAfterSeconds ({self.stale_after_seconds}) must exceed 60 (the controller's watch timeout)"
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
    #: Also evict external pods whose preferred on-prem affinity could now be met (nodeFit checks room).
    prefer_onprem_affinity: bool = False

    @field_validator("schedule")
    @classmethod
    def _cron(cls, value: str) -> str:
        if len(value.split()) != 5:
            raise ValueError("must be a five-field cron expression such as '*/2 * * * *'")
        return value

    @model_validator(mode="after")
    def _limits(self) -> Self:
        if self.max_pods_per_node > self.max_pods_total:
            raise ValueError(
                f"maxPodsPerNode ({self.max_pods_per_node}) must not exceed maxPodsTotal ({self.max_pods_total})"
            )
        if self.max_pods_per_namespace > self.max_pods_total:
            raise ValueError(
                f"maxPodsPerNamespace ({self.max_pods_per_namespace}) must not exceed maxPodsTotal "
                f"({self.max_pods_total})"
            )
        return self


def burst_problems(cfg: ClusterConfig) -> list[Problem]:
    """Rules between providers and inference services: a burst must add pods that can serve."""
    problems: list[Problem] = []
    routable = [p.name for p in cfg.providers if p.routable]
    for index, service in enumerate(cfg.inference.services):
        if service.traffic.shape is TrafficShape.GATEWAY and cfg.providers and not routable:
            problems.append(
                Problem(
                    f"inference.services[{index}].traffic.shape",
                    "'gateway' needs a provider whose pods the cluster can route to (kind 'liqo' or "
                    "podsRoutable: true); otherwise burst replicas serve nobody. Use 'queue-worker'",
                    service.traffic.shape.value,
                )
            )
        largest = max((p.gpus for p in cfg.providers), default=0)
        if cfg.providers and service.gpus_per_replica > largest:
            problems.append(
                Problem(
                    f"inference.services[{index}].gpusPerReplica",
                    f"no provider offers that many GPUs on its virtual node (largest: {largest})",
                    service.gpus_per_replica,
                )
            )
    if cfg.burst.close_at_free_gpus > cfg.onprem_gpus:
        problems.append(
            Problem("burst.closeAtFreeGpus",
                    f"can never be reached: the stack has only {cfg.onprem_gpus} on-prem GPUs",
                    cfg.burst.close_at_free_gpus)
        )
    return problems


# --------------------------------------------------------------------------- observability


class Observability(_Model):
    dcgm_interval_ms: Annotated[int, Field(ge=1000, le=30000)] = 5000
    thermal_threshold_celsius: PositiveInt = 78
    thermal_hold_seconds: PositiveInt = 120
    thermal_warning_band_celsius: PositiveInt = 5
    inference_tolerates_thermal: bool = True
    step_heartbeat_metric: Annotated[str, Field(pattern=r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")] = (
        "training_step_heartbeat_timestamp_seconds"
    )
    hang_window_minutes: PositiveInt = 10
    dashboards: bool = True
    #: Deploy the InfiniBand exporter DaemonSet on the GPU pools (nodes without HCAs export nothing).
    ib_exporter: bool = True
    ib_exporter_port: Annotated[int, Field(ge=1024, le=65535)] = 9315
    #: The rate an InfiniBand port must train at; lower raises InfinibandRateBelowNominal (NDR: 400).
    ib_nominal_rate_gbps: PositiveInt = 400
    #: Deploy the thermal guard (taints hot nodes); off leaves only the alerts.
    thermal_guard: bool = True
    thermal_poll_seconds: PositiveInt = 15
    thermal_guard_port: Annotated[int, Field(ge=1024, le=65535)] = 9316
    #: Prometheus the thermal guard queries.
    prometheus_url: Annotated[str, Field(pattern=r"^https?://")] = "http://prometheus-operated.monitoring.svc:9090"
    #: Scrape interval of our ServiceMonitors; at most the hold so the guard's rule can see the hold.
    scrape_interval_seconds: Annotated[int, Field(ge=1, le=60)] = 15
    #: Labels the Prometheus Operator selects ServiceMonitors and PrometheusRules by (e.g. release).
    monitor_labels: dict[str, str] = Field(default_factory=dict)
    #: XIDs that page: drain and RMA.
    critical_xids: list[Annotated[int, Field(ge=1, le=999)]] = Field(default_factory=lambda: [48, 64, 74, 79, 95])
    #: RuntimeClass that gives dcgm-exporter the GPUs (the NVIDIA container runtime); null for the default.
    dcgm_runtime_class: DnsLabel | None = "nvidia"

    @model_validator(mode="after")
    def _thermal_consistent(self) -> Self:
        if self.thermal_warning_band_celsius >= self.thermal_threshold_celsius:
            raise ValueError(
                f"thermalWarningBandCelsius ({self.thermal_warning_band_celsius}) must be below "
                f"thermalThresholdCelsius ({self.thermal_threshold_celsius})"
            )
        if self.thermal_poll_seconds > self.thermal_hold_seconds:
            raise ValueError(
                f"thermalPollSeconds ({self.thermal_poll_seconds}) must not exceed thermalHoldSeconds "
                f"({self.thermal_hold_seconds}): the guard could not observe the hold"
            )
        if self.scrape_interval_seconds > self.thermal_hold_seconds:
            raise ValueError(
                f"scrapeIntervalSeconds ({self.scrape_interval_seconds}) must not exceed thermalHoldSeconds "
                f"({self.thermal_hold_seconds})"
            )
        if not self.critical_xids:
            raise ValueError("criticalXids must list at least one XID")
        return self


# --------------------------------------------------------------------------- checkpoints


class CheckpointBackend(StrEnum):
    NFS = "nfs"
    LUSTRE = "lustre"
    WEKA = "weka"
    VAST = "vast"
    STATIC = "static"


#: The CSI driver (StorageClass ``provisioner``) behind each dynamically provisioned backend.
CHECKPOINT_DRIVERS: dict[CheckpointBackend, str] = {
    CheckpointBackend.NFS: "nfs.csi.k8s.io",
    CheckpointBackend.LUSTRE: "fsx.csi.aws.com",
    CheckpointBackend.WEKA: "csi.weka.io",
    CheckpointBackend.VAST: "csi.vastdata.com",
}

#: Backend-specific keys (camelCase, as in the stack file) and the backend each belongs to; a key set
#: on another backend is a mistake the driver would silently ignore (or, for FSx, reject at provision).
_BACKEND_KEYS: dict[str, CheckpointBackend] = {
    "server": CheckpointBackend.NFS,
    "share": CheckpointBackend.NFS,
    "subnetId": CheckpointBackend.LUSTRE,
    "securityGroupIds": CheckpointBackend.LUSTRE,
    "deploymentType": CheckpointBackend.LUSTRE,
    "perUnitStorageThroughput": CheckpointBackend.LUSTRE,
    "filesystemName": CheckpointBackend.WEKA,
    "apiSecretName": CheckpointBackend.WEKA,
    "vipPool": CheckpointBackend.VAST,
    "rootExport": CheckpointBackend.VAST,
    "viewPolicy": CheckpointBackend.VAST,
    "driver": CheckpointBackend.STATIC,
    "volumeHandle": CheckpointBackend.STATIC,
    "volumeAttributes": CheckpointBackend.STATIC,
}

#: FSx for Lustre throughput tiers (MB/s per TiB of storage) by deployment type. SCRATCH types are
#: absent on purpose: their data is not replicated, and a checkpoint must survive a file server loss.
LUSTRE_THROUGHPUT_TIERS: dict[str, tuple[int, ...]] = {
    "PERSISTENT_1": (50, 100, 200),
    "PERSISTENT_2": (125, 250, 500, 1000),
}

#: StorageClass parameters the FSx CSI driver accepts; it refuses CreateVolume on any other key
#: (keys prefixed ``csi.storage.k8s.io/`` are the external provisioner's and always allowed).
LUSTRE_PARAMETER_KEYS = frozenset({
    "subnetId", "securityGroupIds", "deploymentType", "perUnitStorageThroughput", "autoImportPolicy",
    "s3ImportPath", "s3ExportPath", "kmsKeyId", "storageType", "driveCacheType",
    "automaticBackupRetentionDays", "dailyAutomaticBackupStartTime", "copyTagsToBackups",
    "dataCompressionType", "weeklyMaintenanceStartTime", "fileSystemTypeVersion", "extraTags",
    "efaEnabled", "metadataConfigurationMode", "metadataIops",
})

_SUBNET = re.compile(r"^subnet-[0-9a-f]{8,17}$")
_SECURITY_GROUP = re.compile(r"^sg-[0-9a-f]{8,17}$")


class Filesystem(_Model):
    """A shared filesystem for checkpoints. Backend-specific fields are checked per backend.

    ``renamedFrom`` lists earlier names of this entry, oldest first. The Kubernetes objects keep the
    oldest name (a PVC cannot be renamed; a new name would be a new, empty volume) and the Pulumi
    resources carry aliases to the earlier logical names, so renaming an entry is a no-op diff.
    """

    name: DnsLabel
    backend: CheckpointBackend
    capacity_gi: PositiveInt = 102_400
    #: Sustained aggregate write bandwidth the backend is sized for (GB/s).
    write_gbps: Annotated[float, Field(gt=0)]
    mount_options: list[str] = Field(default_factory=list)
    renamed_from: list[DnsLabel] = Field(default_factory=list)
    #: Extra StorageClass parameters (escape hatch); may not override the typed ones.
    extra_parameters: dict[str, str] = Field(default_factory=dict)
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
    api_secret_name: DnsLabel | None = None
    api_secret_namespace: DnsLabel = "csi-wekafs"
    capacity_enforcement: Literal["HARD", "SOFT"] = "HARD"
    # vast
    vip_pool: str | None = None
    root_export: str | None = None
    view_policy: str | None = None
    lb_strategy: Literal["roundrobin", "random"] = "roundrobin"
    # static
    driver: str | None = None
    volume_handle: str | None = None
    volume_attributes: dict[str, str] = Field(default_factory=dict)

    @property
    def object_name(self) -> str:
        """The name the Kubernetes objects carry: the oldest name, stable across renames."""
        from components.naming import checkpoint_claim_name

        return checkpoint_claim_name(self.renamed_from[0] if self.renamed_from else self.name)

    @property
    def driver_name(self) -> str:
        if self.backend is CheckpointBackend.STATIC:
            assert self.driver is not None
            return self.driver
        return CHECKPOINT_DRIVERS[self.backend]

    @model_validator(mode="after")
    def _backend_fields(self) -> Self:
        backend = self.backend
        for key, owner in _BACKEND_KEYS.items():
            if owner is not backend and getattr(self, _snake(key)) not in (None, [], {}):
                raise ValueError(f"{key} applies only to backend '{owner}', not '{backend}'")
        if self.name in self.renamed_from:
            raise ValueError(f"renamedFrom must list earlier names, not the current name '{self.name}'")
        check = {
            CheckpointBackend.NFS: self._nfs,
            CheckpointBackend.LUSTRE: self._lustre,
            CheckpointBackend.WEKA: self._weka,
            CheckpointBackend.VAST: self._vast,
            CheckpointBackend.STATIC: self._static,
        }[backend]
        check()
        return self

    def _require(self, *keys: str) -> None:
        missing = [k for k in keys if not getattr(self, _snake(k))]
        if missing:
            raise ValueError(f"backend '{self.backend}' needs {' and '.join(missing)}")

    def _nfs(self) -> None:
        self._require("server", "share")
        assert self.share is not None
        if not self.share.startswith("/"):
            raise ValueError(f"share must be an absolute export path such as '/exports/checkpoints' "
                             f"(got '{self.share}')")

    def _lustre(self) -> None:
        self._require("subnetId", "securityGroupIds", "perUnitStorageThroughput")
        if not _SUBNET.match(self.subnet_id or ""):
            raise ValueError(f"subnetId must be one subnet id like 'subnet-0abc1234' (got '{self.subnet_id}'); "
                             "FSx for Lustre takes exactly one subnet")
        bad = [g for g in self.security_group_ids if not _SECURITY_GROUP.match(g)]
        if bad:
            raise ValueError(f"securityGroupIds must be ids like 'sg-0abc1234' (got {bad})")
        kind = self.deployment_type or "PERSISTENT_2"
        if kind.startswith("SCRATCH"):
            raise ValueError(f"deploymentType '{kind}' does not replicate data; checkpoints need "
                             f"one of {sorted(LUSTRE_THROUGHPUT_TIERS)}")
        if kind not in LUSTRE_THROUGHPUT_TIERS:
            raise ValueError(f"deploymentType must be one of {sorted(LUSTRE_THROUGHPUT_TIERS)} (got '{kind}')")
        tiers = LUSTRE_THROUGHPUT_TIERS[kind]
        if self.per_unit_storage_throughput not in tiers:
            raise ValueError(f"perUnitStorageThroughput for {kind} must be one of {list(tiers)} MB/s/TiB "
                             f"(got {self.per_unit_storage_throughput})")
        if self.capacity_gi != 1200 and self.capacity_gi % 2400:
            raise ValueError(f"capacityGi for FSx for Lustre must be 1200 or a multiple of 2400 "
                             f"(got {self.capacity_gi})")
        provisioned = self.lustre_provisioned_gbps
        if provisioned is not None and self.write_gbps > provisioned:
            raise ValueError(f"writeGbps ({self.write_gbps:g}) exceeds what FSx provisions for capacityGi × "
                             f"perUnitStorageThroughput ({provisioned:.1f} GB/s)")
        unknown = sorted(k for k in self.extra_parameters
                         if k not in LUSTRE_PARAMETER_KEYS and not k.startswith("csi.storage.k8s.io/"))
        if unknown:
            raise ValueError(f"extraParameters {unknown} are not FSx CSI StorageClass parameters; "
                             "the driver would refuse to provision")

    @property
    def lustre_provisioned_gbps(self) -> float | None:
        """FSx for Lustre throughput: storage TiB × MB/s per TiB, in GB/s."""
        if self.backend is not CheckpointBackend.LUSTRE or self.per_unit_storage_throughput is None:
            return None
        return self.capacity_gi / 1024 * self.per_unit_storage_throughput / 1000

    def _weka(self) -> None:
        # WEKA CSI 3.0 removed the unauthenticated mode: every class references the API secret.
        self._require("filesystemName", "apiSecretName")

    def _vast(self) -> None:
        self._require("vipPool", "rootExport", "viewPolicy")
        assert self.root_export is not None
        if not self.root_export.startswith("/"):
            raise ValueError(f"rootExport must be an absolute path such as '/k8s' (got '{self.root_export}')")

    def _static(self) -> None:
        self._require("driver", "volumeHandle")
        assert self.driver is not None
        if not _DNS_SUBDOMAIN.match(self.driver):
            raise ValueError(f"driver must be a CSI driver name such as 'spectrumscale.csi.ibm.com' "
                             f"(got '{self.driver}')")
        if self.extra_parameters:
            raise ValueError("extraParameters apply to StorageClasses; a static volume takes volumeAttributes")


def _snake(key: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", key).lower()


class CheckpointBudget(_Model):
    """How fast a checkpoint must land: ``sizeTb`` (decimal TB) in ``seconds`` from ``writers`` ranks."""

    size_tb: Annotated[float, Field(gt=0)] = 1.0
    seconds: Annotated[float, Field(gt=0)] = 30.0
    writers: PositiveInt = 256
    #: One client's link (GB/s): an NDR 400 Gb/s port moves about 50 GB/s.
    client_link_gbps: Annotated[float, Field(gt=0)] = 50.0


class ThroughputCheck(_Model):
    """The fio check: ``nodes`` × ``writersPerNode`` concurrent writers, each ``sizePerWriterGi``."""

    enabled: bool = False
    filesystem: DnsLabel | None = None
    #: GPU pool the writers run on; default the first pool.
    pool: DnsLabel | None = None
    nodes: PositiveInt = 8
    writers_per_node: PositiveInt = 8
    size_per_writer_gi: PositiveInt = 16
    #: Run weekly (CronJob at a per-stack random minute/hour/day) instead of once per change.
    weekly: bool = False
    deadline_seconds: PositiveInt = 3600
    #: Image carrying fio and the reducer; default the pinned checkpoint-check agent image.
    image: PinnedImage | None = None


class Checkpoint(_Model):
    filesystems: list[Filesystem] = Field(default_factory=list)
    budget: CheckpointBudget = CheckpointBudget()
    #: Fail validation (instead of warning) when a filesystem cannot meet the budget.
    strict: bool = False
    throughput_check: ThroughputCheck = ThroughputCheck()


def checkpoint_problems(cfg: ClusterConfig) -> list[Problem]:
    """Cross-section checkpoint rules: the sizing budget (strict only), the check's pool and nodes."""
    from components.checkpoint_sizing import sizing_problems

    problems = [Problem(path, message, value) for path, message, value in sizing_problems(cfg, strict_only=True)]
    check = cfg.checkpoint.throughput_check
    if check.enabled:
        pool_names = [p.name for p in cfg.pools]
        pool = check.pool or pool_names[0]
        if pool not in pool_names:
            problems.append(Problem("checkpoint.throughputCheck.pool",
                                    f"unknown pool; expected one of {sorted(pool_names)}", pool))
        elif check.nodes > len(cfg.pool(pool).node_names):
            problems.append(Problem("checkpoint.throughputCheck.nodes",
                                    f"pool '{pool}' has only {len(cfg.pool(pool).node_names)} nodes", check.nodes))
    names = [f.object_name for f in cfg.checkpoint.filesystems]
    for index, fs in enumerate(cfg.checkpoint.filesystems):
        if names.count(fs.object_name) > 1:
            problems.append(Problem(f"checkpoint.filesystems[{index}].renamedFrom",
                                    f"two filesystems would own the claim '{fs.object_name}'", fs.name))
    return problems


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
    #: Per-worker CPU and memory requests; size them below the pool's allocatable or the gang never fits.
    cpu_per_worker: str = "64"
    memory_per_worker: str = "1024Gi"
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
    def system_pool_selector(self) -> dict[str, str]:
        """The node selector that places platform components on the system pool."""
        return {f"{self.label_prefix}/pool": self.system_pool.name}

    @property
    def handover_active(self) -> bool:
        """Training waits at the handover gate: only with inference to protect and somewhere to put a standby."""
        return self.burst.handover.enabled and bool(self.providers) and bool(self.inference.services)

    @property
    def handover_services(self) -> dict[str, int]:
        """Inference services the handover protects, with the minimum each keeps ready; empty when off."""
        return {s.name: s.min_replicas for s in self.inference.services} if self.handover_active else {}

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
    problems += checkpoint_problems(cfg)
    check = cfg.checkpoint.throughput_check
    if check.enabled and check.filesystem not in fs_names:
        problems.append(
            Problem("checkpoint.throughputCheck.filesystem",
                    f"must name a declared filesystem; expected one of {sorted(fs_names)}", check.filesystem)
        )
    problems += burst_problems(cfg)
    problems += scheduling_problems(cfg)
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

