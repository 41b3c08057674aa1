"""Per-phase timings of the last end-to-end burst scenario on the local control plane (`make e2e`).

The scenario needs the control plane built from Go modules and takes minutes, so `make bench` reports
the phases the last `make e2e` wrote rather than running it again; the report says when it has not run.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

PHASES = Path(__file__).resolve().parent.parent / ".state" / "localcluster" / "e2e-phases.json"


def run(path: Path = PHASES) -> dict[str, Any]:
    if not path.is_file():
        return {"name": "e2e burst scenario phases", "status": "not run here: run `make e2e` first"}
    phases = json.loads(path.read_text())
    when = datetime.fromtimestamp(path.stat().st_mtime, UTC).isoformat(timespec="seconds")
    return {
        "name": "e2e burst scenario phases (seconds, last `make e2e`)",
        "measured_at": when,
        **{key: round(value, 2) if isinstance(value, float) else value for key, value in sorted(phases.items())},
    }


if __name__ == "__main__":
    print(json.dumps(run(), indent=2))
