"""Burst and return: the burst controller's thresholds, the handover, and their checks against providers."""

from __future__ import annotations

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
    timeout_seconds: Annotated[int, Field(ge=1, le=3600)] = int(_AGENT.handover_timeout_seconds)
    #: ``current``: the standby replaces every replica at risk, up to the service's current count (capacity
    #: survives the handover); ``minimum``: only up to minReplicas (the floor survives, fewer external GPUs).
    cover: Literal["current", "minimum"] = _AGENT.handover_cover.value
    #: ``pool``: a waiting gang puts at risk every ready replica of its pool; ``displaced``: only the replicas on
    #: the GPUs it lacks (node by node, at most that many per service): fewer external GPU·h, a little less
    #: availability (README, simulator).
    sizing: Literal["pool", "displaced"] = _AGENT.handover_sizing.value
    #: External replicas per service the standby covers while they return home (those the descheduler moves
    #: at once, e.g. its ``maxPodsPerNamespace``); 0: every external replica.
    return_batch: NonNegativeInt = _AGENT.handover_return_batch


class Burst(ConfigModel):
    """Thresholds of the burst controller. The close threshold sits above the open one (hysteresis)."""

    taint_value: DnsLabel = _AGENT.taint_value
    open_below_free_gpus: NonNegativeInt = _AGENT.open_below_free_gpus
    close_at_free_gpus: PositiveInt = _AGENT.close_at_free_gpus
    open_hold_seconds: NonNegativeInt = int(_AGENT.open_hold_seconds)
    close_hold_seconds: NonNegativeInt = int(_AGENT.close_hold_seconds)
    pending_grace_seconds: NonNegativeInt = int(_AGENT.pending_grace_seconds)
    external_deletion_cost: Annotated[int, Field(ge=-(2**31), le=2**31 - 1)] = _AGENT.external_deletion_cost
    resync_seconds: PositiveInt = int(_AGENT.resync_seconds)
    stale_after_seconds: PositiveInt = int(_AGENT.stale_after_seconds)
    #: How often the controller decides (hold timers and the handover timeout are as precise as this).
    tick_seconds: PositiveInt = int(_AGENT.tick_seconds)
    replicas: Annotated[int, Field(ge=1, le=5)] = 2
    metrics_port: Annotated[int, Field(ge=1024, le=65535)] = 9102
    handover: Handover = Handover()

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
              "tick_seconds")


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
    if cfg.burst.close_at_free_gpus > cfg.onprem_gpus:
        problems.append(
            Problem("burst.closeAtFreeGpus",
                    f"can never be reached: the stack has only {cfg.onprem_gpus} on-prem GPUs",
                    cfg.burst.close_at_free_gpus)
        )
    return problems

