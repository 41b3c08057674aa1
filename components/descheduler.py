"""Descheduler: the gradual return of inference from virtual nodes once the burst taint is back.

The burst controller puts ``<prefix>/burst`` back as NoSchedule; nothing is evicted by that alone. On
its schedule the descheduler evicts (through the eviction API, so PDBs hold) pods that do not tolerate
that taint — inference pods on virtual nodes — a few per node, namespace and cycle. The policy replaces
the upstream chart's default profile, which turns on unrelated balancing plugins:

- ``RemovePodsViolatingNodeTaints`` restricted to the burst taint key (provider taints never count) and to
  the inference namespace (``namespaces.include``);
- optionally ``RemovePodsViolatingNodeAffinity`` in preferred mode, which needs ``nodeFit``, in the same
  namespace;
- ``DefaultEvictor``: only pods labelled ``<prefix>/workload=inference``, only below a priority that sits
  under training's, only older than ``minPodAge``, and only when another node could take them
  (``nodeFit``), so an eviction never strands a replica in Pending.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi_kubernetes as k8s
import yaml

from components import images, rbac
from components.config import ClusterConfig, Descheduler, Priorities
from components.naming import INFERENCE, Keys, common_labels
from components.security import API_CLIENT, checkov_skips, container_security_context, resources
from components.system_agent import Placement, SystemAgent

APP = "descheduler"
POLICY_FILE = "policy.yaml"
POLICY_DIR = "/policy-dir"
PROFILE = "burst-return"
#: A descheduling pass that has not finished by then is killed, so the next scheduled cycle can run.
DEADLINE_SECONDS = 600
Rule = rbac.Rule

#: The upstream descheduler ClusterRole, less leader election (a CronJob runs one pod at a time),
#: metrics.k8s.io (only LowNodeUtilization with real usage reads it) and every pod write: its informers read
#: cluster-wide, but it evicts only in the inference namespace (EVICTION_RULES), the one its policy includes.
#: Upstream's pods ``delete`` goes too: the descheduler evicts through the Eviction API, never deletes. Since
#: v0.36 it watches PersistentVolumeClaims (the DefaultEvictor's PVC protection), as upstream's chart grants.
RULES: tuple[Rule, ...] = (
    Rule(api_groups=["events.k8s.io"], resources=["events"], verbs=["create", "update"]),
    Rule(api_groups=[""], resources=["nodes"], verbs=["get", "watch", "list"]),
    Rule(api_groups=[""], resources=["namespaces"], verbs=["get", "watch", "list"]),
    Rule(api_groups=[""], resources=["pods"], verbs=["get", "watch", "list"]),
    Rule(api_groups=["scheduling.k8s.io"], resources=["priorityclasses"], verbs=["get", "watch", "list"]),
    Rule(api_groups=["policy"], resources=["poddisruptionbudgets"], verbs=["get", "watch", "list"]),
    Rule(api_groups=[""], resources=["persistentvolumeclaims"], verbs=["get", "watch", "list"]),
)
#: In the inference namespace only: evict (the Eviction API, so PodDisruptionBudgets hold).
EVICTION_RULES: tuple[Rule, ...] = (Rule(api_groups=[""], resources=["pods/eviction"], verbs=["create"]),)


def priority_threshold(priorities: Priorities) -> int:
    """Evict only pods below this: inference qualifies, training (strictly higher) never does."""
    return priorities.inference.value + 1


def policy(d: Descheduler, priorities: Priorities, keys: Keys, namespace: str) -> dict[str, Any]:
    """The DeschedulerPolicy (descheduler/v1alpha2) doing only the gradual return, of ``namespace``'s pods."""
    only = {"include": [namespace]}
    deschedule = ["RemovePodsViolatingNodeTaints"]
    plugin_config: list[dict[str, Any]] = [
        {
            "name": "DefaultEvictor",
            "args": {
                "labelSelector": {"matchLabels": {keys.workload: INFERENCE}},
                "priorityThreshold": {"value": priority_threshold(priorities)},
                "minPodAge": f"{d.min_pod_age_seconds}s",
                "nodeFit": True,
                # Inference pods mount an emptyDir for /tmp (read-only root filesystem); the evictor
                # protects pods with local storage by default, which would pin them to the virtual node.
                "podProtections": {"defaultDisabled": ["PodsWithLocalStorage"]},
            },
        },
        {"name": "RemovePodsViolatingNodeTaints", "args": {"includedTaints": [keys.burst_taint], "namespaces": only}},
    ]
    if d.prefer_onprem_affinity:
        deschedule.append("RemovePodsViolatingNodeAffinity")
        plugin_config.append({
            "name": "RemovePodsViolatingNodeAffinity",
            "args": {"nodeAffinityType": ["preferredDuringSchedulingIgnoredDuringExecution"], "namespaces": only},
        })
    return {
        "apiVersion": "descheduler/v1alpha2",
        "kind": "DeschedulerPolicy",
        "maxNoOfPodsToEvictPerNode": d.max_pods_per_node,
        "maxNoOfPodsToEvictPerNamespace": d.max_pods_per_namespace,
        "maxNoOfPodsToEvictTotal": d.max_pods_total,
        "profiles": [{
            "name": PROFILE,
            "pluginConfig": plugin_config,
            "plugins": {
                "filter": {"enabled": ["DefaultEvictor"]},
                "preEvictionFilter": {"enabled": ["DefaultEvictor"]},
                "deschedule": {"enabled": deschedule},
            },
        }],
    }


@dataclass(frozen=True)
class DeschedulerArgs:
    descheduler: Descheduler
    priorities: Priorities
    label_prefix: str
    image: str
    placement: Placement
    #: The only namespace it evicts in (its policy's ``namespaces.include`` and its eviction Role).
    inference_namespace: str = "inference"

    @classmethod
    def from_config(cls, cfg: ClusterConfig) -> DeschedulerArgs:
        return cls(
            descheduler=cfg.descheduler,
            priorities=cfg.priorities,
            label_prefix=cfg.label_prefix,
            image=cfg.descheduler.image,
            placement=Placement(cfg.system_namespace, cfg.priorities.system.name, cfg.system_pool_selector),
            inference_namespace=cfg.inference_namespace,
        )


class GradualReturn(pulumi.ComponentResource):
    """The descheduler CronJob, its policy and its RBAC."""

    schedule: pulumi.Output[str]

    def __init__(self, name: str, args: DeschedulerArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("gpu-cluster:burst:GradualReturn", name, None, opts)
        d = args.descheduler
        labels = common_labels(APP, "descheduler", images.image_version(args.image))
        meta = k8s.meta.v1.ObjectMetaArgs
        agent = SystemAgent(self, APP, labels, args.placement)
        self.agent = agent
        document = yaml.safe_dump(policy(d, args.priorities, Keys(args.label_prefix), args.inference_namespace),
                                  sort_keys=False)
        config = agent.settings("policy", {POLICY_FILE: document})
        agent.grant_cluster(RULES)
        agent.grant_namespace("evict", EVICTION_RULES, name=f"{APP}-evict", namespace=args.inference_namespace)
        volume, mount = agent.settings_volume("policy", POLICY_DIR)
        self.cron_job = k8s.batch.v1.CronJob(
            APP,
            metadata=meta(name=APP, namespace=agent.namespace, labels=labels,
                          annotations=checkov_skips({"CKV_K8S_38": API_CLIENT})),
            spec=k8s.batch.v1.CronJobSpecArgs(
                schedule=d.schedule,
                # Two overlapping cycles would double the per-cycle eviction limits.
                concurrency_policy="Forbid",
                starting_deadline_seconds=60,
                successful_jobs_history_limit=3,
                failed_jobs_history_limit=1,
                job_template=k8s.batch.v1.JobTemplateSpecArgs(
                    metadata=meta(labels=labels),
                    spec=k8s.batch.v1.JobSpecArgs(
                        backoff_limit=0,
                        # One pass takes seconds; under Forbid a hung run would block every later cycle.
                        active_deadline_seconds=DEADLINE_SECONDS,
                        template=agent.pod_template(
                            [k8s.core.v1.ContainerArgs(
                                name=APP,
                                image=args.image,
                                command=["/bin/descheduler"],
                                args=[f"--policy-config-file={POLICY_DIR}/{POLICY_FILE}", "--v=3"],
                                resources=resources(d.resources.cpu, d.resources.memory),
                                security_context=container_security_context(),
                                volume_mounts=[mount],
                            )],
                            restart_policy="Never",
                            volumes=[volume],
                        ),
                    ),
                ),
            ),
            opts=pulumi.ResourceOptions(parent=self, depends_on=[config, *agent.grants]),
        )
        self.schedule = pulumi.Output.from_input(d.schedule)
        self.register_outputs({"schedule": self.schedule})


def summary_rows(cfg: ClusterConfig) -> list[tuple[str, str]]:
    """Descheduler schedule, eviction limits and what it may touch."""
    d = cfg.descheduler
    keys = Keys(cfg.label_prefix)
    plugins = "RemovePodsViolatingNodeTaints"
    if d.prefer_onprem_affinity:
        plugins += " + RemovePodsViolatingNodeAffinity (preferred)"
    return [
        ("descheduler", f"{d.image} on '{d.schedule}': {plugins} for {keys.burst_taint}"),
        ("eviction limits", f"{d.max_pods_per_node}/node, {d.max_pods_per_namespace}/namespace, "
                            f"{d.max_pods_total}/cycle; pods older than {d.min_pod_age_seconds}s; nodeFit"),
        ("evictable", f"{keys.workload}={INFERENCE} in {cfg.inference_namespace} below priority "
                      f"{priority_threshold(cfg.priorities)} "
                      f"(training is {cfg.priorities.training.value})"),
    ]
