"""``gpucluster train submit|list|status|logs|cancel``: click commands over the shell in ``kube``."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
import yaml
from rich.console import Console
from rich.table import Table

from gpucluster_cli.kube import CliError, Cluster
from gpucluster_cli.render import pod_monitor, team_label, volcano_job, worker_selector
from gpucluster_cli.spec import SpecError, load_spec, resolve
from gpucluster_cli.views import UNSCHEDULED, checkpoint_step, job_row, summarize, worker_pod

DEFAULT_NAMESPACE = "training"
TRAINER_CONTAINER = "trainer"

#: Tests replace this to talk to a fake API; the default reads the user's kubeconfig.
ClusterFactory = Callable[[str | None, str], Cluster]
cluster_factory: ClusterFactory = Cluster.from_kubeconfig


def _console() -> Console:
    return Console(highlight=False, soft_wrap=True)


def _fail(message: str) -> None:
    Console(stderr=True, highlight=False, soft_wrap=True).print(f"[bold red]error:[/] {message}", markup=True)
    sys.exit(1)


class _Ctx:
    def __init__(self, context: str | None, namespace: str) -> None:
        self.context, self.namespace = context, namespace
        self._cluster: Cluster | None = None

    @property
    def cluster(self) -> Cluster:
        if self._cluster is None:
            self._cluster = cluster_factory(self.context, self.namespace)
        return self._cluster


@click.group()
@click.option("--context", default=None, help="kubeconfig context (default: the current one)")
@click.option("--namespace", "-n", default=lambda: os.environ.get("GPUCLUSTER_NAMESPACE", DEFAULT_NAMESPACE),
              show_default="training or $GPUCLUSTER_NAMESPACE", help="the cluster's training namespace")
@click.pass_context
def main(ctx: click.Context, context: str | None, namespace: str) -> None:
    """Submit and watch training on the GPU cluster."""
    ctx.obj = _Ctx(context, namespace)


@main.group()
def train() -> None:
    """Training jobs: submit, list, status, logs, cancel."""


def _guard(fn: Callable[..., None]) -> Callable[..., None]:
    """Turn the CLI's own errors into one red line and exit code 1."""
    def wrapped(*args: Any, **kwargs: Any) -> None:
        try:
            fn(*args, **kwargs)
        except (CliError, SpecError) as exc:
            _fail(str(exc))
    wrapped.__name__, wrapped.__doc__ = fn.__name__, fn.__doc__
    return wrapped


@train.command()
@click.argument("spec_file", type=click.Path(path_type=Path))
@click.option("--dry-run", is_flag=True, help="render and validate on the server; create nothing")
@click.option("--show", is_flag=True, help="print the objects as YAML")
@click.pass_obj
@_guard
def submit(obj: _Ctx, spec_file: Path, dry_run: bool, show: bool) -> None:
    """Submit the job in SPEC_FILE (name, image, command, gpus, pool, checkpointInterval, team)."""
    spec = load_spec(spec_file)
    cluster = obj.cluster
    settings = cluster.settings()
    job = resolve(spec, settings, str(spec_file))
    vj, pm = volcano_job(settings, job, spec.team), pod_monitor(settings, job, spec.team)
    out = _console()
    if show:
        out.print(yaml.safe_dump_all([vj, pm], sort_keys=False), markup=False)
    cluster.apply(vj, dry_run=dry_run)
    monitor_note = ""
    try:
        cluster.apply(pm, dry_run=dry_run)
    except CliError as exc:
        monitor_note = f" (no metrics scrape: {exc})"
    verb = "would submit" if dry_run else "submitted"
    out.print(f"{verb} [bold]{job.name}[/]: {job.workers} × {job.gpus_per_worker} GPUs in pool {job.pool}, "
              f"queue {vj['spec']['queue']}, namespace {settings.training_namespace}{monitor_note}")
    if not dry_run:
        out.print(f"watch it with: gpucluster train status {job.name}")


@train.command(name="list")
@click.pass_obj
@_guard
def list_jobs(obj: _Ctx) -> None:
    """The training jobs in the namespace."""
    cluster = obj.cluster
    settings = cluster.settings()
    jobs = cluster.jobs()
    out = _console()
    if not jobs:
        out.print(f"no training jobs in namespace {cluster.namespace}")
        return
    table = Table("NAME", "PHASE", "QUEUE", "TEAM", "RUNNING", "MANAGED BY")
    for job in sorted(jobs, key=lambda j: j["metadata"]["name"]):
        table.add_row(*job_row(job, team_label(settings)))
    out.print(table)


@train.command()
@click.argument("name")
@click.pass_obj
@_guard
def status(obj: _Ctx, name: str) -> None:
    """The gang's state, pods per node, restarts and the last checkpoint step."""
    cluster = obj.cluster
    settings = cluster.settings()
    st = summarize(cluster.job(name), cluster.pods(worker_selector(settings, name)))
    step = None
    if st.pod_phases.get(worker_pod(name, 0)) == "Running":
        text = cluster.metrics(worker_pod(name, 0), settings.metrics_port)
        step = checkpoint_step(text) if text is not None else None
    out = _console()
    running = sum(1 for phase in st.pod_phases.values() if phase == "Running")
    out.print(f"[bold]{st.name}[/]  gang {st.phase}  queue {st.queue}  workers running {running}/{st.min_available}")
    out.print(f"restarts: gang {st.gang_restarts}, containers {st.container_restarts}")
    out.print(f"last checkpoint step: {step if step is not None else 'unknown (rank 0 not running or no metrics)'}")
    table = Table("NODE", "PODS")
    for node, pods in st.pods_per_node.items():
        table.add_row(node, ", ".join(f"{p} ({st.pod_phases[p]})" for p in pods))
    if st.pods_per_node:
        out.print(table)
    elif st.phase in ("Pending", "Inqueue"):
        out.print("no pods yet: the gang waits in its queue until all of its workers fit")
    if UNSCHEDULED in st.pods_per_node:
        out.print("unscheduled pods wait for the whole gang to fit (or for the handover gate to lift)")


@train.command()
@click.argument("name")
@click.option("--rank", type=click.IntRange(min=0), default=0, show_default=True, help="which worker")
@click.option("--follow", "-f", is_flag=True, help="stream until the container stops")
@click.pass_obj
@_guard
def logs(obj: _Ctx, name: str, rank: int, follow: bool) -> None:
    """The trainer's log of one worker (rank 0 by default)."""
    cluster = obj.cluster
    cluster.job(name)
    for chunk in cluster.logs(worker_pod(name, rank), TRAINER_CONTAINER, follow):
        click.echo(chunk, nl=False)


@train.command()
@click.argument("name")
@click.pass_obj
@_guard
def cancel(obj: _Ctx, name: str) -> None:
    """Delete the job and its pods; checkpoints stay on the checkpoint filesystem."""
    if not obj.cluster.delete(name):
        raise CliError(f"no training job '{name}' in namespace '{obj.namespace}' (see `gpucluster train list`)")
    _console().print(f"cancelled [bold]{name}[/]; its checkpoints stay in its directory on the checkpoint "
                     f"filesystem")
