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

from typing import Any

import yaml

from agents.health_guard.contract import Names as HealthNames
from components.alert_rules_hardware import gpu_error_rules, gpu_thermal_rules, infiniband_rules, nvlink_rules
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


def _training(t: AlertThresholds) -> list[dict[str, Any]]:
    # Instant values held with ``for`` (not max_over_time over the window): a single busy sample resets
    # the clock, and a pod that just started is not called idle before the full window has passed.
    window = duration(t.hang_window_seconds)
    rate_window = "5m"
    training = f'max by (namespace, pod) (kube_pod_labels{{{t.workload_label}="training"}})'
    node = f"{{{{ $labels.{DCGM_NODE_LABEL} }}}}"
    idle_pct = promql_number(t.tensor_idle_ratio * 100)
    return [
        alert(
            t,
            "TrainingTensorCoresIdle",
            f'(max by (namespace, pod) (DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{{pod!=""}}) '
            f"< {promql_number(t.tensor_idle_ratio)}) "
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
        alert(
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
        alert(
            t,
            "NcclHangSuspected",
            f'max by ({DCGM_NODE_LABEL}) (DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{{pod!=""}}) '
            f"< {promql_number(t.tensor_idle_ratio)} "
            f"and on ({DCGM_NODE_LABEL}) label_replace(sum by ({IB_NODE_LABEL}) "
            f"(rate(infiniband_port_data_transmitted_bytes_total[{rate_window}])), "
            f'"{DCGM_NODE_LABEL}", "$1", "{IB_NODE_LABEL}", "(.+)") < {promql_number(t.ib_flat_bytes_per_second)} '
            f"and on ({DCGM_NODE_LABEL}) sum by ({DCGM_NODE_LABEL}) "
            # NVLINK_TX_BYTES is already bytes per second (a gauge): averaged, not rate()d.
            f"(avg_over_time(DCGM_FI_PROF_NVLINK_TX_BYTES[{rate_window}])) "
            f"< {promql_number(t.nvlink_flat_bytes_per_second)}",
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
    budget = promql_number(t.checkpoint_budget_seconds)
    return [
        alert(
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
        alert(
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
        alert(
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
        alert(
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
        alert(
            t,
            "GpuPoolQuarantinedShareHigh",
            f"max by (pool) (gpucluster_health_pool_quarantined_ratio) > {promql_number(t.quarantined_pool_share)}",
            CRITICAL,
            "gpu",
            "{{ $value | humanizePercentage }} of pool {{ $labels.pool }} is quarantined",
            "A share of pool {{ $labels.pool }} this large points at a shared cause (cooling of a row, a switch, "
            "a driver or firmware roll-out) rather than single bad GPUs, and gangs that need the pool wait. "
            "Check: the signals per node on the GPU health dashboard. Action: fix the shared cause; release "
            "nodes as docs/training.md says (Release).",
            "5m",
        ),
        alert(
            t,
            "GangRestartRateHigh",
            "sum by (pool) (increase(gpucluster_health_gang_restarts_total[1h])) > "
            f"{promql_number(t.gang_restart_rate_per_hour)}",
            WARNING,
            "training",
            "Gangs in pool {{ $labels.pool }} restarted {{ $value | humanize }} times in the last hour",
            "Every restart costs the work since the last checkpoint plus the restart itself. More than "
            f"{promql_number(t.gang_restart_rate_per_hour)} an hour means the pool fails faster than the checkpoint "
            "interval assumes. Check: time between failures on the GPU health dashboard, which signals quarantined "
            "the nodes. Action: shorten the checkpoint interval or fix the failing hardware class.",
        ),
        alert(
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
        alert(
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
        alert(
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
        alert(
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
            {"name": "gpucluster.gpu-thermal", "rules": gpu_thermal_rules(t)},
            {"name": "gpucluster.gpu-errors", "rules": gpu_error_rules(t)},
            {"name": "gpucluster.nvlink", "rules": nvlink_rules(t)},
            {"name": "gpucluster.infiniband", "rules": infiniband_rules(t)},
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
