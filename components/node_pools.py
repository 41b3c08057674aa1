"""GPU node pools: which on-prem nodes belong to which pool, and the labels and taint each pool's nodes carry.

Nodes come from the datacenter's provisioning, not from Pulumi. The GPU pools are one settings ConfigMap read
by the node-pool agent (:mod:`agents.node_pools`), which labels and taints every node of a pool the moment it
joins, not one ``NodePatch`` per node: at 2,048 nodes those made ``pulumi up`` rewrite its state 2,048 times
and a no-change preview diff 2,048 objects (docs/scale.md). The agent writes the node's taint list with the
``resourceVersion`` it read and copies every taint that is not its pool's, as the health guard does, so
neither can drop the other's taint: a quarantined node stays quarantined.

A pool that keeps warm spares (``spareNodes``) gets an image pre-pull DaemonSet on them: the images of the jobs
declared on the pool and ``training.prepullImages``, each pulled by an init container that exits at once, then an
idle container; it selects the spare label the agent sets with the taint, so a node pulls the images as it becomes
a spare and the replacement that lands there starts without a pull.

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
from components.config.base import ContainerRequests
from components.config.footprint import NODE_POOL_AGENT, agent_requests
from components.naming import ONPREM, Keys, common_labels, selector_labels
from components.security import (
    API_CLIENT,
    checkov_skips,
    container_security_context,
    pod_security_context,
    resources,
)
from components.system_agent import SETTINGS_KEY, Placement, SystemAgent
from components.workloads import metrics_liveness_probe, metrics_readiness_probe

CONFIG_DIR = f"/etc/{APP}"
REPLICAS = 2

Rule = rbac.Rule

#: Exactly what the agent calls: a watch of nodes and a patch of their labels, annotations and taints.
CLUSTER_RULES: tuple[Rule, ...] = (Rule(api_groups=[""], resources=["nodes"], verbs=["get", "list", "watch", "patch"]),)
POD_RULES: tuple[Rule, ...] = (Rule(api_groups=[""], resources=["pods"], verbs=["list", "watch"]),)
#: The pre-pull pods serve nothing and hold nothing: checks that ask for probes and an image digest of a
#: researcher's image do not apply.
PREPULL_CHECKOV_SKIPS = {
    "CKV_K8S_8": "an idle container that serves nothing has no liveness to probe",
    "CKV_K8S_9": "an idle container that serves nothing has no readiness to probe",
}


def prepull_images(cfg: ClusterConfig) -> dict[str, list[str]]:
    """Pool → the images its warm spares pull ahead (the jobs declared on it, enabled or not, and
    ``training.prepullImages``); only pools that keep spares, only those with an image to pull."""
    out: dict[str, list[str]] = {}
    for pool in cfg.pools:
        wanted = {job.image for job in cfg.training.jobs if job.pool == pool.name} | set(cfg.training.prepull_images)
        if pool.spares and wanted:
            out[pool.name] = sorted(wanted)
    return out


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
    #: Pool → the images its spares pull ahead (:func:`prepull_images`).
    prepull: dict[str, list[str]]
    #: The class of the pre-pull pods: the lowest, so pulling ahead never preempts what runs on a spare.
    prepull_priority_class: str
    #: The agent container's requests: the stack's, or sized from its nodes (``components.config.footprint``).
    resources: ContainerRequests = NODE_POOL_AGENT.floor

    @classmethod
    def from_config(cls, cfg: ClusterConfig, priority_class: str) -> NodePoolsArgs:
        return cls(pools=cfg.pools, system_pool=cfg.system_pool, label_prefix=cfg.label_prefix,
                   settings=settings_from_config(cfg),
                   placement=Placement(cfg.system_namespace, priority_class, cfg.system_pool_selector),
                   image=images.agent_image(APP, cfg.agent_registry), port=METRICS_PORT,
                   prepull=prepull_images(cfg),
                   prepull_priority_class=cfg.priorities.lowest.name,
                   resources=agent_requests(cfg, NODE_POOL_AGENT))


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
                resources=resources(args.resources.cpu, args.resources.memory),
                security_context=container_security_context(),
                volume_mounts=[mount],
            )],
            # Two replicas, one active through the Lease: the standby takes over a lost leader.
            replicas=REPLICAS,
            annotations=checkov_skips({"CKV_K8S_38": API_CLIENT}),
            volumes=[volume],
        )
        self.pod_disruption_budget = agent.disruption_budget()
        self.prepull = {pool.name: self._prepull(args, keys, pool, wanted) for pool in args.pools
                        if (wanted := args.prepull.get(pool.name))}
        self.node_count = pulumi.Output.from_input(sum(len(p.node_names) for p in args.pools))
        self.gpu_count = pulumi.Output.from_input(sum(p.gpu_count for p in args.pools))
        self.register_outputs({"node_count": self.node_count, "gpu_count": self.gpu_count})

    def _prepull(self, args: NodePoolsArgs, keys: Keys, pool: GpuPool, wanted: list[str]) -> k8s.apps.v1.DaemonSet:
        """On each warm spare of ``pool`` (the agent's label): every image pulled by an init container that exits at
        once (a shell, as a trainer's image has), then an idle container from the agent's own image. No token, no
        network, restricted; at the lowest class, so it never preempts the inference a spare may run."""
        app = f"image-prepull-{pool.name}"
        ns = args.placement.namespace
        labels = common_labels(app, "image-prepull", images.AGENT_VERSION)
        meta = k8s.meta.v1.ObjectMetaArgs
        account = rbac.service_account(app, ns, labels, self, automount_token=False).service_account
        small = resources("10m", "32Mi")
        pulls = [k8s.core.v1.ContainerArgs(name=f"pull-{index}", image=image, command=["/bin/sh", "-c", "exit 0"],
                                           resources=small, security_context=container_security_context())
                 for index, image in enumerate(wanted)]
        idle = k8s.core.v1.ContainerArgs(name="idle", image=args.image,
                                         command=["python3", "-c", "import signal; signal.pause()"],
                                         resources=small, security_context=container_security_context())
        spare = keys.spare_taint
        return k8s.apps.v1.DaemonSet(
            app,
            metadata=meta(name=app, namespace=ns, labels=labels, annotations=checkov_skips(PREPULL_CHECKOV_SKIPS)),
            spec=k8s.apps.v1.DaemonSetSpecArgs(
                selector=k8s.meta.v1.LabelSelectorArgs(match_labels=selector_labels(labels)),
                template=k8s.core.v1.PodTemplateSpecArgs(
                    metadata=meta(labels=labels),
                    spec=k8s.core.v1.PodSpecArgs(
                        service_account_name=app,
                        automount_service_account_token=False,
                        priority_class_name=args.prepull_priority_class,
                        node_selector={keys.pool: pool.name, spare: "true"},
                        tolerations=[*([pool_toleration(keys, pool)] if pool.taint else []),
                                     k8s.core.v1.TolerationArgs(key=spare, operator="Exists", effect="NoSchedule")],
                        security_context=pod_security_context(),
                        init_containers=pulls,
                        containers=[idle],
                    ),
                ),
            ),
            opts=pulumi.ResourceOptions(parent=self, depends_on=[account]),
        )
