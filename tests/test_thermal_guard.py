"""Thermal guard: decision tables for the pure core, the shell against fakes, settings validation."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import generate_latest

from agents.thermal_guard.cli import load_settings, main
from agents.thermal_guard.decide import (
    GuardState,
    NodeStatus,
    NodeView,
    Release,
    Taint,
    decide,
    reason_label_value,
)
from agents.thermal_guard.settings import SettingsError, ThermalSettings
from agents.thermal_guard.shell import Guard, QueryError, parse_vector, release_patch, taint_patch

S = ThermalSettings()  # 78 C, 120 s hold, 5 C warning band


def run(temps_by_time: Sequence[tuple[float, dict[str, float]]], nodes: dict[str, NodeView]) -> list[Any]:
    """Feed a timeline into decide(); return (time, actions) for every step that acted."""
    state = GuardState()
    acted = []
    for now, temps in temps_by_time:
        d = decide(S, temps, nodes, state, now)
        state = d.state
        if d.actions:
            acted.append((now, d.actions))
    return acted


PLAIN = {"n1": NodeView("n1")}


# (id, timeline of (t, {node: max °C}), expected [(t, actions)])
TIMELINES = [
    (
        "79C held 120s taints at 120s",
        [(0, {"n1": 79}), (60, {"n1": 79.5}), (120, {"n1": 79})],
        [(120, (Taint("n1", 0, 79),))],
    ),
    ("exactly 78C is at the threshold", [(0, {"n1": 78}), (120, {"n1": 78})], [(120, (Taint("n1", 0, 78),))]),
    ("79C for 105s does not taint", [(0, {"n1": 79}), (60, {"n1": 79}), (105, {"n1": 79})], []),
    ("77C forever never taints", [(t, {"n1": 77.9}) for t in range(0, 3600, 15)], []),
    (
        "one cool sample restarts the hold",
        [(0, {"n1": 80}), (60, {"n1": 77}), (120, {"n1": 80}), (180, {"n1": 80}), (240, {"n1": 80})],
        [(240, (Taint("n1", 120, 80),))],
    ),
    (
        "a missing sample restarts the hold",
        [(0, {"n1": 80}), (60, {}), (120, {"n1": 80}), (240, {"n1": 80})],
        [(240, (Taint("n1", 120, 80),))],
    ),
    ("temperature of an unwatched host is ignored", [(0, {"ghost": 99}), (500, {"ghost": 99})], []),
]


@pytest.mark.parametrize(("timeline", "expected"), [(t, e) for _, t, e in TIMELINES], ids=[i for i, _, _ in TIMELINES])
def test_timelines(timeline: list[tuple[float, dict[str, float]]], expected: list[Any]) -> None:
    assert run(timeline, PLAIN) == expected


# One cycle from a given node view: (id, view, temp or None, hot_since or None, now, actions, status, next hot_since)
CYCLES = [
    (
        "tainted node stays tainted while hot",
        NodeView("n1", tainted=True, marked=True),
        90.0,
        None,
        1000,
        (),
        NodeStatus.TAINTED,
        {},
    ),
    (
        "tainted node stays tainted when cool: no automatic release",
        NodeView("n1", tainted=True, marked=True),
        40.0,
        None,
        1000,
        (),
        NodeStatus.TAINTED,
        {},
    ),
    (
        "tainted node without a sample stays tainted",
        NodeView("n1", tainted=True, marked=True),
        None,
        None,
        1000,
        (),
        NodeStatus.TAINTED,
        {},
    ),
    (
        "release label on a tainted cool node releases it",
        NodeView("n1", tainted=True, marked=True, release_requested=True),
        60.0,
        None,
        1000,
        (Release("n1"),),
        NodeStatus.OK,
        {},
    ),
    (
        "release on a still-hot node releases and restarts the clock",
        NodeView("n1", tainted=True, marked=True, release_requested=True),
        85.0,
        None,
        1000,
        (Release("n1"),),
        NodeStatus.WARNING,
        {},
    ),
    (
        "taint removed by hand: leftover marks are cleaned",
        NodeView("n1", tainted=False, marked=True),
        50.0,
        None,
        1000,
        (Release("n1"),),
        NodeStatus.OK,
        {},
    ),
    (
        "release label on an untainted node is cleared",
        NodeView("n1", release_requested=True),
        None,
        None,
        1000,
        (Release("n1"),),
        NodeStatus.UNKNOWN,
        {},
    ),
    ("warning band is reported, not acted on", NodeView("n1"), 74.0, None, 1000, (), NodeStatus.WARNING, {}),
    ("just below the warning band is ok", NodeView("n1"), 72.9, None, 1000, (), NodeStatus.OK, {}),
    ("first hot sample starts the clock", NodeView("n1"), 80.0, None, 1000, (), NodeStatus.PENDING, {"n1": 1000}),
    ("hot within the hold keeps the clock", NodeView("n1"), 80.0, 950.0, 1000, (), NodeStatus.PENDING, {"n1": 950.0}),
    (
        "hot past the hold taints",
        NodeView("n1"),
        80.0,
        880.0,
        1000,
        (Taint("n1", 880.0, 80.0),),
        NodeStatus.TAINTED,
        {},
    ),
    ("cooling within the hold clears the clock", NodeView("n1"), 70.0, 950.0, 1000, (), NodeStatus.OK, {}),
    ("no sample clears the clock", NodeView("n1"), None, 950.0, 1000, (), NodeStatus.UNKNOWN, {}),
]


@pytest.mark.parametrize(
    ("view", "temp", "hot_since", "now", "actions", "status", "next_hot"),
    [c[1:] for c in CYCLES],
    ids=[c[0] for c in CYCLES],
)
def test_one_cycle(
    view: NodeView,
    temp: float | None,
    hot_since: float | None,
    now: float,
    actions: tuple[Any, ...],
    status: NodeStatus,
    next_hot: dict[str, float],
) -> None:
    temps = {} if temp is None else {view.name: temp}
    state = GuardState({} if hot_since is None else {view.name: hot_since})
    d = decide(S, temps, {view.name: view}, state, now)
    assert d.actions == actions
    assert d.status == {view.name: status}
    assert dict(d.state.hot_since) == next_hot


def test_release_then_still_hot_taints_again_only_after_a_full_hold() -> None:
    released = decide(S, {"n1": 85}, {"n1": NodeView("n1", True, True, True)}, GuardState(), 1000)
    assert released.actions == (Release("n1"),)
    after = NodeView("n1")
    d1 = decide(S, {"n1": 85}, {"n1": after}, released.state, 1015)
    assert (d1.actions, dict(d1.state.hot_since)) == ((), {"n1": 1015})
    d2 = decide(S, {"n1": 85}, {"n1": after}, d1.state, 1134)
    assert d2.actions == ()
    d3 = decide(S, {"n1": 85}, {"n1": after}, d2.state, 1135)
    assert d3.actions == (Taint("n1", 1015, 85),)


def test_many_nodes_are_decided_independently_and_in_name_order() -> None:
    nodes = {n: NodeView(n) for n in ("c", "a", "b")}
    state = GuardState({"a": 0, "b": 0, "c": 100})
    d = decide(S, {"a": 80, "b": 70, "c": 80}, nodes, state, 130)
    assert d.actions == (Taint("a", 0, 80),)
    assert d.status == {"a": NodeStatus.TAINTED, "b": NodeStatus.OK, "c": NodeStatus.PENDING}
    assert dict(d.state.hot_since) == {"c": 100}


def test_custom_threshold_and_hold() -> None:
    s = ThermalSettings(threshold_celsius=85, hold_seconds=30, warning_band=0)
    d = decide(s, {"n1": 84.9}, {"n1": NodeView("n1")}, GuardState({"n1": 0}), 100)
    assert (d.actions, d.status["n1"]) == ((), NodeStatus.OK)
    d = decide(s, {"n1": 85}, {"n1": NodeView("n1")}, GuardState({"n1": 70}), 100)
    assert d.actions == (Taint("n1", 70, 85),)


def test_reason_label_value_is_a_valid_label_value() -> None:
    assert reason_label_value(S, 79.0) == "gpu-temp-79c-ge-78c"
    assert reason_label_value(S, 81.5) == "gpu-temp-81.5c-ge-78c"


# ---- settings -------------------------------------------------------------------------------------


def test_settings_defaults() -> None:
    s = ThermalSettings.from_mapping({})
    assert (s.threshold_celsius, s.hold_seconds, s.taint_key, s.inference_tolerates) == (
        78.0,
        120,
        "gpucluster.io/thermal",
        True,
    )
    assert s.query() == "max by (Hostname) (DCGM_FI_DEV_GPU_TEMP)"
    assert (s.reason_label, s.since_annotation, s.release_key) == (
        "gpucluster.io/thermal-reason",
        "gpucluster.io/thermal-since",
        "gpucluster.io/thermal-release",
    )


def test_settings_from_mapping_accepts_ints_for_floats() -> None:
    s = ThermalSettings.from_mapping({"threshold_celsius": 80, "hold_seconds": 60, "inference_tolerates": False})
    assert (s.threshold_celsius, s.hold_seconds, s.inference_tolerates) == (80.0, 60, False)


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"treshold_celsius": 80}, "cm: unknown key 'treshold_celsius'"),
        ({"hold_seconds": "2m"}, "cm: hold_seconds must be int, got '2m'"),
        ({"inference_tolerates": "yes"}, "cm: inference_tolerates must be bool, got 'yes'"),
        ({"threshold_celsius": True}, "cm: threshold_celsius must be float, got True"),
        ({"threshold_celsius": 150}, "cm: threshold_celsius must be in (0, 120), got 150.0"),
        ({"hold_seconds": 0}, "cm: hold_seconds must be > 0, got 0"),
        ({"warning_band": 80}, "cm: warning_band must be >= 0 and below the threshold, got 80.0"),
        ({"poll_seconds": 300}, "cm: poll_seconds (300) must not exceed hold_seconds (120)"),
        ({"prometheus_url": "prometheus:9090"}, "cm: prometheus_url must start with http:// or https://"),
        ({"taint_key": "thermal"}, "cm: taint_key must be a prefixed Kubernetes key"),
        ({"label_prefix": "GPU_Cluster"}, "cm: label_prefix must be a DNS subdomain"),
        ({"node_label": "host-name"}, "cm: node_label must be a Prometheus label name"),
    ],
)
def test_settings_errors_name_key_and_source(raw: dict[str, Any], message: str) -> None:
    with pytest.raises(SettingsError) as caught:
        ThermalSettings.from_mapping(raw, source="cm")
    assert message in str(caught.value)


def test_settings_report_every_problem_at_once() -> None:
    with pytest.raises(SettingsError) as caught:
        ThermalSettings.from_mapping({"hold_seconds": 0, "threshold_celsius": 200}, source="cm")
    assert str(caught.value) == (
        "cm: threshold_celsius must be in (0, 120), got 200.0; cm: hold_seconds must be > 0, got 0"
    )


def test_cli_check_config(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "settings.json"
    path.write_text(json.dumps({"threshold_celsius": 80, "inference_tolerates": False}))
    assert main(["--config", str(path), "--check-config"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert (shown["threshold_celsius"], shown["inference_tolerates"], shown["hold_seconds"]) == (80.0, False, 120)
    path.write_text(json.dumps({"hold_seconds": -1}))
    assert main(["--config", str(path), "--check-config"]) == 2
    assert capsys.readouterr().err == f"thermal-guard: {path}: hold_seconds must be > 0, got -1\n"
    path.write_text("[1]")
    with pytest.raises(SettingsError, match="settings must be a JSON object"):
        load_settings(str(path))


# ---- shell ----------------------------------------------------------------------------------------


def prom(result: list[dict[str, Any]], status: str = "success") -> dict[str, Any]:
    return {"status": status, "data": {"resultType": "vector", "result": result}}


def test_parse_vector() -> None:
    payload = prom(
        [
            {"metric": {"Hostname": "n1"}, "value": [1700000000, "79"]},
            {"metric": {"Hostname": "n2"}, "value": [1700000000, "NaN"]},
            {"metric": {}, "value": [1700000000, "90"]},
            {"metric": {"Hostname": "n3"}, "value": [1700000000, "garbage"]},
        ]
    )
    assert parse_vector(payload, "Hostname") == {"n1": 79.0}
    with pytest.raises(QueryError, match="prometheus answered 'error': bad query"):
        parse_vector({"status": "error", "error": "bad query"}, "Hostname")
    with pytest.raises(QueryError, match="expected a vector, got 'matrix'"):
        parse_vector({"status": "success", "data": {"resultType": "matrix"}}, "Hostname")


def k8s_node(
    name: str,
    taints: list[dict[str, str]] | None = None,
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "uid": f"uid-{name}",
            "resourceVersion": "42",
            "labels": labels or {},
            "annotations": annotations or {},
        },
        "spec": {"taints": taints or []},
    }


VK_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
OUR_TAINT = {"key": "gpucluster.io/thermal", "value": "hot", "effect": "NoSchedule"}


def test_taint_patch_keeps_other_taints_and_records_why_and_when() -> None:
    body = taint_patch(S, k8s_node("n1", [VK_TAINT]), Taint("n1", 1700000000, 79.5))
    assert body == {
        "metadata": {
            "resourceVersion": "42",
            "labels": {"gpucluster.io/thermal-reason": "gpu-temp-79.5c-ge-78c"},
            "annotations": {
                "gpucluster.io/thermal-since": "2023-11-14T22:13:20Z",
                "gpucluster.io/thermal-detail": "hottest GPU 79.5 C >= 78 C since 2023-11-14T22:13:20Z "
                "(hold 120 s); release by setting gpucluster.io/thermal-release",
            },
        },
        "spec": {"taints": [VK_TAINT, OUR_TAINT]},
    }


def test_release_patch_removes_only_ours() -> None:
    node = k8s_node("n1", [VK_TAINT, OUR_TAINT], {"gpucluster.io/thermal-release": "alice"})
    assert release_patch(S, node) == {
        "metadata": {
            "resourceVersion": "42",
            "labels": {"gpucluster.io/thermal-reason": None, "gpucluster.io/thermal-release": None},
            "annotations": {
                "gpucluster.io/thermal-since": None,
                "gpucluster.io/thermal-detail": None,
                "gpucluster.io/thermal-release": None,
            },
        },
        "spec": {"taints": [VK_TAINT]},
    }


@dataclass
class FakeTemps:
    answers: list[dict[str, float] | Exception]

    def hottest_gpu_per_node(self) -> dict[str, float]:
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer


@dataclass
class FakeNodes:
    nodes: dict[str, dict[str, Any]]
    patches: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)
    fail_patch: bool = False
    selectors: list[str] = field(default_factory=list)

    def list_nodes(self, label_selector: str) -> list[dict[str, Any]]:
        self.selectors.append(label_selector)
        return list(self.nodes.values())

    def patch_node(self, name: str, body: dict[str, Any]) -> None:
        if self.fail_patch:
            raise RuntimeError("409 Conflict")
        self.patches.append((name, body))
        node = self.nodes[name]
        for section in ("labels", "annotations"):
            for key, value in body["metadata"][section].items():
                if value is None:
                    node["metadata"][section].pop(key, None)
                else:
                    node["metadata"][section][key] = value
        node["spec"]["taints"] = body["spec"]["taints"]

    def create_event(self, namespace: str, body: dict[str, Any]) -> None:
        self.events.append({"namespace": namespace, **body})


def sample(guard: Guard, name: str, labels: dict[str, str] | None = None) -> float | None:
    value = guard.metrics.registry.get_sample_value(name, labels or {})
    return value


def test_guard_taints_then_holds_until_released() -> None:
    nodes = FakeNodes({"n1": k8s_node("n1"), "n2": k8s_node("n2")})
    temps = FakeTemps([{"n1": 80, "n2": 60}, {"n1": 80, "n2": 60}, {"n1": 50, "n2": 60}, {"n1": 50, "n2": 60}])
    guard = Guard(S, temps, nodes)
    guard.cycle(now=1000)
    assert nodes.patches == []
    guard.cycle(now=1120)
    assert [name for name, _ in nodes.patches] == ["n1"]
    assert nodes.nodes["n1"]["spec"]["taints"] == [OUR_TAINT]
    assert nodes.selectors == ["gpucluster.io/location=onprem"] * 2
    assert [(e["namespace"], e["reason"], e["involvedObject"]["name"], e["type"]) for e in nodes.events] == [
        ("default", "ThermalTaint", "n1", "Warning")
    ]
    assert sample(guard, "thermal_guard_node_tainted", {"node": "n1"}) == 1.0
    assert sample(guard, "thermal_guard_actions_total", {"action": "taint"}) == 1.0
    guard.cycle(now=1200)  # cooled down: still tainted
    assert len(nodes.patches) == 1
    nodes.nodes["n1"]["metadata"]["labels"]["gpucluster.io/thermal-release"] = "alice"
    guard.cycle(now=1300)
    assert nodes.nodes["n1"]["spec"]["taints"] == []
    assert nodes.nodes["n1"]["metadata"]["labels"] == {}
    assert nodes.nodes["n1"]["metadata"]["annotations"] == {}
    assert sample(guard, "thermal_guard_actions_total", {"action": "release"}) == 1.0
    assert sample(guard, "thermal_guard_nodes", {"status": "ok"}) == 2.0
    assert sample(guard, "thermal_guard_node_gpu_temperature_celsius", {"node": "n2"}) == 60.0


def test_guard_skips_the_cycle_when_prometheus_fails() -> None:
    nodes = FakeNodes({"n1": k8s_node("n1")})
    guard = Guard(S, FakeTemps([{"n1": 80}, QueryError("down"), {"n1": 80}]), nodes)
    guard.cycle(now=0)
    assert guard.cycle(now=60) is None
    assert sample(guard, "thermal_guard_errors_total", {"stage": "query"}) == 1.0
    # The outage did not restart the clock: the hold counted from t=0.
    guard.cycle(now=120)
    assert [name for name, _ in nodes.patches] == ["n1"]


def test_guard_retries_a_failed_patch_without_waiting_a_new_hold() -> None:
    nodes = FakeNodes({"n1": k8s_node("n1")}, fail_patch=True)
    guard = Guard(S, FakeTemps([{"n1": 80}, {"n1": 80}, {"n1": 80}]), nodes)
    guard.cycle(now=0)
    guard.cycle(now=120)
    assert nodes.patches == []
    assert sample(guard, "thermal_guard_errors_total", {"stage": "patch"}) == 1.0
    nodes.fail_patch = False
    guard.cycle(now=135)
    assert [name for name, _ in nodes.patches] == ["n1"]
    assert nodes.nodes["n1"]["metadata"]["annotations"]["gpucluster.io/thermal-since"] == "1970-01-01T00:00:00Z"


def test_guard_counts_hosts_that_match_no_node() -> None:
    guard = Guard(S, FakeTemps([{"n1": 50, "dgx-17.local": 50}]), FakeNodes({"n1": k8s_node("n1")}))
    guard.cycle(now=0)
    assert sample(guard, "thermal_guard_unmatched_hosts") == 1.0
    text = generate_latest(guard.metrics.registry).decode()
    assert "thermal_guard_threshold_celsius 78.0" in text
