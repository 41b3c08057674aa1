"""Alert rules for GPUs, NVLink, InfiniBand, training progress and checkpoints, built from typed thresholds.

:func:`build_rule_spec` is a pure function from :class:`AlertThresholds` to the ``spec`` of a
Prometheus Operator ``PrometheusRule`` (which is also the layout of a plain Prometheus rules file), so
the same output is checked by ``promtool check rules``, unit-tested by ``promtool test rules`` and
deployed. Every alert carries ``severity`` (``critical`` pages, ``warning`` tickets) and ``component``
labels, a one-line ``summary`` and a runbook-style ``description``: what it means, what to check
first, what to do.

Metric names are the ones this platform exports: dcgm-exporter fields from our counters CSV (node in the
``Hostname`` label of the pinned exporter), the ib-exporter's ``infiniband_*`` series (node in the ``node``
label its ServiceMonitor adds), kube-state-metrics' ``kube_pod_labels`` for the workload label, and
the training heartbeat and checkpoint duration that training jobs push.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import yaml

from agents.defaults import DEFAULT_LABEL_PREFIX
from agents.health_guard.contract import FATAL_XIDS, REPEATED_XIDS
from agents.health_guard.contract import Names as HealthNames
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


def _number(value: float) -> str:
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
    handover_timeout_seconds: int = 300
    """The burst controller releases gated training after this long; held longer means it cannot act."""
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


def _alert(
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


def _gpu_thermal(t: AlertThresholds) -> list[dict[str, Any]]:
    names = HealthNames(t.label_prefix)
    node = f"{{{{ $labels.{DCGM_NODE_LABEL} }}}}"
    threshold = _number(t.thermal.thermal_threshold_celsius)
    warning = _number(t.thermal.thermal_warning_celsius)
    return [
        _alert(
            t,
            "GpuTemperatureCritical",
            f"DCGM_FI_DEV_GPU_TEMP >= {threshold}",
            CRITICAL,
            "gpu",
            f"GPU {{{{ $labels.gpu }}}} on {node} at {{{{ $value }}}} C (limit {threshold} C)",
            f"GPU {{{{ $labels.gpu }}}} ({{{{ $labels.UUID }}}}) on node {node} has been at or above {threshold} C "
            f"for {duration(t.thermal.thermal_hold_seconds)}. The health guard quarantines the node "
            f"({names.taint}=degraded:NoSchedule) so no new training lands there. Check: airflow "
            "and fan state of the chassis, DCGM_FI_DEV_THERMAL_VIOLATION, neighbours in the same rack. Action: "
            "replace or repair the node; a hot GPU is pulled from service, not debugged in place. The guard "
            "releases the node once it has stayed below the limit minus its band for the probation.",
            duration(t.thermal.thermal_hold_seconds),
        ),
        _alert(
            t,
            "GpuTemperatureWarning",
            f"DCGM_FI_DEV_GPU_TEMP >= {warning} and DCGM_FI_DEV_GPU_TEMP < {threshold}",
            WARNING,
            "gpu",
            f"GPU {{{{ $labels.gpu }}}} on {node} at {{{{ $value }}}} C, within "
            f"{_number(t.thermal.thermal_warning_band_celsius)} C of the limit",
            f"GPU {{{{ $labels.gpu }}}} on node {node} has run between {warning} C and {threshold} C for "
            f"{duration(t.thermal_warning_hold_seconds)}. Nothing is tainted yet. Check: cooling of the "
            "rack, a fan alarm in the BMC, whether the whole node or one GPU runs warm. Action: schedule "
            "maintenance before the guard pulls the node out of service.",
            duration(t.thermal_warning_hold_seconds),
        ),
        _alert(
            t,
            "GpuThermalThrottling",
            # Clock-event reasons bit 0x20 (SW thermal slowdown) or 0x40 (HW thermal slowdown).
            "floor(DCGM_FI_DEV_CLOCKS_EVENT_REASONS / 32) % 4 > 0",
            WARNING,
            "gpu",
            f"GPU {{{{ $labels.gpu }}}} on {node} is throttling its clocks for temperature",
            f"GPU {{{{ $labels.gpu }}}} on node {node} has reported a thermal clock-event reason (SW or HW "
            f"thermal slowdown) for {duration(t.throttle_hold_seconds)}: it is running slower than its "
            "peers and slows every collective of its training job. Check: DCGM_FI_DEV_GPU_TEMP and "
            "DCGM_FI_DEV_MEMORY_TEMP, DCGM_FI_DEV_THERMAL_VIOLATION rate. Action: as for a hot GPU.",
            duration(t.throttle_hold_seconds),
        ),
    ]


def _gpu_errors(t: AlertThresholds) -> list[dict[str, Any]]:
    names = HealthNames(t.label_prefix)
    node = f"{{{{ $labels.{DCGM_NODE_LABEL} }}}}"
    critical = " or ".join(f"DCGM_FI_DEV_XID_ERRORS == {x}" for x in t.critical_xids)
    repeated = "|".join(str(x) for x in t.repeated_xids)
    window = duration(t.repeated_xid_window_seconds)
    return [
        _alert(
            t,
            "GpuCriticalXid",
            critical,
            CRITICAL,
            "gpu",
            f"GPU {{{{ $labels.gpu }}}} on {node} reported XID {{{{ $value }}}}",
            f"GPU {{{{ $labels.gpu }}}} ({{{{ $labels.UUID }}}}) on node {node} reported XID {{{{ $value }}}}, "
            f"one of {', '.join(str(x) for x in t.critical_xids)}: hardware, not the application. Check: "
            "dmesg for NVRM lines, DCGM_FI_DEV_ECC_DBE_VOL_TOTAL and DCGM_FI_DEV_ROW_REMAP_FAILURE. The health "
            f"guard quarantines the node as fatal on the same XIDs ({names.taint}=fatal). Action: run the DCGM "
            "diagnostic (dcgmi diag -r 3), open an RMA if it fails.",
        ),
        _alert(
            t,
            "GpuRepeatedXid",
            f'max_over_time(DCGM_EXP_XID_ERRORS_COUNT{{xid=~"{repeated}"}}[{window}]) >= {t.repeated_xid_count}',
            CRITICAL,
            "gpu",
            f"GPU {{{{ $labels.gpu }}}} on {node} repeated XID {{{{ $labels.xid }}}}",
            f"GPU {{{{ $labels.gpu }}}} on node {node} reported XID {{{{ $labels.xid }}}} "
            f"{{{{ $value }}}} times within {window}. One contained ECC error is survivable; repeated ones "
            "mean the memory is failing. Check: remapped rows, ECC counters. Action: drain the node and "
            "run the DCGM diagnostic.",
        ),
        _alert(
            t,
            "GpuDoubleBitEccErrors",
            "increase(DCGM_FI_DEV_ECC_DBE_VOL_TOTAL[10m]) > 0",
            CRITICAL,
            "gpu",
            f"GPU {{{{ $labels.gpu }}}} on {node} had uncorrectable (double-bit) ECC errors",
            f"GPU {{{{ $labels.gpu }}}} on node {node} counted double-bit ECC errors in the last 10 minutes; "
            "the job on it may have computed on corrupt data. Check: XID 48/94/95 in dmesg, remapped rows. "
            "Action: drain the node; restart the affected job from its last checkpoint.",
        ),
        _alert(
            t,
            "GpuRowRemapFailure",
            "DCGM_FI_DEV_ROW_REMAP_FAILURE > 0",
            CRITICAL,
            "gpu",
            f"GPU {{{{ $labels.gpu }}}} on {node} failed to remap a memory row",
            f"GPU {{{{ $labels.gpu }}}} on node {node} has no spare rows left to remap a failing one. "
            "Action: drain the node and open an RMA; a reset will not fix it.",
        ),
    ]


def _nvlink(t: AlertThresholds) -> list[dict[str, Any]]:
    node = f"{{{{ $labels.{DCGM_NODE_LABEL} }}}}"
    window = duration(t.nvlink_window_seconds)
    # One rate per counter joined with ``or`` (any of them over the limit): a regex selector over the three
    # names would produce colliding series once rate() drops the metric name.
    rising = " or ".join(
        f"rate(DCGM_FI_DEV_NVLINK_{kind}_ERROR_COUNT_TOTAL[{window}]) > {_number(t.nvlink_error_rate)}"
        for kind in ("REPLAY", "CRC_FLIT", "CRC_DATA")
    )
    return [
        _alert(
            t,
            "NvlinkRecoveryErrors",
            f"increase(DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL[{window}]) > 0",
            CRITICAL,
            "nvlink",
            f"NVLink recovery errors on GPU {{{{ $labels.gpu }}}} of {node}",
            f"An NVLink of GPU {{{{ $labels.gpu }}}} on node {node} needed link recovery in the last "
            f"{window}; NCCL traffic over it stalls while it recovers and may time out. Check: XID 74 in "
            "dmesg, `nvidia-smi nvlink -e`. Action: drain the node and reseat or replace the NVLink bridge "
            "or baseboard.",
        ),
        _alert(
            t,
            "NvlinkErrorsRising",
            rising,
            WARNING,
            "nvlink",
            f"NVLink replay/CRC errors rising on GPU {{{{ $labels.gpu }}}} of {node}",
            f"GPU {{{{ $labels.gpu }}}} on node {node} sees {{{{ $value }}}} NVLink replay or CRC errors "
            f"per second over {window}. Replays cost bandwidth before they cost correctness. Check: which "
            "lanes (`nvidia-smi nvlink -e`), temperature. Action: plan a drain; repeated growth becomes "
            "recovery errors.",
        ),
    ]


def _infiniband(t: AlertThresholds) -> list[dict[str, Any]]:
    where = f"{{{{ $labels.device }}}} port {{{{ $labels.port }}}} on {{{{ $labels.{IB_NODE_LABEL} }}}}"
    window = duration(t.ib_window_seconds)
    hold = duration(t.ib_link_hold_seconds)
    port_keys = f"{IB_NODE_LABEL}, device, port"
    ib_only = f'and on ({port_keys}) infiniband_port_info{{link_layer="InfiniBand"}}'

    def transport(name: str, counters: str, meaning: str) -> dict[str, Any]:
        expr = " or ".join(
            f"rate(infiniband_hw_{counter}_total[{window}]) > {_number(t.ib_transport_error_rate)}"
            for counter in counters.split("|")
        )
        return _alert(
            t,
            name,
            expr,
            WARNING,
            "infiniband",
            f"{meaning} on {where}",
            f"{where} counts {{{{ $value }}}} per second of {counters.replace('|', ' or ')} over {window}. "
            "These transport errors come before NCCL timeouts: a peer or a path is dropping packets. "
            "Check: the remote end (ibdiagnet, switch port counters), congestion (xmit wait), the same "
            "counters on the job's other nodes. Action: if one node stands out, drain it.",
        )

    return [
        _alert(
            t,
            "InfinibandPortNotActive",
            "infiniband_state_id != 4",
            CRITICAL,
            "infiniband",
            f"InfiniBand {where} is not ACTIVE",
            f"Logical state of {where} has been {{{{ $value }}}} (4 is ACTIVE) for {hold}. With the "
            "physical link up this points at the subnet manager; with it down, at the cable. Check: "
            "`ibstat`, the physical state alert, opensm logs. Action: multi-node jobs on this node lose "
            "bandwidth or hang; drain it until the port is ACTIVE.",
            hold,
        ),
        _alert(
            t,
            "InfinibandPhysicalLinkDown",
            "infiniband_physical_state_id != 5",
            CRITICAL,
            "infiniband",
            f"Physical link of {where} is down",
            f"Physical state of {where} has been {{{{ $value }}}} (5 is LinkUp) for {hold}. Check: cable "
            "and transceiver seating, the switch port, `mlxlink`. Action: drain the node; replace the "
            "cable or transceiver.",
            hold,
        ),
        _alert(
            t,
            "InfinibandRateBelowNominal",
            f"infiniband_rate_bytes_per_second < {_number(t.ib_nominal_rate_bytes_per_second)} {ib_only}",
            WARNING,
            "infiniband",
            f"{where} trained below its nominal rate",
            f"{where} runs at {{{{ $value | humanize }}}}B/s, below the nominal "
            f"{_number(t.ib_nominal_rate_bytes_per_second)} B/s. A port that trained at a lower width or "
            "speed slows every collective of the jobs on it. Check: `ibstat` width/speed, `mlxlink` BER. "
            "Action: reseat or replace the cable at the next drain.",
            hold,
        ),
        _alert(
            t,
            "InfinibandLinkDowned",
            f"increase(infiniband_link_downed_total[{window}]) > 0",
            WARNING,
            "infiniband",
            f"{where} went down and came back",
            f"{where} lost its link in the last {window} (link_downed). Each flap can kill "
            "NCCL communicators. Check: symbol errors and link error recovery on the same port, the switch "
            "side. Action: if it repeats, replace the cable.",
        ),
        _alert(
            t,
            "InfinibandSymbolErrorsRising",
            f"rate(infiniband_symbol_error_total[{window}]) > {_number(t.ib_symbol_error_rate)}",
            WARNING,
            "infiniband",
            f"Symbol errors rising on {where}",
            f"{where} counts {{{{ $value }}}} symbol errors per second over {window}: a marginal "
            "physical lane. Check: `mlxlink` eye/BER, the cable. Action: replace the cable before it "
            "becomes link-downed events.",
        ),
        _alert(
            t,
            "InfinibandReceiveErrorsRising",
            f"rate(infiniband_port_errors_received_total[{window}]) > {_number(t.ib_rcv_error_rate)}",
            WARNING,
            "infiniband",
            f"Receive errors rising on {where}",
            f"{where} receives {{{{ $value }}}} malformed packets per second over {window}. Check: "
            "symbol errors on this port and on the switch port facing it. Action: replace the cable if "
            "both ends show errors.",
        ),
        _alert(
            t,
            "InfinibandCongestion",
            f"rate(infiniband_port_transmit_wait_total[{window}]) > {_number(t.ib_xmit_wait_min_rate)} "
            f"and rate(infiniband_port_transmit_wait_total[{window}]) "
            f"> {_number(t.ib_xmit_wait_increase_factor)} "
            f"* rate(infiniband_port_transmit_wait_total[{window}] offset {window}) "
            f"and rate(infiniband_port_data_transmitted_bytes_total[{window}]) "
            f"< rate(infiniband_port_data_transmitted_bytes_total[{window}] offset {window})",
            WARNING,
            "infiniband",
            f"{where} waits more while sending less",
            f"Transmit wait on {where} grew more than {_number(t.ib_xmit_wait_increase_factor)}x over "
            f"{window} while the bytes it sent fell: the fabric is congested or a remote receiver is "
            "slow. Check: the same signal on the job's other nodes (one slow receiver shows everywhere), "
            "switch counters, adaptive routing. Action: find the slow peer; drain it if it is a host.",
        ),
        transport("InfinibandLocalAckTimeouts", "local_ack_timeout_err", "Local ACK timeouts"),
        transport("InfinibandSequenceErrors", "out_of_sequence|packet_seq_err", "Packet sequence errors"),
        _alert(
            t,
            "InfinibandExporterSysfsErrors",
            # The kernel's "N/A" (no PMA) is counted as reason="unsupported" to explain a missing series: not a fault.
            'increase(infiniband_exporter_scrape_errors_total{reason!="unsupported"}[15m]) > 0',
            WARNING,
            "infiniband",
            "ib-exporter on {{ $labels.node }} skipped series ({{ $labels.reason }})",
            "The InfiniBand exporter on {{ $labels.node }} skipped {{ $value }} series in 15m because "
            "sysfs files were {{ $labels.reason }}. Its other series are still exported. Check: `ls "
            "/sys/class/infiniband`, the driver (dmesg mlx5_core), a recent HCA reset. Action: none if "
            "reason is counter_wrapped once; otherwise fix the driver or the HCA.",
        ),
    ]


def _training(t: AlertThresholds) -> list[dict[str, Any]]:
    # Instant values held with ``for`` (not max_over_time over the window): a single busy sample resets
    # the clock, and a pod that just started is not called idle before the full window has passed.
    window = duration(t.hang_window_seconds)
    rate_window = "5m"
    training = f'max by (namespace, pod) (kube_pod_labels{{{t.workload_label}="training"}})'
    node = f"{{{{ $labels.{DCGM_NODE_LABEL} }}}}"
    idle_pct = _number(t.tensor_idle_ratio * 100)
    return [
        _alert(
            t,
            "TrainingTensorCoresIdle",
            f'(max by (namespace, pod) (DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{{pod!=""}}) < {_number(t.tensor_idle_ratio)}) '
            f"* on (namespace, pod) group_left () {training}",
            WARNING,
            "training",
            "Training pod {{ $labels.namespace }}/{{ $labels.pod }} has not used its tensor cores for "
            f"{window}",
            "Every GPU of training pod {{ $labels.namespace }}/{{ $labels.pod }} kept its tensor pipe below "
            f"{idle_pct}% active for {window}, while it holds the GPUs. GPU utilization may still read 100%: "
            "a kernel spinning in a collective counts as busy. Check: the job's step heartbeat, its logs "
            "for NCCL watchdog messages, the IB and NVLink bytes of its nodes. Action: if the heartbeat is "
            "flat too, treat it as a hang (see NcclHangSuspected).",
            window,
        ),
        _alert(
            t,
            "TrainingHeartbeatStalled",
            # One alert per job, not per rank: every worker of a job exports its own heartbeat. ``and ...
            # offset`` keeps a job younger than the window (no history yet) from firing.
            f"max by (namespace, job_name) (changes({t.heartbeat_metric}[{window}])) == 0 "
            f"and on (namespace, job_name) max by (namespace, job_name) ({t.heartbeat_metric} offset {window})",
            CRITICAL,
            "training",
            "Training job {{ $labels.namespace }}/{{ $labels.job_name }} made no step for " + window,
            f"{t.heartbeat_metric} of {{{{ $labels.namespace }}}}/{{{{ $labels.job_name }}}} has not moved for "
            f"{window}. NCCL hangs are silent: the PyTorch watchdog only fires after its heartbeat timeout "
            "(480 s) and collective timeout (10 min), and sometimes never. Check: tensor activity and "
            "IB/NVLink bytes of the job's nodes, py-spy dump of rank 0. Action: restart the job from its "
            "last checkpoint; drain the node the stuck rank ran on if a hardware alert points at it.",
        ),
        _alert(
            t,
            "NcclHangSuspected",
            f'max by ({DCGM_NODE_LABEL}) (DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{{pod!=""}}) < {_number(t.tensor_idle_ratio)} '
            f"and on ({DCGM_NODE_LABEL}) label_replace(sum by ({IB_NODE_LABEL}) "
            f"(rate(infiniband_port_data_transmitted_bytes_total[{rate_window}])), "
            f'"{DCGM_NODE_LABEL}", "$1", "{IB_NODE_LABEL}", "(.+)") < {_number(t.ib_flat_bytes_per_second)} '
            f"and on ({DCGM_NODE_LABEL}) sum by ({DCGM_NODE_LABEL}) "
            # NVLINK_TX_BYTES is already bytes per second (a gauge): averaged, not rate()d.
            f"(avg_over_time(DCGM_FI_PROF_NVLINK_TX_BYTES[{rate_window}])) < {_number(t.nvlink_flat_bytes_per_second)}",
            CRITICAL,
            "training",
            f"Node {node} holds GPUs for pods but computes and communicates nothing",
            f"On node {node}, GPUs assigned to pods kept tensor activity below {idle_pct}% for {window} "
            "while InfiniBand and NVLink traffic stayed flat: the signature of a silent NCCL hang. Check: "
            "which job owns the GPUs (pod label of DCGM_FI_PROF_PIPE_TENSOR_ACTIVE), its heartbeat, XID and "
            "link alerts on its nodes. Action: restart the job from its last checkpoint; drain the node if "
            "a hardware alert points at it.",
            window,
        ),
    ]


def _checkpoint(t: AlertThresholds) -> list[dict[str, Any]]:
    budget = _number(t.checkpoint_budget_seconds)
    return [
        _alert(
            t,
            "CheckpointOverBudget",
            f"max by (namespace, job_name) ({t.checkpoint_duration_metric}) > {budget}",
            WARNING,
            "checkpoint",
            "Checkpoint of {{ $labels.namespace }}/{{ $labels.job_name }} took {{ $value }} s "
            f"(budget {budget} s)",
            f"The last checkpoint of {{{{ $labels.namespace }}}}/{{{{ $labels.job_name }}}} took "
            f"{{{{ $value }}}} s, over the {budget} s budget: every checkpoint now stalls training longer "
            "than planned. Check: the checkpoint filesystem's throughput (the fio check job), metadata "
            "load from many writers, the job's checkpoint size. Action: fix the storage or reduce the "
            "checkpoint frequency until it is fixed.",
        ),
    ]


def _guard(t: AlertThresholds) -> list[dict[str, Any]]:
    """The health guard: what it quarantined, when it holds back, and the crashes it accounts for."""
    names = HealthNames(t.label_prefix)
    loop = duration(t.restart_loop_window_seconds)
    return [
        _alert(
            t,
            "GpuNodeQuarantined",
            "max by (node, class) (gpucluster_health_node_quarantined) == 1",
            WARNING,
            "gpu",
            "Node {{ $labels.node }} is quarantined as {{ $labels.class }}",
            f"The health guard tainted node {{{{ $labels.node }}}} {names.taint}={{{{ $labels.class }}}}"
            ":NoSchedule "
            "and evicted its training pods (and, for fatal, its inference pods). `kubectl describe node` shows "
            "the GpuHealthy condition with the signal. Action: none for degraded nodes (released after a healthy "
            "probation); for fatal ones repair the node, then `kubectl label node {{ $labels.node }} "
            f"{names.repaired}=<who>` (released after the probation).",
        ),
        _alert(
            t,
            "InfinibandSwitchFault",
            "max by (leaf) (gpucluster_health_switch_faults) == 1",
            CRITICAL,
            "infiniband",
            "Leaf switch {{ $labels.leaf }} is at fault: its nodes take no new pods",
            "The InfiniBand signals of several nodes under leaf switch {{ $labels.leaf }} went bad together, so the "
            f"health guard attributed them to the switch: every node under it carries {names.switch_fault}="
            "{{ $labels.leaf }}:NoSchedule; nothing was evicted or quarantined, and the guard rails and breaker are "
            "untouched. Check: the InfinibandSwitchFault event, `kubectl get nodes -l "
            f"{names.switch_fault}={{{{ $labels.leaf }}}}`, the switch's own logs. Action: repair the switch, then "
            f"`kubectl label node <any node of the leaf> {names.switch_repaired}=<who>` (released after the "
            "probation with its InfiniBand signals clear; an error-burst fault needs no mark).",
        ),
        _alert(
            t,
            "GpuHealthGuardSuppressed",
            "max(gpucluster_health_breaker_tripped) > 0",
            CRITICAL,
            "gpu",
            "The health guard refused a quarantine at its rate limit and stopped acting",
            "More nodes went bad than the guard may take out (nodes per hour, in total, or a share of a pool), "
            "so it quarantined none of the rest and waits for a person: a broken exporter, a hot row or a bad "
            "firmware must not drain the fleet. Check: the GpuHealthSuppressed events, the Lease annotation "
            f"{names.breaker}, which signal fires where. Action: fix the cause or quarantine by "
            "hand, then reset: `kubectl annotate lease -n <system namespace> health-guard "
            f"{names.breaker}-`.",
        ),
        _alert(
            t,
            "GpuPoolQuarantinedShareHigh",
            f"max by (pool) (gpucluster_health_pool_quarantined_ratio) > {_number(t.quarantined_pool_share)}",
            CRITICAL,
            "gpu",
            "{{ $value | humanizePercentage }} of pool {{ $labels.pool }} is quarantined",
            "A share of pool {{ $labels.pool }} this large points at a shared cause (cooling of a row, a switch, "
            "a driver or firmware roll-out) rather than single bad GPUs, and gangs that need the pool wait. "
            "Check: the signals per node on the GPU health dashboard. Action: fix the shared cause; release "
            "nodes as docs/training.md says (Release).",
            "5m",
        ),
        _alert(
            t,
            "GangRestartRateHigh",
            "sum by (pool) (increase(gpucluster_health_gang_restarts_total[1h])) > "
            f"{_number(t.gang_restart_rate_per_hour)}",
            WARNING,
            "training",
            "Gangs in pool {{ $labels.pool }} restarted {{ $value | humanize }} times in the last hour",
            "Every restart costs the work since the last checkpoint plus the restart itself. More than "
            f"{_number(t.gang_restart_rate_per_hour)} an hour means the pool fails faster than the checkpoint "
            "interval assumes. Check: time between failures on the GPU health dashboard, which signals quarantined "
            "the nodes. Action: shorten the checkpoint interval or fix the failing hardware class.",
        ),
        _alert(
            t,
            "GangRestartLoopOnNode",
            # The guard's restarts only: an application crash names no node to blame.
            'sum by (namespace, job, node) (increase(gpucluster_health_gang_restarts_total{cause="guard"}'
            f"[{loop}])) >= {t.restart_loop_count}",
            CRITICAL,
            "training",
            "Job {{ $labels.namespace }}/{{ $labels.job }} restarted {{ $value | humanize }} times because of node "
            "{{ $labels.node }}",
            f"The same node took the same job down {{{{ $value | humanize }}}} times within {loop}: it is released "
            f"and fails again. Check: the node's {names.history} annotation and its signals. "
            f"Action: keep it out (label {names.opt_out}=disabled only after taking it out of the "
            "pool by hand) "
            "and have it repaired.",
        ),
        _alert(
            t,
            "HealthGuardNoLeader",
            "max(gpucluster_health_leader) < 1 or absent(gpucluster_health_leader)",
            CRITICAL,
            "gpu",
            "No health guard replica leads",
            "No replica of the health guard holds its Lease (or none is scraped): bad GPUs stay in service and "
            "training keeps crashing on them. Action: check the health-guard Deployment in the system namespace "
            "(crash loop, RBAC, API reachability).",
            duration(t.controller_absent_seconds),
        ),
    ]


def _burst(t: AlertThresholds) -> list[dict[str, Any]]:
    """The burst controller is in the training path (it lifts the handover gate): its absence pages."""
    return [
        _alert(
            t,
            "BurstControllerNoLeader",
            "max(gpucluster_burst_leader) < 1 or absent(gpucluster_burst_leader)",
            CRITICAL,
            "burst",
            "No burst controller replica leads",
            "No replica of the burst controller holds its Lease (or none is scraped). Nothing opens or closes "
            "external capacity, and new training pods stay behind the handover scheduling gate. Action: check "
            "the burst-controller Deployment in the system namespace (crash loop, RBAC, API reachability).",
            duration(t.controller_absent_seconds),
        ),
        _alert(
            t,
            "TrainingHeldAtHandoverGate",
            "max(gpucluster_burst_gated_training_pods) > 0",
            WARNING,
            "burst",
            "{{ $value }} training pods held at the handover gate",
            "Training pods have waited at the handover scheduling gate past the controller's timeout "
            f"({t.handover_timeout_seconds}s), so it cannot release them (pod patch refused, lease lost). "
            "Action: read the burst controller's log and errors metric; as a last resort remove the "
            f"{t.label_prefix}/handover gate from the pods by hand.",
            duration(t.handover_timeout_seconds + 120),
        ),
    ]


def build_rule_spec(thresholds: AlertThresholds | None = None) -> dict[str, Any]:
    """The ``PrometheusRule`` ``spec`` (``{"groups": [...]}``) for ``thresholds`` (defaults if ``None``)."""
    t = thresholds or AlertThresholds()
    return {
        "groups": [
            {"name": "gpucluster.gpu-thermal", "rules": _gpu_thermal(t)},
            {"name": "gpucluster.gpu-errors", "rules": _gpu_errors(t)},
            {"name": "gpucluster.nvlink", "rules": _nvlink(t)},
            {"name": "gpucluster.infiniband", "rules": _infiniband(t)},
            {"name": "gpucluster.training", "rules": _training(t)},
            {"name": "gpucluster.checkpoint", "rules": _checkpoint(t)},
            {"name": "gpucluster.health-guard", "rules": _guard(t)},
            {"name": "gpucluster.burst", "rules": _burst(t)},
        ]
    }


def alert_names(spec: dict[str, Any]) -> list[str]:
    """Every alert name in ``spec``, in order."""
    return [rule["alert"] for group in spec["groups"] for rule in group["rules"]]


def render_rules_yaml(thresholds: AlertThresholds | None = None) -> str:
    """The rules as a Prometheus rules file (what ``promtool check rules`` reads)."""
    return yaml.safe_dump(build_rule_spec(thresholds), sort_keys=False, width=120)
