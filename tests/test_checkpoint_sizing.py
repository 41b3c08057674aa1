"""Sizing arithmetic: bandwidth one checkpoint needs, and each filesystem's margin against it."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from components.checkpoint_sizing import summary_rows
from components.config import parse_config
from components.config.sizing import (
    GRACE_FLOOR_SECONDS,
    assess,
    emergency_checkpoint_seconds,
    requirement,
    sizing_problems,
    termination_grace_seconds,
)
from components.mockrt import raw_from_stack


@pytest.mark.parametrize(
    ("size_tb", "seconds", "writers", "aggregate", "per_writer", "fits_link"),
    [
        (1.0, 30.0, 256, 33.333, 0.1302, True),    # the default budget: many writers need little each
        (1.0, 30.0, 2048, 33.333, 0.0163, True),   # thousands of ranks: 16 MB/s each, metadata is the load
        (1.0, 30.0, 8, 33.333, 4.1667, True),      # one node's worth of writers: 4.2 GB/s each
        (1.0, 30.0, 1, 33.333, 33.333, True),      # a single writer still fits one NDR port
        (2.0, 20.0, 1, 100.0, 100.0, False),       # 100 GB/s from one writer exceeds a 50 GB/s link
        (0.05, 30.0, 32, 1.667, 0.0521, True),     # the local stack's small model
    ],
)
def test_requirement(size_tb: float, seconds: float, writers: int, aggregate: float, per_writer: float,
                     fits_link: bool) -> None:
    req = requirement(size_tb, seconds, writers)
    assert req.aggregate_gbps == pytest.approx(aggregate, abs=1e-3)
    assert req.per_writer_gbps == pytest.approx(per_writer, abs=1e-3)
    assert req.per_writer_fits_link is fits_link


@pytest.mark.parametrize(
    ("declared", "margin", "ratio", "seconds", "meets"),
    [
        (60.0, 26.667, 1.8, 16.7, True),
        (40.0, 6.667, 1.2, 25.0, True),
        (33.0, -0.333, 0.99, 30.3, False),
        (2.0, -31.333, 0.06, 500.0, False),
    ],
)
def test_margin_against_the_default_budget(declared: float, margin: float, ratio: float, seconds: float,
                                           meets: bool) -> None:
    m = assess("fs", declared, requirement())
    assert m.margin_gbps == pytest.approx(margin, abs=1e-3)
    assert m.ratio == pytest.approx(ratio, abs=1e-3)
    assert m.seconds_at_declared == pytest.approx(seconds, abs=0.1)
    assert m.meets is meets
    assert (m.reason() == "") is meets


def test_reason_names_the_numbers() -> None:
    assert assess("fs", 2.0, requirement()).reason() == (
        "declares 2 GB/s but 1 TB in 30 s needs 33.3 GB/s; one checkpoint would take 500 s")
    assert "add writers" in assess("fs", 500.0, requirement(2.0, 20.0, 1)).reason()


def test_too_few_writers_fails_even_a_fast_filesystem() -> None:
    assert not assess("fs", 500.0, requirement(2.0, 20.0, 1)).meets


@pytest.mark.parametrize("bad", [dict(size_tb=0), dict(seconds=0), dict(writers=0), dict(client_link_gbps=-1)])
def test_requirement_refuses_non_positive_inputs(bad: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="must be positive"):
        requirement(**bad)  # type: ignore[arg-type]


def test_problems_name_the_filesystem_key() -> None:
    raw = raw_from_stack("local")
    raw["checkpoint"] = {**raw["checkpoint"], "budget": {"sizeTb": 1.0, "seconds": 30}}
    cfg = parse_config(raw, "Pulumi.local.yaml")
    assert sizing_problems(cfg, strict_only=True) == []  # not strict: the component warns instead
    [(path, message, value)] = sizing_problems(cfg)
    assert path == "checkpoint.filesystems[0].writeGbps"
    assert message.startswith("filesystem 'nfs-ckpt' cannot meet the checkpoint budget: declares 2 GB/s")
    assert value == 2


def test_summary_rows_for_prod() -> None:
    cfg = parse_config(raw_from_stack("prod"), "Pulumi.prod.yaml")
    rows = dict(summary_rows(cfg))
    assert rows["checkpoint budget"] == "1 TB in 30 s = 33.3 GB/s aggregate; 256 writers × 130 MB/s"
    weka = rows["checkpoint weka-ckpt"]
    assert weka.startswith("weka (csi.weka.io), 60 GB/s declared, margin +26.7 GB/s (1.80×, 17 s per checkpoint)")
    assert weka.endswith("protected + retainOnDelete: PersistentVolumeClaim training/checkpoints-weka-ckpt")
    assert "margin +6.7 GB/s (1.20×" in rows["checkpoint vast-ckpt"]
    check = rows["checkpoint throughput check"]
    assert check.startswith("weekly CronJob on 'weka-ckpt': 32 nodes × 8 fio writers (256)")


# ---------------------------------------------------------------------------------------------- grace on SIGTERM

@pytest.mark.parametrize(("size_tb", "ranks", "write", "link", "seconds", "grace"), [
    # 1 TB from 512 ranks to a 60 GB/s filesystem: 16.7 s at the aggregate, plus a 0.2 s snapshot.
    (1.0, 512, 60.0, 50.0, 1000 / 512 / 10 + 1000 / 60, 34),
    # Few ranks: one client link is the limit, not the filesystem.
    (1.0, 8, 1000.0, 50.0, 125 / 10 + 125 / 50, 30),
    # A slow NFS: the default 30 s grace would lose the checkpoint.
    (1.0, 32, 2.0, 50.0, 1000 / 32 / 10 + 500, 1007),
])
def test_the_grace_holds_one_emergency_checkpoint_with_margin(size_tb: float, ranks: int, write: float, link: float,
                                                              seconds: float, grace: int) -> None:
    assert emergency_checkpoint_seconds(size_tb, ranks, write, link) == pytest.approx(seconds)
    assert termination_grace_seconds(size_tb, ranks, write, link) == grace


@given(st.floats(0.001, 20), st.integers(1, 100_000), st.floats(0.1, 5000), st.floats(1, 400), st.floats(1.01, 4))
def test_the_grace_never_falls_below_the_floor_and_grows_with_the_checkpoint(size: float, ranks: int, write: float,
                                                                              link: float, factor: float) -> None:
    grace = termination_grace_seconds(size, ranks, write, link)
    assert grace >= GRACE_FLOOR_SECONDS
    assert grace >= 2 * emergency_checkpoint_seconds(size, ranks, write, link)
    assert termination_grace_seconds(size * factor, ranks, write, link) >= grace
    assert termination_grace_seconds(size, ranks, write * factor, link) <= grace


def test_the_stack_gives_every_checkpointing_job_its_grace(local: Any) -> None:
    job = local.one("Job", "smoke-gang")
    spec = job.inputs["spec"]["tasks"][0]["template"]["spec"]
    assert spec["terminationGracePeriodSeconds"] >= GRACE_FLOOR_SECONDS
