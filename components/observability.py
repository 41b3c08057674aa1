"""Observability that does not lie: DCGM with tensor-core fields, the InfiniBand exporter, tested alert
rules, the GPU fleet and GPU health dashboards and the health guard, as first-class Kubernetes objects.

Every object is a ``pulumi_kubernetes`` resource (CRDs through ``CustomResource``) rather than a Helm
chart, so the mock runtime, the render tool and the policy pack see the exact DaemonSets, RBAC and
rules that reach the cluster. The pieces and why they look the way they do:

Both exporters run in the telemetry namespace (``telemetryNamespace``), the only namespace whose Pod Security
level is ``privileged``; the health guard stays with the other controllers in the system namespace (restricted).

* **dcgm-exporter** (DaemonSet, GPU pools only): our counters CSV in a ConfigMap, a 5 s collection
  interval from the stack (upstream's 30 s is too slow for a 78 °C rule held 2 minutes), only the
  ``SYS_ADMIN`` capability the profiling fields need, and the kubelet pod-resources socket mounted
  read-only to map GPUs to pods. It tolerates the pool taints and the health taint: a quarantined node is
  exactly where temperature must keep being measured.
* **ib-exporter** (DaemonSet, GPU pools): non-root, read-only root filesystem, no capabilities, the host's
  ``/sys`` mounted read-only. Its ServiceMonitor adds the ``node`` label the alert rules join on.
* **PrometheusRule**: :func:`components.alert_rules.build_rule_spec` with thresholds from the stack, so
  the rules promtool tested are the rules deployed.
* **Dashboards**: JSON from :mod:`components.dashboards.gpu_fleet` and :mod:`components.dashboards.gpu_health`
  (quarantines, gang restarts, time between failures) in ConfigMaps labelled ``grafana_dashboard: "1"``.
* **health-guard**: :mod:`components.health_guard` (two replicas, one active through a Lease; least-privilege
  RBAC), settings from :func:`components.health_guard.settings_from_config`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi_kubernetes as k8s

from agents.health_guard.contract import APP as GUARD_APP
from agents.health_guard.contract import Names as HealthNames
from agents.ib_exporter import contract as ib_contract
from components import dcgm_counters, images, rbac
from components.alert_rules import build_rule_spec
from components.alert_thresholds import AlertThresholds
from components.config import ClusterConfig, GpuPool, Observability
from components.dashboards import gpu_fleet, gpu_health
from components.dashboards.grafana import Scope
from components.health_guard import HealthGuard, HealthGuardArgs
from components.naming import ONPREM, Keys, common_labels, selector_labels
from components.security import (
    checkov_skips,
    container_security_context,
    kube_score_ignores,
    pod_security_context,
    resources,
)
from components.system_agent import Scrape

DCGM_APP = "dcgm-exporter"
IB_APP = ib_contract.APP
DCGM_PORT = 9400
COUNTERS_KEY = "counters.csv"
DCGM_CONFIG_DIR = "/etc/dcgm-exporter/custom"
#: Where dcgm-exporter looks for the kubelet's pod-resources socket, in its container; the host side is under the
#: stack's ``kubeletRootDir``.
POD_RESOURCES_DIR = "/var/lib/kubelet/pod-resources"
HOST_SYS = ib_contract.HOST_SYSFS_ROOT
DASHBOARD_KEY = "gpu-fleet.json"
HEALTH_DASHBOARD_KEY = "gpu-health.json"
DASHBOARD_LABEL = {"grafana_dashboard": "1"}

Rule = rbac.Rule

#: dcgm-exporter's allow-listed privileges (policies.rules.allow_lists.privileged_agents), skipped in checkov
#: on its DaemonSet only.
DCGM_CHECKOV_SKIPS = {
    "CKV_K8S_23": "DCGM host engine runs as root (allow-listed in policies/rules/allow_lists.py)",
    "CKV_K8S_40": "DCGM host engine runs as root, uid 0 (allow-listed in policies/rules/allow_lists.py)",
    "CKV_K8S_25": "adds SYS_ADMIN only, for DCGM profiling fields (allow-listed in policies/rules/allow_lists.py)",
    "CKV_K8S_39": "CAP_SYS_ADMIN for DCGM profiling fields; never privileged (allow-listed)",
}
#: The same decisions for kube-score, on the DaemonSet only.
DCGM_KUBE_SCORE_IGNORES = {
    "container-security-context-user-group-id": "DCGM host engine runs as root, uid/gid 0 (allow-listed)",
    "pod-probes-identical": "dcgm-exporter serves one health endpoint (/health); /metrics would read the GPUs "
                            "on every probe",
}


def kube_state_label(key: str) -> str:
    """How kube-state-metrics spells a Kubernetes label in ``kube_*_labels`` series."""
    return "label_" + re.sub(r"[^a-zA-Z0-9_]", "_", key)


def alert_thresholds(cfg: ClusterConfig) -> AlertThresholds:
    """The alert rules' thresholds from the stack: one source for rules, guard and dashboard."""
    o = cfg.observability
    return AlertThresholds(
        thermal=o.thermal(),
        critical_xids=tuple(o.health.fatal_xids),
        ib_nominal_rate_bytes_per_second=o.ib_nominal_rate_gbps * 1e9 / 8,
        hang_window_seconds=o.hang_window_minutes * 60,
        heartbeat_metric=o.step_heartbeat_metric,
        checkpoint_budget_seconds=float(cfg.checkpoint.budget.seconds),
        label_prefix=cfg.label_prefix,
        workload_label=kube_state_label(Keys(cfg.label_prefix).workload),
        handover_timeout_seconds=cfg.burst.handover.timeout_seconds,
    )


@dataclass(frozen=True)
class ObservabilityArgs:
    observability: Observability
    pools: list[GpuPool]
    keys: Keys
    #: Where the exporters run: the one namespace that admits privileged pods (``telemetryNamespace``).
    telemetry_namespace: str
    monitoring_namespace: str
    priority_class: str
    system_pool_selector: dict[str, str]
    thresholds: AlertThresholds
    guard: HealthGuardArgs
    dashboard: gpu_fleet.DashboardOptions
    health_dashboard: gpu_health.HealthDashboardOptions
    dcgm_image: str
    ib_image: str
    ib: ib_contract.IbExporterSettings
    #: The kubelet's pod-resources directory on the GPU nodes (``kubeletRootDir``), mounted into dcgm-exporter.
    host_pod_resources_dir: str = POD_RESOURCES_DIR

    @classmethod
    def from_config(cls, cfg: ClusterConfig) -> ObservabilityArgs:
        keys = Keys(cfg.label_prefix)
        o = cfg.observability
        scope = Scope(
            pool_label=kube_state_label(keys.pool),
            job_label=kube_state_label(keys.job),
            workload_label=kube_state_label(keys.workload),
            location_label=kube_state_label(keys.location),
            gpu_pools=tuple(p.name for p in cfg.pools),
        )
        return cls(
            observability=o,
            pools=list(cfg.pools),
            keys=keys,
            telemetry_namespace=cfg.telemetry_namespace,
            monitoring_namespace=cfg.monitoring_namespace,
            priority_class=cfg.priorities.system.name,
            system_pool_selector=cfg.system_pool_selector,
            thresholds=alert_thresholds(cfg),
            guard=HealthGuardArgs.from_config(cfg),
            dashboard=gpu_fleet.DashboardOptions(
                thermal=o.thermal(),
                burst_taint_key=keys.burst_taint,
                health_taint_key=HealthNames(cfg.label_prefix).taint,
                scope=scope,
            ),
            health_dashboard=gpu_health.HealthDashboardOptions(
                health_taint_key=HealthNames(cfg.label_prefix).taint,
                repaired_key=HealthNames(cfg.label_prefix).repaired,
                scope=scope,
            ),
            dcgm_image=images.DCGM_EXPORTER,
            ib_image=images.agent_image(IB_APP, cfg.agent_registry),
            ib=ib_exporter_settings(cfg),
            host_pod_resources_dir=cfg.pod_resources_dir,
        )


def _gpu_pool_affinity(args: ObservabilityArgs) -> k8s.core.v1.AffinityArgs:
    """Only nodes of our GPU pools: virtual nodes and the system pool have no GPUs or HCAs of ours."""
    return k8s.core.v1.AffinityArgs(
        node_affinity=k8s.core.v1.NodeAffinityArgs(
            required_during_scheduling_ignored_during_execution=k8s.core.v1.NodeSelectorArgs(
                node_selector_terms=[
                    k8s.core.v1.NodeSelectorTermArgs(
                        match_expressions=[
                            k8s.core.v1.NodeSelectorRequirementArgs(
                                key=args.keys.pool, operator="In", values=sorted(p.name for p in args.pools)
                            ),
                            k8s.core.v1.NodeSelectorRequirementArgs(
                                key=args.keys.location, operator="In", values=[ONPREM]
                            ),
                        ]
                    )
                ]
            )
        )
    )


def _gpu_node_tolerations(args: ObservabilityArgs) -> list[k8s.core.v1.TolerationArgs]:
    """Each pool's taint, the guard's switch-fault and health taints (measuring must go on where the guard pulled
    the node or its leaf: the release depends on it), the burst handover's reservation (a node cleared for waiting
    training is still measured) and the warm spares' taint."""
    tolerations = [
        k8s.core.v1.TolerationArgs(key=args.keys.pool, operator="Equal", value=p.name, effect="NoSchedule")
        for p in sorted(args.pools, key=lambda p: p.name)
        if p.taint
    ]
    names = args.guard.settings.names
    tolerations += [k8s.core.v1.TolerationArgs(key=key, operator="Exists", effect="NoSchedule")
                    for key in (names.switch_fault, names.taint, args.keys.reserved_taint)]
    if any(p.spares for p in args.pools):
        # A warm spare is watched like any node: a spare that went bad must never be handed to a gang.
        tolerations.append(k8s.core.v1.TolerationArgs(key=args.keys.spare_taint, operator="Exists",
                                                      effect="NoSchedule"))
    return tolerations


def _node_name_env() -> k8s.core.v1.EnvVarArgs:
    return k8s.core.v1.EnvVarArgs(
        name="NODE_NAME",
        value_from=k8s.core.v1.EnvVarSourceArgs(
            field_ref=k8s.core.v1.ObjectFieldSelectorArgs(field_path="spec.nodeName")
        ),
    )


def _node_relabeling() -> list[dict[str, Any]]:
    """Every scraped series gets ``node``: the alert rules join InfiniBand and GPU series on it."""
    return [
        {"sourceLabels": ["__meta_kubernetes_pod_node_name"], "targetLabel": "node", "action": "replace"},
    ]


#: The target labels the operator always sets from the scraped pod, which dcgm-exporter also uses for the pod
#: that holds each GPU.
WORKLOAD_LABELS = ("namespace", "pod", "container")


def _gpu_workload_relabeling() -> list[dict[str, Any]]:
    """dcgm-exporter's ``namespace``/``pod``/``container`` name the workload that holds each GPU.

    The operator sets the same three target labels to the exporter's own pod, so by default the workload's
    become ``exported_*`` and every GPU seems to belong to the exporter; ``honorLabels`` alone would keep
    the workload's but still stamp the exporter's pod on GPUs no pod holds. Dropping the three target
    labels leaves exactly dcgm-exporter's: a GPU no pod holds has no ``pod`` label (``pod=""`` in PromQL).
    The exporter stays identified by ``instance`` and ``exporter_pod``.
    """
    return [
        {"sourceLabels": ["__meta_kubernetes_pod_name"], "targetLabel": "exporter_pod", "action": "replace"},
        {"regex": "|".join(WORKLOAD_LABELS), "action": "labeldrop"},
    ]


class ObservabilityStack(pulumi.ComponentResource):
    """DCGM exporter, InfiniBand exporter, scrape configs, alert rules, dashboards and health guard."""

    rule_names: pulumi.Output[list[str]]
    health_taint: pulumi.Output[str]

    def __init__(self, name: str, args: ObservabilityArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("gpu-cluster:observability:ObservabilityStack", name, None, opts)
        self.args = args
        o = args.observability
        self.dcgm = self._dcgm_exporter()
        self.ib_exporter = self._ib_exporter() if o.ib_exporter else None
        spec = build_rule_spec(args.thresholds)
        meta = k8s.meta.v1.ObjectMetaArgs
        rules_labels = {**common_labels("gpu-alerts", "alert-rules"), **o.monitor_labels}
        self.rules = k8s.apiextensions.CustomResource(
            "gpu-alerts",
            api_version="monitoring.coreos.com/v1",
            kind="PrometheusRule",
            metadata=meta(name="gpu-alerts", namespace=args.monitoring_namespace, labels=rules_labels),
            spec=spec,
            opts=pulumi.ResourceOptions(parent=self),
        )
        self.dashboard = (
            k8s.core.v1.ConfigMap(
                "gpu-fleet-dashboard",
                metadata=meta(
                    name="gpu-fleet-dashboard",
                    namespace=args.monitoring_namespace,
                    labels={**common_labels("gpu-fleet-dashboard", "dashboard"), **DASHBOARD_LABEL},
                ),
                data={DASHBOARD_KEY: gpu_fleet.render(args.dashboard)},
                opts=pulumi.ResourceOptions(parent=self),
            )
            if o.dashboards
            else None
        )
        self.health_dashboard = (
            k8s.core.v1.ConfigMap(
                "gpu-health-dashboard",
                metadata=meta(
                    name="gpu-health-dashboard",
                    namespace=args.monitoring_namespace,
                    labels={**common_labels("gpu-health-dashboard", "dashboard"), **DASHBOARD_LABEL},
                ),
                data={HEALTH_DASHBOARD_KEY: gpu_health.render(args.health_dashboard)},
                opts=pulumi.ResourceOptions(parent=self),
            )
            if o.dashboards
            else None
        )
        self.guard = self._health_guard() if o.health_guard else None
        self.rule_names = pulumi.Output.from_input(
            [rule["alert"] for group in spec["groups"] for rule in group["rules"]]
        )
        self.health_taint = pulumi.Output.from_input(args.guard.settings.names.taint)
        self.register_outputs({"rule_names": self.rule_names, "health_taint": self.health_taint})

    # ------------------------------------------------------------------ scraping helper

    def _service_and_monitor(
        self, app: str, labels: dict[str, str], namespace: str, port: int, depends: list[pulumi.Resource],
        relabelings: list[dict[str, Any]],
    ) -> k8s.apiextensions.CustomResource:
        meta = k8s.meta.v1.ObjectMetaArgs
        selector = selector_labels(labels)
        service = k8s.core.v1.Service(
            f"{app}-metrics",
            metadata=meta(name=f"{app}-metrics", namespace=namespace, labels=labels),
            spec=k8s.core.v1.ServiceSpecArgs(
                selector=selector,
                ports=[k8s.core.v1.ServicePortArgs(name="metrics", port=port, target_port="metrics")],
            ),
            opts=pulumi.ResourceOptions(parent=self, depends_on=depends),
        )
        return k8s.apiextensions.CustomResource(
            f"{app}-servicemonitor",
            api_version="monitoring.coreos.com/v1",
            kind="ServiceMonitor",
            metadata=meta(name=app, namespace=namespace, labels={**labels, **self.args.observability.monitor_labels}),
            spec={
                "selector": {"matchLabels": selector},
                "namespaceSelector": {"matchNames": [namespace]},
                "endpoints": [
                    {
                        "port": "metrics",
                        "path": "/metrics",
                        "interval": f"{self.args.observability.scrape_interval_seconds}s",
                        "relabelings": relabelings,
                    }
                ],
            },
            opts=pulumi.ResourceOptions(parent=self, depends_on=[service]),
        )

    # ------------------------------------------------------------------ GPU-node DaemonSets

    def _gpu_node_daemonset(
        self,
        app: str,
        labels: dict[str, str],
        port: int,
        *,
        pod_security: k8s.core.v1.PodSecurityContextArgs,
        container: k8s.core.v1.ContainerArgs,
        volumes: list[k8s.core.v1.VolumeArgs],
        depends_on: list[pulumi.Resource],
        annotations: dict[str, str] | None = None,
        runtime_class: str | None = None,
        relabelings: list[dict[str, Any]] | None = None,
    ) -> k8s.apps.v1.DaemonSet:
        """A telemetry exporter on every node of our GPU pools, with its tokenless ServiceAccount and scraping.

        The exporters read the node, never the API server: no token is mounted. Rolling 10% at a time keeps
        most of the fleet measured during an update. They run in the telemetry namespace, the only one that
        admits what they need (root and SYS_ADMIN, hostPath), apart from the controllers.
        """
        args = self.args
        ns = args.telemetry_namespace
        meta = k8s.meta.v1.ObjectMetaArgs
        sa = rbac.service_account(app, ns, labels, self, automount_token=False).service_account
        daemonset = k8s.apps.v1.DaemonSet(
            app,
            metadata=meta(name=app, namespace=ns, labels=labels, annotations=annotations),
            spec=k8s.apps.v1.DaemonSetSpecArgs(
                selector=k8s.meta.v1.LabelSelectorArgs(match_labels=selector_labels(labels)),
                update_strategy=k8s.apps.v1.DaemonSetUpdateStrategyArgs(
                    type="RollingUpdate",
                    rolling_update=k8s.apps.v1.RollingUpdateDaemonSetArgs(max_unavailable="10%"),
                ),
                template=k8s.core.v1.PodTemplateSpecArgs(
                    metadata=meta(labels=labels),
                    spec=k8s.core.v1.PodSpecArgs(
                        service_account_name=app,
                        automount_service_account_token=False,
                        priority_class_name=args.priority_class,
                        runtime_class_name=runtime_class,
                        affinity=_gpu_pool_affinity(args),
                        tolerations=_gpu_node_tolerations(args),
                        security_context=pod_security,
                        containers=[container],
                        volumes=volumes,
                    ),
                ),
            ),
            opts=pulumi.ResourceOptions(parent=self, depends_on=[*depends_on, sa]),
        )
        self._service_and_monitor(app, labels, ns, port, [daemonset], [*_node_relabeling(), *(relabelings or [])])
        return daemonset

    # ------------------------------------------------------------------ DCGM

    def _dcgm_exporter(self) -> k8s.apps.v1.DaemonSet:
        args = self.args
        ns = args.telemetry_namespace
        labels = common_labels(DCGM_APP, "gpu-telemetry", args.dcgm_image.rsplit(":", 1)[-1])
        counters = k8s.core.v1.ConfigMap(
            f"{DCGM_APP}-counters",
            metadata=k8s.meta.v1.ObjectMetaArgs(name=f"{DCGM_APP}-counters", namespace=ns, labels=labels),
            data={COUNTERS_KEY: dcgm_counters.render()},
            opts=pulumi.ResourceOptions(parent=self),
        )
        env = [
            k8s.core.v1.EnvVarArgs(name="DCGM_EXPORTER_COLLECTORS", value=f"{DCGM_CONFIG_DIR}/{COUNTERS_KEY}"),
            k8s.core.v1.EnvVarArgs(name="DCGM_EXPORTER_INTERVAL", value=str(args.observability.dcgm_interval_ms)),
            k8s.core.v1.EnvVarArgs(name="DCGM_EXPORTER_LISTEN", value=f":{DCGM_PORT}"),
            k8s.core.v1.EnvVarArgs(name="DCGM_EXPORTER_KUBERNETES", value="true"),
            k8s.core.v1.EnvVarArgs(name="NVIDIA_VISIBLE_DEVICES", value="all"),
            # The pinned exporter fills its ``Hostname`` label from NODE_NAME: the health guard and the
            # alert rules find the node by it.
            _node_name_env(),
        ]
        return self._gpu_node_daemonset(
            DCGM_APP,
            labels,
            DCGM_PORT,
            annotations={**checkov_skips(DCGM_CHECKOV_SKIPS), **kube_score_ignores(DCGM_KUBE_SCORE_IGNORES)},
            runtime_class=args.observability.dcgm_runtime_class,
            relabelings=_gpu_workload_relabeling(),
            # DCGM's host engine needs root; it gets SYS_ADMIN only (allow-listed), never privileged.
            pod_security=pod_security_context(run_as_non_root=False, run_as_user=0, run_as_group=0, fs_group=None),
            container=k8s.core.v1.ContainerArgs(
                name=DCGM_APP,
                image=args.dcgm_image,
                env=env,
                ports=[k8s.core.v1.ContainerPortArgs(name="metrics", container_port=DCGM_PORT)],
                readiness_probe=k8s.core.v1.ProbeArgs(
                    http_get=k8s.core.v1.HTTPGetActionArgs(path="/health", port="metrics"),
                    period_seconds=10,
                ),
                liveness_probe=k8s.core.v1.ProbeArgs(
                    http_get=k8s.core.v1.HTTPGetActionArgs(path="/health", port="metrics"),
                    initial_delay_seconds=45,
                    period_seconds=20,
                    failure_threshold=6,
                ),
                resources=resources("100m", "512Mi"),
                security_context=container_security_context(
                    run_as_non_root=False,
                    capabilities=k8s.core.v1.CapabilitiesArgs(drop=["ALL"], add=["SYS_ADMIN"]),
                ),
                volume_mounts=[
                    k8s.core.v1.VolumeMountArgs(name="counters", mount_path=DCGM_CONFIG_DIR, read_only=True),
                    k8s.core.v1.VolumeMountArgs(name="pod-resources", mount_path=POD_RESOURCES_DIR, read_only=True),
                    k8s.core.v1.VolumeMountArgs(name="tmp", mount_path="/tmp"),
                ],
            ),
            volumes=[
                k8s.core.v1.VolumeArgs(
                    name="counters",
                    config_map=k8s.core.v1.ConfigMapVolumeSourceArgs(name=f"{DCGM_APP}-counters"),
                ),
                k8s.core.v1.VolumeArgs(
                    name="pod-resources",
                    host_path=k8s.core.v1.HostPathVolumeSourceArgs(path=args.host_pod_resources_dir,
                                                                   type="Directory"),
                ),
                k8s.core.v1.VolumeArgs(name="tmp", empty_dir=k8s.core.v1.EmptyDirVolumeSourceArgs(size_limit="64Mi")),
            ],
            depends_on=[counters],
        )

    # ------------------------------------------------------------------ InfiniBand

    def _ib_exporter(self) -> k8s.apps.v1.DaemonSet:
        args = self.args
        port = args.ib.port
        labels = common_labels(IB_APP, "network-telemetry", images.AGENT_VERSION)
        return self._gpu_node_daemonset(
            IB_APP,
            labels,
            port,
            pod_security=pod_security_context(),
            container=k8s.core.v1.ContainerArgs(
                name=IB_APP,
                image=args.ib_image,
                args=args.ib.args(),
                ports=[k8s.core.v1.ContainerPortArgs(name="metrics", container_port=port)],
                readiness_probe=k8s.core.v1.ProbeArgs(
                    http_get=k8s.core.v1.HTTPGetActionArgs(path="/healthz", port="metrics"),
                    period_seconds=10,
                ),
                liveness_probe=k8s.core.v1.ProbeArgs(
                    http_get=k8s.core.v1.HTTPGetActionArgs(path="/livez", port="metrics"),
                    period_seconds=20,
                    failure_threshold=3,
                ),
                resources=resources("50m", "64Mi", cpu_limit="500m"),
                security_context=container_security_context(),
                volume_mounts=[k8s.core.v1.VolumeMountArgs(name="sys", mount_path=HOST_SYS, read_only=True)],
            ),
            volumes=[
                k8s.core.v1.VolumeArgs(
                    name="sys",
                    host_path=k8s.core.v1.HostPathVolumeSourceArgs(path="/sys", type="Directory"),
                )
            ],
            depends_on=[],
        )

    # ------------------------------------------------------------------ health guard

    def _health_guard(self) -> HealthGuard:
        """The guard (components.health_guard) as a child, scraped like the other agents (``honorLabels``)."""
        guard = HealthGuard(GUARD_APP, self.args.guard, pulumi.ResourceOptions(parent=self))
        # This component created the guard's Service and ServiceMonitor before the agent builder did.
        guard.agent.scrape(self.args.guard.port, Scrape.of(self.args.observability), depends_on=[guard.deployment],
                           alias_parent=self)
        return guard


def summary_rows(cfg: ClusterConfig) -> list[tuple[str, str]]:
    """Observability settings for the preview summary (the health guard has its own rows)."""
    o = cfg.observability
    return [
        (
            "thermal limit",
            f"{o.thermal_threshold_celsius} °C for {o.thermal_hold_seconds}s → "
            f"{HealthNames(cfg.label_prefix).taint}=degraded:NoSchedule (health guard)",
        ),
        ("dcgm interval", f"{o.dcgm_interval_ms} ms ({images.DCGM_EXPORTER})"),
        ("ib-exporter", "on GPU pools" if o.ib_exporter else "off"),
        ("health guard", f"poll {o.health_guard_poll_seconds}s" if o.health_guard else "off (alerts only)"),
    ]


def ib_exporter_settings(cfg: ClusterConfig) -> ib_contract.IbExporterSettings:
    """The exporter's settings in the stack: the host's sysfs as the DaemonSet mounts it, the configured port."""
    return ib_contract.IbExporterSettings(sysfs_root=ib_contract.HOST_SYSFS_ROOT,
                                          port=cfg.observability.ib_exporter_port)
