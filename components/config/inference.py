"""Inference services: traffic shape, HPA scaling, the gateway and the metrics adapter."""

from __future__ import annotations

from enum import StrEnum
from typing import TYPE_CHECKING, Annotated, Self
from urllib.parse import urlsplit

from pydantic import Field, field_validator, model_validator

from components import images
from components.config.base import (
    ConfigModel,
    DnsLabel,
    NonNegativeInt,
    PinnedImage,
    PlainUrl,
    PositiveInt,
    Problem,
    Quantity,
    dns_1035,
    unique_names,
    url_without_credentials,
)

#: Room in a service name for the suffixes of its derived objects (``-standby``, ``-queue``, the HPA's).
SERVICE_NAME_ROOM = 16

if TYPE_CHECKING:
    from components.config.cluster import ClusterConfig


#: A broker URL's port when it names none, by scheme: the queue URL's check and the broker's egress rule read it.
DEFAULT_PORTS = {"amqps": 5671, "amqp": 5672, "https": 443, "http": 80, "nats": 4222, "redis": 6379,
                 "rediss": 6379, "kafka": 9092}


class TrafficShape(StrEnum):
    QUEUE_WORKER = "queue-worker"
    GATEWAY = "gateway"


class Traffic(ConfigModel):
    """How requests reach replicas wherever they run; without this a burst adds idle pods.

    ``queue-worker``: replicas pull from a broker every location reaches (queueUrl, credentials).
    ``gateway``: an HTTPRoute for gatewayHost sends requests to one Service spanning every ready replica,
    so each location gets traffic in proportion to its ready replicas; the service bursts only onto
    providers whose pod IPs the cluster can route to.
    """

    shape: TrafficShape
    """How requests reach the replicas: `queue-worker` (they pull from a broker) or `gateway` (an HTTPRoute to
    one Service over every ready replica)."""
    queue_url: str | None = None
    """Broker URL every location reaches, given to replicas as `QUEUE_URL`; required for `queue-worker`. No
    credentials in it; its port is the one the egress policy opens."""
    queue_credentials_secret: str | None = None
    """Name of a secret config key holding the broker credentials; replicas read them as `QUEUE_CREDENTIALS`
    from a Secret."""
    gateway_host: str | None = None
    """Host name the HTTPRoute matches; required for `gateway`."""

    @field_validator("queue_url")
    @classmethod
    def _queue_url(cls, url: str | None) -> str | None:
        if url is None:
            return url
        url_without_credentials(url, "the secret config key named by queueCredentialsSecret "
                                     "(`pulumi config set --secret <key> '<url with credentials>'`)")
        # The broker's egress policy opens exactly this port: the URL's own, else its scheme's default.
        parts = urlsplit(url)
        if not parts.scheme or not parts.hostname:
            raise ValueError("must be a URL with scheme and host such as 'amqps://queue.example:5671/jobs'")
        if parts.port is None and parts.scheme not in DEFAULT_PORTS:
            raise ValueError(f"names no port and scheme '{parts.scheme}' has no known default "
                             f"({', '.join(sorted(DEFAULT_PORTS))}); write the port in the URL")
        return url

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


#: How often the forecast's recording rules are evaluated (seconds): the HPA's own sync period (15 s by default),
#: so every HPA sync reads a forecast at most one sync old, and no evaluation is wasted between two syncs.
FORECAST_INTERVAL_SECONDS = 15


class Forecast(ConfigModel):
    """Replicas before the ramp: a forecast of the scaling metric as the HPA's second metric, with the same
    per-replica target, so the HPA takes the larger of demand now and demand expected `horizonSeconds` ahead.

    A Prometheus recording rule computes it every 15 s (the HPA's sync period) from the service's demand:
    the larger of a linear trend over `trendWindowSeconds` projected `horizonSeconds` ahead, and (with
    `seasonSeconds`) the demand one season ago at the horizon, scaled by how today's level over
    `levelWindowSeconds` compares with that season's. prometheus-adapter serves it as an external metric.
    """

    # Off by default. Measured with the forecast on every service (4,096 GPUs, seed 1, 4 days after one warm-up
    # day; bench_families gives the full table): the daily season cuts the shortfall of replicas still starting
    # where demand repeats (loop-smooth 0.100 -> 0.006 points, decays 0.493 -> 0.368, steep ramps 0.115 -> 0.098)
    # and lifts the services-alone bound itself, but the replicas it asks for early land on on-prem GPUs a gang
    # then takes (2 days: preemptions +33 % on plateaus, +81 % diurnal) and their replacements find the virtual
    # nodes full, so the shortfall of replicas being replaced grows on plateaus (0.233 -> 0.342) and diurnal
    # demand (0.026 -> 0.060), all of it while no virtual node had room. The trend alone moves the starting
    # shortfall by at most 0.013 points either way (a ramp sampled in 5-minute bins is one step it cannot see
    # coming). External GPU·h change by -1 to +6 %. Not better everywhere, so a stack turns it on per service
    # whose demand it knows to repeat.
    horizon_seconds: Annotated[int, Field(ge=0, le=3600)] = 0
    """How far ahead the forecast looks (seconds, a multiple of 15); about the external start (image pull and
    model load on a virtual node), the time a replica asked for now takes to serve. 0: no forecast metric."""
    trend_window_seconds: Annotated[int, Field(ge=30, le=3600)] = 300
    """Window of the linear trend (`predict_linear`, seconds, a multiple of 15): short enough to follow a ramp
    within minutes, long enough that one noisy sample does not tilt it."""
    season_seconds: Annotated[int, Field(ge=0, le=2_419_200)] = 0
    """Length of the demand's season (seconds, a multiple of 15; 86400 for a daily cycle, 604800 weekly); 0
    leaves the seasonal term out and the forecast is the trend alone."""
    level_window_seconds: Annotated[int, Field(ge=60, le=86_400)] = 3600
    """Window over which today's level is compared with the same window one season ago (seconds, a multiple of
    15); the ratio scales last season's demand to today's."""

    @property
    def enabled(self) -> bool:
        return self.horizon_seconds > 0

    @model_validator(mode="after")
    def _on_the_evaluation_grid(self) -> Self:
        step = FORECAST_INTERVAL_SECONDS
        for key, value in (("horizonSeconds", self.horizon_seconds), ("trendWindowSeconds", self.trend_window_seconds),
                           ("seasonSeconds", self.season_seconds), ("levelWindowSeconds", self.level_window_seconds)):
            if value % step:
                raise ValueError(f"{key} must be a multiple of the rule's {step} s evaluation interval "
                                 f"(the recorded samples it reads lie on that grid), got {value}")
        if self.season_seconds and self.season_seconds <= self.horizon_seconds:
            raise ValueError(f"seasonSeconds ({self.season_seconds}) must exceed horizonSeconds "
                             f"({self.horizon_seconds}): the seasonal term reads last season at the horizon")
        return self


class Scaling(ConfigModel):
    """HPA target. cpu/memory: average utilization percent; queue-depth: waiting jobs per replica
    (an external metric); in-flight: concurrent requests per replica (a pods metric)."""

    metric: ScalingMetric = ScalingMetric.QUEUE_DEPTH
    """What the HPA scales on: `cpu` or `memory` utilization, `queue-depth` (waiting jobs, an external
    metric) or `in-flight` (concurrent requests, a pods metric)."""
    target: PositiveInt = 4
    """The metric's target: a utilization percent (1-100) for cpu/memory, an average per replica otherwise."""
    scale_up_stabilization_seconds: NonNegativeInt = 0
    """HPA scale-up stabilization window (seconds); 0 scales up at once."""
    scale_down_stabilization_seconds: NonNegativeInt = 300
    """HPA scale-down stabilization window (seconds): the highest recommendation within it holds, so a short
    dip removes no replica."""
    scale_down_percent_per_minute: Annotated[int, Field(ge=1, le=100)] = 10
    """Scale-down never removes more than this share of replicas per minute (a gentle return)."""
    prometheus_series: Annotated[str, Field(pattern=r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")] | None = None
    """Prometheus series the adapter serves for queue-depth/in-flight; `inference_queue_depth` or
    `inference_requests_in_flight` when unset."""
    forecast: Forecast = Forecast()
    """A forecast of the metric as a second HPA metric (queue-depth only); off unless `horizonSeconds` is set."""

    @model_validator(mode="after")
    def _target(self) -> Self:
        if self.metric in (ScalingMetric.CPU, ScalingMetric.MEMORY) and self.target > 100:
            raise ValueError(f"target for metric '{self.metric}' is a utilization percent (1-100), got {self.target}")
        if self.metric in (ScalingMetric.CPU, ScalingMetric.MEMORY) and self.prometheus_series:
            raise ValueError(f"prometheusSeries applies to queue-depth/in-flight, not '{self.metric}'")
        if self.forecast.enabled and self.metric is not ScalingMetric.QUEUE_DEPTH:
            raise ValueError(f"forecast applies to metric 'queue-depth' (one series per service, selected by its "
                             f"service label), not '{self.metric}': a per-pod or resource metric has no service-wide "
                             "series to forecast")
        return self


class InferenceService(ConfigModel):
    name: Annotated[DnsLabel, dns_1035(SERVICE_NAME_ROOM)]
    """Name of the Deployment, its Service (DNS-1035: starts with a letter) and HPA, and the prefix of its
    standby and Secret."""
    image: PinnedImage
    """Pinned image of the inference server."""
    gpus_per_replica: PositiveInt = 1
    """GPUs each replica requests (limit = request); a node of its pool(s), and a provider, must have as many."""
    min_replicas: PositiveInt = 2
    """HPA minimum, and what the handover keeps ready while training takes GPUs."""
    max_replicas: PositiveInt = 16
    """HPA maximum."""
    port: Annotated[int, Field(ge=1, le=65535)] = 8080
    """Port the server listens on: the Service and the HTTPRoute send requests there, the probes ask there."""
    cpu: Quantity = "8"
    """CPU request of each replica."""
    memory: Quantity = "64Gi"
    """Memory request and limit of each replica."""
    max_unavailable: PositiveInt = 1
    """Replicas a drain or an eviction may take at once (the PodDisruptionBudget); below `minReplicas`."""
    readiness_path: str = "/healthz"
    """HTTP path of the readiness and startup probes: a replica gets requests only while it answers."""
    liveness_path: str | None = None
    """The server's liveness path ("the process works", e.g. Triton's /v2/health/live), apart from readiness
    ("can serve now"). Unset: liveness is a TCP connect to the server's port, so a loaded replica that stops
    being ready is taken out of the Service but never restarted for it."""
    startup_timeout_seconds: Annotated[int, Field(ge=30, le=7200)] = 1800
    """How long a replica may take to load its model before the readiness path must answer (seconds); until
    then the liveness probe does not run, so a slow load is never killed as a hang."""
    pool: DnsLabel | None = None
    """GPU pool the replicas prefer and tolerate; every pool when unset."""
    traffic: Traffic
    """How requests reach the replicas wherever they run."""
    scaling: Scaling = Scaling()
    """The HPA's metric, target and pace."""
    args: list[str] = Field(default_factory=list)
    """Arguments of the server container; the image's own when empty."""

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
        if self.liveness_path is not None and not self.liveness_path.startswith("/"):
            raise ValueError(f"livenessPath must start with '/', got '{self.liveness_path}'")
        return self


class GatewayRef(ConfigModel):
    """The Gateway (Gateway API) that gateway-shaped services attach their HTTPRoute to."""

    name: DnsLabel = "inference-gateway"
    """Name of the Gateway."""
    namespace: DnsLabel | None = None
    """Namespace of the Gateway; the inference namespace when unset."""
    section_name: DnsLabel | None = None
    """Listener of the Gateway the routes attach to (`sectionName`); every listener that admits them when unset."""


class MetricsAdapter(ConfigModel):
    """prometheus-adapter serving custom.metrics.k8s.io and external.metrics.k8s.io from Prometheus."""

    image: PinnedImage = images.PROMETHEUS_ADAPTER
    """Pinned prometheus-adapter image."""
    prometheus_url: Annotated[PlainUrl, Field(pattern=r"^https?://\S+$")] | None = None
    """Prometheus the adapter queries; the Prometheus Operator's governing Service in the monitoring namespace
    when unset."""
    relist_interval_seconds: PositiveInt = 60
    """How often the adapter lists Prometheus's series again (`--metrics-relist-interval`, seconds)."""
    replicas: PositiveInt = 2
    """Adapter replicas, on different nodes: one node down must not take every HPA's metrics with it."""


class Inference(ConfigModel):
    services: list[InferenceService] = Field(default_factory=list)
    """Inference services, each a Deployment its HPA scales, with a Service and a PodDisruptionBudget."""
    gateway: GatewayRef = GatewayRef()
    """The Gateway that `gateway`-shaped services attach their HTTPRoutes to."""
    adapter: MetricsAdapter = MetricsAdapter()
    """prometheus-adapter, deployed when a service scales on queue-depth or in-flight."""



def inference_problems(cfg: ClusterConfig) -> list[Problem]:
    """Service names are distinct and each named pool exists."""
    problems = unique_names(enumerate(s.name for s in cfg.inference.services), "inference.services", "service")
    pool_names = {p.name for p in cfg.pools}
    for index, service in enumerate(cfg.inference.services):
        if service.pool is not None and service.pool not in pool_names:
            problems.append(
                Problem(f"inference.services[{index}].pool", f"unknown pool; expected one of {sorted(pool_names)}",
                        service.pool)
            )
            continue
        candidates = [p for p in cfg.pools if service.pool in (None, p.name)]
        largest = max(p.gpus_per_node for p in candidates)
        if service.gpus_per_replica > largest:
            where = f"pool '{service.pool}'" if service.pool else "any pool"
            problems.append(
                Problem(f"inference.services[{index}].gpusPerReplica",
                        f"a replica fits on no node: nodes of {where} have at most {largest} GPUs",
                        service.gpus_per_replica)
            )
    return problems
