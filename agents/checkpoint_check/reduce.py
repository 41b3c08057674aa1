"""Sum fio results from many writers into one aggregate write bandwidth and a verdict.

Pure: text in, numbers out. Each result file is one node's ``fio --output-format=json`` run, with one
entry in ``jobs`` per writer (or a single entry when ``group_reporting`` merged them). fio reports each
writer's bandwidth over that writer's own runtime; the sum over writers is the aggregate the
filesystem sustained *if the writers overlapped*. The check's barrier starts them together, and the
reducer measures the overlap instead of trusting it: the wall-clock figure (all bytes over the span
from the first start to the last finish) is printed beside the sum, and a run whose writers did not
mostly overlap is inconclusive rather than a pass.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from enum import IntEnum
from typing import Any

GB = 1e9


class Verdict(IntEnum):
    """Exit codes of ``checkpoint-reduce``."""

    PASS = 0
    FAIL = 1
    ERROR = 2
    INCONCLUSIVE = 3


@dataclass(frozen=True)
class Writer:
    """One fio job (one writer, one file)."""

    source: str
    name: str
    bytes_written: int
    bw_bytes: float
    runtime_ms: int
    end_ms: int

    @property
    def start_ms(self) -> int:
        return self.end_ms - self.runtime_ms


class FioOutputError(ValueError):
    """A result file that is not fio JSON output, or reports a failed job."""


def _json_body(text: str) -> dict[str, Any]:
    """fio may print notes before the JSON document (e.g. on stdout); start at the first brace."""
    start = text.find("{")
    if start < 0:
        raise FioOutputError("no JSON object in fio output")
    try:
        body = json.loads(text[start:])
    except json.JSONDecodeError as error:
        raise FioOutputError(f"fio output is not valid JSON: {error}") from None
    if not isinstance(body, dict) or not isinstance(body.get("jobs"), list):
        raise FioOutputError("fio output has no 'jobs' list")
    return body


def parse_fio(text: str, source: str = "<fio>") -> list[Writer]:
    """The writers in one fio JSON document. A job with a non-zero ``error`` fails the whole file."""
    body = _json_body(text)
    end_ms = int(body.get("timestamp_ms") or int(body.get("timestamp", 0)) * 1000)
    writers = []
    for job in body["jobs"]:
        name = str(job.get("jobname", "?"))
        if job.get("error"):
            raise FioOutputError(f"{source}: fio job '{name}' failed with error {job['error']}")
        write = job.get("write") or {}
        io_bytes = int(write.get("io_bytes", 0))
        if io_bytes <= 0:
            continue  # a reader or an idle job: nothing written, nothing to sum
        bw_bytes = float(write.get("bw_bytes", float(write.get("bw", 0)) * 1024))
        runtime_ms = int(job.get("job_runtime") or write.get("runtime") or 0)
        writers.append(Writer(source, name, io_bytes, bw_bytes, runtime_ms, end_ms))
    return writers


@dataclass(frozen=True)
class Summary:
    writers: tuple[Writer, ...]
    budget_gbps: float
    min_overlap: float = 0.8

    @property
    def aggregate_gbps(self) -> float:
        """Sum of the writers' bandwidths (fio's convention for concurrent jobs)."""
        return sum(w.bw_bytes for w in self.writers) / GB

    @property
    def total_bytes(self) -> int:
        return sum(w.bytes_written for w in self.writers)

    @property
    def span_ms(self) -> int:
        return max(w.end_ms for w in self.writers) - min(w.start_ms for w in self.writers)

    @property
    def wall_clock_gbps(self) -> float:
        """All bytes over the time from the first writer's start to the last one's end (conservative)."""
        return self.total_bytes / GB / (self.span_ms / 1000) if self.span_ms > 0 else 0.0

    @property
    def overlap(self) -> float:
        """Fraction of the span during which every writer was running (1.0 = perfectly together)."""
        if not self.writers or self.span_ms <= 0:
            return 1.0
        common = min(w.end_ms for w in self.writers) - max(w.start_ms for w in self.writers)
        return max(common, 0) / self.span_ms

    @property
    def per_writer_gbps(self) -> float:
        return self.aggregate_gbps / len(self.writers) if self.writers else 0.0

    @property
    def verdict(self) -> Verdict:
        if not self.writers:
            return Verdict.ERROR
        if self.overlap < self.min_overlap:
            return Verdict.INCONCLUSIVE
        return Verdict.PASS if self.aggregate_gbps >= self.budget_gbps else Verdict.FAIL

    def report(self) -> str:
        lines = [
            f"writers: {len(self.writers)} in {len({w.source for w in self.writers})} result files",
            f"written: {self.total_bytes / GB:.3f} GB",
            f"aggregate: {self.aggregate_gbps:.3f} GB/s (sum of writer bandwidths)",
            f"per writer: {self.per_writer_gbps * 1000:.1f} MB/s",
            f"wall clock: {self.wall_clock_gbps:.3f} GB/s over {self.span_ms / 1000:.1f} s, "
            f"overlap {self.overlap:.0%}",
            f"budget: {self.budget_gbps:.3f} GB/s, margin {self.aggregate_gbps - self.budget_gbps:+.3f} GB/s",
        ]
        verdict = self.verdict
        if verdict is Verdict.INCONCLUSIVE:
            lines.append(f"INCONCLUSIVE: writers overlapped {self.overlap:.0%} < {self.min_overlap:.0%}; "
                         "the sum would overstate the aggregate")
        else:
            lines.append(verdict.name)
        return "\n".join(lines)


def summarize(writers: list[Writer], budget_gbps: float, min_overlap: float = 0.8) -> Summary:
    return Summary(tuple(writers), budget_gbps, min_overlap)
