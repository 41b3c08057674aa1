"""The guard's observation: its queries side by side, bounded, with the same readings, unknowns and errors as one
after the other; a stop ends it before the queries not yet sent; the cycle period (docs/scale.md: fault storms)."""

from __future__ import annotations

import threading
import time
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from agents.health_guard.contract import HealthSettings
from agents.health_guard.prometheus import QueryError, observe
from agents.health_guard.shell import next_cycle_in

BASE = HealthSettings()
QUERIES = [*(e.freshness_query for e in BASE.exporters.values()), *(s.query for s in BASE.signals)]


class Prom:
    """Answers every query with a per-query value for one node; ``failing`` queries raise; counts what is in
    flight."""

    def __init__(self, failing: frozenset[str] = frozenset(), delay: float = 0.0) -> None:
        self.failing, self.delay = failing, delay
        self.lock = threading.Lock()
        self.in_flight = self.most = 0
        self.asked: list[str] = []

    def query_raw(self, promql: str) -> Any:
        with self.lock:
            self.in_flight += 1
            self.most = max(self.most, self.in_flight)
            self.asked.append(promql)
        try:
            time.sleep(self.delay)
            if promql in self.failing:
                raise QueryError(f"{promql[:20]} refused")
            label = "node" if "infiniband" in promql else "Hostname"
            return {"status": "success", "data": {"resultType": "vector", "result": [
                {"metric": {label: "gpu-1"}, "value": [0, str(QUERIES.index(promql))]}]}}
        finally:
            with self.lock:
                self.in_flight -= 1


@settings(max_examples=40, deadline=None)
@given(st.sets(st.sampled_from(QUERIES)), st.integers(1, 16))
def test_side_by_side_reads_exactly_what_one_after_the_other_reads(failing: set[str], concurrency: int) -> None:
    serial = observe(BASE.model_copy(update={"query_concurrency": 1}), Prom(frozenset(failing)))
    parallel = observe(BASE.model_copy(update={"query_concurrency": concurrency}), Prom(frozenset(failing)))
    assert parallel == serial
    failed_signals = {s.name for s in BASE.signals if s.query in failing}
    assert serial[0].failed == frozenset(failed_signals)  # a failed query is unknown, never clear
    assert len(serial[1]) == len(failing)


def test_no_more_queries_in_flight_than_the_bound_and_more_than_one() -> None:
    prom = Prom(delay=0.02)
    observe(BASE.model_copy(update={"query_concurrency": 3}), prom)
    assert prom.most == 3 and sorted(prom.asked) == sorted(QUERIES)


def test_a_stop_sends_no_further_query_and_leaves_the_rest_unknown() -> None:
    prom = Prom()
    calls = [0]

    def stopped() -> bool:
        calls[0] += 1
        return calls[0] > 5

    obs, errors = observe(BASE.model_copy(update={"query_concurrency": 1}), prom, stopped)
    assert len(prom.asked) == 5 and errors == []
    asked_signals = {s.name for s in BASE.signals if s.query in prom.asked}
    assert obs.failed == frozenset(s.name for s in BASE.signals) - asked_signals
    assert set(obs.readings) == asked_signals


@given(st.floats(0.1, 600), st.floats(-1e6, 1e6))
def test_cycles_start_every_period_and_at_once_after_a_long_one(period: float, took: float) -> None:
    wait = next_cycle_in(period, took)
    assert 0.0 <= wait <= period
    if 0 <= took <= period:
        assert abs(wait - (period - took)) < 1e-9
    elif took > period:
        assert wait == 0.0
