"""``gpucluster train submit|list|status|logs|cancel``: click commands over the shell in ``kube``.

Three console scripts share these commands: ``gpucluster``, ``kubectl-gpucluster`` (so ``kubectl gpucluster``
runs them as a kubectl plugin) and ``kubectl_complete-gpucluster`` (kubectl's TAB completion for the plugin).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
import yaml
from click.shell_completion import CompletionItem, ShellComplete, get_completion_class
from rich.console import Console
from rich.markup import escape
from urllib3.exceptions import HTTPError

from components.naming import Keys
from gpucluster_cli import __version__
from gpucluster_cli.kube import CliError, Cluster, unreachable
from gpucluster_cli.output import FORMATS, NAME, dump, name_lines, parse_duration, table
from gpucluster_cli.render import (
    MONITOR_GROUP,
    MONITOR_VERSION,
    VOLCANO_GROUP,
    VOLCANO_VERSION,
    pod_monitor,
    team_label,
    volcano_job,
    worker_selector,
)
from gpucluster_cli.spec import SpecError, load_spec, resolve
from gpucluster_cli.views import (
    UNSCHEDULED,
    checkpoint_step,
    fabric_pool,
    job_row,
    leaves_line,
    placement_line,
    restart_line,
    summarize,
    worker_pod,
)

PROG = "gpucluster"
#: The name kubectl shows for the plugin (it runs ``kubectl-gpucluster`` for ``kubectl gpucluster``).
KUBECTL_PROG = "kubectl gpucluster"
#: click's completion variable (``_GPUCLUSTER_COMPLETE=bash_source gpucluster``), spelled out so the plugin's
#: program name (with a space) does not change it.
COMPLETE_VAR = "_GPUCLUSTER_COMPLETE"
SHELLS = ("bash", "zsh", "fish")
DEFAULT_NAMESPACE = "training"
TRAINER_CONTAINER = "trainer"
JOB_KIND, JOB_API = "Job", f"{VOLCANO_GROUP}/{VOLCANO_VERSION}"
MONITOR_KIND, MONITOR_API = "PodMonitor", f"{MONITOR_GROUP}/{MONITOR_VERSION}"
#: Seconds a TAB completion waits for the API server before it offers nothing.
COMPLETION_TIMEOUT_S = 3.0

#: Tests replace this to talk to a fake API; the default reads the user's kubeconfig (context, namespace, file).
ClusterFactory = Callable[[str | None, str, str | None], Cluster]
cluster_factory: ClusterFactory = Cluster.from_kubeconfig


def _console() -> Console:
    return Console(highlight=False, soft_wrap=True)


def _fail(message: str) -> None:
    """``error: <message>`` on stderr, exit 1. The message is escaped: it quotes the user's input (a key, a name),
    and ``[/x]`` there must print as typed, not be read as rich markup (nor raise)."""
    Console(stderr=True, highlight=False, soft_wrap=True, emoji=False).print(
        f"[bold red]error:[/] {escape(message)}", markup=True)
    sys.exit(1)


def _prog() -> str:
    """How the user called us, for the hints we print (``gpucluster`` or ``kubectl gpucluster``)."""
    ctx = click.get_current_context(silent=True)
    return (ctx.find_root().info_name if ctx is not None else None) or PROG


class _Ctx:
    def __init__(self, context: str | None, namespace: str, kubeconfig: str | None) -> None:
        self.context, self.namespace, self.kubeconfig = context, namespace, kubeconfig
        self._cluster: Cluster | None = None

    @property
    def cluster(self) -> Cluster:
        if self._cluster is None:
            self._cluster = cluster_factory(self.context, self.namespace, self.kubeconfig)
            self._cluster.prog = _prog()
        return self._cluster


def _default_namespace() -> str:
    return os.environ.get("GPUCLUSTER_NAMESPACE", DEFAULT_NAMESPACE)


def _obj(ctx: click.Context) -> _Ctx:
    """The connection settings; built from the group's options where its callback has not run (TAB completion
    parses the command line without running callbacks)."""
    found = ctx.find_object(_Ctx)
    if found is None:
        root = ctx.find_root()
        found = root.obj = _Ctx(root.params.get("context"), root.params.get("namespace") or _default_namespace(),
                                root.params.get("kubeconfig"))
    return found


def _set(attribute: str) -> Callable[[click.Context, click.Parameter, str | None], None]:
    def callback(ctx: click.Context, param: click.Parameter, value: str | None) -> None:
        if value is not None:
            setattr(_obj(ctx), attribute, value)
    return callback


#: The connection flags, accepted before the group (``gpucluster -n foo train list``), between the group and the
#: command (``gpucluster train -n foo list``) and after it (``gpucluster train list -n foo``), as kubectl accepts
#: them anywhere. Their default is None and only a given value is kept, so a later one wins and none resets another.
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


class EqualsValueOption(click.Option):
    """An option whose value comes only after ``=``, as kubectl's ``--dry-run[=server|client]``: given alone it
    means ``bare``, and ``--dry-run job.yaml`` never takes the file for its value."""

    def __init__(self, *args: Any, bare: str, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.bare = bare

    def get_help_record(self, ctx: click.Context) -> tuple[str, str] | None:
        record = super().get_help_record(ctx)
        if record is None or not isinstance(self.type, click.Choice):
            return record
        shown = [str(c) for c in self.type.choices if c != self.default]
        return f"{self.opts[0]}[={'|'.join(shown)}]", record[1]


class KubectlCommand(click.Command):
    """Reads a bare :class:`EqualsValueOption` as ``--option=<bare>`` before click parses the line."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        bare = {opt: p.bare for p in self.params if isinstance(p, EqualsValueOption) for opt in p.opts}
        out: list[str] = []
        for i, arg in enumerate(args):
            if arg == "--":
                out += args[i:]
                break
            out.append(f"{arg}={bare[arg]}" if arg in bare else arg)
        return super().parse_args(ctx, out)


def _complete_jobs(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[CompletionItem]:
    """Job names from the cluster, as kubectl completes resource names; nothing when it cannot be asked."""
    try:
        jobs = _obj(ctx).cluster.jobs(timeout=COMPLETION_TIMEOUT_S)
    except Exception:  # a TAB must never print a traceback into the user's command line
        return []
    found = sorted(j["metadata"]["name"] for j in jobs)
    return [CompletionItem(n) for n in found if n.startswith(incomplete)]


@click.group(name=PROG)
@click.option("--context", default=None, help="kubeconfig context (default: the current one)")
@click.option("--namespace", "-n", default=_default_namespace,
              show_default="training or $GPUCLUSTER_NAMESPACE", help="the cluster's training namespace")
@click.option("--kubeconfig", default=None, type=click.Path(dir_okay=False),
              help="kubeconfig file (default: $KUBECONFIG or ~/.kube/config)")
@click.version_option(__version__, "--version")
@click.pass_context
def main(ctx: click.Context, context: str | None, namespace: str, kubeconfig: str | None) -> None:
    """Submit and watch training on the GPU cluster."""
    ctx.obj = _Ctx(context, namespace, kubeconfig)


def kubectl_plugin() -> None:
    """``kubectl-gpucluster``: the same commands under the name kubectl shows (``kubectl gpucluster``)."""
    main(prog_name=KUBECTL_PROG, complete_var=COMPLETE_VAR)


def kubectl_complete() -> None:
    """``kubectl_complete-gpucluster``: kubectl (1.26 and later) runs it on TAB after ``kubectl gpucluster`` with
    the words typed so far, the last one the incomplete word, and reads Cobra's answer: one ``value<TAB>help``
    per line, then ``:<directive>`` (4: offer no file names; 0: let the shell complete a file name)."""
    args = sys.argv[1:]
    incomplete = args.pop() if args else ""
    items = ShellComplete(main, {}, KUBECTL_PROG, COMPLETE_VAR).get_completions(args, incomplete)
    files = any(item.type in ("file", "dir") for item in items)
    for item in items:
        if item.type == "plain":
            click.echo(f"{item.value}\t{item.help}" if item.help else item.value)
    click.echo(":0" if files else ":4")


@main.command()
@click.argument("shell", type=click.Choice(SHELLS))
def completion(shell: str) -> None:
    """Print the completion script for SHELL (bash, zsh or fish), as kubectl completion does.

    Load it with: source <(gpucluster completion bash). Under kubectl gpucluster, kubectl (1.26 and later)
    completes through the kubectl_complete-gpucluster script that comes with the CLI.
    """
    cls = get_completion_class(shell)
    assert cls is not None  # SHELLS are click's own
    click.echo(cls(main, {}, PROG, COMPLETE_VAR).source())


@main.group()
@kube_options
def train() -> None:
    """Training jobs: submit, list, status, logs, cancel."""


def _guard(fn: Callable[..., None]) -> Callable[..., None]:
    """Turn the CLI's own errors, and an API server that does not answer, into one red line and exit code 1."""
    def wrapped(*args: Any, **kwargs: Any) -> None:
        try:
            fn(*args, **kwargs)
        except (CliError, SpecError) as exc:
            _fail(str(exc))
        except HTTPError as exc:  # only a built cluster makes requests, so there is a host to name
            _fail(str(unreachable(exc, _obj(click.get_current_context()).cluster.host)))
    wrapped.__name__, wrapped.__doc__ = fn.__name__, fn.__doc__
    return wrapped


def _print_objects(objects: list[tuple[str, str, dict[str, Any]]], output: str) -> None:
    """``-o name`` lines, or the objects as one ``List`` in JSON or YAML (kubectl's shapes)."""
    if output == NAME:
        click.echo(name_lines(objects), nl=False)
        return
    click.echo(dump({"apiVersion": "v1", "kind": "List", "items": [o for _, _, o in objects]}, output), nl=False)


DRY_RUN_HELP = ("server (a bare --dry-run): the API server validates and admits the objects and creates nothing; "
                "client: render only (the cluster is asked for its settings, nothing is sent)")


@train.command(cls=KubectlCommand)
@click.argument("spec_file", type=click.Path(path_type=Path))
@click.option("--dry-run", cls=EqualsValueOption, bare="server", type=click.Choice(("none", "server", "client")),
              default="none", help=DRY_RUN_HELP)
@click.option("--show", is_flag=True, help="print the objects as YAML")
@click.option("--output", "-o", type=click.Choice((*FORMATS, NAME)), default=None,
              help="json or yaml: the objects as applied (as the API server returned them); name: kind/name lines")
@kube_options
@click.pass_obj
@_guard
def submit(obj: _Ctx, spec_file: Path, dry_run: str, show: bool, output: str | None) -> None:
    """Submit the job in SPEC_FILE (name, image, command, gpus, pool, checkpointInterval, team)."""
    spec = load_spec(spec_file)
    cluster = obj.cluster
    settings = cluster.settings()
    job = resolve(spec, settings, str(spec_file))
    vj, pm = volcano_job(settings, job, spec.team), pod_monitor(settings, job, spec.team)
    out = _console()
    if show:
        out.print(yaml.safe_dump_all([vj, pm], sort_keys=False), markup=False)
    monitor_note = ""
    if dry_run == "client":
        applied = [(JOB_KIND, JOB_API, vj), (MONITOR_KIND, MONITOR_API, pm)]
    else:
        applied = [(JOB_KIND, JOB_API, cluster.apply(vj, dry_run=dry_run == "server"))]
        try:
            applied.append((MONITOR_KIND, MONITOR_API, cluster.apply(pm, dry_run=dry_run == "server")))
        except CliError as exc:
            monitor_note = f" (no metrics scrape: {exc})"
    if output is not None:
        _print_objects(applied, output)
        if monitor_note:
            click.echo(f"warning:{monitor_note}", err=True)
        return
    verb = {"none": "submitted", "server": "would submit", "client": "would submit"}[dry_run]
    unchecked = " (client dry run: rendered here, not validated by the API server)" if dry_run == "client" else ""
    out.print(f"{verb} [bold]{job.name}[/]: {job.workers} × {job.gpus_per_worker} GPUs in pool {job.pool}, "
              f"queue {vj['spec']['queue']}, namespace {settings.training_namespace}{monitor_note}{unchecked}")
    placement = placement_line(vj["spec"])
    if placement is not None:
        out.print(placement, markup=False)
    restarts = restart_line(settings, job)
    if restarts is not None:
        out.print(restarts, markup=False)
    if dry_run == "none":
        # Submitting returns before Volcano places the gang: status shows the leaves it spans once it is placed.
        spans = " (and, once placed, the leaf switches it spans)" if placement is not None else ""
        out.print(f"watch it with: {_prog()} train status {job.name}{spans}")


@train.command(name="list")
@click.option("--output", "-o", type=click.Choice((*FORMATS, "wide", NAME)), default=None,
              help="json or yaml: the objects as the API returns them; wide: more columns; name: kind/name lines")
@kube_options
@click.pass_obj
@_guard
def list_jobs(obj: _Ctx, output: str | None) -> None:
    """The training jobs in the namespace."""
    cluster = obj.cluster
    settings = cluster.settings()
    jobs = sorted(cluster.jobs(), key=lambda j: j["metadata"]["name"])
    if output in (*FORMATS, NAME):
        assert output is not None
        _print_objects([(JOB_KIND, JOB_API, j) for j in jobs], output)
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
@click.argument("name", shell_complete=_complete_jobs)
@click.option("--output", "-o", type=click.Choice((*FORMATS, NAME)), default=None,
              help="json or yaml: the job and its pods as the API returns them; name: kind/name lines")
@kube_options
@click.pass_obj
@_guard
def status(obj: _Ctx, name: str, output: str | None) -> None:
    """The gang's state, pods per node, restarts and the last checkpoint step."""
    cluster = obj.cluster
    settings = cluster.settings()
    job, pods = cluster.job(name), cluster.pods(worker_selector(settings, name))
    if output is not None:
        _print_objects([(JOB_KIND, JOB_API, job), *(("Pod", "v1", p) for p in pods)], output)
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
        leaf_key = Keys(settings.label_prefix).leaf
        spans = leaves_line(st.pods_per_node, fabric_pool(settings, list(st.pods_per_node)),
                            lambda node: cluster.node_label(node, leaf_key))
        if spans is not None:
            out.print(spans, markup=False)
    elif st.phase in ("Pending", "Inqueue"):
        out.print("no pods yet: the gang waits in its queue until all of its workers fit")
    if UNSCHEDULED in st.pods_per_node:
        out.print("unscheduled pods wait for the whole gang to fit (or for the handover gate to lift)")


@train.command()
@click.argument("name", shell_complete=_complete_jobs)
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
@click.argument("name", shell_complete=_complete_jobs)
@kube_options
@click.pass_obj
@_guard
def cancel(obj: _Ctx, name: str) -> None:
    """Delete the job and its pods; checkpoints stay on the checkpoint filesystem."""
    if not obj.cluster.delete(name):
        raise CliError(f"no training job '{name}' in namespace '{obj.namespace}' (see `{_prog()} train list`)")
    _console().print(f"cancelled [bold]{name}[/]; its checkpoints stay in its directory on the checkpoint "
                     f"filesystem")
