"""The whole platform layer as one component tree: the single entry point ``__main__.py`` calls."""

from __future__ import annotations

import pulumi
import pulumi_kubernetes as k8s

from components.admission import GuardrailArgs, TrainingGuardrails
from components.burst_controller import BurstController, BurstControllerArgs
from components.checkpoint import CheckpointStorage, CheckpointStorageArgs
from components.cluster_settings import ClusterSettingsMap
from components.config import ClusterConfig, TierName
from components.descheduler import DeschedulerArgs, GradualReturn
from components.gang_scheduler import GangScheduler, GangSchedulerArgs
from components.inference import InferencePlatform
from components.naming import common_labels
from components.network_policy import NetworkPolicies, NetworkPoliciesArgs
from components.node_pools import GpuNodePools, NodePoolsArgs
from components.observability import ObservabilityArgs, ObservabilityStack
from components.priority import PriorityTiers, PriorityTiersArgs
from components.providers import external_providers
from components.training_job import GangTrainingJob, TrainingJobArgs


class PlatformNamespaces(pulumi.ComponentResource):
    """Namespaces with Pod Security admission: restricted for ours, privileged only where named."""

    def __init__(self, name: str, cfg: ClusterConfig, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("gpu-cluster:core:PlatformNamespaces", name, None, opts)
        # The telemetry namespace hosts DCGM (SYS_ADMIN, root) and the IB exporter (hostPath /sys), which no level
        # below privileged admits: privileged there and nowhere else, with the exceptions named in
        # policies/rules/allow_lists.py (privileged_agents). The controllers' system namespace enforces restricted.
        levels = {
            cfg.system_namespace: "restricted",
            cfg.telemetry_namespace: "privileged",
            cfg.training_namespace: "baseline",
            cfg.inference_namespace: "baseline",
            cfg.monitoring_namespace: "restricted",
        }
        self.namespaces: dict[str, k8s.core.v1.Namespace] = {}
        for ns, level in levels.items():
            self.namespaces[ns] = k8s.core.v1.Namespace(
                f"ns-{ns}",
                metadata=k8s.meta.v1.ObjectMetaArgs(
                    name=ns,
                    labels={
                        "pod-security.kubernetes.io/enforce": level,
                        "pod-security.kubernetes.io/warn": "restricted",
                        **common_labels(ns, "namespace"),
                    },
                ),
                opts=pulumi.ResourceOptions(parent=self),
            )
        self.register_outputs({"names": list(levels)})


class UnifiedGpuCluster(pulumi.ComponentResource):
    """Training and inference sharing on-prem GPUs, with burst, observability and safe checkpoints."""

    def __init__(self, name: str, cfg: ClusterConfig, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("gpu-cluster:index:UnifiedGpuCluster", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        self.namespaces = PlatformNamespaces("namespaces", cfg, child)
        after_ns = pulumi.ResourceOptions(parent=self, depends_on=list(self.namespaces.namespaces.values()))
        self.priorities = PriorityTiers("priorities", PriorityTiersArgs.from_config(cfg), child)
        self.node_pools = GpuNodePools(
            "node-pools", NodePoolsArgs.from_config(cfg, self.priorities.names[TierName.SYSTEM]),
            pulumi.ResourceOptions(parent=self, depends_on=[self.priorities, *after_ns.depends_on]),  # type: ignore[misc]
        )
        self.scheduler = GangScheduler(
            "gang-scheduler",
            GangSchedulerArgs.from_config(cfg, self.priorities.names[TierName.SYSTEM]),
            pulumi.ResourceOptions(parent=self, depends_on=[self.priorities]),
        )
        self.checkpoints = CheckpointStorage("checkpoints", CheckpointStorageArgs.from_config(cfg), after_ns)
        self.training_jobs = [
            GangTrainingJob(
                f"training-{job.name}",
                TrainingJobArgs.from_config(cfg, job),
                pulumi.ResourceOptions(
                    parent=self, depends_on=[self.scheduler, self.checkpoints, *after_ns.depends_on]  # type: ignore[misc]
                ),
            )
            for job in cfg.training.jobs
            if job.enabled
        ]
        # Capability components (burst, observability, checkpoints) are wired below, one line each.
        placed = pulumi.ResourceOptions(parent=self, depends_on=[self.priorities, self.scheduler, *after_ns.depends_on])  # type: ignore[misc]
        self.providers = external_providers(cfg, placed)
        self.burst_controller = BurstController("burst-controller", BurstControllerArgs.from_config(cfg), placed)
        self.inference = InferencePlatform("inference", cfg, placed)
        self.gradual_return = GradualReturn("descheduler", DeschedulerArgs.from_config(cfg), placed)
        self.observability = ObservabilityStack("observability", ObservabilityArgs.from_config(cfg), placed)
        self.network_policies = NetworkPolicies("network-policies", NetworkPoliciesArgs.from_config(cfg), after_ns)
        # The researcher CLI's view of the cluster, and the rules every training pod must meet (issue 15).
        self.cluster_settings = ClusterSettingsMap("cluster-settings", cfg, after_ns)
        self.guardrails = TrainingGuardrails("training-guardrails", GuardrailArgs.from_config(cfg), child)

        self.onprem_gpus = pulumi.Output.from_input(cfg.onprem_gpus)
        self.register_outputs(
            {
                "onprem_gpus": self.onprem_gpus,
                "scheduler": self.scheduler.scheduler_name,
                "priority_classes": {t.value: n for t, n in self.priorities.names.items()},
            }
        )
