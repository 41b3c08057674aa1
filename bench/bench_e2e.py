"""Per-phase timings of the last end-to-end burst and fault scenarios on the local control plane (`make e2e`).

The scenario needs the control plane built from Go modules and takes minutes, so `make bench` reports
the phases the last `make e2e` wrote rather than running it again; the report says when it has not run.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

PHASES = Path(__file__).resolve().parent.parent / ".state" / "localcluster" / "e2e-phases.json"
#: The fault scenario's headline phases (seconds from the fault): the let-it-crash loop closed by the guard.
FAULT_PHASES = {
    "fault_time_to_quarantine_s": "time to quarantine",
    "fault_time_to_training_evicted_s": "time to training off the bad nodes",
    "fault_time_to_gang_restarted_s": "time to gang restarted (waiting for room)",
    "fault_time_to_gang_running_again_s": "time to gang running again (incl. probation and repair)",
}


def run(path: Path = PHASES) -> dict[str, Any]:
    if not path.is_file():
        return {"name": "e2e burst scenario phases", "status": "not run here: run `make e2e` first"}
    phases = json.loads(path.read_text())
    when = datetime.fromtimestamp(path.stat().st_mtime, UTC).isoformat(timespec="seconds")
    fault = {label: round(phases[key], 2) for key, label in FAULT_PHASES.items() if key in phases}
    return {
        "name": "e2e burst and fault scenario phases (seconds, last `make e2e`)",
        "measured_at": when,
        "fault_loop": fault or "fault scenario not in the last run",
        **{key: round(value, 2) if isinstance(value, float) else value for key, value in sorted(phases.items())},
    }


if __name__ == "__main__":
    print(json.dumps(run(), indent=2))
