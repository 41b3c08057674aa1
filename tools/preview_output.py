"""Reads ``pulumi preview --diff`` text output into what a reviewer reads first.

A prod preview prints tens of thousands of lines (every object's inputs, Volcano's CRD schemas). Only a few
facts matter at a glance: how many objects of each kind each operation touches, what the policy pack said,
and the engine's own diagnostics. This module finds them; ``tools/preview.py`` prints them before the
declaration tables and leaves the per-object diff in a file. Pure: text in, a report out.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field

#: A resource's header line in the diff: ``    + kubernetes:core/v1:Namespace: (create)``, with a lock after
#: it when the resource is protected. The symbol is absent for unchanged resources in some engine versions;
#: the type has at least two colons.
_HEADER = re.compile(r"^\s*(?:[-+~<>=]{1,2}\s+)?(?P<type>[A-Za-z0-9_.-]+:[A-Za-z0-9_./-]*:[A-Za-z0-9_.$-]+): "
                     r"\((?P<op>[a-z][a-z-]*)\)(?P<marks>[^()]*)$")
PROTECTED_MARK = "\U0001f512"
#: A policy verdict: ``    - [mandatory]  rule-name  (kubernetes:core/v1:Pod: name)``.
_VERDICT = re.compile(r"^\s*- \[(?P<level>advisory|mandatory|remediate|disabled)\]\s+(?P<rule>\S+)")
#: The blocks the engine prints after the diff, each a column-0 title and its indented lines.
BLOCKS = ("Policy Violations", "Policies", "Policy Packs run", "Diagnostics", "Resources")


@dataclass(frozen=True)
class EngineReport:
    """What a preview's output says, in the terms a reviewer asks for."""

    changes: Counter[tuple[str, str]] = field(default_factory=Counter)  # (operation, resource type) → count
    blocks: dict[str, list[str]] = field(default_factory=dict)  # title → its lines as printed, title first
    verdicts: Counter[str] = field(default_factory=Counter)  # policy level → count
    protected: Counter[str] = field(default_factory=Counter)  # operation → protected resources it touches
    lines: int = 0

    def operations(self) -> list[str]:
        """Operations in the engine's own order of consequence: what is lost first."""
        order = ["delete", "replace", "delete-replaced", "create-replacement", "update", "create", "import",
                 "read", "refresh", "same"]
        seen = {op for op, _ in self.changes}
        return [op for op in order if op in seen] + sorted(seen - set(order))

    def by_type(self) -> list[tuple[str, dict[str, int]]]:
        """Each resource type with its count per operation, the most touched first."""
        rows: dict[str, dict[str, int]] = {}
        for (op, rtype), count in self.changes.items():
            rows.setdefault(rtype, {})[op] = count
        return sorted(rows.items(), key=lambda kv: (-sum(kv[1].values()), kv[0]))


def read(text: str) -> EngineReport:
    """The report of one preview's output (stdout and stderr together, in any order)."""
    changes: Counter[tuple[str, str]] = Counter()
    verdicts: Counter[str] = Counter()
    protected: Counter[str] = Counter()
    blocks: dict[str, list[str]] = {}
    current: list[str] | None = None
    lines = text.splitlines()
    for line in lines:
        title = line.rstrip().removesuffix(":")
        if line and not line[0].isspace():
            # A column-0 line ends the block before it; a known title starts a new one.
            current = None
            if line.rstrip().endswith(":") and title in BLOCKS:
                current = blocks.setdefault(title, [])
                current.append(line.rstrip())
                continue
        if current is not None:
            current.append(line.rstrip())
            if found := _VERDICT.match(line):
                verdicts[found.group("level")] += 1
            continue
        if found := _HEADER.match(line):
            changes[(found.group("op"), found.group("type"))] += 1
            if PROTECTED_MARK in found.group("marks"):
                protected[found.group("op")] += 1
    for title, block in blocks.items():
        while block and not block[-1].strip():
            block.pop()
        blocks[title] = block
    return EngineReport(changes=changes, blocks=blocks, verdicts=verdicts, protected=protected,
                        lines=len(lines))
