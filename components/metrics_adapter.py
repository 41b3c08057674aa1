"""The metrics adapter: request-level inference metrics from Prometheus for the HPA.

queue-depth (External) and in-flight (Pods) come from Prometheus through **prometheus-adapter**, not
KEDA: the HPA stays our own object with the same behaviour block for every metric, the adapter is a
handful of first-class objects (no CRDs, no operator, no webhooks) and registers only
custom.metrics.k8s.io and external.metrics.k8s.io, leaving metrics.k8s.io to metrics-server.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi_kubernetes as k8s
import yaml

from components import forecast, rbac
from components.config import (
    ClusterConfig,
    InferenceService,
    MetricsAdapter,
    ScalingMetric,
)
from components.images import image_version
from components.naming import (
    common_labels,
    selector_labels,
)
from components.security import (
    API_CLIENT,
    checkov_skips,
    container_security_context,
    pod_security_context,
    resources,
    scratch_volume,
    serving_certificate,
)
from components.workloads import (
    UNHEALTHY_POD_EVICTION,
    spread_across_nodes,
)

ADAPTER = "prometheus-adapter"
ADAPTER_PORT = 6443
#: Prometheus series per request-level metric, unless the service names its own.
DEFAULT_SERIES: dict[ScalingMetric, str] = {
    ScalingMetric.QUEUE_DEPTH: "inference_queue_depth",
    ScalingMetric.IN_FLIGHT: "inference_requests_in_flight",
}
#: The label on queue-depth series that names the inference service the queue feeds.
QUEUE_SERVICE_LABEL = "service"
ADAPTED = (ScalingMetric.QUEUE_DEPTH, ScalingMetric.IN_FLIGHT)


def series(service: InferenceService) -> str:
    return service.scaling.prometheus_series or DEFAULT_SERIES[service.scaling.metric]


@dataclass(frozen=True)
class MetricsAdapterArgs:
    adapter: MetricsAdapter
    namespace: str
    prometheus_url: str
    services: list[InferenceService]
    priority_class: str
    system_pool_selector: dict[str, str]

    @classmethod
    def from_config(cls, cfg: ClusterConfig) -> MetricsAdapterArgs:
        adapter = cfg.inference.adapter
        url = adapter.prometheus_url or f"http://prometheus-operated.{cfg.monitoring_namespace}.svc:9090/"
        return cls(
            adapter=adapter,
            namespace=cfg.system_namespace,
            prometheus_url=url,
            services=[s for s in cfg.inference.services if s.scaling.metric in ADAPTED],
            priority_class=cfg.priorities.system.name,
            system_pool_selector=cfg.system_pool_selector,
        )


def adapter_rules(services: list[InferenceService]) -> dict[str, Any]:
    """prometheus-adapter rules: in-flight as a per-pod custom metric, queue depth as an external one."""
    pods_series = sorted({series(s) for s in services if s.scaling.metric is ScalingMetric.IN_FLIGHT})
    queue_series = sorted({series(s) for s in services if s.scaling.metric is ScalingMetric.QUEUE_DEPTH})
    rules = [
        {
            "seriesQuery": f'{name}{{namespace!="",pod!=""}}',
            "resources": {"overrides": {"namespace": {"resource": "namespace"}, "pod": {"resource": "pod"}}},
            "name": {"matches": f"^{name}$", "as": name},
            "metricsQuery": "sum(<<.Series>>{<<.LabelMatchers>>}) by (<<.GroupBy>>)",
        }
        for name in pods_series
    ]
    external = [
        {
            # Queue exporters run anywhere; the metric is cluster-wide and selected by service label.
            "seriesQuery": f'{name}{{{QUEUE_SERVICE_LABEL}!=""}}',
            "resources": {"namespaced": False},
            "name": {"matches": f"^{name}$", "as": name},
            "metricsQuery": f"max(<<.Series>>{{<<.LabelMatchers>>}}) by ({QUEUE_SERVICE_LABEL})",
        }
        for name in queue_series
    ]
    external += forecast.adapter_rules(forecast.rules_for(services, series))
    return {"rules": rules, "externalRules": external}


#: Upstream prometheus-adapter's resource-reader ClusterRole: map series labels to objects.
ADAPTER_RULES: tuple[k8s.rbac.v1.PolicyRuleArgs, ...] = (
    k8s.rbac.v1.PolicyRuleArgs(api_groups=[""], resources=["nodes", "namespaces", "pods", "services"],
                               verbs=["get", "list", "watch"]),
)
#: The API groups the adapter serves (metrics.k8s.io stays with metrics-server).
ADAPTER_APIS = ("custom.metrics.k8s.io", "external.metrics.k8s.io")


class PrometheusAdapter(pulumi.ComponentResource):
    """prometheus-adapter as first-class objects: RBAC, rules, Deployment, Service, APIServices."""

    def __init__(self, name: str, args: MetricsAdapterArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("gpu-cluster:inference:PrometheusAdapter", name, None, opts)
        ns = args.namespace
        a = args.adapter
        labels = common_labels(ADAPTER, "metrics-adapter", image_version(a.image))
        selector = selector_labels(labels)
        meta = k8s.meta.v1.ObjectMetaArgs
        child = pulumi.ResourceOptions(parent=self)
        account = rbac.service_account(ADAPTER, ns, labels, self)
        subject = account.subject
        reader = rbac.cluster_role_with_binding(
            f"{ADAPTER}-reader", f"{ADAPTER}-reader", name=f"gpu-cluster:{ADAPTER}", rules=ADAPTER_RULES,
            subject=subject, labels=labels, parent=self, depends_on=[account.service_account],
        )
        after_sa = [account.service_account, reader.role]
        bindings = [
            reader.binding,
            # An aggregated API server delegates authn/authz to the kube-apiserver...
            rbac.bind_cluster_role(
                f"{ADAPTER}-auth-delegator", name=f"gpu-cluster:{ADAPTER}:auth-delegator",
                role="system:auth-delegator", subject=subject, labels=labels, parent=self, depends_on=after_sa,
            ),
            # ...and reads the client-CA ConfigMap in kube-system.
            rbac.bind_role(
                f"{ADAPTER}-auth-reader", name=f"gpu-cluster:{ADAPTER}:auth-reader", namespace="kube-system",
                role="extension-apiserver-authentication-reader", subject=subject, labels=labels, parent=self,
                depends_on=after_sa,
            ),
        ]
        config = k8s.core.v1.ConfigMap(
            f"{ADAPTER}-config",
            metadata=meta(name=f"{ADAPTER}-config", namespace=ns, labels=labels),
            data={"config.yaml": yaml.safe_dump(adapter_rules(args.services), sort_keys=False)},
            opts=child,
        )
        # The APIServices verify the adapter's certificate: a CA the stack manages (cert-manager) signs it, and
        # cert-manager's CA injector puts that CA into each APIService's caBundle.
        cert_secret, certificate, inject_ca = serving_certificate(
            self, ADAPTER, ns, [f"{ADAPTER}.{ns}.svc", f"{ADAPTER}.{ns}.svc.cluster.local"], labels)
        deployment = k8s.apps.v1.Deployment(
            ADAPTER,
            metadata=meta(name=ADAPTER, namespace=ns, labels=labels,
                          annotations=checkov_skips({"CKV_K8S_38": API_CLIENT})),
            spec=k8s.apps.v1.DeploymentSpecArgs(
                replicas=a.replicas,
                selector=k8s.meta.v1.LabelSelectorArgs(match_labels=selector),
                template=k8s.core.v1.PodTemplateSpecArgs(
                    metadata=meta(labels=labels),
                    spec=k8s.core.v1.PodSpecArgs(
                        service_account_name=ADAPTER,
                        priority_class_name=args.priority_class,
                        node_selector=args.system_pool_selector,
                        # Replicas on different nodes: one node down must not take every HPA's metrics with it.
                        affinity=spread_across_nodes(selector),
                        security_context=pod_security_context(),
                        containers=[k8s.core.v1.ContainerArgs(
                            name=ADAPTER,
                            image=a.image,
                            args=[
                                "--tls-cert-file=/var/run/serving-cert/tls.crt",
                                "--tls-private-key-file=/var/run/serving-cert/tls.key",
                                "--config=/etc/adapter/config.yaml",
                                f"--prometheus-url={args.prometheus_url}",
                                f"--metrics-relist-interval={a.relist_interval_seconds}s",
                                f"--secure-port={ADAPTER_PORT}",
                                "--v=2",
                            ],
                            ports=[k8s.core.v1.ContainerPortArgs(name="https", container_port=ADAPTER_PORT)],
                            readiness_probe=k8s.core.v1.ProbeArgs(
                                http_get=k8s.core.v1.HTTPGetActionArgs(path="/readyz", port="https", scheme="HTTPS"),
                                period_seconds=10,
                            ),
                            # The generic API server's own liveness endpoint: it does not depend on Prometheus.
                            liveness_probe=k8s.core.v1.ProbeArgs(
                                http_get=k8s.core.v1.HTTPGetActionArgs(path="/livez", port="https", scheme="HTTPS"),
                                initial_delay_seconds=30,
                                period_seconds=10,
                                timeout_seconds=5,
                                failure_threshold=6,
                            ),
                            resources=resources("250m", "512Mi"),
                            security_context=container_security_context(),
                            volume_mounts=[
                                k8s.core.v1.VolumeMountArgs(name="config", mount_path="/etc/adapter", read_only=True),
                                k8s.core.v1.VolumeMountArgs(name="serving-cert", mount_path="/var/run/serving-cert",
                                                            read_only=True),
                                k8s.core.v1.VolumeMountArgs(name="tmp", mount_path="/tmp"),
                            ],
                        )],
                        volumes=[
                            k8s.core.v1.VolumeArgs(name="config", config_map=k8s.core.v1.ConfigMapVolumeSourceArgs(
                                name=f"{ADAPTER}-config")),
                            k8s.core.v1.VolumeArgs(name="serving-cert", secret=k8s.core.v1.SecretVolumeSourceArgs(
                                secret_name=cert_secret, default_mode=0o440)),
                            scratch_volume(),
                        ],
                    ),
                ),
            ),
            opts=pulumi.ResourceOptions(parent=self, depends_on=[config, certificate, *bindings]),
        )
        # An unavailable APIService stops every custom/external-metric HPA: drains take one replica at a time.
        k8s.policy.v1.PodDisruptionBudget(
            f"{ADAPTER}-pdb",
            metadata=meta(name=ADAPTER, namespace=ns, labels=labels),
            spec=k8s.policy.v1.PodDisruptionBudgetSpecArgs(
                max_unavailable=1, selector=k8s.meta.v1.LabelSelectorArgs(match_labels=selector),
                unhealthy_pod_eviction_policy=UNHEALTHY_POD_EVICTION),
            opts=child,
        )
        service = k8s.core.v1.Service(
            f"{ADAPTER}-service",
            metadata=meta(name=ADAPTER, namespace=ns, labels=labels),
            spec=k8s.core.v1.ServiceSpecArgs(
                selector=selector,
                ports=[k8s.core.v1.ServicePortArgs(name="https", port=443, target_port="https")],
            ),
            opts=child,
        )
        for group in ADAPTER_APIS:
            k8s.apiregistration.v1.APIService(
                f"{ADAPTER}-{group.split('.')[0]}",
                metadata=meta(name=f"v1beta1.{group}", labels=labels, annotations=inject_ca),
                spec=k8s.apiregistration.v1.APIServiceSpecArgs(
                    group=group,
                    version="v1beta1",
                    service=k8s.apiregistration.v1.ServiceReferenceArgs(name=ADAPTER, namespace=ns, port=443),
                    group_priority_minimum=100,
                    version_priority=100,
                    # No caBundle here: cert-manager injects it (annotation above); the API server verifies TLS.
                ),
                opts=pulumi.ResourceOptions(parent=self, depends_on=[deployment, service],
                                            ignore_changes=["spec.caBundle"]),
            )
        self.register_outputs({"apis": list(ADAPTER_APIS)})
