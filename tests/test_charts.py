"""Charts from the Go module cache: Go's answer parsed strictly, the chart checked, clear errors otherwise."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from components import charts
from components.mockrt import RunResult


def chart_tree(root: Path, name: str = "volcano", version: str = "1.14.0") -> Path:
    chart = root / charts.VOLCANO.subdir
    chart.mkdir(parents=True)
    (chart / "Chart.yaml").write_text(f"apiVersion: v1\nname: {name}\nversion: \"{version}\"\n")
    return chart


def test_module_dir_from_go_json() -> None:
    out = json.dumps({"Path": "volcano.sh/volcano", "Version": "v1.14.1", "Dir": "/cache/volcano.sh/volcano@v1.14.1"})
    assert charts.module_dir(out, "volcano.sh/volcano@v1.14.1") == Path("/cache/volcano.sh/volcano@v1.14.1")


def test_module_dir_reports_gos_error() -> None:
    out = json.dumps({"Path": "volcano.sh/volcano", "Version": "v1.99.0", "Error": "unknown revision v1.99.0"})
    with pytest.raises(charts.ChartError, match=r"go mod download volcano.sh/volcano@v1.99.0 failed: unknown revision"):
        charts.module_dir(out, "volcano.sh/volcano@v1.99.0")


@pytest.mark.parametrize(("text", "message"), [
    ("not json", "output is not JSON"),
    ("[1]", "expected a JSON object, got list"),
    ("{}", "no Dir in its output"),
    ('{"Dir": 3}', "no Dir in its output"),
])
def test_module_dir_refuses_odd_output(text: str, message: str) -> None:
    with pytest.raises(charts.ChartError, match=message):
        charts.module_dir(text, "m@v1")


@given(st.text(max_size=200))
def test_module_dir_never_fails_other_than_with_chart_error(text: str) -> None:
    try:
        found = charts.module_dir(text, "m@v1")
    except charts.ChartError:
        return
    assert str(found) and json.loads(text)["Dir"]


def test_check_chart_finds_the_expected_chart(tmp_path: Path) -> None:
    made = chart_tree(tmp_path)
    assert charts.check_chart(charts.VOLCANO, tmp_path) == made


def test_check_chart_names_what_differs(tmp_path: Path) -> None:
    chart_tree(tmp_path, version="1.15.0")
    with pytest.raises(charts.ChartError, match=r"Chart.yaml says chart 'volcano' version '1.15.0', "
                       r"components/charts.py expects 'volcano' version '1.14.0'"):
        charts.check_chart(charts.VOLCANO, tmp_path)
    with pytest.raises(charts.ChartError,
                       match=r"volcano.sh/volcano@v1.14.1/installer/helm/chart/volcano: no Chart.yaml"):
        charts.check_chart(charts.VOLCANO, tmp_path / "elsewhere")


def test_without_go_the_error_says_what_to_do(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shutil, "which", lambda _: None)
    with pytest.raises(charts.ChartError, match=r"from the Go module volcano.sh/volcano@v1.14.1, and `go` is not on "
                       r"PATH; install Go .* or set scheduling.install: false"):
        charts.from_go_module_cache(charts.VOLCANO)


def test_resolver_is_swapped_only_inside_the_block() -> None:
    with charts.resolving_with(charts.reference_only):
        assert charts.chart_path(charts.VOLCANO) == "volcano.sh/volcano@v1.14.1/installer/helm/chart/volcano"
    assert charts._resolver is charts.from_go_module_cache


@pytest.mark.skipif(shutil.which("go") is None, reason="go is not installed")
def test_the_pinned_module_carries_the_chart() -> None:
    # The real module (from the cache the local cluster build fills, or the module proxy).
    path = Path(charts.from_go_module_cache(charts.VOLCANO))
    assert path.parts[-4:] == ("installer", "helm", "chart", "volcano")
    assert "volcano.sh/volcano@v1.14.1" in str(path)
    assert (path / "templates" / "scheduler.yaml").is_file()


def _paths(values: dict[str, object], prefix: str = "") -> set[str]:
    out = set()
    for key, value in values.items():
        path = f"{prefix}{key}"
        out.add(path)
        if isinstance(value, dict) and value:
            out |= _paths(value, f"{path}.")
    return out


@pytest.mark.skipif(shutil.which("go") is None, reason="go is not installed")
def test_every_value_we_pass_is_a_key_of_the_charts_values(prod: RunResult) -> None:
    # A key the chart does not read is silently ignored (the 1.15 repository chart's node selector keys were).
    import yaml

    defaults = yaml.safe_load((Path(charts.from_go_module_cache(charts.VOLCANO)) / "values.yaml").read_text())
    (chart,) = prod.by_type("kubernetes:helm.sh/v4:Chart")
    ours = chart.inputs["values"]
    top = {f"{section}.{key}" for section, keys in ours.items() for key in keys}
    assert sorted(top - _paths(defaults)) == []
