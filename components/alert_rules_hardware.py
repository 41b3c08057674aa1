"""Alert rules for the hardware: GPU temperature and errors, NVLink, InfiniBand (one function per group,
each a pure function of :class:`~components.alert_thresholds.AlertThresholds`)."""

from __future__ import annotations

from typing import Any

from agents.health_guard.contract import Names as HealthNames
from components.alert_thresholds import (
    CRITICAL,
    DCGM_NODE_LABEL,
    IB_NODE_LABEL,
    WARNING,
    AlertThresholds,
    alert,
    duration,
    promql_number,
)


def gpu_thermal_rules(t: AlertThresholds) -> list[dict[str, Any]]:
    names = HealthNames(t.label_prefix)
    node = f"{{{{ $labels.{DCGM_NODE_LABEL} }}}}"
    threshold = promql_number(t.thermal.thermal_threshold_celsius)
    warning = promql_number(t.thermal.thermal_warning_celsius)
    return [
        alert(
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
        alert(
            t,
            "GpuTemperatureWarning",
            f"DCGM_FI_DEV_GPU_TEMP >= {warning} and DCGM_FI_DEV_GPU_TEMP < {threshold}",
            WARNING,
            "gpu",
            f"GPU {{{{ $labels.gpu }}}} on {node} at {{{{ $value }}}} C, within "
            f"{promql_number(t.thermal.thermal_warning_band_celsius)} C of the limit",
            f"GPU {{{{ $labels.gpu }}}} on node {node} has run between {warning} C and {threshold} C for "
            f"{duration(t.thermal_warning_hold_seconds)}. Nothing is tainted yet. Check: cooling of the "
            "rack, a fan alarm in the BMC, whether the whole node or one GPU runs warm. Action: schedule "
            "maintenance before the guard pulls the node out of service.",
            duration(t.thermal_warning_hold_seconds),
        ),
        alert(
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


def gpu_error_rules(t: AlertThresholds) -> list[dict[str, Any]]:
    names = HealthNames(t.label_prefix)
    node = f"{{{{ $labels.{DCGM_NODE_LABEL} }}}}"
    critical = " or ".join(f"DCGM_FI_DEV_XID_ERRORS == {x}" for x in t.critical_xids)
    repeated = "|".join(str(x) for x in t.repeated_xids)
    window = duration(t.repeated_xid_window_seconds)
    return [
        alert(
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
        alert(
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
        alert(
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
        alert(
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


def nvlink_rules(t: AlertThresholds) -> list[dict[str, Any]]:
    node = f"{{{{ $labels.{DCGM_NODE_LABEL} }}}}"
    window = duration(t.nvlink_window_seconds)
    # One rate per counter joined with ``or`` (any of them over the limit): a regex selector over the three
    # names would produce colliding series once rate() drops the metric name.
    rising = " or ".join(
        f"rate(DCGM_FI_DEV_NVLINK_{kind}_ERROR_COUNT_TOTAL[{window}]) > {promql_number(t.nvlink_error_rate)}"
        for kind in ("REPLAY", "CRC_FLIT", "CRC_DATA")
    )
    return [
        alert(
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
        alert(
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


def infiniband_rules(t: AlertThresholds) -> list[dict[str, Any]]:
    where = f"{{{{ $labels.device }}}} port {{{{ $labels.port }}}} on {{{{ $labels.{IB_NODE_LABEL} }}}}"
    window = duration(t.ib_window_seconds)
    hold = duration(t.ib_link_hold_seconds)
    port_keys = f"{IB_NODE_LABEL}, device, port"
    ib_only = f'and on ({port_keys}) infiniband_port_info{{link_layer="InfiniBand"}}'

    def transport(name: str, counters: str, meaning: str) -> dict[str, Any]:
        expr = " or ".join(
            f"rate(infiniband_hw_{counter}_total[{window}]) > {promql_number(t.ib_transport_error_rate)}"
            for counter in counters.split("|")
        )
        return alert(
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
        alert(
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
        alert(
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
        alert(
            t,
            "InfinibandRateBelowNominal",
            f"infiniband_rate_bytes_per_second < {promql_number(t.ib_nominal_rate_bytes_per_second)} {ib_only}",
            WARNING,
            "infiniband",
            f"{where} trained below its nominal rate",
            f"{where} runs at {{{{ $value | humanize }}}}B/s, below the nominal "
            f"{promql_number(t.ib_nominal_rate_bytes_per_second)} B/s. A port that trained at a lower width or "
            "speed slows every collective of the jobs on it. Check: `ibstat` width/speed, `mlxlink` BER. "
            "Action: reseat or replace the cable at the next drain.",
            hold,
        ),
        alert(
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
        alert(
            t,
            "InfinibandSymbolErrorsRising",
            f"rate(infiniband_symbol_error_total[{window}]) > {promql_number(t.ib_symbol_error_rate)}",
            WARNING,
            "infiniband",
            f"Symbol errors rising on {where}",
            f"{where} counts {{{{ $value }}}} symbol errors per second over {window}: a marginal "
            "physical lane. Check: `mlxlink` eye/BER, the cable. Action: replace the cable before it "
            "becomes link-downed events.",
        ),
        alert(
            t,
            "InfinibandReceiveErrorsRising",
            f"rate(infiniband_port_errors_received_total[{window}]) > {promql_number(t.ib_rcv_error_rate)}",
            WARNING,
            "infiniband",
            f"Receive errors rising on {where}",
            f"{where} receives {{{{ $value }}}} malformed packets per second over {window}. Check: "
            "symbol errors on this port and on the switch port facing it. Action: replace the cable if "
            "both ends show errors.",
        ),
        alert(
            t,
            "InfinibandCongestion",
            f"rate(infiniband_port_transmit_wait_total[{window}]) > {promql_number(t.ib_xmit_wait_min_rate)} "
            f"and rate(infiniband_port_transmit_wait_total[{window}]) "
            f"> {promql_number(t.ib_xmit_wait_increase_factor)} "
            f"* rate(infiniband_port_transmit_wait_total[{window}] offset {window}) "
            f"and rate(infiniband_port_data_transmitted_bytes_total[{window}]) "
            f"< rate(infiniband_port_data_transmitted_bytes_total[{window}] offset {window})",
            WARNING,
            "infiniband",
            f"{where} waits more while sending less",
            f"Transmit wait on {where} grew more than {promql_number(t.ib_xmit_wait_increase_factor)}x over "
            f"{window} while the bytes it sent fell: the fabric is congested or a remote receiver is "
            "slow. Check: the same signal on the job's other nodes (one slow receiver shows everywhere), "
            "switch counters, adaptive routing. Action: find the slow peer; drain it if it is a host.",
        ),
        transport("InfinibandLocalAckTimeouts", "local_ack_timeout_err", "Local ACK timeouts"),
        transport("InfinibandSequenceErrors", "out_of_sequence|packet_seq_err", "Packet sequence errors"),
        alert(
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
