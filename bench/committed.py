"""The figures the committed ``bench/report.json`` carries, for the sections measured by runs too long for
``make bench`` (the e2e, the chaos soak, the scale shapes): a machine that has not run them yet reports the last
committed run (dated by its own ``measured_at``) instead of dropping its figures from the report."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

REPORT = Path(__file__).resolve().parent / "report.json"


def committed_result(module: str, report: Path = REPORT) -> dict[str, Any] | None:
    """The ``result`` of ``module`` in the committed report, or None where the report, the module or its result is
    missing or not the shape ``bench/run.py`` writes."""
    try:
        result = json.loads(report.read_text())["benchmarks"][module]["result"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return result if isinstance(result, dict) else None
