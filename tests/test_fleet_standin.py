"""The fleet stand-in: one scrape target serving the guard's DCGM and InfiniBand series for every node."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from components.health_guard import settings_from_config
from tools.localcluster.fleet_standin import GUARD_FIELDS, IB_PORTS, Fleet, fleet_exposition, parse_faults, serve
from tools.localcluster.scale import shape, shape_config

NODES = ["gpu-a-001", "gpu-a-002", "gpu-a-003"]


def _samples(text: str) -> list[tuple[str, dict[str, str], float]]:
    """(family, labels, value) of every sample (a counter's samples are named by its family here)."""
    return [(f.name, s.labels, s.value) for f in text_string_to_metric_families(text) for s in f.samples]


def test_every_node_has_every_guard_field_per_gpu_and_every_port() -> None:
    samples = _samples(fleet_exposition(NODES, 8, {}))
    for field in GUARD_FIELDS:
        assert {(s[1]["Hostname"], s[1]["gpu"]) for s in samples if s[0] == field} == {
            (n, str(g)) for n in NODES for g in range(8)}
    ib = [s for s in samples if s[0] == "infiniband_state_id"]
    assert len(ib) == len(NODES) * IB_PORTS and {s[2] for s in ib} == {4.0}
    # Each port is an InfiniBand rail, by the labels the guard's port signals join on.
    info = [s for s in samples if s[0] == "infiniband_port_info"]
    assert {(s[1]["node"], s[1]["device"], s[1]["port"]) for s in info} == {
        (s[1]["node"], s[1]["device"], s[1]["port"]) for s in ib}
    assert {s[1]["link_layer"] for s in info} == {"InfiniBand"}
    assert not [s for s in samples if s[0] == "DCGM_EXP_XID_ERRORS_COUNT"]


def test_a_fault_replaces_the_readings_of_that_node_only() -> None:
    samples = _samples(fleet_exposition(NODES, 2, {"gpu-a-002": {"xid": 79, "DCGM_FI_DEV_GPU_TEMP": 91,
                                                                  "ib_state": 1}}))
    xids = [s for s in samples if s[0] == "DCGM_EXP_XID_ERRORS_COUNT"]
    assert {(s[1]["Hostname"], s[1]["xid"]) for s in xids} == {("gpu-a-002", "79")}
    last = {(s[1]["Hostname"], s[2]) for s in samples if s[0] == "DCGM_FI_DEV_XID_ERRORS"}
    assert last == {("gpu-a-001", 0.0), ("gpu-a-002", 79.0), ("gpu-a-003", 0.0)}
    temps = {(s[1]["Hostname"], s[2]) for s in samples if s[0] == "DCGM_FI_DEV_GPU_TEMP"}
    assert temps == {("gpu-a-001", 45.0), ("gpu-a-002", 91.0), ("gpu-a-003", 45.0)}
    assert {s[2] for s in samples if s[0] == "infiniband_state_id" and s[1]["node"] == "gpu-a-002"} == {1.0}


def test_the_guards_signal_queries_group_by_labels_the_standin_serves() -> None:
    cfg = shape_config(shape("small"), Path(__file__).resolve().parents[1])
    settings = settings_from_config(cfg)
    for signal in settings.signals:
        assert f"by ({settings.exporters[signal.exporter].node_label})" in signal.query, signal.name


@pytest.mark.parametrize(("body", "message"), [
    (b"not json", "not JSON"),
    (b"[1]", "expected an object of node -> readings, got list"),
    (b'{"gpu-z-999": {"xid": 79}}', "'gpu-z-999' is not a node of this fleet"),
    (b'{"gpu-a-001": 5}', "gpu-a-001: expected field -> number, got int"),
    (b'{"gpu-a-001": {"DCGM_FI_DEV_POWER_USAGE": 1}}', "'DCGM_FI_DEV_POWER_USAGE' is not served"),
    (b'{"gpu-a-001": {"xid": "79"}}', "gpu-a-001.xid: expected a number, got '79'"),
    (b'{"gpu-a-001": {"xid": true}}', "gpu-a-001.xid: expected a number, got True"),
])
def test_bad_faults_are_refused_naming_what_and_where(body: bytes, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)").replace(".", r"\.")):
        parse_faults(body, NODES)


@given(st.binary(max_size=200))
def test_any_body_is_parsed_or_refused_with_a_value_error(body: bytes) -> None:
    try:
        parse_faults(body, NODES)
    except ValueError as exc:
        assert str(exc).startswith("faults:")


def test_a_fault_is_timed_from_the_first_scrape_that_served_it_and_cleared_with_an_empty_object() -> None:
    fleet = Fleet(NODES, 1)
    fleet.scrape(1.0)
    fleet.set_faults({"gpu-a-001": {"xid": 79}})
    assert fleet.first_served == {}
    assert 'xid="79"' in fleet.scrape(5.0)
    fleet.scrape(9.0)
    assert fleet.first_served == {"gpu-a-001": 5.0}
    fleet.set_faults({"gpu-a-001": {}})
    assert 'xid="79"' not in fleet.scrape(10.0) and fleet.first_served == {}


def test_the_server_serves_metrics_takes_faults_and_reports_when_they_were_served() -> None:
    server = serve(Fleet(NODES, 1), "127.0.0.1", 0)
    base = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        request = urllib.request.Request(f"{base}/faults", data=b'{"gpu-a-003": {"xid": 48}}', method="POST")
        assert urllib.request.urlopen(request, timeout=5).status == 200
        assert 'Hostname="gpu-a-003",xid="48"' in urllib.request.urlopen(f"{base}/metrics", timeout=5).read().decode()
        assert set(json.loads(urllib.request.urlopen(f"{base}/served", timeout=5).read())) == {"gpu-a-003"}
        bad = urllib.request.Request(f"{base}/faults", data=b'{"nope": {}}', method="POST")
        with pytest.raises(urllib.error.HTTPError) as info:
            urllib.request.urlopen(bad, timeout=5)
        assert info.value.code == 400 and "not a node of this fleet" in info.value.read().decode()
    finally:
        server.shutdown()
