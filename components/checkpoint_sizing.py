"""Checkpoint sizing: can each declared filesystem absorb one checkpoint inside the time budget?

The preview's rows; the arithmetic (and the rationale behind the budget) is :mod:`components.config.sizing`,
which the config's checks use too.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from components.config.sizing import assess_filesystem, requirement_from_budget

if TYPE_CHECKING:
    from components.config import ClusterConfig


def summary_rows(cfg: ClusterConfig) -> list[tuple[str, str]]:
    """Preview lines: the budget, then each filesystem with its margin and its protected objects."""
    ck = cfg.checkpoint
    req = requirement_from_budget(ck.budget)
    rows = [(
        "checkpoint budget",
        f"{req.size_tb:g} TB in {req.seconds:g} s = {req.aggregate_gbps:.1f} GB/s aggregate; "
        f"{req.writers} writers × {req.per_writer_gbps * 1000:.0f} MB/s"
        + ("" if req.per_writer_fits_link else f" (exceeds one {req.client_link_gbps:g} GB/s client link)"),
    )]
    for fs in ck.filesystems:
        margin = assess_filesystem(fs, ck.budget)
        verdict = "meets budget" if margin.meets else ("FAILS budget (strict)" if ck.strict else "WARN below budget")
        protected = [f"PersistentVolumeClaim {cfg.training_namespace}/{fs.object_name}"]
        if not fs.dynamic:
            protected.append(f"PersistentVolume {fs.object_name}")
        rows.append((
            f"checkpoint {fs.name}",
            f"{fs.backend} ({fs.driver_name}), {fs.write_gbps:g} GB/s declared, margin "
            f"{margin.margin_gbps:+.1f} GB/s ({margin.ratio:.2f}×, {margin.seconds_at_declared:.0f} s per "
            f"checkpoint): {verdict}; protected + retainOnDelete: {', '.join(protected)}",
        ))
    check = ck.throughput_check
    if check.enabled:
        writers = check.nodes * check.writers_per_node
        when = "weekly CronJob" if check.weekly else "Job on each change"
        rows.append((
            "checkpoint throughput check",
            f"{when} on '{check.filesystem}': {check.nodes} nodes × {check.writers_per_node} fio writers "
            f"({writers}) × {check.size_per_writer_gi} GiB, pass at ≥ {req.aggregate_gbps:.1f} GB/s",
        ))
    return rows
