"""The alert rules' typed thresholds and the one way an alert is written (labels, summary, runbook text).

Shared by the rule groups (``alert_rules_hardware`` for GPUs, NVLink and InfiniBand; ``alert_rules`` for
training, checkpoints, the guard and the burst) and by the dashboards, which name nodes as the exporters do.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from agents.burst_controller.contract import HandoverTunables
from agents.defaults import DEFAULT_LABEL_PREFIX
from agents.health_guard.contract import FATAL_XIDS, REPEATED_XIDS
from agents.health_guard.thermal import Thermal

DCGM_NODE_LABEL = "Hostname"
"""dcgm-exporter 4.2.x names the node ``Hostname`` (later releases lower-case it): pinned with the image."""
IB_NODE_LABEL = "node"
"""Added to every ib-exporter series by its ServiceMonitor from the pod's node name."""

CRITICAL = "critical"
WARNING = "warning"


def duration(seconds: int) -> str:
    """Prometheus duration text for whole seconds: 120 → ``2m``, 90 → ``90s``, 3600 → ``1h``."""
    if seconds <= 0:
        raise ValueError(f"duration must be positive, got {seconds}")
    if seconds % 3600 == 0:
        return f"{seconds // 3600}h"
    if seconds % 60 == 0:
        return f"{seconds // 60}m"
    return f"{seconds}s"


def promql_number(value: float) -> str:
    """A threshold as PromQL text without float noise: 78.0 → ``78``, 0.05 → ``0.05``."""
    return str(int(value)) if float(value).is_integer() else repr(float(value))


@dataclass(frozen=True)
class AlertThresholds:
    """Every knob of the alert rules, with defaults that encode the fleet's lessons.

    Rates are per second; windows and holds are whole seconds.
    """

    thermal: Thermal = field(default_factory=Thermal)
    """The thermal threshold, its hold and its warning band: the stack's validated model, shared with the guard
    and the dashboard (nothing here checks them again)."""
    thermal_warning_hold_seconds: int = 300
    throttle_hold_seconds: int = 300
    critical_xids: tuple[int, ...] = FATAL_XIDS
    """XIDs that page: the health guard's fatal ones (one table, :data:`agents.health_guard.contract.XIDS`),
    so every XID that quarantines a node also pages. 13/31/43 are usually the application and do neither."""
    repeated_xids: tuple[int, ...] = REPEATED_XIDS
    """Contained ECC errors (94) are survivable once; repeated ones mean the memory is going."""
    repeated_xid_count: int = 2
    repeated_xid_window_seconds: int = 3600
    nvlink_error_rate: float = 0.1
    """Replay + CRC errors per second over the window that mark a degrading NVLink."""
    nvlink_window_seconds: int = 600
    ib_nominal_rate_bytes_per_second: float = 50e9
    """NDR 400 Gb/s. An InfiniBand port that trained at less has a bad cable or transceiver."""
    ib_symbol_error_rate: float = 0.01
    ib_rcv_error_rate: float = 0.01
    ib_transport_error_rate: float = 0.1
    """hw_counters local_ack_timeout_err/out_of_sequence/packet_seq_err per second: NCCL timeout precursors."""
    ib_xmit_wait_min_rate: float = 1000.0
    """Ticks per second of xmit wait below which congestion is not worth a look."""
    ib_xmit_wait_increase_factor: float = 2.0
    ib_window_seconds: int = 600
    ib_link_hold_seconds: int = 120
    hang_window_seconds: int = 900
    """How long a training pod's tensor pipe must idle (or its heartbeat stay flat) to call it hung."""
    tensor_idle_ratio: float = 0.01
    ib_flat_bytes_per_second: float = 1e6
    nvlink_flat_bytes_per_second: float = 1e6
    heartbeat_metric: str = "training_step_heartbeat_timestamp_seconds"
    """Gauge (or counter) a training job moves once per step, labelled ``namespace`` and ``job_name``;
    flat means no progress."""
    checkpoint_duration_metric: str = "gpucluster_checkpoint_duration_seconds"
    checkpoint_budget_seconds: float = 30.0
    """1 TB in under 30 s is the checkpoint goal; a slower checkpoint eats training time at every step."""
    label_prefix: str = DEFAULT_LABEL_PREFIX
    """The stack's ``labelPrefix``: the label, taint and gate names the descriptions tell an operator to use."""
    workload_label: str = "label_gpucluster_io_workload"
    """``<labelPrefix>/workload`` as kube-state-metrics spells it in ``kube_pod_labels``."""
    extra_labels: dict[str, str] = field(default_factory=dict)
    """Added to every alert (e.g. ``cluster``) for routing."""
    handover_timeout_seconds: int = int(HandoverTunables().timeout_seconds)
    """The burst controller releases gated training after this long; held longer means it cannot act (its default
    is the controller's own)."""
    controller_absent_seconds: int = 120
    gang_restart_rate_per_hour: float = 3.0
    """Gang restarts per pool and hour (the guard's and application crashes') above which the pool fails faster
    than planned."""
    restart_loop_count: int = 2
    """Restarts of one job caused by one node within ``restart_loop_window_seconds`` that make a loop."""
    restart_loop_window_seconds: int = 21600
    quarantined_pool_share: float = 0.1
    """Share of a pool quarantined above which the cause is probably shared."""

    def __post_init__(self) -> None:
        problems: list[str] = []
        for name in (
            "thermal_warning_hold_seconds",
            "throttle_hold_seconds",
            "repeated_xid_window_seconds",
            "nvlink_window_seconds",
            "ib_window_seconds",
            "ib_link_hold_seconds",
            "hang_window_seconds",
            "repeated_xid_count",
            "handover_timeout_seconds",
            "controller_absent_seconds",
            "restart_loop_count",
            "restart_loop_window_seconds",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                problems.append(f"{name} must be a positive whole number, got {value!r}")
        for name in ("critical_xids", "repeated_xids"):
            xids = getattr(self, name)
            if not xids or any(not isinstance(x, int) or not 0 < x < 1000 for x in xids):
                problems.append(f"{name} must be a non-empty list of XID numbers (1-999), got {xids!r}")
        for name in (
            "nvlink_error_rate",
            "ib_nominal_rate_bytes_per_second",
            "ib_symbol_error_rate",
            "ib_rcv_error_rate",
            "ib_transport_error_rate",
            "ib_xmit_wait_min_rate",
            "tensor_idle_ratio",
            "ib_flat_bytes_per_second",
            "nvlink_flat_bytes_per_second",
            "checkpoint_budget_seconds",
            "gang_restart_rate_per_hour",
            "quarantined_pool_share",
        ):
            if getattr(self, name) <= 0:
                problems.append(f"{name} must be positive, got {getattr(self, name)}")
        if self.ib_xmit_wait_increase_factor <= 1:
            problems.append(f"ib_xmit_wait_increase_factor must be > 1, got {self.ib_xmit_wait_increase_factor}")
        for name in ("heartbeat_metric", "checkpoint_duration_metric"):
            metric = getattr(self, name)
            if not metric or not metric.replace("_", "").replace(":", "").isalnum() or metric[0].isdigit():
                problems.append(f"{name} must be a Prometheus metric name, got {metric!r}")
        if problems:
            raise ValueError("invalid alert thresholds: " + "; ".join(problems))


def alert(
    t: AlertThresholds,
    name: str,
    expr: str,
    severity: str,
    component: str,
    summary: str,
    description: str,
    hold: str | None = None,
) -> dict[str, Any]:
    rule: dict[str, Any] = {"alert": name, "expr": expr}
    if hold is not None:
        rule["for"] = hold
    rule["labels"] = {"severity": severity, "component": component, **t.extra_labels}
    rule["annotations"] = {"summary": summary, "description": description}
    return rule
