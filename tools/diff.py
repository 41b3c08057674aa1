"""``make diff BASE=<ref>``: what a change does to the cluster, object by object, without credentials.

The manifests of every stack are rendered twice on the mock runtime: from ``BASE`` (checked out with
``git worktree add`` into a temporary directory under ``.state``) and from the working tree, both with
this virtual environment's Python. Objects are matched by kind, namespace and name; the report lists
the objects added, changed and removed per stack, each with its unified YAML diff folded in a
``<details>`` block, as markdown for the pull-request comment (written to ``--out`` and stdout).
"""

from __future__ import annotations

import argparse
import difflib
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
MARKER = "<!-- gpu-cluster manifest diff -->"


@dataclass
class Rendered:
    """One stack's manifests (file name -> YAML text), or the error that stopped the render."""

    objects: dict[str, str] = field(default_factory=dict)
    error: str = ""


@dataclass
class StackDiff:
    stack: str
    added: dict[str, str] = field(default_factory=dict)
    changed: dict[str, str] = field(default_factory=dict)
    removed: dict[str, str] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not (self.added or self.changed or self.removed or self.errors)


def stacks_in(tree: Path) -> set[str]:
    return {p.name[len("Pulumi."):-len(".yaml")] for p in tree.glob("Pulumi.*.yaml")}


def render(tree: Path, stack: str, scratch: Path) -> Rendered:
    """Run the tree's own ``tools.render`` for one stack with this interpreter."""
    out = scratch / stack
    env = {**os.environ, "PYTHONPATH": str(tree), "PYTHONDONTWRITEBYTECODE": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "tools.render", "--stack", stack, "--out", str(out)],
        cwd=tree, env=env, capture_output=True, text=True, check=False,
    )
    if proc.returncode != 0:
        return Rendered(error=(proc.stderr.strip() or proc.stdout.strip() or f"exit {proc.returncode}")[-2000:])
    manifests = out / "manifests"
    return Rendered({p.name: p.read_text() for p in sorted(manifests.glob("*.yaml"))})


def title(text: str, fallback: str) -> str:
    """``Kind namespace/name`` of a manifest, for headings."""
    try:
        obj: Any = yaml.safe_load(text)
    except yaml.YAMLError:
        return fallback
    if not isinstance(obj, dict):
        return fallback
    meta = obj.get("metadata") or {}
    ns = f"{meta['namespace']}/" if meta.get("namespace") else ""
    patch = " (patch)" if fallback.endswith(".patch.yaml") else ""
    return f"{obj.get('kind', '?')} {ns}{meta.get('name', '?')}{patch}"


def unified(old: str, new: str, name: str) -> str:
    return "".join(difflib.unified_diff(
        old.splitlines(keepends=True), new.splitlines(keepends=True), f"a/{name}", f"b/{name}", n=3,
    ))


def compare(stack: str, base: Rendered, head: Rendered) -> StackDiff:
    diff = StackDiff(stack)
    if base.error:
        diff.errors.append(f"base does not render: {base.error}")
    if head.error:
        diff.errors.append(f"head does not render: {head.error}")
    if base.error or head.error:
        return diff
    for name in sorted(set(base.objects) | set(head.objects)):
        old, new = base.objects.get(name), head.objects.get(name)
        if old is None and new is not None:
            diff.added[name] = unified("", new, name)
        elif new is None and old is not None:
            diff.removed[name] = unified(old, "", name)
        elif old is not None and new is not None and old != new:
            diff.changed[name] = unified(old, new, name)
    return diff


def _section(label: str, items: dict[str, str], objects: dict[str, str]) -> list[str]:
    if not items:
        return []
    lines = [f"**{label}** ({len(items)})", ""]
    for name, text in items.items():
        lines += [
            "<details>",
            f"<summary>{title(objects.get(name, ''), name)}</summary>",
            "",
            "```diff",
            text.rstrip("\n"),
            "```",
            "</details>",
            "",
        ]
    return lines


def markdown(base_ref: str, diffs: list[StackDiff], base: dict[str, Rendered], head: dict[str, Rendered]) -> str:
    lines = [MARKER, f"## Manifest diff: `{base_ref}` → this change", ""]
    lines += ["| stack | added | changed | removed |", "|---|---|---|---|"]
    for d in diffs:
        note = " (render failed)" if d.errors else ""
        lines.append(f"| {d.stack}{note} | {len(d.added)} | {len(d.changed)} | {len(d.removed)} |")
    lines.append("")
    for d in diffs:
        lines.append(f"### {d.stack}")
        lines.append("")
        if d.empty:
            lines += ["No change to rendered objects.", ""]
            continue
        for error in d.errors:
            lines += ["```", error, "```", ""]
        old_objects = base.get(d.stack, Rendered()).objects
        new_objects = head.get(d.stack, Rendered()).objects
        lines += _section("Added", d.added, new_objects)
        lines += _section("Changed", d.changed, new_objects)
        lines += _section("Removed", d.removed, old_objects)
    return "\n".join(lines).rstrip("\n") + "\n"


@contextmanager
def worktree(repo: Path, ref: str, parent: Path) -> Iterator[Path]:
    """A detached checkout of ``ref`` under ``parent``, removed afterwards."""
    parent.mkdir(parents=True, exist_ok=True)
    path = Path(tempfile.mkdtemp(prefix="diff-base-", dir=parent))
    path.rmdir()
    subprocess.run(["git", "-C", str(repo), "worktree", "add", "--detach", "--quiet", str(path), ref],
                   check=True, capture_output=True, text=True)
    try:
        yield path
    finally:
        subprocess.run(["git", "-C", str(repo), "worktree", "remove", "--force", str(path)],
                       check=False, capture_output=True)
        shutil.rmtree(path, ignore_errors=True)


def run(repo: Path, base_ref: str, stacks: list[str] | None = None) -> tuple[str, list[StackDiff]]:
    """Render base and working tree for each stack and return the markdown report and the diffs."""
    state = repo / ".state"
    with worktree(repo, base_ref, state) as base_tree, tempfile.TemporaryDirectory(dir=state) as scratch_dir:
        scratch = Path(scratch_dir)
        names = sorted(stacks or (stacks_in(base_tree) | stacks_in(repo)))
        base: dict[str, Rendered] = {}
        head: dict[str, Rendered] = {}
        for stack in names:
            base[stack] = render(base_tree, stack, scratch / "base") if stack in stacks_in(base_tree) else Rendered()
            head[stack] = render(repo, stack, scratch / "head") if stack in stacks_in(repo) else Rendered()
        diffs = [compare(s, base[s], head[s]) for s in names]
        return markdown(base_ref, diffs, base, head), diffs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--base", required=True, help="git ref to compare the working tree with")
    parser.add_argument("--repo", type=Path, default=ROOT)
    parser.add_argument("--stack", action="append", dest="stacks", help="limit to these stacks (repeatable)")
    parser.add_argument("--out", type=Path, default=None, help="markdown file (default .state/diff.md)")
    args = parser.parse_args(argv)
    repo: Path = args.repo.resolve()
    try:
        report, diffs = run(repo, args.base, args.stacks)
    except subprocess.CalledProcessError as error:
        print(f"error: git {' '.join(error.cmd[3:])} failed: {error.stderr.strip()}", file=sys.stderr)
        return 2
    out: Path = args.out or repo / ".state" / "diff.md"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(report)
    sys.stdout.write(report)
    return 1 if any(d.errors for d in diffs) else 0


if __name__ == "__main__":
    sys.exit(main())
