"""The policies compared on one seeded workload.

- static partition: a fixed share of on-prem GPUs (whole nodes) is reserved for inference, training may
  not use it and inference may not leave it; no burst, no preemption. The share is the inference GPUs the
  HPA asks for at the diurnal peak without spikes — a generous, hand-tuned partition.
- no burst: one shared pool, training preempts inference, virtual nodes stay tainted: evicted or scaled-up
  inference waits for on-prem GPUs.
- naive burst: the controller's own core with zero holds and adjacent thresholds (open below N free GPUs,
  close at N + 1 plus the external GPUs), and a descheduler without per-cycle limits or minimum pod age
  that runs every controller tick — "open at once, come back at once". Using the real core (rather than a
  policy of its own) isolates the effect of hysteresis and gradual return from everything else. No handover:
  a gang starts as soon as it can and deletes the inference in its way.
- controller without handover: the stack's settings with no handover services, the product before the
  make-before-break handover: isolates what the standby buys (availability) and costs (external GPUs, gang
  wait).
- controller: the core with the stack's settings (handover included, as the stack deploys it by default)
  and the descheduler with the stack's limits.
- placement oracle: the real HPA (its lag, headroom and stabilisation windows) and the real start times, but
  virtual nodes always open and every external pod moved on-prem, at no cost, at each HPA sync it fits: the
  fewest external GPU·h any burst controller could reach, since the HPA, not the controller, sets how many
  replicas there are and when. A cost bound, not an availability one (its moves are not make-before-break).
- a perfect forecast (`foresighted`, any policy): every HPA also proposes the true peak demand of the next
  external start, in place of the services' forecast rule: the bound on what forecasting could add.
- oracle: an upper bound, not a policy one could run — zero pod start latency, an HPA that matches demand
  exactly every period, virtual nodes always open, and external pods moved on-prem instantly whenever a
  GPU frees. Availability is then limited only by total capacity; utilisation by training's own demand.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from agents.burst_controller.contract import BurstSettings
from bench.sim.controller_adapter import naive_settings
from bench.sim.model import ClusterModel, DeschedulerLimits
from bench.sim.workload import WorkloadSpec

NEVER = "never"
CONTROLLER = "controller"
ALWAYS = "always"


@dataclass(frozen=True)
class Policy:
    name: str
    burst: str  # NEVER (taint stays), CONTROLLER (the real core flips it), ALWAYS (oracle: never tainted)
    settings: BurstSettings | None = None  # for CONTROLLER
    descheduler: DeschedulerLimits | None = None
    reserved_inference_gpus: int = 0
    zero_lag: bool = False
    # Feed the core per-pool free and pending-training GPUs (what the view learns from pool labels and
    # training pods' required affinity). False feeds cluster-wide totals only: the core before per-pool
    # accounting, kept as a baseline.
    pool_accounting: bool = True
    # Move external pods on-prem the moment they fit, at every HPA sync and at no cost (the oracles).
    rebalance: bool = False
    # > 0: every HPA's second metric is a perfect forecast, the true peak demand of the next `foresight_s`
    # seconds (`foresighted`). Not a rule anyone can deploy: the best any forecast metric could do.
    foresight_s: float = 0.0


def static_partition(model: ClusterModel, spec: WorkloadSpec) -> Policy:
    gpus = sum(
        math.ceil(spec.peak_share * s.max_replicas * spec.hpa_headroom) * s.gpus_per_replica for s in model.services
    )
    return Policy("static partition", NEVER, reserved_inference_gpus=gpus)


def no_burst() -> Policy:
    return Policy("no burst", NEVER)


def naive_burst(model: ClusterModel, settings: BurstSettings) -> Policy:
    tick = float(settings.tick_seconds)
    limits = DeschedulerLimits(interval_s=tick, max_per_node=None, max_per_namespace=None, max_total=None,
                               min_pod_age_s=0.0)
    return Policy("naive burst", CONTROLLER, naive_settings(settings), limits)


def controller(model: ClusterModel, settings: BurstSettings) -> Policy:
    return Policy("controller", CONTROLLER, settings, model.descheduler)


def controller_no_handover(model: ClusterModel, settings: BurstSettings) -> Policy:
    return Policy("controller without handover", CONTROLLER, settings.replace(handover_services={}), model.descheduler)


def oracle(model: ClusterModel) -> Policy:
    return Policy("oracle", ALWAYS, zero_lag=True, rebalance=True)


def placement_oracle(model: ClusterModel) -> Policy:
    return Policy("placement oracle", ALWAYS, rebalance=True)


def foresighted(policy: Policy, model: ClusterModel) -> Policy:
    """`policy` with a perfect forecast in every HPA: the peak demand of the next external start plus one HPA
    period, the span a replica asked for now needs to be Ready wherever it lands. What is left of the
    shortfall then is not the forecast's to close, whatever its rule."""
    horizon = model.latencies.external_start_s + model.latencies.hpa_period_s
    return replace(policy, name=f"{policy.name} with a perfect forecast", foresight_s=horizon)


def all_policies(model: ClusterModel, settings: BurstSettings, spec: WorkloadSpec) -> list[Policy]:
    """Every policy, in the order the outcome table shows them."""
    return [
        static_partition(model, spec),
        no_burst(),
        naive_burst(model, settings),
        controller_no_handover(model, settings),
        controller(model, settings),
        oracle(model),
    ]
