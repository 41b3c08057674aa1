"""The demand forecast as the HPA's second metric: the rendered recording rules, the adapter's rule, the HPA's
metrics, the config's refusals, and the simulator's model (components.forecast.forecast_at) against promtool
evaluating the rendered PromQL on the same series."""

from __future__ import annotations

import copy
import random
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from components.config import Forecast, parse_config
from components.forecast import ForecastRule, forecast_at, forecast_expr, rule_groups
from components.mockrt import RunResult, config_error, raw_from_stack, run_program
from policies.rules import evaluate
from tests.conftest import raw_stack
from tests.promtool_support import promtool
from tests.test_schema_validation import validate_all
from tools import policy

STEP = 15
SOURCE = "inference_queue_depth"
#: The prod stack's first service with a forecast on (the parameters a stack would deploy, a short season so
#: the promtool series stays small).
FORECAST = {"horizonSeconds": 180, "trendWindowSeconds": 300, "seasonSeconds": 1800, "levelWindowSeconds": 600}


def with_forecast(config: dict[str, Any], index: int = 0, **overrides: int) -> None:
    services = config["gpu-cluster:inference"]["services"]
    services[index]["scaling"] = {**services[index]["scaling"], "forecast": {**FORECAST, **overrides}}


def forecast_raw() -> dict[str, Any]:
    raw = copy.deepcopy(raw_from_stack("prod"))
    raw["inference"]["services"][0]["scaling"] = {**raw["inference"]["services"][0]["scaling"], "forecast": FORECAST}
    return raw


@pytest.fixture(scope="module")
def forecasting() -> RunResult:
    config, secrets = raw_stack("prod")
    with_forecast(config)
    return run_program("prod", config, secrets)


def test_the_stack_with_a_forecast_validates_strictly(forecasting: RunResult) -> None:
    version = parse_config(forecast_raw(), "Pulumi.prod.yaml").kubernetes_version
    assert validate_all(forecasting, version) == []


def test_the_stack_with_a_forecast_passes_every_mandatory_rule(forecasting: RunResult) -> None:
    found = evaluate(policy.resources_of(forecasting), policy.context_for("prod", forecast_raw()))
    assert [(v.rule, v.resource, v.message) for v in found if v.level.value == "mandatory"] == []


def rules_spec(result: RunResult) -> dict[str, Any]:
    spec: dict[str, Any] = result.one("PrometheusRule", "inference-forecast").inputs["spec"]
    return spec


def test_hpa_takes_the_forecast_as_a_second_metric_with_the_same_target(forecasting: RunResult) -> None:
    metrics = forecasting.one("HorizontalPodAutoscaler", "sdxl-turbo").inputs["spec"]["metrics"]
    assert metrics == [
        {"type": "External",
         "external": {"metric": {"name": "inference_queue_depth",
                                 "selector": {"matchLabels": {"service": "sdxl-turbo"}}},
                      "target": {"type": "AverageValue", "averageValue": "4"}}},
        {"type": "External",
         "external": {"metric": {"name": "inference_queue_depth_forecast",
                                 "selector": {"matchLabels": {"service": "sdxl-turbo"}}},
                      "target": {"type": "AverageValue", "averageValue": "4"}}},
    ]
    # A service without a forecast keeps its one metric.
    assert len(forecasting.one("HorizontalPodAutoscaler", "whisper-large").inputs["spec"]["metrics"]) == 1


def test_the_adapter_serves_the_forecast_record(forecasting: RunResult) -> None:
    config = forecasting.one("ConfigMap", "prometheus-adapter-config").inputs["data"]["config.yaml"]
    external = yaml.safe_load(config)["externalRules"]
    assert external[-1] == {
        "seriesQuery": 'service:inference_queue_depth:forecast{service!=""}',
        "resources": {"namespaced": False},
        "name": {"matches": "^service:inference_queue_depth:forecast$", "as": "inference_queue_depth_forecast"},
        "metricsQuery": "max(<<.Series>>{<<.LabelMatchers>>}) by (service)",
    }
    assert [r["name"]["as"] for r in external].count("inference_queue_depth") == 1


def test_recording_rules_are_rendered_where_the_operator_reads_rules(forecasting: RunResult) -> None:
    rule = forecasting.one("PrometheusRule", "inference-forecast")
    assert rule.metadata["namespace"] == "monitoring"
    groups = rules_spec(forecasting)["groups"]
    assert [g["name"] for g in groups] == ["inference-forecast-sdxl-turbo"]
    assert groups[0]["interval"] == "15s"
    assert [r["record"] for r in groups[0]["rules"]] == [
        "service:inference_queue_depth:max", "service:inference_queue_depth:forecast"]
    assert groups[0]["rules"][0]["expr"] == 'max by (service) (inference_queue_depth{service="sdxl-turbo"})'


def test_no_forecast_by_default(prod: RunResult) -> None:
    assert prod.by_kind("PrometheusRule") and not [
        r for r in prod.by_kind("PrometheusRule") if r.metadata["name"] == "inference-forecast"]
    assert Forecast().enabled is False


def test_promtool_checks_the_rendered_rules(forecasting: RunResult, tmp_path: Path) -> None:
    rules = tmp_path / "rules.yml"
    rules.write_text(yaml.safe_dump(rules_spec(forecasting)))
    done = subprocess.run([promtool(), "check", "rules", str(rules)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


# ------------------------------------------------------------------ the model equals the deployed rule


def promtool_matches(spec: dict[str, Any], rule: ForecastRule, values: list[int], times: list[int],
                     tmp: Path) -> subprocess.CompletedProcess[str]:
    """promtool evaluates the forecast record at ``times`` (evaluation indices) on the series ``values`` (one
    sample every 15 s from 0); the expectation is the model's value on the same series."""
    rules = tmp / "rules.yml"
    rules.write_text(yaml.safe_dump(spec, sort_keys=False))
    checks = []
    for n in times:
        value = forecast_at([float(v) for v in values], n, rule)
        samples = [] if value is None else [
            {"labels": f'{rule.forecast_record}{{service="{rule.service}"}}', "value": value}]
        checks.append({"expr": f'{rule.forecast_record}{{service="{rule.service}"}}', "eval_time": f"{n * STEP}s",
                       "exp_samples": samples})
    test = tmp / "test.yml"
    test.write_text(yaml.safe_dump({
        "rule_files": [str(rules)], "evaluation_interval": f"{STEP}s",
        "tests": [{"interval": f"{STEP}s",
                   "input_series": [{"series": f'{SOURCE}{{service="{rule.service}",queue="a"}}',
                                     "values": " ".join(str(v) for v in values)}],
                   "promql_expr_test": checks}],
    }, sort_keys=False))
    return subprocess.run([promtool(), "test", "rules", str(test)], capture_output=True, text=True)


def ramps(seed: int, n: int) -> list[int]:
    """A demand series with a daily-like cycle, steps and noise (integers, so sums are exact)."""
    rng = random.Random(seed)
    out, level = [], 40
    for i in range(n):
        if rng.random() < 0.02:
            level += rng.randint(-10, 30)
        level = max(level, 0)
        out.append(max(0, level + (i % 120) // 4 + rng.randint(-3, 3)))
    return out


def test_model_equals_the_rendered_rule_on_a_series(forecasting: RunResult, tmp_path: Path) -> None:
    """The rule the stack renders, as promtool evaluates it, and the simulator's function, on one series: before
    the trend has two samples, before a season of history, and long after (the seasonal and trend terms both)."""
    spec = rules_spec(forecasting)
    rule = ForecastRule("sdxl-turbo", SOURCE, 180, 300, 1800, 600)
    assert spec["groups"][0]["rules"][1]["expr"] == forecast_expr(rule)
    values = ramps(1, 400)
    times = [0, 1, 2, 19, 20, 21, 100, 119, 120, 121, 150, 200, 260, 300, 333, 399]
    done = promtool_matches(spec, rule, values, times, tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    # The seasonal term decides some of these, the trend others.
    season = [forecast_at([float(v) for v in values], n, rule) for n in times]
    trend = [forecast_at([float(v) for v in values], n, ForecastRule("sdxl-turbo", SOURCE, 180, 300, 0, 600))
             for n in times]
    assert any(a != b for a, b in zip(season, trend, strict=True))
    assert any(a == b and a is not None for a, b in zip(season[-6:], trend[-6:], strict=True))


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(values=st.lists(st.integers(0, 500), min_size=60, max_size=90),
       horizon=st.sampled_from([15, 60, 180]), trend=st.sampled_from([30, 120, 300]),
       season=st.sampled_from([0, 300, 450]), level=st.sampled_from([60, 150]))
def test_model_equals_promtool_on_any_series(values: list[int], horizon: int, trend: int, season: int, level: int,
                                            tmp_path: Path) -> None:
    if season and season <= horizon:
        season = 0
    rule = ForecastRule("svc", SOURCE, horizon, trend, season, level)
    spec = {"groups": rule_groups([rule])}
    times = sorted({0, 1, len(values) // 3, len(values) // 2, len(values) - 1})
    done = promtool_matches(spec, rule, values, times, tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr


def test_constant_demand_forecasts_itself() -> None:
    rule = ForecastRule("s", SOURCE, 180, 300, 900, 300)
    assert forecast_at([7.0] * 200, 199, rule) == 7.0
    assert forecast_at([7.0], 0, rule) is None  # one sample: no trend, no season yet
    # A falling trend never reads as a negative queue.
    assert forecast_at([float(v) for v in range(40, 0, -2)], 19, ForecastRule("s", SOURCE, 600, 300, 0, 300)) == 0.0


# ------------------------------------------------------------------ refused config


def _forecast(index: int, **values: int) -> Any:
    def edit(raw: dict[str, Any]) -> None:
        scaling = raw["inference"]["services"][index]["scaling"]
        scaling["forecast"] = values
    return edit


def test_forecast_only_on_queue_depth() -> None:
    message = config_error(_forecast(1, horizonSeconds=180))
    assert ("inference.services[1].scaling: forecast applies to metric 'queue-depth' (one series per service, "
            "selected by its service label), not 'in-flight'") in message


def test_forecast_windows_lie_on_the_evaluation_grid() -> None:
    message = config_error(_forecast(0, horizonSeconds=100))
    assert ("inference.services[0].scaling.forecast: horizonSeconds must be a multiple of the rule's 15 s "
            "evaluation interval (the recorded samples it reads lie on that grid), got 100") in message


def test_season_longer_than_the_horizon() -> None:
    message = config_error(_forecast(0, horizonSeconds=300, seasonSeconds=300))
    assert "seasonSeconds (300) must exceed horizonSeconds (300)" in message


def test_forecast_bounds() -> None:
    assert "inference.services[0].scaling.forecast.horizonSeconds" in config_error(_forecast(0, horizonSeconds=7200))
    assert "inference.services[0].scaling.forecast.trendWindowSeconds" in config_error(
        _forecast(0, horizonSeconds=180, trendWindowSeconds=15))
