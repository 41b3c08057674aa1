"""The forecast metric in the simulator: the HPA's second metric from the deployed rule's own function
(components.forecast.forecast_at), evaluated every 15 s on the demand then and read one evaluation late, the
larger count winning; the stack's setting reaching the model; invariants and quiet ticks with it on."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from bench.sim.demand import ALL, TraceWorkload
from bench.sim.engine import Simulator
from bench.sim.model import ClusterModel, PoolModel, ServiceModel
from bench.sim.policies import CONTROLLER, Policy, foresighted, no_burst, oracle
from components.config import Forecast, parse_config
from components.forecast import ForecastRule, forecast_at
from components.mockrt import raw_from_stack
from tests.test_sim import FLAT, ONE, quiet_and_exact, small_stack

STEP = 15.0
RULE = ForecastRule("svc", "demand", 180, 120, 0, 3600)
#: A ramp from 1 to 13 replicas' worth over 16 minutes in 15 s bins, then flat (max 16 replicas, headroom 1.15).
RAMP = tuple(min(1.0 + i * 0.2, 13.0) / 16.0 for i in range(200))


def ramp_sim(rule: ForecastRule | None, policy: Policy | None = None, nodes: int = 1,
             warmup_s: float = 0.0) -> Simulator:
    model = replace(ONE, pools=(PoolModel("gpu", nodes, 8),),
                    services=(ServiceModel("svc", 1, 1, 16, 1, 0.0, 300.0, rule),))
    workload = TraceWorkload((), (), replace(FLAT, peak_share=1.0), shapes={ALL: RAMP}, bin_s=STEP, peak_share=1.0)
    return Simulator(model, workload, policy or no_burst(), 3000.0 - warmup_s, warmup_s, check=True)


def test_the_hpa_takes_the_larger_of_demand_and_the_forecast_one_evaluation_late() -> None:
    sim = ramp_sim(RULE)
    headroom = sim.hpa.headroom
    demand = [16 * v for v in RAMP]
    raws: list[int] = []
    replicas = 1
    for k in range(80):
        sim.hpa.run(k * STEP)
        # The evaluation at the sync's own instant is not read; the one before is.
        forecast = forecast_at(demand[:k], k - 1, RULE) if k >= 1 else None
        want = math.ceil(demand[k] * headroom - 1e-9)
        if forecast is not None:
            want = max(want, math.ceil(forecast * headroom - 1e-9))
        raws.append(min(max(want, 1), 16))
        # Up at once; down to the highest recommendation of the last 300 s (the scale-down window).
        held = max(raws[max(0, k - 20):])
        replicas = raws[-1] if raws[-1] > replicas else min(replicas, held)
        assert sim.cluster.services[0].replicas == replicas, k
        assert sim.hpa.recorded[0] == demand[:k + 1]
    # On the ramp, the forecast asked for more than demand did (the trend 180 s ahead).
    assert any(r > math.ceil(d * headroom - 1e-9) for r, d in zip(raws, demand, strict=False))


def test_without_a_forecast_the_hpa_follows_demand_alone() -> None:
    sim = ramp_sim(None)
    for k in range(40):
        sim.hpa.run(k * STEP)
        assert sim.cluster.services[0].replicas == min(max(math.ceil(16 * RAMP[k] * sim.hpa.headroom - 1e-9), 1), 16)
    assert sim.hpa.recorded == [[]]


def test_the_forecast_serves_the_ramp_sooner() -> None:
    off, on = ramp_sim(None).run(), ramp_sim(RULE).run()
    assert on.inference_availability > off.inference_availability
    assert on.shortfall_starting < off.shortfall_starting


def test_a_perfect_forecast_asks_at_once_for_the_peak_of_the_next_external_start() -> None:
    """The forecast bound: the service's own rule gives way to the true peak demand of the next 195 s (the
    external start and one HPA period), sampled every HPA period, against demand as ever."""
    model = replace(ONE, services=(ServiceModel("svc", 1, 1, 16, 1, 0.0, 300.0, RULE),))
    sim = ramp_sim(RULE, foresighted(no_burst(), model))
    assert sim.policy.foresight_s == 195.0 and sim.hpa.forecasts == [None]
    headroom = sim.hpa.headroom
    demand = [16 * v for v in RAMP]
    for k in range(70):  # the ramp and its top: the peak ahead never falls, so the HPA follows it up at once
        sim.hpa.run(k * STEP)
        peak = max(demand[k:k + 14])
        assert sim.cluster.services[0].replicas == min(max(math.ceil(peak * headroom - 1e-9), 1), 16), k
        assert sim.cluster.services[0].demand == demand[k]  # availability is still measured on demand now


def test_a_perfect_forecast_serves_the_ramp_before_it_comes() -> None:
    model = replace(ONE, services=(ServiceModel("svc", 1, 1, 16, 1, 0.0, 300.0, RULE),))
    # 16 GPUs hold the whole ramp: only the start of a pod stands between demand and its replicas. Measured
    # from the first replica's start (60 s), the perfect forecast is never late.
    off, rule = (ramp_sim(r, nodes=2, warmup_s=60.0).run() for r in (None, RULE))
    perfect = ramp_sim(RULE, foresighted(no_burst(), model), nodes=2, warmup_s=60.0).run()
    assert perfect.inference_availability == 1.0 >= rule.inference_availability > off.inference_availability
    assert perfect.shortfall_starting == 0.0 < off.shortfall_starting


def test_the_oracle_has_no_forecast() -> None:
    sim = ramp_sim(RULE, oracle(ONE))
    assert sim.hpa.forecasts == [None]


def test_the_stack_setting_reaches_the_model() -> None:
    raw = raw_from_stack("prod")
    raw["inference"]["services"][0]["scaling"]["forecast"] = {"horizonSeconds": 180, "seasonSeconds": 86400}
    model = ClusterModel.from_config(parse_config(raw, "Pulumi.prod.yaml"))
    assert model.services[0].forecast == ForecastRule("sdxl-turbo", "demand", 180, 300, 86400, 3600)
    assert model.services[1].forecast is None
    every = model.with_forecast(Forecast(horizon_seconds=120))
    assert [s.forecast.horizon_s if s.forecast else None for s in every.services] == [120, 120, 120]
    assert all(s.forecast is None for s in model.with_forecast(Forecast()).services)


@pytest.mark.parametrize("forecast", [Forecast(horizon_seconds=180),
                                      Forecast(horizon_seconds=180, season_seconds=3600, level_window_seconds=600)],
                         ids=["trend", "trend+season"])
def test_quiet_ticks_and_invariants_with_the_forecast_on(forecast: Forecast) -> None:
    model, settings, workload = small_stack()
    model = model.with_forecast(forecast)
    _, quiet, _ = quiet_and_exact(model, workload, Policy("controller", CONTROLLER, settings, model.descheduler),
                                  check=True)
    assert quiet.inference_availability > 0.9
