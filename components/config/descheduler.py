"""The descheduler that returns burst pods on-prem a few at a time."""

from __future__ import annotations

from typing import Self

from pydantic import field_validator, model_validator

from components import images
from components.config.base import ConfigModel, ContainerRequests, NonNegativeInt, PinnedImage, PositiveInt, check_cron


class Descheduler(ConfigModel):
    """Gradual return: a few pods per cycle move back on-prem once the burst taint returns."""

    image: PinnedImage = images.DESCHEDULER
    """Pinned descheduler image."""
    schedule: str = "*/2 * * * *"
    """Cron schedule of the descheduler's CronJob; each run evicts a few inference pods the burst taint no
    longer admits."""
    max_pods_per_node: PositiveInt = 4
    """Most pods one run evicts from one node (`maxNoOfPodsToEvictPerNode`)."""
    max_pods_per_namespace: PositiveInt = 8
    """Most pods one run evicts from one namespace (`maxNoOfPodsToEvictPerNamespace`)."""
    max_pods_total: PositiveInt = 16
    """Most pods one run evicts in all (`maxNoOfPodsToEvictTotal`)."""
    min_pod_age_seconds: NonNegativeInt = 300
    """Only pods older than this are evicted (the evictor's `minPodAge`, seconds), so a replica that has just
    started is not moved again at once."""
    resources: ContainerRequests = ContainerRequests(cpu="500m", memory="256Mi")
    """Each run's pod: it lists every pod and node, so it grows with the fleet; a run takes seconds, yet its request
    must fit on the system node beside the agents at every schedule (a pod that does not fit preempts one there)."""
    prefer_onprem_affinity: bool = False
    """Also evict external pods whose preferred on-prem affinity could now be met (nodeFit checks room). With
    priced providers it also moves pods from a dearer provider to a cheaper one with room, each an external
    restart. Off by default: the room it fills is mostly room queued training takes next (bench report)."""

    @field_validator("schedule")
    @classmethod
    def _cron(cls, value: str) -> str:
        return check_cron(value)

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

