"""The GPU fleet dashboard: the signals that do not lie, on one page.

Built in Python rather than kept as exported JSON so that the thermal threshold line and the burst taint
key come from the same stack config as the alert rules and the health guard; a stack that moves the
threshold to 80 C sees its dashboard move with it. Panel queries use the metric and label names of the
pinned exporters (see :mod:`components.alert_rules`); the pool, node and job variables and
the links to the health dashboard are :mod:`components.dashboards.grafana`'s.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from agents.health_guard.thermal import Thermal
from components.alert_thresholds import DCGM_NODE_LABEL, IB_NODE_LABEL
from components.dashboards.grafana import (
    FLEET_UID,
    HEALTH_UID,
    SCHEMA_VERSION,
    TOP,
    Scope,
    dashboard_link,
    data_link,
    panel,
    target,
)

UID = FLEET_UID


@dataclass(frozen=True)
class DashboardOptions:
    thermal: Thermal = field(default_factory=Thermal)
    burst_taint_key: str = "gpucluster.io/burst"
    health_taint_key: str = "gpucluster.io/gpu-health"
    scope: Scope = field(default_factory=Scope)


def build(options: DashboardOptions | None = None) -> dict[str, Any]:
    """The dashboard model (what Grafana's JSON import expects)."""
    o = options or DashboardOptions()
    s = o.scope
    warn = o.thermal.thermal_warning_celsius
    ib = f"{IB_NODE_LABEL}, device, port"
    gpu_legend = f"{{{{{DCGM_NODE_LABEL}}}}} gpu {{{{gpu}}}}"
    port_legend = f"{{{{{IB_NODE_LABEL}}}}} {{{{device}}}}/{{{{port}}}}"
    on_node = '{node=~"$node"}'
    tensor = s.in_pools('DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{pod!="", node=~"$node"}')
    thermal_steps: list[dict[str, Any]] = [
        {"color": "green", "value": None},
        {"color": "orange", "value": warn},
        {"color": "red", "value": o.thermal.thermal_threshold_celsius},
    ]
    node_health = [data_link("GPU health of ${__field.labels.node}", HEALTH_UID, node="node")]

    def top(vector: str) -> str:
        """The largest TOP series of ``vector`` (selected with ``on_node``) in the selected pools."""
        return f"topk({TOP}, {s.in_pools(vector)})"

    def windowed(metric: str, how: str = "rate") -> str:
        """``how`` (rate or increase) of the counter ``metric`` of the selected nodes over 5 minutes."""
        return f"{how}({metric}{on_node}[5m])"

    def port_errors(metric: str, how: str = "rate") -> str:
        return top(f"sum by ({ib}) ({windowed(metric, how)})")

    hottest = top(f"DCGM_FI_DEV_GPU_TEMP{on_node}")

    panels = [
        panel(
            1,
            "GPU temperature per node / GPU",
            f"The {TOP} hottest GPUs of the selected pools and nodes. The red line is the thermal limit "
            f"({o.thermal.thermal_threshold_celsius:g} C): a GPU at or above it for the hold time is quarantined as "
            "degraded by the health guard.",
            [target(hottest, gpu_legend, "A")],
            (0, 0, 12, 9),
            "celsius",
            thermal_steps,
            threshold_line=True,
            links=node_health,
        ),
        panel(
            2,
            "Tensor-core activity per training pod",
            f"Mean DCGM_FI_PROF_PIPE_TENSOR_ACTIVE over the pod's GPUs, the {TOP} idlest pods of the selected "
            "jobs. Near zero while the pod holds GPUs is a hang suspect, whatever GPU utilization says.",
            [
                target(
                    f"bottomk({TOP}, avg by (namespace, pod) ({tensor}) "
                    f"* on (namespace, pod) group_left ({s.job_label}) {s.training_pods()})",
                    "{{namespace}}/{{pod}}",
                    "A",
                )
            ],
            (12, 0, 12, 9),
            "percentunit",
            links=[data_link(f"Gang restarts of ${{__field.labels.{s.job_label}}}", HEALTH_UID,
                             job=s.job_label)],
        ),
        panel(
            3,
            "InfiniBand throughput per port",
            f"Bytes per second (sysfs words x 4), the {TOP} busiest ports each way. Transmit positive, receive "
            "negative.",
            [
                target(top(windowed("infiniband_port_data_transmitted_bytes_total")), f"{port_legend} tx", "A"),
                target("-" + top(windowed("infiniband_port_data_received_bytes_total")), f"{port_legend} rx", "B"),
            ],
            (0, 9, 12, 8),
            "Bps",
            links=node_health,
        ),
        panel(
            4,
            "InfiniBand transmit wait per port",
            f"Ticks per second with data queued but nothing sent: congestion; the {TOP} most waiting ports. "
            "Rising wait with falling bytes points at the fabric or a slow receiver.",
            [target(top(windowed("infiniband_port_transmit_wait_total")), port_legend, "A")],
            (12, 9, 12, 8),
            "short",
            links=node_health,
        ),
        panel(
            5,
            "InfiniBand errors per port",
            "Physical (symbol, link downed), receive, and transport errors that precede NCCL timeouts; the "
            f"{TOP} worst ports of each kind.",
            [
                target(port_errors("infiniband_symbol_error_total"), f"{port_legend} symbol", "A"),
                target(port_errors("infiniband_port_errors_received_total"), f"{port_legend} rcv", "B"),
                target(port_errors("infiniband_link_downed_total", "increase"), f"{port_legend} link downed",
                       "C"),
                target(port_errors("infiniband_hw_local_ack_timeout_err_total"), f"{port_legend} ack timeout",
                       "D"),
                target(port_errors("infiniband_hw_out_of_sequence_total"), f"{port_legend} out of sequence",
                       "E"),
            ],
            (0, 17, 12, 8),
            "short",
            links=node_health,
        ),
        panel(
            6,
            "NVLink errors per GPU",
            f"Replay and CRC errors per second, and recovery events (the link stalled); the {TOP} worst GPUs of "
            "each kind.",
            [
                target(
                    top(windowed(f"DCGM_FI_DEV_NVLINK_{kind}_ERROR_COUNT_TOTAL")),
                    f"{gpu_legend} {kind.lower().replace('_', ' ')}",
                    ref,
                )
                for ref, kind in zip("ABCD", ("REPLAY", "CRC_FLIT", "CRC_DATA", "RECOVERY"), strict=True)
            ],
            (12, 17, 12, 8),
            "short",
            links=node_health,
        ),
        panel(
            7,
            "Burst state: external nodes open to inference",
            f"External (virtual) nodes without the burst taint {o.burst_taint_key} accept inference; with it, "
            "inference is drained back on-prem gradually. Also: inference pods running externally. External "
            "nodes belong to no pool: the variables do not apply.",
            [
                target(
                    f'count(kube_node_labels{{{s.location_label}="external"}}) - '
                    f'(count(kube_node_spec_taint{{key="{o.burst_taint_key}"}}) or vector(0))',
                    "external nodes open",
                    "A",
                ),
                target(
                    f'count(kube_pod_info * on (node) group_left () kube_node_labels{{{s.location_label}="external"}})'
                    " or vector(0)",
                    "pods on external nodes",
                    "B",
                ),
            ],
            (0, 25, 12, 7),
            "short",
        ),
        panel(
            8,
            "Nodes out of service (GPU health)",
            f"Nodes of the selected pools carrying {o.health_taint_key} (fatal or degraded); see the GPU health "
            "dashboard.",
            [target(f"sum({s.in_pools(f'gpucluster_health_node_quarantined{on_node}')}) or vector(0)",
                    "quarantined nodes", "A")],
            (12, 25, 12, 7),
            "short",
            [{"color": "green", "value": None}, {"color": "red", "value": 1}],
            kind="stat",
        ),
        panel(
            9,
            "Hottest GPUs now",
            f"The {TOP} hottest GPUs of the selected pools and nodes at the end of the range, hottest first; a "
            "bar links to the GPU health of its node.",
            [target(f"sort_desc({hottest})", gpu_legend, "A", instant=True)],
            (0, 32, 24, 8),
            "celsius",
            thermal_steps,
            kind="bargauge",
            links=node_health,
        ),
    ]
    return {
        "uid": UID,
        "title": "GPU fleet: temperature, tensor activity, InfiniBand, NVLink, burst",
        "tags": ["gpucluster", "gpu", "infiniband"],
        "timezone": "utc",
        "schemaVersion": SCHEMA_VERSION,
        "refresh": "30s",
        "time": {"from": "now-6h", "to": "now"},
        "templating": {"list": s.variables()},
        "links": [dashboard_link(HEALTH_UID, "GPU health")],
        "panels": panels,
    }


def render(options: DashboardOptions | None = None) -> str:
    """Dashboard JSON text, stable across runs (sorted keys) so previews show real changes only."""
    return json.dumps(build(options), indent=2, sort_keys=True)
