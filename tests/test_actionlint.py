"""actionlint over the repository's GitHub workflows (built from its Go module by `make policy-tools`)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import yaml

from components.mockrt import ROOT

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


WORKFLOWS = ROOT / ".github" / "workflows"
CI_DOC = ROOT / "docs" / "ci.md"


def _preview_steps() -> list[dict[str, object]]:
    steps: list[dict[str, object]] = yaml.safe_load(WORKFLOW.read_text())["jobs"]["preview"]["steps"]
    return steps


def test_preview_takes_its_backend_passphrase_and_cli_from_the_repository() -> None:
    action = next(s for s in _preview_steps() if str(s.get("uses", "")).startswith("pulumi/actions@v"))
    env = action["env"]
    assert isinstance(env, dict) and isinstance(action["with"], dict)
    assert env["PULUMI_ACCESS_TOKEN"] == "${{ secrets.PULUMI_ACCESS_TOKEN }}"
    assert env["PULUMI_CONFIG_PASSPHRASE"] == "${{ secrets.PULUMI_CONFIG_PASSPHRASE }}"
    assert action["with"]["cloud-url"] == "${{ secrets.PULUMI_BACKEND_URL }}"
    pinned = re.search(r"^pulumi==(\S+)$", (ROOT / "requirements.txt").read_text(), re.MULTILINE)
    assert pinned is not None
    assert action["with"]["pulumi-version"] == pinned.group(1), "the CI's CLI is the Python SDK's version"


def test_every_secret_a_workflow_reads_is_documented() -> None:
    used = set()
    for workflow in WORKFLOWS.glob("*.yml"):
        used |= set(re.findall(r"secrets\.([A-Z0-9_]+)", workflow.read_text()))
    used.discard("GITHUB_TOKEN")
    assert {"KUBECONFIG", "PULUMI_ACCESS_TOKEN", "PULUMI_BACKEND_URL", "PULUMI_CONFIG_PASSPHRASE"} <= used
    documented = CI_DOC.read_text()
    assert not [name for name in sorted(used) if f"`{name}`" not in documented]


def _placeholder_check(cwd: Path, stack: str) -> subprocess.CompletedProcess[str]:
    step = next(s for s in _preview_steps() if "placeholder" in str(s.get("name", "")))
    return subprocess.run(["bash", "-c", str(step["run"])], cwd=cwd, env={"STACK": stack, "PATH": "/usr/bin:/bin"},
                          capture_output=True, text=True, check=False)


def test_preview_stops_on_the_shipped_placeholder_secrets(tmp_path: Path) -> None:
    proc = _placeholder_check(ROOT, "prod")
    assert proc.returncode == 1
    assert "::error file=Pulumi.prod.yaml::placeholder secrets" in proc.stdout
    real = (ROOT / "Pulumi.prod.yaml").read_text().replace(":placeholder", ":AAAArealCiphertext")
    (tmp_path / "Pulumi.prod.yaml").write_text(real)
    assert _placeholder_check(tmp_path, "prod").returncode == 0
