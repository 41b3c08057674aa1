"""Inference services: HPA-scaled GPU deployments that prefer on-prem and burst only when let in.

The platform component deploys every configured service (``components.inference_service``) and, when one
scales on a request-level metric, the metrics adapter (``components.metrics_adapter``), plus the forecasts'
recording rules.
"""

from __future__ import annotations

import pulumi
import pulumi_kubernetes as k8s

from components import forecast
from components.config import (
    ClusterConfig,
    ScalingMetric,
    TrafficShape,
)
from components.inference_service import InferenceServiceArgs, InferenceServiceComponent
from components.metrics_adapter import ADAPTED, MetricsAdapterArgs, PrometheusAdapter, series
from components.naming import (
    common_labels,
)


class InferencePlatform(pulumi.ComponentResource):
    """Every configured inference service, plus the metrics adapter when one of them needs it."""

    def __init__(self, name: str, cfg: ClusterConfig, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("gpu-cluster:inference:InferencePlatform", name, None, opts)
        adapter_args = MetricsAdapterArgs.from_config(cfg)
        deps: list[pulumi.Resource] = []
        if adapter_args.services:
            deps.append(PrometheusAdapter("metrics-adapter", adapter_args, pulumi.ResourceOptions(parent=self)))
        rules = forecast.rules_for(cfg.inference.services, series)
        if rules:
            # The forecasts' recording rules, where the Prometheus Operator picks up the stack's other rules.
            labels = {**common_labels("inference-forecast", "recording-rules"), **cfg.observability.monitor_labels}
            k8s.apiextensions.CustomResource(
                "inference-forecast",
                api_version="monitoring.coreos.com/v1",
                kind="PrometheusRule",
                metadata=k8s.meta.v1.ObjectMetaArgs(name="inference-forecast", namespace=cfg.monitoring_namespace,
                                                    labels=labels),
                spec={"groups": forecast.rule_groups(rules)},
                opts=pulumi.ResourceOptions(parent=self),
            )
        self.services = [
            InferenceServiceComponent(
                f"inference-{s.name}",
                InferenceServiceArgs.from_config(cfg, s),
                pulumi.ResourceOptions(parent=self, depends_on=deps),
            )
            for s in cfg.inference.services
        ]
        self.register_outputs({"services": [s.name for s in cfg.inference.services]})


def summary_rows(cfg: ClusterConfig) -> list[tuple[str, str]]:
    """Inference services: replicas, GPUs, traffic shape and scaling metric."""
    rows = []
    for s in cfg.inference.services:
        t = s.traffic
        where = t.queue_url if t.shape is TrafficShape.QUEUE_WORKER else t.gateway_host
        metric = s.scaling.metric.value
        unit = "%" if s.scaling.metric in (ScalingMetric.CPU, ScalingMetric.MEMORY) else " per replica"
        rows.append((
            f"inference {s.name}",
            f"{s.min_replicas}–{s.max_replicas} replicas × {s.gpus_per_replica} GPU, {t.shape.value} ({where}), "
            f"HPA on {metric} {s.scaling.target}{unit}"
            + (f" and its {s.scaling.forecast.horizon_seconds}s forecast" if s.scaling.forecast.enabled else "")
            + ", "
            f"scale-down window {s.scaling.scale_down_stabilization_seconds}s",
        ))
    if any(s.scaling.metric in ADAPTED for s in cfg.inference.services):
        rows.append(("metrics adapter", f"{cfg.inference.adapter.image} (custom + external metrics)"))
    return rows
