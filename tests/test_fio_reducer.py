"""The reducer on real fio output: Debian's fio writes a few MB per writer, the reducer sums it."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agents.checkpoint_check import cli
from agents.checkpoint_check.cli import main
from agents.checkpoint_check.reduce import FioOutputError, Verdict, collect, parse_fio, summarize
from tests.corpus.fio.cases import CASES as FIO_CASES
from tests.corpus.fio.cases import Case, run_case, write_results

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


#: Note lines fio (or a wrapper) may print around its document: any text, braces included, one line each.
NOTE_LINES = st.lists(st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\n\r"),
                              max_size=30), max_size=4)


@given(before=NOTE_LINES, after=NOTE_LINES)
def test_the_document_is_found_whatever_note_lines_surround_it(before: list[str], after: list[str]) -> None:
    """A note before or after the result, containing ``{`` or not, never hides the result document."""
    text = "".join(f"{line}\n" for line in before) + fio_doc(job("a", 10, 5, 2000)) + "".join(
        f"\n{line}" for line in after)
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


# ------------------------------------------------------------------ hostile results: the corpus


def _run_in_process(case: Case, root: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    results = write_results(case, root)
    try:
        code = main([str(results), *case.args])
    except SystemExit as exit_:  # argparse refusing an argument
        code = int(exit_.code or 0)
    out = capsys.readouterr()
    return code, out.out, out.err


def test_corpus_covers_every_exit_code_but_internal() -> None:
    assert len(FIO_CASES) >= 50
    assert len({c.name for c in FIO_CASES}) == len(FIO_CASES)
    assert {c.exit for c in FIO_CASES} == {0, 1, 2, 3}


@pytest.mark.parametrize("case", FIO_CASES, ids=lambda case: case.name)
def test_corpus_case(case: Case, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _run_in_process(case, tmp_path, capsys)
    assert code == case.exit, err or out
    where = err if case.exit == Verdict.ERROR else out
    for fragment in case.message:
        assert fragment in where, (fragment, where)
    if case.exit == Verdict.ERROR:
        assert "Traceback" not in err and not out


@pytest.mark.parametrize("name", ["not_utf8", "deeply_nested", "bw_nan", "budget_nan", "within_budget", "below_budget"])
def test_corpus_case_through_a_fresh_interpreter(name: str) -> None:
    # The exit status the Job sees, including the one Python gives an uncaught exception (1).
    case = next(c for c in FIO_CASES if c.name == name)
    code, _, err = run_case(case)
    assert code == case.exit, err


def test_a_bug_is_not_a_verdict(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                capsys: pytest.CaptureFixture[str]) -> None:
    def broken(*args: object, **kwargs: object) -> None:
        raise KeyError("boom")

    monkeypatch.setattr(cli, "summarize", broken)
    (tmp_path / "0.json").write_text(fio_doc(job("a", 10, 5, 2000)))
    assert main([str(tmp_path), "--budget-gbps", "1"]) == 4 == int(Verdict.INTERNAL)
    assert "INTERNAL ERROR" in capsys.readouterr().err


# ------------------------------------------------------------------ properties of the parser


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)


@settings(max_examples=150, deadline=None)
@given(st.one_of(st.binary(max_size=200), JSON.map(lambda v: json.dumps(v).encode())))
def test_arbitrary_bytes_or_json_are_invalid_input_naming_the_file(data: bytes) -> None:
    with pytest.raises(FioOutputError) as refused:
        collect([("7.json", data)])
    assert str(refused.value).startswith("7.json: ") or "no writes found" in str(refused.value)


# Every field the reducer reads, as (path, a valid value); a hostile value at any of them is refused.
FIELDS: list[tuple[tuple[str | int, ...], str]] = [
    (("timestamp_ms",), "timestamp_ms"),
    (("jobs", 0, "jobname"), "jobs[0].jobname"),
    (("jobs", 0, "error"), "jobs[0].error"),
    (("jobs", 0, "job_runtime"), "jobs[0].job_runtime"),
    (("jobs", 0, "write", "io_bytes"), "jobs[0].write.io_bytes"),
    (("jobs", 0, "write", "bw_bytes"), "jobs[0].write.bw_bytes"),
    (("jobs", 1, "write", "bw_bytes"), "jobs[1].write.bw_bytes"),
]
HOSTILE: st.SearchStrategy[Any] = st.one_of(
    st.sampled_from([None, True, "12", [], {}, -1, -0.5, 1.5]),
    st.sampled_from(["NaN", "Infinity", "-Infinity", "1e400"]).map(lambda raw: ("raw", raw)),
    st.integers(max_value=-1),
    st.text(max_size=5),
)


def _legitimate(key: str, value: Any) -> bool:
    """Values a hostile draw may hit that fio could really write (a job name, a fractional bandwidth)."""
    if key == "jobname":
        return isinstance(value, str)
    if key == "job_runtime" and value is None:
        return True  # fio before 3.x: write.runtime stands in, as the reducer documents
    if key == "error" or isinstance(value, bool):
        return False  # error 0 is the valid document itself; any other value is a failed job or garbage
    if key == "io_bytes" and value == 0:
        return True  # an idle job, skipped
    if isinstance(value, float) and key != "bw_bytes":
        return False
    return isinstance(value, int | float) and value >= 0


def _valid_doc() -> Any:
    return json.loads(fio_doc(job("w0", 10**10, 2 * 10**9, 5000), job("w1", 10**10, 2 * 10**9, 5000)))


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(FIELDS), HOSTILE)
def test_a_hostile_value_in_any_field_is_refused_with_file_and_field(field: tuple[tuple[str | int, ...], str],
                                                                      value: Any) -> None:
    path, where = field
    doc = _valid_doc()
    target: Any = doc
    for step in path[:-1]:
        target = target[step]
    if value is None:
        del target[path[-1]]  # missing
    else:
        target[path[-1]] = "@RAW@" if isinstance(value, tuple) else value
    text = json.dumps(doc)
    if isinstance(value, tuple):
        text = text.replace('"@RAW@"', value[1])
    if _legitimate(str(path[-1]), value):
        return
    with pytest.raises(FioOutputError) as refused:
        collect([("3.json", text.encode())])
    message = str(refused.value)
    assert message.startswith(f"3.json: {where}: "), message


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 10**12), st.integers(0, 10**11)), min_size=1, max_size=6),
       st.floats(min_value=1e-6, max_value=1e3))
def test_verdict_is_pass_exactly_when_the_sum_meets_the_budget(jobs: list[tuple[int, int]], budget: float) -> None:
    doc = fio_doc(*(job(f"w{i}", io, bw, 5000) for i, (io, bw) in enumerate(jobs)))
    summary = summarize(collect([("0.json", doc.encode())]), budget)
    expected = Verdict.PASS if sum(bw for _, bw in jobs) / 1e9 >= budget else Verdict.FAIL
    assert summary.verdict is expected


def test_a_copied_result_is_refused_even_reformatted() -> None:
    body = fio_doc(job("a", 10, 5, 2000))
    copy = json.dumps(json.loads(body), indent=2, sort_keys=True)
    with pytest.raises(FioOutputError, match=r"^1\.json: duplicate of 0\.json"):
        collect([("0.json", body.encode()), ("1.json", copy.encode())])
