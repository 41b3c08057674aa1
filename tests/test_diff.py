"""`make diff` on two commits with a known change shows exactly that change.

A throwaway git repository in tmp_path holds a copy of the program (components, agents, tools, stack
files); the second commit changes one config value, and the report must show the one object it changes.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from tools import diff
from tools.mockrt import ROOT

COPY = ["__main__.py", "Pulumi.yaml", "Pulumi.prod.yaml", "Pulumi.local.yaml", "components", "agents"]


def git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True)


@pytest.fixture
def repo(tmp_path: Path) -> Path:
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
    stack = root / "Pulumi.local.yaml"
    text = stack.read_text()
    assert "  gpu-cluster:scheduling:\n    install: false\n" in text
    stack.write_text(text.replace(
        "  gpu-cluster:scheduling:\n    install: false\n",
        "  gpu-cluster:scheduling:\n    install: false\n"
        "    inferenceQueue: {name: inference, weight: 3, reclaimable: true}\n",
    ))
    git(root, "-c", "user.name=t", "-c", "user.email=t@example.org", "commit", "--quiet", "-am", "heavier inference")
    return root


def test_diff_shows_exactly_the_changed_object(repo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = repo / "diff.md"
    assert diff.main(["--repo", str(repo), "--base", "HEAD~1", "--stack", "local", "--out", str(out)]) == 0
    report = out.read_text()
    assert capsys.readouterr().out == report
    assert "| local | 0 | 1 | 0 |" in report
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
    assert "No change to rendered objects." in report


def test_a_base_that_does_not_render_is_reported() -> None:
    broken = diff.compare("s", diff.Rendered(error="error: invalid stack configuration"), diff.Rendered())
    assert broken.errors == ["base does not render: error: invalid stack configuration"]
    assert "(render failed)" in diff.markdown("main", [broken], {}, {})
