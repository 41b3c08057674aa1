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

from gpucluster_cli.kube import CliError, Cluster
from gpucluster_cli.output import FORMATS, dump, parse_duration, table
from gpucluster_cli.render import pod_monitor, team_label, volcano_job, worker_selector
from gpucluster_cli.spec import SpecError, load_spec, resolve
from gpucluster_cli.views import UNSCHEDULED, checkpoint_step, job_row, summarize, worker_pod

DEFAULT_NAMESPACE = "training"
TRAINER_CONTAINER = "trainer"

#: Tests replace this to talk to a fake API; the default reads the user's kubeconfig (context, namespace, file).
ClusterFactory = Callable[[str | None, str, str | None], Cluster]
cluster_factory: ClusterFactory = Cluster.from_kubeconfig


def _console() -> Console:
    return Console(highlight=False, soft_wrap=True)


def _fail(message: str) -> None:
    Console(stderr=True, highlight=False, soft_wrap=True).print(f"[bold red]error:[/] {message}", markup=True)
    sys.exit(1)


class _Ctx:
    def __init__(self, context: str | None, namespace: str, kubeconfig: str | None) -> None:
        self.context, self.namespace, self.kubeconfig = context, namespace, kubeconfig
        self._cluster: Cluster | None = None

    @property
    def cluster(self) -> Cluster:
        if self._cluster is None:
            self._cluster = cluster_factory(self.context, self.namespace, self.kubeconfig)
        return self._cluster


def _set(attribute: str) -> Callable[[click.Context, click.Parameter, str | None], None]:
    def callback(ctx: click.Context, param: click.Parameter, value: str | None) -> None:
        if value is not None:
            setattr(ctx.find_object(_Ctx), attribute, value)
    return callback


#: The connection flags, accepted before the command (``gpucluster -n foo train list``) and after it
#: (``gpucluster train list -n foo``), as kubectl accepts them anywhere.
KUBE_OPTIONS = (
    click.option("--namespace", "-n", default=None, expose_value=False, callback=_set("namespace"),
                 help="the cluster's training namespace"),
    click.option("--context", default=None, expose_value=False, callback=_set("context"),
                 help="kubeconfig context (default: the current one)"),
    click.option("--kubeconfig", default=None, expose_value=False, callback=_set("kubeconfig"),
                 type=click.Path(dir_okay=False), help="kubeconfig file (default: $KUBECONFIG or ~/.kube/config)"),
)


def kube_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    for option in reversed(KUBE_OPTIONS):
        fn = option(fn)
    return fn


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("gpu-cluster-agents")
    except PackageNotFoundError:
        return "unknown (not installed)"


@click.group()
@click.option("--context", default=None, help="kubeconfig context (default: the current one)")
@click.option("--namespace", "-n", default=lambda: os.environ.get("GPUCLUSTER_NAMESPACE", DEFAULT_NAMESPACE),
              show_default="training or $GPUCLUSTER_NAMESPACE", help="the cluster's training namespace")
@click.option("--kubeconfig", default=None, type=click.Path(dir_okay=False),
              help="kubeconfig file (default: $KUBECONFIG or ~/.kube/config)")
@click.version_option(_version(), "--version", prog_name="gpucluster")
@click.pass_context
def main(ctx: click.Context, context: str | None, namespace: str, kubeconfig: str | None) -> None:
    """Submit and watch training on the GPU cluster."""
    ctx.obj = _Ctx(context, namespace, kubeconfig)


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
@kube_options
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


OUTPUT = click.option("--output", "-o", type=click.Choice((*FORMATS, "wide")), default=None,
                      help="json or yaml: the objects as the API returns them; wide: more columns")


@train.command(name="list")
@OUTPUT
@kube_options
@click.pass_obj
@_guard
def list_jobs(obj: _Ctx, output: str | None) -> None:
    """The training jobs in the namespace."""
    cluster = obj.cluster
    settings = cluster.settings()
    jobs = sorted(cluster.jobs(), key=lambda j: j["metadata"]["name"])
    if output in FORMATS:
        click.echo(dump({"apiVersion": "v1", "kind": "List", "items": jobs}, output), nl=False)
        return
    out = _console()
    if not jobs:
        out.print(f"no training jobs in namespace {cluster.namespace}")
        return
    headers = ["NAME", "PHASE", "QUEUE", "TEAM", "RUNNING", "MANAGED BY"]
    rows = [list(job_row(job, team_label(settings))) for job in jobs]
    if output == "wide":
        headers += ["RESTARTS", "CREATED"]
        rows = [[*row, str((job.get("status") or {}).get("retryCount", 0)),
                 str(job["metadata"].get("creationTimestamp", "-"))] for row, job in zip(rows, jobs, strict=True)]
    table(out, headers, rows)


@train.command()
@click.argument("name")
@click.option("--output", "-o", type=click.Choice(FORMATS), default=None,
              help="json or yaml: the job and its pods as the API returns them")
@kube_options
@click.pass_obj
@_guard
def status(obj: _Ctx, name: str, output: str | None) -> None:
    """The gang's state, pods per node, restarts and the last checkpoint step."""
    cluster = obj.cluster
    settings = cluster.settings()
    job, pods = cluster.job(name), cluster.pods(worker_selector(settings, name))
    if output in FORMATS:
        click.echo(dump({"apiVersion": "v1", "kind": "List", "items": [job, *pods]}, output), nl=False)
        return
    st = summarize(job, pods)
    step = None
    if st.pod_phases.get(worker_pod(name, 0)) == "Running":
        text = cluster.metrics(worker_pod(name, 0), settings.metrics_port)
        step = checkpoint_step(text) if text is not None else None
    out = _console()
    running = sum(1 for phase in st.pod_phases.values() if phase == "Running")
    out.print(f"[bold]{st.name}[/]  gang {st.phase}  queue {st.queue}  workers running {running}/{st.min_available}")
    out.print(f"restarts: gang {st.gang_restarts}, containers {st.container_restarts}")
    out.print(f"last checkpoint step: {step if step is not None else 'unknown (rank 0 not running or no metrics)'}")
    if st.pods_per_node:
        table(out, ["NODE", "PODS"], [[node, ", ".join(f"{p} ({st.pod_phases[p]})" for p in names)]
                                      for node, names in st.pods_per_node.items()])
    elif st.phase in ("Pending", "Inqueue"):
        out.print("no pods yet: the gang waits in its queue until all of its workers fit")
    if UNSCHEDULED in st.pods_per_node:
        out.print("unscheduled pods wait for the whole gang to fit (or for the handover gate to lift)")


@train.command()
@click.argument("name")
@click.option("--rank", type=click.IntRange(min=0), default=0, show_default=True, help="which worker")
@click.option("--follow", "-f", is_flag=True, help="stream until the container stops")
@click.option("--tail", type=click.IntRange(min=0), default=None, help="only the last N lines")
@click.option("--previous", "-p", is_flag=True, help="the log of the previous container (before a restart)")
@click.option("--since", "since_seconds", default=None, help="only lines newer than this (30s, 5m, 1h30m)",
              callback=lambda ctx, param, value: parse_duration(value) if value is not None else None)
@kube_options
@click.pass_obj
@_guard
def logs(obj: _Ctx, name: str, rank: int, follow: bool, tail: int | None, previous: bool,
         since_seconds: int | None) -> None:
    """The trainer's log of one worker (rank 0 by default)."""
    cluster = obj.cluster
    cluster.job(name)
    for chunk in cluster.logs(worker_pod(name, rank), TRAINER_CONTAINER, follow, tail=tail, previous=previous,
                              since_seconds=since_seconds):
        click.echo(chunk, nl=False)


@train.command()
@click.argument("name")
@kube_options
@click.pass_obj
@_guard
def cancel(obj: _Ctx, name: str) -> None:
    """Delete the job and its pods; checkpoints stay on the checkpoint filesystem."""
    if not obj.cluster.delete(name):
        raise CliError(f"no training job '{name}' in namespace '{obj.namespace}' (see `gpucluster train list`)")
    _console().print(f"cancelled [bold]{name}[/]; its checkpoints stay in its directory on the checkpoint "
                     f"filesystem")
