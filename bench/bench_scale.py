"""The stack at production size on the local control plane (`make bench-scale`): gangs, API server cost, footprint.

The runs take many minutes per shape, so `make bench` reports what the last `make bench-scale` wrote
(``.state/scale/results.json``, one entry per shape) rather than running it again; the report says when it has
not run. Every figure is measured on this machine's control plane (kwok nodes, real API server, etcd and Volcano).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent.parent / ".state" / "scale" / "results.json"
#: The published anchors the figures stand beside (DESIGN.md, fourth round).
ANCHORS = {
    "gang_bind_goal_s": 30.0,
    "apiserver_mutating_slo_s": 1.0,
}


def run(path: Path = RESULTS) -> dict[str, Any]:
    if not path.is_file():
        return {"status": "not run here: run `make bench-scale` first"}
    data: dict[str, Any] = json.loads(path.read_text())
    return {"anchors": ANCHORS, "shapes": data.get("shapes", {})}


def _cell(stats: dict[str, Any] | None, key: str) -> str:
    return "–" if not stats or key not in stats else f"{stats[key]:.1f}"


def to_markdown(result: dict[str, Any]) -> str:
    if "shapes" not in result:
        return str(result.get("status", "no results"))
    lines = [
        "Each shape runs on this machine's control plane: etcd, the API server, the controller manager, kwok for the",
        "nodes, Volcano's scheduler and controllers; the stack's own objects applied; gangs of 8-GPU pods submitted",
        "through `gpucluster train submit`, one after the other. Times in seconds from the submit.",
        "",
        "| shape | nodes | GPUs | up (s) | gang pods | runs | created p50 | bound p50 | bound p99 | Running p50 "
        "| Running p99 | deleted p50 |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, shape in result["shapes"].items():
        for size, gang in shape.get("gangs", {}).items():
            lines.append(
                f"| {name} | {shape['nodes']:,} | {shape['gpus']:,} | {shape['up_s']} | {int(size):,} | "
                f"{gang['bound']['n']} | {_cell(gang.get('created'), 'p50')} | {_cell(gang['bound'], 'p50')} | "
                f"{_cell(gang['bound'], 'p99')} | {_cell(gang['running'], 'p50')} | {_cell(gang['running'], 'p99')} | "
                f"{_cell(gang.get('deleted'), 'p50')} |")
    goal = result["anchors"]["gang_bind_goal_s"]
    lines += ["", f"Goal: a 2,048-pod gang bound in under {goal:.0f} s p99.", ""]
    for name, shape in result["shapes"].items():
        p99 = shape.get("apiserver_mutating_p99_s")
        lines += [f"**{name}** (measured {shape.get('measured', '?')}): mutating API calls p99 "
                  f"{'–' if p99 is None else f'{p99:.3f} s'} over the gang runs (SLO ≤ "
                  f"{result['anchors']['apiserver_mutating_slo_s']:.0f} s); stack objects applied "
                  f"{shape.get('objects_applied')}, left out {shape.get('objects_left_out')}.", ""]
        agents = shape.get("requests_per_s_by_agent") or {}
        if agents:
            lines += ["| agent | requests/s | mutating/s | requests |", "|---|---|---|---|"]
            lines += [f"| {a} | {v['requests_per_s']} | {v['mutating_per_s']} | {v['requests']:,} |"
                      for a, v in list(agents.items())[:12]]
            lines.append("")
        usage = shape.get("process_usage_after") or {}
        if usage:
            lines += ["| process | RSS MiB at rest | RSS MiB after the gangs | CPU s (total) |", "|---|---|---|---|"]
            rest = shape.get("process_usage_at_rest") or {}
            lines += [f"| {p} | {rest.get(p, {}).get('rss_mib', '–')} | {u['rss_mib']} | {u['cpu_s']} |"
                      for p, u in usage.items()]
            lines.append("")
        tuning = shape.get("tuning") or []
        if tuning:
            lines += ["Control-plane settings for this size:", ""]
            lines += [f"- `{t['component']} {t['flag']}`: {t['why']}" for t in tuning]
            lines.append("")
    return "\n".join(lines)
