"""Count how the corpora fare against an implementation: scrapes lost, wrong reducer exit codes.

``python tests/corpus/survey.py [--impl DIR]`` imports ``agents`` from ``DIR`` (default: this checkout),
so the same corpus can be run against an older tree extracted with ``git archive`` to get "before"
figures. A scrape counts as lost when collecting or rendering raises, or the exposition fails
prometheus_client's parser, ``promtool check metrics`` (parse errors; lint findings are not losses) or
carries the same series twice. A reducer case is wrong when its exit code differs from the corpus's.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]


def exposition_problem(text: bytes) -> str | None:
    """Why ``text`` is not a valid exposition Prometheus would ingest whole, or ``None``."""
    from prometheus_client.parser import text_string_to_metric_families

    try:
        decoded = text.decode("utf-8")
        seen: set[tuple[str, tuple[tuple[str, str], ...]]] = set()
        for family in text_string_to_metric_families(decoded):
            for sample in family.samples:
                key = (sample.name, tuple(sorted(sample.labels.items())))
                if key in seen:
                    return f"duplicate series {key}"
                seen.add(key)
    except Exception as exc:  # any parser failure is the finding
        return f"prometheus_client: {type(exc).__name__}: {exc}"
    promtool = shutil.which("promtool")
    if promtool is not None:
        done = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, check=False)
        if done.returncode not in (0, 3):  # 3: lint findings only, the text parsed
            return f"promtool: {(done.stdout + done.stderr).decode(errors='replace').strip()}"
    return None


def survey_ib() -> dict[str, Any]:
    from agents.ib_exporter.collector import InfiniBandCollector
    from agents.ib_exporter.exposition import render
    from tests.corpus.ib_sysfs.cases import CASES, build

    lost: dict[str, str] = {}
    for case in CASES:
        with tempfile.TemporaryDirectory(prefix="ib-corpus-") as root:
            build(Path(root), case)
            try:
                text = render(InfiniBandCollector(root).collect())
            except Exception as exc:
                lost[case.name] = f"raised {type(exc).__name__}: {str(exc)[:80]}"
                continue
            problem = exposition_problem(text)
            if problem is not None:
                lost[case.name] = problem[:160]
    return {"cases": len(CASES), "scrapes_lost": len(lost), "lost": lost}


def survey_fio(impl: Path = REPO) -> dict[str, Any]:
    from tests.corpus.fio.cases import CASES, run_case

    wrong: dict[str, str] = {}
    for case in CASES:
        code, _, err = run_case(case, impl)
        if code != case.exit:
            wrong[case.name] = f"exit {code}, expected {case.exit}: {err.strip().splitlines()[-1:]!s:.160}"
    return {"cases": len(CASES), "wrong_exit_codes": len(wrong), "wrong": wrong}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--impl", type=Path, default=REPO, help="directory to import agents/ from")
    args = parser.parse_args()
    sys.path[:0] = [str(args.impl), str(REPO)]
    print(json.dumps({"ib_sysfs": survey_ib(), "fio": survey_fio(args.impl)}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
