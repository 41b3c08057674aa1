"""One builder for the platform's own agents on the system pool, so their objects are written once.

A system agent (burst controller, health guard, descheduler, a provider's virtual kubelet) is the same set
of objects every time: a settings ConfigMap, a ServiceAccount with its RBAC, pods on the system pool at the
platform priority under the restricted pod security profile, and — where it runs as a highly available
Deployment — a PodDisruptionBudget and a metrics Service with its ServiceMonitor. :class:`SystemAgent`
creates them as children of the calling component and keeps each under the name of its role
(``config_map``, ``service_account``, ``cluster_role``, ``deployment``, ``pod_disruption_budget``,
``service``, ``service_monitor``…), as kube-prometheus names every object by its role.

Logical names (``<app>-settings``, ``<app>-sa``, ``<app>-role``/``-binding``, ``<app>-pdb``,
``<app>-metrics``, ``<app>-servicemonitor``) are the ones the components always used: they are part of
each object's URN, and a renamed one would make ``pulumi up`` replace a live object.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pulumi
import pulumi_kubernetes as k8s

from agents.kit.calls import CLUSTER_SCOPED_EVENT_NAMESPACE
from components import rbac
from components.naming import selector_labels
from components.security import checkov_skips, pod_security_context
from components.workloads import UNHEALTHY_POD_EVICTION, spread_across_nodes

#: Node events: create only (each Event is new, ``generateName``), in CLUSTER_SCOPED_EVENT_NAMESPACE.
NODE_EVENT_RULES: tuple[rbac.Rule, ...] = (rbac.Rule(api_groups=[""], resources=["events"], verbs=["create"]),)
NODE_EVENTS_CHECKOV_SKIPS = {"CKV_K8S_21": "node events live in namespace default; this Role only creates events"}

if TYPE_CHECKING:
    from components.config import Observability

Rule = rbac.Rule

#: The key of an agent's settings file in its ConfigMap (mounted as ``/etc/<app>/settings.json``).
SETTINGS_KEY = "settings.json"


@dataclass(frozen=True)
class Placement:
    """Where and how a system agent's pods run: its namespace, the system pool, the platform priority."""

    namespace: str
    priority_class: str
    system_pool_selector: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Scrape:
    """How the stack's Prometheus finds an agent: the scrape interval and the labels it selects monitors by."""

    interval_seconds: int = 15
    monitor_labels: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def of(cls, o: Observability) -> Scrape:
        """The stack's ``observability.scrapeIntervalSeconds`` and ``monitorLabels``."""
        return cls(interval_seconds=o.scrape_interval_seconds, monitor_labels=dict(o.monitor_labels))


class SystemAgent:
    """The objects of one system agent, created as children of ``parent`` and kept by role."""

    def __init__(self, parent: pulumi.Resource, app: str, labels: dict[str, str], placement: Placement) -> None:
        self.parent = parent
        self.app = app
        self.labels = labels
        self.selector = selector_labels(labels)
        self.placement = placement
        self.namespace = placement.namespace
        self.config_map: k8s.core.v1.ConfigMap | None = None
        self.config_map_name = ""
        self.account = rbac.service_account(app, self.namespace, labels, parent)
        self.service_account = self.account.service_account
        self.cluster_role: k8s.rbac.v1.ClusterRole | None = None
        self.cluster_role_binding: k8s.rbac.v1.ClusterRoleBinding | None = None
        #: Namespaced grants by their role (``lease``, ``events``, ``handover``…).
        self.roles: dict[str, rbac.NamespacedGrant] = {}
        self.deployment: k8s.apps.v1.Deployment | None = None
        self.pod_disruption_budget: k8s.policy.v1.PodDisruptionBudget | None = None
        self.service: k8s.core.v1.Service | None = None
        self.service_monitor: k8s.apiextensions.CustomResource | None = None

    # ------------------------------------------------------------------ settings and identity

    def settings(self, suffix: str, data: Mapping[str, str]) -> k8s.core.v1.ConfigMap:
        """The ConfigMap ``<app>-<suffix>`` holding the agent's settings (or policy) files."""
        name = f"{self.app}-{suffix}"
        self.config_map_name = name
        self.config_map = k8s.core.v1.ConfigMap(
            name,
            metadata=k8s.meta.v1.ObjectMetaArgs(name=name, namespace=self.namespace, labels=self.labels),
            data=dict(data),
            opts=pulumi.ResourceOptions(parent=self.parent),
        )
        return self.config_map

    def settings_volume(self, volume: str,
                        mount_path: str) -> tuple[k8s.core.v1.VolumeArgs, k8s.core.v1.VolumeMountArgs]:
        """The settings ConfigMap as a read-only volume and its mount."""
        assert self.config_map is not None, "settings() first"
        source = k8s.core.v1.ConfigMapVolumeSourceArgs(name=self.config_map_name)
        return (
            k8s.core.v1.VolumeArgs(name=volume, config_map=source),
            k8s.core.v1.VolumeMountArgs(name=volume, mount_path=mount_path, read_only=True),
        )

    def grant_cluster(self, rules: Sequence[Rule], *, role_resource: str = "", binding_resource: str = "",
                      name: str = "") -> rbac.ClusterGrant:
        """The agent's ClusterRole (default ``gpu-cluster:<app>``) and its binding to the ServiceAccount."""
        grant = rbac.cluster_role_with_binding(
            role_resource or f"{self.app}-role", binding_resource or f"{self.app}-binding",
            name=name or f"gpu-cluster:{self.app}", rules=rules, subject=self.account.subject, labels=self.labels,
            parent=self.parent, depends_on=[self.service_account],
        )
        self.cluster_role, self.cluster_role_binding = grant
        return grant

    def grant_namespace(self, role: str, rules: Sequence[Rule], *, name: str, namespace: str | None = None,
                        annotations: Mapping[str, str] | None = None) -> rbac.NamespacedGrant:
        """A Role ``name`` with its binding in ``namespace`` (default the agent's), kept as ``roles[role]``;
        logical names ``<app>-<role>-role`` and ``<app>-<role>-binding``."""
        grant = rbac.namespaced_role_with_binding(
            f"{self.app}-{role}-role", f"{self.app}-{role}-binding", name=name,
            namespace=namespace or self.namespace, rules=rules, subject=self.account.subject, labels=self.labels,
            parent=self.parent, depends_on=[self.service_account], annotations=annotations,
        )
        self.roles[role] = grant
        return grant

    def grant_node_events(self) -> rbac.NamespacedGrant:
        """Create Events about nodes where the API server keeps them (``default``: it refuses an Event about a
        cluster-scoped object in any other namespace), and nothing else there."""
        return self.grant_namespace("events", NODE_EVENT_RULES, name=f"{self.app}-node-events",
                                    namespace=CLUSTER_SCOPED_EVENT_NAMESPACE,
                                    annotations=checkov_skips(NODE_EVENTS_CHECKOV_SKIPS))

    @property
    def grants(self) -> list[pulumi.Resource]:
        """Every binding so far: the pods wait for them, or they would start forbidden."""
        cluster: list[pulumi.Resource] = [self.cluster_role_binding] if self.cluster_role_binding else []
        return [*cluster, *(grant.binding for grant in self.roles.values())]

    # ------------------------------------------------------------------ pods

    def pod_spec(self, containers: Sequence[k8s.core.v1.ContainerArgs], **extra: Any) -> k8s.core.v1.PodSpecArgs:
        """A pod on the system pool: the agent's ServiceAccount, the platform priority, restricted security."""
        return k8s.core.v1.PodSpecArgs(
            service_account_name=self.app,
            priority_class_name=self.placement.priority_class,
            node_selector=self.placement.system_pool_selector,
            security_context=pod_security_context(),
            containers=list(containers),
            **extra,
        )

    def pod_template(self, containers: Sequence[k8s.core.v1.ContainerArgs],
                     **extra: Any) -> k8s.core.v1.PodTemplateSpecArgs:
        return k8s.core.v1.PodTemplateSpecArgs(
            metadata=k8s.meta.v1.ObjectMetaArgs(labels=self.labels), spec=self.pod_spec(containers, **extra))

    def deploy(self, containers: Sequence[k8s.core.v1.ContainerArgs], *, replicas: int,
               annotations: Mapping[str, str] | None = None, strategy: str | None = None,
               depends_on: Sequence[pulumi.Resource] = (), **pod: Any) -> k8s.apps.v1.Deployment:
        """The Deployment ``<app>``; it waits for the settings, ``depends_on`` and every grant so far.

        More than one replica (a leader and its standby) are spread over nodes unless ``affinity`` says
        otherwise: a standby on the leader's node goes down with it.
        """
        waits = [*depends_on, *([self.config_map] if self.config_map else []), *self.grants]
        if replicas > 1:
            pod.setdefault("affinity", spread_across_nodes(self.selector))
        self.deployment = k8s.apps.v1.Deployment(
            self.app,
            metadata=k8s.meta.v1.ObjectMetaArgs(name=self.app, namespace=self.namespace, labels=self.labels,
                                                annotations=dict(annotations) if annotations else None),
            spec=k8s.apps.v1.DeploymentSpecArgs(
                replicas=replicas,
                strategy=k8s.apps.v1.DeploymentStrategyArgs(type=strategy) if strategy else None,
                selector=k8s.meta.v1.LabelSelectorArgs(match_labels=self.selector),
                template=self.pod_template(containers, **pod),
            ),
            opts=pulumi.ResourceOptions(parent=self.parent, depends_on=waits),
        )
        return self.deployment

    def disruption_budget(self, min_available: int = 1) -> k8s.policy.v1.PodDisruptionBudget:
        """``<app>-pdb``: a drain never takes the last replica (the standby keeps the Lease warm).

        A replica that is not ready is evictable (:data:`~components.workloads.UNHEALTHY_POD_EVICTION`).
        """
        self.pod_disruption_budget = k8s.policy.v1.PodDisruptionBudget(
            f"{self.app}-pdb",
            metadata=k8s.meta.v1.ObjectMetaArgs(name=self.app, namespace=self.namespace, labels=self.labels),
            spec=k8s.policy.v1.PodDisruptionBudgetSpecArgs(
                min_available=min_available, selector=k8s.meta.v1.LabelSelectorArgs(match_labels=self.selector),
                unhealthy_pod_eviction_policy=UNHEALTHY_POD_EVICTION),
            opts=pulumi.ResourceOptions(parent=self.parent),
        )
        return self.pod_disruption_budget

    def scrape(self, port: int, how: Scrape, *, spec: Mapping[str, Any] | None = None,
               depends_on: Sequence[pulumi.Resource] = (),
               alias_parent: pulumi.Resource | None = None) -> k8s.apiextensions.CustomResource:
        """The Service ``<app>-metrics`` on the pods' ``metrics`` port and the ServiceMonitor ``<app>`` over it.

        ``honorLabels``: an agent's series name the objects it acts on — ``node``, ``namespace``, ``job`` of a
        gang — and the operator's target labels of the same names (the agent's own pod) must not rename
        them ``exported_*``. ``spec`` adds keys to the monitor's spec; ``alias_parent`` is the component
        that created these two objects before this builder did (their URNs stay, no replacement).
        """
        meta = k8s.meta.v1.ObjectMetaArgs
        aliases = [pulumi.Alias(parent=alias_parent)] if alias_parent is not None else None
        self.service = k8s.core.v1.Service(
            f"{self.app}-metrics",
            metadata=meta(name=f"{self.app}-metrics", namespace=self.namespace, labels=self.labels),
            spec=k8s.core.v1.ServiceSpecArgs(
                selector=self.selector,
                ports=[k8s.core.v1.ServicePortArgs(name="metrics", port=port, target_port="metrics")],
            ),
            opts=pulumi.ResourceOptions(parent=self.parent, depends_on=list(depends_on), aliases=aliases),
        )
        self.service_monitor = k8s.apiextensions.CustomResource(
            f"{self.app}-servicemonitor",
            api_version="monitoring.coreos.com/v1",
            kind="ServiceMonitor",
            metadata=meta(name=self.app, namespace=self.namespace, labels={**self.labels, **how.monitor_labels}),
            spec={
                "selector": {"matchLabels": self.selector},
                **(spec or {}),
                "endpoints": [{"port": "metrics", "interval": f"{how.interval_seconds}s", "path": "/metrics",
                               "honorLabels": True}],
            },
            opts=pulumi.ResourceOptions(parent=self.parent, depends_on=[self.service], aliases=aliases),
        )
        return self.service_monitor
