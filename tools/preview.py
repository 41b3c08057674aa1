"""``make preview``: what a change would do, on a few screens, and the full diff in a file.

Runs ``pulumi preview --diff`` with the policy pack, on the user's own ``pulumi`` when one at or above the
SDK's version is on PATH, else on the project's build (``make engine``; see tools/engine_select.py,
``ENGINE=built|path`` chooses); when no engine can run on this machine it says so in one line and uses the
mock runtime alone. The engine's per-object diff (tens of thousands of lines for prod) goes to
``.state/preview/<stack>.diff`` as it arrives (and to the terminal with ``--diff``, ``make preview DIFF=1``);
the terminal gets the engine's warnings and errors as they come, then, in this order: the change summary
(resources by type and operation), the policy pack's verdicts, the engine's diagnostics, the stack's
declarations (GPUs per pool, priority tiers, queues, and each capability's own rows), where the diff is,
and last the engine that ran.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

import components
from components.config import ClusterConfig, ConfigError, parse_config
from components.mockrt import ROOT, Registered, RunResult, raw_from_stack, run_program
from tools.engine_select import ENGINE_BUILD_ESTIMATE, EngineChoice, EngineSelectionError, select_engine
from tools.preview_output import EngineReport
from tools.preview_output import read as read_engine_output
from tools.progress import heartbeat

DIFF_DIR = ROOT / ".state" / "preview"
# Engine lines worth a reviewer's eye while the run goes on; the rest is the per-object diff.
_LIVE_PREFIXES = ("Previewing", "note:", "warning:", "error:", "preview:")
#: The provider's warning for each Secret in render mode: about an `up`'s output, never true of a preview.
RENDER_SECRET_WARNING = "warning: rendered YAML will contain a secret value in plaintext"

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


def change_table(report: EngineReport) -> Table:
    """Resources by type and operation, as the engine counted them: what a reviewer reads first."""
    ops = report.operations()
    total = sum(report.changes.values())
    table = Table(title=f"What the engine would change ({total} resources)")
    table.add_column("resource type (kubernetes: left out)")
    for op in ops:
        table.add_column(op, justify="right")
    for rtype, counts in report.by_type():
        table.add_row(rtype.removeprefix("kubernetes:"), *(str(counts.get(op, "")) for op in ops))
    if report.protected:
        table.add_row("of which protected", *(str(report.protected.get(op, "")) for op in ops))
    return table


def engine_verdicts(report: EngineReport, console: Console) -> None:
    """The policy pack's verdicts and the engine's diagnostics, as the engine printed them."""
    for line in report.blocks.get("Resources", []):
        console.print(line, highlight=False, markup=False, soft_wrap=True)
    violations = report.blocks.get("Policy Violations")
    if violations:
        counted = ", ".join(f"{n} {level}" for level, n in sorted(report.verdicts.items()))
        console.print(f"policy pack: {counted or 'violations'} (below, as the engine printed them)", highlight=False)
        for line in violations:
            console.print(line, highlight=False, markup=False, soft_wrap=True)
    elif "Policy Packs run" in report.blocks or "Policies" in report.blocks:
        console.print("policy pack: no violations", highlight=False)
    else:
        console.print("[red]policy pack: the engine reported no policy pack run[/red]")
    for line in report.blocks.get("Diagnostics", []):
        console.print(line, highlight=False, markup=False, soft_wrap=True)


def summary(stack: str, console: Console, report: EngineReport | None = None) -> int:
    """The declaration tables; with an engine ``report``, its change table and verdicts before them."""
    try:
        cfg = parse_config(raw_from_stack(stack), f"Pulumi.{stack}.yaml")
        result = run_program(stack)
    except (ConfigError, FileNotFoundError) as error:
        console.print(f"[red]error:[/red] {error}")
        return 2
    if report is not None:
        console.print(change_table(report))
        engine_verdicts(report, console)
    console.print(declared_table(cfg))
    for title, rows in capability_rows():
        table = Table(title=title)
        table.add_column("item")
        table.add_column("value")
        for key, value in rows(cfg):
            table.add_row(key, value)
        console.print(table)
    if report is None:
        # Without an engine, the mock runtime's registrations are the only count there is.
        console.print(components_table(result))
        console.print(counts_table(result))
    return 0


def real_engine_preview(
    stack: str, console: Console, choice: EngineChoice, diff_path: Path, echo_diff: bool = False,
) -> tuple[int, EngineReport] | None:
    """Run the chosen engine's preview into ``diff_path``; None when the project's build cannot run here."""
    try:
        runner: Any = importlib.import_module("tools.engine_runner")
    except ImportError:
        return None
    if choice.kind == "built" and not runner.engine_available():
        console.print(f"preview: building the real engine from Go modules first ({ENGINE_BUILD_ESTIMATE}; "
                      "`make preview MOCK=1` skips it, a pulumi CLI on PATH replaces it)")
        if not runner.ensure_engine():
            return None
    diff_path.parent.mkdir(parents=True, exist_ok=True)
    lines: list[str] = []
    render_warnings = 0
    with diff_path.open("w", encoding="utf-8") as diff:

        def sink(line: str) -> None:
            nonlocal render_warnings
            lines.append(line)
            diff.write(line + "\n")
            if line.strip() == RENDER_SECRET_WARNING:
                render_warnings += 1  # said once, correctly, below
                return
            if echo_diff or line.startswith(_LIVE_PREFIXES):
                # The engine's own lines, unwrapped: its diff lines are wider than a terminal's default.
                sys.stdout.write(line + "\n")
                sys.stdout.flush()

        try:
            with heartbeat(f"preview: pulumi preview --stack {stack}"):
                code = runner.streamed_preview(stack, sink, policy_pack=True, cli=choice.cli)
        except runner.EngineError as error:
            console.print(f"[red]preview:[/red] {error}")
            return 1, read_engine_output("")
    if render_warnings:
        console.print(f"preview: {render_warnings} Secret(s) in the stack; the offline engine previews in the "
                      "provider's render mode (the Volcano chart expands without a cluster), which warns that an "
                      "`up` in that mode would write their values in plaintext. This preview wrote none: its render "
                      "folder is removed after every run.", highlight=False, soft_wrap=True)
    if code != 0 and choice.kind == "path":
        sys.stderr.write("preview: your pulumi failed; `pulumi stack ls` shows the stacks of your backend, "
                         "and ENGINE=built previews offline on the project's build instead\n")
    return int(code), read_engine_output("\n".join(lines))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--stack", default="prod")
    parser.add_argument("--mock-only", action="store_true", help="skip the real engine even when it is built")
    parser.add_argument("--diff", action="store_true", help="print the engine's per-object diff here too")
    parser.add_argument("--diff-file", type=Path, help="where the per-object diff goes "
                        "(default .state/preview/<stack>.diff)")
    args = parser.parse_args(argv)
    console = Console()
    diff_path: Path = args.diff_file or DIFF_DIR / f"{args.stack}.diff"
    code: int | None = None
    report: EngineReport | None = None
    if args.mock_only:
        ran = "engine: none (MOCK=1: the mock runtime only)"
    else:
        try:
            choice = select_engine()
        except EngineSelectionError as error:
            console.print(f"[red]preview:[/red] {error}")
            return 2
        console.print(choice.describe(), highlight=False, soft_wrap=True)
        outcome = real_engine_preview(args.stack, console, choice, diff_path, echo_diff=args.diff)
        ran = choice.describe()
        if outcome is None:
            ran = "engine: none (the project's build cannot run here); the mock runtime only"
            console.print("preview: real Pulumi engine not available here; showing the mock-runtime preview")
        else:
            code, report = outcome
    rc = summary(args.stack, console, report)
    if report is not None:
        console.print(f"full diff: {_shown(diff_path)} ({report.lines:,} lines; `make preview DIFF=1` prints it here)",
                      highlight=False, soft_wrap=True)
    console.print(ran, highlight=False, soft_wrap=True)
    return rc or (code or 0)


def _shown(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)


if __name__ == "__main__":
    sys.exit(main())
