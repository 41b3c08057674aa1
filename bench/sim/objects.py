"""What the simulated cluster is made of: event kinds and pod states, the event heap, the counters every
model adds to, and the jobs, pods and services the models move around. Data only; `cluster.ClusterState`
holds them and owns the rules that change them."""

from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from bench.sim.topology import GangPlacement

# Event kinds (ints keep heap tuples cheap and comparable).
ARRIVAL, JOB_END, POD_READY, HPA, CTRL, DESCHED, SAMPLE, WARM_READY = range(8)
# Pod states.
PENDING, STARTING, READY = 0, 1, 2
INFERENCE_NAMESPACE = "inference"
TRAINING_NAMESPACE = "training"


class Events:
    """The clock and the event heap; ties break by push order, which makes runs exactly reproducible."""

    __slots__ = ("heap", "now", "seq", "warmup")

    def __init__(self, warmup_s: float) -> None:
        self.heap: list[tuple[float, int, int, int]] = []
        self.seq = 0
        self.now = 0.0
        self.warmup = warmup_s

    def push(self, t: float, kind: int, arg: int = 0) -> None:
        self.seq += 1
        heapq.heappush(self.heap, (t, self.seq, kind, arg))


@dataclass
class Counters:
    """What the models count for the outcome; all but `gangs_rejected` only within the measured period."""

    preemptions: int = 0
    desched_evictions: int = 0
    return_evictions: int = 0  # external replicas the make-before-break return evicted (their cover Ready)
    surges: int = 0
    flips: int = 0  # the adapter counts the whole run; these count after warm-up
    node_patches: int = 0
    gangs_rejected: int = 0
    returns: list[float] = field(default_factory=list)  # seconds from a surge's close to no external GPU in use
    gang_waits: list[float] = field(default_factory=list)
    # Pools with a fabric only: where each gang started, and at each sample (stranded free GPUs, free GPUs).
    gang_placements: list[GangPlacement] = field(default_factory=list)
    stranded: list[tuple[int, int]] = field(default_factory=list)


class Job(NamedTuple):
    """A running gang: its zone and the nodes it holds whole."""

    zone: int
    nodes: list[int]


class Pod:
    __slots__ = ("cost", "created", "gpus", "home", "id", "node", "replacement", "standby", "state", "svc")

    def __init__(self, pid: int, svc: int, gpus: int, created: float, standby: bool = False,
                 replacement: bool = False, home: bool = False) -> None:
        self.id = pid
        # Created to replace a replica a gang, the descheduler or the oracle's move took away, not by the HPA.
        self.replacement = replacement
        self.svc = svc
        self.gpus = gpus
        self.created = created
        self.state = PENDING
        self.node = -1  # >= 0: on-prem node index; <= -2: virtual node -(node + 2); -1: unplaced
        self.cost = 0  # the pod-deletion-cost annotation (0: none)
        self.standby = standby  # a pod of the service's standby Deployment (handover), not the HPA's
        self.home = home  # a pod of the service's on-prem return Deployment (the bridge), not the HPA's


class Service:
    __slots__ = (
        "demand",
        "down_s",
        "gpus",
        "handover",
        "history",
        "history_up",
        "max",
        "maxunav",
        "min",
        "name",
        "pending",
        "ready",
        "ready_ext",
        "ready_zone",
        "replicas",
        "rt_pending",
        "rt_ready",
        "rt_replicas",
        "rt_starting",
        "sb_pending",
        "sb_ready",
        "sb_replicas",
        "sb_starting",
        "start_zone",
        "starting",
        "unready_replacements",
        "up_s",
        "warm_count",
        "warm_target",
    )

    def __init__(self, name: str, gpus: int, lo: int, hi: int, maxunav: int, up_s: float, down_s: float,
                 zones: int = 0) -> None:
        self.name = name
        self.gpus = gpus
        self.min = lo
        self.max = hi
        self.maxunav = maxunav
        self.up_s = up_s
        self.down_s = down_s
        self.replicas = 0
        self.demand = 0.0
        self.history: deque[tuple[float, int]] = deque()
        self.history_up: deque[tuple[float, int]] = deque()
        self.pending: dict[int, None] = {}
        self.starting: dict[int, None] = {}
        self.ready: dict[int, None] = {}
        self.unready_replacements = 0  # main pods not ready yet that replace a replica taken away
        # What the handover core reads, kept as the pods change: ready main pods on virtual nodes and per
        # on-prem zone, and the standby Deployment's target and pods.
        self.handover = False  # named in the controller's handover services: the core sees this service
        self.ready_ext = 0
        self.ready_zone = [0] * zones
        self.start_zone = [0] * zones  # main pods starting on an on-prem zone's nodes
        self.sb_replicas = 0
        self.sb_pending: dict[int, None] = {}
        self.sb_starting: dict[int, None] = {}
        self.sb_ready: dict[int, None] = {}
        # The warm pool's placeholder Deployment: its target (the core's SET_WARM) and its placed pods.
        self.warm_target = 0
        self.warm_count = 0
        # The make-before-break return's on-prem bridge Deployment: its target (SET_RETURN) and its pods.
        self.rt_replicas = 0
        self.rt_pending: dict[int, None] = {}
        self.rt_starting: dict[int, None] = {}
        self.rt_ready: dict[int, None] = {}

    def count(self) -> int:
        return len(self.pending) + len(self.starting) + len(self.ready)

    def rt_count(self) -> int:
        return len(self.rt_pending) + len(self.rt_starting) + len(self.rt_ready)

    def sb_count(self) -> int:
        return len(self.sb_pending) + len(self.sb_starting) + len(self.sb_ready)
