"""``ib-exporter``: serve InfiniBand/RoCE port metrics from sysfs, or print one scrape with ``--once``."""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from collections.abc import Sequence
from types import FrameType

from agents.ib_exporter.collector import InfiniBandCollector
from agents.ib_exporter.contract import DEFAULT_SYSFS_ROOT, IbExporterSettings
from agents.ib_exporter.exposition import render, serve

DEFAULT_LISTEN = IbExporterSettings().listen_address


def parse_listen_address(value: str) -> tuple[str, int]:
    """Split ``HOST:PORT`` (``[v6]:PORT`` for IPv6) into host and port, failing with a usable message."""
    host, sep, port_text = value.rpartition(":")
    if not sep or not port_text.isdigit():
        raise argparse.ArgumentTypeError(f"--listen-address must be HOST:PORT, got {value!r}")
    port = int(port_text)
    if not 0 < port < 65536:
        raise argparse.ArgumentTypeError(f"--listen-address port must be 1-65535, got {port}")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host or "0.0.0.0", port


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ib-exporter",
        description="Export InfiniBand/RoCE port counters, hw_counters, state and rate from sysfs.",
    )
    parser.add_argument(
        "--sysfs-root", default=DEFAULT_SYSFS_ROOT,
        help=f"sysfs mount to read (default {DEFAULT_SYSFS_ROOT}; a host mount in a pod)"
    )
    parser.add_argument(
        "--listen-address",
        default=DEFAULT_LISTEN,
        type=parse_listen_address,
        help=f"HOST:PORT to serve /metrics on (default {DEFAULT_LISTEN})",
    )
    parser.add_argument("--once", action="store_true", help="print one scrape in the Prometheus text format and exit")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    # Only our collector is served: the default registry's process/platform collectors would describe
    # this small container while sitting next to series that describe the node.
    collector = InfiniBandCollector(args.sysfs_root)
    if args.once:
        sys.stdout.write(render(collector.collect()).decode("utf-8"))
        sys.stdout.flush()
        return 0
    host, port = args.listen_address
    server, thread = serve(collector, host, port)
    stop = threading.Event()

    def _stop(signum: int, frame: FrameType | None) -> None:
        stop.set()

    # Kubernetes stops pods with SIGTERM; answering it promptly keeps DaemonSet rollouts short.
    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    print(f"ib-exporter: serving {args.sysfs_root}/class/infiniband on {host}:{port}", file=sys.stderr)
    stop.wait()
    server.shutdown()
    thread.join(timeout=5)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
