"""The GPU/InfiniBand health guard as Kubernetes objects: settings ConfigMap, least-privilege RBAC, Deployment, PDB.

Settings are built by :func:`settings_from_config` (the one way from the stack to
the guard) and validated by the agent's own model, so a value the agent would refuse fails at preview. Two
replicas, one active (a Lease): a crash or an eviction of the leader hands over within the lease duration, and
a PodDisruptionBudget (minAvailable 1) keeps a drain from taking both. The objects come from the shared
:class:`components.system_agent.SystemAgent` builder, like the burst controller's.
RBAC is exactly what its shell calls:

* cluster-wide: ``nodes`` get/list/watch/patch (taints, labels, annotations), ``nodes/status`` patch (the
  ``GpuHealthy`` condition), ``pods`` list (what runs on a quarantined node, by field selector); no pod write;
* in the training namespace, and the inference namespace when fatal nodes evict inference too:
  ``pods/eviction`` create (the Eviction API, so PodDisruptionBudgets are honoured). A pod labelled as
  training or inference elsewhere is not the guard's to move: its settings (``eviction_namespaces``) leave
  it alone, and the API server would refuse it;
* in ``default``: ``events`` create (node events live there);
* in the system namespace: ``leases`` create, and get/update of its own Lease only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi_kubernetes as k8s

from agents.health_guard.contract import (
    APP,
    HealthClass,
    HealthSettings,
    default_signals,
    parse_settings,
    settings_document,
)
from components import images, rbac
from components.config import ClusterConfig
from components.config.base import ContainerRequests
from components.config.footprint import HEALTH_GUARD, agent_requests
from components.naming import common_labels
from components.security import API_CLIENT, checkov_skips, container_security_context, resources
from components.system_agent import SETTINGS_KEY, Placement, SystemAgent
from components.workloads import metrics_liveness_probe, metrics_readiness_probe

CONFIG_DIR = f"/etc/{APP}"
REPLICAS = 2

Rule = rbac.Rule

CLUSTER_RULES: tuple[Rule, ...] = (
    Rule(api_groups=[""], resources=["nodes"], verbs=["get", "list", "watch", "patch"]),
    Rule(api_groups=[""], resources=["nodes/status"], verbs=["patch"]),
    Rule(api_groups=[""], resources=["pods"], verbs=["list"]),
)
#: In each namespace whose pods it evicts (``HealthGuardArgs.eviction_namespaces``).
EVICTION_RULES: tuple[Rule, ...] = (Rule(api_groups=[""], resources=["pods/eviction"], verbs=["create"]),)
#: In the training namespace: Volcano Jobs' retry counts are the restarts application crashes cause.
GANG_RULES: tuple[Rule, ...] = (Rule(api_groups=["batch.volcano.sh"], resources=["jobs"], verbs=["list", "watch"]),)


@dataclass(frozen=True)
class HealthGuardArgs:
    settings: HealthSettings
    namespace: str
    port: int
    priority_class: str
    system_pool_selector: dict[str, str]
    image: str
    #: Where it evicts, by workload (the key names the Role's logical name, so a renamed namespace keeps its
    #: URN): training always, inference when a fatal node evicts inference too.
    eviction_namespaces: tuple[tuple[str, str], ...] = (("training", "training"),)
    #: The container's requests: the stack's, or sized from its nodes (``components.config.footprint``).
    resources: ContainerRequests = HEALTH_GUARD.floor

    @classmethod
    def from_config(cls, cfg: ClusterConfig) -> HealthGuardArgs:
        settings = settings_from_config(cfg)
        return cls(
            settings=settings,
            namespace=cfg.system_namespace,
            port=cfg.observability.health_guard_port,
            priority_class=cfg.priorities.system.name,
            system_pool_selector=cfg.system_pool_selector,
            image=images.agent_image(APP, cfg.agent_registry),
            eviction_namespaces=(("training", cfg.training_namespace),
                                 *((("inference", cfg.inference_namespace),) if settings.evict_inference_on_fatal
                                   else ())),
            resources=agent_requests(cfg, HEALTH_GUARD),
        )


class HealthGuard(pulumi.ComponentResource):
    """Settings, identity, RBAC, the Deployment and its PDB, built by :class:`SystemAgent` (children in ``agent``)."""

    def __init__(self, name: str, args: HealthGuardArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("gpu-cluster:health:HealthGuard", name, None, opts)
        labels = common_labels(APP, "health-guard", images.AGENT_VERSION)
        self.labels = labels
        agent = SystemAgent(self, APP, labels,
                            Placement(args.namespace, args.priority_class, args.system_pool_selector))
        self.agent = agent
        agent.settings("settings", {SETTINGS_KEY: settings_document(args.settings)})
        agent.grant_cluster(CLUSTER_RULES)
        agent.grant_node_events()
        agent.grant_namespace("lease", rbac.lease_rules(args.settings.lease_name), name=f"{APP}-lease")
        for workload, namespace in args.eviction_namespaces:
            agent.grant_namespace(f"evict-{workload}", EVICTION_RULES, name=f"{APP}-evict", namespace=namespace)
        for namespace in args.settings.training_namespaces:
            agent.grant_namespace(f"gangs-{namespace}", GANG_RULES, name=f"{APP}-gangs", namespace=namespace)
        pod_name = k8s.core.v1.EnvVarArgs(
            name="POD_NAME",
            value_from=k8s.core.v1.EnvVarSourceArgs(
                field_ref=k8s.core.v1.ObjectFieldSelectorArgs(field_path="metadata.name")),
        )
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
        # A drain never takes both replicas: the standby keeps the Lease warm, so quarantines go on.
        self.pod_disruption_budget = agent.disruption_budget()
        self.register_outputs({})


def summary_rows(cfg: ClusterConfig) -> list[tuple[str, str]]:
    """The health guard's rules of engagement for the preview summary."""
    if not cfg.observability.health_guard:
        return [("health guard", "off (alerts only)")]
    s = settings_from_config(cfg)
    n = s.names
    fatal = ", ".join(x.name for x in s.signals if x.health_class == "fatal")
    degraded = ", ".join(x.name for x in s.signals if x.health_class == "degraded")
    return [
        ("fatal", f"{fatal} → {n.taint}=fatal:NoSchedule, training and inference evicted"),
        ("degraded", f"{degraded} → {n.taint}=degraded:NoSchedule, training evicted, inference stays"),
        ("guard rails", f"≤ {s.max_nodes_per_hour} nodes/h and {s.max_nodes_quarantined} in total, "
                        f"≤ {s.max_pool_percent_per_hour:g} %/h and {s.max_pool_percent_quarantined:g} % of a pool; "
                        "past that the breaker trips until a person resets it"),
        ("release", f"degraded after {s.probation_seconds}s healthy; fatal also needs {n.repaired}"),
        ("switch faults", f"≥ {s.switch_fault_min_nodes} nodes (or {s.switch_fault_leaf_percent:g} % of a smaller "
                          f"leaf) with InfiniBand faults under one {n.leaf} → {n.switch_fault}=<leaf>:NoSchedule "
                          f"on the leaf, nothing evicted, rails not counted; released after the probation "
                          f"(a port down: and {n.switch_repaired})"),
    ]


def settings_from_config(cfg: ClusterConfig, **overrides: Any) -> HealthSettings:
    """The guard's settings from the stack: the one function the component, the local cluster and the tests use.

    Thermal limit, band and hold come from ``observability`` (one source with the alert rules); the rest
    from ``observability.health``. ``overrides`` replace top-level fields (e.g. a local Prometheus URL).
    """
    o = cfg.observability
    h = o.health
    signals = default_signals(
        threshold_celsius=float(o.thermal_threshold_celsius),
        band_celsius=float(o.thermal_warning_band_celsius),
        hold_seconds=o.thermal_hold_seconds,
        fatal_xids=tuple(h.fatal_xids),
        degraded_xids=tuple(h.degraded_xids),
    )
    classes = dict(h.signal_classes)  # names checked at load (config.observability.HealthGuardConfig)
    mapped = [
        s.model_copy(update={"health_class": HealthClass(classes[s.name])}) if s.name in classes else s
        for s in signals
        if classes.get(s.name) != "off"
    ]
    values: dict[str, Any] = {
        "label_prefix": cfg.label_prefix,
        "prometheus_url": o.prometheus_url,
        "node_selector": f"{cfg.label_prefix}/location=onprem",
        "poll_seconds": o.health_guard_poll_seconds,
        **h.tunables(),
        "eviction_namespaces": [cfg.training_namespace, cfg.inference_namespace],
        "training_namespaces": [cfg.training_namespace],
        "namespace": cfg.system_namespace,
        "signals": [s.model_dump() for s in mapped],
        **overrides,
    }
    return parse_settings(values, source="observability.health")
