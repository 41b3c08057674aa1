"""Burst and return: the burst controller's thresholds, the handover, and their checks against providers."""

from __future__ import annotations

import math
import re
from typing import TYPE_CHECKING, Annotated, Literal, Self

from pydantic import Field, model_validator
from pydantic.alias_generators import to_camel

from agents.burst_controller.contract import BurstSettings, SettingsError
from components.config.base import ConfigModel, DnsLabel, NonNegativeInt, PositiveInt, Problem
from components.config.inference import TrafficShape

if TYPE_CHECKING:
    from components.config.cluster import ClusterConfig


#: The agent's own defaults (its contract): the stack's defaults are the same numbers, not a copy of them.
_AGENT = BurstSettings()


class Handover(ConfigModel):
    """Make before break: inference a gang (or the return home) takes away is replaced first.

    Training pods start behind a scheduling gate; the burst controller scales each inference service's
    standby Deployment on virtual nodes to cover the replicas at risk, then lifts the gate (or closes the
    burst). Ready replicas stay at or above minReplicas throughout; `timeoutSeconds` bounds how long
    training waits for the standby, because training outranks inference.
    """

    enabled: bool = True
    """Gate training behind the standby (make before break). In effect only where the stack has both providers
    and inference services; off, a gang takes inference GPUs at once."""
    timeout_seconds: Annotated[int, Field(ge=1, le=3600)] = int(_AGENT.handover_timeout_seconds)
    """Longest a gang waits at the gate, and a close waits for the standby, before going ahead without it
    (seconds): training outranks inference."""
    cover: Literal["current", "minimum"] = _AGENT.handover_cover.value
    """`current`: the standby replaces every replica at risk, up to the service's current count (capacity
    survives the handover); `minimum`: only up to minReplicas (the floor survives, on fewer external GPUs)."""
    sizing: Literal["pool", "displaced"] = _AGENT.handover_sizing.value
    """`pool`: a waiting gang puts at risk every ready replica of its pool; `displaced`: only the replicas on
    the GPUs it lacks (node by node, at most that many per service), for fewer external GPU·h and a little
    less availability (see the simulator)."""
    return_batch: NonNegativeInt = _AGENT.handover_return_batch
    """External replicas per service the standby covers while they return home (those the descheduler moves
    at once, e.g. its `maxPodsPerNamespace`); 0: every external replica."""


class Burst(ConfigModel):
    """Thresholds of the burst controller. The close threshold sits above the open one (hysteresis)."""

    taint_value: DnsLabel = _AGENT.taint_value
    """Value of the burst taint `<labelPrefix>/burst=<value>:NoSchedule` that the controller keeps on every
    virtual node while the burst is closed."""
    open_below_free_gpus: NonNegativeInt = _AGENT.open_below_free_gpus
    """Open the burst when the effective free on-prem GPUs (per pool, free minus what pending training needs; only
    the pools the inference services may run in) stay below this for `openHoldSeconds`."""
    close_at_free_gpus: PositiveInt = _AGENT.close_at_free_gpus
    """Close the burst when the effective free on-prem GPUs reach this plus the GPUs inference uses externally,
    for `closeHoldSeconds`; above `openBelowFreeGpus`, so the taint does not flap."""
    open_hold_seconds: NonNegativeInt = int(_AGENT.open_hold_seconds)
    """How long the shortage must last before the burst opens (seconds)."""
    close_hold_seconds: NonNegativeInt = int(_AGENT.close_hold_seconds)
    """How long the plenty must last before the burst closes and external replicas go home (seconds)."""
    pending_grace_seconds: NonNegativeInt = int(_AGENT.pending_grace_seconds)
    """Inference GPUs pending this long open the burst whatever the free count (seconds)."""
    external_deletion_cost: Annotated[int, Field(ge=-(2**31), le=2**31 - 1)] = _AGENT.external_deletion_cost
    """`pod-deletion-cost` the controller gives inference replicas on virtual nodes: negative, so an HPA
    scale-down removes them before on-prem ones; with priced providers the dearer ones get less."""
    resync_seconds: PositiveInt = int(_AGENT.resync_seconds)
    """How often the controller lists everything again, repairing what a missed watch event left wrong
    (seconds)."""
    stale_after_seconds: PositiveInt = int(_AGENT.stale_after_seconds)
    """With cluster data older than this (seconds) the controller leaves the taints as they are; a longer gap
    between two decisions restarts the holds."""
    tick_seconds: PositiveInt = int(_AGENT.tick_seconds)
    """How often the controller decides (seconds); hold timers and the handover timeout are as precise as
    this."""
    replicas: Annotated[int, Field(ge=1, le=5)] = 2
    """Burst controller replicas: one leads through a Lease, the others stand by for a drain or a crash."""
    metrics_port: Annotated[int, Field(ge=1024, le=65535)] = 9102
    """Port of the controller's /metrics endpoint, which Prometheus scrapes."""
    handover: Handover = Handover()
    """Make before break: the inference a gang (or the return home) takes away is replaced first."""
    warm_pool_share: Annotated[float, Field(ge=0.0, le=1.0)] = _AGENT.warm_pool_share
    """Warm external capacity: while the burst is open, each handover service keeps this share of its replicas
    (rounded up) as placeholders on virtual nodes (its `<service>-warm` Deployment, the lowest priority), so a
    scale-up landing on one starts warm in seconds instead of a cold external start of minutes. At every
    service's maxReplicas it must fit on the GPUs of the providers it may run on. 0: none; what each size costs
    and serves is in bench/report.md."""
    warm_pool_ramp_seconds: NonNegativeInt = int(_AGENT.warm_pool_ramp_seconds)
    """The warm pool also holds the rise each service's replica count is expected to make over this many
    seconds (its rise over the last 5 minutes carried forward), at most its current count; 0: share alone."""
    return_surge_share: Annotated[float, Field(ge=0.0, le=1.0)] = _AGENT.return_surge_share
    """Make-before-break return: external replicas come home while the burst is open once on-prem has room
    training does not need; each handover service's on-prem `<service>-return` Deployment (at most this share
    of its replicas, rounded up: the surge the HPA tolerates) starts the replacements first, the controller
    evicts an external replica only for a Ready one. 0: no bridge, the descheduler's return after the close;
    what it moves is in bench/report.md."""

    @model_validator(mode="after")
    def _agent_rules(self) -> Self:
        """The agent's own rules on these values, spelled with the stack's keys: one validator per rule."""
        agent = {name: getattr(self, name) for name in AGENT_KEYS}
        try:
            BurstSettings.from_mapping(agent, source="burst")
        except SettingsError as exc:
            raise ValueError(_stack_spelling(str(exc).removeprefix("burst: "))) from None
        return self


#: The section's keys that are the agent's own settings (the rest configure the deployment).
AGENT_KEYS = ("taint_value", "open_below_free_gpus", "close_at_free_gpus", "open_hold_seconds", "close_hold_seconds",
              "pending_grace_seconds", "external_deletion_cost", "resync_seconds", "stale_after_seconds",
              "tick_seconds", "warm_pool_share", "warm_pool_ramp_seconds", "return_surge_share")


def _stack_spelling(message: str) -> str:
    """The agent's snake_case key names as the stack file spells them (camelCase)."""
    return re.sub(r"\b[a-z]+(?:_[a-z0-9]+)+\b", lambda m: to_camel(m.group(0)), message)


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
    problems += warm_pool_problems(cfg)
    if cfg.burst.close_at_free_gpus > cfg.onprem_gpus:
        problems.append(
            Problem("burst.closeAtFreeGpus",
                    f"can never be reached: the stack has only {cfg.onprem_gpus} on-prem GPUs",
                    cfg.burst.close_at_free_gpus)
        )
    return problems


def warm_pool_problems(cfg: ClusterConfig) -> list[Problem]:
    """The warm pool at its largest fits on the providers it may run on.

    While the burst is open the controller keeps ceil(`warmPoolShare` × replicas) placeholders per handover
    service (``plan_warm`` in the agent), each as large as a replica, on the virtual nodes of the service's
    eligible providers (routable ones for a gateway service); at `maxReplicas` everywhere a pool beyond those
    providers' GPUs could never be placed: its placeholders would sit Pending while the share promises warm starts.
    """
    share = cfg.burst.warm_pool_share
    if not cfg.handover_active or share == 0:
        return []
    services = cfg.inference.services
    # Rounded as plan_warm rounds (a share such as 0.1 × 30 is not a hair above 3).
    warm = sum(math.ceil(share * s.max_replicas - 1e-9) * s.gpus_per_replica for s in services)
    eligible = [p for p in cfg.providers
                if p.routable or any(s.traffic.shape is not TrafficShape.GATEWAY for s in services)]
    capacity = sum(p.gpus for p in eligible)
    if warm <= capacity:
        return []
    return [Problem(
        "burst.warmPoolShare",
        f"the warm pool would hold up to {warm} GPUs (ceil(warmPoolShare × maxReplicas) × gpusPerReplica over the "
        f"inference services), more than the {capacity} GPUs of the providers it can run on "
        f"({', '.join(p.name for p in eligible)}); lower warmPoolShare or add provider capacity", share)]
