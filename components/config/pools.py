"""GPU pools and the system pool; their check: every node belongs to one pool only (and to one leaf switch of
its pool's topology, components.config.topology)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

from pydantic import Field

from agents.node_names import expand_node_names
from components.config.base import (
    ConfigModel,
    ContainerRequests,
    DnsLabel,
    LabelValue,
    NodePatterns,
    NonNegativeInt,
    PositiveInt,
    Problem,
    unique_names,
)
from components.config.topology import PoolTopology, topology_problems
from components.failure_rate import DEFAULT_REPAIR_HOURS, DEFAULT_SPARE_COVERAGE, sized_spares

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
    """Pool name: the `<labelPrefix>/pool` label (and taint value) of its nodes; jobs, services and the
    throughput check name it."""
    nodes: NodePatterns
    """Node names or ranges such as `gpu-[001-256]` (zero padding kept); a node belongs to one pool only."""
    gpu_model: LabelValue = "H100-SXM5-80GB"
    """GPU model, set as the `<labelPrefix>/gpu-model` label of the nodes (a label value: at most 63 letters,
    digits, `-`, `_` or `.`); a known model gives the hardware slowdown limit."""
    gpus_per_node: PositiveInt = 8
    """GPUs on each node: they size the pool (burst thresholds, queues, team quotas) and bound what one worker
    or replica may request."""
    hardware_limit_celsius: PositiveInt | None = None
    """Temperature (°C) at which these GPUs start hardware slowdown; unset: the known limit of `gpuModel`, else
    85. The thermal threshold must stay below it."""
    taint: bool = True
    """Taint the nodes `<labelPrefix>/pool=<name>:NoSchedule`, so only pods that tolerate the pool (the
    platform's GPU workloads) land there."""
    ib_hcas_per_node: NonNegativeInt = 8
    """InfiniBand HCAs per node, for the record: no component reads it (the InfiniBand exporter reports the
    HCAs a node has)."""
    topology: PoolTopology | None = None
    """The pool's InfiniBand fabric: which leaf switch each node hangs off and which spine each leaf is under.
    Volcano then keeps a training gang inside one leaf, or one spine when no leaf holds it (docs/scheduling.md),
    and each node carries `<labelPrefix>/leaf` and `<labelPrefix>/spine`. Unset: the pool is flat."""

    spare_nodes: NonNegativeInt | None = None
    """Warm spares: idle nodes kept out of training by the `<labelPrefix>/spare` taint (inference may use them), so a
    gang that loses a node to a quarantine finds another at once; each quarantined node uses one up, and the repaired
    node becomes a spare again (docs/training.md). Unset: the fewest spares with which a node failure finds one with
    probability `spareCoverage` (nodes go into repair at the Llama 3 rate and stay out `repairHours`), at most one
    node in 16 of the pool (none under 16 nodes)."""
    repair_hours: Annotated[float, Field(gt=0, le=8760)] = DEFAULT_REPAIR_HOURS
    """How long a quarantined node is out (diagnosis, repair, probation), for sizing `spareNodes` when unset."""
    spare_coverage: Annotated[float, Field(gt=0, lt=1)] = DEFAULT_SPARE_COVERAGE
    """The share of node failures that should find a spare, for sizing `spareNodes` when unset. Sizing at the mean
    number out instead would leave a 128-node pool without its one spare at most of its failures."""

    @property
    def node_names(self) -> list[str]:
        return expand_node_names(self.nodes)

    @property
    def spares(self) -> int:
        """The warm spares the pool keeps: `spareNodes`, or sized from its GPUs, `repairHours` and `spareCoverage`."""
        if self.spare_nodes is not None:
            return self.spare_nodes
        return sized_spares(self.gpu_count, len(self.node_names), self.repair_hours, self.spare_coverage)

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
    """The `<labelPrefix>/pool` label of the system nodes, which the platform's components select."""
    nodes: NodePatterns
    """Node names or ranges such as `cpu-sys-[01-12]`; none may be in a GPU pool."""

    @property
    def node_names(self) -> list[str]:
        return expand_node_names(self.nodes)



class NodePoolAgent(ConfigModel):
    """The agent that keeps every GPU pool's nodes labelled and tainted and chooses the warm spares."""

    resources: ContainerRequests | None = None
    """Requests of the node-pool agent's container (`cpu`, `memory`; the memory is its limit too).
    Unset: 50m and 128Mi, or more where the stack's nodes need it: the agent keeps every node it watches
    in memory, so the memory is sized from the nodes (docs/scale.md); a memory set below what the agent holds at this
    size is refused."""


def pools_problems(cfg: ClusterConfig) -> list[Problem]:
    """Pool names are distinct, no node is claimed twice (by one pool, two pools or a GPU and the system pool), and
    each pool's topology covers its nodes and nests."""
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
        if pool.spares >= len(pool.node_names):
            problems.append(Problem(f"pools[{index}].spareNodes", "must leave the pool at least one node for "
                                    f"training: it has {len(pool.node_names)}", pool.spares))
    for node in expand_node_names(cfg.system_pool.nodes):
        if node in owner:
            problems.append(Problem("systemPool.nodes", f"node is already in GPU pool '{owner[node]}'", node))
    return problems + topology_problems(cfg)
