"""``node-pools``: keep every node of every GPU pool labelled and tainted as the stack declares its pool, the
moment it joins, without one Pulumi object per node."""

from __future__ import annotations

from collections.abc import Sequence

from agents.kit.loop import AgentSpec
from agents.kit.loop import main as run_agent
from agents.node_pools.contract import METRICS_PORT, NodePoolSettings, parse_settings, settings_document
from agents.node_pools.shell import NodePools, connections

SPEC: AgentSpec[NodePoolSettings] = AgentSpec(
    prog="node-pools",
    description=__doc__ or "",
    metrics_port=METRICS_PORT,
    parse_settings=lambda data, source: parse_settings(dict(data), source=source),
    dump_settings=settings_document,
    build=lambda settings, port, identity: NodePools(settings, port, identity=identity),
    request_timeout=lambda s: s.request_timeout_seconds,
    connections=connections,
    # /livez fails once no pass has completed for four lease periods (at least two minutes): a wedged loop restarts.
    liveness_seconds=lambda s: max(120.0, 4.0 * s.retry_period_seconds),
)


def main(argv: Sequence[str] | None = None) -> int:
    return run_agent(SPEC, argv)


if __name__ == "__main__":
    raise SystemExit(main())
