"""`make bench`: run every bench/bench_*.py module's `run()` and gather the results.

Writes bench/report.json (every result, plus status and duration per module) and bench/report.md (a section
per module: its own `to_markdown(result)` when it has one, generic tables otherwise). A module that fails to
import or raises is reported as failed with its error — never silently left out. The plots a module draws are
copied beside the report (``PLOTS``), which report.md references.

``--only a,b --merge`` reruns only those modules and keeps every other entry of the report already there, each with
the time it was measured: the end-to-end figures (``bench_e2e``, ``bench_sim_vs_e2e``) can follow a later
``make e2e`` without running the simulator again.
"""

from __future__ import annotations

import argparse
import importlib
import json
import platform
import shutil
import sys
import time
import traceback
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
#: The plot each module draws, copied beside the report under this name (report.md references it there).
PLOTS = {"bench_sim": "sim.png", "bench_scale": "scale.png"}


def discover(bench_dir: Path = BENCH_DIR) -> list[str]:
    """Module names of every benchmark, in name order."""
    return [f"bench.{p.stem}" for p in sorted(bench_dir.glob("bench_*.py"))]


def run_module(name: str) -> dict[str, Any]:
    started = time.perf_counter()
    try:
        module = importlib.import_module(name)
        result = module.run()
        if not isinstance(result, dict):
            raise TypeError(f"run() returned {type(result).__name__}, expected a dict")
        status, error = "ok", None
    except BaseException as exc:  # a benchmark may fail in any way; the report must say so
        if isinstance(exc, KeyboardInterrupt):
            raise
        result, status = {}, "failed"
        error = "".join(traceback.format_exception_only(type(exc), exc)).strip()
        traceback.print_exc()
    return {"status": status, "seconds": round(time.perf_counter() - started, 2), "error": error, "result": result}


def _scalar_table(items: dict[str, Any]) -> list[str]:
    lines = ["| key | value |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in items.items()]
    return lines


def generic_markdown(result: dict[str, Any]) -> str:
    """Scalars as one key/value table; each dict of dicts as a table with one row per key."""
    scalars = {k: v for k, v in result.items() if not isinstance(v, dict | list)}
    lines = _scalar_table(scalars) if scalars else []
    for key, value in result.items():
        if isinstance(value, dict) and value and all(isinstance(v, dict) for v in value.values()):
            columns: list[str] = []
            for row in value.values():
                columns += [c for c in row if c not in columns]
            lines += ["", f"**{key}**", "", "| " + " | ".join([key, *columns]) + " |"]
            lines.append("|" + "---|" * (len(columns) + 1))
            for name, row in value.items():
                lines.append("| " + " | ".join([str(name)] + [str(row.get(c, "")) for c in columns]) + " |")
        elif isinstance(value, dict):
            lines += ["", f"**{key}**", "", *_scalar_table(value)]
    return "\n".join(lines)


def section(name: str, entry: dict[str, Any]) -> str:
    head = f"## {name.removeprefix('bench.')} — {entry['status']} ({entry['seconds']} s, measured {entry['measured']})"
    if entry["status"] != "ok":
        return f"{head}\n\nFAILED:\n\n```text\n{entry['error']}\n```"
    # A kept entry (--merge) was not run here: its module is imported to render as it does.
    module = sys.modules.get(name) or importlib.import_module(name)
    render = getattr(module, "to_markdown", None)
    body = render(entry["result"]) if callable(render) else generic_markdown(entry["result"])
    return f"{head}\n\n{body}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench", description=__doc__)
    parser.add_argument("--only", help="comma-separated module names (bench_sim,…); default: all")
    parser.add_argument("--out-dir", type=Path, default=BENCH_DIR)
    parser.add_argument("--merge", action="store_true",
                        help="with --only: keep the other modules' entries of the existing report.json")
    args = parser.parse_args(argv)
    if args.merge and not args.only:
        parser.error("--merge needs --only: the modules to run again")
    every = discover()
    names = every
    if args.only:
        wanted = {f"bench.{n.strip().removeprefix('bench.')}" for n in args.only.split(",")}
        names = [n for n in every if n in wanted]
    report: dict[str, Any] = {
        "generated": datetime.now(UTC).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "machine": platform.machine(),
        "benchmarks": {},
    }
    kept: dict[str, Any] = {}
    if args.merge:
        previous = args.out_dir / "report.json"
        if not previous.is_file():
            parser.error(f"--merge: {previous} does not exist; run every module first")
        old = json.loads(previous.read_text(encoding="utf-8"))
        kept = {n: {**e, "measured": e.get("measured", old.get("generated"))} for n, e in old["benchmarks"].items()}
    for name in every:
        short = name.removeprefix("bench.")
        if name not in names:
            if short in kept:
                report["benchmarks"][short] = kept[short]
            continue
        print(f"bench: {name} …", flush=True)
        entry = run_module(name)
        entry["measured"] = report["generated"]
        report["benchmarks"][short] = entry
        print(f"bench: {name} {entry['status']} in {entry['seconds']} s", flush=True)
    out = args.out_dir
    out.mkdir(parents=True, exist_ok=True)
    for short, name in PLOTS.items():
        result = report["benchmarks"].get(short, {}).get("result", {})
        if result.get("plot") and Path(result["plot"]).is_file():
            shutil.copyfile(result["plot"], out / name)
            result["plot"] = name
    (out / "report.json").write_text(json.dumps(report, indent=2, sort_keys=False) + "\n", encoding="utf-8")
    failed = [n for n, e in report["benchmarks"].items() if e["status"] != "ok"]
    md = ["# Benchmarks", "", f"Generated {report['generated']} by `make bench` (Python {report['python']}, "
          f"{report['machine']}). Modules: {len(report['benchmarks'])}, failed: {len(failed)}"
          + (f" ({', '.join(failed)})" if failed else "") + ".", ""]
    md += [section(f"bench.{n}", e) + "\n" for n, e in report["benchmarks"].items()]
    (out / "report.md").write_text("\n".join(md), encoding="utf-8")
    print(f"bench: wrote {out / 'report.json'} and {out / 'report.md'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
