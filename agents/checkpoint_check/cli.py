"""``checkpoint-reduce``: wait for every writer's fio result on the shared volume, then sum them.

Exit codes, one meaning each: 0 PASS (aggregate meets the budget), 1 FAIL (below the budget), 2 ERROR
(invalid input: missing, malformed or duplicated results, or bad arguments; the message names the
file and field), 3 INCONCLUSIVE (writers did not run together), 4 a bug in the reducer. Results are
``*.json`` files; writers write to a temporary name and rename, so a half-written file is never read.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path

from agents.checkpoint_check.contract import DEFAULT_MIN_OVERLAP, REDUCE_COMMAND
from agents.checkpoint_check.reduce import MAX_RESULT_BYTES, FioOutputError, Verdict, collect, summarize


def wait_for_results(directory: Path, expect: int, wait_seconds: float, poll_seconds: float = 2.0) -> list[Path]:
    """The result files once ``expect`` exist, or whatever exists when the wait runs out."""
    deadline = time.monotonic() + wait_seconds
    while True:
        files = sorted(directory.glob("*.json"))
        if len(files) >= expect or time.monotonic() >= deadline:
            return files
        time.sleep(poll_seconds)


def _bounded(name: str, low: float, high: float = math.inf, *, low_open: bool = False) -> Callable[[str], float]:
    """An argparse type: a finite number in [low, high] (or (low, high]); NaN and inf are refused."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} must be a number, got {text!r}") from None
        if not math.isfinite(value) or value < low or (low_open and value == low) or value > high:
            interval = f"{'(' if low_open else '['}{low:g}, {high:g}]"
            raise argparse.ArgumentTypeError(f"{name} must be a finite number in {interval}, got {text!r}")
        return value

    return parse


def _count(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"--expect must be a whole number >= 0, got {text!r}")
    return int(text)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=REDUCE_COMMAND, description=__doc__)
    parser.add_argument("results", type=Path, help="directory holding one fio JSON file per node")
    parser.add_argument("--budget-gbps", type=_bounded("--budget-gbps", 0.0, low_open=True), required=True,
                        help="aggregate GB/s needed to pass")
    parser.add_argument("--expect", type=_count, default=0, help="number of result files to wait for")
    parser.add_argument("--wait-seconds", type=_bounded("--wait-seconds", 0.0), default=0.0,
                        help="how long to wait for them")
    parser.add_argument("--min-overlap", type=_bounded("--min-overlap", 0.0, 1.0), default=DEFAULT_MIN_OVERLAP,
                        help="fraction of the run all writers must share for the sum to count")
    return parser


def _read(paths: list[Path]) -> Iterator[tuple[str, bytes]]:
    for path in paths:
        try:
            with path.open("rb") as handle:
                data = handle.read(MAX_RESULT_BYTES + 1)
        except OSError as error:
            raise FioOutputError(f"{path.name}: cannot read: {error.strerror or error}") from None
        if len(data) > MAX_RESULT_BYTES:
            raise FioOutputError(f"{path.name}: larger than {MAX_RESULT_BYTES} bytes, not a fio result")
        yield path.name, data


def run(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)  # bad arguments: argparse exits 2, which is ERROR
    files = wait_for_results(args.results, args.expect, args.wait_seconds)
    if args.expect and len(files) < args.expect:
        print(f"ERROR: {len(files)} of {args.expect} result files in {args.results}", file=sys.stderr)
        return int(Verdict.ERROR)
    try:
        writers = collect(_read(files), args.expect)
    except FioOutputError as error:
        print(f"ERROR: {error}", file=sys.stderr)
        return int(Verdict.ERROR)
    summary = summarize(writers, args.budget_gbps, args.min_overlap)
    print(summary.report())
    return int(summary.verdict)


def main(argv: list[str] | None = None) -> int:
    """:func:`run`, with any unforeseen exception turned into INTERNAL: Python's own exit status for an
    uncaught exception is 1, which the check would read as "below budget"."""
    try:
        return run(argv)
    except Exception:
        traceback.print_exc()
        print("INTERNAL ERROR: this is a bug in checkpoint-reduce, not a verdict", file=sys.stderr)
        return int(Verdict.INTERNAL)


if __name__ == "__main__":
    sys.exit(main())
