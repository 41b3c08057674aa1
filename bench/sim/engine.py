"""Discrete-event simulation of the unified cluster: one event heap, integer GPU accounting, no randomness.

Why an own event queue rather than simpy: every process here is either periodic (HPA, controller,
descheduler, sampling) or a single timer (a gang ends, a pod turns Ready), so a heap of plain tuples does
the job with plain functions as handlers. Measured here, the bare machinery for the 720k periodic events
of a 30-day run costs 0.33 s CPU on a heap against 0.95 s on simpy's Environment; either is small next
to the model's own work (about 16 s CPU for the controller policy at 4,096 GPUs), so the choice is for
simplicity and for the tie-break order (time, then push order) that makes runs exactly reproducible.

What is modelled, and how:

- On-prem nodes in pools; a training gang takes whole nodes of one pool, all at once (gang admission),
  choosing empty nodes first and then the nodes with the fewest inference GPUs, whose inference pods it
  deletes outright (a batch scheduler's preemption does not wait for PDBs). Gangs pass Volcano's enqueue
  (pods exist only once the queue has room for them) and allocate (in arrival order, smaller gangs
  backfilling past larger ones), as the stack's scheduler configuration has it. The enqueue room is
  cluster-wide with one training queue, per pool with one queue per pool (`ClusterModel.queue_per_pool`).
- Inference pods are bin-packed (best fit) onto nodes without training; when none fits they go to the first
  virtual node that is open (our taint absent) and has GPU and pod room, else they stay pending
  (unschedulable). A pod is Ready after the on-prem or external start latency.
- HPA per service every period: desired = ceil(demand × headroom) clamped to [min, max], with the upstream
  stabilisation rule (scale up to the minimum of the up-window, down to the maximum of the down-window).
  Scale-down deletes pods in the ReplicaSet's order: unplaced, not ready, lower deletion cost, newest.
- The burst controller's real core (through `controller_adapter`) every `tick_seconds`.
- The descheduler every interval: on virtual nodes that carry our NoSchedule taint it evicts pods older than
  the minimum age, within the per-node/namespace/total limits, only when the pod fits on-prem (nodeFit) and
  the service's PDB (maxUnavailable) allows; the ReplicaSet's replacement is scheduled at once.
- The make-before-break handover, when the controller's settings name handover services: an Inqueue gang's
  pods are gated (not allocated) until the core sends UNGATE; gated and released-but-unbound gangs are the
  core's unplaced training. Each service has a standby Deployment the core scales (SET_STANDBY): its pods
  go only to virtual nodes with GPU and pod room, whatever our taint says (they tolerate it), are Ready
  after the external start latency, serve traffic and count in the service's PDB, but are not the HPA's
  replicas; no gang preempts them (they are never on-prem) and the descheduler leaves them (they tolerate
  the taint). Scale-down deletes not-ready standby pods first. Their GPUs are external GPUs.
"""

from __future__ import annotations

import heapq
import math
import time
from collections import deque
from dataclasses import dataclass, field

from bench.sim.controller_adapter import ControllerAdapter, Mode
from bench.sim.model import ClusterModel
from bench.sim.policies import ALWAYS, CONTROLLER, Policy
from bench.sim.workload import Gang, Workload

# Event kinds (ints keep heap tuples cheap and comparable).
_ARRIVAL, _JOB_END, _POD_READY, _HPA, _CTRL, _DESCHED, _SAMPLE = range(7)
_PENDING, _STARTING, _READY = 0, 1, 2
WINDOW_S = 300.0
INFERENCE_NAMESPACE = "inference"
TRAINING_NAMESPACE = "training"


class _Pod:
    __slots__ = ("cost", "created", "gpus", "id", "node", "standby", "state", "svc")

    def __init__(self, pid: int, svc: int, gpus: int, created: float, standby: bool = False) -> None:
        self.id = pid
        self.svc = svc
        self.gpus = gpus
        self.created = created
        self.state = _PENDING
        self.node = -1  # >= 0: on-prem node index; <= -2: virtual node -(node + 2); -1: unplaced
        self.cost = False
        self.standby = standby  # a pod of the service's standby Deployment (handover), not the HPA's


class _Service:
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
        "sb_pending",
        "sb_ready",
        "sb_replicas",
        "sb_starting",
        "starting",
        "up_s",
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
        # What the handover core reads, kept as the pods change: ready main pods on virtual nodes and per
        # on-prem zone, and the standby Deployment's target and pods.
        self.handover = False  # named in the controller's handover services: the core sees this service
        self.ready_ext = 0
        self.ready_zone = [0] * zones
        self.sb_replicas = 0
        self.sb_pending: dict[int, None] = {}
        self.sb_starting: dict[int, None] = {}
        self.sb_ready: dict[int, None] = {}

    def count(self) -> int:
        return len(self.pending) + len(self.starting) + len(self.ready)

    def sb_count(self) -> int:
        return len(self.sb_pending) + len(self.sb_starting) + len(self.sb_ready)


@dataclass
class Outcome:
    """Outcomes of one policy over the measured period (after warm-up)."""

    policy: str
    gpus: int
    days: float
    onprem_gpu_utilization: float = 0.0
    training_gpu_utilization: float = 0.0
    inference_availability: float = 1.0
    worst_window_availability: float = 1.0
    external_gpu_hours: float = 0.0
    evictions_per_hour: float = 0.0
    preemptions: int = 0
    descheduler_evictions: int = 0
    taint_flips: int = 0
    node_taint_patches: int = 0
    burst_open_share: float = 0.0
    surges: int = 0
    return_minutes_mean: float | None = None
    return_minutes_max: float | None = None
    gangs_admitted: int = 0
    gangs_rejected: int = 0
    gang_wait_hours_mean: float = 0.0
    events: int = 0
    decide_calls: int = 0
    decide_skipped: int = 0
    standby_gpu_hours: float = 0.0  # part of external_gpu_hours: the handover's standby replicas
    runtime_s: float = 0.0
    samples: list[tuple[float, int, int, int, int]] = field(default_factory=list, repr=False)

    def summary(self) -> dict[str, object]:
        """The outcome without the time series (what reports and tables show)."""
        return {k: v for k, v in self.__dict__.items() if k != "samples"}


class Simulator:
    """One run of one policy on one workload. `check=True` verifies the invariants after every event."""

    def __init__(self, model: ClusterModel, workload: Workload, policy: Policy, seconds: float,
                 warmup_s: float = 0.0, sample_s: float = WINDOW_S, check: bool = False,
                 exact_ticks: bool = False) -> None:
        self.model = model
        self.workload = workload
        self.policy = policy
        self.end = warmup_s + seconds
        self.warmup = warmup_s
        self.sample_s = sample_s
        self.check_each = check
        lat = model.latencies
        self.onprem_lat = 0.0 if policy.zero_lag else lat.onprem_start_s
        self.external_lat = 0.0 if policy.zero_lag else lat.external_start_s
        self.hpa_period = lat.hpa_period_s
        self.headroom = 1.0 if policy.zero_lag else workload.spec.hpa_headroom
        self.now = 0.0
        self._heap: list[tuple[float, int, int, int]] = []
        self._seq = 0
        self.events = 0
        self._build_nodes()
        self._build_virtual()
        self.services = [
            _Service(s.name, s.gpus_per_replica, s.min_replicas, s.max_replicas, s.max_unavailable,
                     s.scale_up_stabilization_s, s.scale_down_stabilization_s, len(self.zone_gpn))
            for s in model.services
        ]
        self.service_index = {svc.name: i for i, svc in enumerate(self.services)}
        self.pods: dict[int, _Pod] = {}
        self._next_pod = 0
        self.pending: dict[int, None] = {}  # unplaced inference pods, FIFO
        self.pending_inf_gpus = 0
        self.onprem_inf_gpus = 0
        self.ext_gpus = 0
        # Handover: standby pods waiting for virtual-node room (FIFO, not pending inference: they never open
        # the burst), standby GPUs on virtual nodes, gangs behind the gate, and a counter that changes
        # whenever anything the core reads about the handover changes (the quiet-tick key).
        handover = policy.settings.handover_services if policy.burst == CONTROLLER and policy.settings else {}
        for svc in self.services:
            svc.handover = svc.name in handover
        self.handover = bool(handover)
        self.sb_pending: dict[int, None] = {}
        self.sb_ext_gpus = 0
        self.gated: dict[int, None] = {}  # Inqueue gangs whose pods carry the handover gate, in order
        self.handover_seq = 0
        self.train_gpus = 0
        self._capacity_changed = False
        self._admit_dirty = False
        # Training.
        self.gangs: list[Gang] = list(workload.gangs)
        self.gangs_rejected = 0
        self._next_gang = 0
        self.queue: dict[int, dict[int, float]] = {z: {} for z in range(len(self.zones))}  # zone -> gang -> arrival
        self.pending_train_gpus = 0  # GPUs of Inqueue gangs (pods created, unschedulable)
        self.waiting: dict[int, float] = {}  # gangs not yet Inqueue (no pods): gang -> arrival
        self.jobs: dict[int, tuple[int, list[int]]] = {}
        # Metrics.
        self._a_train = self._a_inf = self._a_ext = self._a_open = self._a_standby = 0.0
        self._a_served = self._a_demand = 0.0
        self._served = self._demanded = 0.0
        self._avail_dirty = True
        nwin = max(1, math.ceil(seconds / WINDOW_S))
        self._w_served = [0.0] * nwin
        self._w_demand = [0.0] * nwin
        self.preemptions = self.desched_evictions = 0
        self.surges = 0
        self.flips = self.node_patches = 0  # within the measured period (the adapter counts the whole run)
        self._surge_closed_at: float | None = None
        self.returns: list[float] = []
        self.gang_waits: list[float] = []
        self.samples: list[tuple[float, int, int, int, int]] = []
        self.controller: ControllerAdapter | None = None
        if policy.burst == CONTROLLER:
            if policy.settings is None:
                raise ValueError(f"policy {policy.name!r}: the controller needs settings")
            self.controller = ControllerAdapter(policy.settings, self, exact_ticks=exact_ticks,
                                                on_flip=self._on_flip, per_pool=policy.pool_accounting)

    # ------------------------------------------------------------------ construction

    def _build_nodes(self) -> None:
        """Zones are (pool, reserved-for-inference) halves of pools; buckets index nodes by free GPUs."""
        reserve = self.policy.reserved_inference_gpus
        total = self.model.onprem_gpus
        self.zone_gpn: list[int] = []
        self.zone_pool: list[str] = []
        self.zone_reserved: list[bool] = []
        self.node_zone: list[int] = []
        self.node_free: list[int] = []
        self.node_job: list[int] = []
        self.node_pods: list[dict[int, None]] = []
        self.train_zone: dict[str, int] = {}
        for pool in self.model.pools:
            reserved_nodes = 0
            if reserve:
                share = pool.nodes * pool.gpus_per_node / total
                reserved_nodes = min(pool.nodes, math.ceil(reserve * share / pool.gpus_per_node))
            for is_reserved, count in ((False, pool.nodes - reserved_nodes), (True, reserved_nodes)):
                if count == 0 and is_reserved:
                    continue
                z = len(self.zone_gpn)
                self.zone_gpn.append(pool.gpus_per_node)
                self.zone_pool.append(pool.name)
                self.zone_reserved.append(is_reserved)
                if not is_reserved:
                    self.train_zone[pool.name] = z
                for _ in range(count):
                    self.node_zone.append(z)
                    self.node_free.append(pool.gpus_per_node)
                    self.node_job.append(-1)
                    self.node_pods.append({})
        self.zones = range(len(self.zone_gpn))
        self.zone_nodes = [0] * len(self.zone_gpn)
        for z in self.node_zone:
            self.zone_nodes[z] += 1
        self.max_gpn = max(self.zone_gpn, default=0)
        self.min_gpn = min(self.zone_gpn, default=1)
        self.buckets: list[list[dict[int, None]]] = [[{} for _ in range(g + 1)] for g in self.zone_gpn]
        self.zone_avail = [0] * len(self.zone_gpn)  # nodes without training
        # GPUs per zone held by training, by inference on-prem, and asked for by Inqueue gangs.
        self.zone_train = [0] * len(self.zone_gpn)
        self.zone_inf = [0] * len(self.zone_gpn)
        self.zone_pend = [0] * len(self.zone_gpn)
        for i, z in enumerate(self.node_zone):
            self.buckets[z][self.node_free[i]][i] = None
            self.zone_avail[z] += 1
        reserved = [z for z in self.zones if self.zone_reserved[z]]
        self.inf_zones = reserved if reserve else list(self.zones)
        self.capacity = sum(self.zone_gpn[z] for z in self.node_zone)
        self.train_capacity = sum(self.zone_gpn[z] for z in self.node_zone if not self.zone_reserved[z])
        self.preempt = not reserve

    def _build_virtual(self) -> None:
        provs = self.model.providers
        self.vn_name = [p.node_name for p in provs]
        self.vn_provider = [p.name for p in provs]
        self.vn_cap = [p.gpus for p in provs]
        self.vn_podcap = [p.pods for p in provs]
        self.vn_used = [0] * len(provs)
        self.vn_pods: list[dict[int, None]] = [{} for _ in provs]
        open_ = self.policy.burst == ALWAYS
        self.vn_taint: list[str | None] = [None if open_ else "NoSchedule" for _ in provs]
        self.vn_changed: list[float | None] = [None] * len(provs)
        self.vn_index = {n: i for i, n in enumerate(self.vn_name)}
        self.needing_cost: dict[int, None] = {}

    # ------------------------------------------------------------------ the adapter's port

    def onprem_allocatable_gpus(self) -> int:
        return self.capacity

    def onprem_free_gpus(self) -> int:
        return self.capacity - self.train_gpus - self.onprem_inf_gpus

    def pending_inference_gpus(self) -> int:
        return self.pending_inf_gpus

    def pending_training_gpus(self) -> int:
        return self.pending_train_gpus

    def pool_gpus(self) -> dict[str, tuple[int, int]]:
        """Per pool: (free on-prem GPUs, GPUs of Inqueue gangs waiting for it); O(zones)."""
        out: dict[str, tuple[int, int]] = {}
        for z in self.zones:
            free = self.zone_nodes[z] * self.zone_gpn[z] - self.zone_train[z] - self.zone_inf[z]
            f, p = out.get(self.zone_pool[z], (0, 0))
            out[self.zone_pool[z]] = (f + free, p + self.zone_pend[z])
        return out

    def pool_shapes(self) -> dict[str, tuple[dict[int, int], dict[int, int]]]:
        """Per pool: (free GPUs on a node -> nodes without training with that many, GPUs per waiting gang pod ->
        pods). Gangs here take whole nodes, so each Inqueue gang is `nodes` pods of the zone's GPUs per node.
        O(zones × GPUs per node)."""
        out: dict[str, tuple[dict[int, int], dict[int, int]]] = {}
        for z in self.zones:
            free_nodes, pods = out.setdefault(self.zone_pool[z], ({}, {}))
            for f, nodes in enumerate(self.buckets[z]):
                if f and nodes:
                    free_nodes[f] = free_nodes.get(f, 0) + len(nodes)
            gpn = self.zone_gpn[z]
            if self.zone_pend[z]:
                pods[gpn] = pods.get(gpn, 0) + self.zone_pend[z] // gpn
        return out

    def quiet_key(self) -> tuple[object, ...]:
        """Everything the core's input depends on, cheaply: equal keys mean equal snapshots (but the clock).

        While training waits under the handover, where the free GPUs are (node by node) matters too.
        """
        shapes: tuple[object, ...] = ()
        if self.handover and self.pending_train_gpus:
            shapes = tuple(tuple(len(b) for b in self.buckets[z]) for z in self.zones if self.zone_pend[z])
        return (self.train_gpus + self.onprem_inf_gpus, self.pending_inf_gpus, self.pending_train_gpus,
                tuple(self.vn_used), tuple(self.vn_taint), tuple(self.vn_changed), len(self.needing_cost),
                tuple(self.zone_train), tuple(self.zone_inf), tuple(self.zone_pend), self.handover_seq, shapes)

    def service_replicas(self) -> dict[str, tuple[int, int, int, int, dict[str, int], int, int]]:
        """Per handover service: (minReplicas, main live, main ready, main ready on virtual nodes, main ready
        per on-prem pool, standby live, standby ready); O(services × zones) from the kept counts.

        minReplicas is the simulated service's own (the stack derives its handover services from the same
        field), so a model scaled to another size keeps the standby's cap and the HPA's floor equal.
        """
        out: dict[str, tuple[int, int, int, int, dict[str, int], int, int]] = {}
        for svc in self.services:
            if not svc.handover:
                continue
            onprem: dict[str, int] = {}
            for z, n in enumerate(svc.ready_zone):
                if n:
                    onprem[self.zone_pool[z]] = onprem.get(self.zone_pool[z], 0) + n
            out[svc.name] = (svc.min, svc.count(), len(svc.ready), svc.ready_ext, onprem, svc.sb_count(),
                             len(svc.sb_ready))
        return out

    def gated_pods(self) -> list[tuple[str, str]]:
        """One pod reference per gated gang (the core releases them all at once anyway)."""
        return [(TRAINING_NAMESPACE, f"gang-{index}") for index in self.gated]

    def standby_external_gpus(self) -> int:
        return self.sb_ext_gpus

    def virtual_nodes(self) -> list[tuple[str, str, str | None, int, float | None]]:
        return [
            (self.vn_name[v], self.vn_provider[v], self.vn_taint[v], self.vn_used[v], self.vn_changed[v])
            for v in range(len(self.vn_name))
        ]

    def pods_needing_cost(self, limit: int) -> list[tuple[str, str]]:
        out: list[tuple[str, str]] = []
        for pid in self.needing_cost:
            if len(out) >= limit:
                break
            out.append((INFERENCE_NAMESPACE, f"p{pid}"))
        return out

    def set_taint(self, node: str, effect: str | None, now: float) -> None:
        v = self.vn_index[node]
        self.vn_taint[v] = effect
        self.vn_changed[v] = now
        if now >= self.warmup:
            self.node_patches += 1
        if effect is None:
            self._capacity_changed = True

    def set_deletion_cost(self, namespace: str, pod: str, cost: int) -> None:
        pid = int(pod[1:])
        p = self.pods.get(pid)
        if p is not None:
            p.cost = cost < 0
            self.needing_cost.pop(pid, None)

    def set_standby(self, service: str, replicas: int) -> None:
        s = self.service_index.get(service)
        if s is None:
            return  # a handover service the model does not run: no standby Deployment to scale
        self.services[s].sb_replicas = replicas
        self._reconcile_standby(s)

    def ungate(self, namespace: str, pod: str) -> None:
        index = int(pod.removeprefix("gang-"))
        if index in self.gated:
            del self.gated[index]
            self.handover_seq += 1
            self._admit_dirty = True  # allocate at the end of this event, as the scheduler would at once

    def _on_flip(self, mode: Mode, now: float) -> None:
        if now >= self.warmup:
            self.flips += 1
        if mode is Mode.CLOSED:
            self.surges += 1 if now >= self.warmup else 0
            self._surge_closed_at = now if self.ext_gpus else None
        else:
            self._surge_closed_at = None

    # ------------------------------------------------------------------ event loop

    def _push(self, t: float, kind: int, arg: int = 0) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (t, self._seq, kind, arg))

    def run(self) -> Outcome:
        started = time.perf_counter()
        self._push(0.0, _HPA)
        if self.controller is not None:
            self._push(0.0, _CTRL)
        if self.policy.descheduler is not None:
            self._push(self.policy.descheduler.interval_s, _DESCHED)
        self._push(self.warmup, _SAMPLE)
        if self.gangs:
            self._push(self.gangs[0].arrival_s, _ARRIVAL, 0)
        if self.controller is not None:
            self.controller.start(0.0)
        heap = self._heap
        pop = heapq.heappop
        end = self.end
        while heap:
            t, _, kind, arg = pop(heap)
            if t > end:
                break
            if t > self.now:
                self._integrate(self.now, t)
                self.now = t
            self.events += 1
            if kind == _CTRL:
                assert self.controller is not None
                self.controller.tick(t)
                self._push(t + self.controller.settings.tick_seconds, _CTRL)
            elif kind == _POD_READY:
                self._pod_ready(arg)
            elif kind == _HPA:
                self._hpa(t)
                self._push(t + self.hpa_period, _HPA)
            elif kind == _ARRIVAL:
                self._arrival(arg)
            elif kind == _JOB_END:
                self._job_end(arg)
            elif kind == _DESCHED:
                assert self.policy.descheduler is not None
                self._deschedule(t)
                self._push(t + self.policy.descheduler.interval_s, _DESCHED)
            elif kind == _SAMPLE:
                self.samples.append((t, self.train_gpus, self.onprem_inf_gpus, self.ext_gpus,
                                     int(any(x is None for x in self.vn_taint))))
                self._push(t + self.sample_s, _SAMPLE)
            self._schedule()
            if self.check_each:
                self.check()
        if self.now < end:
            self._integrate(self.now, end)
            self.now = end
        return self._outcome(time.perf_counter() - started)

    # ------------------------------------------------------------------ metrics

    def _refresh_availability(self) -> None:
        served = demanded = 0.0
        for s in self.services:
            d = s.demand * s.gpus
            demanded += d
            ready = (len(s.ready) + len(s.sb_ready)) * s.gpus  # the standby serves traffic too
            served += ready if ready < d else d
        self._served, self._demanded = served, demanded
        self._avail_dirty = False

    def _integrate(self, t0: float, t1: float) -> None:
        if t1 <= self.warmup:
            return
        t0 = max(t0, self.warmup)
        dt = t1 - t0
        self._a_train += self.train_gpus * dt
        self._a_inf += self.onprem_inf_gpus * dt
        self._a_ext += self.ext_gpus * dt
        self._a_standby += self.sb_ext_gpus * dt
        if any(x is None for x in self.vn_taint):
            self._a_open += dt
        if self._avail_dirty:
            self._refresh_availability()
        served, demanded = self._served, self._demanded
        self._a_served += served * dt
        self._a_demand += demanded * dt
        # Split across 5-minute windows.
        a = t0 - self.warmup
        b = t1 - self.warmup
        nwin = len(self._w_served)
        w = int(a // WINDOW_S)
        if w == int(b // WINDOW_S) and w < nwin:
            self._w_served[w] += served * dt
            self._w_demand[w] += demanded * dt
            return
        while a < b:
            w = min(int(a // WINDOW_S), nwin - 1)
            edge = min(b, (w + 1) * WINDOW_S) if w < nwin - 1 else b
            span = edge - a
            self._w_served[w] += served * span
            self._w_demand[w] += demanded * span
            a = edge

    def _outcome(self, runtime: float) -> Outcome:
        span = self.end - self.warmup
        hours = span / 3600.0
        cap = self.capacity * span
        windows = [s / d for s, d in zip(self._w_served, self._w_demand, strict=True) if d > 0]
        out = Outcome(
            policy=self.policy.name,
            gpus=self.capacity,
            days=span / 86400.0,
            onprem_gpu_utilization=(self._a_train + self._a_inf) / cap if cap else 0.0,
            training_gpu_utilization=self._a_train / cap if cap else 0.0,
            inference_availability=self._a_served / self._a_demand if self._a_demand else 1.0,
            worst_window_availability=min(windows) if windows else 1.0,
            external_gpu_hours=self._a_ext / 3600.0,
            standby_gpu_hours=self._a_standby / 3600.0,
            evictions_per_hour=(self.preemptions + self.desched_evictions) / hours if hours else 0.0,
            preemptions=self.preemptions,
            descheduler_evictions=self.desched_evictions,
            burst_open_share=self._a_open / span if span else 0.0,
            surges=self.surges,
            return_minutes_mean=sum(self.returns) / len(self.returns) / 60.0 if self.returns else None,
            return_minutes_max=max(self.returns) / 60.0 if self.returns else None,
            gangs_admitted=len(self.gang_waits),
            gangs_rejected=self.gangs_rejected,
            gang_wait_hours_mean=sum(self.gang_waits) / len(self.gang_waits) / 3600.0 if self.gang_waits else 0.0,
            events=self.events,
            runtime_s=runtime,
            samples=self.samples,
        )
        if self.controller is not None:
            st = self.controller.stats
            out.taint_flips = self.flips
            out.node_taint_patches = self.node_patches
            out.decide_calls = st.calls
            out.decide_skipped = st.skipped
        return out

    # ------------------------------------------------------------------ training

    def _arrival(self, index: int) -> None:
        gang = self.gangs[index]
        z = self.train_zone.get(gang.pool)
        if z is None or self.zone_nodes[z] == 0 or gang.nodes <= 0:
            self.gangs_rejected += 1  # no such pool (trace) or a pool wholly reserved for inference
        else:
            nodes = min(gang.nodes, self.zone_nodes[z])  # a gang larger than its pool waits forever: cap it
            if nodes != gang.nodes:
                self.gangs[index] = Gang(gang.arrival_s, nodes, gang.duration_s, gang.pool)
            self.waiting[index] = self.now
            self._admit_dirty = True
        if index + 1 < len(self.gangs):
            self._push(self.gangs[index + 1].arrival_s, _ARRIVAL, index + 1)

    def _admit(self) -> None:
        """Volcano's enqueue then allocate, as the stack configures them (priority, gang, proportion).

        enqueue: a gang becomes Inqueue — and only then does the job controller create its pods — while the
        training queue's allocated plus Inqueue GPUs stay within the queue's real capability (all on-prem
        GPUs training may use); a gang that does not fit is passed over, not waited for. allocate: an Inqueue
        gang starts when its pool has enough nodes without training (inference on them is preempted).
        Only Inqueue gangs have (unschedulable) pods, so only they count as pending training GPUs. With the
        handover on, an Inqueue gang's pods carry the gate: allocate passes it over until the core lifts it.
        """
        if self.waiting:
            per_pool = self.model.queue_per_pool
            # Room per training queue: key -1 is the one queue over every pool, else the pool's zone.
            rooms: dict[int, int] = (
                {z: self.zone_nodes[z] * self.zone_gpn[z] - self.zone_train[z] - self.zone_pend[z]
                 for z in self.train_zone.values()}
                if per_pool else {-1: self.train_capacity - self.train_gpus - self.pending_train_gpus}
            )
            if not self.model.enqueue_gate:
                rooms = dict.fromkeys(rooms, 1 << 60)  # every gang Inqueue on arrival: pending at once
            for index in list(self.waiting):
                if max(rooms.values()) < self.min_gpn:
                    break
                gang = self.gangs[index]
                z = self.train_zone[gang.pool]
                key = z if per_pool else -1
                gpus = gang.nodes * self.zone_gpn[z]
                if gpus <= rooms[key]:
                    self.queue[z][index] = self.waiting.pop(index)
                    self.pending_train_gpus += gpus
                    self.zone_pend[z] += gpus
                    rooms[key] -= gpus
                    if self.handover:
                        self.gated[index] = None  # the pods are created behind the handover gate
                        self.handover_seq += 1
        gated = self.gated
        for z, queue in self.queue.items():
            if not queue or self.zone_avail[z] == 0:
                continue
            for index in list(queue):
                gang = self.gangs[index]
                if gang.nodes > self.zone_avail[z] or index in gated:
                    continue
                arrived = queue.pop(index)
                self._start_gang(index, gang, z, arrived)
                if self.zone_avail[z] == 0:
                    break

    def _start_gang(self, index: int, gang: Gang, z: int, arrived: float) -> None:
        assert index not in self.gated
        gpn = self.zone_gpn[z]
        buckets = self.buckets[z]
        chosen: list[int] = []
        need = gang.nodes
        for f in range(gpn, -1, -1):
            b = buckets[f]
            while b and need:
                node = next(iter(b))
                del b[node]
                chosen.append(node)
                need -= 1
            if not need:
                break
        self.zone_avail[z] -= gang.nodes
        hit: set[int] = set()
        for node in chosen:
            self.node_job[node] = index
            for pid in list(self.node_pods[node]):
                pod = self.pods[pid]
                hit.add(pod.svc)
                self._remove_pod(pod)
                if self.now >= self.warmup:
                    self.preemptions += 1
            self.node_free[node] = 0
        self.train_gpus += gang.nodes * gpn
        self.pending_train_gpus -= gang.nodes * gpn
        self.zone_train[z] += gang.nodes * gpn
        self.zone_pend[z] -= gang.nodes * gpn
        self.jobs[index] = (z, chosen)
        if self.now >= self.warmup:
            self.gang_waits.append(self.now - arrived)
        self._push(self.now + gang.duration_s, _JOB_END, index)
        for s in sorted(hit):
            self._reconcile(s)  # the ReplicaSets replace what the gang deleted

    def _job_end(self, index: int) -> None:
        z, nodes = self.jobs.pop(index)
        gpn = self.zone_gpn[z]
        for node in nodes:
            self.node_job[node] = -1
            self.node_free[node] = gpn
            self.buckets[z][gpn][node] = None
        self.zone_avail[z] += len(nodes)
        self.train_gpus -= len(nodes) * gpn
        self.zone_train[z] -= len(nodes) * gpn
        self._capacity_changed = True
        self._admit_dirty = True

    # ------------------------------------------------------------------ inference pods

    def _place(self, pod: _Pod) -> bool:
        g = pod.gpus
        if pod.standby:
            return self._place_virtual(pod, any_taint=True)
        buckets = self.buckets
        for f in range(g, self.max_gpn + 1):
            for z in self.inf_zones:
                if f >= len(buckets[z]):
                    continue
                b = buckets[z][f]
                if b:
                    node = next(iter(b))
                    del b[node]
                    buckets[z][f - g][node] = None
                    self.node_free[node] = f - g
                    self.node_pods[node][pod.id] = None
                    pod.node = node
                    self.onprem_inf_gpus += g
                    self.zone_inf[z] += g
                    self._start_pod(pod, self.onprem_lat)
                    return True
        return self._place_virtual(pod, any_taint=False)

    def _place_virtual(self, pod: _Pod, any_taint: bool) -> bool:
        """The first virtual node with GPU and pod room that is open (or any, for a pod tolerating our taint)."""
        g = pod.gpus
        for v in range(len(self.vn_name)):
            if (any_taint or self.vn_taint[v] is None) and self.vn_used[v] + g <= self.vn_cap[v] \
                    and len(self.vn_pods[v]) < self.vn_podcap[v]:
                self.vn_used[v] += g
                self.vn_pods[v][pod.id] = None
                pod.node = -2 - v
                self.ext_gpus += g
                if self.controller is not None and not pod.standby:  # a standby is external anyway
                    self.needing_cost[pod.id] = None
                if pod.standby:
                    self.sb_ext_gpus += g
                    self.handover_seq += 1
                self._start_pod(pod, self.external_lat)
                return True
        return False

    def _start_pod(self, pod: _Pod, latency: float) -> None:
        svc = self.services[pod.svc]
        pending, starting = (svc.sb_pending, svc.sb_starting) if pod.standby else (svc.pending, svc.starting)
        if pod.state == _PENDING and pod.id in pending:
            del pending[pod.id]
        pod.state = _STARTING
        starting[pod.id] = None
        if latency <= 0:
            self._pod_ready(pod.id)
        else:
            self._push(self.now + latency, _POD_READY, pod.id)

    def _pod_ready(self, pid: int) -> None:
        pod = self.pods.get(pid)
        if pod is None or pod.state != _STARTING:
            return
        svc = self.services[pod.svc]
        pod.state = _READY
        self._avail_dirty = True
        if pod.standby:
            del svc.sb_starting[pid]
            svc.sb_ready[pid] = None
            self.handover_seq += 1
            return
        del svc.starting[pid]
        svc.ready[pid] = None
        if pod.node <= -2:
            svc.ready_ext += 1
        else:
            svc.ready_zone[self.node_zone[pod.node]] += 1
        if svc.handover:
            self.handover_seq += 1

    def _create_pod(self, s: int) -> None:
        svc = self.services[s]
        pid = self._next_pod
        self._next_pod += 1
        pod = _Pod(pid, s, svc.gpus, self.now)
        self.pods[pid] = pod
        svc.pending[pid] = None
        if svc.handover:
            self.handover_seq += 1
        if not self._place(pod):
            self.pending[pid] = None
            self.pending_inf_gpus += pod.gpus

    def _create_standby(self, s: int) -> None:
        svc = self.services[s]
        pid = self._next_pod
        self._next_pod += 1
        pod = _Pod(pid, s, svc.gpus, self.now, standby=True)
        self.pods[pid] = pod
        svc.sb_pending[pid] = None
        self.handover_seq += 1
        if not self._place(pod):
            self.sb_pending[pid] = None

    def _remove_pod(self, pod: _Pod) -> None:
        svc = self.services[pod.svc]
        pid = pod.id
        node = pod.node
        g = pod.gpus
        del self.pods[pid]
        if pod.standby or svc.handover:
            self.handover_seq += 1
        if pod.standby:
            if pod.state == _PENDING:
                del svc.sb_pending[pid]
                self.sb_pending.pop(pid, None)
            elif pod.state == _STARTING:
                del svc.sb_starting[pid]
            else:
                del svc.sb_ready[pid]
                self._avail_dirty = True
            if node <= -2:
                self.sb_ext_gpus -= g
        elif pod.state == _PENDING:
            del svc.pending[pid]
            if pid in self.pending:
                del self.pending[pid]
                self.pending_inf_gpus -= pod.gpus
        elif pod.state == _STARTING:
            del svc.starting[pid]
        else:
            del svc.ready[pid]
            self._avail_dirty = True
            if node <= -2:
                svc.ready_ext -= 1
            else:
                svc.ready_zone[self.node_zone[node]] -= 1
        if node >= 0:
            del self.node_pods[node][pid]
            self.onprem_inf_gpus -= g
            self.zone_inf[self.node_zone[node]] -= g
            if self.node_job[node] == -1:
                z = self.node_zone[node]
                f = self.node_free[node]
                del self.buckets[z][f][node]
                self.buckets[z][f + g][node] = None
                self.node_free[node] = f + g
                self._capacity_changed = True
        elif node <= -2:
            v = -2 - node
            del self.vn_pods[v][pid]
            self.vn_used[v] -= g
            self.ext_gpus -= g
            self.needing_cost.pop(pid, None)
            self._capacity_changed = True
            if self.ext_gpus == 0 and self._surge_closed_at is not None:
                if self.now >= self.warmup:
                    self.returns.append(self.now - self._surge_closed_at)
                self._surge_closed_at = None

    def _reconcile(self, s: int) -> None:
        """The ReplicaSet: create or delete pods until the service has `replicas` of them."""
        svc = self.services[s]
        diff = svc.replicas - svc.count()
        for _ in range(diff):
            self._create_pod(s)
        if diff < 0:
            for pod in self._deletion_order(svc, -diff):
                self._remove_pod(pod)

    def _reconcile_standby(self, s: int) -> None:
        """The standby Deployment's ReplicaSet: scale to `sb_replicas`, deleting unplaced, then not ready, newest
        first (standby pods all sit on virtual nodes with the same deletion cost: that is the whole ranking)."""
        svc = self.services[s]
        diff = svc.sb_replicas - svc.sb_count()
        for _ in range(diff):
            self._create_standby(s)
        for group in (svc.sb_pending, svc.sb_starting, svc.sb_ready):
            for pid in reversed(list(group)):
                if diff >= 0:
                    return
                self._remove_pod(self.pods[pid])
                diff += 1

    def _deletion_order(self, svc: _Service, n: int) -> list[_Pod]:
        """Upstream ReplicaSet ranking, reduced to what differs here: unplaced, not ready, cost, newest."""
        out: list[_Pod] = []
        pods = self.pods
        for group in (svc.pending, svc.starting):
            for pid in reversed(list(group)):
                if len(out) == n:
                    return out
                out.append(pods[pid])
        ready = [pods[pid] for pid in reversed(list(svc.ready))]
        for pod in ready:
            if len(out) == n:
                return out
            if pod.cost:
                out.append(pod)
        for pod in ready:
            if len(out) == n:
                return out
            if not pod.cost:
                out.append(pod)
        return out

    def _retry_pending(self) -> None:
        if not self.pending and not self.sb_pending:
            return
        failed_at = 1 << 30
        for pid in list(self.pending):
            pod = self.pods[pid]
            if pod.gpus >= failed_at:
                continue
            if self._place(pod):
                del self.pending[pid]
                self.pending_inf_gpus -= pod.gpus
            else:
                failed_at = pod.gpus
        failed_at = 1 << 30  # standby pods have their own placement (any virtual node): own cut-off
        for pid in list(self.sb_pending):
            pod = self.pods[pid]
            if pod.gpus >= failed_at:
                continue
            if self._place(pod):
                del self.sb_pending[pid]
            else:
                failed_at = pod.gpus

    def _schedule(self) -> None:
        """One scheduler pass: gangs first (training outranks inference), then unplaced inference pods."""
        if self._admit_dirty:
            self._admit_dirty = False
            if self.pending_train_gpus or self.waiting:
                self._admit()
        if self._capacity_changed:
            self._capacity_changed = False
            self._retry_pending()

    # ------------------------------------------------------------------ HPA and descheduler

    def _hpa(self, t: float) -> None:
        demand = self.workload.demand
        for s, svc in enumerate(self.services):
            d = demand(svc.name, svc.max, t)
            if d != svc.demand:
                svc.demand = d
                self._avail_dirty = True
            raw = min(max(math.ceil(d * self.headroom - 1e-9), svc.min), svc.max)
            if self.policy.zero_lag:
                target = raw
            else:
                up = raw if svc.up_s <= 0 else self._window(svc.history_up, t, raw, svc.up_s, lowest=True)
                down = self._window(svc.history, t, raw, svc.down_s, lowest=False)
                target = svc.replicas
                if target < up:
                    target = up
                elif target > down:
                    target = down
            if target != svc.replicas:
                svc.replicas = target
                self._reconcile(s)
        if self.policy.zero_lag:
            self._rebalance()

    @staticmethod
    def _window(hist: deque[tuple[float, int]], t: float, value: int, span: float, lowest: bool) -> int:
        """Sliding-window min or max of recommendations (monotone deque: O(1) amortised)."""
        if lowest:
            while hist and hist[-1][1] >= value:
                hist.pop()
        else:
            while hist and hist[-1][1] <= value:
                hist.pop()
        hist.append((t, value))
        while hist[0][0] < t - span:
            hist.popleft()
        return hist[0][1]

    def _rebalance(self) -> None:
        """Oracle only: move external pods on-prem the moment they fit, at no cost."""
        for v in range(len(self.vn_name)):
            for pid in list(self.vn_pods[v]):
                if self.onprem_free_gpus() == 0:
                    return
                pod = self.pods[pid]
                if pod.standby or not self._fits_onprem(pod.gpus):
                    continue
                s = pod.svc
                self._remove_pod(pod)
                self._create_pod(s)

    def _fits_onprem(self, g: int) -> bool:
        for z in self.inf_zones:
            b = self.buckets[z]
            for f in range(g, len(b)):
                if b[f]:
                    return True
        return False

    def _deschedule(self, t: float) -> None:
        lim = self.policy.descheduler
        assert lim is not None
        total = min(x for x in (lim.max_total, lim.max_per_namespace, 1 << 30) if x is not None)
        for v in range(len(self.vn_name)):
            if self.vn_taint[v] != "NoSchedule" or total <= 0:
                continue
            per_node = lim.max_per_node if lim.max_per_node is not None else 1 << 30
            for pid in list(self.vn_pods[v]):
                if per_node <= 0 or total <= 0:
                    break
                pod = self.pods.get(pid)
                if pod is None or pod.standby or t - pod.created < lim.min_pod_age_s:
                    continue  # a standby pod tolerates our taint: not the descheduler's to move
                svc = self.services[pod.svc]
                # The PDB selects by service, so standby pods count as healthy and their Deployment's scale
                # as expected pods.
                healthy_after = len(svc.ready) + len(svc.sb_ready) - (1 if pod.state == _READY else 0)
                if healthy_after < svc.replicas + svc.sb_replicas - svc.maxunav:
                    continue  # PDB: the eviction API refuses
                if not self._fits_onprem(pod.gpus):
                    continue  # nodeFit
                s = pod.svc
                self._remove_pod(pod)
                if t >= self.warmup:
                    self.desched_evictions += 1
                per_node -= 1
                total -= 1
                self._reconcile(s)

    # ------------------------------------------------------------------ invariants

    def check(self) -> None:
        """Conservation: no node over-allocated, every GPU and every pod accounted for exactly once."""
        onprem = 0
        for i, z in enumerate(self.node_zone):
            gpn = self.zone_gpn[z]
            used = sum(self.pods[p].gpus for p in self.node_pods[i])
            if self.node_job[i] >= 0:
                assert not self.node_pods[i], f"node {i} runs training and inference"
                assert i not in self.buckets[z][self.node_free[i]]
            else:
                assert used + self.node_free[i] == gpn, f"node {i}: {used} used + {self.node_free[i]} free != {gpn}"
                assert i in self.buckets[z][self.node_free[i]]
            assert 0 <= self.node_free[i] <= gpn
            onprem += used
        assert onprem == self.onprem_inf_gpus
        running = sum(len(nodes) * self.zone_gpn[z] for z, nodes in self.jobs.values())
        assert running == self.train_gpus
        assert self.train_gpus + self.onprem_inf_gpus <= self.capacity
        assert sum(self.zone_avail) == sum(1 for j in self.node_job if j < 0)
        for v in range(len(self.vn_name)):
            used = sum(self.pods[p].gpus for p in self.vn_pods[v])
            assert used == self.vn_used[v] <= self.vn_cap[v]
            assert len(self.vn_pods[v]) <= self.vn_podcap[v]
        assert sum(self.vn_used) == self.ext_gpus
        seen = 0
        for s, svc in enumerate(self.services):
            seen += svc.count() + svc.sb_count()
            assert svc.count() == svc.replicas, f"{svc.name}: {svc.count()} pods for {svc.replicas} replicas"
            assert svc.sb_count() == svc.sb_replicas, f"{svc.name}: {svc.sb_count()} standby for {svc.sb_replicas}"
            assert svc.handover or not svc.sb_replicas, f"{svc.name}: a standby without the handover"
            for role, groups in ((False, (svc.pending, svc.starting, svc.ready)),
                                 (True, (svc.sb_pending, svc.sb_starting, svc.sb_ready))):
                for state, group in enumerate(groups):
                    for pid in group:
                        pod = self.pods[pid]
                        assert (pod.svc, pod.standby, pod.state) == (s, role, state), f"pod {pid} misfiled"
                        assert (pod.node == -1) == (state == _PENDING), f"pod {pid}: placement and state disagree"
                        assert not (role and pod.node >= 0), f"standby pod {pid} on-prem"
            # The counts the core reads, kept incrementally, against a recount.
            ready = [self.pods[p] for p in svc.ready]
            assert svc.ready_ext == sum(1 for p in ready if p.node <= -2)
            assert svc.ready_zone == [sum(1 for p in ready if p.node >= 0 and self.node_zone[p.node] == z)
                                      for z in self.zones]
        assert seen == len(self.pods)
        placed = sum(len(p) for p in self.node_pods) + sum(len(p) for p in self.vn_pods)
        assert placed + len(self.pending) + len(self.sb_pending) == len(self.pods)
        assert sum(self.pods[p].gpus for p in self.pending) == self.pending_inf_gpus
        assert all(not self.pods[p].standby for p in self.pending)
        assert all(self.pods[p].standby and self.pods[p].node == -1 for p in self.sb_pending)
        assert self.sb_ext_gpus == sum(self.pods[p].gpus for v in self.vn_pods for p in v if self.pods[p].standby)
        assert set(self.needing_cost) <= {p for v in self.vn_pods for p in v}
        queued = sum(self.gangs[i].nodes * self.zone_gpn[z] for z, q in self.queue.items() for i in q)
        assert queued == self.pending_train_gpus
        assert self.train_gpus + self.pending_train_gpus <= self.train_capacity or not self.model.enqueue_gate
        for z in self.zones:
            assert self.zone_train[z] == sum(len(n) * self.zone_gpn[z] for zz, n in self.jobs.values() if zz == z)
            assert self.zone_inf[z] == sum(self.pods[p].gpus for i in range(len(self.node_zone))
                                           if self.node_zone[i] == z for p in self.node_pods[i])
            assert self.zone_pend[z] == sum(self.gangs[i].nodes * self.zone_gpn[z] for i in self.queue[z])
            if self.model.queue_per_pool and self.model.enqueue_gate:
                assert self.zone_train[z] + self.zone_pend[z] <= self.zone_nodes[z] * self.zone_gpn[z]
        inqueue = {i for q in self.queue.values() for i in q}
        assert not set(self.waiting) & inqueue
        assert set(self.gated) <= inqueue, "a gated gang that is not Inqueue"
        assert self.handover or not self.gated, "gangs gated without the handover"


def simulate(model: ClusterModel, workload: Workload, policy: Policy, seconds: float, warmup_s: float = 0.0,
             check: bool = False, exact_ticks: bool = False) -> Outcome:
    """Run one policy; see `Simulator`."""
    return Simulator(model, workload, policy, seconds, warmup_s, check=check, exact_ticks=exact_ticks).run()


__all__ = ["Outcome", "Simulator", "simulate"]
