"""GPU node pools: label and taint on-prem nodes that Pulumi does not own, via server-side apply.

Nodes come from the datacenter's provisioning, not from Pulumi, so the component patches only the
fields it manages (``NodePatch``): the pool, location and GPU-model labels and the pool taint. Patches
are not forced: if another field manager (the thermal guard) has changed the node's taints, the update
stops with a conflict instead of silently putting a hot node back into service.
"""

from __future__ import annotations

from dataclasses import dataclass

import pulumi
import pulumi_kubernetes as k8s

from components.config import ClusterConfig, GpuPool, SystemPool, expand_node_names
from components.naming import ONPREM, Keys, common_labels


@dataclass(frozen=True)
class NodePoolsArgs:
    pools: list[GpuPool]
    system_pool: SystemPool
    label_prefix: str

    @classmethod
    def from_config(cls, cfg: ClusterConfig) -> NodePoolsArgs:
        return cls(pools=cfg.pools, system_pool=cfg.system_pool, label_prefix=cfg.label_prefix)


def pool_taint(keys: Keys, pool: GpuPool) -> dict[str, str]:
    """The taint that keeps non-GPU pods off a pool; GPU workloads tolerate it."""
    return {"key": keys.pool, "value": pool.name, "effect": "NoSchedule"}


def pool_toleration(keys: Keys, pool: GpuPool) -> k8s.core.v1.TolerationArgs:
    return k8s.core.v1.TolerationArgs(key=keys.pool, operator="Equal", value=pool.name, effect="NoSchedule")


class GpuNodePools(pulumi.ComponentResource):
    """Labels and taints for every on-prem GPU node and the system pool."""

    node_count: pulumi.Output[int]
    gpu_count: pulumi.Output[int]

    def __init__(self, name: str, args: NodePoolsArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("gpu-cluster:nodes:GpuNodePools", name, None, opts)
        keys = Keys(args.label_prefix)
        child = pulumi.ResourceOptions(parent=self)
        self.patches: dict[str, k8s.core.v1.NodePatch] = {}
        for pool in args.pools:
            labels = {
                keys.pool: pool.name,
                keys.location: ONPREM,
                keys.gpu_model: pool.gpu_model,
                **common_labels(pool.name, "gpu-node-pool"),
            }
            taints = [pool_taint(keys, pool)] if pool.taint else []
            for node in pool.node_names:
                self.patches[node] = k8s.core.v1.NodePatch(
                    f"node-{node}",
                    metadata=k8s.meta.v1.ObjectMetaPatchArgs(name=node, labels=labels),
                    spec=k8s.core.v1.NodeSpecPatchArgs(
                        taints=[k8s.core.v1.TaintPatchArgs(**t) for t in taints]
                    )
                    if taints
                    else None,
                    opts=child,
                )
        system_labels = {keys.pool: args.system_pool.name, **common_labels(args.system_pool.name, "system-pool")}
        for node in expand_node_names(args.system_pool.nodes):
            self.patches[node] = k8s.core.v1.NodePatch(
                f"node-{node}",
                metadata=k8s.meta.v1.ObjectMetaPatchArgs(name=node, labels=system_labels),
                opts=child,
            )
        self.node_count = pulumi.Output.from_input(sum(len(p.node_names) for p in args.pools))
        self.gpu_count = pulumi.Output.from_input(sum(p.gpu_count for p in args.pools))
        self.register_outputs({"node_count": self.node_count, "gpu_count": self.gpu_count})
