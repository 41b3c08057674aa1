"""``checkpoint-reduce``: wait for every writer's fio result on the shared volume, then sum them.

Exit codes: 0 PASS (aggregate meets the budget), 1 FAIL, 2 ERROR (missing or broken results),
3 INCONCLUSIVE (writers did not run together). Results are ``*.json`` files; writers write to a
temporary name and rename, so a half-written file is never read.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from agents.checkpoint_check.reduce import FioOutputError, Verdict, Writer, parse_fio, summarize


def wait_for_results(directory: Path, expect: int, wait_seconds: float, poll_seconds: float = 2.0) -> list[Path]:
    """The result files once ``expect`` exist, or whatever exists when the wait runs out."""
    deadline = time.monotonic() + wait_seconds
    while True:
        files = sorted(directory.glob("*.json"))
        if len(files) >= expect or time.monotonic() >= deadline:
            return files
        time.sleep(poll_seconds)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="checkpoint-reduce", description=__doc__)
    parser.add_argument("results", type=Path, help="directory holding one fio JSON file per node")
    parser.add_argument("--budget-gbps", type=float, required=True, help="aggregate GB/s needed to pass")
    parser.add_argument("--expect", type=int, default=0, help="number of result files to wait for")
    parser.add_argument("--wait-seconds", type=float, default=0.0, help="how long to wait for them")
    parser.add_argument("--min-overlap", type=float, default=0.8,
                        help="fraction of the run all writers must share for the sum to count")
    args = parser.parse_args(argv)

    files = wait_for_results(args.results, args.expect, args.wait_seconds)
    if args.expect and len(files) < args.expect:
        print(f"ERROR: {len(files)} of {args.expect} result files in {args.results}", file=sys.stderr)
        return int(Verdict.ERROR)
    writers: list[Writer] = []
    try:
        for path in files:
            writers += parse_fio(path.read_text(), source=path.name)
    except (OSError, FioOutputError) as error:
        print(f"ERROR: {error}", file=sys.stderr)
        return int(Verdict.ERROR)
    summary = summarize(writers, args.budget_gbps, args.min_overlap)
    if not writers:
        print(f"ERROR: no writes found in {args.results}", file=sys.stderr)
        return int(Verdict.ERROR)
    print(summary.report())
    return int(summary.verdict)


if __name__ == "__main__":
    sys.exit(main())
