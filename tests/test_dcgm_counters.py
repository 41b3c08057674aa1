"""The DCGM counters CSV we ship: format as dcgm-exporter reads it, and the fields DESIGN.md asks for."""

from __future__ import annotations

import pytest

from components import dcgm_counters
from components.dcgm_counters import Counter, CountersError, parse, render

# DESIGN.md: default-on fields we keep, plus the off-by-default ones worth enabling.
DESIGN_FIELDS = {
    "DCGM_FI_DEV_GPU_TEMP",
    "DCGM_FI_DEV_MEMORY_TEMP",
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
    "DCGM_FI_PROF_DRAM_ACTIVE",
    "DCGM_FI_DEV_GPU_UTIL",
    "DCGM_FI_DEV_POWER_USAGE",
    "DCGM_FI_DEV_XID_ERRORS",
    "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
    "DCGM_FI_PROF_SM_ACTIVE",
    "DCGM_FI_PROF_SM_OCCUPANCY",
    "DCGM_FI_PROF_NVLINK_TX_BYTES",
    "DCGM_FI_PROF_NVLINK_RX_BYTES",
    "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
    "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL",
    "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL",
    "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL",
    "DCGM_FI_DEV_THERMAL_VIOLATION",
    "DCGM_FI_DEV_CLOCKS_EVENT_REASONS",
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
    "DCGM_EXP_XID_ERRORS_COUNT",
    # remapped rows
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
    "DCGM_FI_DEV_ROW_REMAP_FAILURE",
}


def test_rendered_csv_parses_and_covers_the_design_list() -> None:
    counters = parse(render())
    fields = {c.field for c in counters}
    assert DESIGN_FIELDS - fields == set()
    assert fields == DESIGN_FIELDS | {"DCGM_FI_DEV_SM_CLOCK", "DCGM_FI_DEV_FB_USED"}
    assert len(counters) == 26


def test_types_of_key_fields() -> None:
    by_field = {c.field: c for c in parse(render())}
    assert by_field["DCGM_FI_DEV_GPU_TEMP"] == Counter("DCGM_FI_DEV_GPU_TEMP", "gauge", "GPU temperature (in C).")
    assert by_field["DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"].type == "gauge"
    assert by_field["DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL"].type == "counter"
    assert by_field["DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"].type == "counter"
    assert by_field["DCGM_EXP_XID_ERRORS_COUNT"].type == "gauge"


def test_every_line_has_exactly_two_commas() -> None:
    # dcgm-exporter splits on every comma: a comma in a help text breaks the line.
    body = [line for line in render().splitlines() if line and not line.startswith("#")]
    assert len(body) == 26
    assert all(line.count(",") == 2 for line in body)


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("DCGM_FI_DEV_GPU_TEMP, gauge", "line 2: expected 'FIELD, type, help' (3 parts), got 2"),
        ("DCGM_FI_DEV_GPU_TEMP, gauge, hot, very", "line 2: expected 'FIELD, type, help' (3 parts), got 4"),
        ("GPU_TEMP, gauge, x", "line 2: 'GPU_TEMP' is not a DCGM field name"),
        ("DCGM_FI_DEV_GPU-TEMP, gauge, x", "line 2: 'DCGM_FI_DEV_GPU-TEMP' is not a DCGM field name"),
        ("DCGM_FI_dev_gpu_temp, gauge, x", "line 2: 'DCGM_FI_dev_gpu_temp' must be upper case"),
        ("DCGM_FI_DEV_GPU_TEMP, histogram, x", "line 2: type 'histogram' is not one of ['counter', 'gauge', 'label']"),
        ("DCGM_FI_DEV_GPU_TEMP, gauge, ", "line 2: DCGM_FI_DEV_GPU_TEMP has no help text"),
        ("DCGM_FI_DEV_SM_CLOCK, gauge, again", "line 2: DCGM_FI_DEV_SM_CLOCK already defined on line 1"),
    ],
)
def test_bad_lines_are_rejected_with_their_line_number(line: str, message: str) -> None:
    text = f"DCGM_FI_DEV_SM_CLOCK, gauge, SM clock.\n{line}\n"
    with pytest.raises(CountersError) as caught:
        parse(text, required=frozenset())
    assert str(caught.value) == message


def test_dropping_a_required_field_is_rejected() -> None:
    text = "\n".join(line for line in render().splitlines() if not line.startswith("DCGM_FI_DEV_GPU_TEMP,"))
    with pytest.raises(CountersError) as caught:
        parse(text)
    assert str(caught.value) == "required fields missing: DCGM_FI_DEV_GPU_TEMP"


def test_comments_and_blank_lines_are_ignored() -> None:
    text = "# c\n\n   \n  # indented comment\nDCGM_FI_DEV_GPU_TEMP,gauge,t\n"
    assert parse(text, required=frozenset({"DCGM_FI_DEV_GPU_TEMP"})) == (Counter("DCGM_FI_DEV_GPU_TEMP", "gauge", "t"),)


def test_required_fields_are_the_shipped_fields() -> None:
    assert {c.field for c in parse(render())} == dcgm_counters.REQUIRED_FIELDS


#: What each field is, from DCGM's field definitions (dcgm_fields.h) and the type dcgm-exporter's own
#: default-counters.csv gives it: ``total`` fields only grow (counter), ``level`` and ``rate`` fields are read as
#: they are (gauge). NVLink TX/RX bytes are a *rate* (bytes per second): ``rate()`` of them means nothing.
DCGM_DEFINITIONS = {
    "DCGM_FI_DEV_GPU_TEMP": "level", "DCGM_FI_DEV_MEMORY_TEMP": "level", "DCGM_FI_DEV_POWER_USAGE": "level",
    "DCGM_FI_DEV_THERMAL_VIOLATION": "total", "DCGM_FI_DEV_CLOCKS_EVENT_REASONS": "level",
    "DCGM_FI_DEV_SM_CLOCK": "level", "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": "level", "DCGM_FI_PROF_SM_ACTIVE": "level",
    "DCGM_FI_PROF_SM_OCCUPANCY": "level", "DCGM_FI_PROF_GR_ENGINE_ACTIVE": "level",
    "DCGM_FI_PROF_DRAM_ACTIVE": "level", "DCGM_FI_DEV_GPU_UTIL": "level", "DCGM_FI_DEV_FB_USED": "level",
    "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL": "total", "DCGM_FI_PROF_NVLINK_TX_BYTES": "rate",
    "DCGM_FI_PROF_NVLINK_RX_BYTES": "rate", "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL": "total",
    "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL": "total", "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL": "total",
    "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL": "total", "DCGM_FI_DEV_XID_ERRORS": "level",
    "DCGM_EXP_XID_ERRORS_COUNT": "level", "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": "total",
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": "total", "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": "total",
    "DCGM_FI_DEV_ROW_REMAP_FAILURE": "level",
}
PROMETHEUS_TYPE = {"total": "counter", "level": "gauge", "rate": "gauge"}


def test_every_field_is_typed_as_dcgm_defines_it() -> None:
    shipped = {c.field: c.type for c in parse(render())}
    assert set(shipped) == set(DCGM_DEFINITIONS)
    wrong = {f: (t, PROMETHEUS_TYPE[DCGM_DEFINITIONS[f]]) for f, t in shipped.items()
             if t != PROMETHEUS_TYPE[DCGM_DEFINITIONS[f]]}
    assert wrong == {}


def test_no_rule_or_signal_takes_rate_of_a_gauge() -> None:
    """``rate()``/``increase()`` only over counters: on a gauge they read noise (or zero) as the answer."""
    import re

    from agents.health_guard.contract import default_signals
    from components.alert_rules import build_rule_spec
    from components.dashboards import gpu_fleet, gpu_health

    gauges = {f for f, kind in DCGM_DEFINITIONS.items() if PROMETHEUS_TYPE[kind] == "gauge"}
    texts = [r["expr"] for g in build_rule_spec()["groups"] for r in g["rules"]]
    texts += [s.query for s in default_signals()]
    texts += [gpu_fleet.render(gpu_fleet.DashboardOptions()), gpu_health.render(gpu_health.HealthDashboardOptions())]
    misuse = sorted({m for text in texts for m in re.findall(r"(?:rate|increase|irate)\((\w+)", text)} & gauges)
    assert misuse == []
