"""The last chaos soak (`make chaos`, tools/chaos): faults by kind, the worst recovery per kind, the history check's
violations (every count 0 is the goal) and inference availability against the PDB floors.

The soak runs for hours on the local control plane with real nodes, so `make bench` reports the one the last
`make chaos` wrote rather than running it again; the report says when none has run.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPORT = Path(__file__).resolve().parent.parent / ".state" / "chaos" / "report.json"
#: Figures a soak without its training gang (`--no-training`, or a report from before the gang) cannot give.
NOT_MEASURED = {"training_steps_lost": "not measured: that soak ran no training gang",
                "checkpoints_lost": "not measured: that soak ran no training gang"}


def run(path: Path = REPORT) -> dict[str, Any]:
    if not path.is_file():
        return {"name": "chaos soak", "status": "not run here: run `make chaos DURATION=2h` first"}
    report: dict[str, Any] = json.loads(path.read_text())
    when = datetime.fromtimestamp(path.stat().st_mtime, UTC).isoformat(timespec="seconds")
    keep = ("duration_s", "seed", "every_s", "faults_by_kind", "worst_recovery_s_by_kind", "violations",
            "inference_availability", "training_steps_lost", "checkpoints_lost", "training_restarts_by_fault",
            "training_step_reached", "api_calls_faulted")
    return {"name": "chaos soak (last `make chaos`)", "measured_at": when, **NOT_MEASURED,
            **{k: report[k] for k in keep if report.get(k) is not None}}
