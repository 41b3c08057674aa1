"""One inference service: Deployment, Service, HPA, PDB and its traffic wiring.

Placement. Every replica goes through the gang scheduler (Volcano) in the reclaimable inference queue,
annotated preemptable, at the inference priority: a training gang takes its GPUs back. Replicas
require one of our GPU nodes and prefer on-prem; they tolerate their pool's taint and the providers'
own taints (NoSchedule only) but never the burst taint, so they reach a virtual node only while the
burst controller has it open, and the descheduler brings them back when it closes.

Traffic follows the pods through the service's declared shape: ``queue-worker`` replicas pull from a
broker every location reaches (URL and credentials from config and secret config); ``gateway``
services get an HTTPRoute to one Service over every ready replica, so each location receives requests
in proportion to its ready replicas. Fixed on-prem/external weights were rejected: outside a burst the
external backend is empty and its share of requests would fail. Gateway services burst only onto
providers with cluster-routable pod IPs (the config refuses a gateway service without one).

Scaling. ``autoscaling/v2`` HPA with explicit behaviour: scale-up at once (stabilization from config),
scale-down slow (stabilization and a percent-per-minute cap).
cpu/memory use Resource metrics; request-level metrics come through ``components.metrics_adapter``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

import pulumi
import pulumi_kubernetes as k8s

from agents.burst_controller.contract import return_deployment, standby_deployment, warm_deployment
from agents.health_guard.contract import Names as HealthNames
from components import forecast
from components.config import (
    ClusterConfig,
    ExternalProvider,
    GatewayRef,
    GpuPool,
    InferenceService,
    ScalingMetric,
    TrafficShape,
)
from components.images import image_version
from components.metrics_adapter import QUEUE_SERVICE_LABEL, series
from components.naming import (
    EXTERNAL,
    INFERENCE,
    ONPREM,
    RETURN,
    STANDBY,
    VOLCANO_PREEMPTABLE_ANNOTATION,
    VOLCANO_QUEUE_ANNOTATION,
    WARM,
    Keys,
    common_labels,
    selector_labels,
)
from components.node_pools import pool_toleration
from components.provider_rank import provider_weights
from components.providers import provider_toleration
from components.security import (
    checkov_skips,
    container_security_context,
    pod_security_context,
    scratch_volume,
    with_ephemeral_storage,
)
from components.stack import secret_value
from components.workloads import (
    UNHEALTHY_POD_EVICTION,
    gpu_resources,
    prefer_onprem_affinity,
    provider_preferences,
)

#: Probe period for the startup and liveness probes on the server's readiness path.
PROBE_PERIOD_SECONDS = 10
#: Liveness restarts a replica only after a minute of failed checks, each allowed 5 s: a server busy with
#: long generations answers its health path slowly, and restarting it under load would make it worse.
LIVENESS_FAILURES = 6
LIVENESS_TIMEOUT_SECONDS = 5
#: An inference server's scratch (/tmp: request payloads, decoded media) and its ephemeral storage: the
#: scratch plus its logs. Past the limit the kubelet evicts the replica instead of filling the node's disk.
SERVER_SCRATCH_LIMIT = "4Gi"
SERVER_EPHEMERAL_REQUEST = "1Gi"
SERVER_EPHEMERAL_LIMIT = "5Gi"


@dataclass(frozen=True)
class InferenceServiceArgs:
    service: InferenceService
    namespace: str
    label_prefix: str
    gpu_resource: str
    scheduler_name: str
    queue: str
    priority_class: str
    pools: list[GpuPool]
    providers: list[ExternalProvider]
    gateway: GatewayRef
    #: Inference runs fine on a hot GPU (training does not), so by default it tolerates the degraded health taint.
    tolerates_thermal: bool = True
    #: A standby Deployment on virtual nodes for the make-before-break handover (config.Handover).
    standby: bool = False
    #: A warm-pool placeholder Deployment on virtual nodes (config.Burst.warmPoolShare), and the
    #: PriorityClass its pods take: the lowest tier's, so a replica outranks them.
    warm: bool = False
    warm_priority_class: str = ""
    #: An on-prem return bridge Deployment for the make-before-break return (config.Burst.returnSurgeShare).
    home: bool = False

    @classmethod
    def from_config(cls, cfg: ClusterConfig, service: InferenceService) -> InferenceServiceArgs:
        pools = [cfg.pool(service.pool)] if service.pool is not None else list(cfg.pools)
        providers = list(cfg.providers)
        if service.traffic.shape is TrafficShape.GATEWAY:
            providers = [p for p in providers if p.routable]
        return cls(
            service=service,
            namespace=cfg.inference_namespace,
            label_prefix=cfg.label_prefix,
            gpu_resource=cfg.gpu_resource,
            scheduler_name=cfg.scheduling.scheduler_name,
            queue=cfg.scheduling.inference_queue.name,
            priority_class=cfg.priorities.inference.name,
            pools=pools,
            providers=providers,
            gateway=cfg.inference.gateway,
            tolerates_thermal=cfg.observability.inference_tolerates_thermal,
            # One switch with the controller's handover_services; a gateway service always has a routable
            # provider (the config refuses it otherwise), so the standby's provider list is never empty.
            standby=cfg.handover_active,
            warm=cfg.handover_active and (cfg.burst.warm_pool_share > 0 or cfg.burst.warm_pool_ramp_seconds > 0),
            warm_priority_class=cfg.priorities.lowest.name,
            home=cfg.handover_active and cfg.burst.return_surge_share > 0,
        )


def tolerations(args: InferenceServiceArgs) -> list[k8s.core.v1.TolerationArgs]:
    """Its GPU pool(s), their warm spares and the eligible providers' own taints; the burst taint is deliberately
    absent."""
    keys = Keys(args.label_prefix)
    out = [pool_toleration(keys, pool) for pool in args.pools if pool.taint]
    if any(pool.spares for pool in args.pools):
        # A warm spare's GPUs are idle GPUs: inference may use them and yields them to a gang's replacement pod
        # (training's class preempts inference's), as it yields any GPU a gang needs.
        out.append(k8s.core.v1.TolerationArgs(key=keys.spare_taint, operator="Exists", effect="NoSchedule"))
    out += [provider_toleration(p) for p in args.providers]
    if args.tolerates_thermal:
        # The health guard's degraded class (a hot GPU, an NVLink or InfiniBand error burst): inference runs
        # fine there; fatal nodes are tolerated by nothing.
        health = HealthNames(args.label_prefix).taint
        out.append(k8s.core.v1.TolerationArgs(key=health, operator="Equal", value="degraded", effect="NoSchedule"))
    return out


class ServerProbes(NamedTuple):
    startup: k8s.core.v1.ProbeArgs
    readiness: k8s.core.v1.ProbeArgs
    liveness: k8s.core.v1.ProbeArgs


def server_probes(service: InferenceService) -> ServerProbes:
    """Startup, readiness and liveness on the server's readiness path.

    The startup probe gives a replica ``startupTimeoutSeconds`` to load its model; only then does the
    liveness probe run, so a slow load is never mistaken for a hang, and a wedged server is restarted.
    """
    def probe(period_seconds: int, failure_threshold: int, timeout_seconds: int | None = None,
              path: str | None = service.readiness_path) -> k8s.core.v1.ProbeArgs:
        return k8s.core.v1.ProbeArgs(
            http_get=k8s.core.v1.HTTPGetActionArgs(path=path, port="http") if path else None,
            # Without a liveness path: the process still accepts connections on its port.
            tcp_socket=None if path else k8s.core.v1.TCPSocketActionArgs(port="http"),
            period_seconds=period_seconds, failure_threshold=failure_threshold, timeout_seconds=timeout_seconds,
        )

    period = PROBE_PERIOD_SECONDS
    return ServerProbes(
        startup=probe(period_seconds=period, failure_threshold=-(-service.startup_timeout_seconds // period)),
        readiness=probe(period_seconds=5, failure_threshold=3),
        # Liveness never asks "can you serve now": a loaded replica that stops being ready is not killed.
        liveness=probe(period_seconds=period, timeout_seconds=LIVENESS_TIMEOUT_SECONDS,
                       failure_threshold=LIVENESS_FAILURES, path=service.liveness_path),
    )


def hpa_metric(service: InferenceService) -> k8s.autoscaling.v2.MetricSpecArgs:
    s = service.scaling
    if s.metric in (ScalingMetric.CPU, ScalingMetric.MEMORY):
        return k8s.autoscaling.v2.MetricSpecArgs(
            type="Resource",
            resource=k8s.autoscaling.v2.ResourceMetricSourceArgs(
                name=s.metric.value,
                target=k8s.autoscaling.v2.MetricTargetArgs(type="Utilization", average_utilization=s.target),
            ),
        )
    if s.metric is ScalingMetric.QUEUE_DEPTH:
        # Jobs waiting per replica: an External metric, so it is the same wherever replicas run.
        return k8s.autoscaling.v2.MetricSpecArgs(
            type="External",
            external=k8s.autoscaling.v2.ExternalMetricSourceArgs(
                metric=k8s.autoscaling.v2.MetricIdentifierArgs(
                    name=series(service),
                    selector=k8s.meta.v1.LabelSelectorArgs(match_labels={QUEUE_SERVICE_LABEL: service.name}),
                ),
                target=k8s.autoscaling.v2.MetricTargetArgs(type="AverageValue", average_value=str(s.target)),
            ),
        )
    return k8s.autoscaling.v2.MetricSpecArgs(
        type="Pods",
        pods=k8s.autoscaling.v2.PodsMetricSourceArgs(
            metric=k8s.autoscaling.v2.MetricIdentifierArgs(name=series(service)),
            target=k8s.autoscaling.v2.MetricTargetArgs(type="AverageValue", average_value=str(s.target)),
        ),
    )


def forecast_metric(service: InferenceService) -> k8s.autoscaling.v2.MetricSpecArgs:
    """The forecast (components/forecast.py) as a second External metric with the demand metric's per-replica
    target: the HPA computes a count from each metric and takes the larger."""
    return k8s.autoscaling.v2.MetricSpecArgs(
        type="External",
        external=k8s.autoscaling.v2.ExternalMetricSourceArgs(
            metric=k8s.autoscaling.v2.MetricIdentifierArgs(
                name=forecast.adapter_name(series(service)),
                selector=k8s.meta.v1.LabelSelectorArgs(match_labels={QUEUE_SERVICE_LABEL: service.name}),
            ),
            target=k8s.autoscaling.v2.MetricTargetArgs(type="AverageValue",
                                                       average_value=str(service.scaling.target)),
        ),
    )


def hpa_metrics(service: InferenceService) -> list[k8s.autoscaling.v2.MetricSpecArgs]:
    """The demand metric, and the forecast when the service sets one."""
    metrics = [hpa_metric(service)]
    if service.scaling.forecast.enabled:
        metrics.append(forecast_metric(service))
    return metrics


def hpa_behavior(service: InferenceService) -> k8s.autoscaling.v2.HorizontalPodAutoscalerBehaviorArgs:
    """Up fast (double or +4 pods every 15 s, whichever is more); down slow and capped per minute."""
    s = service.scaling
    policy = k8s.autoscaling.v2.HPAScalingPolicyArgs
    return k8s.autoscaling.v2.HorizontalPodAutoscalerBehaviorArgs(
        scale_up=k8s.autoscaling.v2.HPAScalingRulesArgs(
            stabilization_window_seconds=s.scale_up_stabilization_seconds,
            select_policy="Max",
            policies=[policy(type="Percent", value=100, period_seconds=15),
                      policy(type="Pods", value=4, period_seconds=15)],
        ),
        scale_down=k8s.autoscaling.v2.HPAScalingRulesArgs(
            stabilization_window_seconds=s.scale_down_stabilization_seconds,
            select_policy="Min",
            policies=[policy(type="Percent", value=s.scale_down_percent_per_minute, period_seconds=60)],
        ),
    )


def standby_tolerations(args: InferenceServiceArgs) -> list[k8s.core.v1.TolerationArgs]:
    """A standby runs on virtual nodes whatever the burst mode: it alone tolerates the burst taint."""
    keys = Keys(args.label_prefix)
    burst = k8s.core.v1.TolerationArgs(key=keys.burst_taint, operator="Exists", effect="NoSchedule")
    return [*tolerations(args), burst]


def external_required_affinity(keys: Keys, providers: list[ExternalProvider],
                               weights: Mapping[str, int]) -> k8s.core.v1.AffinityArgs:
    """Required: a virtual node of one of the service's eligible providers, never an on-prem GPU; preferred:
    the cheaper providers (`weights`, from `provider_rank`)."""
    return k8s.core.v1.AffinityArgs(
        node_affinity=k8s.core.v1.NodeAffinityArgs(
            required_during_scheduling_ignored_during_execution=k8s.core.v1.NodeSelectorArgs(
                node_selector_terms=[k8s.core.v1.NodeSelectorTermArgs(match_expressions=[
                    k8s.core.v1.NodeSelectorRequirementArgs(key=keys.location, operator="In", values=[EXTERNAL]),
                    k8s.core.v1.NodeSelectorRequirementArgs(
                        key=keys.provider, operator="In", values=[p.name for p in providers]),
                ])]
            ),
            preferred_during_scheduling_ignored_during_execution=provider_preferences(keys, weights) or None,
        )
    )


def standby_labels(labels: dict[str, str], keys: Keys, service: str, version: str) -> dict[str, str]:
    """Own name (so neither Deployment adopts the other's pods), same service label, role=standby."""
    return {**common_labels(standby_deployment(service), "inference", version), keys.workload: INFERENCE,
            keys.service: service, keys.role: STANDBY}


def return_labels(labels: dict[str, str], keys: Keys, service: str, version: str) -> dict[str, str]:
    """Own name (no other Deployment adopts its pods, and the HPA's scale target never counts them), the
    serving labels (the Service and the PDB select it: it serves and counts as available), role=return."""
    return {**common_labels(return_deployment(service), "inference", version), keys.workload: INFERENCE,
            keys.service: service, keys.role: RETURN}


def onprem_required_affinity(keys: Keys, pool: str | None) -> k8s.core.v1.AffinityArgs:
    """Required: an on-prem GPU node (of the service's pool, when it has one); never a virtual node."""
    required = [k8s.core.v1.NodeSelectorRequirementArgs(key=keys.location, operator="In", values=[ONPREM])]
    if pool is not None:
        required.append(k8s.core.v1.NodeSelectorRequirementArgs(key=keys.pool, operator="In", values=[pool]))
    return k8s.core.v1.AffinityArgs(node_affinity=k8s.core.v1.NodeAffinityArgs(
        required_during_scheduling_ignored_during_execution=k8s.core.v1.NodeSelectorArgs(
            node_selector_terms=[k8s.core.v1.NodeSelectorTermArgs(match_expressions=required)]),
    ))


def warm_labels(keys: Keys, service: str, version: str) -> dict[str, str]:
    """Own name and component (so neither the Service nor the PDB selects a placeholder: it serves nobody),
    the service label (the burst controller counts them per service), role=warm."""
    return {**common_labels(warm_deployment(service), "inference-warm", version), keys.workload: INFERENCE,
            keys.service: service, keys.role: WARM}


def surge_first() -> k8s.apps.v1.DeploymentStrategyArgs:
    """GPUs are scarce: add one replica before taking one away."""
    return k8s.apps.v1.DeploymentStrategyArgs(
        type="RollingUpdate", rolling_update=k8s.apps.v1.RollingUpdateDeploymentArgs(max_surge=1, max_unavailable=0)
    )


def server_pod_template(
    args: InferenceServiceArgs,
    labels: dict[str, str],
    env: list[k8s.core.v1.EnvVarArgs],
    affinity: k8s.core.v1.AffinityArgs,
    pod_tolerations: list[k8s.core.v1.TolerationArgs],
    priority_class: str = "",
) -> k8s.core.v1.PodTemplateSpecArgs:
    """The inference server pod; the main and the standby Deployment differ only in labels and placement, the
    warm pool's also in `priority_class` (the service's own when empty)."""
    svc = args.service
    probes = server_probes(svc)
    return k8s.core.v1.PodTemplateSpecArgs(
        metadata=k8s.meta.v1.ObjectMetaArgs(
            labels=labels,
            annotations={VOLCANO_QUEUE_ANNOTATION: args.queue, VOLCANO_PREEMPTABLE_ANNOTATION: "true"},
        ),
        spec=k8s.core.v1.PodSpecArgs(
            scheduler_name=args.scheduler_name,
            priority_class_name=priority_class or args.priority_class,
            affinity=affinity,
            tolerations=pod_tolerations,
            # The server never calls the Kubernetes API: no token in the pod.
            automount_service_account_token=False,
            security_context=pod_security_context(),
            termination_grace_period_seconds=60,
            containers=[k8s.core.v1.ContainerArgs(
                name="server",
                image=svc.image,
                args=svc.args or None,
                env=env or None,
                ports=[k8s.core.v1.ContainerPortArgs(name="http", container_port=svc.port)],
                startup_probe=probes.startup,
                readiness_probe=probes.readiness,
                liveness_probe=probes.liveness,
                resources=with_ephemeral_storage(
                    gpu_resources(args.gpu_resource, svc.gpus_per_replica, svc.cpu, svc.memory),
                    SERVER_EPHEMERAL_REQUEST, SERVER_EPHEMERAL_LIMIT),
                security_context=container_security_context(),
                volume_mounts=[k8s.core.v1.VolumeMountArgs(name="tmp", mount_path="/tmp")],
            )],
            volumes=[scratch_volume(size_limit=SERVER_SCRATCH_LIMIT)],
        ),
    )


class InferenceServiceComponent(pulumi.ComponentResource):
    """One service: Deployment (no replicas: the HPA owns them), Service, HPA, PDB, traffic wiring."""

    service_name: pulumi.Output[str]

    def __init__(self, name: str, args: InferenceServiceArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("gpu-cluster:inference:InferenceService", name, None, opts)
        svc = args.service
        ns = args.namespace
        keys = Keys(args.label_prefix)
        version = image_version(svc.image)
        labels = {**common_labels(svc.name, "inference", version), keys.workload: INFERENCE, keys.service: svc.name}
        selector = selector_labels(labels)
        meta = k8s.meta.v1.ObjectMetaArgs
        child = pulumi.ResourceOptions(parent=self)
        env: list[k8s.core.v1.EnvVarArgs] = []
        deps: list[pulumi.Resource] = []
        skips: dict[str, str] = {}
        traffic = svc.traffic
        if traffic.shape is TrafficShape.QUEUE_WORKER:
            env.append(k8s.core.v1.EnvVarArgs(name="QUEUE_URL", value=traffic.queue_url))
            if traffic.queue_credentials_secret:
                secret = k8s.core.v1.Secret(
                    f"{svc.name}-queue",
                    metadata=meta(name=f"{svc.name}-queue", namespace=ns, labels=labels),
                    type="Opaque",
                    string_data={"credentials": secret_value(traffic.queue_credentials_secret)},
                    opts=child,
                )
                deps.append(secret)
                env.append(k8s.core.v1.EnvVarArgs(
                    name="QUEUE_CREDENTIALS",
                    value_from=k8s.core.v1.EnvVarSourceArgs(secret_key_ref=k8s.core.v1.SecretKeySelectorArgs(
                        name=f"{svc.name}-queue", key="credentials")),
                ))
                skips["CKV_K8S_35"] = "the worker image reads queue credentials from env; secretKeyRef, never literal"
        # Service and PDB select by service, so the standby's pods serve traffic and count as available.
        serving = {k: v for k, v in labels.items() if k in ("app.kubernetes.io/component", "app.kubernetes.io/part-of")}
        serving[keys.service] = svc.name
        annotations = checkov_skips(skips) or None
        weights = provider_weights(args.providers)  # the main and the standby rank the providers alike
        self.deployment = k8s.apps.v1.Deployment(
            svc.name,
            metadata=meta(name=svc.name, namespace=ns, labels=labels, annotations=annotations),
            spec=k8s.apps.v1.DeploymentSpecArgs(
                selector=k8s.meta.v1.LabelSelectorArgs(match_labels=selector),
                strategy=surge_first(),
                template=server_pod_template(
                    args, labels, env, prefer_onprem_affinity(keys, svc.pool, weights),
                    tolerations(args),
                ),
            ),
            opts=pulumi.ResourceOptions(parent=self, depends_on=deps),
        )
        def scaled_by_controller(suffix: str, name: str, pod_labels: dict[str, str],
                                 template: k8s.core.v1.PodTemplateSpecArgs) -> None:
            """A Deployment the burst controller scales through the scale subresource: Pulumi creates it at zero
            and leaves the count alone."""
            k8s.apps.v1.Deployment(
                f"{svc.name}-{suffix}",
                metadata=meta(name=name, namespace=ns, labels=pod_labels, annotations=annotations),
                spec=k8s.apps.v1.DeploymentSpecArgs(
                    replicas=0,
                    selector=k8s.meta.v1.LabelSelectorArgs(match_labels=selector_labels(pod_labels)),
                    strategy=surge_first(),
                    template=template,
                ),
                opts=pulumi.ResourceOptions(parent=self, depends_on=deps, ignore_changes=["spec.replicas"]),
            )

        if args.standby:
            # Make before break (config.Handover): replicas on virtual nodes only, up while a gang waits.
            standby = standby_labels(labels, keys, svc.name, version)
            scaled_by_controller("standby", standby_deployment(svc.name), standby, server_pod_template(
                args, standby, env, external_required_affinity(keys, args.providers, weights),
                standby_tolerations(args)))
        if args.home:
            # Make-before-break return (config.Burst.returnSurgeShare): on-prem replicas the burst controller
            # scales up before it evicts external ones and back to 0 once their replacements are Ready. Not the
            # HPA's scale target, so the HPA never undoes the surge.
            home = return_labels(labels, keys, svc.name, version)
            scaled_by_controller("return", return_deployment(svc.name), home, server_pod_template(
                args, home, env, onprem_required_affinity(keys, svc.pool), tolerations(args)))
        if args.warm:
            # Warm external capacity: placeholders of the service's image on virtual nodes only, at the lowest
            # priority, scaled by the burst controller while the burst is open (0 while it is closed, so they
            # need not tolerate the burst taint); a replica landing beside one takes its warm instance over.
            warm = warm_labels(keys, svc.name, version)
            scaled_by_controller("warm", warm_deployment(svc.name), warm, server_pod_template(
                args, warm, env, external_required_affinity(keys, args.providers, weights), tolerations(args),
                priority_class=args.warm_priority_class))
        service = k8s.core.v1.Service(
            f"{svc.name}-service",
            metadata=meta(name=svc.name, namespace=ns, labels=labels),
            spec=k8s.core.v1.ServiceSpecArgs(
                selector=serving,
                ports=[k8s.core.v1.ServicePortArgs(name="http", port=svc.port, target_port="http")],
            ),
            opts=child,
        )
        k8s.autoscaling.v2.HorizontalPodAutoscaler(
            f"{svc.name}-hpa",
            metadata=meta(name=svc.name, namespace=ns, labels=labels),
            spec=k8s.autoscaling.v2.HorizontalPodAutoscalerSpecArgs(
                scale_target_ref=k8s.autoscaling.v2.CrossVersionObjectReferenceArgs(
                    api_version="apps/v1", kind="Deployment", name=svc.name
                ),
                min_replicas=svc.min_replicas,
                max_replicas=svc.max_replicas,
                metrics=hpa_metrics(svc),
                behavior=hpa_behavior(svc),
            ),
            opts=pulumi.ResourceOptions(parent=self, depends_on=[self.deployment]),
        )
        k8s.policy.v1.PodDisruptionBudget(
            f"{svc.name}-pdb",
            metadata=meta(name=svc.name, namespace=ns, labels=labels),
            spec=k8s.policy.v1.PodDisruptionBudgetSpecArgs(
                max_unavailable=svc.max_unavailable,
                selector=k8s.meta.v1.LabelSelectorArgs(match_labels=serving),
                unhealthy_pod_eviction_policy=UNHEALTHY_POD_EVICTION,
            ),
            opts=child,
        )
        if traffic.shape is TrafficShape.GATEWAY:
            parent: dict[str, Any] = {"group": "gateway.networking.k8s.io", "kind": "Gateway",
                                      "name": args.gateway.name, "namespace": args.gateway.namespace or ns}
            if args.gateway.section_name:
                parent["sectionName"] = args.gateway.section_name
            k8s.apiextensions.CustomResource(
                f"{svc.name}-route",
                api_version="gateway.networking.k8s.io/v1",
                kind="HTTPRoute",
                metadata=meta(name=svc.name, namespace=ns, labels=labels),
                spec={
                    "parentRefs": [parent],
                    "hostnames": [traffic.gateway_host],
                    "rules": [{
                        "matches": [{"path": {"type": "PathPrefix", "value": "/"}}],
                        "backendRefs": [{"group": "", "kind": "Service", "name": svc.name, "port": svc.port}],
                    }],
                },
                opts=pulumi.ResourceOptions(parent=self, depends_on=[service]),
            )
        self.service_name = pulumi.Output.from_input(svc.name)
        self.register_outputs({"service_name": self.service_name})
