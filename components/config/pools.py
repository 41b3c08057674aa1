"""GPU pools and the system pool; their check: every node belongs to one pool only."""

from __future__ import annotations

from typing import TYPE_CHECKING

from components.config.base import (
    ConfigModel,
    DnsLabel,
    LabelValue,
    NodePatterns,
    NonNegativeInt,
    PositiveInt,
    Problem,
    expand_node_names,
    unique_names,
)

if TYPE_CHECKING:
    from components.config.cluster import ClusterConfig

#: Temperatures (°C) at which each GPU model starts hardware slowdown; a thermal guard threshold
#: at or above these never fires before the GPU throttles itself.
GPU_HARDWARE_LIMITS_CELSIUS: dict[str, int] = {
    "H100-SXM5-80GB": 87,
    "H100-PCIe-80GB": 85,
    "H200-SXM5-141GB": 87,
    "B200-SXM6-180GB": 87,
    "A100-SXM4-80GB": 85,
    "L40S-48GB": 88,
    "L4-24GB": 85,
}


class GpuPool(ConfigModel):
    """A set of on-prem GPU nodes that share a model and a taint."""

    name: DnsLabel
    nodes: NodePatterns
    #: Also a node label value (at most 63 letters, digits, '-', '_', '.').
    gpu_model: LabelValue = "H100-SXM5-80GB"
    gpus_per_node: PositiveInt = 8
    hardware_limit_celsius: PositiveInt | None = None
    taint: bool = True
    ib_hcas_per_node: NonNegativeInt = 8

    @property
    def node_names(self) -> list[str]:
        return expand_node_names(self.nodes)

    @property
    def gpu_count(self) -> int:
        return len(self.node_names) * self.gpus_per_node

    @property
    def hardware_limit(self) -> int:
        """The slowdown temperature: explicit override, else the model table, else a safe 85 °C."""
        if self.hardware_limit_celsius is not None:
            return self.hardware_limit_celsius
        return GPU_HARDWARE_LIMITS_CELSIUS.get(self.gpu_model, 85)


class SystemPool(ConfigModel):
    """CPU nodes for platform components (schedulers, controllers, exporters' backends)."""

    name: DnsLabel = "system"
    nodes: NodePatterns

    @property
    def node_names(self) -> list[str]:
        return expand_node_names(self.nodes)



def pools_problems(cfg: ClusterConfig) -> list[Problem]:
    """Pool names are distinct and no node is claimed twice (by one pool, two pools or a GPU and the system pool)."""
    problems = unique_names(enumerate(p.name for p in cfg.pools), "pools", "pool")
    owner: dict[str, str] = {}
    for index, pool in enumerate(cfg.pools):
        seen_here: set[str] = set()
        for node in pool.node_names:
            if node in seen_here:
                problems.append(Problem(f"pools[{index}].nodes", "node listed twice in the pool", node))
            elif node in owner:
                problems.append(
                    Problem(f"pools[{index}].nodes", f"node is already in pool '{owner[node]}'", node)
                )
            seen_here.add(node)
            owner.setdefault(node, pool.name)
    for node in expand_node_names(cfg.system_pool.nodes):
        if node in owner:
            problems.append(Problem("systemPool.nodes", f"node is already in GPU pool '{owner[node]}'", node))
    return problems
