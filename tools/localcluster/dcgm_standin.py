"""A stand-in for dcgm-exporter on the local cluster's real GPU nodes, and for the tests that scrape one.

The real GPU nodes have fake GPUs (the device plugin's), and no DCGM to read, yet the stack's dcgm-exporter
DaemonSet lands on them like on every GPU node, and ``pulumi up`` waits for it to be Ready. This is the image it
runs there (``make images`` builds it under the exact reference the stack names, ``components.images.DCGM_EXPORTER``):
it serves ``/health`` and, on ``/metrics``, every field of the counters CSV the stack mounts
(``DCGM_EXPORTER_COLLECTORS``) for each GPU of the node (``NODE_NAME``), with dcgm-exporter 4.2's labels and a
plausible reading. A fault is injected by writing readings into :data:`FAULTS` inside the container (its ``/tmp``
is the pod's own emptyDir): ``{"<gpu index>": {"DCGM_FI_DEV_GPU_TEMP": 91}}``, read at every scrape.

Standard library only, plus ``components.dcgm_counters`` (which is too): the image carries these two files alone.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from components import dcgm_counters

DRIVER = "550.127.05"
MODEL = "NVIDIA H100 80GB HBM3"
#: Readings to serve instead of the plausible ones, per GPU index (written by a test with ``kubectl exec``).
FAULTS = Path("/tmp/dcgm-standin-faults.json")


@dataclass(frozen=True)
class Gpu:
    index: int
    #: ``(namespace, pod, container)`` of the workload holding it; ``None``: no pod holds it.
    owner: tuple[str, str, str] | None = None


def dcgm_labels(node: str, gpu: Gpu) -> dict[str, str]:
    """dcgm-exporter 4.2's labels for one GPU; the workload's only when a pod holds the GPU."""
    labels = {"gpu": str(gpu.index), "UUID": f"GPU-{node}-{gpu.index:04d}",
              "pci_bus_id": f"00000000:{0x18 + gpu.index:02X}:00.0", "device": f"nvidia{gpu.index}",
              "modelName": MODEL, "Hostname": node, "DCGM_FI_DRIVER_VERSION": DRIVER}
    if gpu.owner is not None:
        labels.update(zip(("namespace", "pod", "container"), gpu.owner, strict=True))
    return labels


#: A plausible reading per field, in DCGM's units (NVLink TX/RX are bytes per second, not running totals).
DCGM_VALUES = {
    "DCGM_FI_DEV_GPU_TEMP": 45.0, "DCGM_FI_DEV_MEMORY_TEMP": 50.0, "DCGM_FI_DEV_POWER_USAGE": 420.5,
    "DCGM_FI_DEV_THERMAL_VIOLATION": 0.0, "DCGM_FI_DEV_CLOCKS_EVENT_REASONS": 0.0, "DCGM_FI_DEV_SM_CLOCK": 1980.0,
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": 0.62, "DCGM_FI_PROF_SM_ACTIVE": 0.9, "DCGM_FI_PROF_SM_OCCUPANCY": 0.5,
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": 0.95, "DCGM_FI_PROF_DRAM_ACTIVE": 0.4, "DCGM_FI_DEV_GPU_UTIL": 100.0,
    "DCGM_FI_DEV_FB_USED": 61000.0, "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL": 9.1e12,
    "DCGM_FI_PROF_NVLINK_TX_BYTES": 3.2e10, "DCGM_FI_PROF_NVLINK_RX_BYTES": 3.1e10,
    "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL": 0.0, "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL": 0.0,
    "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL": 0.0, "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL": 0.0,
    "DCGM_FI_DEV_XID_ERRORS": 0.0, "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": 0.0,
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": 0.0, "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": 0.0,
    "DCGM_FI_DEV_ROW_REMAP_FAILURE": 0.0,
}


def label_text(labels: Mapping[str, str]) -> str:
    """A series' label set in the text exposition format (values are ours: no escaping needed)."""
    inner = ",".join(f'{k}="{v}"' for k, v in labels.items())
    return "{" + inner + "}"


def dcgm_exposition(node: str, gpus: Sequence[Gpu], counters_csv: str,
                    faults: Mapping[int, Mapping[str, float]] | None = None) -> str:
    """What dcgm-exporter serves on ``node`` for the fields of ``counters_csv`` (types as the CSV declares), with
    ``faults`` (per GPU index, per field) in place of the plausible readings."""
    faults = faults or {}
    lines: list[str] = []
    for counter in dcgm_counters.parse(counters_csv):
        lines.append(f"# HELP {counter.field} {counter.help}")
        lines.append(f"# TYPE {counter.field} {counter.type}")
        for gpu in gpus:
            labels = dcgm_labels(node, gpu)
            if counter.field == "DCGM_EXP_XID_ERRORS_COUNT":
                # The XID counter carries the XID; it has series only for XIDs seen in its window.
                xid = faults.get(gpu.index, {}).get("xid")
                if xid is not None:
                    lines.append(f"{counter.field}{label_text({**labels, 'xid': str(int(xid))})} 1")
                continue
            value = faults.get(gpu.index, {}).get(counter.field, DCGM_VALUES[counter.field])
            lines.append(f"{counter.field}{label_text(labels)} {value}")
    return "\n".join(lines) + "\n"


def read_faults(path: Path = FAULTS) -> dict[int, dict[str, float]]:
    """The injected readings, or none; a file that does not parse is reported on stderr and ignored (the stand-in
    keeps serving, as dcgm-exporter keeps serving through a bad field)."""
    try:
        raw = json.loads(path.read_text())
        return {int(gpu): {str(k): float(v) for k, v in fields.items()} for gpu, fields in raw.items()}
    except FileNotFoundError:
        return {}
    except (ValueError, TypeError, AttributeError) as err:
        print(f"dcgm-standin: {path}: ignored, not {{gpu: {{field: number}}}}: {err}", file=sys.stderr, flush=True)
        return {}


def main(env: Mapping[str, str] | None = None) -> int:
    env = os.environ if env is None else env
    node = env.get("NODE_NAME", "")
    counters = Path(env.get("DCGM_EXPORTER_COLLECTORS", "/etc/dcgm-exporter/default-counters.csv")).read_text()
    dcgm_counters.parse(counters)  # a bad CSV stops the exporter at start, as dcgm-exporter's own check does
    gpus = tuple(Gpu(i) for i in range(int(env.get("DCGM_STANDIN_GPUS", "8"))))
    host, _, port = env.get("DCGM_EXPORTER_LISTEN", ":9400").rpartition(":")

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path == "/health":
                body, kind = b"OK\n", "text/plain"
            elif self.path == "/metrics":
                body, kind = dcgm_exposition(node, gpus, counters, read_faults()).encode(), \
                    "text/plain; version=0.0.4; charset=utf-8"
            else:
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            return

    print(f"dcgm-standin: {len(gpus)} fake GPUs of {node or '?'} on {host or '0.0.0.0'}:{port}", flush=True)
    ThreadingHTTPServer((host or "0.0.0.0", int(port)), Handler).serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
