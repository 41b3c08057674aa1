"""The demand forecast an inference service's HPA takes as its second metric, and its model.

One module holds both the recording rules Prometheus evaluates and the pure function the simulator evaluates,
so "the simulator models the rule as deployed" is one file's claim, and ``tests/test_forecast.py`` checks it
with promtool on the same series.

Per service, one rule group evaluated every ``FORECAST_INTERVAL_SECONDS`` records two series:

* ``service:<series>:max{service="<svc>"}``: the service's demand, the same ``max by (service)`` the adapter
  applies to the demand metric the HPA already scales on;
* ``service:<series>:forecast{service="<svc>"}``: ``clamp_min(max(trend, seasonal), 0)`` over the first one, where

  - trend = ``predict_linear(D[W], H)``: the least-squares line through the last W seconds of demand,
    evaluated H seconds ahead;
  - seasonal = ``D offset (P - H) * level(now) / level(one season ago)``: the demand one season ago at the
    horizon, scaled by today's level over the level window against that season's (absent until one season of
    history exists, or when that season's level was zero).

Why these two terms and the larger of them. The HPA already follows demand now; what it cannot do is ask for
a replica before the demand that needs it arrives, and a replica asked for on a virtual node serves only
after the external start (image pull and model load, minutes). So H is about that start. A ramp that began
is continued by the trend; a ramp that has not begun yet but comes every day at this hour is anticipated only
by the season. Each is a whole forecast of the demand at t + H, and the HPA takes the largest of its metrics,
so the rule takes the larger of the two as well: adding them would count a seasonal ramp twice (today's
trend already contains it). A forecast below demand changes nothing (the demand metric wins), so the rule
needs no guard against undershooting; it is clamped at zero only so that a falling trend never reads as a
negative queue.

Range windows are written half an evaluation interval short (``[292500ms]`` for 300 s): the recorded
samples lie exactly on the evaluation grid, and a window ending between two grid points holds the same
samples whether the Prometheus version treats a range as closed at its left end (2.x) or open (3.x).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from components.config import FORECAST_INTERVAL_SECONDS, Forecast, InferenceService

#: The label naming the service on the demand series (the queue exporters' own, which the adapter selects on).
SERVICE_LABEL = "service"


@dataclass(frozen=True)
class ForecastRule:
    """One service's forecast: its demand series and the rule's parameters (seconds)."""

    service: str
    source: str
    horizon_s: int
    trend_window_s: int
    season_s: int
    level_window_s: int
    interval_s: int = FORECAST_INTERVAL_SECONDS

    @classmethod
    def of(cls, service: str, source: str, forecast: Forecast) -> ForecastRule:
        return cls(service, source, forecast.horizon_seconds, forecast.trend_window_seconds,
                   forecast.season_seconds, forecast.level_window_seconds)

    @property
    def demand_record(self) -> str:
        return f"{SERVICE_LABEL}:{self.source}:max"

    @property
    def forecast_record(self) -> str:
        return f"{SERVICE_LABEL}:{self.source}:forecast"

    @property
    def metric_name(self) -> str:
        """What the adapter serves the forecast as, and the HPA's second external metric (no colons)."""
        return adapter_name(self.source)


def adapter_name(source: str) -> str:
    return f"{source}_forecast"


def rules_for(services: Sequence[InferenceService], series_of: Any) -> list[ForecastRule]:
    """The forecast rule of every service that sets one; ``series_of(service)`` names its demand series."""
    return [ForecastRule.of(s.name, series_of(s), s.scaling.forecast) for s in services
            if s.scaling.forecast.enabled]


def _window(seconds: int, interval_s: int) -> str:
    """A range half an interval short of ``seconds`` (see the module's note)."""
    return f"{seconds * 1000 - interval_s * 500}ms"


def forecast_expr(rule: ForecastRule) -> str:
    """The PromQL of the forecast record."""
    d = f'{rule.demand_record}{{{SERVICE_LABEL}="{rule.service}"}}'
    trend = f"predict_linear({d}[{_window(rule.trend_window_s, rule.interval_s)}], {rule.horizon_s})"
    if not rule.season_s:
        return f"clamp_min({trend}, 0)"
    level = _window(rule.level_window_s, rule.interval_s)
    # The mean written as sum / count, the operations the model repeats in the same order.
    now = f"(sum_over_time({d}[{level}]) / count_over_time({d}[{level}]))"
    then = (f"(sum_over_time({d}[{level}] offset {rule.season_s}s) / "
            f"count_over_time({d}[{level}] offset {rule.season_s}s))")
    seasonal = f"({d} offset {rule.season_s - rule.horizon_s}s * {now} / ({then} > 0))"
    # The larger of the two where both exist, else whichever does.
    return f"clamp_min(({trend} > {seasonal}) or {seasonal} or {trend}, 0)"


def rule_groups(rules: Sequence[ForecastRule]) -> list[dict[str, Any]]:
    """The PrometheusRule groups: one per service, at the evaluation interval."""
    return [{
        "name": f"inference-forecast-{r.service}",
        "interval": f"{r.interval_s}s",
        "rules": [
            {"record": r.demand_record,
             "expr": f'max by ({SERVICE_LABEL}) ({r.source}{{{SERVICE_LABEL}="{r.service}"}})'},
            {"record": r.forecast_record, "expr": forecast_expr(r)},
        ],
    } for r in rules]


def adapter_rules(rules: Sequence[ForecastRule]) -> list[dict[str, Any]]:
    """prometheus-adapter external rules serving each forecast record as ``<series>_forecast``."""
    sources = sorted({r.source for r in rules})
    return [{
        "seriesQuery": f'{SERVICE_LABEL}:{source}:forecast{{{SERVICE_LABEL}!=""}}',
        "resources": {"namespaced": False},
        "name": {"matches": f"^{SERVICE_LABEL}:{source}:forecast$", "as": adapter_name(source)},
        "metricsQuery": f"max(<<.Series>>{{<<.LabelMatchers>>}}) by ({SERVICE_LABEL})",
    } for source in sources]


# ---------------------------------------------------------------------------------------------- the model


def _linear_regression(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float]:
    """Prometheus's linearRegression (promql/functions.go): slope and the intercept at x = 0 (the evaluation
    time), the same operations in the same order; a constant series is exactly flat."""
    if all(y == ys[0] for y in ys):
        return 0.0, ys[0]
    n = float(len(xs))
    sum_x = sum_y = sum_xy = sum_x2 = 0.0
    for x, y in zip(xs, ys, strict=True):
        sum_x += x
        sum_y += y
        sum_xy += x * y
        sum_x2 += x * x
    cov_xy = sum_xy - sum_x * sum_y / n
    var_x = sum_x2 - sum_x * sum_x / n
    slope = cov_xy / var_x
    return slope, sum_y / n - slope * sum_x / n


def forecast_at(demand: Sequence[float], n: int, rule: ForecastRule) -> float | None:
    """The forecast record's value at evaluation ``n`` (time ``n × interval``), from the demand record's
    values ``demand[0..n]`` (``demand[k]`` recorded at ``k × interval``, the series starting at 0). ``None``
    where the rule yields no sample (fewer than two samples in the trend window).

    The same formula as :func:`forecast_expr`, evaluated the way Prometheus does on samples on the grid.
    """
    step = rule.interval_s
    k = rule.trend_window_s // step  # samples in the half-interval-short window: n-k+1 .. n
    first = max(0, n - k + 1)
    ys = demand[first:n + 1]
    trend = None
    if len(ys) >= 2:
        xs = [float((i - n) * step) for i in range(first, n + 1)]
        slope, intercept = _linear_regression(xs, ys)
        trend = slope * rule.horizon_s + intercept
    seasonal = None
    if rule.season_s:
        back = (rule.season_s - rule.horizon_s) // step
        season = rule.season_s // step
        lw = rule.level_window_s // step
        # An instant selector finds the newest sample within the 5-minute lookback; the grid has one exactly there.
        if n - back >= 0 and n - season >= 0:
            now = demand[max(0, n - lw + 1):n + 1]
            then = demand[max(0, n - season - lw + 1):n - season + 1]
            mean_then = sum(then) / len(then)
            if mean_then > 0:
                seasonal = demand[n - back] * (sum(now) / len(now)) / mean_then
    if trend is None:
        value = seasonal
    elif seasonal is None:
        value = trend
    else:
        value = trend if trend > seasonal else seasonal
    if value is None:
        return None
    return value if value >= 0 or math.isnan(value) else 0.0
