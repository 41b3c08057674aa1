"""actionlint over the repository's GitHub workflows (built from its Go module by `make policy-tools`)."""

from __future__ import annotations

import subprocess

import pytest
import yaml

from tools.mockrt import ROOT

ACTIONLINT = ROOT / ".state" / "bin" / "actionlint"
WORKFLOW = ROOT / ".github" / "workflows" / "pr-preview.yml"


def test_actionlint_is_clean() -> None:
    if not ACTIONLINT.exists():
        pytest.fail(f"{ACTIONLINT.relative_to(ROOT)} is missing: run `make policy-tools`")
    proc = subprocess.run([str(ACTIONLINT), "-no-color"], cwd=ROOT, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_actionlint_catches_a_broken_workflow(tmp_path) -> None:
    if not ACTIONLINT.exists():
        pytest.fail(f"{ACTIONLINT.relative_to(ROOT)} is missing: run `make policy-tools`")
    broken = tmp_path / "broken.yml"
    broken.write_text("on: pull_request\njobs:\n  a:\n    runs-on: ubuntu-24.04\n    steps:\n"
                      "      - run: echo ${{ github.event.pull_request.title }}\n")
    proc = subprocess.run([str(ACTIONLINT), "-no-color", str(broken)], capture_output=True, text=True, check=False)
    assert proc.returncode == 1
    assert "potentially untrusted" in proc.stdout


def test_pr_workflow_shape() -> None:
    workflow = yaml.safe_load(WORKFLOW.read_text())
    jobs = workflow["jobs"]
    assert any(step.get("run") == "make test" for step in jobs["test"]["steps"])
    diff_steps = jobs["diff"]["steps"]
    assert any("make diff BASE=" in str(step.get("run")) for step in diff_steps)
    assert any(str(step.get("uses", "")).startswith("marocchino/sticky-pull-request-comment@v") for step in diff_steps)
    preview = jobs["preview"]
    assert preview["if"] == "${{ needs.credentials.outputs.configured == 'true' }}"
    action = next(step for step in preview["steps"] if str(step.get("uses", "")).startswith("pulumi/actions@v"))
    assert action["with"]["policyPacks"] == "policies"
    assert action["with"]["comment-on-pr"] is True and action["with"]["edit-pr-comment"] is True
    assert action["with"]["command"] == "preview" and action["with"]["diff"] is True
