"""``thermal-guard``: poll GPU temperatures and keep hot nodes out of service until a human releases them."""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import threading
from collections.abc import Sequence
from types import FrameType

from prometheus_client import start_http_server

from agents.thermal_guard.settings import SettingsError, ThermalSettings
from agents.thermal_guard.shell import Guard, GuardMetrics, KubeNodeApi, PrometheusTemperatures


def load_settings(path: str | None) -> ThermalSettings:
    """Settings from the JSON file the ConfigMap mounts; defaults when no file is given."""
    if path is None:
        return ThermalSettings()
    try:
        with open(path, encoding="utf-8") as handle:
            raw = json.load(handle)
    except (OSError, ValueError) as exc:
        raise SettingsError(f"{path}: cannot read settings: {exc}") from exc
    if not isinstance(raw, dict):
        raise SettingsError(f"{path}: settings must be a JSON object")
    return ThermalSettings.from_mapping(raw, source=path)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="thermal-guard", description=__doc__)
    parser.add_argument("--config", help="settings JSON (the thermal-guard ConfigMap)")
    parser.add_argument("--metrics-port", type=int, default=9316)
    parser.add_argument("--kubeconfig", help="kubeconfig file; default: the pod's in-cluster identity")
    parser.add_argument("--check-config", action="store_true", help="validate the settings and exit")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    try:
        settings = load_settings(args.config)
    except SettingsError as exc:
        print(f"thermal-guard: {exc}", file=sys.stderr)
        return 2
    if args.check_config:
        print(json.dumps(settings.__dict__, sort_keys=True))
        return 0

    metrics = GuardMetrics()
    start_http_server(args.metrics_port, registry=metrics.registry)
    guard = Guard(settings, PrometheusTemperatures(settings), KubeNodeApi(args.kubeconfig), metrics)
    stop = threading.Event()

    def _stop(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    while not stop.is_set():
        guard.cycle()
        stop.wait(settings.poll_seconds)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
