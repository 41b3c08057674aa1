"""Alert rules: structure in Python, syntax with `promtool check rules`, behaviour with `promtool test rules`.

promtool comes from Debian's prometheus package (`make observability-tools`). Each behaviour case below is
one promtool unit test with synthetic series; expected annotations are the rule's templates expanded here
for the expected labels and value, so a wording change cannot hide a wrong label.
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from agents.health_guard.contract import FATAL_XIDS, XIDS, HealthClass, default_signals
from agents.health_guard.thermal import Thermal
from agents.kit.settings import SettingsError
from components.alert_rules import AlertThresholds, alert_names, build_rule_spec, duration, render_rules_yaml
from components.mockrt import RunResult
from tests.promtool_support import expected_alert, promtool, rule, run_unit_test, series
from tests.test_health_guard_xid_query import listed_xids

GPU = {"gpu": "0", "UUID": "GPU-0a", "Hostname": "gpu-node-1", "modelName": "NVIDIA H100 80GB HBM3"}
IB = {"device": "mlx5_0", "port": "1", "node": "gpu-node-1", "instance": "10.0.0.5:9315"}
JOB = {"namespace": "team-a", "job_name": "llm-70b"}
LEADER = "gpucluster_burst_leader"
RESTARTS = "gpucluster_health_gang_restarts_total"
JOB_GANG = {"namespace": "team-a", "job": "llm-70b", "pool": "h100-a", "cause": "guard"}


@dataclass
class Case:
    id: str
    alert: str
    input_series: list[dict[str, str]]
    eval_time: str
    # (labels of the alert without rule labels, value the annotations show); empty: must not fire.
    fires: list[tuple[dict[str, str], float]] = field(default_factory=list)


CASES = [
    Case(
        "79C for 2m fires", "GpuTemperatureCritical", [series("DCGM_FI_DEV_GPU_TEMP", GPU, "79x20")], "2m", [(GPU, 79)]
    ),
    Case(
        "79C for 1m45s is only pending",
        "GpuTemperatureCritical",
        [series("DCGM_FI_DEV_GPU_TEMP", GPU, "79x20")],
        "105s",
    ),
    Case(
        "exactly 78C for 2m fires",
        "GpuTemperatureCritical",
        [series("DCGM_FI_DEV_GPU_TEMP", GPU, "78x20")],
        "2m",
        [(GPU, 78)],
    ),
    Case("77C never fires critical", "GpuTemperatureCritical", [series("DCGM_FI_DEV_GPU_TEMP", GPU, "77x80")], "20m"),
    Case(
        "a dip below 78C restarts the hold",
        "GpuTemperatureCritical",
        [series("DCGM_FI_DEV_GPU_TEMP", GPU, "79x6 70 79x10")],
        "3m",
    ),
    Case(
        "77C for 5m warns", "GpuTemperatureWarning", [series("DCGM_FI_DEV_GPU_TEMP", GPU, "77x40")], "5m", [(GPU, 77)]
    ),
    Case("72C does not warn", "GpuTemperatureWarning", [series("DCGM_FI_DEV_GPU_TEMP", GPU, "72x40")], "10m"),
    Case(
        "HW thermal slowdown bit throttles",
        "GpuThermalThrottling",
        [series("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", GPU, "64x40")],
        "5m",
        [(GPU, 2)],
    ),
    Case(
        "power cap bit is not thermal",
        "GpuThermalThrottling",
        [series("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", GPU, "4x40")],
        "10m",
    ),
    Case("XID 79 fires", "GpuCriticalXid", [series("DCGM_FI_DEV_XID_ERRORS", GPU, "0 0 79x10")], "1m", [(GPU, 79)]),
    Case("XID 13 is the application", "GpuCriticalXid", [series("DCGM_FI_DEV_XID_ERRORS", GPU, "13x10")], "1m"),
    Case(
        "XID 94 twice fires",
        "GpuRepeatedXid",
        [series("DCGM_EXP_XID_ERRORS_COUNT", {**GPU, "xid": "94"}, "1 1 2x10")],
        "2m",
        [({**GPU, "xid": "94"}, 2)],
    ),
    Case(
        "XID 94 once does not",
        "GpuRepeatedXid",
        [series("DCGM_EXP_XID_ERRORS_COUNT", {**GPU, "xid": "94"}, "1x10")],
        "2m",
    ),
    Case(
        "double-bit ECC fires",
        "GpuDoubleBitEccErrors",
        [series("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", GPU, "0x10 2x10")],
        "5m",
        [(GPU, 2)],
    ),
    Case(
        "row remap failure fires",
        "GpuRowRemapFailure",
        [series("DCGM_FI_DEV_ROW_REMAP_FAILURE", GPU, "1x4")],
        "1m",
        [(GPU, 1)],
    ),
    Case(
        "NVLink recovery fires",
        "NvlinkRecoveryErrors",
        [series("DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL", GPU, "0x20 1x20")],
        "10m",
        [(GPU, 1)],
    ),
    Case(
        "NVLink replays rising fire",
        "NvlinkErrorsRising",
        [
            series("DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL", GPU, "0+30x60"),
            series("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", GPU, "0+15x60"),
        ],
        "10m",
        [(GPU, 2)],
    ),
    Case(
        "flat NVLink error counters stay quiet",
        "NvlinkErrorsRising",
        [series("DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL", GPU, "500x60")],
        "10m",
    ),
    Case(
        "link goes down fires",
        "InfinibandPortNotActive",
        [series("infiniband_state_id", IB, "4x4 1x20")],
        "4m",
        [(IB, 1)],
    ),
    Case("active link is quiet", "InfinibandPortNotActive", [series("infiniband_state_id", IB, "4x40")], "10m"),
    Case(
        "physical link down fires",
        "InfinibandPhysicalLinkDown",
        [series("infiniband_physical_state_id", IB, "5x4 3x20")],
        "4m",
        [(IB, 3)],
    ),
    Case(
        "HDR on an NDR fabric is below nominal",
        "InfinibandRateBelowNominal",
        [
            series("infiniband_rate_bytes_per_second", IB, "25000000000x20"),
            series("infiniband_port_info", {**IB, "link_layer": "InfiniBand"}, "1x20"),
        ],
        "2m",
        [(IB, 25e9)],
    ),
    Case(
        "a RoCE port is not held to the IB nominal rate",
        "InfinibandRateBelowNominal",
        [
            series("infiniband_rate_bytes_per_second", IB, "12500000000x20"),
            series("infiniband_port_info", {**IB, "link_layer": "Ethernet"}, "1x20"),
        ],
        "3m",
    ),
    Case(
        "link downed counter fires",
        "InfinibandLinkDowned",
        [series("infiniband_link_downed_total", IB, "3x10 4x30")],
        "5m",
        [(IB, 1)],
    ),
    Case(
        "symbol errors rising fire",
        "InfinibandSymbolErrorsRising",
        [series("infiniband_symbol_error_total", IB, "0+15x60")],
        "10m",
        [(IB, 1)],
    ),
    Case(
        "receive errors rising fire",
        "InfinibandReceiveErrorsRising",
        [series("infiniband_port_errors_received_total", IB, "0+3x60")],
        "10m",
        [(IB, 0.2)],
    ),
    Case(
        "xmit wait up while bytes fall fires",
        "InfinibandCongestion",
        [
            series("infiniband_port_transmit_wait_total", IB, "0+15000x40 600000+60000x40"),
            series("infiniband_port_data_transmitted_bytes_total", IB, "0+3000000000x40 120000000000+1000000000x40"),
        ],
        "20m",
        [(IB, 4000)],
    ),
    Case(
        "xmit wait up with bytes up is just load",
        "InfinibandCongestion",
        [
            series("infiniband_port_transmit_wait_total", IB, "0+15000x40 600000+60000x40"),
            series("infiniband_port_data_transmitted_bytes_total", IB, "0+1000000000x80"),
        ],
        "20m",
    ),
    Case(
        "local ack timeouts fire",
        "InfinibandLocalAckTimeouts",
        [series("infiniband_hw_local_ack_timeout_err_total", IB, "0+30x60")],
        "10m",
        [(IB, 2)],
    ),
    Case(
        "sequence errors fire",
        "InfinibandSequenceErrors",
        [
            series("infiniband_hw_out_of_sequence_total", IB, "0+15x60"),
            series("infiniband_hw_packet_seq_err_total", IB, "0+45x60"),
        ],
        "10m",
        [(IB, 1)],
    ),
    Case(
        "exporter sysfs errors warn",
        "InfinibandExporterSysfsErrors",
        [series("infiniband_exporter_scrape_errors_total", {"node": "gpu-node-1", "reason": "garbage"}, "0x10 1x20")],
        "5m",
        [({"node": "gpu-node-1", "reason": "garbage"}, 1)],
    ),
    Case(
        "the kernel's N/A (reason unsupported) is no exporter error",
        "InfinibandExporterSysfsErrors",
        [
            series("infiniband_exporter_scrape_errors_total", {"node": "gpu-node-1", "reason": "unsupported"},
                   "0+4x30"),
            series("infiniband_exporter_scrape_errors_total", {"node": "gpu-node-2", "reason": "unsupported"},
                   "0x10 1x20"),
            series("infiniband_exporter_scrape_errors_total", {"node": "gpu-node-2", "reason": "unreadable"},
                   "0x10 2x20"),
        ],
        "5m",
        [({"node": "gpu-node-2", "reason": "unreadable"}, 2)],
    ),
    Case(
        "flat heartbeat fires",
        "TrainingHeartbeatStalled",
        [series("training_step_heartbeat_timestamp_seconds", JOB, "100+1x40 140x80")],
        "26m",
        [(JOB, 0)],
    ),
    Case(
        "moving heartbeat is quiet",
        "TrainingHeartbeatStalled",
        [series("training_step_heartbeat_timestamp_seconds", JOB, "0+1x120")],
        "25m",
    ),
    Case(
        "a job younger than the window is not stalled",
        "TrainingHeartbeatStalled",
        [series("training_step_heartbeat_timestamp_seconds", JOB, "5x40")],
        "9m",
    ),
    Case(
        "idle tensor cores of a training pod warn",
        "TrainingTensorCoresIdle",
        [
            series("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", {**GPU, "namespace": "team-a", "pod": "llm-70b-0"}, "0.001x80"),
            series(
                "kube_pod_labels",
                {"namespace": "team-a", "pod": "llm-70b-0", "label_gpucluster_io_workload": "training"},
                "1x80",
            ),
        ],
        "15m",
        [({"namespace": "team-a", "pod": "llm-70b-0"}, 0.001)],
    ),
    Case(
        "idle inference pod is not a training hang",
        "TrainingTensorCoresIdle",
        [
            series("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", {**GPU, "namespace": "serve", "pod": "sd-0"}, "0x80"),
            series(
                "kube_pod_labels",
                {"namespace": "serve", "pod": "sd-0", "label_gpucluster_io_workload": "inference"},
                "1x80",
            ),
        ],
        "19m",
    ),
    Case(
        "idle GPUs with flat IB and NVLink is a hang",
        "NcclHangSuspected",
        [
            series("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", {**GPU, "namespace": "team-a", "pod": "llm-70b-0"}, "0x80"),
            series("infiniband_port_data_transmitted_bytes_total", IB, "5000x80"),
            series("DCGM_FI_PROF_NVLINK_TX_BYTES", GPU, "7000x80"),
        ],
        "16m",
        [({"Hostname": "gpu-node-1"}, 0)],
    ),
    Case(
        "idle GPUs with busy IB is not a hang",
        "NcclHangSuspected",
        [
            series("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", {**GPU, "namespace": "team-a", "pod": "llm-70b-0"}, "0x80"),
            series("infiniband_port_data_transmitted_bytes_total", IB, "0+1000000000x80"),
            series("DCGM_FI_PROF_NVLINK_TX_BYTES", GPU, "7000x80"),
        ],
        "19m",
    ),
    Case(
        "busy NVLink (a bytes-per-second gauge) with idle tensor cores and flat IB is not a hang",
        "NcclHangSuspected",
        [
            series("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", {**GPU, "namespace": "team-a", "pod": "llm-70b-0"}, "0x80"),
            series("infiniband_port_data_transmitted_bytes_total", IB, "5000x80"),
            series("DCGM_FI_PROF_NVLINK_TX_BYTES", GPU, "5000000000x80"),
        ],
        "19m",
    ),
    Case(
        "one stalled job of many ranks is one alert",
        "TrainingHeartbeatStalled",
        [series("training_step_heartbeat_timestamp_seconds", {**JOB, "rank": str(r), "pod": f"w-{r}"},
                "100+1x40 140x80") for r in range(4)],
        "26m",
        [(JOB, 0)],
    ),
    Case(
        "a job with one moving rank is not stalled",
        "TrainingHeartbeatStalled",
        [series("training_step_heartbeat_timestamp_seconds", {**JOB, "rank": "0", "pod": "w-0"}, "100+1x40 140x80"),
         series("training_step_heartbeat_timestamp_seconds", {**JOB, "rank": "1", "pod": "w-1"}, "100+1x120")],
        "26m",
    ),
    Case(
        "a slow checkpoint on several ranks is one alert with the slowest",
        "CheckpointOverBudget",
        [series("gpucluster_checkpoint_duration_seconds", {**JOB, "rank": "0"}, "42x4"),
         series("gpucluster_checkpoint_duration_seconds", {**JOB, "rank": "1"}, "37x4")],
        "1m",
        [(JOB, 42)],
    ),
    Case(
        "slow checkpoint warns",
        "CheckpointOverBudget",
        [series("gpucluster_checkpoint_duration_seconds", JOB, "42x4")],
        "1m",
        [(JOB, 42)],
    ),
    Case(
        "checkpoint in budget is quiet",
        "CheckpointOverBudget",
        [series("gpucluster_checkpoint_duration_seconds", JOB, "28x4")],
        "1m",
    ),
    Case("quarantined node warns", "GpuNodeQuarantined",
         [series("gpucluster_health_node_quarantined", {"node": "gpu-node-1", "class": "fatal", "pod": "g"}, "1x4")],
         "1m", [({"node": "gpu-node-1", "class": "fatal"}, 1)]),
    Case("a switch fault pages once per leaf", "InfinibandSwitchFault",
         [series("gpucluster_health_switch_faults", {"leaf": "leaf-07", "pod": "g"}, "1x4")], "1m",
         [({"leaf": "leaf-07"}, 1)]),
    Case("a cleared switch fault is quiet", "InfinibandSwitchFault",
         [series("gpucluster_health_switch_faults", {"leaf": "leaf-07", "pod": "g"}, "0x4")], "1m", []),
    Case("tripped breaker pages", "GpuHealthGuardSuppressed",
         [series("gpucluster_health_breaker_tripped", {"pod": "g"}, "1x4")], "1m", [({}, 1)]),
    Case("breaker not tripped is quiet", "GpuHealthGuardSuppressed",
         [series("gpucluster_health_breaker_tripped", {"pod": "g"}, "0x4")], "1m"),
    Case("a third of a pool quarantined pages", "GpuPoolQuarantinedShareHigh",
         [series("gpucluster_health_pool_quarantined_ratio", {"pool": "h100-a", "pod": "g"}, "0.25x10")], "6m",
         [({"pool": "h100-a"}, 0.25)]),
    Case("a small share of a pool is quiet", "GpuPoolQuarantinedShareHigh",
         [series("gpucluster_health_pool_quarantined_ratio", {"pool": "h100-a", "pod": "g"}, "0.05x10")], "6m"),
    Case("four gang restarts in an hour warn", "GangRestartRateHigh",
         [series(RESTARTS, {**JOB_GANG, "node": "gpu-node-1"}, "0 0 0 0 2 2 2 2 2 2"),
          series(RESTARTS, {**JOB_GANG, "node": "gpu-node-2"}, "0 0 0 0 0 0 2 2 2 2")],
         # increase() extrapolates half a sample interval past the window's last sample: 4 × 9.5 / 9.
         "9m", [({"pool": "h100-a"}, 4 * 9.5 / 9)]),
    Case("one gang restart an hour is quiet", "GangRestartRateHigh",
         [series(RESTARTS, {**JOB_GANG, "node": "gpu-node-1"}, "0 0 0 1 1 1 1 1 1 1")], "9m"),
    Case("a job restarted twice by one node pages", "GangRestartLoopOnNode",
         [series(RESTARTS, {**JOB_GANG, "node": "gpu-node-1"}, "0 0 1 1 2 2 2 2 2 2")], "9m",
         [({"namespace": "team-a", "job": "llm-70b", "node": "gpu-node-1"}, 2 * 9.5 / 9)]),
    Case("application crashes name no node: no loop", "GangRestartLoopOnNode",
         [series(RESTARTS, {**JOB_GANG, "node": "", "cause": "application"}, "0 0 1 1 2 2 3 3 3 3")], "9m"),
    Case("application crashes count toward the pool's restart rate", "GangRestartRateHigh",
         [series(RESTARTS, {**JOB_GANG, "node": "", "cause": "application"}, "0 0 0 0 4 4 4 4 4 4")], "9m",
         [({"pool": "h100-a"}, 4 * 9.5 / 9)]),
    Case("restarts from different nodes are no loop", "GangRestartLoopOnNode",
         [series(RESTARTS, {**JOB_GANG, "node": "gpu-node-1"}, "0 0 1 1 1 1 1 1 1 1"),
          series(RESTARTS, {**JOB_GANG, "node": "gpu-node-2"}, "0 0 0 0 1 1 1 1 1 1")], "9m"),
    Case("no health guard leader pages", "HealthGuardNoLeader",
         [series("gpucluster_health_leader", {"pod": "a"}, "0x12"),
          series("gpucluster_health_leader", {"pod": "b"}, "0x12")], "2m", [({}, 0)]),
    Case("one health guard leader is quiet", "HealthGuardNoLeader",
         [series("gpucluster_health_leader", {"pod": "a"}, "1x12"),
          series("gpucluster_health_leader", {"pod": "b"}, "0x12")], "2m"),
    Case("no leader pages", "BurstControllerNoLeader",
         [series(LEADER, {"pod": "a"}, "0x12"), series(LEADER, {"pod": "b"}, "0x12")], "2m", [({}, 0)]),
    Case("one leader is quiet", "BurstControllerNoLeader",
         [series(LEADER, {"pod": "a"}, "1x12"), series(LEADER, {"pod": "b"}, "0x12")], "2m"),
    Case("no controller scraped pages", "BurstControllerNoLeader",
         [series("up", {"job": "other"}, "1x12")], "2m", [({}, 1)]),
    Case("gate held past the timeout warns", "TrainingHeldAtHandoverGate",
         [series("gpucluster_burst_gated_training_pods", {"pod": "a"}, "4x40")], "7m", [({}, 4)]),
    Case("gate released within the timeout is quiet", "TrainingHeldAtHandoverGate",
         [series("gpucluster_burst_gated_training_pods", {"pod": "a"}, "4x16 0x24")], "7m"),
]


@pytest.fixture(scope="module")
def rules_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("rules") / "rules.yml"
    path.write_text(render_rules_yaml())
    return path


def test_promtool_check_rules_accepts_the_rendered_rules(rules_file: Path) -> None:
    result = subprocess.run([promtool(), "check", "rules", str(rules_file)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 32 rules found" in result.stdout


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_promtool_unit(case: Case, rules_file: Path, tmp_path: Path) -> None:
    spec = build_rule_spec()
    exp_alerts = [expected_alert(spec, case.alert, labels, value) for labels, value in case.fires]
    result = run_unit_test(rules_file, tmp_path / "test.yml", case.input_series,
                           [{"eval_time": case.eval_time, "alertname": case.alert, "exp_alerts": exp_alerts}])
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_alert_has_summary_description_and_severity() -> None:
    spec = build_rule_spec()
    names = alert_names(spec)
    assert len(names) == len(set(names)) == 32
    for group in spec["groups"]:
        for r in group["rules"]:
            assert r["labels"]["severity"] in {"critical", "warning"}, r["alert"]
            assert r["labels"]["component"] in {"gpu", "nvlink", "infiniband", "training", "checkpoint", "burst"}
            assert set(r["annotations"]) == {"summary", "description"}, r["alert"]
            assert "Action:" in r["annotations"]["description"], r["alert"]


def test_every_alert_is_exercised_by_a_firing_case() -> None:
    fired = {c.alert for c in CASES if c.fires}
    assert fired == set(alert_names(build_rule_spec()))


def test_thresholds_flow_into_the_rules() -> None:
    spec = build_rule_spec(
        AlertThresholds(
            thermal=Thermal(thermal_threshold_celsius=80, thermal_hold_seconds=90, thermal_warning_band_celsius=2.5),
            critical_xids=(79,),
            heartbeat_metric="my_steps_total",
            checkpoint_budget_seconds=45,
            extra_labels={"cluster": "prod-eu"},
        )
    )
    crit = rule(spec, "GpuTemperatureCritical")
    assert crit["expr"] == "DCGM_FI_DEV_GPU_TEMP >= 80"
    assert crit["for"] == "90s"
    assert crit["labels"] == {"severity": "critical", "component": "gpu", "cluster": "prod-eu"}
    assert rule(spec, "GpuTemperatureWarning")["expr"] == ("DCGM_FI_DEV_GPU_TEMP >= 77.5 and DCGM_FI_DEV_GPU_TEMP < 80")
    assert rule(spec, "GpuCriticalXid")["expr"] == "DCGM_FI_DEV_XID_ERRORS == 79"
    assert rule(spec, "TrainingHeartbeatStalled")["expr"] == (
        "max by (namespace, job_name) (changes(my_steps_total[15m])) == 0 "
        "and on (namespace, job_name) max by (namespace, job_name) (my_steps_total offset 15m)"
    )
    assert rule(spec, "CheckpointOverBudget")["expr"] == (
        "max by (namespace, job_name) (gpucluster_checkpoint_duration_seconds) > 45")


def test_health_and_thermal_texts_use_the_stacks_label_prefix() -> None:
    spec = build_rule_spec(AlertThresholds(label_prefix="ml.example.org"))
    texts = {r["alert"]: " ".join(r["annotations"].values()) for g in spec["groups"] for r in g["rules"]}
    assert [name for name, text in texts.items() if "gpucluster.io/" in text] == []
    assert "ml.example.org/gpu-health=degraded:NoSchedule" in texts["GpuTemperatureCritical"]
    assert "ml.example.org/gpu-health={{ $labels.class }}:NoSchedule" in texts["GpuNodeQuarantined"]
    assert "ml.example.org/gpu-repaired=<who>" in texts["GpuNodeQuarantined"]
    assert "ml.example.org/gpu-health-breaker-`" in texts["GpuHealthGuardSuppressed"]
    assert "ml.example.org/gpu-health-guard=disabled" in texts["GangRestartLoopOnNode"]


def test_default_thermal_rule_is_78c_for_2m() -> None:
    crit = rule(build_rule_spec(), "GpuTemperatureCritical")
    assert (crit["expr"], crit["for"]) == ("DCGM_FI_DEV_GPU_TEMP >= 78", "2m")
    assert rule(build_rule_spec(), "GpuCriticalXid")["expr"] == (
        "DCGM_FI_DEV_XID_ERRORS == 48 or DCGM_FI_DEV_XID_ERRORS == 64 or DCGM_FI_DEV_XID_ERRORS == 74 "
        "or DCGM_FI_DEV_XID_ERRORS == 79 or DCGM_FI_DEV_XID_ERRORS == 95 or DCGM_FI_DEV_XID_ERRORS == 119 "
        "or DCGM_FI_DEV_XID_ERRORS == 120"
    )


def test_the_xids_that_page_are_the_xids_that_quarantine(prod: RunResult, local: RunResult) -> None:
    """One XID table: every XID the guard calls fatal pages, and nothing else does (the stacks' rules)."""
    assert tuple(x.number for x in XIDS if x.health_class is HealthClass.FATAL) == FATAL_XIDS
    assert AlertThresholds().critical_xids == FATAL_XIDS
    fatal_query = next(s.query for s in default_signals() if s.name == "xid-fatal")
    assert listed_xids(fatal_query) == sorted(FATAL_XIDS)
    for result in (prod, local):
        expr = rule(result.one("PrometheusRule", "gpu-alerts").inputs["spec"], "GpuCriticalXid")["expr"]
        assert sorted(int(x) for x in re.findall(r"== (\d+)", expr)) == sorted(FATAL_XIDS), result.stack


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"thermal_threshold_celsius": 0}, "thermal_threshold_celsius: must be >= 60, got 0.0"),
        ({"thermal_threshold_celsius": 120}, "thermal_threshold_celsius: must be below 120, got 120.0"),
        ({"thermal_warning_band_celsius": 0}, "thermal_warning_band_celsius: must be > 0, got 0.0"),
        ({"thermal_warning_band_celsius": 80}, "thermal_warning_band_celsius (80) must be below thermal_threshold"),
        ({"thermal_hold_seconds": 0}, "thermal_hold_seconds: must be > 0, got 0"),
        ({"thermal_hold_seconds": True}, "key 'thermal_hold_seconds' must be an integer, got True"),
    ],
)
def test_invalid_thermal_settings_name_the_key(kwargs: dict[str, Any], message: str) -> None:
    """One model checks the thermal numbers for the alerts, the dashboard and the guard alike."""
    with pytest.raises(SettingsError) as caught:
        Thermal.parse(kwargs, source="")
    assert message in str(caught.value)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"critical_xids": ()}, "critical_xids must be a non-empty list of XID numbers (1-999), got ()"),
        ({"ib_xmit_wait_increase_factor": 1.0}, "ib_xmit_wait_increase_factor must be > 1, got 1.0"),
        ({"heartbeat_metric": "9steps"}, "heartbeat_metric must be a Prometheus metric name, got '9steps'"),
    ],
)
def test_invalid_thresholds_name_the_field(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError) as caught:
        AlertThresholds(**kwargs)
    assert message in str(caught.value)


def test_duration_text() -> None:
    assert [duration(s) for s in (90, 120, 3600, 5400)] == ["90s", "2m", "1h", "90m"]
    with pytest.raises(ValueError):
        duration(0)
