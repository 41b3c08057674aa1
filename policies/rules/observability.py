"""Observability rules: thermal alerts at the configured limit, DCGM exporting the counters the agents need."""

from __future__ import annotations

import re

from policies.rules.core import MANDATORY, Resource, RuleContext, as_map, as_seq, rule

REQUIRED_DCGM_COUNTERS = ("DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE")


_TEMP_COMPARISON = re.compile(r"DCGM_FI_DEV_GPU_TEMP\b[^<>\n]*?(?P<op>>=|>)\s*(?P<value>\d+(\.\d+)?)")


@rule(
    "thermal-alert-threshold",
    "GPU temperature alerts fire at or below the configured thermal limit.",
    MANDATORY,
    "a GPU above the limit throttles silently and slows the whole gang",
)
def check_thermal_alert(res: Resource, ctx: RuleContext) -> list[str]:
    if res.kind != "PrometheusRule":
        return []
    out = []
    for group in (as_map(g) for g in as_seq(as_map(res.props.get("spec")).get("groups"))):
        for entry in (as_map(r) for r in as_seq(group.get("rules"))):
            expr = str(entry.get("expr") or "")
            for match in _TEMP_COMPARISON.finditer(expr):
                if float(match["value"]) > ctx.thermal_limit_celsius:
                    out.append(
                        f"rule '{entry.get('alert') or entry.get('record')}' in group '{group.get('name')}' compares "
                        f"GPU temperature {match['op']} {match['value']} °C, above the configured limit of "
                        f"{ctx.thermal_limit_celsius:g} °C; use observability.thermalThresholdCelsius "
                        "instead of a literal"
                    )
    return out


def dcgm_counters(res: Resource) -> dict[str, set[str]]:
    """Data keys of a ConfigMap that hold DCGM counter CSVs, with the counters they enable."""
    found: dict[str, set[str]] = {}
    if res.kind != "ConfigMap":
        return found
    for key, text in as_map(res.props.get("data")).items():
        if not isinstance(text, str):
            continue
        fields = {
            line.split(",", 1)[0].strip()
            for line in text.splitlines()
            if line.strip().startswith("DCGM_") and "," in line
        }
        if fields:
            found[str(key)] = fields
    return found


@rule(
    "dcgm-counters",
    "DCGM counter CSVs include DCGM_FI_DEV_GPU_TEMP and DCGM_FI_PROF_PIPE_TENSOR_ACTIVE.",
    MANDATORY,
    "the thermal guard and the utilization that does not lie depend on them",
)
def check_dcgm_counters(res: Resource, ctx: RuleContext) -> list[str]:
    out = []
    for key, fields in dcgm_counters(res).items():
        missing = [c for c in REQUIRED_DCGM_COUNTERS if c not in fields]
        if missing:
            out.append(f"data.{key}: the DCGM counters CSV lacks {', '.join(missing)}; add a line "
                       f"'{missing[0]}, gauge, …' — temperature drives the thermal guard and tensor activity "
                       "is the utilization that does not lie")
    return out
