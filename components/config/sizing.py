"""Checkpoint sizing arithmetic: can each declared filesystem absorb one checkpoint inside the time budget, and
how long does one emergency checkpoint take?

Pure arithmetic, no Pulumi: config validation (strict mode), the component's warnings and the preview
summary all call it. Units are decimal, as storage vendors quote them: 1 TB = 1000 GB, GB/s = 1e9 B/s.
The default budget is the lesson from large clusters: 1 TB in 30 s, i.e. 33.3 GB/s aggregate. Spread
over 256 writers that is only 130 MB/s each; the filesystem's aggregate (and its metadata service,
with that many files created at once) is the limit, not a node's link. With few writers the
per-writer rate can exceed what one client link carries, which no filesystem can fix.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from components.config.checkpoint import CheckpointBudget, Filesystem
    from components.config.cluster import ClusterConfig

GB_PER_TB = 1000.0


@dataclass(frozen=True)
class Requirement:
    """Bandwidth one checkpoint needs to land within its budget."""

    size_tb: float
    seconds: float
    writers: int
    client_link_gbps: float

    @property
    def aggregate_gbps(self) -> float:
        return self.size_tb * GB_PER_TB / self.seconds

    @property
    def per_writer_gbps(self) -> float:
        return self.aggregate_gbps / self.writers

    @property
    def per_writer_fits_link(self) -> bool:
        """One writer's share must fit one client link, whatever the filesystem behind it."""
        return self.per_writer_gbps <= self.client_link_gbps


def requirement(size_tb: float = 1.0, seconds: float = 30.0, writers: int = 256,
                client_link_gbps: float = 50.0) -> Requirement:
    if size_tb <= 0 or seconds <= 0 or writers <= 0 or client_link_gbps <= 0:
        raise ValueError("size, seconds, writers and link bandwidth must be positive")
    return Requirement(size_tb, seconds, writers, client_link_gbps)


def requirement_from_budget(budget: CheckpointBudget) -> Requirement:
    return requirement(budget.size_tb, budget.seconds, budget.writers, budget.client_link_gbps)


@dataclass(frozen=True)
class Margin:
    """One filesystem against the requirement: positive margin means it meets the budget."""

    name: str
    declared_gbps: float
    required: Requirement

    @property
    def margin_gbps(self) -> float:
        return self.declared_gbps - self.required.aggregate_gbps

    @property
    def ratio(self) -> float:
        return self.declared_gbps / self.required.aggregate_gbps

    @property
    def meets(self) -> bool:
        return self.margin_gbps >= 0 and self.required.per_writer_fits_link

    @property
    def seconds_at_declared(self) -> float:
        """How long one checkpoint takes at the declared bandwidth."""
        return self.required.size_tb * GB_PER_TB / self.declared_gbps

    def reason(self) -> str:
        """Why it does not meet the budget (empty when it does)."""
        req = self.required
        if not req.per_writer_fits_link:
            return (f"{req.writers} writers need {req.per_writer_gbps:.1f} GB/s each, more than one "
                    f"{req.client_link_gbps:g} GB/s client link; add writers")
        if self.margin_gbps < 0:
            return (f"declares {self.declared_gbps:g} GB/s but {req.size_tb:g} TB in {req.seconds:g} s needs "
                    f"{req.aggregate_gbps:.1f} GB/s; one checkpoint would take {self.seconds_at_declared:.0f} s")
        return ""


def assess(name: str, declared_gbps: float, required: Requirement) -> Margin:
    if declared_gbps <= 0:
        raise ValueError("declared bandwidth must be positive")
    return Margin(name, declared_gbps, required)


def assess_filesystem(fs: Filesystem, budget: CheckpointBudget) -> Margin:
    return assess(fs.name, fs.write_gbps, requirement_from_budget(budget))


def sizing_problems(cfg: ClusterConfig, strict_only: bool = False) -> list[tuple[str, str, Any]]:
    """``(key path, message, value)`` for every filesystem that cannot meet the budget.

    With ``strict_only`` the list is empty unless ``checkpoint.strict`` is set: config validation
    fails only in strict mode, while the component turns the same findings into warnings.
    """
    if strict_only and not cfg.checkpoint.strict:
        return []
    found = []
    for index, fs in enumerate(cfg.checkpoint.filesystems):
        margin = assess_filesystem(fs, cfg.checkpoint.budget)
        if not margin.meets:
            key = "writeGbps" if margin.required.per_writer_fits_link else None
            path = (f"checkpoint.filesystems[{index}].{key}" if key else "checkpoint.budget.writers")
            value: Any = fs.write_gbps if key else cfg.checkpoint.budget.writers
            found.append((path, f"filesystem '{fs.name}' cannot meet the checkpoint budget: {margin.reason()}",
                          value))
    return found


#: Device-to-host copy of a rank's state before it is written (the snapshot): a conservative PCIe/NVLink-C2C
#: figure, so the grace errs long. An H100 over PCIe Gen5 copies at 25-50 GB/s.
SNAPSHOT_GBPS = 10.0
#: Twice the estimate: a grace that only just holds one checkpoint loses it to the first slow write.
GRACE_MARGIN = 2.0
#: Kubernetes' own default grace: never shorter.
GRACE_FLOOR_SECONDS = 30


def emergency_checkpoint_seconds(size_tb: float, ranks: int, write_gbps: float, client_link_gbps: float) -> float:
    """Seconds for one emergency checkpoint on SIGTERM: every rank snapshots its shard, then writes it.

    Each rank writes ``size / ranks`` at its share of the filesystem's aggregate (all ranks write at once),
    capped by one client link. That is the whole checkpoint at the aggregate rate, unless few ranks make
    the link the limit.
    """
    if size_tb <= 0 or ranks <= 0 or write_gbps <= 0 or client_link_gbps <= 0:
        raise ValueError("size, ranks, write and link bandwidth must be positive")
    shard_gb = size_tb * GB_PER_TB / ranks
    per_writer_gbps = min(write_gbps / ranks, client_link_gbps)
    return shard_gb / SNAPSHOT_GBPS + shard_gb / per_writer_gbps


def termination_grace_seconds(size_tb: float, ranks: int, write_gbps: float, client_link_gbps: float) -> int:
    """The ``terminationGracePeriodSeconds`` that holds one emergency checkpoint with margin."""
    needed = GRACE_MARGIN * emergency_checkpoint_seconds(size_tb, ranks, write_gbps, client_link_gbps)
    return max(GRACE_FLOOR_SECONDS, math.ceil(needed))
