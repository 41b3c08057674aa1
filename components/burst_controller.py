"""Burst controller: the one owner of the burst taint on virtual nodes, deployed highly available.

Two replicas, one active: leader election through a Lease in the system namespace, so a node drain
or a crash hands over within the lease duration and never leaves two writers. Its settings come from
the stack's ``burst`` section, rendered with the agent's own :class:`BurstSettings` so a key the agent
does not know fails here, at preview, not at start-up in the cluster. RBAC is exactly what the shell
calls: nodes and pods get/list/watch/patch cluster-wide (taints, deletion cost, the handover gate); leases
and events in its own namespace; with the handover on, the scale of the named standby Deployments only.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import pulumi
import pulumi_kubernetes as k8s

from agents.burst_controller.contract import BurstSettings, standby_deployment
from components import images, rbac
from components.config import Burst, ClusterConfig
from components.naming import Keys, common_labels, selector_labels
from components.security import (
    API_CLIENT,
    checkov_skips,
    container_security_context,
    pod_security_context,
    resources,
)
from components.workloads import metrics_liveness_probe, metrics_readiness_probe, spread_across_nodes

APP = "burst-controller"
LEASE_NAME = "burst-controller"
SETTINGS_FILE = "settings.yaml"
CONFIG_DIR = "/etc/burst-controller"
Rule = rbac.Rule

#: Cluster-wide: read nodes and pods; patch node taints and pods' deletion-cost annotation. Nothing else.
CLUSTER_RULES: tuple[Rule, ...] = (
    Rule(api_groups=[""], resources=["nodes"], verbs=["get", "list", "watch", "patch"]),
    Rule(api_groups=[""], resources=["pods"], verbs=["get", "list", "watch", "patch"]),
)


def namespace_rules(lease_name: str) -> list[Rule]:
    """In its own namespace: create the Lease once, then read and renew only that one; record events."""
    return [
        Rule(api_groups=["coordination.k8s.io"], resources=["leases"], verbs=["create"]),
        Rule(api_groups=["coordination.k8s.io"], resources=["leases"], resource_names=[lease_name],
             verbs=["get", "update"]),
        Rule(api_groups=[""], resources=["events"], verbs=["create", "patch"]),
    ]


def handover_rules(services: list[str]) -> list[Rule]:
    """In the inference namespace: read and write the scale of each standby Deployment, nothing else."""
    names = [standby_deployment(s) for s in services]
    return [Rule(api_groups=["apps"], resources=["deployments/scale"], resource_names=names, verbs=["get", "patch"])]


def settings_from_config(cfg: ClusterConfig) -> BurstSettings:
    """The agent's settings as the stack deploys them: the one builder, used by this component and the simulator.

    Every key comes from the stack (its ``burst`` section, label prefix, GPU resource, namespaces, the
    handover); label and taint keys are derived by the contract from the prefix, never here. The agent
    validates the same mapping again at start.
    """
    burst = cfg.burst
    return BurstSettings.from_mapping(
        {
            "label_prefix": cfg.label_prefix,
            "taint_value": burst.taint_value,
            "gpu_resource": cfg.gpu_resource,
            "open_below_free_gpus": burst.open_below_free_gpus,
            "close_at_free_gpus": burst.close_at_free_gpus,
            "open_hold_seconds": float(burst.open_hold_seconds),
            "close_hold_seconds": float(burst.close_hold_seconds),
            "pending_grace_seconds": float(burst.pending_grace_seconds),
            "external_deletion_cost": burst.external_deletion_cost,
            "resync_seconds": float(burst.resync_seconds),
            "stale_after_seconds": float(burst.stale_after_seconds),
            "tick_seconds": float(burst.tick_seconds),
            "namespace": cfg.system_namespace,
            "lease_name": LEASE_NAME,
            "event_namespace": cfg.system_namespace,
            "handover_services": dict(cfg.handover_services),
            "handover_timeout_seconds": float(burst.handover.timeout_seconds),
            "handover_cover": burst.handover.cover,
            "inference_namespace": cfg.inference_namespace,
        },
        source="stack config (burst)",
    )


def settings_document(settings: BurstSettings) -> str:
    """The ConfigMap file: every settings key spelled out (JSON is YAML), sorted for stable diffs."""
    return json.dumps(json.loads(settings.to_json()), indent=2, sort_keys=True) + "\n"


@dataclass(frozen=True)
class BurstControllerArgs:
    burst: Burst
    settings: BurstSettings
    namespace: str
    image: str
    priority_class: str
    system_pool_selector: dict[str, str]

    @classmethod
    def from_config(cls, cfg: ClusterConfig) -> BurstControllerArgs:
        return cls(
            burst=cfg.burst,
            settings=settings_from_config(cfg),
            namespace=cfg.system_namespace,
            image=images.agent_image(APP),
            priority_class=cfg.priorities.system.name,
            system_pool_selector=cfg.system_pool_selector,
        )


class BurstController(pulumi.ComponentResource):
    """Settings, identity, RBAC, the Deployment, its PDB, and metrics scraping."""

    taint_key: pulumi.Output[str]

    def __init__(self, name: str, args: BurstControllerArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("gpu-cluster:burst:BurstController", name, None, opts)
        ns = args.namespace
        labels = common_labels(APP, "burst-controller", images.AGENT_VERSION)
        selector = selector_labels(labels)
        meta = k8s.meta.v1.ObjectMetaArgs
        child = pulumi.ResourceOptions(parent=self)
        role_name = f"gpu-cluster:{APP}"

        config = k8s.core.v1.ConfigMap(
            f"{APP}-settings",
            metadata=meta(name=f"{APP}-settings", namespace=ns, labels=labels),
            data={SETTINGS_FILE: settings_document(args.settings)},
            opts=child,
        )
        account = rbac.service_account(APP, ns, labels, self)
        cluster = rbac.cluster_role_with_binding(
            f"{APP}-role", f"{APP}-binding", name=role_name, rules=CLUSTER_RULES, subject=account.subject,
            labels=labels, parent=self, depends_on=[account.service_account],
        )
        local = rbac.namespaced_role_with_binding(
            f"{APP}-ns-role", f"{APP}-ns-binding", name=APP, namespace=ns, rules=namespace_rules(LEASE_NAME),
            subject=account.subject, labels=labels, parent=self, depends_on=[account.service_account],
        )
        grants = [cluster.binding, local.binding]
        if args.settings.handover_services:
            grants.append(rbac.namespaced_role_with_binding(
                f"{APP}-handover-role", f"{APP}-handover-binding", name=f"{APP}-handover",
                namespace=args.settings.inference_namespace,
                rules=handover_rules(list(args.settings.handover_services)),
                subject=account.subject, labels=labels, parent=self, depends_on=[account.service_account],
            ).binding)
        port = args.burst.metrics_port
        self.deployment = k8s.apps.v1.Deployment(
            APP,
            metadata=meta(name=APP, namespace=ns, labels=labels, annotations=checkov_skips({"CKV_K8S_38": API_CLIENT})),
            spec=k8s.apps.v1.DeploymentSpecArgs(
                # One leader, one warm standby: the Lease, not the replica count, guarantees one writer.
                replicas=args.burst.replicas,
                selector=k8s.meta.v1.LabelSelectorArgs(match_labels=selector),
                template=k8s.core.v1.PodTemplateSpecArgs(
                    metadata=meta(labels=labels),
                    spec=k8s.core.v1.PodSpecArgs(
                        service_account_name=APP,
                        priority_class_name=args.priority_class,
                        node_selector=args.system_pool_selector,
                        security_context=pod_security_context(),
                        affinity=spread_across_nodes(selector),
                        containers=[k8s.core.v1.ContainerArgs(
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
                            resources=resources("100m", "256Mi"),
                            security_context=container_security_context(),
                            volume_mounts=[k8s.core.v1.VolumeMountArgs(
                                name="settings", mount_path=CONFIG_DIR, read_only=True)],
                        )],
                        volumes=[k8s.core.v1.VolumeArgs(
                            name="settings",
                            config_map=k8s.core.v1.ConfigMapVolumeSourceArgs(name=f"{APP}-settings"),
                        )],
                    ),
                ),
            ),
            opts=pulumi.ResourceOptions(parent=self, depends_on=[config, *grants]),
        )
        k8s.policy.v1.PodDisruptionBudget(
            f"{APP}-pdb",
            metadata=meta(name=APP, namespace=ns, labels=labels),
            spec=k8s.policy.v1.PodDisruptionBudgetSpecArgs(
                min_available=1, selector=k8s.meta.v1.LabelSelectorArgs(match_labels=selector)
            ),
            opts=child,
        )
        service = k8s.core.v1.Service(
            f"{APP}-metrics",
            metadata=meta(name=f"{APP}-metrics", namespace=ns, labels=labels),
            spec=k8s.core.v1.ServiceSpecArgs(
                selector=selector,
                ports=[k8s.core.v1.ServicePortArgs(name="metrics", port=port, target_port="metrics")],
            ),
            opts=child,
        )
        k8s.apiextensions.CustomResource(
            f"{APP}-servicemonitor",
            api_version="monitoring.coreos.com/v1",
            kind="ServiceMonitor",
            metadata=meta(name=APP, namespace=ns, labels=labels),
            spec={
                "selector": {"matchLabels": selector},
                "endpoints": [{"port": "metrics", "interval": "15s", "path": "/metrics"}],
            },
            opts=pulumi.ResourceOptions(parent=self, depends_on=[service]),
        )
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
        ("external pods", f"pod-deletion-cost {b.external_deletion_cost} (scaled down first)"),
        ("burst controller", f"{b.replicas} replicas, one leader (Lease {LEASE_NAME}), "
                             f"resync {b.resync_seconds}s, stale after {b.stale_after_seconds}s"),
    ]
