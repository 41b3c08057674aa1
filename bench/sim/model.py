"""The simulated cluster's shape, read from the typed stack config (the same one `pulumi up` uses).

Only what the outcome depends on is kept: pools (nodes × GPUs), external providers (GPU and pod limits of
each virtual node), inference services (GPUs per replica, replica bounds, PDB, HPA stabilisation) and the
descheduler's per-cycle limits. Latencies are properties of the environment, not of the stack, so they are
simulation knobs with defaults here.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, replace

from bench.sim.topology import Fabric
from components.config import ClusterConfig, Forecast, SchedulingEngine, TopologyMode
from components.forecast import ForecastRule


@dataclass(frozen=True)
class PoolModel:
    name: str
    nodes: int
    gpus_per_node: int
    # The pool's InfiniBand fabric (`pools[].topology`); None: a flat pool.
    fabric: Fabric | None = None


@dataclass(frozen=True)
class ProviderModel:
    name: str
    node_name: str
    gpus: int
    pods: int
    price_per_gpu_hour: float | None = None  # ranks the providers a burst fills (components.provider_rank)


@dataclass(frozen=True)
class ServiceModel:
    name: str
    gpus_per_replica: int
    min_replicas: int
    max_replicas: int
    max_unavailable: int
    scale_up_stabilization_s: float
    scale_down_stabilization_s: float
    # The service's forecast metric (scaling.forecast), modelled by the deployed rule's own function.
    forecast: ForecastRule | None = None


@dataclass(frozen=True)
class DeschedulerLimits:
    """One descheduler run every `interval_s`; `None` limits mean unlimited (the naive baseline).

    `prefer_onprem` is the stack's `descheduler.preferOnpremAffinity`: RemovePodsViolatingNodeAffinity in
    preferred mode also moves pods off virtual nodes that are open, whenever one fits on-prem.
    """

    interval_s: float
    max_per_node: int | None
    max_per_namespace: int | None
    max_total: int | None
    min_pod_age_s: float
    prefer_onprem: bool = False


@dataclass(frozen=True)
class Latencies:
    """Environment timings (seconds): pod start to Ready on-prem and on an external provider, cold and warm,
    HPA period.

    A cold external start pulls the image and loads the model (7-10 min with a cold 10-20 GB pull, under
    30-40 s tuned; 180 s here, between the two); a warm one takes over an instance already started and
    asleep: llm-d measured 4.0 s warm against 85 s cold, a sleeping vLLM wakes in about 3 s (the design
    brief's field facts).
    """

    onprem_start_s: float = 60.0
    external_start_s: float = 180.0
    external_warm_start_s: float = 4.0
    hpa_period_s: float = 15.0


@dataclass(frozen=True)
class ClusterModel:
    pools: tuple[PoolModel, ...]
    providers: tuple[ProviderModel, ...]
    services: tuple[ServiceModel, ...]
    descheduler: DeschedulerLimits
    latencies: Latencies = Latencies()
    # Volcano's enqueue action with the capacity plugin (the stack's scheduler configuration; the same gate
    # as proportion's: allocated + Inqueue + minResources within the queue's capability): a gang's
    # pods exist only once the training queue's allocated + Inqueue GPUs leave room for it. False models a
    # scheduler that creates every gang's pods on submission (all queued training counts as pending).
    enqueue_gate: bool = True
    # One training queue per pool (`scheduling.trainingQueuePerPool`): the enqueue gate then counts room per
    # pool (allocated + Inqueue GPUs of that pool's queue within the pool's GPUs) instead of cluster-wide.
    queue_per_pool: bool = False
    # How gangs of pools with a fabric are held to it (`scheduling.topologyMode`, the Volcano Job's
    # `networkTopology.mode`); None places them as in a flat pool (the fabric is then only measured).
    topology_mode: TopologyMode | None = None

    @property
    def onprem_gpus(self) -> int:
        return sum(p.nodes * p.gpus_per_node for p in self.pools)

    @classmethod
    def from_config(cls, cfg: ClusterConfig, latencies: Latencies | None = None) -> ClusterModel:
        pools = tuple(PoolModel(p.name, len(p.node_names), p.gpus_per_node,
                                None if p.topology is None else Fabric.of(p.topology)) for p in cfg.pools)
        providers = tuple(ProviderModel(p.name, p.node_name, p.gpus, p.pods, p.price_per_gpu_hour)
                          for p in cfg.providers)
        services = tuple(
            ServiceModel(
                s.name,
                s.gpus_per_replica,
                s.min_replicas,
                s.max_replicas,
                s.max_unavailable,
                float(s.scaling.scale_up_stabilization_seconds),
                float(s.scaling.scale_down_stabilization_seconds),
                ForecastRule.of(s.name, "demand", s.scaling.forecast) if s.scaling.forecast.enabled else None,
            )
            for s in cfg.inference.services
        )
        d = cfg.descheduler
        limits = DeschedulerLimits(
            interval_s=cron_interval_seconds(d.schedule),
            max_per_node=d.max_pods_per_node,
            max_per_namespace=d.max_pods_per_namespace,
            max_total=d.max_pods_total,
            min_pod_age_s=float(d.min_pod_age_seconds),
            prefer_onprem=d.prefer_onprem_affinity,
        )
        # The template's rule (components/training_spec.py topology_mode): Volcano and a pool with a topology.
        placed = cfg.scheduling.engine is SchedulingEngine.VOLCANO and any(p.topology is not None for p in cfg.pools)
        return cls(pools, providers, services, limits, latencies or Latencies(),
                   queue_per_pool=cfg.scheduling.queue_per_pool(len(cfg.pools)),
                   topology_mode=cfg.scheduling.topology_mode if placed else None)

    def with_forecast(self, forecast: Forecast) -> ClusterModel:
        """Every service with `forecast` as its HPA's second metric (none when it is off), as if each service of
        the stack set it."""
        services = tuple(replace(s, forecast=ForecastRule.of(s.name, "demand", forecast) if forecast.enabled else None)
                         for s in self.services)
        return replace(self, services=services)

    def scaled_to(self, gpus: int) -> ClusterModel:
        """The same shape at another size: node counts (and a fabric's leaves), provider GPUs and replica bounds
        scale together."""
        factor = gpus / self.onprem_gpus
        pools = tuple(replace(p, nodes=n, fabric=None if p.fabric is None else p.fabric.scaled(n))
                      for p in self.pools for n in [max(1, round(p.nodes * factor))])
        providers = tuple(replace(p, gpus=max(1, round(p.gpus * factor)), pods=max(1, round(p.pods * factor)))
                          for p in self.providers)
        services = tuple(
            replace(s, min_replicas=max(1, round(s.min_replicas * factor)),
                    max_replicas=max(1, round(s.max_replicas * factor)))
            for s in self.services
        )
        return replace(self, pools=pools, providers=providers, services=services)


def cron_interval_seconds(schedule: str) -> float:
    """Period of a descheduler CronJob schedule; supports the minute forms the stack uses.

    `* * * * *` → 60 s, `*/N * * * *` → N minutes, `a,b,c * * * *` → the shortest gap. Other forms (hours,
    days) make the descheduler too slow to matter for a return measured in minutes, so they are refused.
    """
    fields = schedule.split()
    if len(fields) != 5 or any(f != "*" for f in fields[1:]):
        raise ValueError(f"descheduler.schedule: only minute-level schedules are simulated, got {schedule!r}")
    minute = fields[0]
    if minute == "*":
        return 60.0
    if minute.startswith("*/") and minute[2:].isdigit() and int(minute[2:]) > 0:
        return 60.0 * int(minute[2:])
    parts = minute.split(",")
    if all(p.isdigit() for p in parts):
        values = sorted({int(p) for p in parts})
        gaps = [b - a for a, b in itertools.pairwise(values)] + [60 - values[-1] + values[0]]
        return 60.0 * min(gaps)
    raise ValueError(f"descheduler.schedule: cannot read the minute field {minute!r}")

