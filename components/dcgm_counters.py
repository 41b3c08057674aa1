"""The DCGM exporter counters CSV of our own, and a parser that validates any such CSV.

Why our own list: the upstream default leaves the fields that tell the truth about a training fleet off
(SM activity and occupancy, NVLink error counters, thermal violation, clock-event reasons, XID counts),
and plain ``DCGM_FI_DEV_GPU_UTIL`` only says a kernel was resident, not that tensor cores did work. The
file format is dcgm-exporter's: ``FIELD, prometheus type, help`` per line, ``#`` comments.
"""

from __future__ import annotations

from dataclasses import dataclass

METRIC_TYPES = frozenset({"gauge", "counter", "label"})


@dataclass(frozen=True)
class Counter:
    """One line of the CSV."""

    field: str
    type: str
    help: str


# Grouped as the dashboard and the alert rules use them; every field here is one the rules or panels read.
COUNTERS: tuple[tuple[str, tuple[Counter, ...]], ...] = (
    (
        "Temperature and power: the 78 C rule and the thermal guard read GPU_TEMP",
        (
            Counter("DCGM_FI_DEV_GPU_TEMP", "gauge", "GPU temperature (in C)."),
            Counter("DCGM_FI_DEV_MEMORY_TEMP", "gauge", "Memory (HBM) temperature (in C)."),
            Counter("DCGM_FI_DEV_POWER_USAGE", "gauge", "Power draw (in W)."),
            Counter(
                "DCGM_FI_DEV_THERMAL_VIOLATION", "counter", "Throttling duration due to thermal constraints (in us)."
            ),
            Counter(
                "DCGM_FI_DEV_CLOCKS_EVENT_REASONS",
                "gauge",
                "Bitmask of current clock-event (throttle) reasons.",
            ),
            Counter("DCGM_FI_DEV_SM_CLOCK", "gauge", "SM clock frequency (in MHz)."),
        ),
    ),
    (
        "Activity: tensor pipe and SM activity instead of the utilization that lies",
        (
            Counter("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "gauge", "Ratio of cycles the tensor (HMMA) pipe is active."),
            Counter("DCGM_FI_PROF_SM_ACTIVE", "gauge", "Ratio of cycles an SM has at least one warp assigned."),
            Counter(
                "DCGM_FI_PROF_SM_OCCUPANCY",
                "gauge",
                "Ratio of warps resident on an SM to the maximum it supports.",
            ),
            Counter("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "gauge", "Ratio of time the graphics engine is active."),
            Counter(
                "DCGM_FI_PROF_DRAM_ACTIVE",
                "gauge",
                "Ratio of cycles the device memory interface is active sending or receiving data.",
            ),
            Counter(
                "DCGM_FI_DEV_GPU_UTIL",
                "gauge",
                "GPU utilization (in %) kept for comparison only: it counts resident kernels and not work.",
            ),
            Counter("DCGM_FI_DEV_FB_USED", "gauge", "Framebuffer memory used (in MiB)."),
        ),
    ),
    (
        "NVLink: bandwidth and the error counters that precede NCCL failures",
        (
            Counter(
                "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
                "counter",
                "Total number of NVLink bandwidth counters for all lanes.",
            ),
            # DCGM defines these two as rates (bytes per second) and dcgm-exporter types them gauge: read
            # them as they are (avg_over_time), never through rate().
            Counter("DCGM_FI_PROF_NVLINK_TX_BYTES", "gauge", "NVLink bytes transmitted per second."),
            Counter("DCGM_FI_PROF_NVLINK_RX_BYTES", "gauge", "NVLink bytes received per second."),
            Counter(
                "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
                "counter",
                "NVLink flow-control CRC errors across all lanes.",
            ),
            Counter(
                "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL", "counter", "NVLink data CRC errors across all lanes."
            ),
            Counter("DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL", "counter", "NVLink replay errors across all lanes."),
            Counter(
                "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL", "counter", "NVLink recovery errors across all lanes."
            ),
        ),
    ),
    (
        "Errors: XIDs, ECC and row remapping decide drain or RMA",
        (
            Counter("DCGM_FI_DEV_XID_ERRORS", "gauge", "Value of the last XID error encountered."),
            Counter("DCGM_EXP_XID_ERRORS_COUNT", "gauge", "Count of XID errors within the window by xid label."),
            Counter("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "counter", "Total volatile double-bit ECC errors."),
            Counter("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "counter", "Rows remapped for uncorrectable errors."),
            Counter("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "counter", "Rows remapped for correctable errors."),
            Counter("DCGM_FI_DEV_ROW_REMAP_FAILURE", "gauge", "Whether remapping of rows has failed (1: failed)."),
        ),
    ),
)

#: Fields the alert rules and the dashboard depend on: the parser refuses a CSV that drops one of them.
REQUIRED_FIELDS: frozenset[str] = frozenset(counter.field for _, group in COUNTERS for counter in group)


class CountersError(ValueError):
    """A counters CSV that dcgm-exporter would reject, or that drops a field we rely on."""


def render() -> str:
    """The CSV text shipped in the exporter's ConfigMap."""
    lines = [
        "# Counters of the unified GPU cluster for dcgm-exporter (generated by components/dcgm_counters.py).",
        "# Format: DCGM FIELD, Prometheus metric type, help message",
    ]
    for title, group in COUNTERS:
        lines.append("")
        lines.append(f"# {title}")
        lines.extend(f"{c.field}, {c.type}, {c.help}" for c in group)
    return "\n".join(lines) + "\n"


def parse(text: str, *, required: frozenset[str] = REQUIRED_FIELDS) -> tuple[Counter, ...]:
    """Parse and validate a counters CSV the way dcgm-exporter reads it.

    Checks, each failing with the line number: exactly three comma-separated parts (the help may not
    contain a comma: dcgm-exporter splits on every comma), a ``DCGM_FI_``/``DCGM_EXP_`` field name in
    upper case, a known metric type, a non-empty help, no duplicate field; then that every field in
    ``required`` is present.
    """
    counters: list[Counter] = []
    seen: dict[str, int] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        parts = [part.strip() for part in line.split(",")]
        if len(parts) != 3:
            raise CountersError(f"line {number}: expected 'FIELD, type, help' (3 parts), got {len(parts)}")
        field, kind, help_text = parts
        if not (field.startswith(("DCGM_FI_", "DCGM_EXP_")) and field.replace("_", "").isalnum()):
            raise CountersError(f"line {number}: {field!r} is not a DCGM field name")
        if field != field.upper():
            raise CountersError(f"line {number}: {field!r} must be upper case")
        if kind not in METRIC_TYPES:
            raise CountersError(f"line {number}: type {kind!r} is not one of {sorted(METRIC_TYPES)}")
        if not help_text:
            raise CountersError(f"line {number}: {field} has no help text")
        if field in seen:
            raise CountersError(f"line {number}: {field} already defined on line {seen[field]}")
        seen[field] = number
        counters.append(Counter(field, kind, help_text))
    missing = sorted(required - seen.keys())
    if missing:
        raise CountersError(f"required fields missing: {', '.join(missing)}")
    return tuple(counters)
