"""The reducer on real fio output: Debian's fio writes a few MB per writer, the reducer sums it."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from agents.checkpoint_check.cli import main
from agents.checkpoint_check.reduce import FioOutputError, Verdict, parse_fio, summarize

FIO = shutil.which("fio")
WRITERS_PER_RUN = 3
RUNS = 3


def run_fio(directory: Path, output: Path, direct: bool) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["fio", "--name=ckpt", f"--directory={directory}", "--rw=write", "--bs=1m", "--size=4m",
         f"--numjobs={WRITERS_PER_RUN}", "--end_fsync=1", "--ioengine=psync", f"--direct={int(direct)}",
         "--output-format=json", f"--output={output}"],
        capture_output=True, text=True, check=False,
    )


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """RUNS fio runs (one per pretend node), WRITERS_PER_RUN writers each, one after the other."""
    assert FIO, "fio is missing: run `make checkpoint-tools` (Debian package fio)"
    root = tmp_path_factory.mktemp("fio")
    out = root / "results"
    out.mkdir()
    for node in range(RUNS):
        data = root / f"data-{node}"
        data.mkdir()
        done = run_fio(data, out / f"{node}.json", direct=True)
        if done.returncode != 0:  # a filesystem without O_DIRECT (tmpfs): buffered writes, same JSON
            done = run_fio(data, out / f"{node}.json", direct=False)
        assert done.returncode == 0, done.stderr
    return out


def raw_bandwidths(results: Path) -> list[int]:
    """Every writer's bw_bytes, read straight from fio's JSON (not through the reducer)."""
    return [job["write"]["bw_bytes"] for path in sorted(results.glob("*.json"))
            for job in json.loads(path.read_text())["jobs"]]


def test_fio_wrote_one_file_per_writer(results: Path) -> None:
    data = sorted((results.parent / "data-0").iterdir())
    assert [p.name for p in data] == [f"ckpt.{i}.0" for i in range(WRITERS_PER_RUN)]
    assert all(p.stat().st_size == 4 * 1024 * 1024 for p in data)


def test_parser_reads_every_writer(results: Path) -> None:
    writers = [w for p in sorted(results.glob("*.json")) for w in parse_fio(p.read_text(), p.name)]
    assert len(writers) == RUNS * WRITERS_PER_RUN
    assert all(w.bytes_written == 4 * 1024 * 1024 for w in writers)
    assert sorted(w.bw_bytes for w in writers) == sorted(raw_bandwidths(results))


def test_printed_aggregate_is_the_sum_of_writer_bandwidths(results: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main([str(results), "--budget-gbps", "0.000001", "--expect", str(RUNS), "--min-overlap", "0"])
    printed = capsys.readouterr().out
    expected = sum(raw_bandwidths(results)) / 1e9
    assert f"aggregate: {expected:.3f} GB/s" in printed
    assert f"writers: {RUNS * WRITERS_PER_RUN} in {RUNS} result files" in printed
    assert code == Verdict.PASS and printed.rstrip().endswith("PASS")


def test_below_budget_fails(results: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(results), "--budget-gbps", "1000000", "--min-overlap", "0"]) == Verdict.FAIL
    assert capsys.readouterr().out.rstrip().endswith("FAIL")


def test_runs_that_did_not_overlap_are_inconclusive(results: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # The runs above ran one after another: summing them would overstate what the filesystem sustains.
    assert main([str(results), "--budget-gbps", "0.000001"]) == Verdict.INCONCLUSIVE
    assert "INCONCLUSIVE: writers overlapped 0%" in capsys.readouterr().out


def test_missing_results_are_an_error(results: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(results), "--budget-gbps", "1", "--expect", str(RUNS + 1)]) == Verdict.ERROR
    assert f"{RUNS} of {RUNS + 1} result files" in capsys.readouterr().err


def fio_doc(*jobs: dict[str, object], timestamp_ms: int = 1_000_000) -> str:
    return json.dumps({"fio version": "fio-3.33", "timestamp_ms": timestamp_ms, "jobs": list(jobs)})


def job(name: str, io_bytes: int, bw_bytes: int, runtime_ms: int, error: int = 0) -> dict[str, object]:
    return {"jobname": name, "error": error, "job_runtime": runtime_ms,
            "write": {"io_bytes": io_bytes, "bw_bytes": bw_bytes, "runtime": runtime_ms}}


def test_notes_before_the_json_are_skipped() -> None:
    text = "note: both iodepth >= 1 and synchronous I/O engine are selected\n" + fio_doc(job("a", 10, 5, 2000))
    assert [w.name for w in parse_fio(text)] == ["a"]


def test_a_failed_job_fails_the_file() -> None:
    with pytest.raises(FioOutputError, match="fio job 'a' failed with error 5"):
        parse_fio(fio_doc(job("a", 10, 5, 2000, error=5)), "n0.json")


@pytest.mark.parametrize("text", ["", "not json", "{\"jobs\": 3}", "{broken"])
def test_non_fio_text_is_refused(text: str) -> None:
    with pytest.raises(FioOutputError):
        parse_fio(text)


def test_summary_arithmetic() -> None:
    # Two nodes, 2 writers each at 5 GB/s for 10 s, both nodes finishing at the same moment.
    writers = parse_fio(fio_doc(job("w0", 50 * 10**9, 5 * 10**9, 10_000), job("w1", 50 * 10**9, 5 * 10**9, 10_000)))
    writers += parse_fio(fio_doc(job("w0", 50 * 10**9, 5 * 10**9, 10_000), job("w1", 50 * 10**9, 5 * 10**9, 10_000)))
    summary = summarize(writers, budget_gbps=20.0)
    assert summary.aggregate_gbps == 20.0
    assert summary.wall_clock_gbps == 20.0
    assert summary.overlap == 1.0
    assert summary.per_writer_gbps == 5.0
    assert summary.verdict is Verdict.PASS
    assert summarize(writers, budget_gbps=20.001).verdict is Verdict.FAIL
