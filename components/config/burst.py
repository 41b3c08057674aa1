"""Burst and return: the burst controller's thresholds, the handover, and their checks against providers."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Annotated

from pydantic import Field

from agents.burst_controller.contract import BurstTunables, HandoverTunables
from components.config.base import ConfigModel, ContainerRequests, Problem
from components.config.inference import TrafficShape

if TYPE_CHECKING:
    from components.config.cluster import ClusterConfig


class Handover(ConfigModel, HandoverTunables):
    """Make before break: inference a gang (or the return home) takes away is replaced first.

    Training pods start behind a scheduling gate; the burst controller scales each inference service's
    standby Deployment on virtual nodes to cover the replicas at risk, then lifts the gate (or closes the
    burst). Ready replicas stay at or above minReplicas throughout; `timeoutSeconds` bounds how long
    training waits for the standby, because training outranks inference. The keys are the controller's own
    (its contract's ``HandoverTunables``), plus `enabled`.
    """

    enabled: bool = True
    """Gate training behind the standby (make before break). In effect only where the stack has both providers
    and inference services; off, a gang takes inference GPUs at once."""
    timeout_seconds: Annotated[int, Field(ge=1, le=3600)] = int(HandoverTunables().timeout_seconds)
    """Longest a gang waits at the gate, and a close waits for the standby, before going ahead without it
    (whole seconds, at most an hour): training outranks inference."""


class Burst(ConfigModel, BurstTunables):
    """Thresholds of the burst controller (its own settings model, embedded as it is) and its deployment. The
    close threshold sits above the open one (hysteresis)."""

    replicas: Annotated[int, Field(ge=1, le=5)] = 2
    """Burst controller replicas: one leads through a Lease, the others stand by for a drain or a crash."""
    metrics_port: Annotated[int, Field(ge=1024, le=65535)] = 9102
    """Port of the controller's /metrics endpoint, which Prometheus scrapes."""
    handover: Handover = Handover()
    """Make before break: the inference a gang (or the return home) takes away is replaced first."""
    resources: ContainerRequests | None = None
    """Requests of the burst controller's container (`cpu`, `memory`; the memory is its limit too).
    Unset: 100m and 256Mi, or more where the stack's nodes need it: the agent keeps every node it watches
    in memory, so the memory is sized from the nodes (docs/scale.md); a memory set below what the agent holds at this
    size is refused."""


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
