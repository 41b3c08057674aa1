"""External GPU-hours per provider and their cost: what the burst costs in money, next to availability.

The engine integrates external GPUs as one total; a provider's price differs (a GPU cloud's list price, a
peered cluster's internal rate), so `CostedSimulator` also integrates each virtual node's used GPUs over the
measured period. Prices come from the stack (`providers[].pricePerGpuHour`, US dollars); a provider without
one is costed at zero and named in the report, so a missing price never hides in a total.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from bench.sim.engine import Outcome, Simulator
from bench.sim.model import ClusterModel
from bench.sim.policies import Policy, oracle
from bench.sim.workload import Workload
from components.config import ClusterConfig


@dataclass(frozen=True)
class Bill:
    """External GPU·h per provider and their cost for one policy's run."""

    policy: str
    gpu_hours: Mapping[str, float]
    cost: float
    unpriced: tuple[str, ...]  # providers used without a price in the stack


#: The oracle with the HPA headroom every other policy has: zero lag and instant moves, but as many replicas
#: as a real HPA at the same target would ask for. The plain oracle's headroom of 1.0 saves ~15 % of
#: replicas no HPA would drop, so "× oracle" overstates what the controller's mechanisms cost.
ORACLE_AT_HEADROOM = "oracle (HPA headroom)"


def oracle_at_headroom(model: ClusterModel) -> Policy:
    return replace(oracle(model), name=ORACLE_AT_HEADROOM)


class CostedSimulator(Simulator):
    """The engine, plus GPU-seconds per virtual node (same integration window as every other figure)."""

    def __init__(self, model: ClusterModel, workload: Workload, policy: Policy, seconds: float,
                 warmup_s: float = 0.0) -> None:
        super().__init__(model, workload, policy, seconds, warmup_s)
        self.vn_gpu_seconds = [0.0] * len(model.providers)
        if policy.name == ORACLE_AT_HEADROOM:
            self.hpa.headroom = workload.spec.hpa_headroom

    def _integrate(self, t0: float, t1: float) -> None:
        super()._integrate(t0, t1)
        if t1 <= self.warmup:
            return
        dt = t1 - max(t0, self.warmup)
        c = self.cluster
        for v, g in enumerate(c.vn_used):
            g += c.vn_warm_gpus[v]  # the warm pool's placeholders hold the provider's GPUs too
            if g:
                self.vn_gpu_seconds[v] += g * dt


def prices_from_config(cfg: ClusterConfig) -> dict[str, float | None]:
    """Provider name → its price per GPU-hour in the stack (None where the stack sets none)."""
    return {p.name: getattr(p, "price_per_gpu_hour", None) for p in cfg.providers}


def bill(policy: str, model: ClusterModel, gpu_seconds: Sequence[float],
         prices: Mapping[str, float | None]) -> Bill:
    hours = {p.name: s / 3600.0 for p, s in zip(model.providers, gpu_seconds, strict=True)}
    unpriced = tuple(n for n, h in hours.items() if h > 0 and prices.get(n) is None)
    cost = sum(h * (prices.get(n) or 0.0) for n, h in hours.items())
    return Bill(policy, hours, cost, unpriced)


def run_costed(model: ClusterModel, workload: Workload, policies: Sequence[Policy], seconds: float,
               warmup_s: float, prices: Mapping[str, float | None]) -> list[tuple[Outcome, Bill]]:
    """Every policy on the same workload, each with its bill."""
    out = []
    for policy in policies:
        sim = CostedSimulator(model, workload, policy, seconds, warmup_s)
        outcome = sim.run()
        out.append((outcome, bill(policy.name, model, sim.vn_gpu_seconds, prices)))
    return out


def bill_lines(results: Sequence[tuple[Outcome, Bill]]) -> list[str]:
    """A plain-text table: availability, external GPU·h by provider and cost, per policy."""
    if not results:
        return []
    providers = list(results[0][1].gpu_hours)
    oracle = next((b.cost for o, b in results if o.policy == "oracle"), None)
    head = f"{'policy':<30} {'availability':>12} " + " ".join(f"{p + ' GPU·h':>18}" for p in providers)
    lines = [head + f" {'cost USD':>12} {'× oracle':>8}"]
    for o, b in results:
        ratio = f"{b.cost / oracle:.2f}" if oracle else "–"
        lines.append(f"{o.policy:<30} {o.inference_availability:>12.3%} "
                     + " ".join(f"{b.gpu_hours[p]:>18,.0f}" for p in providers) + f" {b.cost:>12,.0f} {ratio:>8}")
    unpriced = sorted({n for _, b in results for n in b.unpriced})
    if unpriced:
        lines.append(f"no pricePerGpuHour in the stack for {unpriced}: their GPU·h are costed at 0")
    return lines
