"""The GPU health dashboard: what the health guard took out of service, and what crashes cost.

Crashes grow with the cluster; this page counts them where the platform sees them: nodes quarantined per
class and pool, gang restarts per pool and per job (after an eviction from a quarantined node, or an
application crash), the time between failures per pool, and the guard's own brakes (suppressed quarantines,
the breaker). Metric names are the guard's (:mod:`agents.health_guard.shell`). It shares the fleet
dashboard's pool, node and job variables (:mod:`components.dashboards.grafana`), so the links between the
two keep the selection.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from components.dashboards.grafana import (
    DATASOURCE,
    FLEET_UID,
    HEALTH_UID,
    SCHEMA_VERSION,
    Scope,
    dashboard_link,
    data_link,
    panel,
    target,
)

UID = HEALTH_UID


@dataclass(frozen=True)
class HealthDashboardOptions:
    health_taint_key: str = "gpucluster.io/gpu-health"
    repaired_key: str = "gpucluster.io/gpu-repaired"
    scope: Scope = field(default_factory=Scope)


def build(options: HealthDashboardOptions | None = None) -> dict[str, Any]:
    o = options or HealthDashboardOptions()
    red_at_one: list[dict[str, Any]] = [{"color": "green", "value": None}, {"color": "red", "value": 1}]
    pool = '{pool=~"$pool"}'
    # A restart names its gang (job), the pool and the node that caused it (none for an application crash:
    # "All" nodes is ".*", which keeps those).
    restarts = 'gpucluster_health_gang_restarts_total{pool=~"$pool", node=~"$node", job=~"$job"}'
    pool_fleet = [data_link("GPU fleet of pool ${__field.labels.pool}", FLEET_UID, pool="pool")]
    panels = [
        panel(1, "Quarantined nodes by class and pool",
              f"Nodes carrying {o.health_taint_key}. Degraded ones come back after probation; fatal ones need "
              f"{o.repaired_key} as well.",
              [target(f"sum by (class, pool) (gpucluster_health_nodes_quarantined{pool})", "{{class}} {{pool}}",
                      "A")],
              (0, 0, 12, 8), "short", links=pool_fleet),
        panel(2, "Quarantined share of each pool",
              "The guard stops at its per-pool limit; a rising share means a fleet-wide cause (a row, a rack, "
              "a firmware), not single bad GPUs.",
              [target(f"max by (pool) (gpucluster_health_pool_quarantined_ratio{pool})", "{{pool}}", "A")],
              (12, 0, 12, 8), "percentunit", links=pool_fleet),
        panel(3, "Gang restarts per pool (per hour)",
              "Gangs restarted from their checkpoint: because a node under them was quarantined, or after an "
              "application crash (no node).",
              [target(f"sum by (pool) (increase({restarts}[1h]))", "{{pool}}", "A")],
              (0, 8, 12, 8), "short", links=pool_fleet),
        panel(4, "Gang restarts per job (last 24 h)",
              "The 10 jobs restarted most often; the same node again and again raises GangRestartLoopOnNode.",
              [target(f"topk(10, sum by (namespace, job) (increase({restarts}[24h])))", "{{namespace}}/{{job}}",
                      "A")],
              (12, 8, 12, 8), "short",
              links=[data_link("GPU fleet of job ${__field.labels.job}", FLEET_UID, job="job")]),
        panel(5, "Mean time between failures per pool",
              "Seconds between consecutive quarantines in a pool, averaged over a day: the number that shrinks "
              "as the fleet grows and sets the checkpoint interval.",
              [target(f"sum by (pool) (rate(gpucluster_health_seconds_between_failures_sum{pool}[24h])) / "
                      f"sum by (pool) (rate(gpucluster_health_seconds_between_failures_count{pool}[24h]))",
                      "{{pool}}", "A")],
              (0, 16, 12, 8), "s", links=pool_fleet),
        panel(6, "Signals firing",
              "Nodes on which each health signal fires now (held or not), fleet-wide.",
              [target("sum by (signal) (gpucluster_health_signal_firing)", "{{signal}}", "A")],
              (12, 16, 12, 8), "short"),
        panel(7, "Guard breaker",
              "1: the guard refused a quarantine at its rate limit and stopped acting until a person resets it.",
              [target("max(gpucluster_health_breaker_tripped) or vector(0)", "breaker", "A")],
              (0, 24, 6, 6), "short", red_at_one, kind="stat"),
        panel(8, "Quarantines refused (24 h)",
              "Quarantines in the selected pools the rate limit or the breaker refused.",
              [target(f"sum(increase(gpucluster_health_suppressed_total{pool}[24h])) or vector(0)", "refused",
                      "A")],
              (6, 24, 6, 6), "short", red_at_one, kind="stat"),
        panel(9, "Evictions by workload and result",
              "blocked: a PodDisruptionBudget said not yet (retried every cycle). Fleet-wide.",
              [target("sum by (workload, result) (increase(gpucluster_health_evictions_total[1h]))",
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
        "templating": {"list": o.scope.variables()},
        "links": [dashboard_link(FLEET_UID, "GPU fleet")],
        "panels": panels,
        "annotations": {"list": [{"datasource": DATASOURCE, "enable": True, "name": "quarantines",
                                  "expr": f"changes(gpucluster_health_taints_applied_total{pool}[1m]) > 0"}]},
    }


def render(options: HealthDashboardOptions | None = None) -> str:
    """Dashboard JSON text, stable across runs."""
    return json.dumps(build(options), indent=2, sort_keys=True)
