"""The last chaos soak (`make chaos`, tools/chaos): faults by kind, the worst recovery per kind, the history check's
violations (every count 0 is the goal) and inference availability against the PDB floors.

The soak runs for hours on the local control plane with real nodes, so `make bench` reports the one the last
`make chaos` wrote rather than running it again (on a machine that has run none, the committed report's); the
report says when none has run. A short soak (a check of a fix, minutes) does not replace a committed long one
(`LONG_S`): the report keeps the long run's figures and names the shorter one beside them.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.committed import REPORT as COMMITTED
from bench.committed import committed_result

REPORT = Path(__file__).resolve().parent.parent / ".state" / "chaos" / "report.json"
#: A soak at least this long is the long run the report carries (the two hours the soak's figures are judged on).
LONG_S = 7200.0
#: Figures a soak without its training gang (`--no-training`, or a report from before the gang) cannot give.
NOT_MEASURED = {"training_steps_lost": "not measured: that soak ran no training gang",
                "checkpoints_lost": "not measured: that soak ran no training gang"}


def run(path: Path = REPORT, committed: Path = COMMITTED) -> dict[str, Any]:
    if not path.is_file():
        last = committed_result("bench_chaos", committed)
        if last is not None and "measured_at" in last:
            # A fresh clone keeps the committed soak's figures, dated by when that soak ran.
            return last
        return {"name": "chaos soak", "status": "not run here: run `make chaos DURATION=2h` first"}
    report: dict[str, Any] = json.loads(path.read_text())
    when = datetime.fromtimestamp(path.stat().st_mtime, UTC).isoformat(timespec="seconds")
    last = committed_result("bench_chaos", committed)
    if (float(report.get("duration_s") or 0) < LONG_S and last is not None
            and float(last.get("duration_s") or 0) >= LONG_S):
        return {**last, "shorter_soak_since": f"seed {report.get('seed')}, {report.get('duration_s')} s, {when}: "
                                              "the long run's figures kept"}
    keep = ("duration_s", "seed", "every_s", "faults_by_kind", "worst_recovery_s_by_kind", "violations",
            "inference_availability", "training_steps_lost", "checkpoints_lost", "training_restarts_by_fault",
            "training_step_reached", "api_calls_faulted")
    return {"name": "chaos soak (last `make chaos`)", "measured_at": when, **NOT_MEASURED,
            **{k: report[k] for k in keep if report.get(k) is not None}}
