"""`make diff` on two commits with a known change shows exactly that change.

A throwaway git repository in tmp_path holds a copy of the program (components, agents, tools, stack
files); the second commit changes one config value, and the report must show the one object it changes.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from components.mockrt import ROOT
from tools import diff

COPY = ["__main__.py", "Pulumi.yaml", "Pulumi.prod.yaml", "Pulumi.local.yaml", "components", "agents"]


def git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True)


def commit_all(repo: Path, message: str) -> None:
    git(repo, "-c", "user.name=t", "-c", "user.email=t@example.org", "commit", "--quiet", "-am", message)


def base_repo(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    root.mkdir()
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in COPY:
        source = ROOT / name
        if source.is_dir():
            shutil.copytree(source, root / name, ignore=ignore)
        else:
            shutil.copy2(source, root / name)
    (root / "tools").mkdir()
    for source in (ROOT / "tools").glob("*.py"):
        shutil.copy2(source, root / "tools" / source.name)
    (root / ".gitignore").write_text(".state/\n__pycache__/\n")
    git(root, "init", "--quiet", "--initial-branch=main")
    git(root, "-c", "user.name=t", "-c", "user.email=t@example.org", "add", "-A")
    git(root, "-c", "user.name=t", "-c", "user.email=t@example.org", "commit", "--quiet", "-m", "base")
    return root


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    root = base_repo(tmp_path)
    stack = root / "Pulumi.local.yaml"
    text = stack.read_text()
    assert "  gpu-cluster:scheduling:\n    install: false\n" in text
    stack.write_text(text.replace(
        "  gpu-cluster:scheduling:\n    install: false\n",
        "  gpu-cluster:scheduling:\n    install: false\n"
        "    inferenceQueue: {name: inference, weight: 3, reclaimable: true}\n",
    ))
    commit_all(root, "heavier inference")
    return root


def test_diff_shows_exactly_the_changed_object(repo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = repo / "diff.md"
    assert diff.main(["--repo", str(repo), "--base", "HEAD~1", "--stack", "local", "--out", str(out)]) == 0
    report = out.read_text()
    assert capsys.readouterr().out == report
    assert "| local | 0 | 1 | 0 | 0 | 0 | 0 | 0 |" in report
    assert "<summary>Queue inference</summary>" in report
    changed = [line for line in report.splitlines()
               if line.startswith(("+", "-")) and not line.startswith(("+++", "---"))]
    assert changed == ["-  weight: 2", "+  weight: 3"]
    # The base worktree is gone afterwards.
    listed = subprocess.run(["git", "-C", str(repo), "worktree", "list"], capture_output=True, text=True, check=True)
    assert len(listed.stdout.strip().splitlines()) == 1


def test_no_change_and_added_removed_objects() -> None:
    base = diff.Rendered({"a.yaml": "kind: A\nmetadata: {name: a}\n", "b.yaml": "kind: B\nmetadata: {name: b}\n"})
    head = diff.Rendered({"b.yaml": "kind: B\nmetadata: {name: b}\n", "c.yaml": "kind: C\nmetadata: {name: c}\n"})
    same = diff.compare("s", base, base)
    assert same.empty
    moved = diff.compare("s", base, head)
    assert (list(moved.added), list(moved.changed), list(moved.removed)) == (["c.yaml"], [], ["a.yaml"])
    report = diff.markdown("main", [moved, diff.compare("t", base, base)], {"s": base, "t": base},
                           {"s": head, "t": base})
    assert "| s | 1 | 0 | 1 |" in report and "| t | 0 | 0 | 0 |" in report
    assert "<summary>C c</summary>" in report and "<summary>A a</summary>" in report
    assert "No change to rendered objects, inputs, options or policy verdicts." in report


def test_a_base_that_does_not_render_is_reported() -> None:
    broken = diff.compare("s", diff.Rendered(error="error: invalid stack configuration"), diff.Rendered())
    assert broken.errors == ["base does not render: error: invalid stack configuration"]
    assert "(render failed)" in diff.markdown("main", [broken], {}, {})


def test_removing_reclaim_from_volcanos_config_shows_the_values_and_the_verdict(tmp_path: Path) -> None:
    # The scheduler configuration is a chart value, no manifest of its own: the diff must still show it,
    # and the policy verdict it breaks.
    root = base_repo(tmp_path)
    module = root / "components" / "gang_scheduler.py"
    text = module.read_text()
    actions = 'VOLCANO_ACTIONS = ["enqueue", "allocate", "preempt", "reclaim", "backfill"]'
    assert actions in text
    module.write_text(text.replace(actions, 'VOLCANO_ACTIONS = ["enqueue", "allocate", "preempt", "backfill"]'))
    commit_all(root, "no reclaim")
    out = root / "diff.md"
    assert diff.main(["--repo", str(root), "--base", "HEAD~1", "--stack", "prod", "--out", str(out)]) == 0
    report = out.read_text()
    assert "| prod | 0 | 0 | 0 | 1 | 0 | 1 | 0 |" in report
    assert "<summary>kubernetes:helm.sh/v4:Chart volcano</summary>" in report
    changed = [line for line in report.splitlines()
               if line.startswith(("+", "-")) and not line.startswith(("+++", "---"))]
    assert changed == ["-      actions: enqueue, allocate, preempt, reclaim, backfill",
                       "+      actions: enqueue, allocate, preempt, backfill"]
    (new,) = [line for line in report.splitlines() if line.startswith("* new: ")]
    assert new.startswith("* new: `gang-scheduler-preemption-path` (mandatory) on ")
    assert "lack reclaim" in new


def entry(urn: str, type_: str = "kubernetes:helm.sh/v4:Chart", inputs: dict[str, Any] | None = None,
          **options: Any) -> dict[str, Any]:
    return {"urn": urn, "type": type_, "name": urn.rsplit("::", 1)[-1], "custom": False,
            "inputs": inputs or {}, "options": options}


def test_options_changes_are_listed_per_resource() -> None:
    pvc = "urn:pulumi:prod::gpu-cluster::kubernetes:core/v1:PersistentVolumeClaim::ckpt"
    ns = "urn:pulumi:prod::gpu-cluster::kubernetes:core/v1:Namespace::training"
    old = "urn:pulumi:prod::gpu-cluster::kubernetes:core/v1:PersistentVolumeClaim::checkpoints"
    manifest = {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "ckpt"}}
    before = diff.Rendered(resources={pvc: entry(pvc, "kubernetes:core/v1:PersistentVolumeClaim", manifest,
                                                 protect=True, retainOnDelete=True, dependsOn=[])})
    after = diff.Rendered(resources={pvc: entry(pvc, "kubernetes:core/v1:PersistentVolumeClaim", manifest,
                                                protect=False, retainOnDelete=True, dependsOn=[ns], aliases=[old])})
    d = diff.compare("prod", before, after)
    label = "kubernetes:core/v1:PersistentVolumeClaim ckpt"
    assert d.options == {label: ["protect: true → false",
                                 "aliases: + kubernetes:core/v1:PersistentVolumeClaim::checkpoints",
                                 "dependsOn: + kubernetes:core/v1:Namespace::training"]}
    assert d.inputs == {}  # a Kubernetes object: its inputs are the manifest diff's
    report = diff.markdown("main", [d], {"prod": before}, {"prod": after})
    assert f"* {label}: protect: true → false; aliases: + " in report
    # An added resource lists only the options it sets.
    assert diff.compare("prod", diff.Rendered(), after).options == {label: [
        "retainOnDelete: false → true", "aliases: + kubernetes:core/v1:PersistentVolumeClaim::checkpoints",
        "dependsOn: + kubernetes:core/v1:Namespace::training"]}
    assert diff.compare("prod", after, after).empty


def test_chart_version_and_removed_verdicts_are_shown() -> None:
    urn = "urn:pulumi:prod::gpu-cluster::kubernetes:helm.sh/v4:Chart::volcano"
    bad = diff.Verdict("mandatory", "gang-scheduler-preemption-path", "Chart volcano", "lacks reclaim")
    before = diff.Rendered(resources={urn: entry(urn, inputs={"chart": "volcano", "version": "1.14.0"})},
                           verdicts=[bad])
    after = diff.Rendered(resources={urn: entry(urn, inputs={"chart": "volcano", "version": "1.15.0"})})
    d = diff.compare("prod", before, after)
    assert list(d.inputs) == ["kubernetes:helm.sh/v4:Chart volcano"]
    assert "-version: 1.14.0\n+version: 1.15.0" in d.inputs["kubernetes:helm.sh/v4:Chart volcano"]
    assert (d.new_violations, d.resolved_violations, d.head_violations) == ([], [bad], (0, 0))
    report = diff.markdown("main", [d], {"prod": before}, {"prod": after})
    assert "| prod | 0 | 0 | 0 | 1 | 0 | 0 | 1 |" in report
    assert "* resolved: `gang-scheduler-preemption-path` (mandatory) on Chart volcano: lacks reclaim" in report
