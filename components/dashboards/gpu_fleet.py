"""The GPU fleet dashboard: the signals that do not lie, on one page.

Built in Python rather than kept as exported JSON so that the thermal threshold line and the burst taint
key come from the same stack config as the alert rules and the health guard; a stack that moves the
threshold to 80 C sees its dashboard move with it. Panel queries use the metric and label names of the
pinned exporters (see :mod:`components.alert_rules`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from agents.health_guard.contract import THERMAL_BAND_CELSIUS, THERMAL_LIMIT_CELSIUS
from components.alert_rules import DCGM_NODE_LABEL, IB_NODE_LABEL

UID = "gpucluster-gpu-fleet"
SCHEMA_VERSION = 39
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}


@dataclass(frozen=True)
class DashboardOptions:
    thermal_threshold_celsius: float = THERMAL_LIMIT_CELSIUS
    thermal_warning_band_celsius: float = THERMAL_BAND_CELSIUS
    burst_taint_key: str = "gpucluster.io/burst"
    health_taint_key: str = "gpucluster.io/gpu-health"
    workload_label: str = "label_gpucluster_io_workload"
    location_label: str = "label_gpucluster_io_location"


def _target(expr: str, legend: str, ref: str) -> dict[str, Any]:
    return {"datasource": DATASOURCE, "expr": expr, "legendFormat": legend, "refId": ref}


def _panel(
    pid: int,
    title: str,
    description: str,
    targets: list[dict[str, Any]],
    grid: tuple[int, int, int, int],
    unit: str,
    thresholds: list[dict[str, Any]] | None = None,
    threshold_line: bool = False,
    kind: str = "timeseries",
) -> dict[str, Any]:
    x, y, w, h = grid
    defaults: dict[str, Any] = {"unit": unit}
    if thresholds is not None:
        defaults["thresholds"] = {"mode": "absolute", "steps": thresholds}
    if threshold_line:
        defaults["custom"] = {"thresholdsStyle": {"mode": "line+area"}}
    return {
        "id": pid,
        "type": kind,
        "title": title,
        "description": description,
        "datasource": DATASOURCE,
        "gridPos": {"x": x, "y": y, "w": w, "h": h},
        "fieldConfig": {"defaults": defaults, "overrides": []},
        "options": {"legend": {"displayMode": "table", "placement": "right", "calcs": ["max", "lastNotNull"]}}
        if kind == "timeseries"
        else {},
        "targets": targets,
    }


def build(options: DashboardOptions | None = None) -> dict[str, Any]:
    """The dashboard model (what Grafana's JSON import expects)."""
    o = options or DashboardOptions()
    warn = o.thermal_threshold_celsius - o.thermal_warning_band_celsius
    training = f'max by (namespace, pod) (kube_pod_labels{{{o.workload_label}="training"}})'
    ib = f"{IB_NODE_LABEL}, device, port"
    panels = [
        _panel(
            1,
            "GPU temperature per node / GPU",
            f"Hottest first. The red line is the thermal limit ({o.thermal_threshold_celsius:g} C): a GPU at or "
            "above it for the hold time is quarantined as degraded by the health guard.",
            [
                _target(
                    "sort_desc(DCGM_FI_DEV_GPU_TEMP)",
                    f"{{{{{DCGM_NODE_LABEL}}}}} gpu {{{{gpu}}}}",
                    "A",
                )
            ],
            (0, 0, 12, 9),
            "celsius",
            [
                {"color": "green", "value": None},
                {"color": "orange", "value": warn},
                {"color": "red", "value": o.thermal_threshold_celsius},
            ],
            threshold_line=True,
        ),
        _panel(
            2,
            "Tensor-core activity per training pod",
            "Mean DCGM_FI_PROF_PIPE_TENSOR_ACTIVE over the pod's GPUs. Near zero while the pod holds GPUs is a "
            "hang suspect, whatever GPU utilization says.",
            [
                _target(
                    f'avg by (namespace, pod) (DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{{pod!=""}}) '
                    f"* on (namespace, pod) group_left () {training}",
                    "{{namespace}}/{{pod}}",
                    "A",
                )
            ],
            (12, 0, 12, 9),
            "percentunit",
        ),
        _panel(
            3,
            "InfiniBand throughput per port",
            "Bytes per second (sysfs words x 4). Transmit positive, receive negative.",
            [
                _target(
                    "rate(infiniband_port_data_transmitted_bytes_total[5m])",
                    f"{{{{{IB_NODE_LABEL}}}}} {{{{device}}}}/{{{{port}}}} tx",
                    "A",
                ),
                _target(
                    "-rate(infiniband_port_data_received_bytes_total[5m])",
                    f"{{{{{IB_NODE_LABEL}}}}} {{{{device}}}}/{{{{port}}}} rx",
                    "B",
                ),
            ],
            (0, 9, 12, 8),
            "Bps",
        ),
        _panel(
            4,
            "InfiniBand transmit wait per port",
            "Ticks per second with data queued but nothing sent: congestion. Rising wait with falling bytes "
            "points at the fabric or a slow receiver.",
            [
                _target(
                    "rate(infiniband_port_transmit_wait_total[5m])",
                    f"{{{{{IB_NODE_LABEL}}}}} {{{{device}}}}/{{{{port}}}}",
                    "A",
                )
            ],
            (12, 9, 12, 8),
            "short",
        ),
        _panel(
            5,
            "InfiniBand errors per port",
            "Physical (symbol, link downed), receive, and transport errors that precede NCCL timeouts.",
            [
                _target(
                    f"sum by ({ib}) (rate(infiniband_symbol_error_total[5m]))",
                    f"{{{{{IB_NODE_LABEL}}}}} {{{{device}}}}/{{{{port}}}} symbol",
                    "A",
                ),
                _target(
                    f"sum by ({ib}) (rate(infiniband_port_errors_received_total[5m]))",
                    f"{{{{{IB_NODE_LABEL}}}}} {{{{device}}}}/{{{{port}}}} rcv",
                    "B",
                ),
                _target(
                    f"sum by ({ib}) (increase(infiniband_link_downed_total[5m]))",
                    f"{{{{{IB_NODE_LABEL}}}}} {{{{device}}}}/{{{{port}}}} link downed",
                    "C",
                ),
                _target(
                    f"sum by ({ib}) (rate(infiniband_hw_local_ack_timeout_err_total[5m]))",
                    f"{{{{{IB_NODE_LABEL}}}}} {{{{device}}}}/{{{{port}}}} ack timeout",
                    "D",
                ),
                _target(
                    f"sum by ({ib}) (rate(infiniband_hw_out_of_sequence_total[5m]))",
                    f"{{{{{IB_NODE_LABEL}}}}} {{{{device}}}}/{{{{port}}}} out of sequence",
                    "E",
                ),
            ],
            (0, 17, 12, 8),
            "short",
        ),
        _panel(
            6,
            "NVLink errors per GPU",
            "Replay and CRC errors per second, and recovery events; recovery means the link stalled.",
            [
                _target(
                    f"rate(DCGM_FI_DEV_NVLINK_{kind}_ERROR_COUNT_TOTAL[5m])",
                    f"{{{{{DCGM_NODE_LABEL}}}}} gpu {{{{gpu}}}} {kind.lower().replace('_', ' ')}",
                    ref,
                )
                for ref, kind in zip("ABCD", ("REPLAY", "CRC_FLIT", "CRC_DATA", "RECOVERY"), strict=True)
            ],
            (12, 17, 12, 8),
            "short",
        ),
        _panel(
            7,
            "Burst state: external nodes open to inference",
            f"External (virtual) nodes without the burst taint {o.burst_taint_key} accept inference; with it, "
            "inference is drained back on-prem gradually. Also: inference pods running externally.",
            [
                _target(
                    f'count(kube_node_labels{{{o.location_label}="external"}}) - '
                    f'(count(kube_node_spec_taint{{key="{o.burst_taint_key}"}}) or vector(0))',
                    "external nodes open",
                    "A",
                ),
                _target(
                    f'count(kube_pod_info * on (node) group_left () kube_node_labels{{{o.location_label}="external"}})'
                    " or vector(0)",
                    "pods on external nodes",
                    "B",
                ),
            ],
            (0, 25, 12, 7),
            "short",
        ),
        _panel(
            8,
            "Nodes out of service (GPU health)",
            f"Nodes carrying {o.health_taint_key} (fatal or degraded); see the GPU health dashboard.",
            [_target("sum(gpucluster_health_node_quarantined) or vector(0)", "quarantined nodes", "A")],
            (12, 25, 12, 7),
            "short",
            [{"color": "green", "value": None}, {"color": "red", "value": 1}],
            kind="stat",
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
        "templating": {
            "list": [
                {
                    "name": "datasource",
                    "type": "datasource",
                    "query": "prometheus",
                    "label": "Prometheus",
                    "current": {},
                }
            ]
        },
        "panels": panels,
    }


def render(options: DashboardOptions | None = None) -> str:
    """Dashboard JSON text, stable across runs (sorted keys) so previews show real changes only."""
    return json.dumps(build(options), indent=2, sort_keys=True)
