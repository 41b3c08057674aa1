"""The guard's XID query, evaluated by Prometheus' own engine (promtool): for any XIDs on any GPUs it answers, per
node, the number of GPUs whose last XID is listed — what ``count by (Hostname) (X == a or X == b …)`` answered, at
one selection of the gauge instead of one per listed XID (docs/scale.md: the fault storms)."""

from __future__ import annotations

import math
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agents.health_guard.contract import FATAL_XIDS, xid_query
from tests.promtool_support import promtool, series

GAUGE = "DCGM_FI_DEV_XID_ERRORS"


def listed_xids(query: str) -> list[int]:
    """The XIDs a query made by :func:`xid_query` keeps."""
    return sorted(int(x) for x in re.findall(r'vector\(1\), "xid", "(\d+)"', query))


def expected(readings: dict[tuple[str, int], float], xids: list[int]) -> dict[str, int]:
    """The old query's answer: GPUs per node whose reading equals a listed XID (NaN equals nothing)."""
    out: dict[str, int] = {}
    for (node, _), value in readings.items():
        if not math.isnan(value) and value in xids:
            out[node] = out.get(node, 0) + 1
    return out


def evaluate(tmp: Path, readings: dict[tuple[str, int], float], xids: list[int]) -> subprocess.CompletedProcess[str]:
    want = expected(readings, xids)
    test = {"tests": [{"interval": "1m", "input_series": [
        series(GAUGE, {"Hostname": node, "gpu": str(gpu)}, "NaN" if math.isnan(v) else f"{v:g}")
        for (node, gpu), v in sorted(readings.items())],
        "promql_expr_test": [{"expr": xid_query(xids), "eval_time": "0m", "exp_samples": [
            {"labels": f'{{Hostname="{node}"}}', "value": count} for node, count in sorted(want.items())]}]}]}
    path = tmp / "xid.yml"
    path.write_text(yaml.safe_dump(test, sort_keys=False))
    return subprocess.run([promtool(), "test", "rules", str(path)], capture_output=True, text=True)


READING = st.one_of(st.sampled_from([0.0, 13.0, 31.0, 79.5, math.nan]), st.sampled_from(FATAL_XIDS).map(float),
                    st.integers(1, 200).map(float))


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.dictionaries(st.tuples(st.sampled_from(["gpu-01", "gpu-02", "gpu-03"]), st.integers(0, 3)), READING,
                       min_size=1, max_size=12),
       st.lists(st.integers(1, 200), min_size=1, max_size=8, unique=True))
def test_the_query_counts_each_nodes_gpus_whose_last_xid_is_listed(tmp_path: Path, readings: Any,
                                                                    xids: list[int]) -> None:
    result = evaluate(tmp_path, readings, xids)
    assert result.returncode == 0, result.stdout + result.stderr


def test_a_wrong_answer_fails_the_check(tmp_path: Path) -> None:
    """The check above can fail: the same query asked to find GPU 79's node among XIDs that do not list 79."""
    readings = {("gpu-01", 0): 79.0, ("gpu-02", 0): 48.0}
    ok = evaluate(tmp_path, readings, [79])
    assert ok.returncode == 0, ok.stdout + ok.stderr
    test = yaml.safe_load((tmp_path / "xid.yml").read_text())
    test["tests"][0]["promql_expr_test"][0]["expr"] = xid_query([48])
    (tmp_path / "xid.yml").write_text(yaml.safe_dump(test))
    wrong = subprocess.run([promtool(), "test", "rules", str(tmp_path / "xid.yml")], capture_output=True, text=True)
    assert wrong.returncode != 0 and "gpu-02" in wrong.stdout + wrong.stderr


def test_the_listed_xids_are_the_ones_asked_for_once_each() -> None:
    assert listed_xids(xid_query([79, 48, 79])) == [48, 79]


@pytest.mark.parametrize("xids", [[], [0], [79, -1]])
def test_xids_that_are_not_positive_are_refused_by_name(xids: list[int]) -> None:
    with pytest.raises(ValueError, match="XIDs must be positive numbers"):
        xid_query(xids)
