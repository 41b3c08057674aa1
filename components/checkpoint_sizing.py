"""Checkpoint sizing: can each declared filesystem absorb one checkpoint inside the time budget?

Pure arithmetic, no Pulumi: config validation (strict mode), the component's warnings and the preview
summary all call it. Units are decimal, as storage vendors quote them: 1 TB = 1000 GB, GB/s = 1e9 B/s.
The default budget is the lesson from large clusters: 1 TB in 30 s, i.e. 33.3 GB/s aggregate. Spread
over 256 writers that is only 130 MB/s each; the filesystem's aggregate (and its metadata service,
with that many files created at once) is the limit, not a node's link. With few writers the
per-writer rate can exceed what one client link carries, which no filesystem can fix.
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
