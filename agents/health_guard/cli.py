"""``health-guard``: keep GPU/InfiniBand-faulty nodes out of training (and fatal ones out of inference) until
they are healthy again, within guard rails that leave a fleet-wide problem to a person."""

from __future__ import annotations

from collections.abc import Sequence

from agents.health_guard.contract import METRICS_PORT, HealthSettings, parse_settings
from agents.health_guard.prometheus import PrometheusMetrics
from agents.health_guard.shell import Guard, connections
from agents.kit.loop import AgentSpec
from agents.kit.loop import main as run_agent

SPEC: AgentSpec[HealthSettings] = AgentSpec(
    prog="health-guard",
    description=__doc__ or "",
    metrics_port=METRICS_PORT,
    parse_settings=lambda data, source: parse_settings(dict(data), source=source),
    dump_settings=lambda s: s.model_dump_json(indent=2),
    build=lambda settings, port, identity: Guard(
        settings, PrometheusMetrics(settings.prometheus_url, connections=settings.query_concurrency), port,
        identity=identity),
    request_timeout=lambda s: s.request_timeout_seconds,
    connections=connections,
    # /livez fails once no cycle has completed for four polls (at least two minutes): a wedged loop restarts.
    liveness_seconds=lambda s: max(120.0, 4.0 * s.poll_seconds),
    config_required=False,
)


def main(argv: Sequence[str] | None = None) -> int:
    return run_agent(SPEC, argv)


if __name__ == "__main__":
    raise SystemExit(main())
