"""Malformed (and a few well-formed) fio result sets for ``checkpoint-reduce``, each with its exit code.

A case is a results directory (file name → raw bytes), the reducer's extra arguments, the exit code it
must produce (0 within budget, 1 below budget, 2 invalid input, 3 inconclusive) and fragments its
message must contain: for invalid input, the file and the field. :func:`run_case` runs the real
console entry point in a fresh interpreter, so a crash shows up as the exit code Python gives it (1,
which is the "below budget" verdict: the bug this corpus exists to keep fixed).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[3]
BUDGET = ("--budget-gbps", "1")


def job(name: str = "w0", **overrides: Any) -> dict[str, Any]:
    """One writer at 2 GB/s for 5 s; ``write_<key>`` overrides a key of the write section, ``None`` drops it."""
    doc: dict[str, Any] = {
        "jobname": name,
        "error": 0,
        "job_runtime": 5000,
        "write": {"io_bytes": 10 * 10**9, "bw_bytes": 2 * 10**9, "bw": 1953125, "runtime": 5000},
    }
    for key, value in overrides.items():
        target, name_ = (doc["write"], key[6:]) if key.startswith("write_") else (doc, key)
        if value is None:
            target.pop(name_, None)
        else:
            target[name_] = value
    return doc


def doc(*jobs: dict[str, Any], **top: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"fio version": "fio-3.33", "timestamp": 1_000, "timestamp_ms": 1_000_000,
                            "jobs": list(jobs) if jobs else [job()]}
    for key, value in top.items():
        if value is None:
            body.pop(key, None)
        else:
            body[key] = value
    return body


def js(value: Any) -> bytes:
    return json.dumps(value).encode()


def raw(template: Any, marker: str, text: str) -> bytes:
    """JSON of ``template`` with the string ``marker`` replaced by raw JSON ``text`` (NaN, 1e400…)."""
    return js(template).replace(f'"{marker}"'.encode(), text.encode())


@dataclass(frozen=True)
class Case:
    name: str
    files: dict[str, bytes]
    exit: int
    message: tuple[str, ...] = ()
    """Fragments of stderr (invalid input) or stdout (verdicts)."""
    args: tuple[str, ...] = BUDGET
    dirs: tuple[str, ...] = field(default=())
    """Entries of the results directory that are directories, not files."""


OK = js(doc())

CASES: tuple[Case, ...] = (
    # ------------------------------------------------------------------ controls: the three verdicts
    Case("within_budget", {"0.json": OK}, 0, ("PASS",)),
    Case("below_budget", {"0.json": OK}, 1, ("FAIL",), ("--budget-gbps", "100")),
    Case("notes_before_json", {"0.json": b"note: iodepth ignored\n" + OK}, 0, ("PASS",)),
    Case("note_after_json", {"0.json": OK + b"\nfio: file hash not empty on exit\n"}, 0, ("PASS",)),
    Case("note_with_brace_before_json", {"0.json": b"note: {iodepth} capped to 1 {\n" + OK}, 0, ("PASS",)),
    Case("note_starting_with_brace_before_json", {"0.json": b"{not json}\n" + OK + b"\n"}, 0, ("PASS",)),
    Case("notes_on_both_sides", {"0.json": b"a { b\n" + OK + b"\nbye }\n"}, 0, ("PASS",)),
    Case("reader_job_beside_writer", {"0.json": js(doc(job(), job("r", write_io_bytes=0, write_bw_bytes=0)))},
         0, ("writers: 1 in 1",)),
    Case("bw_kib_only", {"0.json": js(doc(job(write_bw_bytes=None)))}, 0, ("PASS",)),
    Case("two_nodes_overlapping", {"0.json": OK, "1.json": js(doc(job("w1")))}, 0, ("writers: 2 in 2",)),
    Case("not_overlapping", {"0.json": OK, "1.json": js(doc(timestamp_ms=2_000_000))}, 3, ("INCONCLUSIVE",)),
    # ------------------------------------------------------------------ not JSON at all
    Case("not_utf8", {"0.json": b"\xff\xfe" + OK}, 2, ("0.json", "UTF-8")),
    Case("latin1_jobname", {"0.json": OK.replace(b'"w0"', b'"w\xe9"')}, 2, ("0.json", "UTF-8")),
    Case("empty_file", {"0.json": b""}, 2, ("0.json", "no JSON object")),
    Case("not_json", {"0.json": b"fio: engine libaio not loadable\n"}, 2, ("0.json", "no JSON object")),
    Case("truncated_json", {"0.json": OK[:-7]}, 2, ("0.json", "not valid JSON")),
    Case("trailing_garbage", {"0.json": OK + b"}"}, 2, ("0.json", "not valid JSON")),
    Case("duplicate_keys", {"0.json": b'{"timestamp_ms": 1, "jobs": [], "jobs": []}'}, 2, ("0.json", "jobs", "twice")),
    Case("huge_integer_literal", {"0.json": raw(doc(job(write_io_bytes="X")), "X", "9" * 5000)}, 2,
         ("0.json", "JSON")),
    Case("deeply_nested", {"0.json": b'{"jobs": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"}, 2, ("0.json",)),
    # ------------------------------------------------------------------ shape
    Case("top_level_array", {"0.json": b"[" + OK + b"]"}, 2, ("0.json", "not valid JSON")),
    Case("jobs_not_a_list", {"0.json": js(doc(jobs=3))}, 2, ("0.json", "jobs")),
    Case("jobs_empty", {"0.json": js(doc(jobs=[]))}, 2, ("no writes",)),
    Case("job_not_an_object", {"0.json": js(doc(jobs=[3]))}, 2, ("0.json", "jobs[0]")),
    Case("write_not_an_object", {"0.json": js(doc(job(write=[1])))}, 2, ("0.json", "jobs[0].write")),
    Case("write_missing", {"0.json": OK, "1.json": js(doc(job(write=None)))}, 2, ("1.json", "jobs[0].write")),
    # ------------------------------------------------------------------ missing fields
    Case("io_bytes_missing", {"0.json": js(doc(job(write_io_bytes=None)))}, 2, ("0.json", "jobs[0].write.io_bytes")),
    Case("bandwidth_missing", {"0.json": js(doc(job(write_bw_bytes=None, write_bw=None)))}, 2,
         ("0.json", "jobs[0].write.bw_bytes")),
    Case("runtime_missing", {"0.json": js(doc(job(job_runtime=None, write_runtime=None)))}, 2,
         ("0.json", "jobs[0].job_runtime")),
    Case("timestamp_missing", {"0.json": js(doc(timestamp_ms=None, timestamp=None))}, 2, ("0.json", "timestamp_ms")),
    Case("jobname_missing", {"0.json": js(doc(job(jobname=None)))}, 2, ("0.json", "jobs[0].jobname")),
    Case("error_missing", {"0.json": js(doc(job(error=None)))}, 2, ("0.json", "jobs[0].error")),
    # ------------------------------------------------------------------ wrong types
    Case("io_bytes_string", {"0.json": js(doc(job(write_io_bytes="10000000000")))}, 2,
         ("0.json", "jobs[0].write.io_bytes", "integer")),
    Case("io_bytes_float", {"0.json": js(doc(job(write_io_bytes=10.5)))}, 2, ("0.json", "jobs[0].write.io_bytes")),
    Case("io_bytes_bool", {"0.json": js(doc(job(write_io_bytes=True)))}, 2, ("0.json", "jobs[0].write.io_bytes")),
    Case("bw_bytes_string", {"0.json": js(doc(job(write_bw_bytes="fast")))}, 2, ("0.json", "jobs[0].write.bw_bytes")),
    Case("timestamp_string", {"0.json": js(doc(timestamp_ms="now"))}, 2, ("0.json", "timestamp_ms")),
    Case("jobname_number", {"0.json": js(doc(job(jobname=7)))}, 2, ("0.json", "jobs[0].jobname")),
    Case("error_string", {"0.json": js(doc(job(error="EIO")))}, 2, ("0.json", "jobs[0].error")),
    Case("job_failed", {"0.json": js(doc(job(error=5)))}, 2, ("0.json", "'w0'", "error 5")),
    # ------------------------------------------------------------------ numbers out of range
    Case("bw_nan", {"0.json": raw(doc(job(write_bw_bytes="X")), "X", "NaN")}, 2, ("0.json", "jobs[0].write.bw_bytes")),
    Case("bw_infinity", {"0.json": raw(doc(job(write_bw_bytes="X")), "X", "Infinity")}, 2,
         ("0.json", "jobs[0].write.bw_bytes")),
    Case("bw_beyond_float", {"0.json": raw(doc(job(write_bw_bytes="X")), "X", "1e400")}, 2,
         ("0.json", "jobs[0].write.bw_bytes")),
    Case("bw_negative", {"0.json": js(doc(job(write_bw_bytes=-2 * 10**9)))}, 2, ("0.json", "jobs[0].write.bw_bytes")),
    Case("io_bytes_negative", {"0.json": js(doc(job(write_io_bytes=-1)))}, 2, ("0.json", "jobs[0].write.io_bytes")),
    Case("runtime_negative", {"0.json": js(doc(job(job_runtime=-5000)))}, 2, ("0.json", "jobs[0].job_runtime")),
    Case("timestamp_beyond_float", {"0.json": raw(doc(timestamp_ms="X"), "X", "1e400")}, 2, ("0.json", "timestamp_ms")),
    Case("timestamp_negative", {"0.json": js(doc(timestamp_ms=-1))}, 2, ("0.json", "timestamp_ms")),
    # ------------------------------------------------------------------ the result set
    Case("duplicate_result_files", {"0.json": OK, "1.json": OK}, 2, ("1.json", "duplicate of 0.json")),
    Case("more_results_than_expected", {"0.json": OK, "1.json": js(doc(job("w1")))}, 2,
         ("2 result files", "expected 1"), (*BUDGET, "--expect", "1")),
    Case("fewer_results_than_expected", {"0.json": OK}, 2, ("1 of 2 result files",), (*BUDGET, "--expect", "2")),
    Case("result_is_a_directory", {"0.json": OK}, 2, ("1.json",), dirs=("1.json",)),
    Case("no_results", {}, 2, ("no result files",)),
    # ------------------------------------------------------------------ arguments
    Case("budget_nan", {"0.json": OK}, 2, ("--budget-gbps",), ("--budget-gbps", "nan")),
    Case("budget_infinite", {"0.json": OK}, 2, ("--budget-gbps",), ("--budget-gbps", "inf")),
    Case("budget_negative", {"0.json": OK}, 2, ("--budget-gbps",), ("--budget-gbps", "-1")),
    Case("min_overlap_above_one", {"0.json": OK}, 2, ("--min-overlap",), (*BUDGET, "--min-overlap", "5")),
    Case("expect_negative", {"0.json": OK}, 2, ("--expect",), (*BUDGET, "--expect", "-1")),
)


def write_results(case: Case, root: Path) -> Path:
    results = root / "results"
    results.mkdir()
    for name, content in case.files.items():
        (results / name).write_bytes(content)
    for name in case.dirs:
        (results / name).mkdir()
    return results


def run_case(case: Case, impl: Path = REPO) -> tuple[int, str, str]:
    """Run ``checkpoint-reduce`` (imported from ``impl``) on the case in a fresh interpreter."""
    with tempfile.TemporaryDirectory(prefix="fio-corpus-") as root:
        results = write_results(case, Path(root))
        code = "import sys; from agents.checkpoint_check.cli import main; sys.exit(main(sys.argv[1:]))"
        env = {**os.environ, "PYTHONPATH": str(impl)}
        done = subprocess.run([sys.executable, "-c", code, str(results), *case.args],
                              capture_output=True, text=True, env=env, check=False, cwd=root)
    return done.returncode, done.stdout, done.stderr
