"""How the CLI prints, the way kubectl does: tables drawn for a terminal and plain columns for a pipe,
``-o json|yaml`` for scripts, ``-o name`` for ``xargs``, and durations such as ``5m`` for ``--since``."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from typing import Any

import click
import yaml
from rich.console import Console
from rich.table import Table

FORMATS = ("json", "yaml")
#: kubectl's ``-o name``: one ``kind.group/name`` line per object.
NAME = "name"
_DURATION = re.compile(r"(\d+)([smhd])")
_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def table(console: Console, headers: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    """A drawn table on a terminal; on a pipe kubectl's plain columns (space-padded, no box characters), so
    ``| awk``/``| grep`` see one row per line."""
    if console.is_terminal:
        drawn = Table(*headers)
        for row in rows:
            drawn.add_row(*row)
        console.print(drawn)
        return
    widths = [max(len(str(cell)) for cell in column) for column in zip(headers, *rows, strict=False)]
    for line in (headers, *rows):
        text = "   ".join(str(cell).ljust(width) for cell, width in zip(line, widths, strict=False)).rstrip()
        console.print(text, markup=False, highlight=False)


def dump(value: Any, fmt: str) -> str:
    """``value`` as ``json`` (indented, as kubectl) or ``yaml``."""
    if fmt == "json":
        return json.dumps(value, indent=2, sort_keys=False) + "\n"
    return yaml.safe_dump(value, sort_keys=False)


def resource_name(kind: str, api_version: str, name: str) -> str:
    """kubectl's ``-o name`` form: ``pod/x`` for the core group, ``job.batch.volcano.sh/x`` for others."""
    group = api_version.rpartition("/")[0]
    return f"{kind.lower()}.{group}/{name}" if group else f"{kind.lower()}/{name}"


def name_lines(objects: Iterable[tuple[str, str, dict[str, Any]]]) -> str:
    """``-o name`` lines for ``(kind, apiVersion, object)``; list items from the API carry no kind of their own."""
    return "".join(resource_name(kind, version, obj["metadata"]["name"]) + "\n" for kind, version, obj in objects)


def parse_duration(text: str) -> int:
    """``90s``, ``5m``, ``1h30m``, ``2d`` → seconds; anything else is a usage error naming the value."""
    matched = "".join(m.group(0) for m in _DURATION.finditer(text))
    if not text or matched != text:
        raise click.BadParameter(f"must be a duration such as 30s, 5m or 1h30m, got {text!r}")
    seconds = sum(int(n) * _SECONDS[unit] for n, unit in _DURATION.findall(text))
    if seconds <= 0:
        raise click.BadParameter(f"must be longer than 0s, got {text!r}")
    return seconds
