"""Per-phase timings of the last end-to-end burst and fault scenarios on the local control plane (`make e2e`).

The scenario needs the control plane built from Go modules and takes minutes, so `make bench` reports
the phases the last `make e2e` wrote rather than running it again; the report says when it has not run.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

STATE = Path(__file__).resolve().parent.parent / ".state"
PHASES = STATE / "localcluster" / "e2e-phases.json"
#: What tests/test_e2e_realnodes.py measured on real kubelets, and what `make images` took per image.
REAL_PODS = STATE / "localcluster" / "e2e-realnodes.json"
IMAGE_SECONDS = STATE / "images" / "oci" / "build-seconds.json"
#: What tests/test_e2e_stack_in_pods.py measured: `pulumi up` of the local stack with every agent in its pods.
STACK_IN_PODS = STATE / "localcluster" / "e2e-stack-in-pods.json"
#: The fault scenario's headline phases (seconds from the fault): the let-it-crash loop closed by the guard.
FAULT_PHASES = {
    "fault_time_to_quarantine_s": "time to quarantine",
    "fault_time_to_training_evicted_s": "time to training off the bad nodes",
    "fault_time_to_gang_restarted_s": "time to gang restarted (waiting for room)",
    "fault_time_to_gang_running_again_s": "time to gang running again (incl. probation and repair)",
}


def _last(path: Path) -> dict[str, Any]:
    out: dict[str, Any] = json.loads(path.read_text()) if path.is_file() else {
        "status": "not run here: run `make e2e` first"}
    return out


def real_pods(path: Path = REAL_PODS, images: Path = IMAGE_SECONDS,
              stack_in_pods: Path = STACK_IN_PODS) -> dict[str, Any]:
    """real_nodes, agent_pods_running, leader_failover_s, liveness_restart_s, host hygiene, image build seconds,
    and the whole stack's ``pulumi up`` with every agent in its pods."""
    out = _last(path)
    if images.is_file():
        out["image_build_s"] = json.loads(images.read_text())
    out["stack_in_pods"] = _last(stack_in_pods)
    return out


def run(path: Path = PHASES, real: Path = REAL_PODS, images: Path = IMAGE_SECONDS,
        stack_in_pods: Path = STACK_IN_PODS) -> dict[str, Any]:
    if not path.is_file():
        return {"name": "e2e burst scenario phases", "status": "not run here: run `make e2e` first",
                "real_pods": real_pods(real, images, stack_in_pods)}
    phases = json.loads(path.read_text())
    when = datetime.fromtimestamp(path.stat().st_mtime, UTC).isoformat(timespec="seconds")
    fault = {label: round(phases[key], 2) for key, label in FAULT_PHASES.items() if key in phases}
    return {
        "name": "e2e burst and fault scenario phases (seconds, last `make e2e`)",
        "measured_at": when,
        "fault_loop": fault or "fault scenario not in the last run",
        "real_pods": real_pods(real, images, stack_in_pods),
        **{key: round(value, 2) if isinstance(value, float) else value for key, value in sorted(phases.items())},
    }


if __name__ == "__main__":
    print(json.dumps(run(), indent=2))
