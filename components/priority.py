"""Priority tiers: training preempts inference; inference never preempts; platform agents stay up."""

from __future__ import annotations

from dataclasses import dataclass

import pulumi
import pulumi_kubernetes as k8s

from components.config import ClusterConfig, Priorities, TierName
from components.naming import common_labels


@dataclass(frozen=True)
class PriorityTiersArgs:
    priorities: Priorities

    @classmethod
    def from_config(cls, cfg: ClusterConfig) -> PriorityTiersArgs:
        return cls(priorities=cfg.priorities)


#: Inference may be preempted, but must never evict anything itself (it waits or bursts instead).
PREEMPTION_POLICY: dict[TierName, str] = {
    TierName.SYSTEM: "PreemptLowerPriority",
    TierName.TRAINING: "PreemptLowerPriority",
    TierName.INFERENCE: "Never",
    TierName.DEFAULT: "Never",
}


class PriorityTiers(pulumi.ComponentResource):
    """One PriorityClass per tier; names are exported for the other components."""

    names: dict[TierName, str]

    def __init__(self, name: str, args: PriorityTiersArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("gpu-cluster:scheduling:PriorityTiers", name, None, opts)
        self.classes: dict[TierName, k8s.scheduling.v1.PriorityClass] = {}
        self.names = {}
        for tier, spec in args.priorities.tiers().items():
            self.names[tier] = spec.name
            self.classes[tier] = k8s.scheduling.v1.PriorityClass(
                f"priority-{tier.value}",
                metadata=k8s.meta.v1.ObjectMetaArgs(name=spec.name, labels=common_labels(spec.name, "priority")),
                value=spec.value,
                global_default=tier is args.priorities.global_default,
                preemption_policy=PREEMPTION_POLICY[tier],
                description=spec.description or f"{tier.value} tier",
                opts=pulumi.ResourceOptions(parent=self),
            )
        self.register_outputs({"names": {t.value: n for t, n in self.names.items()}})
