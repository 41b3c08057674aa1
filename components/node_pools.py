"""GPU node pools: which on-prem nodes belong to which pool, and the labels and taint each pool's nodes carry.

Nodes come from the datacenter's provisioning, not from Pulumi. The GPU pools are one settings ConfigMap read
by the node-pool agent (:mod:`agents.node_pools`), which labels and taints every node of a pool the moment it
joins, not one ``NodePatch`` per node: at 2,048 nodes those made ``pulumi up`` rewrite its state 2,048 times
and a no-change preview diff 2,048 objects (docs/scale.md). The agent writes the node's taint list with the
``resourceVersion`` it read and copies every taint that is not its pool's, as the health guard does, so
neither can drop the other's taint: a quarantined node stays quarantined.

The system pool keeps its ``NodePatch`` per node: a dozen nodes, and the agents themselves (the node-pool
agent first) are scheduled onto them by that label, so it must be there before any agent runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi_kubernetes as k8s

from agents.node_pools.contract import APP, METRICS_PORT, NodePoolSettings, parse_settings, settings_document
from agents.node_taints import leaf_label_key, spine_label_key
from components import images, rbac
from components.config import ClusterConfig, GpuPool, PoolTopology, SystemPool, expand_node_names
from components.naming import ONPREM, Keys, common_labels
from components.security import API_CLIENT, checkov_skips, container_security_context, resources
from components.system_agent import SETTINGS_KEY, Placement, SystemAgent
from components.workloads import metrics_liveness_probe, metrics_readiness_probe

CONFIG_DIR = f"/etc/{APP}"
REPLICAS = 2

Rule = rbac.Rule

#: Exactly what the agent calls: a watch of nodes and a patch of their labels, annotations and taints.
CLUSTER_RULES: tuple[Rule, ...] = (Rule(api_groups=[""], resources=["nodes"], verbs=["get", "list", "watch", "patch"]),)
POD_RULES: tuple[Rule, ...] = (Rule(api_groups=[""], resources=["pods"], verbs=["list", "watch"]),)


def pool_taint(keys: Keys, pool: GpuPool) -> dict[str, str]:
    """The taint that keeps non-GPU pods off a pool; GPU workloads tolerate it."""
    return {"key": keys.pool, "value": pool.name, "effect": "NoSchedule"}


def pool_toleration(keys: Keys, pool: GpuPool) -> k8s.core.v1.TolerationArgs:
    return k8s.core.v1.TolerationArgs(key=keys.pool, operator="Equal", value=pool.name, effect="NoSchedule")


def pool_labels(keys: Keys, pool: GpuPool) -> dict[str, str]:
    """What every node of a GPU pool carries: pool, location, GPU model and the common labels."""
    return {
        keys.pool: pool.name,
        keys.location: ONPREM,
        keys.gpu_model: pool.gpu_model,
        **common_labels(pool.name, "gpu-node-pool"),
    }


def fabric_settings(prefix: str, topology: PoolTopology) -> dict[str, Any]:
    """A pool's topology as the agent writes it: ``<prefix>/leaf`` and ``<prefix>/spine`` on each node (the keys
    every agent derives from ``agents.node_taints``)."""
    spine_of = topology.spine_of()
    leaves: list[dict[str, Any]] = []
    for leaf in topology.leaves:
        entry: dict[str, Any] = {"name": leaf.name, "spine": spine_of[leaf.name]}
        if topology.by_label:
            entry["label_value"] = leaf.selector_value
        else:
            entry["nodes"] = list(leaf.nodes or [])
        leaves.append(entry)
    fabric: dict[str, Any] = {"leaf_key": leaf_label_key(prefix), "spine_key": spine_label_key(prefix),
                              "leaves": leaves}
    if topology.leaf_label is not None:
        fabric["site_label"] = topology.leaf_label
    return fabric


def settings_from_config(cfg: ClusterConfig, **overrides: Any) -> NodePoolSettings:
    """The agent's settings from the stack: the one function the component, the local cluster and the tests use."""
    keys = Keys(cfg.label_prefix)
    pools: list[dict[str, Any]] = []
    for p in cfg.pools:
        pool: dict[str, Any] = {"name": p.name, "nodes": list(p.nodes), "labels": pool_labels(keys, p),
                                "taints": [pool_taint(keys, p)] if p.taint else []}
        if p.topology is not None:
            pool["fabric"] = fabric_settings(cfg.label_prefix, p.topology)
        if p.spares:
            pool["spares"] = p.spares
        pools.append(pool)
    values: dict[str, Any] = {
        "label_prefix": cfg.label_prefix,
        "namespace": cfg.system_namespace,
        "training_namespace": cfg.training_namespace,
        "pools": pools,
        **overrides,
    }
    return parse_settings(values, source="pools")


@dataclass(frozen=True)
class NodePoolsArgs:
    pools: list[GpuPool]
    system_pool: SystemPool
    label_prefix: str
    settings: NodePoolSettings
    placement: Placement
    image: str
    port: int

    @classmethod
    def from_config(cls, cfg: ClusterConfig, priority_class: str) -> NodePoolsArgs:
        return cls(pools=cfg.pools, system_pool=cfg.system_pool, label_prefix=cfg.label_prefix,
                   settings=settings_from_config(cfg),
                   placement=Placement(cfg.system_namespace, priority_class, cfg.system_pool_selector),
                   image=images.agent_image(APP, cfg.agent_registry), port=METRICS_PORT)


class GpuNodePools(pulumi.ComponentResource):
    """The system pool's labels, and the agent that keeps every GPU pool's nodes labelled and tainted."""

    node_count: pulumi.Output[int]
    gpu_count: pulumi.Output[int]

    def __init__(self, name: str, args: NodePoolsArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("gpu-cluster:nodes:GpuNodePools", name, None, opts)
        keys = Keys(args.label_prefix)
        child = pulumi.ResourceOptions(parent=self)
        system_labels = {keys.pool: args.system_pool.name, **common_labels(args.system_pool.name, "system-pool")}
        self.patches: dict[str, k8s.core.v1.NodePatch] = {
            node: k8s.core.v1.NodePatch(f"node-{node}", metadata=k8s.meta.v1.ObjectMetaPatchArgs(
                name=node, labels=system_labels), opts=child)
            for node in expand_node_names(args.system_pool.nodes)
        }
        agent = SystemAgent(self, APP, common_labels(APP, "node-pools", images.AGENT_VERSION), args.placement)
        self.agent = agent
        self.config_map = agent.settings("settings", {SETTINGS_KEY: settings_document(args.settings)})
        agent.grant_cluster(CLUSTER_RULES)
        if any(pool.spares for pool in args.settings.pools):
            # Only an idle node becomes a warm spare: it reads which nodes the training pods are bound to.
            agent.grant_namespace("pods", POD_RULES, name=f"{APP}-pods", namespace=args.settings.training_namespace)
        agent.grant_namespace("lease", rbac.lease_rules(args.settings.lease_name), name=f"{APP}-lease")
        pod_name = k8s.core.v1.EnvVarArgs(name="POD_NAME", value_from=k8s.core.v1.EnvVarSourceArgs(
            field_ref=k8s.core.v1.ObjectFieldSelectorArgs(field_path="metadata.name")))
        volume, mount = agent.settings_volume("settings", CONFIG_DIR)
        self.deployment = agent.deploy(
            [k8s.core.v1.ContainerArgs(
                name=APP,
                image=args.image,
                args=[f"--config={CONFIG_DIR}/{SETTINGS_KEY}", f"--metrics-port={args.port}"],
                env=[pod_name],
                ports=[k8s.core.v1.ContainerPortArgs(name="metrics", container_port=args.port)],
                readiness_probe=metrics_readiness_probe(),
                liveness_probe=metrics_liveness_probe(),
                resources=resources("50m", "128Mi"),
                security_context=container_security_context(),
                volume_mounts=[mount],
            )],
            # Two replicas, one active through the Lease: the standby takes over a lost leader.
            replicas=REPLICAS,
            annotations=checkov_skips({"CKV_K8S_38": API_CLIENT}),
            volumes=[volume],
        )
        self.pod_disruption_budget = agent.disruption_budget()
        self.node_count = pulumi.Output.from_input(sum(len(p.node_names) for p in args.pools))
        self.gpu_count = pulumi.Output.from_input(sum(p.gpu_count for p in args.pools))
        self.register_outputs({"node_count": self.node_count, "gpu_count": self.gpu_count})
