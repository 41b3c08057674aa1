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
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass
from enum import IntEnum
from typing import Any

GB = 1e9


class Verdict(IntEnum):
    """Exit codes of ``checkpoint-reduce``; each means one thing and nothing else produces it."""

    PASS = 0
    """The aggregate meets the budget."""
    FAIL = 1
    """The aggregate is below the budget."""
    ERROR = 2
    """Invalid input: missing, malformed or duplicated results, or bad arguments."""
    INCONCLUSIVE = 3
    """The writers did not run together, so their sum says nothing about the filesystem."""
    INTERNAL = 4
    """A bug in the reducer itself (never 1, which would read as "below budget")."""


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
    """Invalid input: a result file that is not fio JSON output, reports a failed job, or repeats another.

    The message starts with the file and, where there is one, the field (``0.json: jobs[1].write.bw_bytes:
    …``): the operator reading a failed check needs to know which node's result to look at."""


MAX_RESULT_BYTES = 16 * 1024 * 1024
"""fio's JSON for a node is tens of kilobytes; a file this large is not one and is not read whole."""


#: Where a JSON document may start: a line whose first non-blank character is ``{``.
_OBJECT_LINE = re.compile(r"^[ \t]*(\{)", re.MULTILINE)
#: Lines starting with ``{`` tried at most (notes are a few lines; this bounds a hostile file's cost).
MAX_CANDIDATES = 64


def _reject_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    body: dict[str, Any] = {}
    for key, value in pairs:
        if key in body:
            # fio never repeats a key; with a repeat, which value "counts" depends on the JSON library.
            raise _DuplicateKey(key)
        body[key] = value
    return body


class _DuplicateKey(ValueError):
    pass


def _decode(data: bytes | str, source: str) -> str:
    if isinstance(data, str):
        return data
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise FioOutputError(f"{source}: not UTF-8 text (byte {error.start} is 0x{data[error.start]:02x})") from None


def _json_body(data: bytes | str, source: str = "<fio>") -> dict[str, Any]:
    """The fio result document in ``data``: fio may print notes before it and after it (on stdout), and a note
    may contain braces, so each line that starts with ``{`` is tried in turn (then the first ``{`` anywhere) and
    the first that holds a JSON object with a ``jobs`` list is the result. Lines after the document are notes
    and ignored; anything after it on its own last line is not (a truncated or concatenated file).

    NaN/Infinity tokens and out-of-range floats (``1e400``) parse to non-finite floats here and are
    refused by the field checks, which can name the field."""
    text = _decode(data, source)
    starts = [m.start(1) for m in _OBJECT_LINE.finditer(text)][:MAX_CANDIDATES]
    first = text.find("{")
    if first >= 0 and first not in starts:  # a document after a note on the same line
        starts.append(first)
    if not starts:
        raise FioOutputError(f"{source}: no JSON object in fio output")
    decoder = json.JSONDecoder(object_pairs_hook=_reject_duplicate_keys)
    first_problem: str | None = None
    for start in starts:
        try:
            body, end = decoder.raw_decode(text, start)
        except json.JSONDecodeError as error:
            problem = f"fio output is not valid JSON: {error}"
        except _DuplicateKey as error:
            problem = f"key '{error}' appears twice in one JSON object"
        except RecursionError:
            problem = "fio output is not valid JSON: nested too deeply"
        except ValueError as error:  # an integer literal beyond int()'s digit limit
            problem = f"fio output is not valid JSON: {error}"
        else:
            rest = text[end:].split("\n", 1)[0]
            if rest.strip():  # a note starts on a line of its own; this is the document's own tail
                problem = f"fio output is not valid JSON: unexpected {rest.strip()[:20]!r} after the document"
            elif isinstance(body, dict) and isinstance(body.get("jobs"), list):
                return dict(body)
            else:
                problem = "jobs: fio output has no 'jobs' list"
        first_problem = first_problem or problem
    raise FioOutputError(f"{source}: {first_problem}")


def _kind(value: object) -> str:
    return "null" if value is None else type(value).__name__


class _Fields:
    """Typed, located access to one JSON object of a result file: every refusal names file and field."""

    def __init__(self, source: str, path: str, obj: object) -> None:
        if not isinstance(obj, dict):
            raise FioOutputError(f"{source}: {path}: expected an object, got {_kind(obj)}")
        self.source, self.path, self.obj = source, path, obj

    def where(self, key: str) -> str:
        return f"{self.path}.{key}" if self.path else key

    def fail(self, key: str, problem: str) -> FioOutputError:
        return FioOutputError(f"{self.source}: {self.where(key)}: {problem}")

    def has(self, key: str) -> bool:
        return key in self.obj

    def integer(self, key: str) -> int:
        """A non-negative integer; booleans and integral floats are not integers in fio's output."""
        if key not in self.obj:
            raise self.fail(key, "missing")
        value = self.obj[key]
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.fail(key, f"expected a non-negative integer, got {_kind(value)} {value!r:.40}")
        if value < 0:
            raise self.fail(key, f"expected a non-negative integer, got {value}")
        return value

    def number(self, key: str) -> float:
        """A finite non-negative number."""
        if key not in self.obj:
            raise self.fail(key, "missing")
        value = self.obj[key]
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise self.fail(key, f"expected a finite non-negative number, got {_kind(value)} {value!r:.40}")
        number = float(value)
        if not (math.isfinite(number) and number >= 0):
            raise self.fail(key, f"expected a finite non-negative number, got {value!r:.40}")
        return number

    def text(self, key: str) -> str:
        if key not in self.obj:
            raise self.fail(key, "missing")
        value = self.obj[key]
        if not isinstance(value, str):
            raise self.fail(key, f"expected a string, got {_kind(value)}")
        return value

    def child(self, key: str) -> _Fields:
        if key not in self.obj:
            raise self.fail(key, "missing")
        return _Fields(self.source, self.where(key), self.obj[key])


def _end_ms(top: _Fields) -> int:
    if top.has("timestamp_ms") or not top.has("timestamp"):
        return top.integer("timestamp_ms")
    return top.integer("timestamp") * 1000  # fio before 3.x wrote seconds only


def _writer(job: _Fields, end_ms: int) -> Writer | None:
    name = job.text("jobname")
    error = job.integer("error")
    if error:
        raise FioOutputError(f"{job.source}: {job.where('error')}: fio job '{name}' failed with error {error}")
    write = job.child("write")
    io_bytes = write.integer("io_bytes")
    if io_bytes == 0:
        return None  # a reader or an idle job: nothing written, nothing to sum
    bw_bytes = write.number("bw_bytes") if write.has("bw_bytes") or not write.has("bw") else write.number("bw") * 1024
    runtime_ms = job.integer("job_runtime") if job.has("job_runtime") or not write.has("runtime") else (
        write.integer("runtime"))
    if runtime_ms > end_ms:
        raise job.fail("job_runtime", f"{runtime_ms} ms is longer than the run ended after ({end_ms} ms)")
    return Writer(job.source, name, io_bytes, bw_bytes, runtime_ms, end_ms)


def parse_fio(data: bytes | str, source: str = "<fio>") -> list[Writer]:
    """The writers in one fio JSON document. A job with a non-zero ``error`` fails the whole file, and so
    does any field that is missing, of the wrong type, negative or not finite."""
    return parse_result(data, source).writers


@dataclass(frozen=True)
class Result:
    """One result file: its writers and a fingerprint of its content, to catch a file counted twice."""

    source: str
    writers: list[Writer]
    fingerprint: str


def parse_result(data: bytes | str, source: str = "<fio>") -> Result:
    body = _json_body(data, source)
    top = _Fields(source, "", body)
    end_ms = _end_ms(top)
    writers = []
    for index, raw_job in enumerate(body["jobs"]):
        writer = _writer(_Fields(source, f"jobs[{index}]", raw_job), end_ms)
        if writer is not None:
            writers.append(writer)
    # Key order and whitespace do not make a copy a different run.
    fingerprint = json.dumps(body, sort_keys=True, separators=(",", ":"))
    return Result(source, writers, fingerprint)


def collect(results: Iterable[tuple[str, bytes]], expect: int = 0) -> list[Writer]:
    """Every writer of a result set, refusing sets that cannot be summed honestly.

    ``results`` are (file name, content) pairs. Refused, as invalid input: no files, more files than
    writers were started (``expect``), a file that repeats another (a copy would count a node twice), and
    a run without a single write."""
    seen: dict[str, str] = {}
    writers: list[Writer] = []
    count = 0
    for source, data in results:
        count += 1
        result = parse_result(data, source)
        first = seen.setdefault(result.fingerprint, source)
        if first != source:
            raise FioOutputError(f"{source}: duplicate of {first}: the same run would be summed twice")
        writers += result.writers
    if count == 0:
        raise FioOutputError("no result files")
    if expect and count > expect:
        raise FioOutputError(f"{count} result files, expected {expect}: results of another run are mixed in")
    if not writers:
        raise FioOutputError(f"no writes found in {count} result files")
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
