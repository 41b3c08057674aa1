"""``make preview``: what a stack declares and what it would create, as tables.

Runs ``pulumi preview --diff`` with the policy pack first, on the user's own ``pulumi`` when one at or above
the SDK's version is on PATH, else on the project's build (``make engine``; see tools/engine_select.py,
``ENGINE=built|path`` chooses); when no engine can run on this machine it says so in one line and uses
the mock runtime alone. The last line names the engine that ran. The
summary always comes from the mock-runtime render: components, resource counts by kind, and the
stack's declarations (GPUs per pool, priority tiers, queues, and each capability's own rows).
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys
from collections import Counter
from collections.abc import Callable
from typing import Any

from rich.console import Console
from rich.table import Table

import components
from components.config import ClusterConfig, ConfigError, parse_config
from tools.engine_select import ENGINE_BUILD_ESTIMATE, EngineChoice, EngineSelectionError, select_engine
from tools.mockrt import Registered, RunResult, raw_from_stack, run_program
from tools.progress import heartbeat

SummaryRows = Callable[[ClusterConfig], list[tuple[str, str]]]


def capability_rows() -> list[tuple[str, SummaryRows]]:
    """Every ``summary_rows(cfg)`` a component module offers, titled by the module's first doc line."""
    found = []
    for info in sorted(pkgutil.iter_modules(components.__path__), key=lambda m: m.name):
        module = importlib.import_module(f"components.{info.name}")
        rows = getattr(module, "summary_rows", None)
        if callable(rows):
            title = (module.__doc__ or info.name).strip().splitlines()[0].rstrip(".")
            found.append((title, rows))
    return found


def declared_table(cfg: ClusterConfig) -> Table:
    table = Table(title="What the stack declares", show_lines=False)
    table.add_column("item")
    table.add_column("value")
    for pool in cfg.pools:
        table.add_row(
            f"pool {pool.name}",
            f"{len(pool.node_names)} nodes × {pool.gpus_per_node} {pool.gpu_model} = {pool.gpu_count} GPUs",
        )
    table.add_row("on-prem GPUs", str(cfg.onprem_gpus))
    table.add_row("system pool", f"{cfg.system_pool.name}: {len(cfg.system_pool.node_names)} nodes")
    for tier, spec in cfg.priorities.tiers().items():
        default = " (globalDefault)" if tier is cfg.priorities.global_default else ""
        table.add_row(f"tier {tier.value}", f"{spec.name} = {spec.value}{default}")
    sched = cfg.scheduling
    table.add_row("gang scheduler", f"{sched.engine.value} (schedulerName {sched.scheduler_name})")
    training = sched.training_queue
    for name in dict.fromkeys(sched.training_queue_names(p.name for p in cfg.pools).values()):
        table.add_row(f"queue {name}", f"weight {training.weight}, reclaimable {str(training.reclaimable).lower()}")
    inference = sched.inference_queue
    table.add_row(f"queue {inference.name}",
                  f"weight {inference.weight}, reclaimable {str(inference.reclaimable).lower()}")
    for job in cfg.training.jobs:
        state = "enabled" if job.enabled else "disabled"
        table.add_row(f"training job {job.name}", f"{job.workers} × {job.gpus_per_worker} GPUs on {job.pool}, {state}")
    return table


def _kind_label(resource: Registered) -> str:
    if not (resource.custom and resource.kind):
        return resource.type
    return f"{resource.kind} (patch)" if resource.type.endswith("Patch") else resource.kind


def counts_table(result: RunResult) -> Table:
    table = Table(title=f"Resources registered ({len(result.resources)})")
    table.add_column("kind / component type")
    table.add_column("count", justify="right")
    counts = Counter(_kind_label(r) for r in result.resources)
    for kind, count in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])):
        table.add_row(kind, str(count))
    return table


def components_table(result: RunResult) -> Table:
    table = Table(title="Components")
    table.add_column("component")
    table.add_column("type")
    table.add_column("children", justify="right")
    children = Counter(r.parent for r in result.resources)
    for r in result.resources:
        if not r.custom:
            table.add_row(r.name, r.type, str(children.get(r.urn, 0)))
    return table


def summary(stack: str, console: Console) -> int:
    try:
        cfg = parse_config(raw_from_stack(stack), f"Pulumi.{stack}.yaml")
        result = run_program(stack)
    except (ConfigError, FileNotFoundError) as error:
        console.print(f"[red]error:[/red] {error}")
        return 2
    console.print(declared_table(cfg))
    for title, rows in capability_rows():
        table = Table(title=title)
        table.add_column("item")
        table.add_column("value")
        for key, value in rows(cfg):
            table.add_row(key, value)
        console.print(table)
    console.print(components_table(result))
    console.print(counts_table(result))
    return 0


def real_engine_preview(stack: str, console: Console, choice: EngineChoice) -> int | None:
    """Run the chosen engine's preview; None when the project's build cannot run on this machine."""
    try:
        runner: Any = importlib.import_module("tools.engine_runner")
    except ImportError:
        return None
    if choice.kind == "built" and not runner.engine_available():
        console.print(f"preview: building the real engine from Go modules first ({ENGINE_BUILD_ESTIMATE}; "
                      "`make preview MOCK=1` skips it, a pulumi CLI on PATH replaces it)")
        if not runner.ensure_engine():
            return None
    try:
        # The engine's output is captured until it ends (a prod preview renders the Volcano chart): say it lives.
        with heartbeat(f"preview: pulumi preview --stack {stack}"):
            proc = runner.real_preview(stack, policy_pack=True, cli=choice.cli)
    except runner.EngineError as error:
        console.print(f"[red]preview:[/red] {error}")
        return 1
    # The engine's own output, unwrapped: its diff lines are wider than a terminal's default.
    sys.stdout.write(proc.stdout)
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr)
        if choice.kind == "path":
            sys.stderr.write("preview: your pulumi failed; `pulumi stack ls` shows the stacks of your backend, "
                             "and ENGINE=built previews offline on the project's build instead\n")
    sys.stdout.flush()
    return int(proc.returncode)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--stack", default="prod")
    parser.add_argument("--mock-only", action="store_true", help="skip the real engine even when it is built")
    args = parser.parse_args(argv)
    console = Console()
    code: int | None = None
    if args.mock_only:
        ran = "engine: none (MOCK=1: the mock runtime only)"
    else:
        try:
            choice = select_engine()
        except EngineSelectionError as error:
            console.print(f"[red]preview:[/red] {error}")
            return 2
        console.print(choice.describe(), highlight=False, soft_wrap=True)
        code = real_engine_preview(args.stack, console, choice)
        ran = choice.describe()
        if code is None:
            ran = "engine: none (the project's build cannot run here); the mock runtime only"
            console.print("preview: real Pulumi engine not available here; showing the mock-runtime preview")
    rc = summary(args.stack, console)
    console.print(ran, highlight=False, soft_wrap=True)
    return rc or (code or 0)


if __name__ == "__main__":
    sys.exit(main())
