"""The GPU health dashboard: what the health guard took out of service, and what crashes cost.

Crashes grow with the cluster; this page counts them where the platform sees them: nodes quarantined per
class and pool, gang restarts per pool and per job (each caused by an eviction from a quarantined node),
the time between failures per pool, and the guard's own brakes (suppressed quarantines, the breaker).
Metric names are the guard's (:mod:`agents.health_guard.shell`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from components.dashboards.gpu_fleet import DATASOURCE, SCHEMA_VERSION, _panel, _target

UID = "gpucluster-gpu-health"


@dataclass(frozen=True)
class HealthDashboardOptions:
    health_taint_key: str = "gpucluster.io/gpu-health"
    repaired_key: str = "gpucluster.io/gpu-repaired"


def build(options: HealthDashboardOptions | None = None) -> dict[str, Any]:
    o = options or HealthDashboardOptions()
    red_at_one: list[dict[str, Any]] = [{"color": "green", "value": None}, {"color": "red", "value": 1}]
    panels = [
        _panel(1, "Quarantined nodes by class and pool",
               f"Nodes carrying {o.health_taint_key}. Degraded ones come back after probation; fatal ones need "
               f"{o.repaired_key} as well.",
               [_target("sum by (class, pool) (gpucluster_health_nodes_quarantined)", "{{class}} {{pool}}", "A")],
               (0, 0, 12, 8), "short"),
        _panel(2, "Quarantined share of each pool",
               "The guard stops at its per-pool limit; a rising share means a fleet-wide cause (a row, a rack, "
               "a firmware), not single bad GPUs.",
               [_target("max by (pool) (gpucluster_health_pool_quarantined_ratio)", "{{pool}}", "A")],
               (12, 0, 12, 8), "percentunit"),
        _panel(3, "Gang restarts per pool (per hour)",
               "Gangs restarted from their checkpoint because a node under them was quarantined.",
               [_target("sum by (pool) (increase(gpucluster_health_gang_restarts_total[1h]))", "{{pool}}", "A")],
               (0, 8, 12, 8), "short"),
        _panel(4, "Gang restarts per job (last 24 h)",
               "Jobs restarted most often; the same node again and again raises GangRestartLoopOnNode.",
               [_target("topk(10, sum by (namespace, job) (increase(gpucluster_health_gang_restarts_total[24h])))",
                        "{{namespace}}/{{job}}", "A")],
               (12, 8, 12, 8), "short"),
        _panel(5, "Mean time between failures per pool",
               "Seconds between consecutive quarantines in a pool, averaged over a day: the number that shrinks "
               "as the fleet grows and sets the checkpoint interval.",
               [_target("sum by (pool) (rate(gpucluster_health_seconds_between_failures_sum[24h])) / "
                        "sum by (pool) (rate(gpucluster_health_seconds_between_failures_count[24h]))",
                        "{{pool}}", "A")],
               (0, 16, 12, 8), "s"),
        _panel(6, "Signals firing",
               "Nodes on which each health signal fires now (held or not).",
               [_target("sum by (signal) (gpucluster_health_signal_firing)", "{{signal}}", "A")],
               (12, 16, 12, 8), "short"),
        _panel(7, "Guard breaker",
               "1: the guard refused a quarantine at its rate limit and stopped acting until a person resets it.",
               [_target("max(gpucluster_health_breaker_tripped) or vector(0)", "breaker", "A")],
               (0, 24, 6, 6), "short", red_at_one, kind="stat"),
        _panel(8, "Quarantines refused (24 h)",
               "Quarantines the rate limit or the breaker refused.",
               [_target("sum(increase(gpucluster_health_suppressed_total[24h])) or vector(0)", "refused", "A")],
               (6, 24, 6, 6), "short", red_at_one, kind="stat"),
        _panel(9, "Evictions by workload and result",
               "blocked: a PodDisruptionBudget said not yet (retried every cycle).",
               [_target("sum by (workload, result) (increase(gpucluster_health_evictions_total[1h]))",
                        "{{workload}} {{result}}", "A")],
               (12, 24, 12, 6), "short"),
    ]
    return {
        "uid": UID,
        "title": "GPU health: quarantines, gang restarts, time between failures",
        "tags": ["gpucluster", "gpu", "health"],
        "timezone": "utc",
        "schemaVersion": SCHEMA_VERSION,
        "refresh": "30s",
        "time": {"from": "now-24h", "to": "now"},
        "templating": {"list": [{"name": "datasource", "type": "datasource", "query": "prometheus",
                                 "label": "Prometheus", "current": {}}]},
        "panels": panels,
        "annotations": {"list": [{"datasource": DATASOURCE, "enable": True, "name": "quarantines",
                                  "expr": "changes(gpucluster_health_taints_applied_total[1m]) > 0"}]},
    }


def render(options: HealthDashboardOptions | None = None) -> str:
    """Dashboard JSON text, stable across runs."""
    return json.dumps(build(options), indent=2, sort_keys=True)
