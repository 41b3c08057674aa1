"""checkov over the rendered built-in objects of every stack: no failed check beyond the listed skips.

checkov lives in its own tool venv (it pins packaging 23.x; pulumi needs >= 26), installed by
`make policy-tools` before the unit tests run. Every skip in .checkov.yaml carries a one-line reason.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from components.mockrt import ROOT, RunResult
from components.security import CHECKOV_SKIP_PREFIX
from tools.policy import is_builtin, write_for_checkov
from tools.render import manifests

CHECKOV = ROOT / ".state" / "checkov-venv" / "bin" / "checkov"
CONFIG = ROOT / ".checkov.yaml"
POD_KINDS = ("Deployment", "DaemonSet", "StatefulSet", "Job", "CronJob")
#: The controllers that call the Kubernetes API and so keep their ServiceAccount token, per stack.
TOKEN_HOLDERS = {
    "prod": {("Deployment", "burst-controller"), ("Deployment", "health-guard"), ("Deployment", "prometheus-adapter"),
             ("Deployment", "vk-lambda-east"), ("Deployment", "vk-dr-cluster"), ("CronJob", "descheduler"),
             ("Deployment", "node-pools")},
    "local": {("Deployment", "burst-controller"), ("Deployment", "health-guard"), ("Deployment", "vk-local-cloud"),
              ("Deployment", "vk-backup-cloud"), ("CronJob", "descheduler"), ("Deployment", "node-pools")},
}


def object_skips(result: RunResult) -> dict[tuple[str, str], dict[str, str]]:
    """Per-object checkov skips of the built-in objects checkov sees: (kind, name) -> {check: reason}."""
    out: dict[tuple[str, str], dict[str, str]] = {}
    for manifest in manifests(result).values():
        if not is_builtin(str(manifest.get("apiVersion", ""))):
            continue
        annotations = manifest["metadata"].get("annotations") or {}
        skips = dict(v.split("=", 1) for k, v in annotations.items() if k.startswith(CHECKOV_SKIP_PREFIX))
        if skips:
            out[(manifest["kind"], manifest["metadata"]["name"])] = skips
    return out


def pod_spec(manifest: dict[str, Any]) -> dict[str, Any]:
    spec = manifest["spec"]
    if manifest["kind"] == "CronJob":
        spec = spec["jobTemplate"]["spec"]
    pod: dict[str, Any] = spec["template"]["spec"]
    return pod


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
def test_per_object_skips_carry_reasons_and_do_not_repeat_global_ones(stack: str,
                                                                       request: pytest.FixtureRequest) -> None:
    global_skips = set(yaml.safe_load(CONFIG.read_text())["skip-check"])
    skips = object_skips(request.getfixturevalue(stack))
    assert skips, "no per-object skips rendered"
    for obj, checks in skips.items():
        for check, reason in checks.items():
            assert check not in global_skips, f"{obj}: {check} is already skipped for every object"
            assert len(reason.strip()) > 20, f"{obj}: {check} needs a reason"


@pytest.mark.parametrize("stack", ["prod", "local"])
def test_only_controllers_keep_their_api_token(stack: str, request: pytest.FixtureRequest) -> None:
    result: RunResult = request.getfixturevalue(stack)
    holders = {obj for obj, checks in object_skips(result).items() if "CKV_K8S_38" in checks}
    assert holders == TOKEN_HOLDERS[stack]
    for manifest in manifests(result).values():
        if manifest["kind"] in POD_KINDS and is_builtin(manifest["apiVersion"]):
            obj = (manifest["kind"], manifest["metadata"]["name"])
            automount = pod_spec(manifest).get("automountServiceAccountToken")
            assert automount is (None if obj in holders else False), obj


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
    # Every per-object skip matched a real finding: a stale skip (the object was fixed) shows up here.
    skips = sum(len(checks) for checks in object_skips(result).values())
    assert sum(r["summary"]["skipped"] for r in reports) == skips
    assert sum(r["summary"]["passed"] for r in reports) > 0
    assert sum(r["summary"]["resource_count"] for r in reports) >= written


def test_crd_objects_are_left_out_for_checkov(local: RunResult, tmp_path: Path) -> None:
    write_for_checkov(local, tmp_path)
    kinds = {(yaml.safe_load(p.read_text())["apiVersion"]) for p in tmp_path.glob("*.yaml")}
    assert "batch.volcano.sh/v1alpha1" not in kinds
    assert {"v1", "apps/v1", "rbac.authorization.k8s.io/v1"} <= kinds
