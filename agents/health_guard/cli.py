"""``health-guard``: keep GPU/InfiniBand-faulty nodes out of training (and fatal ones out of inference) until
they are healthy again, within guard rails that leave a fleet-wide problem to a person."""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import socket
import sys
import threading
from collections.abc import Sequence
from types import FrameType

from agents import liveness
from agents.health_guard.contract import HealthSettings, SettingsError, parse_settings
from agents.health_guard.shell import Guard, GuardMetrics, KubePort, PrometheusMetrics


def load_settings(path: str | None) -> HealthSettings:
    """Settings from the JSON file the ConfigMap mounts; defaults when no file is given."""
    if path is None:
        return HealthSettings()
    try:
        with open(path, encoding="utf-8") as handle:
            raw = json.load(handle)
    except (OSError, ValueError) as exc:
        raise SettingsError(f"{path}: cannot read settings: {exc}") from exc
    return parse_settings(raw, source=path)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="health-guard", description=__doc__)
    parser.add_argument("--config", help="settings JSON (the health-guard ConfigMap)")
    parser.add_argument("--metrics-port", type=int, default=9316)
    parser.add_argument("--kubeconfig", help="kubeconfig file; default: the pod's in-cluster identity")
    parser.add_argument("--identity", default=os.environ.get("POD_NAME") or socket.gethostname(),
                        help="holder identity in the Lease (default: POD_NAME, else the host name)")
    parser.add_argument("--check-config", action="store_true", help="validate the settings and exit")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    try:
        settings = load_settings(args.config)
    except SettingsError as exc:
        print(f"health-guard: {exc}", file=sys.stderr)
        return 2
    if args.check_config:
        print(settings.model_dump_json(indent=2))
        return 0

    metrics = GuardMetrics()
    # /livez fails once no cycle has completed for four polls (at least two minutes): a wedged loop restarts.
    heartbeat = liveness.Heartbeat(max(120.0, 4.0 * settings.poll_seconds))
    liveness.start_http_server(args.metrics_port, metrics.registry, heartbeat)
    guard = Guard(settings, PrometheusMetrics(settings.prometheus_url), KubePort(args.kubeconfig),
                  identity=args.identity, metrics=metrics)
    stop = threading.Event()

    def _stop(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    while not stop.is_set():
        guard.cycle()
        heartbeat.beat()
        stop.wait(settings.poll_seconds)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
