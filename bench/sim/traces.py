"""Production traces as simulator input: canonical CSV formats, loaders for two public traces, statistics.

Outside input, so every row is checked and a bad one fails with `file:line:column: what` (`TraceError`).
A file may be plain or gzip-compressed (detected by its magic bytes, not its name). Canonical formats
(a header row names the columns; order free; other columns ignored):

- request log: `time`, `service_seconds`, optional `service` — one row per request;
- rate series: `time`, `rps`, optional `service` — requests per second from `time` until the next row of
  the same service;
- job log: `submit_time`, `workers`, `gpus_per_worker`, `duration_s`, optional `pool` — one training job.

`time` and `submit_time` are epoch seconds or ISO 8601 (a time without an offset is UTC). Two native formats
are read as they are published (see bench/traces/README.md): the GenTD26 Stable Diffusion request log
(`gmt_create`, `exec_time_seconds`) as a request log, and the Alibaba GPU 2023 pod list (`qos`, `num_gpu`,
`creation_time`, `scheduled_time`, `deletion_time`): latency-sensitive (LS) pods as a request log whose
requests are the pods' lifetimes, best-effort and burstable pods as a job log of one-worker jobs.
"""

from __future__ import annotations

import csv
import gzip
import io
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path

DAY = 86_400.0
WEEK = 7 * DAY
HOUR = 3_600.0


class TraceError(ValueError):
    """A trace that cannot be read: names the file and, where one is to blame, the line and column."""

    def __init__(self, path: str | Path, message: str, line: int | None = None, column: int | None = None) -> None:
        where = str(path)
        if line is not None:
            where += f":{line}"
            if column is not None:
                where += f":{column}"
        self.path, self.line, self.column = str(path), line, column
        super().__init__(f"{where}: {message}")


class TraceKind(StrEnum):
    REQUEST_LOG = "request log"
    RATE_SERIES = "rate series"
    JOB_LOG = "job log"
    GENTD26 = "GenTD26 request log"
    ALIBABA_2023 = "Alibaba GPU 2023 pod list"


@dataclass(frozen=True)
class Request:
    time_s: float
    service_seconds: float
    service: str | None = None


@dataclass(frozen=True)
class Rate:
    time_s: float
    rps: float
    service: str | None = None


@dataclass(frozen=True)
class Job:
    submit_s: float
    workers: int
    gpus_per_worker: int
    duration_s: float
    pool: str | None = None


@dataclass(frozen=True)
class InferenceTrace:
    """Inference demand: either requests or rates (the other empty); `kind` says which format it came from."""

    path: str
    kind: TraceKind
    requests: tuple[Request, ...] = ()
    rates: tuple[Rate, ...] = ()


@dataclass(frozen=True)
class TrainingTrace:
    path: str
    kind: TraceKind
    jobs: tuple[Job, ...]


_REQUIRED: dict[TraceKind, tuple[str, ...]] = {
    TraceKind.REQUEST_LOG: ("time", "service_seconds"),
    TraceKind.RATE_SERIES: ("time", "rps"),
    TraceKind.JOB_LOG: ("submit_time", "workers", "gpus_per_worker", "duration_s"),
    TraceKind.GENTD26: ("gmt_create", "exec_time_seconds"),
    TraceKind.ALIBABA_2023: ("num_gpu", "qos", "creation_time", "scheduled_time", "deletion_time"),
}
INFERENCE_KINDS = (TraceKind.GENTD26, TraceKind.ALIBABA_2023, TraceKind.REQUEST_LOG, TraceKind.RATE_SERIES)
TRAINING_KINDS = (TraceKind.ALIBABA_2023, TraceKind.JOB_LOG)
MAX_BYTES = 512 * 1024 * 1024  # decompressed; a bigger trace is refused rather than filling memory


def _text(path: Path) -> str:
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise TraceError(path, f"cannot read: {exc.strerror or exc}") from None
    if raw[:2] == b"\x1f\x8b":
        try:
            with gzip.GzipFile(fileobj=io.BytesIO(raw)) as f:
                raw = f.read(MAX_BYTES + 1)
        except (OSError, EOFError) as exc:
            raise TraceError(path, f"not a readable gzip file: {exc}") from None
    if len(raw) > MAX_BYTES:
        raise TraceError(path, f"larger than {MAX_BYTES // (1024 * 1024)} MiB")
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise TraceError(path, f"not UTF-8 text (byte {exc.start})", line) from None


class _Rows:
    """CSV rows with their line numbers and a column index by name (1-based columns in errors)."""

    def __init__(self, path: Path, text: str, kinds: Sequence[TraceKind]) -> None:
        self.path = path
        self._reader = csv.reader(io.StringIO(text, newline=""), strict=True)
        try:
            header = next(self._reader, None)
        except csv.Error as exc:
            raise TraceError(path, f"bad CSV: {exc}", 1) from None
        if not header or not any(h.strip() for h in header):
            raise TraceError(path, "empty file: expected a header row naming the columns", 1)
        self.header = [h.strip() for h in header]
        self.index = {name: i for i, name in enumerate(self.header)}
        found = next((k for k in kinds if all(c in self.index for c in _REQUIRED[k])), None)
        if found is None:
            wanted = "; ".join(f"{k.value}: {', '.join(_REQUIRED[k])}" for k in kinds)
            raise TraceError(path, f"unknown columns {self.header}; expected one of — {wanted}", 1)
        self.kind = found

    def __iter__(self) -> Iterator[tuple[int, list[str]]]:
        while True:
            try:
                row = next(self._reader)
            except StopIteration:
                return
            except csv.Error as exc:
                raise TraceError(self.path, f"bad CSV: {exc}", self._reader.line_num) from None
            if not row or all(not c.strip() for c in row):
                continue
            line = self._reader.line_num
            if len(row) != len(self.header):
                raise TraceError(self.path, f"{len(row)} fields, the header has {len(self.header)}", line)
            yield line, row

    def cell(self, row: list[str], line: int, name: str) -> tuple[str, int]:
        col = self.index[name]
        return row[col].strip(), col + 1

    def number(self, row: list[str], line: int, name: str, *, minimum: float = 0.0,
               above: bool = False) -> float:
        value, col = self.cell(row, line, name)
        try:
            x = float(value)
        except ValueError:
            raise TraceError(self.path, f"{name}: expected a number, got {value!r}", line, col) from None
        if not math.isfinite(x) or x < minimum or (above and x == minimum):
            bound = f"above {minimum:g}" if above else f"at least {minimum:g}"
            raise TraceError(self.path, f"{name}: expected a finite number {bound}, got {value!r}", line, col)
        return x

    def integer(self, row: list[str], line: int, name: str, minimum: int) -> int:
        value, col = self.cell(row, line, name)
        try:
            x = int(value)
        except ValueError:
            x = None
        if x is None or x < minimum:
            raise TraceError(self.path, f"{name}: expected a whole number >= {minimum}, got {value!r}", line, col)
        return x

    def time(self, row: list[str], line: int, name: str) -> float:
        value, col = self.cell(row, line, name)
        return parse_time(value, self.path, line, col, name)

    def optional(self, row: list[str], line: int, name: str) -> str | None:
        if name not in self.index:
            return None
        value, _ = self.cell(row, line, name)
        return value or None


def parse_time(value: str, path: str | Path = "<time>", line: int | None = None, column: int | None = None,
               name: str = "time") -> float:
    """Epoch seconds, or ISO 8601 (`2024-11-15 16:57:50`, `...T...Z`, `...+08:00`; no offset means UTC)."""
    try:
        x = float(value)
    except ValueError:
        pass
    else:
        if math.isfinite(x):
            return x
        raise TraceError(path, f"{name}: expected a finite time, got {value!r}", line, column)
    try:
        stamp = datetime.fromisoformat(value)
    except ValueError:
        raise TraceError(path, f"{name}: expected epoch seconds or ISO 8601, got {value!r}", line, column) from None
    if stamp.tzinfo is None:
        stamp = stamp.replace(tzinfo=UTC)
    return stamp.timestamp()


def read_inference(path: str | Path) -> InferenceTrace:
    """Inference demand from a request log, a rate series, GenTD26 or the Alibaba 2023 pod list (LS pods)."""
    p = Path(path)
    rows = _Rows(p, _text(p), INFERENCE_KINDS)
    requests: list[Request] = []
    rates: list[Rate] = []
    kind = rows.kind
    for line, row in rows:
        if kind is TraceKind.GENTD26:
            requests.append(Request(rows.time(row, line, "gmt_create"),
                                    rows.number(row, line, "exec_time_seconds")))
        elif kind is TraceKind.ALIBABA_2023:
            qos, _ = rows.cell(row, line, "qos")
            pod = _pod(rows, row, line)
            if qos == "LS" and pod is not None:
                requests.append(Request(pod[0], pod[1]))
        elif kind is TraceKind.REQUEST_LOG:
            requests.append(Request(rows.time(row, line, "time"), rows.number(row, line, "service_seconds"),
                                    rows.optional(row, line, "service")))
        else:
            rates.append(Rate(rows.time(row, line, "time"), rows.number(row, line, "rps"),
                              rows.optional(row, line, "service")))
    if not requests and not rates:
        what = "no latency-sensitive (LS) pods that held a GPU" if kind is TraceKind.ALIBABA_2023 else "no rows"
        raise TraceError(p, f"{what}: nothing to replay")
    return InferenceTrace(str(p), kind, tuple(sorted(requests, key=lambda r: r.time_s)),
                          tuple(sorted(rates, key=lambda r: r.time_s)))


def read_training(path: str | Path) -> TrainingTrace:
    """Training jobs from a job log or the Alibaba 2023 pod list (BE and Burstable pods as one-worker jobs)."""
    p = Path(path)
    rows = _Rows(p, _text(p), TRAINING_KINDS)
    jobs: list[Job] = []
    for line, row in rows:
        if rows.kind is TraceKind.ALIBABA_2023:
            qos, _ = rows.cell(row, line, "qos")
            gpus = rows.integer(row, line, "num_gpu", 0)
            pod = _pod(rows, row, line)
            if qos in ("BE", "Burstable") and pod is not None and gpus > 0 and pod[1] > 0:
                jobs.append(Job(rows.number(row, line, "creation_time"), 1, gpus, pod[1]))
        else:
            jobs.append(Job(rows.time(row, line, "submit_time"), rows.integer(row, line, "workers", 1),
                            rows.integer(row, line, "gpus_per_worker", 1),
                            rows.number(row, line, "duration_s", above=True), rows.optional(row, line, "pool")))
    if not jobs:
        what = "no best-effort or burstable pods that held a GPU" if rows.kind is TraceKind.ALIBABA_2023 else "no rows"
        raise TraceError(p, f"{what}: nothing to replay")
    return TrainingTrace(str(p), rows.kind, tuple(sorted(jobs, key=lambda j: j.submit_s)))


def _pod(rows: _Rows, row: list[str], line: int) -> tuple[float, float] | None:
    """(scheduled time, seconds it held its GPUs) of an Alibaba pod; None for a pod never scheduled."""
    scheduled, _ = rows.cell(row, line, "scheduled_time")
    if not scheduled:
        return None
    start = rows.number(row, line, "scheduled_time")
    end = rows.number(row, line, "deletion_time")
    if end < start:
        _, col = rows.cell(row, line, "deletion_time")
        raise TraceError(rows.path, f"deletion_time {end:g} is before scheduled_time {start:g}", line, col)
    return start, end - start


# --- Statistics -----------------------------------------------------------------------------------------


def concurrency(requests: Sequence[Request], start_s: float, bins: int, bin_s: float) -> list[float]:
    """Mean requests in service per bin (Little's law by construction: the busy seconds in a bin / its length).

    A request's busy interval [time, time + service_seconds) is split over the bins it overlaps; the part
    outside [start_s, start_s + bins × bin_s) is dropped.
    """
    busy = [0.0] * bins
    full = [0.0] * (bins + 1)  # difference array of whole bins covered
    end_all = start_s + bins * bin_s
    for r in requests:
        s, e = max(r.time_s, start_s), min(r.time_s + r.service_seconds, end_all)
        if e <= s:
            continue
        b0 = min(int((s - start_s) // bin_s), bins - 1)
        b1 = min(int((e - start_s) // bin_s), bins - 1)
        if b0 == b1:
            busy[b0] += e - s
            continue
        busy[b0] += start_s + (b0 + 1) * bin_s - s
        busy[b1] += e - (start_s + b1 * bin_s)
        full[b0 + 1] += bin_s
        full[b1] -= bin_s
    run = 0.0
    for i in range(bins):
        run += full[i]
        busy[i] = (busy[i] + run) / bin_s
    return busy


def rate_concurrency(rates: Sequence[Rate], start_s: float, bins: int, bin_s: float,
                     service_seconds: float) -> list[float]:
    """Concurrency per bin of a rate series (step function): rps × mean service time (Little's law)."""
    out = [0.0] * bins
    for i, r in enumerate(rates):
        s = max(r.time_s, start_s)
        e = rates[i + 1].time_s if i + 1 < len(rates) else r.time_s + bin_s
        e = min(e, start_s + bins * bin_s)
        t = s
        while t < e:
            b = int((t - start_s) // bin_s)
            nxt = min(start_s + (b + 1) * bin_s, e)
            out[b] += r.rps * service_seconds * (nxt - t) / bin_s
            t = nxt
    return out


def smooth(values: Sequence[float], window: int) -> list[float]:
    """Centred moving average over `window` bins (edges average what exists)."""
    if window <= 1:
        return list(values)
    prefix = [0.0]
    for v in values:
        prefix.append(prefix[-1] + v)
    half = window // 2
    n = len(values)
    out = []
    for i in range(n):
        lo, hi = max(0, i - half), min(n, i - half + window)
        out.append((prefix[hi] - prefix[lo]) / (hi - lo))
    return out


def autocorrelation(values: Sequence[float], lag: int) -> float | None:
    """Pearson autocorrelation at `lag` bins; None when the series is shorter than two lags or constant."""
    n = len(values)
    if lag <= 0 or n < 2 * lag:
        return None
    mean = sum(values) / n
    dev = [v - mean for v in values]
    var = sum(d * d for d in dev)
    if var == 0:
        return None
    return sum(dev[i] * dev[i + lag] for i in range(n - lag)) / var


@dataclass(frozen=True)
class TraceStats:
    """What a reader needs to judge a trace: length, burstiness and periodicity (hourly concurrency)."""

    rows: int
    span_days: float
    mean_concurrency: float
    peak_to_mean_hourly: float
    peak_to_mean_replayed: float
    daily_autocorrelation: float | None
    weekly_autocorrelation: float | None

    def lines(self) -> list[str]:
        def ac(x: float | None) -> str:
            return "n/a (trace shorter than two periods)" if x is None else f"{x:.2f}"

        return [
            f"rows: {self.rows:,}; span: {self.span_days:.2f} days; mean concurrency {self.mean_concurrency:.3g}",
            f"peak-to-mean: {self.peak_to_mean_hourly:.1f} (hourly), {self.peak_to_mean_replayed:.1f} (as replayed)",
            f"periodicity (autocorrelation of hourly concurrency): daily {ac(self.daily_autocorrelation)}, "
            f"weekly {ac(self.weekly_autocorrelation)}",
        ]


def stats(rows: int, span_s: float, hourly: Sequence[float], replayed: Sequence[float]) -> TraceStats:
    mean_h = sum(hourly) / len(hourly) if hourly else 0.0
    mean_r = sum(replayed) / len(replayed) if replayed else 0.0
    return TraceStats(
        rows=rows,
        span_days=span_s / DAY,
        mean_concurrency=mean_h,
        peak_to_mean_hourly=max(hourly) / mean_h if mean_h else 0.0,
        peak_to_mean_replayed=max(replayed) / mean_r if mean_r else 0.0,
        daily_autocorrelation=autocorrelation(hourly, 24),
        weekly_autocorrelation=autocorrelation(hourly, 168),
    )
