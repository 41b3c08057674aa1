"""Burst controller: the one owner of the burst taint on virtual nodes, deployed highly available.

Two replicas, one active: leader election through a Lease in the system namespace, so a node drain
or a crash hands over within the lease duration and never leaves two writers. Its settings come from
the stack's ``burst`` section, rendered with the agent's own :class:`BurstSettings` so a key the agent
does not know fails here, at preview, not at start-up in the cluster. RBAC is exactly what the shell
calls, and it writes only where it acts:

* cluster-wide: nodes get/list/watch/patch (the burst taint on virtual nodes; with the handover's clearing on,
  the reservation on the on-prem nodes it clears), pods list/watch (free capacity is counted over every pod); no
  pod write;
* in the inference namespace: pods patch (the deletion-cost annotation on replicas that run externally)
  and, with the handover on, the scale of the named standby Deployments only;
* in the training namespace, with the handover on: pods patch (lifting the handover scheduling gate);
* in its own namespace: its Lease and the events about it;
* in ``default``: create events (about the nodes it taints: the API server keeps Events about a cluster-scoped
  object there and refuses them elsewhere).

A pod elsewhere is never written: the API server refuses it (403), and the shell backs off that action.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import pulumi
import pulumi_kubernetes as k8s

from agents.burst_controller.contract import BurstSettings, return_deployment, standby_deployment, warm_deployment
from components import images, rbac
from components.config import Burst, ClusterConfig
from components.config.base import ContainerRequests
from components.config.footprint import BURST_CONTROLLER, agent_requests
from components.naming import Keys, common_labels
from components.provider_rank import deletion_costs
from components.providers import provider_taint
from components.security import API_CLIENT, checkov_skips, container_security_context, resources
from components.system_agent import Placement, Scrape, SystemAgent
from components.workloads import metrics_liveness_probe, metrics_readiness_probe

APP = "burst-controller"
LEASE_NAME = "burst-controller"
SETTINGS_FILE = "settings.yaml"
CONFIG_DIR = "/etc/burst-controller"
Rule = rbac.Rule

#: Cluster-wide: read and taint nodes; list and watch pods (read only). Pod writes are namespaced (POD_RULES).
CLUSTER_RULES: tuple[Rule, ...] = (
    Rule(api_groups=[""], resources=["nodes"], verbs=["get", "list", "watch", "patch"]),
    Rule(api_groups=[""], resources=["pods"], verbs=["list", "watch"]),
)
#: In a namespace where it acts: patch pods (deletion cost in inference; the handover gate in training).
POD_RULES: tuple[Rule, ...] = (Rule(api_groups=[""], resources=["pods"], verbs=["patch"]),)


def namespace_rules(lease_name: str) -> list[Rule]:
    """In its own namespace: create the Lease once, then read and renew only that one; record events."""
    return [*rbac.lease_rules(lease_name), Rule(api_groups=[""], resources=["events"], verbs=["create", "patch"])]


def handover_rules(services: list[str], warm: bool = False, home: bool = False, clear: bool = False) -> list[Rule]:
    """In the inference namespace: read and write the scale of each standby Deployment (and, with the warm
    pool, of each `<service>-warm` placeholder Deployment; with the make-before-break return, of each
    `<service>-return` bridge), and, with the return or the clearing of a pool for training the scheduler leaves
    waiting (`handover.clearAfterSeconds`), create evictions (the Eviction API, so the PDB decides); nothing else."""
    names = [standby_deployment(s) for s in services]
    if warm:
        names += [warm_deployment(s) for s in services]
    if home:
        names += [return_deployment(s) for s in services]
    rules = [Rule(api_groups=["apps"], resources=["deployments/scale"], resource_names=names, verbs=["get", "patch"])]
    if home or clear:
        rules.append(Rule(api_groups=[""], resources=["pods/eviction"], verbs=["create"]))
    return rules


def settings_from_config(cfg: ClusterConfig) -> BurstSettings:
    """The agent's settings as the stack deploys them: the one builder, used by this component and the simulator.

    The stack's ``burst`` section is the agent's own tunables model, taken as it is; this adds only what the
    stack derives (label prefix, GPU resource, namespaces, the handover, the providers' prices and taints).
    Label and taint keys are derived by the contract from the prefix, never here.
    """
    burst = cfg.burst
    return BurstSettings.deployed(
        burst,
        source="stack config (burst)",
        label_prefix=cfg.label_prefix,
        gpu_resource=cfg.gpu_resource,
        provider_deletion_costs=deletion_costs(cfg.providers, burst.external_deletion_cost),
        namespace=cfg.system_namespace,
        lease_name=LEASE_NAME,
        handover_services=dict(cfg.handover_services),
        handover=burst.handover.tunables(),
        inference_namespace=cfg.inference_namespace,
        inference_pools=list(cfg.inference_pools),
        provider_taints={p.name: "{key}={value}".format(**provider_taint(p)) for p in cfg.providers},
    )


def settings_document(settings: BurstSettings) -> str:
    """The ConfigMap file: every settings key spelled out (JSON is YAML), sorted for stable diffs."""
    return json.dumps(json.loads(settings.to_json()), indent=2, sort_keys=True) + "\n"


@dataclass(frozen=True)
class BurstControllerArgs:
    burst: Burst
    settings: BurstSettings
    image: str
    placement: Placement
    #: Where gated training pods run (the handover gate is lifted there).
    training_namespace: str = "training"
    #: The stack's scrape interval and monitor labels (without them the operator would not select the monitor).
    scrape: Scrape = field(default_factory=Scrape)
    #: The container's requests: the stack's, or sized from its nodes (``components.config.footprint``).
    resources: ContainerRequests = BURST_CONTROLLER.floor

    @classmethod
    def from_config(cls, cfg: ClusterConfig) -> BurstControllerArgs:
        return cls(
            burst=cfg.burst,
            settings=settings_from_config(cfg),
            image=images.agent_image(APP, cfg.agent_registry),
            placement=Placement(cfg.system_namespace, cfg.priorities.system.name, cfg.system_pool_selector),
            training_namespace=cfg.training_namespace,
            scrape=Scrape.of(cfg.observability),
            resources=agent_requests(cfg, BURST_CONTROLLER),
        )


class BurstController(pulumi.ComponentResource):
    """Settings, identity, RBAC, the Deployment, its PDB, and metrics scraping (children in ``agent``)."""

    taint_key: pulumi.Output[str]

    def __init__(self, name: str, args: BurstControllerArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("gpu-cluster:burst:BurstController", name, None, opts)
        labels = common_labels(APP, "burst-controller", images.AGENT_VERSION)
        agent = SystemAgent(self, APP, labels, args.placement)
        self.agent = agent
        agent.settings("settings", {SETTINGS_FILE: settings_document(args.settings)})
        agent.grant_cluster(CLUSTER_RULES)
        agent.grant_namespace("ns", namespace_rules(LEASE_NAME), name=APP)
        agent.grant_node_events()
        agent.grant_namespace("inference-pods", POD_RULES, name=f"{APP}-pods",
                              namespace=args.settings.inference_namespace)
        if args.settings.handover_services:
            agent.grant_namespace("handover", handover_rules(list(args.settings.handover_services),
                                                                 args.settings.warm_pool, args.settings.return_bridge,
                                                                 args.settings.handover.clear_after_seconds > 0),
                                  name=f"{APP}-handover", namespace=args.settings.inference_namespace)
            agent.grant_namespace("training-pods", POD_RULES, name=f"{APP}-pods", namespace=args.training_namespace)
        port = args.burst.metrics_port
        volume, mount = agent.settings_volume("settings", CONFIG_DIR)
        self.deployment = agent.deploy(
            [k8s.core.v1.ContainerArgs(
                name=APP,
                image=args.image,
                args=[f"--config={CONFIG_DIR}/{SETTINGS_FILE}", f"--metrics-port={port}"],
                env=[k8s.core.v1.EnvVarArgs(
                    name="POD_NAME",
                    value_from=k8s.core.v1.EnvVarSourceArgs(
                        field_ref=k8s.core.v1.ObjectFieldSelectorArgs(field_path="metadata.name")
                    ),
                )],
                ports=[k8s.core.v1.ContainerPortArgs(name="metrics", container_port=port)],
                readiness_probe=metrics_readiness_probe(),
                liveness_probe=metrics_liveness_probe(),
                resources=resources(args.resources.cpu, args.resources.memory),
                security_context=container_security_context(),
                volume_mounts=[mount],
            )],
            # One leader, one warm standby: the Lease, not the replica count, guarantees one writer.
            replicas=args.burst.replicas,
            annotations=checkov_skips({"CKV_K8S_38": API_CLIENT}),
            volumes=[volume],
        )
        agent.disruption_budget()
        agent.scrape(port, args.scrape)
        self.taint_key = pulumi.Output.from_input(args.settings.taint_key)
        self.register_outputs({"taint_key": self.taint_key})


def summary_rows(cfg: ClusterConfig) -> list[tuple[str, str]]:
    """Burst thresholds and the taint the controller owns."""
    b = cfg.burst
    return [
        ("burst taint", f"{Keys(cfg.label_prefix).burst_taint}={b.taint_value}:NoSchedule (never NoExecute)"),
        ("burst opens", f"free on-prem GPUs < {b.open_below_free_gpus} for {b.open_hold_seconds}s, "
                        f"or GPU pods pending > {b.pending_grace_seconds}s"),
        ("burst closes", f"free on-prem GPUs ≥ {b.close_at_free_gpus} for {b.close_hold_seconds}s"),
        ("handover", f"training gated until standby replicas cover displaced inference (timeout "
                     f"{b.handover.timeout_seconds}s)" if cfg.handover_active else "off"),
        ("external pods", external_pods_row(cfg)),
        ("burst controller", f"{b.replicas} replicas, one leader (Lease {LEASE_NAME}), "
                             f"resync {b.resync_seconds}s, stale after {b.stale_after_seconds}s"),
    ]


def external_pods_row(cfg: ClusterConfig) -> str:
    """The deletion costs of external replicas: one for all, or per provider when prices rank them."""
    base = cfg.burst.external_deletion_cost
    costs = deletion_costs(cfg.providers, base)
    if not costs:
        return f"pod-deletion-cost {base} (scaled down first)"
    ranked = ", ".join(f"{name} {cost}" for name, cost in sorted(costs.items(), key=lambda kv: kv[1]))
    return f"pod-deletion-cost {ranked} (scaled down first, the dearest provider first)"
