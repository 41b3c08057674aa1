"""Reading the stack's Grafana dashboards as a test needs them: their queries, variables and selectors.

The unit tests (``tests/test_observability_component.py``) and the scrape-path test (``tests/test_scrape_path.py``)
judge the same queries, one on the model, one on the series that arrive; both read them through here.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from components.mockrt import RunResult

CONFIGMAPS = ("gpu-fleet-dashboard", "gpu-health-dashboard")

#: Grafana's own variables (``$__interval``, ``${__field.labels.node}``, ``${__url_time_range}``…).
BUILTIN_PREFIX = "__"
_REF = re.compile(r"\$(?:\{(\w+)[^}]*\}|(\w+))")
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
_KEYWORDS = {"or", "and", "unless", "bool", "offset"}
_SELECTOR = re.compile(r"\b([A-Za-z_:][\w:]*)\s*(\{[^}]*\})?\s*(\()?")
_MATCHER = re.compile(r'(\w+)\s*(=~|!~|!=|=)\s*"([^"]*)"')
_LABEL_VALUES = re.compile(r"^label_values\((.*),\s*(\w+)\)$", re.S)
_QUERY_RESULT = re.compile(r"^query_result\((.*)\)$", re.S)


def boards(result: RunResult) -> dict[str, dict[str, Any]]:
    """The stack's dashboards by uid, as its ConfigMaps ship them."""
    found = {}
    for name in CONFIGMAPS:
        board = json.loads(next(iter(result.one("ConfigMap", name).inputs["data"].values())))
        found[board["uid"]] = board
    return found


@dataclass(frozen=True)
class Query:
    where: str
    expr: str
    legend: str = ""
    kind: str = ""


def queries(board: dict[str, Any]) -> list[Query]:
    """Every panel target and annotation query of ``board``."""
    found = [Query(f"{board['uid']} / {p['title']} / {t['refId']}", t["expr"], t.get("legendFormat", ""), p["type"])
             for p in board["panels"] for t in p.get("targets", [])]
    found += [Query(f"{board['uid']} / annotation {a['name']}", a["expr"], kind="annotation")
              for a in board.get("annotations", {}).get("list", []) if "expr" in a]
    return found


def query_variables(board: dict[str, Any]) -> list[dict[str, Any]]:
    return [v for v in board["templating"]["list"] if v["type"] == "query"]


def references(text: str) -> set[str]:
    """Dashboard variables ``text`` refers to (``$name``, ``${name}``, ``${name:format}``), Grafana's own left out."""
    names = {a or b for a, b in _REF.findall(text)}
    return {n for n in names if not n.startswith(BUILTIN_PREFIX)}


def interpolate(text: str, values: dict[str, str]) -> str:
    """``text`` with each ``$name`` replaced by the regex ``values`` gives it (what Grafana sends Prometheus)."""
    return _REF.sub(lambda m: values[m.group(1) or m.group(2)], text)


def all_values(board: dict[str, Any]) -> dict[str, str]:
    """What each variable stands for when "All" is selected."""
    return {v["name"]: v["allValue"] for v in query_variables(board)}


def selectors(expr: str) -> list[tuple[str, dict[str, tuple[str, str]]]]:
    """(metric, {label: (operator, value)}) for every series selector in a PromQL expression.

    Not a parser: enough for the dashboards' queries (no string arguments outside selectors)."""
    text = re.sub(r"\[[^\]]*\]", "", _GROUPING.sub("", expr))
    found = []
    for name, braces, call in _SELECTOR.findall(text):
        if call or name in _KEYWORDS:
            continue
        found.append((name, {k: (op, v) for k, op, v in _MATCHER.findall(braces)}))
    return found


def variable_selectors(query: str) -> list[tuple[str, dict[str, tuple[str, str]]]]:
    """The series selectors a ``label_values(...)`` or ``query_result(...)`` variable query reads."""
    if m := _LABEL_VALUES.match(query):
        return selectors(m.group(1))
    if m := _QUERY_RESULT.match(query):
        return selectors(m.group(1))
    raise AssertionError(f"not a label_values or query_result query: {query}")


def variable_promql(variable: dict[str, Any]) -> tuple[str, str | None, str | None]:
    """(instant query, label, regex) that evaluate a variable query the way Grafana does: ``label_values``
    reads one label of the selected series, ``query_result`` runs the query and applies the regex to each
    result written as ``{labels} value``."""
    query = variable["query"]
    if m := _LABEL_VALUES.match(query):
        return f"group by ({m.group(2)}) ({m.group(1)})", m.group(2), None
    m = _QUERY_RESULT.match(query)
    assert m, query
    return m.group(1), None, variable["regex"].strip("/")
