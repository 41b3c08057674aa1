"""PriorityClasses: training outranks inference, platform agents outrank both."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Self

from pydantic import Field, model_validator

from components.config.base import ConfigModel, DnsLabel

#: Highest PriorityClass value a user class may take (the API server reserves larger ones).
MAX_PRIORITY_VALUE = 1_000_000_000


class PriorityTier(ConfigModel):
    name: DnsLabel
    """Name of the tier's PriorityClass, which the tier's pods name."""
    value: Annotated[int, Field(ge=-MAX_PRIORITY_VALUE, le=MAX_PRIORITY_VALUE)]
    """The PriorityClass's value: a higher one schedules first and, where the tier may preempt, evicts lower
    ones."""
    description: str = ""
    """The PriorityClass's description; `<tier> tier` when empty."""


class TierName(StrEnum):
    SYSTEM = "system"
    TRAINING = "training"
    INFERENCE = "inference"
    DEFAULT = "default"


class Priorities(ConfigModel):
    """PriorityClasses. Training outranks inference so a gang can take GPUs from inference pods."""

    system: PriorityTier = PriorityTier(
        name="platform-critical", value=100_000_000, description="GPU platform agents and schedulers"
    )
    """The platform's agents and schedulers; above training, so a gang never preempts them."""
    training: PriorityTier = PriorityTier(
        name="gpu-training", value=1_000_000, description="Gang-scheduled training; preempts inference"
    )
    """Training gangs; above inference, so a gang can take the GPUs inference holds."""
    inference: PriorityTier = PriorityTier(
        name="gpu-inference", value=10_000, description="Production inference; never preempts others"
    )
    """Inference replicas and the throughput check; never preempts (`preemptionPolicy: Never`)."""
    default: PriorityTier = PriorityTier(
        name="standard", value=0, description="Pods that name no class"
    )
    """The class for pods that name none (while it is the global default); never preempts."""
    global_default: TierName = TierName.DEFAULT
    """Tier whose class is the cluster's `globalDefault`, given to pods that name no class; `training` and
    `system` are refused, since every unlabelled pod could then preempt."""

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

    @property
    def lowest(self) -> PriorityTier:
        """The tier of the smallest value: for pods that must never preempt anything (placeholders, pre-pulls)."""
        return min(self.tiers().values(), key=lambda t: t.value)

