"""Burst and return: the burst controller's thresholds, the handover, and their checks against providers."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Literal, Self

from pydantic import Field, model_validator

from components.config.base import ConfigModel, DnsLabel, NonNegativeInt, PositiveInt, Problem
from components.config.inference import TrafficShape

if TYPE_CHECKING:
    from components.config.cluster import ClusterConfig


class Handover(ConfigModel):
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


class Burst(ConfigModel):
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

