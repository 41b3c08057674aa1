"""``burst-controller --config FILE [--kubeconfig FILE] [--metrics-port N]``: the process entry point."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from agents.burst_controller.contract import BurstSettings, SettingsError
from agents.burst_controller.shell import BurstShell, connections
from agents.kit.loop import AgentSpec, load_settings
from agents.kit.loop import main as run_agent

SPEC: AgentSpec[BurstSettings] = AgentSpec(
    prog="burst-controller",
    description="Owns the burst taint on virtual-kubelet nodes.",
    metrics_port=9102,
    parse_settings=BurstSettings.parse,
    dump_settings=lambda s: s.model_dump_json(indent=2),
    build=lambda settings, port, identity: BurstShell(settings, port, identity=identity),
    request_timeout=lambda s: s.request_timeout_seconds,
    connections=connections,
    # /livez fails once no reconcile has started for six ticks (at least a minute): a wedged loop restarts.
    liveness_seconds=lambda s: max(60.0, 6 * s.tick_seconds),
)


def load_file(path: str | Path) -> BurstSettings:
    """The settings file (YAML or JSON, the kit's one loader); an empty file means the defaults."""
    try:
        return load_settings(path, BurstSettings.parse)
    except SettingsError:
        raise
    except ValueError as exc:
        raise SettingsError(str(exc)) from None


def main(argv: Sequence[str] | None = None) -> int:
    return run_agent(SPEC, argv)


if __name__ == "__main__":
    raise SystemExit(main())
