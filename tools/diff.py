"""``make diff BASE=<ref>``: what a change does to the cluster, object by object, without credentials.

The manifests of every stack are rendered twice on the mock runtime: from ``BASE`` (checked out with
``git worktree add`` into a temporary directory under ``.state``) and from the working tree, both with
this virtual environment's Python. Objects are matched by kind, namespace and name; the report lists
the objects added, changed and removed per stack, each with its unified YAML diff folded in a
``<details>`` block, as markdown for the pull-request comment (written to ``--out`` and stdout).

A manifest diff alone misses changes a reviewer must see, so the report also has, per stack:

* the inputs of resources that are no Kubernetes object of their own, matched by URN: a Helm chart's
  values (Volcano's scheduler configuration is one), its chart and version;
* resource options: ``protect``, ``retainOnDelete``, ``aliases``, ``dependsOn``, ``ignoreChanges``;
* the policy verdicts: the rules of this tree's pack over both renders, violations the change adds and
  those it resolves.
"""

from __future__ import annotations

import argparse
import difflib
import json
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


#: Types that are no Kubernetes object of their own (tools.render leaves them out of the manifests).
NOT_MANIFESTS = ("kubernetes:helm.sh/", "kubernetes:yaml/", "kubernetes:kustomize/")
#: Resource options a reviewer must see change, in report order, with the value meaning "not set".
OPTIONS: tuple[tuple[str, Any], ...] = (
    ("protect", False), ("retainOnDelete", False), ("aliases", []), ("dependsOn", []), ("ignoreChanges", []),
)


@dataclass
class Rendered:
    """One stack's manifests (file name -> YAML text) and registered resources (URN -> resources.json entry),
    or the error that stopped the render; ``verdicts`` are the policy violations over those resources."""

    objects: dict[str, str] = field(default_factory=dict)
    error: str = ""
    resources: dict[str, dict[str, Any]] = field(default_factory=dict)
    verdicts: list[Verdict] = field(default_factory=list)


@dataclass(frozen=True, order=True)
class Verdict:
    """One policy violation, as the report shows it."""

    level: str
    rule: str
    resource: str
    message: str

    def line(self) -> str:
        return f"`{self.rule}` ({self.level}) on {self.resource}: {self.message}"


@dataclass
class StackDiff:
    stack: str
    added: dict[str, str] = field(default_factory=dict)
    changed: dict[str, str] = field(default_factory=dict)
    removed: dict[str, str] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    #: Resource label -> unified YAML diff of the inputs of a resource with no manifest (a chart's values).
    inputs: dict[str, str] = field(default_factory=dict)
    #: Resource label -> one line per option that changed (or is set on an added resource).
    options: dict[str, list[str]] = field(default_factory=dict)
    new_violations: list[Verdict] = field(default_factory=list)
    resolved_violations: list[Verdict] = field(default_factory=list)
    #: Mandatory and advisory violations in the head render.
    head_violations: tuple[int, int] = (0, 0)

    @property
    def empty(self) -> bool:
        return not (self.added or self.changed or self.removed or self.errors or self.inputs or self.options
                    or self.new_violations or self.resolved_violations)


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
    listing = out / "resources.json"
    data = json.loads(listing.read_text()) if listing.is_file() else {}
    return Rendered(
        {p.name: p.read_text() for p in sorted(manifests.glob("*.yaml"))},
        resources={str(r["urn"]): r for r in data.get("resources", []) if isinstance(r, dict) and r.get("urn")},
        verdicts=verdicts(tree, stack, data) if data else [],
    )


def verdicts(tree: Path, stack: str, data: dict[str, Any]) -> list[Verdict]:
    """This tree's policy rules over a render's ``resources.json``, with the rule context of ``tree``'s stack file.

    The rules are the working tree's (imported here), so base and head are judged alike: a verdict that
    changes is the change's doing, not the pack's.
    """
    from components.config import PROJECT, ConfigError
    from components.mockrt import stack_config
    from policies.rules import evaluate
    from tools.policy import context_for, resources_from_json

    config, secrets = stack_config(stack, tree)
    prefix = f"{PROJECT}:"
    raw = {k[len(prefix):]: v for k, v in config.items() if k.startswith(prefix) and k not in secrets}
    try:
        ctx = context_for(stack, raw)
    except ConfigError as error:
        return [Verdict("error", "config", f"Pulumi.{stack}.yaml", str(error).splitlines()[0])]
    found = evaluate(resources_from_json(data), ctx)
    return sorted({Verdict(v.level.value, v.rule, v.resource, v.message) for v in found})


def has_manifest(resource: dict[str, Any]) -> bool:
    """Whether tools.render writes this resource as a manifest (then the manifest diff shows its inputs)."""
    type_ = str(resource.get("type", ""))
    inputs = resource.get("inputs") or {}
    return (bool(resource.get("custom")) and type_.startswith("kubernetes:") and not type_.startswith(NOT_MANIFESTS)
            and "apiVersion" in inputs and "kind" in inputs)


def resource_label(resource: dict[str, Any]) -> str:
    """``type name`` of a registered resource, for headings (``kubernetes:helm.sh/v4:Chart volcano``)."""
    return f"{resource.get('type', '?')} {resource.get('name', '?')}"


def _short(urn: str) -> str:
    """The ``type::name`` tail of a URN (a dependsOn or alias entry)."""
    parts = urn.split("::")
    return "::".join(parts[-2:]) if len(parts) >= 2 else urn


def option_changes(old: dict[str, Any] | None, new: dict[str, Any] | None) -> list[str]:
    """One line per option that differs; ``old`` None means an added resource (only set options are listed)."""
    lines = []
    for key, unset in OPTIONS:
        before = (old or {}).get(key, unset) if old is not None else unset
        after = (new or {}).get(key, unset)
        if isinstance(unset, list):
            gone = sorted(set(before or []) - set(after or []))
            came = sorted(set(after or []) - set(before or []))
            lines += [f"{key}: + {_short(u)}" for u in came] + [f"{key}: - {_short(u)}" for u in gone]
        elif bool(before) != bool(after):
            lines.append(f"{key}: {str(bool(before)).lower()} → {str(bool(after)).lower()}")
    return lines


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
    for urn in sorted(set(base.resources) | set(head.resources)):
        before, after = base.resources.get(urn), head.resources.get(urn)
        label = resource_label(after or before or {})
        shown = [r for r in (before, after) if r is not None and not has_manifest(r) and r.get("inputs")]
        if shown:
            old_text = _yaml((before or {}).get("inputs")) if before is not None and not has_manifest(before) else ""
            new_text = _yaml((after or {}).get("inputs")) if after is not None and not has_manifest(after) else ""
            if old_text != new_text:
                diff.inputs[label] = unified(old_text, new_text, label.replace(" ", "/"))
        if after is not None:
            lines = option_changes(None if before is None else before.get("options") or {}, after.get("options") or {})
            if lines:
                diff.options[label] = lines
    diff.new_violations = sorted(set(head.verdicts) - set(base.verdicts))
    diff.resolved_violations = sorted(set(base.verdicts) - set(head.verdicts))
    diff.head_violations = (sum(v.level == "mandatory" for v in head.verdicts),
                            sum(v.level != "mandatory" for v in head.verdicts))
    return diff


class _BlockDumper(yaml.SafeDumper):
    """Multi-line strings (a scheduler configuration inside chart values) as ``|`` blocks: diffable line by line."""


def _str(dumper: yaml.SafeDumper, text: str) -> yaml.ScalarNode:
    return dumper.represent_scalar("tag:yaml.org,2002:str", text, style="|" if "\n" in text else None)


_BlockDumper.add_representer(str, _str)


def _yaml(value: Any) -> str:
    return yaml.dump(value, Dumper=_BlockDumper, sort_keys=True, width=120) if value else ""


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


def _folded(summary: str, body: str, fence: str = "diff") -> list[str]:
    return ["<details>", f"<summary>{summary}</summary>", "", f"```{fence}", body.rstrip("\n"), "```", "</details>", ""]


def _extras(d: StackDiff) -> list[str]:
    """Chart values and inputs, resource options and policy verdicts of one stack, as markdown."""
    lines: list[str] = []
    if d.inputs:
        lines += [f"**Chart values and other inputs** ({len(d.inputs)})", ""]
        for label, text in d.inputs.items():
            lines += _folded(label, text)
    if d.options:
        lines += [f"**Resource options** ({len(d.options)})", ""]
        for label, changes in d.options.items():
            lines.append(f"* {label}: " + "; ".join(changes))
        lines.append("")
    mandatory, advisory = d.head_violations
    lines += [f"**Policy verdicts**: {mandatory} mandatory and {advisory} advisory violation(s) with this change; "
              f"{len(d.new_violations)} new, {len(d.resolved_violations)} resolved", ""]
    lines += [f"* new: {v.line()}" for v in d.new_violations]
    lines += [f"* resolved: {v.line()}" for v in d.resolved_violations]
    if d.new_violations or d.resolved_violations:
        lines.append("")
    return lines


def markdown(base_ref: str, diffs: list[StackDiff], base: dict[str, Rendered], head: dict[str, Rendered]) -> str:
    lines = [MARKER, f"## Manifest diff: `{base_ref}` → this change", ""]
    lines += ["| stack | added | changed | removed | inputs | options | new violations | resolved violations |",
              "|---|---|---|---|---|---|---|---|"]
    for d in diffs:
        note = " (render failed)" if d.errors else ""
        lines.append(f"| {d.stack}{note} | {len(d.added)} | {len(d.changed)} | {len(d.removed)} | {len(d.inputs)} | "
                     f"{len(d.options)} | {len(d.new_violations)} | {len(d.resolved_violations)} |")
    lines.append("")
    for d in diffs:
        lines.append(f"### {d.stack}")
        lines.append("")
        if d.empty:
            lines += ["No change to rendered objects, inputs, options or policy verdicts.", ""]
            continue
        for error in d.errors:
            lines += ["```", error, "```", ""]
        if d.errors:
            continue
        old_objects = base.get(d.stack, Rendered()).objects
        new_objects = head.get(d.stack, Rendered()).objects
        lines += _section("Added", d.added, new_objects)
        lines += _section("Changed", d.changed, new_objects)
        lines += _section("Removed", d.removed, old_objects)
        lines += _extras(d)
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
