"""The committed report's sections, read by the benches whose runs are too long for `make bench`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bench.committed import committed_result

JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=5),
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
                    max_leaves=12)
#: Documents shaped like a report at every depth, besides anything at all.
REPORTS = st.one_of(JSON, JSON.map(lambda m: {"benchmarks": {"bench_chaos": m}}),
                    JSON.map(lambda r: {"benchmarks": {"bench_chaos": {"result": r}, "bench_e2e": {}}}))


@given(REPORTS)
def test_any_report_gives_a_section_or_none(tmp_path_factory: pytest.TempPathFactory, document: object) -> None:
    """Whatever the file holds (a hand edit, a merge conflict, a half-written run), the reader gives a dict or None,
    never an exception; a dict only where the report has that module's result as an object."""
    path = tmp_path_factory.mktemp("r") / "report.json"
    path.write_text(json.dumps(document))
    got = committed_result("bench_chaos", path)
    found: object = document
    for key in ("benchmarks", "bench_chaos", "result"):
        found = found.get(key) if isinstance(found, dict) else None
    assert got == (found if isinstance(found, dict) else None)


def test_unreadable_reports_give_none(tmp_path: Path) -> None:
    assert committed_result("bench_chaos", tmp_path / "missing.json") is None
    (tmp_path / "bad.json").write_text("{not json")
    assert committed_result("bench_chaos", tmp_path / "bad.json") is None
    (tmp_path / "bytes.json").write_bytes(b"\xff\xfe\x00")
    assert committed_result("bench_chaos", tmp_path / "bytes.json") is None


def test_the_committed_report_carries_every_module_it_names() -> None:
    report = json.loads((Path(__file__).resolve().parent.parent / "bench" / "report.json").read_text())
    for module in report["benchmarks"]:
        assert committed_result(module) is not None, module
