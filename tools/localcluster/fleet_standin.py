"""One scrape target that stands in for the DCGM and InfiniBand exporters of a whole fleet (the scale shapes).

At 2,048 nodes there are no 2,048 exporter pods to scrape here, yet the health guard's real queries must run
against real series counts in a real Prometheus. This serves, for every node of the plan, the series the guard's
signals read (agents/health_guard/contract.py), with the labels the real scrape path leaves: dcgm-exporter's
``Hostname``, ``gpu``, ``UUID``… per GPU, and the InfiniBand exporter's ``node``, ``device``, ``port`` per port.
Only the guard's fields are served (not the whole counters CSV), which keeps a 2,048-node scrape near 130,000
series.

Faults are injected over HTTP, ``POST /faults`` with ``{"<node>": {"xid": 79}}`` (or any served field, e.g.
``{"DCGM_FI_DEV_GPU_TEMP": 91}``; ``{}`` clears the node), and the time each fault was first served is kept, so the
storm measures from the moment the fault was visible to a scrape, as a real exporter would make it.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from tools.localcluster.dcgm_standin import DCGM_VALUES, MODEL

#: The DCGM fields the guard's signals read (the XID counter is served only for a faulted node).
GUARD_FIELDS = (
    "DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_XID_ERRORS", "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "DCGM_FI_DEV_ROW_REMAP_FAILURE",
    "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL", "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL",
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
)
XID_FIELD = "DCGM_EXP_XID_ERRORS_COUNT"
#: InfiniBand: port state 4 is ACTIVE; the guard counts ports in any other state.
IB_STATE_ACTIVE = 4
IB_PORTS = 8


def _gauge(field: str) -> str:
    return "counter" if field.endswith("_TOTAL") else "gauge"


def fleet_exposition(nodes: Sequence[str], gpus: int, faults: Mapping[str, Mapping[str, float]]) -> str:
    """The text exposition of every node's guard series; ``faults`` (node -> field -> value, ``xid`` for an XID)
    replace the plausible readings of every GPU of that node (a node's fault is on all its GPUs: simple and the
    worst case for the guard's per-node aggregation). ``ib_state`` in a node's faults sets its ports' state."""
    lines: list[str] = []
    for field in GUARD_FIELDS:
        lines += [f"# HELP {field} stand-in", f"# TYPE {field} {_gauge(field)}"]
        for node in nodes:
            readings = faults.get(node, {})
            # dcgm-exporter's XID field is the GPU's last XID (what the guard's XID signals compare).
            value = readings.get("xid", DCGM_VALUES[field]) if field == "DCGM_FI_DEV_XID_ERRORS" else \
                readings.get(field, DCGM_VALUES[field])
            for gpu in range(gpus):
                lines.append(f'{field}{{gpu="{gpu}",UUID="GPU-{node}-{gpu:04d}",modelName="{MODEL}",'
                             f'Hostname="{node}"}} {value}')
    lines += [f"# HELP {XID_FIELD} stand-in", f"# TYPE {XID_FIELD} gauge"]
    for node in nodes:
        xid = faults.get(node, {}).get("xid")
        if xid is not None:
            lines += [f'{XID_FIELD}{{gpu="{gpu}",UUID="GPU-{node}-{gpu:04d}",modelName="{MODEL}",Hostname="{node}",'
                      f'xid="{int(xid)}"}} 1' for gpu in range(gpus)]
    lines += ["# HELP infiniband_state_id stand-in", "# TYPE infiniband_state_id gauge"]
    for node in nodes:
        state = faults.get(node, {}).get("ib_state", IB_STATE_ACTIVE)
        lines += [f'infiniband_state_id{{node="{node}",device="mlx5_{port}",port="1"}} {int(state)}'
                  for port in range(IB_PORTS)]
    # Which ports are InfiniBand (the guard's port signals read only those: an Ethernet port's state is not a rail).
    lines += ["# HELP infiniband_port_info stand-in", "# TYPE infiniband_port_info gauge"]
    for node in nodes:
        lines += [f'infiniband_port_info{{node="{node}",device="mlx5_{port}",port="1",link_layer="InfiniBand"}} 1'
                  for port in range(IB_PORTS)]
    return "\n".join(lines) + "\n"


def parse_faults(body: bytes, known: Sequence[str]) -> dict[str, dict[str, float]]:
    """``{"<node>": {"<field>": number}}`` for nodes of the fleet; anything else is an error naming it."""
    try:
        raw = json.loads(body or b"null")
    except ValueError as exc:
        raise ValueError(f"faults: not JSON ({exc})") from None
    if not isinstance(raw, dict):
        raise ValueError(f"faults: expected an object of node -> readings, got {type(raw).__name__}")
    fields = {*GUARD_FIELDS, "xid", "ib_state"}
    nodes = set(known)
    out: dict[str, dict[str, float]] = {}
    for node, readings in raw.items():
        if node not in nodes:
            raise ValueError(f"faults: {node!r} is not a node of this fleet")
        if not isinstance(readings, dict):
            raise ValueError(f"faults: {node}: expected field -> number, got {type(readings).__name__}")
        for field, value in readings.items():
            if field not in fields:
                raise ValueError(f"faults: {node}: {field!r} is not served (one of: {', '.join(sorted(fields))})")
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ValueError(f"faults: {node}.{field}: expected a number, got {value!r}")
        out[node] = {str(k): float(v) for k, v in readings.items()}
    return out


class Fleet:
    """The served state: faults per node, the exposition (rebuilt only when faults change) and when each node's
    current fault was first served to a scrape."""

    def __init__(self, nodes: Sequence[str], gpus: int = 8) -> None:
        self.nodes, self.gpus = tuple(nodes), gpus
        self._lock = threading.Lock()
        self._faults: dict[str, dict[str, float]] = {}
        self._text = fleet_exposition(self.nodes, gpus, {})
        self._pending: set[str] = set()
        self.first_served: dict[str, float] = {}

    def set_faults(self, faults: Mapping[str, Mapping[str, float]]) -> None:
        with self._lock:
            for node, readings in faults.items():
                if readings:
                    self._faults[node] = dict(readings)
                    self._pending.add(node)
                else:
                    self._faults.pop(node, None)
                    self.first_served.pop(node, None)
            self._text = fleet_exposition(self.nodes, self.gpus, self._faults)

    def scrape(self, now: float) -> str:
        with self._lock:
            for node in self._pending:
                self.first_served.setdefault(node, now)
            self._pending.clear()
            return self._text


def serve(fleet: Fleet, host: str, port: int) -> ThreadingHTTPServer:
    """``GET /metrics`` (the exposition), ``POST /faults`` (set), ``GET /served`` (epoch time each fault was first
    scraped). Loopback only."""

    class Handler(BaseHTTPRequestHandler):
        def _send(self, code: int, body: bytes, kind: str = "application/json") -> None:
            self.send_response(code)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:
            if self.path == "/metrics":
                self._send(200, fleet.scrape(time.time()).encode(), "text/plain; version=0.0.4; charset=utf-8")
            elif self.path == "/served":
                self._send(200, json.dumps(fleet.first_served).encode())
            else:
                self._send(404, b"{}")

        def do_POST(self) -> None:
            if self.path != "/faults":
                self._send(404, b"{}")
                return
            try:
                length = int(self.headers.get("Content-Length") or 0)
                fleet.set_faults(parse_faults(self.rfile.read(length), fleet.nodes))
            except ValueError as exc:
                self._send(400, json.dumps({"error": str(exc)}).encode())
                return
            self._send(200, b"{}")

        def log_message(self, *args: Any) -> None:
            return

    server = ThreadingHTTPServer((host, port), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def main(argv: Sequence[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="fleet-standin", description=__doc__)
    parser.add_argument("--nodes-file", required=True, help="one node name a line")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--gpus", type=int, default=8)
    args = parser.parse_args(argv)
    with open(args.nodes_file, encoding="utf-8") as f:
        nodes = [line.strip() for line in f if line.strip()]
    server = serve(Fleet(nodes, args.gpus), "127.0.0.1", args.port)
    print(f"fleet-standin: {len(nodes)} nodes x {args.gpus} GPUs on 127.0.0.1:{args.port}", flush=True)
    try:
        threading.Event().wait()
    finally:
        server.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
