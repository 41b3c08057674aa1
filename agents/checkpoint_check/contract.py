"""The checkpoint check's contract: its names, the reducer's settings and the command line that carries them.

No I/O and nothing outside the standard library: the deploying component (``components/checkpoint.py``)
and the reducer's own argument parser read the program name, the flags and their defaults from here.
``components.checkpoint.reduce_settings`` is the one way from the stack configuration to them.
"""

from __future__ import annotations

from dataclasses import dataclass

APP = "checkpoint-check"
"""Image, Job and label name of the check."""
REDUCE_COMMAND = "checkpoint-reduce"
"""The reducer's entry point in the image (``pyproject.toml`` ``[project.scripts]``)."""
DEFAULT_MIN_OVERLAP = 0.8
"""Fraction of the run all writers must share for their sum to count as one concurrent measurement."""


@dataclass(frozen=True)
class ReduceSettings:
    """What the reducer needs: how many results to wait for, for how long, and the bar to clear."""

    expect: int
    budget_gbps: float
    wait_seconds: int = 0
    min_overlap: float = DEFAULT_MIN_OVERLAP

    def command(self, results: str) -> str:
        """The reducer's command line for a shell, ``results`` being the (possibly quoted) result directory;
        ``--min-overlap`` is spelled out only when it differs from the reducer's default."""
        overlap = "" if self.min_overlap == DEFAULT_MIN_OVERLAP else f" --min-overlap {self.min_overlap:g}"
        return (f"{REDUCE_COMMAND} {results} --expect {self.expect} --budget-gbps {self.budget_gbps:.3f} "
                f"--wait-seconds {self.wait_seconds}{overlap}")
