"""Outcome table (rich) and plot (matplotlib, Agg) shared by `make simulate` and `make bench`."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from bench.sim.engine import Outcome

#: (key, header, format) of the columns every outcome table shows, in order.
COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("onprem_gpu_utilization", "on-prem util", "{:.2%}"),
    ("training_gpu_utilization", "training util", "{:.2%}"),
    ("inference_availability", "availability", "{:.3%}"),
    ("worst_window_availability", "worst 5 min", "{:.1%}"),
    ("external_gpu_hours", "external GPU·h", "{:,.0f}"),
    ("evictions_per_hour", "evictions/h", "{:.2f}"),
    ("taint_flips", "taint flips", "{}"),
    ("return_minutes_mean", "return min (mean)", "{:.0f}"),
    ("return_minutes_max", "return min (max)", "{:.0f}"),
    ("burst_open_share", "burst open", "{:.1%}"),
    ("gang_wait_hours_mean", "gang wait h", "{:.2f}"),
)


def cell(value: object, fmt: str) -> str:
    if value is None:
        return "–"
    return fmt.format(value)


def rows(outcomes: Sequence[Outcome]) -> list[list[str]]:
    return [[o.policy] + [cell(getattr(o, key), fmt) for key, _, fmt in COLUMNS] for o in outcomes]


def markdown_table(outcomes: Sequence[Outcome]) -> str:
    header = ["policy"] + [h for _, h, _ in COLUMNS]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in rows(outcomes)]
    return "\n".join(lines)


def print_table(outcomes: Sequence[Outcome], title: str) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    table.add_column("policy")
    for _, header, _ in COLUMNS:
        table.add_column(header, justify="right")
    for r in rows(outcomes):
        table.add_row(*r)
    console = Console()
    if not console.is_terminal:
        console = Console(width=200)  # piped or captured: print every column in full
    console.print(table)


def plot(outcome: Outcome, capacity: int, path: Path, title: str) -> Path:
    """GPU use by training / inference on-prem / inference external over time, burst-open periods shaded."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    samples = outcome.samples
    if not samples:
        raise ValueError("no samples to plot (the measured period is shorter than one sample)")
    t0 = samples[0][0]
    days = [(s[0] - t0) / 86400.0 for s in samples]
    train = [s[1] for s in samples]
    onprem = [s[2] for s in samples]
    external = [s[3] for s in samples]
    fig, ax = plt.subplots(figsize=(12, 4.5), dpi=110)
    ax.stackplot(days, train, onprem, external, labels=["training", "inference on-prem", "inference external"],
                 colors=["#4C72B0", "#55A868", "#C44E52"], step="post")
    ax.axhline(capacity, color="black", linewidth=0.8, linestyle="--", label=f"on-prem GPUs ({capacity:,})")
    top = max(capacity, max(a + b + c for a, b, c in zip(train, onprem, external, strict=True))) * 1.05
    ax.fill_between(days, 0, top, where=[s[4] == 1 for s in samples], step="post", color="#DD8452", alpha=0.15,
                    label="burst taint open")
    ax.set_xlim(days[0], days[-1])
    ax.set_ylim(0, top)
    ax.set_xlabel("day")
    ax.set_ylabel("GPUs")
    ax.set_title(title)
    ax.legend(loc="lower left", fontsize=8, ncol=5)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path
