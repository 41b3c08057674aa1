"""Gang scheduling: the engine, its queues, and the checks that tie them to the cluster version and pools."""

from __future__ import annotations

from collections.abc import Iterable
from enum import StrEnum
from typing import TYPE_CHECKING, Annotated, Self

from pydantic import Field, model_validator

from components.config.base import (
    ConfigModel,
    DnsLabel,
    NonEmptyStr,
    NonNegativeInt,
    PositiveInt,
    Problem,
    unique_names,
)
from components.config.topology import TopologyMode

if TYPE_CHECKING:
    from components.config.cluster import ClusterConfig

#: Kubernetes minor versions each gang scheduler supports (inclusive bounds).
SCHEDULER_K8S_SUPPORT: dict[str, tuple[tuple[int, int], tuple[int, int]]] = {
    # kube-batch v0.5 watches policy/v1beta1 PDBs (gone in 1.25) and scheduling/v1beta1 classes.
    "kube-batch": ((1, 13), (1, 24)),
    # Volcano v1.14 (components/pins.py) tracks Kubernetes 1.34 client libraries; the e2e runs it against 1.35.
    "volcano": ((1, 24), (1, 35)),
}


class Queue(ConfigModel):
    """A Volcano queue; inference's queue is reclaimable so training can take its GPUs back."""

    name: DnsLabel
    """Name of the Queue object; per-pool training queues are `<name>-<pool>`."""
    weight: PositiveInt = 1
    """The Queue's `weight`: kube-batch shares GPUs between queues by it; Volcano's capacity plugin shares them
    by `gpuDeserved` instead."""
    gpu_capability: PositiveInt | None = None
    """Most GPUs the queue's pods may hold at once (Volcano `capability`): enqueue keeps a gang waiting while it
    would go above. Unset: no cap, except that a per-pool training queue is capped at its pool's GPUs."""
    reclaimable: bool = True
    """Whether other queues may reclaim the GPUs this queue holds above what it deserves (Volcano
    `reclaimable`); the training queue must not be."""
    gpu_deserved: NonNegativeInt | None = None
    """GPUs the queue deserves (Volcano `capacity` plugin): what it may reclaim up to from reclaimable
    queues, and above which its own pods are reclaim victims. Unset: a training queue deserves every GPU
    of its pool(s); the inference queue deserves none, so all of its pods stay reclaimable."""

    @model_validator(mode="after")
    def _deserved_within_capability(self) -> Self:
        if (self.gpu_deserved is not None and self.gpu_capability is not None
                and self.gpu_deserved > self.gpu_capability):
            raise ValueError(f"gpuDeserved ({self.gpu_deserved}) exceeds gpuCapability ({self.gpu_capability})")
        return self


#: Team queues are named ``<TEAM_QUEUE_PREFIX><team>``.
TEAM_QUEUE_PREFIX = "team-"


class Team(ConfigModel):
    """A research team: its own Volcano queue beside the training queue(s), and its people's access.

    ``guaranteeGpus`` becomes the queue's ``deserved`` GPUs (capacity plugin): up to it the team may reclaim
    GPUs from inference and from teams above their guarantee, and its own pods are never reclaimed while it
    stays within it. Above it, with ``reclaimable`` (the default), its gangs run on spare GPUs and can be
    taken back. ``capabilityGpus`` is its quota: Volcano's enqueue keeps a gang waiting in the team's queue
    while it would take the team above it. Volcano's own ``spec.guarantee`` is deliberately not used: it
    reserves GPUs from every other queue, the training queue included, so a gang that needs a whole pool
    could never start.
    """

    name: DnsLabel
    """Team name: its queue is `team-<name>`, and a training job's `team` names it."""
    group: NonEmptyStr | None = None
    """The Kubernetes group (as the authenticator reports it, e.g. a certificate's O=) bound to the
    researcher Role in the training namespace; the team's name when left out."""
    guarantee_gpus: NonNegativeInt = 0
    """GPUs the team is guaranteed (its queue's deserved GPUs): up to them it reclaims from inference and from
    teams above their guarantee, and while it stays within them none of its pods is reclaimed."""
    capability_gpus: PositiveInt | None = None
    """Most GPUs the team's running and admitted gangs may hold at once; every on-prem GPU when left out."""
    reclaimable: bool = True
    """Whether GPUs above the guarantee may be reclaimed by gangs of queues under their own share."""

    @model_validator(mode="after")
    def _guarantee_within_capability(self) -> Self:
        if self.capability_gpus is not None and self.guarantee_gpus > self.capability_gpus:
            raise ValueError(f"guaranteeGpus ({self.guarantee_gpus}) exceeds capabilityGpus "
                             f"({self.capability_gpus}); a team cannot be guaranteed more than it may use")
        return self

    @property
    def queue(self) -> str:
        return f"{TEAM_QUEUE_PREFIX}{self.name}"

    @property
    def subject_group(self) -> str:
        return self.group or self.name


class ClientRate(ConfigModel):
    """A Kubernetes client's own rate limit (client-go's token bucket): sustained requests per second, and the
    burst it may spend at once."""

    qps: PositiveInt
    """Requests per second the client sustains."""
    burst: PositiveInt
    """Requests it may send at once after a quiet spell (at least `qps`)."""

    @model_validator(mode="after")
    def _burst_covers_qps(self) -> Self:
        if self.burst < self.qps:
            raise ValueError(f"burst ({self.burst}) must be at least qps ({self.qps}): a bucket smaller than one "
                             "second of its rate never reaches that rate")
        return self


class SchedulingEngine(StrEnum):
    VOLCANO = "volcano"
    KUBE_BATCH = "kube-batch"


class Scheduling(ConfigModel):
    engine: SchedulingEngine = SchedulingEngine.VOLCANO
    """The gang scheduler: `volcano`, or `kube-batch` (legacy, Kubernetes 1.24 at most)."""
    install: bool = True
    """Install Volcano from its pinned chart; off where the cluster already runs it (local cluster)."""
    training_queue: Queue = Queue(name="training", weight=8, reclaimable=False)
    """The queue of training gangs (never reclaimable); with per-pool queues, the template of each pool's."""
    inference_queue: Queue = Queue(name="inference", weight=2, reclaimable=True)
    """The queue of inference replicas and the throughput check: reclaimable, so training takes its GPUs
    back."""
    schedule_period_seconds: PositiveInt = 1
    """Volcano's scheduling period (seconds); short enough that a pending gang is reconsidered quickly."""
    training_queue_per_pool: bool | None = None
    """One training queue per GPU pool (`<trainingQueue.name>-<pool>`, capability = that pool's GPUs)
    instead of one queue over all pools. Volcano's enqueue admits a gang only while its queue has room,
    so with one queue a gang waiting for a full pool holds the room that a gang for an idle pool needs
    (head-of-line blocking across pools). Unset means: per pool whenever the stack has more than one."""
    teams: list[Team] = Field(default_factory=list)
    """Research teams, each with a queue of its own (`team-<name>`) and a researcher RoleBinding."""
    controller_client: ClientRate = ClientRate(qps=500, burst=1000)
    """Client rate of Volcano's controllers (`--kube-api-qps`/`--kube-api-burst`). They create every pod of a
    gang through this one client, after the gang is admitted: Volcano's own 50/100 paces a 2,048-pod gang's
    creation at 40 s or more before the scheduler may place any of it (gangs place all or nothing), and the
    scheduler rewrites the condition of every pending pod in each session meanwhile. The API server's priority
    and fairness still bounds what it serves."""

    percentage_of_nodes_to_find: Annotated[int, Field(ge=1, le=100)] | None = None
    """Share of the nodes Volcano's scheduler checks and scores for each pod before it picks one
    (`--percentage-nodes-to-find`; never fewer than 100 nodes). Unset: Volcano's own, 50 % less one point per 125
    nodes, at least 5 % (34 % at 2,048 nodes). A gang's placement costs pods × nodes checked: at 2,048 nodes the
    scheduler spent most of its time filtering and scoring nodes for each pod of a 1,024-pod gang that any of
    hundreds of empty nodes would take. Set 5 to 10 on clusters of a thousand nodes and more."""
    topology_mode: TopologyMode = "soft"
    """How a training gang in a pool with a `topology` is held to its switch (the Volcano Job's
    `networkTopology.mode`): `soft` places it in as few switches as Volcano finds room for and never makes it wait
    for that; `hard` keeps it pending until one leaf (or one spine, for a gang no leaf holds) has room for all of
    it. Pools without a topology ignore it."""

    @model_validator(mode="after")
    def _queues(self) -> Self:
        if self.training_queue.name == self.inference_queue.name:
            raise ValueError("trainingQueue and inferenceQueue must have different names")
        if self.training_queue.reclaimable:
            raise ValueError(
                "trainingQueue.reclaimable must be false: a training gang that loses members stalls"
            )
        return self

    @property
    def scheduler_name(self) -> str:
        return "volcano" if self.engine is SchedulingEngine.VOLCANO else "kube-batch"

    def queue_per_pool(self, pool_count: int) -> bool:
        """Whether training gets one queue per pool: the explicit setting, else more than one pool."""
        return pool_count > 1 if self.training_queue_per_pool is None else self.training_queue_per_pool

    def training_queue_names(self, pools: Iterable[str]) -> dict[str, str]:
        """Pool name → the training queue its gangs go to."""
        names = list(pools)
        base = self.training_queue.name
        if not self.queue_per_pool(len(names)):
            return {pool: base for pool in names}
        return {pool: f"{base}-{pool}" for pool in names}

    def team(self, name: str) -> Team | None:
        return next((t for t in self.teams if t.name == name), None)


def scheduling_problems(cfg: ClusterConfig) -> list[Problem]:
    """The engine serves the cluster's Kubernetes version; per-pool training queues miss the inference queue."""
    problems: list[Problem] = []
    engine = cfg.scheduling.engine.value
    (lo, hi) = SCHEDULER_K8S_SUPPORT[engine]
    if not lo <= cfg.k8s_minor <= hi:
        hint = (
            " kube-batch v0.5 needs policy/v1beta1 and scheduling/v1beta1, which Kubernetes no longer "
            "serves from 1.25; use engine 'volcano'"
            if engine == "kube-batch"
            else ""
        )
        problems.append(
            Problem(
                "scheduling.engine",
                f"'{engine}' supports Kubernetes {lo[0]}.{lo[1]}–{hi[0]}.{hi[1]}, "
                f"but kubernetesVersion is {cfg.kubernetes_version}.{hint}",
                engine,
            )
        )
    # Per-pool training queue names (two DNS labels joined by '-', so valid) must not hit the inference queue.
    sched = cfg.scheduling
    problems += [
        Problem("scheduling.inferenceQueue.name",
                f"collides with the training queue of pool '{pool}'; choose another name", name)
        for pool, name in sched.training_queue_names(p.name for p in cfg.pools).items()
        if name == sched.inference_queue.name
    ]
    return problems + team_problems(cfg)


def team_problems(cfg: ClusterConfig) -> list[Problem]:
    """Teams are distinct, need Volcano, fit the on-prem GPUs, and their queues collide with no other queue."""
    sched = cfg.scheduling
    if not sched.teams:
        return []
    problems = unique_names(enumerate(t.name for t in sched.teams), "scheduling.teams", "team")
    if sched.engine is not SchedulingEngine.VOLCANO:
        problems.append(Problem("scheduling.teams", "team queues need engine 'volcano' (kube-batch v0.5 queues "
                                "have neither deserved nor capability GPUs); remove the teams or use volcano",
                                sched.engine.value))
    total = cfg.onprem_gpus
    other_queues = {*sched.training_queue_names(p.name for p in cfg.pools).values(), sched.inference_queue.name}
    for index, team in enumerate(sched.teams):
        where = f"scheduling.teams[{index}]"
        if team.queue in other_queues:
            problems.append(Problem(f"{where}.name", f"its queue '{team.queue}' is also a training or inference "
                                    "queue; rename the team or that queue", team.name))
        if team.capability_gpus is not None and team.capability_gpus > total:
            problems.append(Problem(f"{where}.capabilityGpus", f"is more than the {total} on-prem GPUs of all "
                                    "pools; leave it out for no limit beyond the cluster", team.capability_gpus))
        if team.guarantee_gpus > total:
            problems.append(Problem(f"{where}.guaranteeGpus", f"is more than the {total} on-prem GPUs of all pools",
                                    team.guarantee_gpus))
    guaranteed = sum(t.guarantee_gpus for t in sched.teams)
    if guaranteed > total:
        problems.append(Problem("scheduling.teams", f"the guarantees add up to {guaranteed} GPUs, more than the "
                                f"{total} on-prem GPUs: they cannot all hold at once; lower some guaranteeGpus",
                                guaranteed))
    return problems
