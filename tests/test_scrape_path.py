"""Every alert and every dashboard panel, checked on the series that arrive through the scrape path.

A real Prometheus (Debian's) scrapes the exporters through the scrape jobs prometheus-operator generates
from the stack's own monitors (:mod:`tests.scrape_world`). The tests then judge the rules and panels on
what arrived, not on label sets written by hand:

* the labels each exporter means (the GPU's workload, the node a guard series is about, a gang's job)
  survive the operator's target labels, and no series carries an ``exported_*`` label;
* every alert rule fires in its scenario with the labels its description and routing use, and every other
  alert stays silent: each scenario is a promtool test whose input series are the *arrived* label sets with
  the scenario's values;
* every dashboard query returns series, each with the labels its legend names, with the variables at "All" and
  at a selected pool, node and job; the variables offer what arrived, each narrowed by the ones before it.
"""

from __future__ import annotations

import copy
import json
import re
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from components.alert_rules import alert_names
from components.mockrt import RunResult, run_program, stack_config
from components.naming import Keys
from tests import dashboard_support, scrape_world
from tests.promtool_support import PROMTOOL, expected_alert, run_unit_test, series
from tests.scrape_world import GPU_NODES, GPU_POOL, World

pytestmark = pytest.mark.skipif(PROMTOOL is None, reason="Debian's prometheus package: make observability-tools")

LABEL_PREFIX = "gpucluster.io"


def _stack() -> RunResult:
    config, secrets = stack_config("local")
    config = copy.deepcopy(config)
    config.setdefault("gpu-cluster:observability", {})["monitorLabels"] = dict(scrape_world.MONITOR_LABELS)
    return run_program("local", config, secrets)


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    result = _stack()
    spec = result.one("PrometheusRule", "gpu-alerts").inputs["spec"]
    heartbeat = next(r for g in spec["groups"] for r in g["rules"]
                     if r["alert"] == "TrainingHeartbeatStalled")["expr"].split("changes(")[1].split("[")[0]
    taint = _burst_taint(result)
    yield from scrape_world.build(result, tmp_path_factory.mktemp("scrape"), Keys(LABEL_PREFIX), heartbeat, taint)


def _burst_taint(result: RunResult) -> str:
    settings = result.one("ConfigMap", "burst-controller-settings").inputs["data"]
    document = yaml.safe_load(next(iter(settings.values())))
    return str(document["taint_key"] if "taint_key" in document else document["taintKey"])


def _rules(world: World) -> dict[str, Any]:
    return dict(world.result.one("PrometheusRule", "gpu-alerts").inputs["spec"])


# ---------------------------------------------------------------------------------------------- the scrape


def test_every_monitor_of_the_stack_is_selected_by_its_prometheus(world: World) -> None:
    """A monitor without the stack's monitorLabels is skipped by the operator in silence: nothing is scraped."""
    assert world.ignored_monitors == []
    names = {job["job_name"].split("/")[2] for job in world.jobs}
    assert {"dcgm-exporter", "ib-exporter", "health-guard", "burst-controller", "smoke-gang"} <= names


def test_every_target_is_up_under_its_workload_identity(world: World) -> None:
    by_job: dict[str, set[str]] = {}
    for target in world.targets:
        assert target["health"] == "up", target
        by_job.setdefault(target["labels"]["job"], set()).add(target["labels"].get("pod", ""))
    # dcgm-exporter's targets drop the operator's pod label: the GPU's workload takes its place (below).
    assert by_job["dcgm-exporter-metrics"] == {""}
    assert by_job["ib-exporter-metrics"] == {f"ib-exporter-{n}" for n in GPU_NODES}
    assert by_job["health-guard-metrics"] == {"health-guard-7d9f-a", "health-guard-7d9f-b"}
    assert by_job["burst-controller-metrics"] == {"burst-controller-5c6b-a", "burst-controller-5c6b-b"}
    assert by_job["training/smoke-gang"] == {"smoke-gang-worker-0", "smoke-gang-worker-1"}


def test_no_series_has_a_renamed_label(world: World) -> None:
    renamed = sorted({f"{s['__name__']}: {k}" for s in world.series for k in s if k.startswith("exported_")})
    assert renamed == []


def test_gpu_series_carry_the_workload_that_holds_the_gpu(world: World) -> None:
    temps = world.arrived("DCGM_FI_DEV_GPU_TEMP")
    assert len(temps) == 6
    owners = {(s["Hostname"], s["gpu"]): (s.get("namespace"), s.get("pod")) for s in temps}
    assert owners == {
        ("gpu-a", "0"): ("training", "smoke-gang-worker-0"), ("gpu-a", "1"): ("training", "smoke-gang-worker-0"),
        ("gpu-a", "2"): ("inference", "sd-0"), ("gpu-a", "3"): (None, None),
        ("gpu-b", "0"): ("training", "smoke-gang-worker-1"), ("gpu-b", "1"): (None, None),
    }
    for s in temps:
        assert s["node"] == s["Hostname"]
        assert s["exporter_pod"] == f"dcgm-exporter-{s['Hostname']}"


def test_guard_series_name_the_nodes_and_gangs_they_are_about(world: World) -> None:
    quarantined = {(s["node"], s["class"]) for s in world.arrived("gpucluster_health_node_quarantined")}
    assert quarantined == {("gpu-a", "degraded"), ("gpu-b", "fatal")}
    restarts = {(s["namespace"], s["job"], s.get("node", ""), s["cause"])
                for s in world.arrived("gpucluster_health_gang_restarts_total")}
    assert restarts == {("training", "smoke-gang", "gpu-a", "guard"), ("training", "other-gang", "gpu-b", "guard"),
                        ("training", "smoke-gang", "", "application")}
    leaders = {s["pod"]: s["namespace"] for s in world.arrived("gpucluster_health_leader")}
    assert leaders == {"health-guard-7d9f-a": "gpu-system", "health-guard-7d9f-b": "gpu-system"}


def test_training_series_carry_their_job(world: World) -> None:
    steps = world.arrived("training_step")
    assert {(s["namespace"], s["job_name"], s["rank"], s["pod"]) for s in steps} == {
        ("training", "smoke-gang", "0", "smoke-gang-worker-0"), ("training", "smoke-gang", "1", "smoke-gang-worker-1")}


def test_ib_series_carry_their_node(world: World) -> None:
    ports = world.arrived("infiniband_state_id")
    assert {(s["node"], s["device"], s["port"]) for s in ports} == {(n, "mlx5_0", "1") for n in GPU_NODES}


def test_nvlink_bytes_arrive_as_the_gauge_dcgm_defines(world: World) -> None:
    metadata = world.query('count by (__name__) ({__name__=~"DCGM_FI_PROF_NVLINK_.X_BYTES"})')
    assert {m["metric"]["__name__"] for m in metadata} == {"DCGM_FI_PROF_NVLINK_TX_BYTES",
                                                           "DCGM_FI_PROF_NVLINK_RX_BYTES"}
    with urllib.request.urlopen(f"{world.prometheus_url}/api/v1/metadata", timeout=5) as response:
        types = {name: entries[0]["type"] for name, entries in json.load(response)["data"].items()}
    assert types["DCGM_FI_PROF_NVLINK_TX_BYTES"] == types["DCGM_FI_PROF_NVLINK_RX_BYTES"] == "gauge"


# ---------------------------------------------------------------------------------------------- alerts

GPU_A0 = {"Hostname": "gpu-a", "gpu": "0"}
"""GPU 0 of gpu-a, held by training worker 0 (see scrape_world)."""
GPU_A1 = {"Hostname": "gpu-a", "gpu": "1"}
GPU_A_INFERENCE = {"Hostname": "gpu-a", "gpu": "2"}
GPU_B_FREE = {"Hostname": "gpu-b", "gpu": "1"}
"""No pod holds this GPU."""
IB_A = {"node": "gpu-a", "device": "mlx5_0", "port": "1"}
IB_B = {"node": "gpu-b", "device": "mlx5_0", "port": "1"}
GUARD_A, GUARD_B = {"pod": "health-guard-7d9f-a"}, {"pod": "health-guard-7d9f-b"}
BURST_A, BURST_B = {"pod": "burst-controller-5c6b-a"}, {"pod": "burst-controller-5c6b-b"}
RANK0, RANK1 = {"pod": "smoke-gang-worker-0"}, {"pod": "smoke-gang-worker-1"}
SMOKE = {"namespace": "training", "job_name": "smoke-gang"}
HEARTBEAT = "training_step_heartbeat_timestamp_seconds"
RESTARTS = "gpucluster_health_gang_restarts_total"
TENSOR = "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"


@dataclass(frozen=True)
class Feed:
    """Values for the one arrived series of ``metric`` whose labels include ``match``."""

    metric: str
    match: dict[str, str]
    values: str


@dataclass(frozen=True)
class Fire:
    """One expected alert: the labels its text and routing use, its value; ``whole``: the alert carries every
    label of that feed's arrived series (a rule that does not aggregate)."""

    labels: dict[str, str]
    value: float
    whole: int | None = None


@dataclass(frozen=True)
class Scenario:
    id: str
    alert: str
    feeds: tuple[Feed, ...]
    eval_time: str
    fires: tuple[Fire, ...] = ()
    #: Other alerts this scenario rightly raises; every alert not named here or above must stay silent.
    also: dict[str, tuple[Fire, ...]] = field(default_factory=dict)


def gpu(metric: str, values: str, where: dict[str, str] = GPU_A0) -> Feed:
    return Feed(metric, where, values)


def ib(metric: str, values: str, where: dict[str, str] = IB_A) -> Feed:
    return Feed(metric, where, values)


def whole(labels: dict[str, str], value: float, feed: int = 0) -> Fire:
    return Fire(labels, value, feed)


#: Leaders for both controllers, in every scenario that does not feed the leader gauges itself: without them
#: their NoLeader alerts (absent()) would fire everywhere.
BASELINE = (Feed("gpucluster_health_leader", GUARD_A, "1x1440"), Feed("gpucluster_burst_leader", BURST_A, "1x1440"))

SCENARIOS = [
    Scenario("hot GPU", "GpuTemperatureCritical", (gpu("DCGM_FI_DEV_GPU_TEMP", "79x20"),), "2m",
             (whole({**GPU_A0, "node": "gpu-a", "pod": "smoke-gang-worker-0"}, 79),)),
    Scenario("warm GPU", "GpuTemperatureWarning", (gpu("DCGM_FI_DEV_GPU_TEMP", "76x40"),), "5m",
             (whole(GPU_A0, 76),)),
    Scenario("thermal slowdown", "GpuThermalThrottling", (gpu("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "64x40"),), "5m",
             (whole(GPU_A0, 2),)),
    Scenario("GSP XID 119 pages as the guard quarantines", "GpuCriticalXid",
             (gpu("DCGM_FI_DEV_XID_ERRORS", "0 0 119x10"),), "1m", (whole(GPU_A0, 119),)),
    Scenario("XID 94 twice", "GpuRepeatedXid",
             (Feed("DCGM_EXP_XID_ERRORS_COUNT", {**GPU_A0, "xid": "94"}, "1 1 2x10"),), "2m",
             (whole({**GPU_A0, "xid": "94"}, 2),)),
    Scenario("double-bit ECC", "GpuDoubleBitEccErrors", (gpu("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "0x10 2x10"),), "5m",
             (whole(GPU_A0, 2),)),
    Scenario("row remap failure", "GpuRowRemapFailure", (gpu("DCGM_FI_DEV_ROW_REMAP_FAILURE", "1x4"),), "1m",
             (whole(GPU_A0, 1),)),
    Scenario("NVLink recovery", "NvlinkRecoveryErrors",
             (gpu("DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL", "0x20 1x20"),), "10m", (whole(GPU_A0, 1),)),
    Scenario("NVLink replays", "NvlinkErrorsRising",
             (gpu("DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL", "0+30x60"),
              gpu("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", "0+15x60")), "10m", (whole(GPU_A0, 2),)),
    Scenario("IB port down", "InfinibandPortNotActive", (ib("infiniband_state_id", "4x4 1x20"),), "4m",
             (whole(IB_A, 1),)),
    Scenario("IB physical link down", "InfinibandPhysicalLinkDown",
             (ib("infiniband_physical_state_id", "5x4 3x20"),), "4m", (whole(IB_A, 3),)),
    Scenario("IB port trained at HDR", "InfinibandRateBelowNominal",
             (ib("infiniband_rate_bytes_per_second", "25000000000x20"), ib("infiniband_port_info", "1x20")), "2m",
             (whole(IB_A, 25e9),)),
    Scenario("IB link downed", "InfinibandLinkDowned", (ib("infiniband_link_downed_total", "3x10 4x30"),), "5m",
             (whole(IB_A, 1),)),
    Scenario("IB symbol errors", "InfinibandSymbolErrorsRising", (ib("infiniband_symbol_error_total", "0+15x60"),),
             "10m", (whole(IB_A, 1),)),
    Scenario("IB receive errors", "InfinibandReceiveErrorsRising",
             (ib("infiniband_port_errors_received_total", "0+3x60"),), "10m", (whole(IB_A, 0.2),)),
    Scenario("IB congestion", "InfinibandCongestion",
             (ib("infiniband_port_transmit_wait_total", "0+15000x40 600000+60000x40"),
              ib("infiniband_port_data_transmitted_bytes_total", "0+3000000000x40 120000000000+1000000000x40")),
             "20m", (whole(IB_A, 4000),)),
    Scenario("IB ack timeouts", "InfinibandLocalAckTimeouts",
             (ib("infiniband_hw_local_ack_timeout_err_total", "0+30x60"),), "10m", (whole(IB_A, 2),)),
    Scenario("IB sequence errors", "InfinibandSequenceErrors",
             (ib("infiniband_hw_out_of_sequence_total", "0+15x60"),
              ib("infiniband_hw_packet_seq_err_total", "0+45x60")),
             "10m", (whole(IB_A, 1),)),
    Scenario("ib-exporter reads garbage", "InfinibandExporterSysfsErrors",
             (Feed("infiniband_exporter_scrape_errors_total", {"node": "gpu-b", "reason": "garbage"}, "0x10 1x20"),),
             "5m", (whole({"node": "gpu-b", "reason": "garbage"}, 1),)),
    Scenario("every rank of a job stalls", "TrainingHeartbeatStalled",
             (Feed(HEARTBEAT, RANK0, "100+1x40 140x80"), Feed(HEARTBEAT, RANK1, "100+1x40 140x80")), "26m",
             (Fire(SMOKE, 0),)),
    Scenario("a training pod's tensor cores idle", "TrainingTensorCoresIdle",
             (gpu(TENSOR, "0.001x80"), gpu(TENSOR, "0.001x80", GPU_A1), Feed("kube_pod_labels", RANK0, "1x80")), "15m",
             (Fire({"namespace": "training", "pod": "smoke-gang-worker-0"}, 0.001),)),
    Scenario("a held node computes and sends nothing", "NcclHangSuspected",
             (gpu(TENSOR, "0x80"), gpu(TENSOR, "0x80", GPU_A1),
              ib("infiniband_port_data_transmitted_bytes_total", "5000x80"),
              gpu("DCGM_FI_PROF_NVLINK_TX_BYTES", "7000x80"), gpu("DCGM_FI_PROF_NVLINK_TX_BYTES", "7000x80", GPU_A1)),
             "16m", (Fire({"Hostname": "gpu-a"}, 0),)),
    Scenario("a slow checkpoint on both ranks", "CheckpointOverBudget",
             (Feed("gpucluster_checkpoint_duration_seconds", RANK0, "42x4"),
              Feed("gpucluster_checkpoint_duration_seconds", RANK1, "37x4")), "1m", (Fire(SMOKE, 42),)),
    Scenario("two nodes quarantined", "GpuNodeQuarantined",
             (Feed("gpucluster_health_node_quarantined", {"node": "gpu-a"}, "1x4"),
              Feed("gpucluster_health_node_quarantined", {"node": "gpu-b"}, "1x4")), "1m",
             (Fire({"node": "gpu-a", "class": "degraded"}, 1), Fire({"node": "gpu-b", "class": "fatal"}, 1))),
    Scenario("breaker tripped", "GpuHealthGuardSuppressed",
             (Feed("gpucluster_health_breaker_tripped", GUARD_A, "1x4"),), "1m", (Fire({}, 1),)),
    Scenario("a leaf switch fenced", "InfinibandSwitchFault",
             (Feed("gpucluster_health_switch_faults", {"leaf": "leaf-l1"}, "1x4"),), "1m",
             (Fire({"leaf": "leaf-l1"}, 1),)),
    Scenario("a quarter of the pool out", "GpuPoolQuarantinedShareHigh",
             (Feed("gpucluster_health_pool_quarantined_ratio", {"pool": "local-gpu"}, "0.25x10"),), "6m",
             (Fire({"pool": "local-gpu"}, 0.25),)),
    Scenario("four restarts in the pool", "GangRestartRateHigh",
             (Feed(RESTARTS, {"node": "gpu-a"}, "0 0 0 0 2 2 2 2 2 2"),
              Feed(RESTARTS, {"node": "gpu-b"}, "0 0 0 0 0 0 2 2 2 2")), "9m",
             (Fire({"pool": "local-gpu"}, 4 * 9.5 / 9),),
             also={"GangRestartLoopOnNode": (
                 Fire({"namespace": "training", "job": "smoke-gang", "node": "gpu-a"}, 2 * 9.5 / 9),
                 Fire({"namespace": "training", "job": "other-gang", "node": "gpu-b"}, 2 * 9.5 / 9))}),
    Scenario("one node takes one job down twice", "GangRestartLoopOnNode",
             (Feed(RESTARTS, {"node": "gpu-a"}, "0 0 1 1 2 2 2 2 2 2"),), "9m",
             (Fire({"namespace": "training", "job": "smoke-gang", "node": "gpu-a"}, 2 * 9.5 / 9),)),
    Scenario("no guard leads", "HealthGuardNoLeader",
             (Feed("gpucluster_health_leader", GUARD_A, "0x12"), Feed("gpucluster_health_leader", GUARD_B, "0x12")),
             "2m", (Fire({}, 0),)),
    Scenario("no burst controller leads", "BurstControllerNoLeader",
             (Feed("gpucluster_burst_leader", BURST_A, "0x12"), Feed("gpucluster_burst_leader", BURST_B, "0x12")),
             "2m", (Fire({}, 0),)),
    Scenario("training held at the gate", "TrainingHeldAtHandoverGate",
             (Feed("gpucluster_burst_gated_training_pods", BURST_A, "4x40"),), "7m", (Fire({}, 4),)),
    # Silent: each of these once paged or would page on the wrong labels or types.
    Scenario("an idle GPU no pod holds is no hang", "NcclHangSuspected",
             (gpu(TENSOR, "0x80", GPU_B_FREE), ib("infiniband_port_data_transmitted_bytes_total", "5000x80", IB_B),
              gpu("DCGM_FI_PROF_NVLINK_TX_BYTES", "7000x80", GPU_B_FREE)), "16m"),
    Scenario("busy NVLink (bytes per second) is no hang", "NcclHangSuspected",
             (gpu(TENSOR, "0x80"), ib("infiniband_port_data_transmitted_bytes_total", "5000x80"),
              gpu("DCGM_FI_PROF_NVLINK_TX_BYTES", "30000000000x80")), "16m"),
    Scenario("an idle inference GPU is no training hang", "TrainingTensorCoresIdle",
             (gpu(TENSOR, "0x80", GPU_A_INFERENCE), Feed("kube_pod_labels", {"pod": "sd-0"}, "1x80")), "19m"),
    Scenario("application crashes are no loop on a node", "GangRestartLoopOnNode",
             (Feed(RESTARTS, {"cause": "application"}, "0 0 1 1 2 2 2 2 2 2"),), "9m"),
    Scenario("two gangs restarted once each on two nodes is no loop", "GangRestartLoopOnNode",
             (Feed(RESTARTS, {"node": "gpu-a"}, "0 0 1 1 1 1 1 1 1 1"),
              Feed(RESTARTS, {"node": "gpu-b"}, "0 0 0 0 1 1 1 1 1 1")), "9m"),
]


def _arrived_one(world: World, feed: Feed) -> dict[str, str]:
    found = [s for s in world.arrived(feed.metric) if all(s.get(k) == v for k, v in feed.match.items())]
    assert len(found) == 1, (f"{feed.metric} with {feed.match}: expected one arrived series, got {found}; "
                             f"arrived: {world.arrived(feed.metric)}")
    return found[0]


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s.id for s in SCENARIOS])
def test_alert_on_the_arrived_series(scenario: Scenario, world: World, tmp_path: Path) -> None:
    spec = _rules(world)
    fed = {f.metric for f in scenario.feeds}
    feeds = [*scenario.feeds, *(f for f in BASELINE if f.metric not in fed)]
    labels = [_arrived_one(world, f) for f in feeds]
    expected: dict[str, list[dict[str, Any]]] = {name: [] for name in alert_names(spec)}
    for name, fires in [(scenario.alert, scenario.fires), *scenario.also.items()]:
        for fire in fires:
            if fire.whole is None:
                alert_labels = fire.labels
            else:
                alert_labels = labels[fire.whole]
                assert fire.labels.items() <= alert_labels.items(), (fire.labels, alert_labels)
            expected[name].append(expected_alert(spec, name, alert_labels, fire.value))
    rules_file = tmp_path / "rules.yml"
    rules_file.write_text(yaml.safe_dump(spec, sort_keys=False))
    checks = [{"eval_time": scenario.eval_time, "alertname": name, "exp_alerts": alerts}
              for name, alerts in expected.items()]
    result = run_unit_test(rules_file, tmp_path / "test.yml",
                           [series(f.metric, s, f.values) for f, s in zip(feeds, labels, strict=True)], checks)
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_alert_has_a_firing_scenario_on_arrived_series(world: World) -> None:
    fired = {s.alert for s in SCENARIOS if s.fires} | {name for s in SCENARIOS for name in s.also}
    assert fired == set(alert_names(_rules(world)))


# ---------------------------------------------------------------------------------------------- panels


def _boards(world: World) -> dict[str, dict[str, Any]]:
    return dashboard_support.boards(world.result)


def _run(world: World, board: dict[str, Any], selection: dict[str, str]) -> list[str]:
    """Every panel query of ``board`` with the variables set to ``selection`` ("All" for the others): each must
    return series, each series with the labels its legend names and, where it has one, the selected node.
    Annotations mark events (a taint applied), which this world has none of: they need only run."""
    problems: list[str] = []
    values = {**dashboard_support.all_values(board), **selection}
    for q in dashboard_support.queries(board):
        result = world.query(dashboard_support.interpolate(q.expr, values))
        legend_labels = re.findall(r"\{\{\s*(\w+)\s*\}\}", q.legend)
        if not result and q.kind != "annotation":
            problems.append(f"{q.where}: no series for {q.expr} with {selection or 'All'}")
            continue
        for sample in result:
            metric = sample["metric"]
            missing = [label for label in legend_labels if label not in metric]
            if missing:
                problems.append(f"{q.where}: series {metric} lacks legend label(s) {missing}")
            if "node" in selection and metric.get("node", selection["node"]) != selection["node"]:
                problems.append(f"{q.where}: series {metric} of another node than {selection['node']}")
    return problems


def test_every_dashboard_panel_returns_series_with_its_legend_labels(world: World) -> None:
    """With every variable at "All" (what a dashboard opens with)."""
    boards = _boards(world)
    assert sum(len(dashboard_support.queries(b)) for b in boards.values()) >= 20
    assert [p for b in boards.values() for p in _run(world, b, {})] == []


def test_every_dashboard_panel_keeps_to_a_selected_pool_node_and_job(world: World) -> None:
    selection = {"pool": GPU_POOL, "node": GPU_NODES[0], "job": "smoke-gang"}
    assert [p for b in _boards(world).values() for p in _run(world, b, selection)] == []


def _options(world: World, variable: dict[str, Any], values: dict[str, str]) -> set[str]:
    """The options Grafana would offer for ``variable`` with the variables before it set to ``values``."""
    expr, label, regex = dashboard_support.variable_promql(variable)
    result = world.query(dashboard_support.interpolate(expr, values))
    if label is not None:
        return {s["metric"][label] for s in result if s["metric"].get(label)}
    assert regex is not None
    texts = ["{" + ",".join(f'{k}="{v}"' for k, v in sorted(s["metric"].items())) + "} " + s["value"][1]
             for s in result]
    return {m.group(1) for text in texts if (m := re.search(regex, text))}


@pytest.mark.parametrize(("selection", "expected"), [
    ({}, {"pool": {GPU_POOL}, "node": set(GPU_NODES), "job": {"smoke-gang"}}),
    ({"pool": GPU_POOL, "node": GPU_NODES[1]}, {"job": {"smoke-gang"}}),
    ({"pool": scrape_world.SYSTEM_POOL}, {"node": set(scrape_world.SYSTEM_NODES), "job": set()}),
    ({"pool": GPU_POOL, "node": scrape_world.SYSTEM_NODES[0]}, {"job": set()}),
], ids=["all", "a node", "another pool", "a node outside the pool"])
def test_dashboard_variables_offer_what_arrived_narrowed_by_the_ones_before(
        world: World, selection: dict[str, str], expected: dict[str, set[str]]) -> None:
    """Pools are the stack's GPU pools (not the system pool), nodes those of the selected pools, jobs those with
    pods on the selected nodes."""
    for uid, board in _boards(world).items():
        values = {**dashboard_support.all_values(board), **selection}
        offered = {v["name"]: _options(world, v, values) for v in dashboard_support.query_variables(board)}
        assert {name: offered[name] for name in expected} == expected, uid


def test_every_selector_of_a_metric_that_arrives_with_pool_or_node_filters_by_the_variable(world: World) -> None:
    """Judged on the labels that really arrive; kube-state-metrics' series are the joins that apply the variables
    (and the burst panel's external nodes, in no pool)."""
    carried: dict[str, set[str]] = {}
    for arrived in world.series:
        carried.setdefault(arrived["__name__"], set()).update({"pool", "node"} & arrived.keys())
    problems = []
    for board in _boards(world).values():
        texts = [(q.where, q.expr) for q in dashboard_support.queries(board)]
        texts += [(f"{board['uid']} / variable {v['name']}", v["query"])
                  for v in dashboard_support.query_variables(board)]
        for where, expr in texts:
            found = (dashboard_support.variable_selectors(expr) if expr.startswith(("label_values", "query_result"))
                     else dashboard_support.selectors(expr))
            for metric, matchers in found:
                assert metric in carried, f"{where}: {metric} never arrives"
                if metric.startswith("kube_"):
                    continue
                problems += [f"{where}: {metric} not filtered by ${label}" for label in sorted(carried[metric])
                             if matchers.get(label) != ("=~", f"${label}")]
    assert problems == []
