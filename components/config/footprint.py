"""What the platform's own agents hold in memory at a cluster's size, and the requests that follow from it.

Why: each agent keeps what it reads every pass in memory (one list, then a watch: ``agents/kit/informer.py``), so
its resident set grows with the nodes it watches (the burst controller's with the pods too), and each container's
memory request is its limit too. On the ``llama3`` scale shape (2,060 nodes) the node-pool agent held 156 MiB under
a 128 MiB limit and the health guard 117 MiB under 128 MiB: a stack sized for a handful of nodes would have its
agents OOM-killed, in a crash loop, at the size the product is for. So a request left unset is sized from the
stack's nodes (and pods), and one set below what the agent holds there is refused.

The footprints are lines through the largest resident set each agent reached on the scale shapes (``bench_scale``
in ``bench/report.json``: ``process_usage_at_rest`` and ``process_usage_after``, gangs and fault storms included;
``make bench-scale``), on the ``small`` (66 nodes), ``prod`` (268) and ``llama3`` (2,060) shapes;
``tests/test_agent_footprint.py`` holds every measured point under its line, so a scale run that finds more
fails until the line moves. The pods the burst controller keeps are estimated from the stack
(:func:`cluster_pods`): with thousands of one-GPU inference replicas its line grows with them.
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
    """One agent's resident memory as a line in the nodes (and pods) it watches, and its requests when the stack
    sets none."""

    agent: str
    #: The key a stack sets the requests under (the capability's section).
    key: str
    base_mib: float
    per_node_kib: float
    #: The requests of a small cluster: a sized request never goes below them.
    floor: ContainerRequests
    #: Only for an agent that keeps the cluster's pods too.
    per_pod_kib: float = 0.0

    def need_mib(self, nodes: int, pods: int = 0) -> float:
        """What the agent holds at ``nodes`` nodes and ``pods`` pods: the line, without headroom."""
        return self.base_mib + (self.per_node_kib * max(0, nodes) + self.per_pod_kib * max(0, pods)) / 1024.0

    def sized(self, nodes: int, pods: int = 0) -> ContainerRequests:
        """The floor, or the footprint with headroom where the cluster is larger than the floor covers."""
        mib = math.ceil(self.need_mib(nodes, pods) * HEADROOM / ROUND_MIB) * ROUND_MIB
        if mib * MIB <= quantity_value(self.floor.memory):
            return self.floor
        return ContainerRequests(cpu=self.floor.cpu, memory=f"{mib}Mi")


#: bench_scale, 2026-12-06/07: burst controller at rest 23.9 MiB at 66 nodes, 56.8 at 268 and up to 100.6 at 2,060
#: (the nodes' line); after the runs 54.6 MiB at 66 nodes (threads and buffers the runs grow, whatever the size) and,
#: over four runs of gangs up to 2,048 pods at 2,060 nodes, 141.7 to 230.6 MiB (the pods' part, through the largest).
BURST_CONTROLLER = Footprint("burst controller", "burst.resources", base_mib=52.4, per_node_kib=34.5,
                             floor=ContainerRequests(cpu="100m", memory="256Mi"), per_pod_kib=54.5)
#: bench_scale, 2026-12-06/07: health guard after the fault storms 53.1 MiB at 66 nodes, 61.4 MiB at 268, and 116.1
#: to 126.6 MiB at 2,060 over four runs (the line through 268 and the largest at 2,060).
HEALTH_GUARD = Footprint("health guard", "observability.health.resources", base_mib=51.7, per_node_kib=37.3,
                         floor=ContainerRequests(cpu="50m", memory="128Mi"))
#: bench_scale, 2026-12-06/07: node-pool agent 65.1 MiB at 268 nodes, 153.0 to 163.6 MiB at 2,060 over four runs.
NODE_POOL_AGENT = Footprint("node-pool agent", "nodePoolAgent.resources", base_mib=50.4, per_node_kib=56.3,
                            floor=ContainerRequests(cpu="50m", memory="128Mi"))
FOOTPRINTS = (BURST_CONTROLLER, HEALTH_GUARD, NODE_POOL_AGENT)


def _gpu_nodes(cfg: ClusterConfig) -> int:
    return sum(len(p.node_names) for p in cfg.pools)


def cluster_nodes(cfg: ClusterConfig) -> int:
    """The nodes every agent watches: the GPU pools' and the system pool's (virtual nodes are a handful)."""
    return _gpu_nodes(cfg) + len(cfg.system_pool.node_names)


def cluster_pods(cfg: ClusterConfig) -> int:
    """The pods the burst controller keeps at the stack's size: a training pod per GPU node (a gang's worker takes a
    node's GPUs) and each inference service at its max replicas twice over (its standby on external capacity)."""
    return _gpu_nodes(cfg) + 2 * sum(s.max_replicas for s in cfg.inference.services)


def explicit_requests(cfg: ClusterConfig, footprint: Footprint) -> ContainerRequests | None:
    if footprint is BURST_CONTROLLER:
        return cfg.burst.resources
    if footprint is HEALTH_GUARD:
        return cfg.observability.health.resources
    return cfg.node_pool_agent.resources


def agent_requests(cfg: ClusterConfig, footprint: Footprint) -> ContainerRequests:
    """The requests an agent of this stack is deployed with: the stack's, or sized from its nodes and pods."""
    explicit = explicit_requests(cfg, footprint)
    return explicit if explicit is not None else footprint.sized(cluster_nodes(cfg), cluster_pods(cfg))


def footprint_problems(cfg: ClusterConfig) -> list[Problem]:
    """A memory request below what the agent holds at this stack's size is an OOM kill at every start: refused."""
    nodes, pods = cluster_nodes(cfg), cluster_pods(cfg)
    problems = []
    for fp in FOOTPRINTS:
        explicit = explicit_requests(cfg, fp)
        if explicit is None:
            continue
        need = fp.need_mib(nodes, pods)
        if quantity_value(explicit.memory) < need * MIB:
            problems.append(Problem(
                f"{fp.key}.memory",
                f"is below what the {fp.agent} holds at this stack's {nodes:,} nodes"
                f"{f' and {pods:,} pods' if fp.per_pod_kib else ''} (about {math.ceil(need)} MiB, "
                f"measured on the scale shapes: docs/scale.md); the limit would OOM-kill it at every start. Raise "
                f"it, or leave `{fp.key}` unset to size it ({fp.sized(nodes, pods).memory} here)", explicit.memory))
    return problems


__all__ = ["FOOTPRINTS", "Footprint", "agent_requests", "cluster_nodes", "cluster_pods", "footprint_problems"]
