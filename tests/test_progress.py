"""The heartbeat helpers (tools/progress.sh for shell steps, tools/progress.py for Python steps): a long step
prints that it is alive at every interval, a fast one stays quiet, and the step's exit status survives."""

from __future__ import annotations

import io
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from components.mockrt import ROOT
from tools.progress import format_elapsed, heartbeat

PROGRESS = ROOT / "tools" / "progress.sh"


def run(*args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(PROGRESS), *args], capture_output=True, text=True, timeout=timeout,
                          check=False)


def test_a_command_longer_than_the_interval_beats_and_keeps_its_exit_code() -> None:
    proc = run("--every", "1", "slow step", "--", "bash", "-c", "echo its own output; sleep 2.5; exit 7")
    assert proc.returncode == 7
    assert proc.stdout == "its own output\n"
    beats = [line for line in proc.stderr.splitlines() if line.startswith("slow step: still running after ")]
    assert len(beats) >= 2, proc.stderr
    assert proc.stderr.splitlines()[-1].startswith("slow step: failed (exit 7) after ")


def test_a_fast_command_prints_nothing_of_ours() -> None:
    started = time.monotonic()
    proc = run("--every", "5", "fast step", "--", "bash", "-c", "echo done")
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, "done\n", "")
    assert time.monotonic() - started < 4, "a fast command is not held for the interval"


def test_a_logged_command_beats_with_its_last_line(tmp_path: Path) -> None:
    log = tmp_path / "build.log"
    proc = run("--every", "1", "--log", str(log), "engine", "--",
               "bash", "-c", "echo 'go: downloading x'; sleep 2.5; echo 'engine: building provider'; sleep 2.5")
    assert proc.returncode == 0
    assert proc.stdout == ""
    assert log.read_text() == "go: downloading x\nengine: building provider\n"
    # Each line stays the last one for over two intervals, so a loaded machine still beats once on each.
    assert re.search(r"^engine: still running after \d+s; last: go: downloading x$", proc.stderr, re.M), proc.stderr
    assert re.search(r"^engine: still running after \d+s; last: engine: building provider$", proc.stderr, re.M)
    assert proc.stderr.splitlines()[-1].startswith("engine: done in ")


def test_timeouts_exit_status_passes_through() -> None:
    assert run("--every", "1", "bounded", "--", "timeout", "1", "sleep", "5").returncode == 124


def test_a_path_with_bash_alone_still_beats(tmp_path: Path) -> None:
    """A bare PATH (a test's, a minimal image's) has no sleep, date or mktemp: the beat waits with bash's own
    `read -t`, so it still beats once a second instead of spinning, and the status and the log survive."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    bash = shutil.which("bash")
    assert bash
    (bin_dir / "bash").symlink_to(bash)
    log = tmp_path / "step.log"
    proc = subprocess.run([str(bin_dir / "bash"), str(PROGRESS), "--every", "1", "--log", str(log), "bare", "--",
                           str(bin_dir / "bash"), "-c", "echo one; echo two >&2; read -t 2.5 <> <(:); exit 3"],
                          capture_output=True, text=True, timeout=30, check=False, env={"PATH": str(bin_dir)})
    assert proc.returncode == 3
    assert proc.stdout == ""
    assert log.read_text() == "one\ntwo\n"
    lines = proc.stderr.splitlines()
    assert 1 <= sum(line.startswith("bare: still running after ") for line in lines) <= 4, proc.stderr
    assert lines[-1].startswith("bare: failed (exit 3) after "), proc.stderr


def test_the_beat_never_outlives_the_command() -> None:
    """Stopping the beat used to go through a trap, and bash 5.2 fails a trap that fires while it parses a
    `$(...)`: the beat then ran for ever and held the caller's pipes. Many short runs, each must end."""
    for _ in range(8):
        proc = run("--every", "1", "bounded", "--", "timeout", "1", "sleep", "5", timeout=15)
        assert proc.returncode == 124
        assert proc.stderr.splitlines()[-1].startswith("bounded: failed (exit 124) after "), proc.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["label-only"], "usage: tools/progress.sh"),
        (["label", "true"], "usage: tools/progress.sh"),
        (["--every", "0", "label", "--", "true"], "--every must be a whole number of seconds >= 1, not '0'"),
        (["--every", "soon", "label", "--", "true"], "not 'soon'"),
    ],
)
def test_bad_usage_is_refused(args: list[str], message: str) -> None:
    proc = run(*args)
    assert proc.returncode == 2
    assert message in proc.stderr


def test_the_python_heartbeat_beats_for_a_long_block_only() -> None:
    out = io.StringIO()
    with heartbeat("chart rendering", every_s=0.2, stream=out, detail=lambda: "volcano 1.14.1"):
        time.sleep(0.7)
    lines = out.getvalue().splitlines()
    assert lines[0] == "chart rendering: still running after 0s; volcano 1.14.1"
    assert len(lines) >= 3 and lines[-1] == "chart rendering: done in 0s"
    quiet = io.StringIO()
    with heartbeat("warm", every_s=5, stream=quiet):
        pass
    assert quiet.getvalue() == ""


def test_the_python_heartbeat_says_when_the_block_failed() -> None:
    out = io.StringIO()
    with pytest.raises(RuntimeError, match="render failed"), heartbeat("chart", every_s=0.1, stream=out):
        time.sleep(0.25)
        raise RuntimeError("render failed")
    assert out.getvalue().splitlines()[-1] == "chart: failed after 0s"
    with pytest.raises(ValueError, match="every_s must be > 0"), heartbeat("chart", every_s=0):
        pass


@pytest.mark.parametrize(("seconds", "text"), [(0, "0s"), (59.9, "59s"), (60, "1m0s"), (1765, "29m25s")])
def test_elapsed_format(seconds: float, text: str) -> None:
    assert format_elapsed(seconds) == text


def test_the_engine_preview_says_it_lives(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
                                         tmp_path: Path) -> None:
    """``make preview`` sends the engine's diff to a file; meanwhile the heartbeat names the step."""
    from collections.abc import Callable

    from rich.console import Console

    import tools.engine_runner as runner
    from tools.engine_select import EngineChoice
    from tools.preview import real_engine_preview

    def slow_preview(stack: str, sink: Callable[[str], None], **_: object) -> int:
        sink(f"Previewing update ({stack}):")
        time.sleep(0.7)
        sink("+ pulumi:pulumi:Stack: (create)")
        return 0

    monkeypatch.setenv("PROGRESS_EVERY_S", "0.2")
    monkeypatch.setattr(runner, "engine_available", lambda: True)
    monkeypatch.setattr(runner, "streamed_preview", slow_preview)
    outcome = real_engine_preview("local", Console(), EngineChoice(kind="built", reason="test"), tmp_path / "d.diff")
    out, err = capsys.readouterr()
    assert outcome is not None and outcome[0] == 0
    assert out == "Previewing update (local):\n"
    assert (tmp_path / "d.diff").read_text() == "Previewing update (local):\n+ pulumi:pulumi:Stack: (create)\n"
    assert "preview: pulumi preview --stack local: still running after 0s" in err
    assert err.splitlines()[-1] == "preview: pulumi preview --stack local: done in 0s"
