"""The short job spec researchers write, and its resolution against the cluster's published settings.

The spec is outside input: every error names the file and the key, and says what to change. Everything the
spec does not say (scheduler, queue, priority, affinity, tolerations, gate, checkpoint mount, NCCL and
runtime environment) comes from the stack's own training template via ``ClusterSettings.training_args``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

from pydantic import BeforeValidator, Discriminator, Field, Tag, ValidationError, model_validator

from components.config import CheckpointMount, SchedulingEngine, TrainingJob
from components.config.base import ConfigModel, DnsLabel, NonEmptyStr, PinnedImage, PositiveInt, Quantity
from components.published_settings import ClusterSettings
from gpucluster_cli.yamlfile import YamlFileError, parse_yaml, read_yaml


class SpecError(ValueError):
    """A job spec that cannot be submitted; the message names the file, the key and the fix."""


class NodeShape(ConfigModel):
    nodes: PositiveInt
    gpus_per_node: PositiveInt


def _gpus_shape(value: Any) -> Any:
    if isinstance(value, bool) or not isinstance(value, int | dict):
        raise ValueError("must be a GPU count (e.g. 16) or {nodes: N, gpusPerNode: G}")
    if isinstance(value, int) and value < 1:
        raise ValueError("must be at least 1 GPU")
    return value


#: A total (``16``) or a shape (``{nodes: 2, gpusPerNode: 8}``); the discriminator keeps errors to one branch.
Gpus = Annotated[
    Annotated[PositiveInt, Tag("count")] | Annotated[NodeShape, Tag("shape")],
    Discriminator(lambda v: "count" if isinstance(v, int) else "shape"),
    BeforeValidator(_gpus_shape),
]


class JobSpec(ConfigModel):
    """``name``, ``image``, ``command``, ``gpus`` (a total, or ``{nodes, gpusPerNode}``), and optional rest."""

    name: DnsLabel
    image: PinnedImage
    command: list[NonEmptyStr] = Field(min_length=1)
    gpus: Gpus
    pool: DnsLabel | None = None
    #: Checkpoint every this many steps (the runtime's CHECKPOINT_INTERVAL_STEPS).
    checkpoint_interval: PositiveInt = 500
    #: Which checkpoint filesystem; the cluster's first one when left out.
    checkpoint_filesystem: DnsLabel | None = None
    team: DnsLabel | None = None
    max_retries: int = Field(default=5, ge=0, le=100)
    #: Each worker's CPU and memory request (memory is the limit too); the stack's training defaults when left out.
    #: They must fit a node of the pool beside its daemons, or the gang never schedules.
    cpu_per_worker: Quantity | None = None
    memory_per_worker: Quantity | None = None

    @model_validator(mode="before")
    @classmethod
    def _mapping(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            raise ValueError("the job spec must be a mapping of keys (name, image, command, gpus, ...)")
        return data


def _printable(text: str) -> str:
    """``text`` kept on its line: a line break or control character in a key (YAML allows them) shown escaped."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def _where(loc: tuple[int | str, ...]) -> str:
    parts = [str(p) for p in loc if not (isinstance(p, str) and p in ("count", "shape"))]
    out = ""
    for p in parts:
        out += f"[{p}]" if p.isdigit() else (f".{p}" if out else p)
    return out or "(top level)"


def parse_spec(text: str, source: str) -> JobSpec:
    """Parse YAML text into a :class:`JobSpec`; :class:`SpecError` lists every problem as ``source: key: why``."""
    try:
        data = parse_yaml(text, source)
    except YamlFileError as exc:
        raise SpecError(str(exc)) from None
    return _validate(data, source)


def _validate(data: Any, source: str) -> JobSpec:
    try:
        return JobSpec.model_validate(data)
    except ValidationError as exc:
        lines = []
        seen: set[str] = set()
        for err in exc.errors():
            where = _where(tuple(err["loc"]))
            msg = err["msg"].removeprefix("Value error, ")
            if err["type"] == "extra_forbidden":
                allowed = sorted(f.alias or n for n, f in JobSpec.model_fields.items())
                msg = "unknown key; allowed: " + ", ".join(allowed)
            elif err["type"] == "missing":
                msg = "required key is missing"
            elif where == "command" and err["type"] == "list_type":
                msg = "must be a list of words, e.g. [python, train.py] (no shell splitting is done)"
            line = f"{source}: {_printable(where)}: {_printable(msg)}"
            if line not in seen:
                seen.add(line)
                lines.append(line)
        raise SpecError("\n".join(lines)) from None


def load_spec(path: Path) -> JobSpec:
    """The job spec in ``path``; every error names the file (and the line, the byte or the key)."""
    try:
        data = read_yaml(path, "the job spec")
    except YamlFileError as exc:
        raise SpecError(str(exc)) from None
    return _validate(data, str(path))


def resolve(spec: JobSpec, settings: ClusterSettings, source: str) -> TrainingJob:
    """The stack's TrainingJob for this spec on this cluster; errors say which key to change and to what."""
    if settings.engine is not SchedulingEngine.VOLCANO:
        raise SpecError(f"this cluster schedules training with {settings.engine.value}; "
                        "the CLI submits Volcano Jobs only")
    names = [p.pool.name for p in settings.pools]
    if spec.pool is None:
        if len(names) != 1:
            raise SpecError(f"{source}: pool: required on this cluster; choose one of {names}")
        pool_name = names[0]
    else:
        pool_name = spec.pool
    found = settings.pool(pool_name)
    if found is None:
        raise SpecError(f"{source}: pool: unknown pool '{pool_name}'; choose one of {names}")
    pool = found.pool
    nodes_in_pool = len(pool.node_names)
    if isinstance(spec.gpus, NodeShape):
        nodes, per_node = spec.gpus.nodes, spec.gpus.gpus_per_node
        if per_node > pool.gpus_per_node:
            raise SpecError(f"{source}: gpus.gpusPerNode: {per_node} is more than the {pool.gpus_per_node} GPUs "
                            f"of a node in pool '{pool.name}'; use at most {pool.gpus_per_node}")
    elif spec.gpus <= pool.gpus_per_node:
        nodes, per_node = 1, spec.gpus
    elif spec.gpus % pool.gpus_per_node:
        lower = spec.gpus - spec.gpus % pool.gpus_per_node
        raise SpecError(f"{source}: gpus: {spec.gpus} is not a whole number of {pool.gpus_per_node}-GPU nodes in "
                        f"pool '{pool.name}'; ask for {lower} or {lower + pool.gpus_per_node}, or give "
                        f"{{nodes: N, gpusPerNode: G}}")
    else:
        nodes, per_node = spec.gpus // pool.gpus_per_node, pool.gpus_per_node
    if nodes > nodes_in_pool:
        raise SpecError(f"{source}: gpus: {nodes} nodes is larger than pool '{pool.name}' ({nodes_in_pool} nodes × "
                        f"{pool.gpus_per_node} GPUs = {pool.gpu_count}); ask for at most {pool.gpu_count} GPUs")
    if nodes > nodes_in_pool - pool.spares:
        usable = (nodes_in_pool - pool.spares) * pool.gpus_per_node
        raise SpecError(f"{source}: gpus: {nodes} nodes would never start: pool '{pool.name}' keeps {pool.spares} of "
                        f"its {nodes_in_pool} nodes as warm spares training does not use; ask for at most {usable} "
                        "GPUs")
    team = _team(spec, settings, source, nodes * per_node)
    checkpoint = None
    if settings.checkpoint_claims or spec.checkpoint_filesystem is not None:
        filesystems = [c.name for c in settings.checkpoint_claims]
        fs = spec.checkpoint_filesystem or filesystems[0]
        if fs not in filesystems:
            raise SpecError(f"{source}: checkpointFilesystem: unknown filesystem '{fs}'; choose one of {filesystems}")
        checkpoint = CheckpointMount(filesystem=fs, interval_steps=spec.checkpoint_interval)
    sized = {k: v for k, v in (("cpu_per_worker", spec.cpu_per_worker), ("memory_per_worker", spec.memory_per_worker))
             if v is not None}
    return TrainingJob(
        name=spec.name, enabled=True, image=spec.image, pool=pool.name, workers=nodes, gpus_per_worker=per_node,
        max_retries=spec.max_retries, command=list(spec.command), checkpoint=checkpoint, team=team, **sized,
    )


def _team(spec: JobSpec, settings: ClusterSettings, source: str, gpus: int) -> str | None:
    """The team whose queue the job goes to: required where the cluster has teams, within the team's quota."""
    names = [t.name for t in settings.teams]
    if spec.team is None:
        if names:
            raise SpecError(f"{source}: team: required on this cluster (each team has its own queue and quota); "
                            f"choose one of {names}")
        return None
    team = settings.team(spec.team)
    if team is None:
        if not names:
            raise SpecError(f"{source}: team: this cluster has no team queues; leave team out")
        raise SpecError(f"{source}: team: unknown team '{spec.team}'; choose one of {names}")
    quota = team.capability_gpus or settings.onprem_gpus
    if gpus > quota:
        raise SpecError(f"{source}: gpus: {gpus} GPUs exceeds team '{team.name}' quota of {quota} GPUs at once; ask "
                        f"for at most {quota}, or ask the cluster admins to raise scheduling.teams "
                        f"'{team.name}' capabilityGpus")
    return team.name
