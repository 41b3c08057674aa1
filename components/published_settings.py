"""The cluster's settings published in the cluster, so the researcher CLI needs no stack file.

The stack writes one ConfigMap in the training namespace holding everything the training template needs
(pools, queues, label prefix, checkpoint claims, scheduler, priority class, gate, NCCL and metrics
settings). The CLI reads it back into :class:`ClusterSettings` and rebuilds the template's
:class:`TrainingJobArgs` with :meth:`ClusterSettings.training_args`; a test checks that this equals
``TrainingJobArgs.from_config`` for every job of every stack, so the two ways in cannot drift.

No Pulumi here: the stack's ``ClusterSettingsMap`` (``components/cluster_settings.py``) writes the ConfigMap
and the CLI, installed on its own, reads it with the same model.
"""

from __future__ import annotations

import json
from typing import Annotated

from pydantic import Field

from components.config import (
    ClusterConfig,
    GpuPool,
    Nccl,
    RestartInPlace,
    SchedulingEngine,
    Team,
    TopologyMode,
    TrainingJob,
)
from components.config.base import ConfigModel, DnsLabel, LabelPrefix, NonEmptyStr, PositiveInt
from components.config.sizing import termination_grace_seconds
from components.naming import Keys
from components.training_spec import TrainingJobArgs, restart_in_place, topology_mode

#: Name and key of the published object; the CLI reads exactly these.
SETTINGS_CONFIGMAP = "gpucluster-settings"
SETTINGS_KEY = "settings.json"
#: Bumped when a key changes meaning or is added (the CLI refuses unknown keys); the CLI refuses settings
#: newer than it understands. 2: ``teams``. 3: each claim's ``writeGbps`` and the checkpoint size and client link
#: (the workers' termination grace holds one emergency checkpoint). 4: a pool's ``topology`` and the stack's
#: ``topologyMode``. 5: ``restartInPlace`` (the template wraps the command in the supervisor). 6: a pool's warm-spare
#: keys (``spareNodes``, ``repairHours``, ``spareCoverage``), published only where a stack sets one (their defaults
#: size the same spares in every reader). A stack that uses none of a version's keys publishes the newest version
#: before it, so a CLI that predates them still reads it.
SETTINGS_VERSION = 6
#: The version of settings whose pools set no warm-spare key (what a CLI of version 5 reads).
IN_PLACE_SETTINGS_VERSION = 5
#: The version of settings without restart in place (what a CLI of version 4 reads).
TOPOLOGY_SETTINGS_VERSION = 4
#: The version of settings without a topology either (what a CLI of version 3 reads).
FLAT_SETTINGS_VERSION = 3


class PoolSettings(ConfigModel):
    """A pool as the template needs it, plus the training queue its gangs go to."""

    pool: GpuPool
    queue: NonEmptyStr


class CheckpointClaim(ConfigModel):
    """A checkpoint filesystem by its config name and the claim (stable object name) jobs mount."""

    name: DnsLabel
    claim: NonEmptyStr
    #: The filesystem's declared write throughput (GB/s), for the workers' termination grace.
    write_gbps: Annotated[float, Field(gt=0)]


class ClusterSettings(ConfigModel):
    """What a training job needs to know about the cluster (camelCase JSON in the ConfigMap)."""

    version: PositiveInt = SETTINGS_VERSION
    label_prefix: LabelPrefix
    gpu_resource: NonEmptyStr
    training_namespace: DnsLabel
    engine: SchedulingEngine
    scheduler_name: NonEmptyStr
    priority_class: NonEmptyStr
    #: Whether training workers start behind the handover gate, and the gate's name.
    handover_gate: bool
    handover_gate_name: NonEmptyStr
    nccl: Nccl
    metrics_port: PositiveInt
    heartbeat_metric: NonEmptyStr
    scrape_interval_seconds: PositiveInt
    monitor_labels: dict[str, str] = Field(default_factory=dict)
    pools: list[PoolSettings]
    checkpoint_claims: list[CheckpointClaim] = Field(default_factory=list)
    #: ``checkpoint.budget.sizeTb`` and ``clientLinkGbps``: the checkpoint one grace must hold.
    checkpoint_size_tb: Annotated[float, Field(gt=0)]
    client_link_gbps: Annotated[float, Field(gt=0)]
    #: The research teams and their queues (``scheduling.teams``).
    teams: list[Team] = Field(default_factory=list)
    #: ``scheduling.topologyMode``, published only where some pool has a topology.
    topology_mode: TopologyMode | None = None
    #: ``training.restartInPlace``, published only where it is on.
    restart_in_place: RestartInPlace | None = None

    def pool(self, name: str) -> PoolSettings | None:
        return next((p for p in self.pools if p.pool.name == name), None)

    def team(self, name: str) -> Team | None:
        return next((t for t in self.teams if t.name == name), None)

    @property
    def onprem_gpus(self) -> int:
        return sum(p.pool.gpu_count for p in self.pools)

    def training_args(self, job: TrainingJob) -> TrainingJobArgs:
        """The template's arguments for ``job``, as ``TrainingJobArgs.from_config`` builds them in the stack."""
        pool = self.pool(job.pool)
        if pool is None:
            raise KeyError(f"unknown pool {job.pool!r}; this cluster has {[p.pool.name for p in self.pools]}")
        claim = None
        grace = None
        if job.checkpoint is not None:
            found = next((c for c in self.checkpoint_claims if c.name == job.checkpoint.filesystem), None)
            if found is None:
                raise KeyError(f"unknown checkpoint filesystem {job.checkpoint.filesystem!r}; this cluster has "
                               f"{[c.name for c in self.checkpoint_claims]}")
            claim = found.claim
            grace = termination_grace_seconds(self.checkpoint_size_tb, job.workers * job.gpus_per_worker,
                                              found.write_gbps, self.client_link_gbps)
        team = None
        if job.team is not None:
            team = self.team(job.team)
            if team is None:
                raise KeyError(f"unknown team {job.team!r}; this cluster has {[t.name for t in self.teams]}")
        return TrainingJobArgs(
            job=job,
            pool=pool.pool,
            nccl=self.nccl,
            namespace=self.training_namespace,
            engine=self.engine,
            scheduler_name=self.scheduler_name,
            queue=team.queue if team is not None else pool.queue,
            priority_class=self.priority_class,
            label_prefix=self.label_prefix,
            gpu_resource=self.gpu_resource,
            checkpoint_claim=claim,
            handover_gate=self.handover_gate,
            metrics_port=self.metrics_port,
            heartbeat_metric=self.heartbeat_metric,
            scrape_interval_seconds=self.scrape_interval_seconds,
            monitor_labels=dict(self.monitor_labels),
            preemptable=team is not None and team.reclaimable,
            termination_grace_seconds=grace,
            topology_mode=topology_mode(pool.pool, self.engine, self.topology_mode or "soft"),
            restart_in_place=restart_in_place(job, self.restart_in_place),
        )


def cluster_settings(cfg: ClusterConfig) -> ClusterSettings:
    """The published settings of a stack: the same sources ``TrainingJobArgs.from_config`` reads."""
    queues = cfg.scheduling.training_queue_names(p.name for p in cfg.pools)
    fabric = any(p.topology is not None for p in cfg.pools)
    in_place = cfg.training.restart_in_place if cfg.training.restart_in_place.enabled else None
    spares = any(_spare_keys(p) for p in cfg.pools)
    version = (SETTINGS_VERSION if spares else IN_PLACE_SETTINGS_VERSION if in_place
               else TOPOLOGY_SETTINGS_VERSION if fabric else FLAT_SETTINGS_VERSION)
    return ClusterSettings(
        version=version,
        label_prefix=cfg.label_prefix,
        gpu_resource=cfg.gpu_resource,
        training_namespace=cfg.training_namespace,
        engine=cfg.scheduling.engine,
        scheduler_name=cfg.scheduling.scheduler_name,
        priority_class=cfg.priorities.training.name,
        handover_gate=cfg.handover_active and cfg.scheduling.engine is SchedulingEngine.VOLCANO,
        handover_gate_name=Keys(cfg.label_prefix).handover_gate,
        nccl=cfg.training.nccl,
        metrics_port=cfg.training.metrics_port,
        heartbeat_metric=cfg.observability.step_heartbeat_metric,
        scrape_interval_seconds=cfg.observability.scrape_interval_seconds,
        monitor_labels=dict(cfg.observability.monitor_labels),
        pools=[PoolSettings(pool=p, queue=queues[p.name]) for p in cfg.pools],
        checkpoint_claims=[CheckpointClaim(name=f.name, claim=f.object_name, write_gbps=f.write_gbps)
                           for f in cfg.checkpoint.filesystems],
        checkpoint_size_tb=cfg.checkpoint.budget.size_tb,
        client_link_gbps=cfg.checkpoint.budget.client_link_gbps,
        teams=list(cfg.scheduling.teams),
        topology_mode=cfg.scheduling.topology_mode if fabric else None,
        restart_in_place=in_place,
    )


#: A pool's warm-spare keys (field, stack spelling): published only when set to something other than their defaults.
_SPARE_KEYS = {f: GpuPool.model_fields[f].alias or f for f in ("spare_nodes", "repair_hours", "spare_coverage")}


def _spare_keys(pool: GpuPool) -> dict[str, object]:
    """The warm-spare keys (their stack spelling) ``pool`` sets to something other than their defaults."""
    return {key: value for field, key in _SPARE_KEYS.items()
            if (value := getattr(pool, field)) != GpuPool.model_fields[field].default}


def settings_json(settings: ClusterSettings) -> str:
    """Stable JSON (sorted keys) so an unchanged stack gives an unchanged ConfigMap; an absent topology and
    topology mode, and warm-spare keys left at their defaults, are left out, so the settings of a stack without
    them read as they did before them."""
    data = settings.model_dump(mode="json", by_alias=True)
    for key in ("topologyMode", "restartInPlace"):
        if data.get(key) is None:
            data.pop(key, None)
    for entry, published in zip(data.get("pools") or [], settings.pools, strict=True):
        if entry["pool"].get("topology") is None:
            entry["pool"].pop("topology", None)
        for key in set(_SPARE_KEYS.values()) - set(_spare_keys(published.pool)):
            entry["pool"].pop(key, None)
    return json.dumps(data, sort_keys=True, indent=1)


def parse_settings(text: str) -> ClusterSettings:
    """Settings from the ConfigMap's value; raises ValueError naming the problem."""
    data = json.loads(text)
    if isinstance(data, dict) and isinstance(data.get("version"), int) and data["version"] > SETTINGS_VERSION:
        raise ValueError(f"cluster settings version {data['version']} is newer than this CLI understands "
                         f"({SETTINGS_VERSION}); upgrade the CLI")
    return ClusterSettings.model_validate(data)
