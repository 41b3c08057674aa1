"""checkov over the rendered built-in objects of every stack: no failed check beyond the listed skips.

checkov lives in its own tool venv (it pins packaging 23.x; pulumi needs >= 26), installed by
`make policy-tools` before the unit tests run. Every skip in .checkov.yaml carries a one-line reason.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml

from tools.mockrt import ROOT, RunResult
from tools.policy import write_for_checkov

CHECKOV = ROOT / ".state" / "checkov-venv" / "bin" / "checkov"
CONFIG = ROOT / ".checkov.yaml"


def test_every_skip_has_a_reason() -> None:
    lines = CONFIG.read_text().splitlines()
    skips = yaml.safe_load(CONFIG.read_text())["skip-check"]
    assert skips, "no skips listed"
    for check in skips:
        index = lines.index(f"  - {check}")
        assert lines[index - 1].strip().startswith("# ") and len(lines[index - 1].strip()) > 20, (
            f"{check} in .checkov.yaml needs a one-line reason in the comment above it"
        )


@pytest.mark.parametrize("stack", ["prod", "local"])
def test_checkov_finds_nothing_beyond_the_listed_skips(stack: str, request: pytest.FixtureRequest,
                                                       tmp_path: Path) -> None:
    if not CHECKOV.exists():
        pytest.fail(f"{CHECKOV.relative_to(ROOT)} is missing: run `make policy-tools`")
    result: RunResult = request.getfixturevalue(stack)
    written = write_for_checkov(result, tmp_path / stack)
    assert written > 0
    proc = subprocess.run(
        [str(CHECKOV), "--config-file", str(CONFIG), "-d", str(tmp_path / stack), "-o", "json"],
        capture_output=True, text=True, check=False, timeout=600,
    )
    start = min(i for i in (proc.stdout.find("{"), proc.stdout.find("[")) if i >= 0)
    reports = json.loads(proc.stdout[start:])
    reports = reports if isinstance(reports, list) else [reports]
    failed = [
        f"{f['check_id']} {f['check_name']}: {f['resource']}"
        for report in reports for f in report["results"]["failed_checks"]
    ]
    assert failed == []
    assert sum(r["summary"]["passed"] for r in reports) > 0
    assert sum(r["summary"]["resource_count"] for r in reports) >= written


def test_crd_objects_are_left_out_for_checkov(local: RunResult, tmp_path: Path) -> None:
    write_for_checkov(local, tmp_path)
    kinds = {(yaml.safe_load(p.read_text())["apiVersion"]) for p in tmp_path.glob("*.yaml")}
    assert "batch.volcano.sh/v1alpha1" not in kinds
    assert {"v1", "apps/v1", "rbac.authorization.k8s.io/v1"} <= kinds
