"""What the platform's own agents hold in memory at a cluster's size, and the requests that follow from it.

Why: each agent keeps what it reads every pass in memory (one list, then a watch: ``agents/kit/informer.py``), so
its resident set grows with the nodes it watches, and each container's memory request is its limit too. On the
``llama3`` scale shape (2,060 nodes) the node-pool agent held 156 MiB under a 128 MiB limit and the health guard
117 MiB under 128 MiB: a stack sized for a handful of nodes would have its agents OOM-killed, in a crash loop, at
the size the product is for. So a request left unset is sized from the stack's nodes, and one set below what the
agent holds there is refused.

The footprints are lines through the largest resident set each agent reached on the scale shapes (``bench_scale``
in ``bench/report.json``: ``process_usage_at_rest`` and ``process_usage_after``, gangs and fault storms included;
``make bench-scale``), through the ``small`` shape (66 nodes) and the ``llama3`` shape (2,060 nodes);
``tests/test_agent_footprint.py`` holds every measured point under its line, so a scale run that finds more
fails until the line moves. The node-pool agent ran on ``llama3`` only: its base is the burst controller's at
rest on ``small`` (the same kit and interpreter).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from components.config.base import ContainerRequests, Problem, quantity_value

if TYPE_CHECKING:
    from components.config.cluster import ClusterConfig

MIB = 2**20
#: A sized request is the footprint times this, rounded up to :data:`ROUND_MIB`: room for a burst of events, a
#: larger object than the shapes had, the interpreter's arenas.
HEADROOM = 1.5
ROUND_MIB = 64


@dataclass(frozen=True)
class Footprint:
    """One agent's resident memory as a line in the nodes it watches, and its requests when the stack sets none."""

    agent: str
    #: The key a stack sets the requests under (the capability's section).
    key: str
    base_mib: float
    per_node_kib: float
    #: The requests of a small cluster: a sized request never goes below them.
    floor: ContainerRequests

    def need_mib(self, nodes: int) -> float:
        """What the agent holds at ``nodes`` nodes: the line, without headroom."""
        return self.base_mib + self.per_node_kib * max(0, nodes) / 1024.0

    def sized(self, nodes: int) -> ContainerRequests:
        """The floor, or the footprint with headroom where the cluster is larger than the floor covers."""
        mib = math.ceil(self.need_mib(nodes) * HEADROOM / ROUND_MIB) * ROUND_MIB
        if mib * MIB <= quantity_value(self.floor.memory):
            return self.floor
        return ContainerRequests(cpu=self.floor.cpu, memory=f"{mib}Mi")

    def requests(self, explicit: ContainerRequests | None, nodes: int) -> ContainerRequests:
        return explicit if explicit is not None else self.sized(nodes)


#: bench_scale, 2026-12-06: burst controller 54.6 MiB at 66 nodes, 173.6 MiB at 2,060 (after a 2,048-pod gang).
BURST_CONTROLLER = Footprint("burst controller", "burst.resources", base_mib=50.7, per_node_kib=61.2,
                             floor=ContainerRequests(cpu="100m", memory="256Mi"))
#: bench_scale, 2026-12-06: health guard 53.1 MiB at 66 nodes, 117.0 MiB at 2,060 (after the fault storms).
HEALTH_GUARD = Footprint("health guard", "observability.health.resources", base_mib=51.0, per_node_kib=32.8,
                         floor=ContainerRequests(cpu="50m", memory="128Mi"))
#: bench_scale, 2026-12-06: node-pool agent 155.6 MiB at 2,060 nodes; base: the burst controller at rest, 23.9 MiB.
NODE_POOL_AGENT = Footprint("node-pool agent", "nodePoolAgent.resources", base_mib=23.9, per_node_kib=65.5,
                            floor=ContainerRequests(cpu="50m", memory="128Mi"))
FOOTPRINTS = (BURST_CONTROLLER, HEALTH_GUARD, NODE_POOL_AGENT)


def cluster_nodes(cfg: ClusterConfig) -> int:
    """The nodes every agent watches: the GPU pools' and the system pool's (virtual nodes are a handful)."""
    return sum(len(p.node_names) for p in cfg.pools) + len(cfg.system_pool.node_names)


def explicit_requests(cfg: ClusterConfig, footprint: Footprint) -> ContainerRequests | None:
    if footprint is BURST_CONTROLLER:
        return cfg.burst.resources
    if footprint is HEALTH_GUARD:
        return cfg.observability.health.resources
    return cfg.node_pool_agent.resources


def agent_requests(cfg: ClusterConfig, footprint: Footprint) -> ContainerRequests:
    """The requests an agent of this stack is deployed with: the stack's, or sized from its nodes."""
    return footprint.requests(explicit_requests(cfg, footprint), cluster_nodes(cfg))


def footprint_problems(cfg: ClusterConfig) -> list[Problem]:
    """A memory request below what the agent holds at this stack's size is an OOM kill at every start: refused."""
    nodes = cluster_nodes(cfg)
    problems = []
    for fp in FOOTPRINTS:
        explicit = explicit_requests(cfg, fp)
        if explicit is None:
            continue
        need = fp.need_mib(nodes)
        if quantity_value(explicit.memory) < need * MIB:
            problems.append(Problem(
                f"{fp.key}.memory",
                f"is below what the {fp.agent} holds at this stack's {nodes:,} nodes (about {math.ceil(need)} MiB, "
                f"measured on the scale shapes: docs/scale.md); the limit would OOM-kill it at every start. Raise "
                f"it, or leave `{fp.key}` unset to size it ({fp.sized(nodes).memory} here)", explicit.memory))
    return problems


__all__ = ["FOOTPRINTS", "Footprint", "agent_requests", "cluster_nodes", "footprint_problems"]
