"""The HPA model: per service every period, desired = ceil(demand × headroom) clamped to [min, max], with the
upstream stabilisation rule (scale up to the minimum of the up-window, down to the maximum of the down-window).
Scale-down deletes pods in the ReplicaSet's order: unplaced, not ready, lower deletion cost, newest.

A service with a forecast (`ServiceModel.forecast`, the stack's `scaling.forecast`) has it as a second metric:
its recording rule is evaluated every `interval_s` from the demand sampled then (`components.forecast
.forecast_at`, the function promtool checks against the rendered rule), and each HPA sync reads the newest
evaluation strictly before it (the adapter serves what Prometheus has recorded; an evaluation at the same
instant is taken as not yet written), proposing ceil(forecast × headroom) beside ceil(demand × headroom) and
taking the larger, as the HPA does with two metrics, before its stabilisation windows.

A policy with foresight (`foresight_s`, the perfect-forecast bound) has instead, as its second metric, the true
peak demand over the next `foresight_s` seconds, sampled every HPA period.

The oracle policy (`zero_lag`) follows demand at once; the oracles (`rebalance`) move external pods on-prem
the moment they fit.
"""

from __future__ import annotations

import math
from collections import deque

from bench.sim.cluster import ClusterState
from bench.sim.replicasets import ReplicaSets
from bench.sim.workload import Workload
from components.forecast import ForecastRule, forecast_at


class Hpa:
    """Every HorizontalPodAutoscaler of the run, evaluated together once per period."""

    def __init__(self, cluster: ClusterState, replicasets: ReplicaSets, workload: Workload, headroom: float,
                 zero_lag: bool, rebalance: bool = False, foresight_s: float = 0.0) -> None:
        self.cluster = cluster
        self.replicasets = replicasets
        self.workload = workload
        self.headroom = headroom
        self.zero_lag = zero_lag
        self.rebalancing = rebalance
        models = cluster.model.services
        # Foresight replaces the services' own rules: one second metric, as deployed.
        self.forecasts: list[ForecastRule | None] = [
            None if zero_lag or foresight_s > 0 else m.forecast for m in models]
        step = cluster.model.latencies.hpa_period_s
        self.foresight = [step * k for k in range(1, int(foresight_s // step) + 1)] if foresight_s > 0 else []
        self.recorded: list[list[float]] = [[] for _ in models]  # the demand record, one value per evaluation
        self.forecast: list[float | None] = [None for _ in models]  # the newest evaluation's value
        self._next_eval = [0.0 for _ in models]

    def evaluate_rules(self, s: int, t: float, including: bool) -> None:
        """Run service `s`'s recording rules at every evaluation instant before `t` (and at `t`, `including`)."""
        rule = self.forecasts[s]
        assert rule is not None
        svc = self.cluster.services[s]
        recorded = self.recorded[s]
        while self._next_eval[s] < t or (including and self._next_eval[s] == t):
            at = self._next_eval[s]
            recorded.append(self.workload.demand(svc.name, svc.max, at))
            self.forecast[s] = forecast_at(recorded, len(recorded) - 1, rule)
            self._next_eval[s] = at + rule.interval_s

    def run(self, t: float) -> None:
        c = self.cluster
        demand = self.workload.demand
        for s, svc in enumerate(c.services):
            d = demand(svc.name, svc.max, t)
            if d != svc.demand:
                svc.demand = d
                c.avail_dirty = True
            want = math.ceil(d * self.headroom - 1e-9)
            if self.forecasts[s] is not None:
                self.evaluate_rules(s, t, including=False)
                f = self.forecast[s]  # the evaluations before t only
                if f is not None and f == f:
                    want = max(want, math.ceil(f * self.headroom - 1e-9))
                self.evaluate_rules(s, t, including=True)
            for ahead in self.foresight:
                f = demand(svc.name, svc.max, t + ahead)
                if f > d:
                    want = max(want, math.ceil(f * self.headroom - 1e-9))
            raw = min(max(want, svc.min), svc.max)
            if self.zero_lag:
                target = raw
            else:
                up = raw if svc.up_s <= 0 else self.window(svc.history_up, t, raw, svc.up_s, lowest=True)
                down = self.window(svc.history, t, raw, svc.down_s, lowest=False)
                target = svc.replicas
                if target < up:
                    target = up
                elif target > down:
                    target = down
            if target != svc.replicas:
                svc.replicas = target
                self.replicasets.reconcile(s)
        if self.rebalancing:
            self.rebalance()

    @staticmethod
    def window(hist: deque[tuple[float, int]], t: float, value: int, span: float, lowest: bool) -> int:
        """Sliding-window min or max of recommendations (monotone deque: O(1) amortised)."""
        if lowest:
            while hist and hist[-1][1] >= value:
                hist.pop()
        else:
            while hist and hist[-1][1] <= value:
                hist.pop()
        hist.append((t, value))
        while hist[0][0] < t - span:
            hist.popleft()
        return hist[0][1]

    def rebalance(self) -> None:
        """The oracles only: move external pods on-prem the moment they fit, at no cost."""
        c = self.cluster
        for v in reversed(c.vn_order):  # the dearest provider's pods come home first
            for pid in list(c.vn_pods[v]):
                if c.onprem_free_gpus() == 0:
                    return
                pod = c.pods[pid]
                if pod.standby or not c.fits_onprem(pod.gpus):
                    continue
                s = pod.svc
                c.remove_pod(pod)
                self.replicasets.create_pod(s, replacement=True)
