"""`burst-controller --config FILE [--kubeconfig FILE] [--metrics-port N]`: the process entry point."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import sys
import threading
from types import FrameType

from kubernetes import client, config

from agents import liveness
from agents.burst_controller.settings import SettingsError, load_file
from agents.burst_controller.shell import BurstShell, KubeApi, Metrics


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="burst-controller", description="Owns the burst taint on virtual-kubelet nodes."
    )
    p.add_argument("--config", required=True, help="YAML/JSON settings file (the mounted ConfigMap key)")
    p.add_argument("--kubeconfig", help="kubeconfig file; default: in-cluster service account")
    p.add_argument("--metrics-port", type=int, default=9102, help="Prometheus metrics port (default 9102)")
    p.add_argument(
        "--identity",
        default=os.environ.get("POD_NAME") or socket.gethostname(),
        help="lease holder identity (default: $POD_NAME or the host name)",
    )
    p.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    return p


def _api_client(kubeconfig: str | None) -> client.ApiClient:
    cfg = client.Configuration()
    if kubeconfig:
        config.load_kube_config(config_file=kubeconfig, client_configuration=cfg)  # type: ignore[no-untyped-call]
    else:
        config.load_incluster_config(client_configuration=cfg)  # type: ignore[no-untyped-call]
    cfg.retries = False  # the shell's own backoff is the single retry policy
    return client.ApiClient(cfg)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    try:
        settings = load_file(args.config)
    except SettingsError as exc:
        print(f"burst-controller: {exc}", file=sys.stderr)
        return 2
    try:
        api = _api_client(args.kubeconfig)
    except (config.ConfigException, OSError) as exc:
        print(f"burst-controller: cannot load Kubernetes credentials: {exc}", file=sys.stderr)
        return 2
    metrics = Metrics()
    shell = BurstShell(settings, KubeApi(api, settings), identity=args.identity, metrics=metrics)
    # /livez fails once no reconcile has started for six ticks (at least a minute): a wedged loop restarts.
    heartbeat = liveness.Heartbeat(max(60.0, 6 * settings.tick_seconds), source=lambda: shell.last_reconcile)
    liveness.start_http_server(args.metrics_port, metrics.registry, heartbeat)
    stop = threading.Event()

    def _stop(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    shell.run(stop)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
