"""``burst-controller --config FILE [--kubeconfig FILE] [--metrics-port N]``: the process entry point."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence

from agents.burst_controller.contract import BurstSettings
from agents.burst_controller.shell import BurstShell
from agents.kit.loop import AgentSpec
from agents.kit.loop import main as run_agent

SPEC: AgentSpec[BurstSettings] = AgentSpec(
    prog="burst-controller",
    description="Owns the burst taint on virtual-kubelet nodes.",
    metrics_port=9102,
    parse_settings=lambda data, source: BurstSettings.from_mapping(dict(data), source=source),
    dump_settings=lambda s: json.dumps(dataclasses.asdict(s), indent=2, default=str),
    build=lambda settings, port, identity: BurstShell(settings, port, identity=identity),
    request_timeout=lambda s: s.request_timeout_seconds,
    # /livez fails once no reconcile has started for six ticks (at least a minute): a wedged loop restarts.
    liveness_seconds=lambda s: max(60.0, 6 * s.tick_seconds),
)


def main(argv: Sequence[str] | None = None) -> int:
    return run_agent(SPEC, argv)


if __name__ == "__main__":
    raise SystemExit(main())
