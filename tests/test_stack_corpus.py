"""The corpus of broken stack files (tests/corpus/stacks): each is refused with one clean message naming the
key and the file, and the mock monitor saw no registration. ``python -m tests.test_stack_corpus`` prints the
tally (clean / traceback / accepted / hang) for the current code."""

from __future__ import annotations

import signal
import sys
import tempfile
import traceback
from collections import Counter
from pathlib import Path
from types import FrameType

import pytest

from components.config import ConfigError
from components.mockrt import RecordingMocks, RecordingMonitor, run_program, stack_config
from tests.corpus.stacks import CASES, Case

#: A render slower than this counts as a hang (a node range of millions).
HANG_SECONDS = 20


class Hang(Exception):
    pass


def _alarm(_signum: int, _frame: FrameType | None) -> None:
    raise Hang


def attempt(case: Case, root: Path) -> tuple[str, str, int]:
    """Write the case as ``Pulumi.<stack>.yaml`` under ``root`` and run the program on it: the outcome
    (clean, traceback, accepted, hang), the message, and how many resources were registered."""
    (root / f"Pulumi.{case.stack}.yaml").write_text(case.render())
    monitor = RecordingMonitor(RecordingMocks())
    previous = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(HANG_SECONDS)
    try:
        config, secrets = stack_config(case.stack, root)
        run_program(case.stack, config, secrets, monitor=monitor)
    except ConfigError as error:
        return "clean", str(error), len(monitor.records)
    except Hang:
        return "hang", "", len(monitor.records)
    except Exception as error:  # the tally counts what escapes as a traceback
        return "traceback", "".join(traceback.format_exception_only(error)), len(monitor.records)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    return "accepted", "", len(monitor.records)


def test_corpus_size() -> None:
    assert len(CASES) >= 60
    assert len({c.id for c in CASES}) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_broken_stack_is_refused_cleanly(case: Case, tmp_path: Path) -> None:
    outcome, message, registered = attempt(case, tmp_path)
    assert outcome == "clean", f"{case.id}: {outcome} {message}"
    assert registered == 0, f"{case.id}: {registered} resources registered before the refusal"
    assert f"Pulumi.{case.stack}.yaml" in message
    for fragment in case.expect:
        assert fragment in message, f"{case.id}: {fragment!r} not in {message!r}"


def main() -> int:
    tally: Counter[str] = Counter()
    with tempfile.TemporaryDirectory() as tmp:
        for case in CASES:
            outcome, message, registered = attempt(case, Path(tmp))
            tally[outcome] += 1
            first = message.strip().splitlines()[-1] if message.strip() else ""
            print(f"{outcome:9} {registered:5} {case.id:40} {first[:110]}")
    print(f"{len(CASES)} cases: " + ", ".join(f"{k} {v}" for k, v in sorted(tally.items())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
