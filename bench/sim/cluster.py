"""The simulated cluster's state, shared by every model: the clock and event heap, nodes in zones, virtual nodes,
pods and services, the training queue, and the bookkeeping all models use (filing, binding, starting and
removing pods), with the invariants that say every GPU and every pod is accounted for exactly once.

The models change this state only through these fields and methods; none of them keeps its own copy, so
the order of operations, and with it every result, is the one the single event loop produces.
"""

from __future__ import annotations

import math

from bench.sim.model import ClusterModel
from bench.sim.objects import (
    PENDING,
    POD_READY,
    READY,
    STARTING,
    WARM_READY,
    Counters,
    Events,
    Job,
    Pod,
    Service,
)
from bench.sim.policies import ALWAYS, CONTROLLER, Policy
from bench.sim.workload import Gang
from components.provider_rank import fill_order


class ClusterState:
    """Nodes, virtual nodes, pods, services and the training queue of one run, with their running totals."""

    def __init__(self, model: ClusterModel, policy: Policy, gangs: tuple[Gang, ...] | list[Gang], events: Events,
                 counters: Counters) -> None:
        self.model = model
        self.events = events
        self.counters = counters
        self._build_nodes(policy.reserved_inference_gpus)
        self._build_virtual(open_=policy.burst == ALWAYS)
        self.services = [
            Service(s.name, s.gpus_per_replica, s.min_replicas, s.max_replicas, s.max_unavailable,
                    s.scale_up_stabilization_s, s.scale_down_stabilization_s, len(self.zone_gpn))
            for s in model.services
        ]
        self.service_index = {svc.name: i for i, svc in enumerate(self.services)}
        self.pods: dict[int, Pod] = {}
        self.next_pod = 0
        self.pending: dict[int, None] = {}  # unplaced inference pods, FIFO
        self.pending_inf_gpus = 0
        self.onprem_inf_gpus = 0
        self.ext_gpus = 0
        # The controller patches a deletion cost onto every external pod: track the ones still lacking it.
        self.cost_tracking = policy.burst == CONTROLLER
        # Handover: standby pods waiting for virtual-node room (FIFO, not pending inference: they never open
        # the burst), standby GPUs on virtual nodes, gangs behind the gate, and a counter that changes
        # whenever anything the core reads about the handover changes (the quiet-tick key).
        handover = policy.settings.handover_services if policy.burst == CONTROLLER and policy.settings else {}
        for svc in self.services:
            svc.handover = svc.name in handover
        self.handover = bool(handover)
        self.sb_pending: dict[int, None] = {}
        self.sb_ext_gpus = 0
        self.rt_pending: dict[int, None] = {}  # bridge pods waiting for on-prem room (FIFO)
        self.gated: dict[int, None] = {}  # Inqueue gangs whose pods carry the handover gate, in order
        self.handover_seq = 0
        self.train_gpus = 0
        # Work for the scheduler pass at the end of the event, and for the availability integral.
        self.capacity_changed = False
        self.admit_dirty = False
        self.avail_dirty = True
        # Training.
        self.gangs: list[Gang] = list(gangs)
        self.queue: dict[int, dict[int, float]] = {z: {} for z in range(len(self.zones))}  # zone -> gang -> arrival
        self.pending_train_gpus = 0  # GPUs of Inqueue gangs (pods created, unschedulable)
        self.waiting: dict[int, float] = {}  # gangs not yet Inqueue (no pods): gang -> arrival
        self.waiting_train_gpus = 0  # their GPUs: room on-prem that queued training will claim next
        self.jobs: dict[int, Job] = {}
        self.surge_closed_at: float | None = None  # when the last surge closed, while external pods remain

    # ------------------------------------------------------------------ construction

    def _build_nodes(self, reserve: int) -> None:
        """Zones are (pool, reserved-for-inference) halves of pools; buckets index nodes by free GPUs."""
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

    def _build_virtual(self, open_: bool) -> None:
        provs = self.model.providers
        self.vn_name = [p.node_name for p in provs]
        self.vn_provider = [p.name for p in provs]
        self.vn_cap = [p.gpus for p in provs]
        self.vn_podcap = [p.pods for p in provs]
        self.vn_used = [0] * len(provs)
        self.vn_pods: list[dict[int, None]] = [{} for _ in provs]
        self.vn_taint: list[str | None] = [None if open_ else "NoSchedule" for _ in provs]
        self.vn_changed: list[float | None] = [None] * len(provs)
        self.vn_index = {n: i for i, n in enumerate(self.vn_name)}
        # The order a burst fills virtual nodes: the pods' preferred affinity ranks the cheaper provider first.
        self.vn_order = fill_order(provs)
        self.needing_cost: dict[int, None] = {}
        # Warm-pool placeholders: the lowest-priority pods on virtual nodes, outside vn_used (any replica
        # preempts one), each id -> [service, virtual node, ready]; per node, and the ready ones per
        # (service, node) that a replica of that service can take over warm.
        self.warm: dict[int, list[int]] = {}
        self.next_warm = 0
        self.vn_warm: list[dict[int, None]] = [{} for _ in provs]
        self.vn_warm_gpus = [0] * len(provs)
        self.warm_ready: dict[tuple[int, int], dict[int, None]] = {}
        self.warm_gpus = 0
        self.warm_dirty = False  # some service's placeholders differ from its target: refill at the pass

    # ------------------------------------------------------------------ queries

    def onprem_free_gpus(self) -> int:
        return self.capacity - self.train_gpus - self.onprem_inf_gpus

    def fits_onprem(self, g: int) -> bool:
        """Some node an inference pod may use has `g` free GPUs (the descheduler's nodeFit, the oracle's move)."""
        for z in self.inf_zones:
            b = self.buckets[z]
            for f in range(g, len(b)):
                if b[f]:
                    return True
        return False

    # ------------------------------------------------------------------ warm pool

    def room_virtual(self, v: int, g: int) -> bool:
        """Virtual node `v` holds `g` more GPUs and one more pod besides its replicas and placeholders."""
        return (self.vn_used[v] + self.vn_warm_gpus[v] + g <= self.vn_cap[v]
                and len(self.vn_pods[v]) + len(self.vn_warm[v]) < self.vn_podcap[v])

    def add_warm(self, s: int, v: int, latency: float) -> None:
        """A placeholder of service `s` on `v`; it is warm (can hand its instance over) after `latency`."""
        svc = self.services[s]
        wid = self.next_warm
        self.next_warm += 1
        self.warm[wid] = [s, v, 0]
        self.vn_warm[v][wid] = None
        self.vn_warm_gpus[v] += svc.gpus
        self.warm_gpus += svc.gpus
        svc.warm_count += 1
        self.handover_seq += 1
        self.events.push(self.events.now + latency, WARM_READY, wid)

    def warm_became_ready(self, wid: int) -> None:
        entry = self.warm.get(wid)
        if entry is None or entry[2]:
            return
        entry[2] = 1
        self.warm_ready.setdefault((entry[0], entry[1]), {})[wid] = None

    def remove_warm(self, wid: int) -> None:
        s, v, ready = self.warm.pop(wid)
        svc = self.services[s]
        del self.vn_warm[v][wid]
        self.vn_warm_gpus[v] -= svc.gpus
        self.warm_gpus -= svc.gpus
        svc.warm_count -= 1
        if ready:
            del self.warm_ready[(s, v)][wid]
        self.handover_seq += 1
        self.warm_dirty = True  # its Deployment recreates it where there is room

    def take_warm(self, s: int, v: int) -> bool:
        """A replica of `s` lands on `v` and takes over a warm placeholder of its own service, if one is there."""
        ready = self.warm_ready.get((s, v))
        if not ready:
            return False
        self.remove_warm(next(iter(ready)))
        return True

    def make_room(self, v: int, g: int) -> None:
        """A replica preempts placeholders on `v` (the oldest first) until it fits beside them."""
        for wid in list(self.vn_warm[v]):
            if self.room_virtual(v, g):
                return
            self.remove_warm(wid)

    # ------------------------------------------------------------------ pods

    def new_pod(self, s: int, standby: bool = False, replacement: bool = False, home: bool = False) -> Pod:
        """A pod of service `s` (of its standby Deployment if `standby`, of its on-prem return bridge if `home`),
        filed as pending but not yet placed; `replacement` when it replaces a replica taken away rather than
        adding one the HPA asked for."""
        svc = self.services[s]
        pid = self.next_pod
        self.next_pod += 1
        extra = standby or home
        pod = Pod(pid, s, svc.gpus, self.events.now, standby=standby, replacement=replacement and not extra,
                  home=home)
        self.pods[pid] = pod
        self.avail_dirty = True  # the shortfall's split by cause counts not-ready pods
        if home:
            svc.rt_pending[pid] = None
            self.handover_seq += 1
        elif standby:
            svc.sb_pending[pid] = None
            self.handover_seq += 1
        else:
            svc.pending[pid] = None
            if pod.replacement:
                svc.unready_replacements += 1
            if svc.handover:
                self.handover_seq += 1
        return pod

    def bind_onprem(self, pod: Pod, node: int, z: int, free: int) -> None:
        """Bind `pod` to on-prem `node` of zone `z`, which has `free` GPUs."""
        g = pod.gpus
        buckets = self.buckets[z]
        del buckets[free][node]
        buckets[free - g][node] = None
        self.node_free[node] = free - g
        self.node_pods[node][pod.id] = None
        pod.node = node
        self.onprem_inf_gpus += g
        self.zone_inf[z] += g

    def bind_virtual(self, pod: Pod, v: int) -> None:
        g = pod.gpus
        self.vn_used[v] += g
        self.vn_pods[v][pod.id] = None
        pod.node = -2 - v
        self.ext_gpus += g
        if self.cost_tracking and not pod.standby:  # a standby is external anyway
            self.needing_cost[pod.id] = None
        if pod.standby:
            self.sb_ext_gpus += g
            self.handover_seq += 1

    def start_pod(self, pod: Pod, latency: float) -> None:
        """The kubelet: a bound pod starts and turns Ready after `latency`."""
        svc = self.services[pod.svc]
        pending, starting = ((svc.sb_pending, svc.sb_starting) if pod.standby else
                             (svc.rt_pending, svc.rt_starting) if pod.home else (svc.pending, svc.starting))
        if pod.state == PENDING and pod.id in pending:
            del pending[pod.id]
        pod.state = STARTING
        starting[pod.id] = None
        if pod.node >= 0 and not (pod.standby or pod.home):
            svc.start_zone[self.node_zone[pod.node]] += 1
        if latency <= 0:
            self.pod_ready(pod.id)
        else:
            self.events.push(self.events.now + latency, POD_READY, pod.id)

    def pod_ready(self, pid: int) -> None:
        pod = self.pods.get(pid)
        if pod is None or pod.state != STARTING:
            return
        svc = self.services[pod.svc]
        pod.state = READY
        self.avail_dirty = True
        if pod.standby or pod.home:
            starting, ready = (svc.sb_starting, svc.sb_ready) if pod.standby else (svc.rt_starting, svc.rt_ready)
            del starting[pid]
            ready[pid] = None
            self.handover_seq += 1
            return
        del svc.starting[pid]
        svc.ready[pid] = None
        if pod.replacement:
            svc.unready_replacements -= 1
        if pod.node <= -2:
            svc.ready_ext += 1
        else:
            svc.start_zone[self.node_zone[pod.node]] -= 1
            svc.ready_zone[self.node_zone[pod.node]] += 1
        if svc.handover:
            self.handover_seq += 1

    def remove_pod(self, pod: Pod) -> None:
        """Delete a pod wherever it is: unfile it, free its GPUs, and note a surge's return when the last
        external GPU comes free."""
        svc = self.services[pod.svc]
        pid = pod.id
        node = pod.node
        g = pod.gpus
        del self.pods[pid]
        if pod.state != READY:
            self.avail_dirty = True
            if pod.replacement:
                svc.unready_replacements -= 1
        if pod.standby or svc.handover:
            self.handover_seq += 1
        if pod.home:
            if pod.state == PENDING:
                del svc.rt_pending[pid]
                self.rt_pending.pop(pid, None)
            elif pod.state == STARTING:
                del svc.rt_starting[pid]
            else:
                del svc.rt_ready[pid]
                self.avail_dirty = True
        elif pod.standby:
            if pod.state == PENDING:
                del svc.sb_pending[pid]
                self.sb_pending.pop(pid, None)
            elif pod.state == STARTING:
                del svc.sb_starting[pid]
            else:
                del svc.sb_ready[pid]
                self.avail_dirty = True
            if node <= -2:
                self.sb_ext_gpus -= g
        elif pod.state == PENDING:
            del svc.pending[pid]
            if pid in self.pending:
                del self.pending[pid]
                self.pending_inf_gpus -= pod.gpus
        elif pod.state == STARTING:
            del svc.starting[pid]
            if node >= 0:
                svc.start_zone[self.node_zone[node]] -= 1
        else:
            del svc.ready[pid]
            self.avail_dirty = True
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
                self.capacity_changed = True
        elif node <= -2:
            v = -2 - node
            del self.vn_pods[v][pid]
            self.vn_used[v] -= g
            self.ext_gpus -= g
            self.needing_cost.pop(pid, None)
            self.capacity_changed = True
            if self.ext_gpus == 0 and self.surge_closed_at is not None:
                now = self.events.now
                if now >= self.events.warmup:
                    self.counters.returns.append(now - self.surge_closed_at)
                self.surge_closed_at = None

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
        running = sum(len(job.nodes) * self.zone_gpn[job.zone] for job in self.jobs.values())
        assert running == self.train_gpus
        assert self.train_gpus + self.onprem_inf_gpus <= self.capacity
        assert sum(self.zone_avail) == sum(1 for j in self.node_job if j < 0)
        for v in range(len(self.vn_name)):
            used = sum(self.pods[p].gpus for p in self.vn_pods[v])
            assert used == self.vn_used[v]
            assert self.vn_used[v] + self.vn_warm_gpus[v] <= self.vn_cap[v]
            assert len(self.vn_pods[v]) + len(self.vn_warm[v]) <= self.vn_podcap[v]
            assert self.vn_warm_gpus[v] == sum(self.services[self.warm[w][0]].gpus for w in self.vn_warm[v])
        assert sum(self.vn_warm_gpus) == self.warm_gpus
        assert sum(len(ids) for ids in self.vn_warm) == len(self.warm)
        assert all(self.warm[w][1] == v for v, ids in enumerate(self.vn_warm) for w in ids), "placeholder misfiled"
        for svc in self.services:
            assert svc.warm_count <= svc.warm_target, f"{svc.name}: {svc.warm_count} placeholders > {svc.warm_target}"
            assert svc.handover or not svc.warm_target, f"{svc.name}: a warm pool without the handover"
        assert all(self.warm[w][2] and self.warm[w][:2] == [s, v] for (s, v), ids in self.warm_ready.items()
                   for w in ids)
        assert sum(len(ids) for ids in self.warm_ready.values()) == sum(1 for e in self.warm.values() if e[2])
        assert all(svc.warm_count == sum(1 for e in self.warm.values() if e[0] == s)
                   for s, svc in enumerate(self.services))
        assert sum(self.vn_used) == self.ext_gpus
        seen = 0
        for s, svc in enumerate(self.services):
            seen += svc.count() + svc.sb_count() + svc.rt_count()
            assert svc.rt_count() == svc.rt_replicas, f"{svc.name}: {svc.rt_count()} bridge for {svc.rt_replicas}"
            assert svc.handover or not svc.rt_replicas, f"{svc.name}: a return bridge without the handover"
            for state, group in enumerate((svc.rt_pending, svc.rt_starting, svc.rt_ready)):
                for pid in group:
                    pod = self.pods[pid]
                    assert (pod.svc, pod.home, pod.standby, pod.state) == (s, True, False, state), \
                        f"bridge pod {pid} misfiled"
                    assert (pod.node == -1) == (state == PENDING), f"bridge pod {pid}: placement and state disagree"
                    assert pod.node == -1 or pod.node >= 0, f"bridge pod {pid} on a virtual node"
            assert svc.count() == svc.replicas, f"{svc.name}: {svc.count()} pods for {svc.replicas} replicas"
            assert svc.sb_count() == svc.sb_replicas, f"{svc.name}: {svc.sb_count()} standby for {svc.sb_replicas}"
            assert svc.handover or not svc.sb_replicas, f"{svc.name}: a standby without the handover"
            for role, groups in ((False, (svc.pending, svc.starting, svc.ready)),
                                 (True, (svc.sb_pending, svc.sb_starting, svc.sb_ready))):
                for state, group in enumerate(groups):
                    for pid in group:
                        pod = self.pods[pid]
                        assert (pod.svc, pod.standby, pod.home, pod.state) == (s, role, False, state), \
                            f"pod {pid} misfiled"
                        assert (pod.node == -1) == (state == PENDING), f"pod {pid}: placement and state disagree"
                        assert not (role and pod.node >= 0), f"standby pod {pid} on-prem"
            assert svc.unready_replacements == sum(1 for g in (svc.pending, svc.starting) for p in g
                                                   if self.pods[p].replacement)
            # The counts the core reads, kept incrementally, against a recount.
            ready = [self.pods[p] for p in svc.ready]
            assert svc.ready_ext == sum(1 for p in ready if p.node <= -2)
            assert svc.ready_zone == [sum(1 for p in ready if p.node >= 0 and self.node_zone[p.node] == z)
                                      for z in self.zones]
            starting = [self.pods[p] for p in svc.starting]
            assert svc.start_zone == [sum(1 for p in starting if p.node >= 0 and self.node_zone[p.node] == z)
                                      for z in self.zones]
        assert seen == len(self.pods)
        placed = sum(len(p) for p in self.node_pods) + sum(len(p) for p in self.vn_pods)
        assert placed + len(self.pending) + len(self.sb_pending) + len(self.rt_pending) == len(self.pods)
        assert all(self.pods[p].home and self.pods[p].node == -1 for p in self.rt_pending)
        assert set(self.rt_pending) == {p for svc in self.services for p in svc.rt_pending}
        assert sum(self.pods[p].gpus for p in self.pending) == self.pending_inf_gpus
        assert all(not self.pods[p].standby for p in self.pending)
        assert all(self.pods[p].standby and self.pods[p].node == -1 for p in self.sb_pending)
        assert self.sb_ext_gpus == sum(self.pods[p].gpus for v in self.vn_pods for p in v if self.pods[p].standby)
        assert set(self.needing_cost) <= {p for v in self.vn_pods for p in v}
        queued = sum(self.gangs[i].nodes * self.zone_gpn[z] for z, q in self.queue.items() for i in q)
        assert queued == self.pending_train_gpus
        assert self.train_gpus + self.pending_train_gpus <= self.train_capacity or not self.model.enqueue_gate
        for z in self.zones:
            assert self.zone_train[z] == sum(len(job.nodes) * self.zone_gpn[z] for job in self.jobs.values()
                                             if job.zone == z)
            assert self.zone_inf[z] == sum(self.pods[p].gpus for i in range(len(self.node_zone))
                                           if self.node_zone[i] == z for p in self.node_pods[i])
            assert self.zone_pend[z] == sum(self.gangs[i].nodes * self.zone_gpn[z] for i in self.queue[z])
            if self.model.queue_per_pool and self.model.enqueue_gate:
                assert self.zone_train[z] + self.zone_pend[z] <= self.zone_nodes[z] * self.zone_gpn[z]
        inqueue = {i for q in self.queue.values() for i in q}
        assert not set(self.waiting) & inqueue
        assert self.waiting_train_gpus == sum(self.gangs[i].nodes * self.zone_gpn[self.train_zone[self.gangs[i].pool]]
                                              for i in self.waiting)
        assert set(self.gated) <= inqueue, "a gated gang that is not Inqueue"
        assert self.handover or not self.gated, "gangs gated without the handover"
