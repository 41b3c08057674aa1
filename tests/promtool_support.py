"""promtool unit tests of the alert rules: input series, expected alerts with their annotations expanded.

Shared by the rule tests on hand-written series (``test_alert_rules``) and on the series that arrive through
the scrape path (``test_scrape_path``). promtool comes from Debian's prometheus package
(``make observability-tools``).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import yaml

PROMTOOL = shutil.which("promtool")


def promtool() -> str:
    assert PROMTOOL is not None, "promtool missing: run `make observability-tools` (Debian prometheus package)"
    return PROMTOOL


def series(name: str, labels: dict[str, str], values: str) -> dict[str, str]:
    """One promtool input series: ``name{labels}`` with promtool's expanding value notation."""
    inner = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    return {"series": f"{name}{{{inner}}}", "values": values}


def _humanize(value: float) -> str:
    prefixes = ["", "k", "M", "G", "T", "P"]
    i = 0
    while abs(value) >= 1000 and i < len(prefixes) - 1:
        value /= 1000
        i += 1
    return f"{value:.4g}{prefixes[i]}"


def _go_value(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(value)


def expand(template: str, labels: dict[str, str], value: float) -> str:
    """The subset of Go templating our annotations use: $labels.x, $value, $value | humanize."""
    text = re.sub(r"\{\{ \$labels\.(\w+) \}\}", lambda m: labels.get(m.group(1), ""), template)
    text = text.replace("{{ $value | humanize }}", _humanize(value))
    text = text.replace("{{ $value | humanizePercentage }}", f"{value * 100:.4g}%")
    text = text.replace("{{ $value }}", _go_value(value))
    assert "{{" not in text, text
    return text


def rule(spec: dict[str, Any], name: str) -> dict[str, Any]:
    return next(r for g in spec["groups"] for r in g["rules"] if r["alert"] == name)


def expected_alert(spec: dict[str, Any], name: str, labels: dict[str, str], value: float) -> dict[str, Any]:
    """promtool's ``exp_alerts`` entry: the alert's labels plus the rule's, its annotations expanded."""
    r = rule(spec, name)
    return {
        "exp_labels": {**labels, **r["labels"]},
        "exp_annotations": {k: expand(v, labels, value) for k, v in r["annotations"].items()},
    }


def run_unit_test(rules_file: Path, test_file: Path, input_series: list[dict[str, str]],
                  checks: list[dict[str, Any]], interval: str = "15s") -> subprocess.CompletedProcess[str]:
    """Write and run one promtool test (``checks`` are ``alert_rule_test`` entries)."""
    test_file.write_text(yaml.safe_dump({
        "rule_files": [str(rules_file)],
        "evaluation_interval": interval,
        "tests": [{"interval": interval, "input_series": input_series, "alert_rule_test": checks}],
    }, sort_keys=False))
    return subprocess.run([promtool(), "test", "rules", str(test_file)], capture_output=True, text=True)
