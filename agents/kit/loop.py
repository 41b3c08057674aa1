"""One process entry for every agent: flags, settings, the port, SIGTERM, ``/livez``, ``/readyz``, metrics.

An agent supplies an :class:`AgentSpec` (how to parse its settings and build itself); :func:`main` does the
rest the same way for all of them: ``--config`` (YAML or JSON, the mounted ConfigMap key), ``--kubeconfig``
(default: the pod's service account), ``--identity`` (the Lease holder; default ``$POD_NAME``),
``--metrics-port``, ``--log-level`` and ``--check-config``. SIGTERM and SIGINT set the stop event; the agent's
``run`` returns after releasing its Lease, so the standby takes over at once.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any, Generic, Protocol, TypeVar

import yaml
from prometheus_client import CollectorRegistry

from agents import liveness
from agents.kit.port import DEFAULT_CONNECTIONS, HttpPort, KubePort

S = TypeVar("S")


class Agent(Protocol):
    """What the loop runs: ``run`` until the event is set; the monotonic time of its last pass."""

    registry: CollectorRegistry

    def run(self, stop: threading.Event) -> None: ...

    def last_pass(self) -> float | None: ...


@dataclass(frozen=True)
class AgentSpec(Generic[S]):
    prog: str
    description: str
    metrics_port: int
    #: Settings from the file's mapping; raises ValueError naming the file (``source``) and the key.
    parse_settings: Callable[[Mapping[str, Any], str], S]
    #: The settings as JSON, for ``--check-config``.
    dump_settings: Callable[[S], str]
    #: The agent on its settings, port and identity.
    build: Callable[[S, KubePort, str], Agent]
    #: Every API call's timeout.
    request_timeout: Callable[[S], float]
    #: ``/livez`` fails once the loop has not passed for this long.
    liveness_seconds: Callable[[S], float]
    #: Whether ``--config`` must be given (else the settings' defaults).
    config_required: bool = True
    #: The most API calls the agent has in flight at once (its watches, its Lease renewal, its loop and its
    #: side-by-side writes): the size of its connection pool.
    connections: Callable[[S], int] = lambda s: DEFAULT_CONNECTIONS


def load_settings(path: str | Path | None, parse: Callable[[Mapping[str, Any], str], S]) -> S:
    """YAML or JSON (YAML is a superset, so one parser serves both); an empty file or no file: the defaults."""
    if path is None:
        return parse({}, "defaults")
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise ValueError(f"{p}: cannot read settings: {exc.strerror}") from None
    try:
        data = yaml.safe_load(text) if text.strip() else {}
    except yaml.YAMLError as exc:
        raise ValueError(f"{p}: not valid YAML/JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{p}: top level must be a mapping of settings keys")
    return parse(data, str(p))


def parser(spec: AgentSpec[Any]) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=spec.prog, description=spec.description)
    p.add_argument("--config", required=spec.config_required, help="YAML/JSON settings (the mounted ConfigMap key)")
    p.add_argument("--kubeconfig", help="kubeconfig file; default: the pod's in-cluster service account")
    p.add_argument("--metrics-port", type=int, default=spec.metrics_port,
                   help=f"port of /metrics, /livez and /readyz (default {spec.metrics_port})")
    p.add_argument("--identity", default=os.environ.get("POD_NAME") or socket.gethostname(),
                   help="Lease holder identity (default: $POD_NAME, else the host name)")
    p.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    p.add_argument("--check-config", action="store_true", help="validate the settings, print them and exit")
    return p


def main(spec: AgentSpec[S], argv: Sequence[str] | None = None) -> int:
    args = parser(spec).parse_args(argv)
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    try:
        settings = load_settings(args.config, spec.parse_settings)
    except ValueError as exc:
        print(f"{spec.prog}: {exc}", file=sys.stderr)
        return 2
    if args.check_config:
        print(spec.dump_settings(settings))
        return 0
    try:
        port = HttpPort.connect(args.kubeconfig, spec.request_timeout(settings),
                                user_agent=f"{spec.prog}/{args.identity}", connections=spec.connections(settings))
    except Exception as exc:  # the kubernetes config loader raises its own exception types
        print(f"{spec.prog}: cannot load Kubernetes credentials: {exc}", file=sys.stderr)
        return 2
    agent = spec.build(settings, port, args.identity)
    heartbeat = liveness.Heartbeat(spec.liveness_seconds(settings), source=agent.last_pass)
    liveness.start_http_server(args.metrics_port, agent.registry, heartbeat)
    stop = threading.Event()

    def _stop(signum: int, frame: FrameType | None) -> None:
        logging.getLogger(spec.prog).info("signal %d: stopping", signum)
        stop.set()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    agent.run(stop)
    return 0


def lease_loop(step: Callable[[], bool], report: Callable[[bool], None], period_seconds: float,
               stop: threading.Event) -> None:
    """Renew every ``period_seconds`` until stopped (a thread's target). Nothing ends it but ``stop``: an
    unexpected error counts as not leading for that round, so the renewer cannot die while the agent runs."""
    log = logging.getLogger("kit.lease")
    while not stop.is_set():
        try:
            leading = step()
        except Exception:
            log.exception("lease step failed")
            leading = False
        report(leading)
        stop.wait(period_seconds)
