"""The scheduler model: Volcano for training gangs (enqueue, then allocate whole nodes, preempting inference) and
the default scheduler's best fit for inference pods (on-prem first, then the first open virtual node).

- A training gang takes whole nodes of one pool, all at once (gang admission), choosing empty nodes first and
  then the nodes with the fewest inference GPUs, whose inference pods it deletes outright (a batch
  scheduler's preemption does not wait for PDBs). Gangs pass Volcano's enqueue (pods exist only once the
  queue has room for them) and allocate (in arrival order, smaller gangs backfilling past larger ones). The
  enqueue room is cluster-wide with one training queue, per pool with one queue per pool
  (`ClusterModel.queue_per_pool`).
- In a pool with a fabric (`ClusterModel.topology_mode` set), a gang takes the nodes `topology.place_gang` picks:
  one leaf when it fits one, else the fewest leaves under one spine; in hard mode it stays pending until such
  room exists (smaller gangs backfill past it).
- Inference pods are bin-packed (best fit) onto nodes without training; when none fits they go to the first
  virtual node, cheapest provider first (`components.provider_rank`: the pods' preferred affinity), that is
  open (our taint absent) and has GPU and pod room, else they stay pending
  (unschedulable). A standby pod goes only to virtual nodes, whatever our taint says (it tolerates it).
"""

from __future__ import annotations

from bench.sim.cluster import ClusterState
from bench.sim.objects import ARRIVAL, JOB_END, Job, Pod
from bench.sim.replicasets import ReplicaSets
from bench.sim.topology import GangPlacement, leaves_spanned, zone_fabrics
from bench.sim.workload import Gang


class Scheduler:
    """One scheduler pass per event (`run_pass`), plus the gang events: arrival (which schedules the next
    arrival) and end."""

    def __init__(self, cluster: ClusterState, onprem_latency_s: float, external_latency_s: float,
                 warm_latency_s: float | None = None) -> None:
        self.cluster = cluster
        self.events = cluster.events
        self.onprem_lat = onprem_latency_s
        self.external_lat = external_latency_s
        self.warm_lat = external_latency_s if warm_latency_s is None else warm_latency_s
        self.replicasets = ReplicaSets(cluster, self.place)
        self.fabrics = zone_fabrics(cluster)
        self.topology_mode = cluster.model.topology_mode

    def run_pass(self) -> None:
        """Gangs first (training outranks inference), then unplaced inference pods."""
        c = self.cluster
        if c.admit_dirty:
            c.admit_dirty = False
            if c.pending_train_gpus or c.waiting:
                self.admit()
        if c.capacity_changed:
            c.capacity_changed = False
            self.retry_pending()
            if c.warm or any(svc.warm_target for svc in c.services):
                c.warm_dirty = True
        if c.warm_dirty:
            for s in range(len(c.services)):
                self.replicasets.reconcile_warm(s, self.external_lat)
            c.warm_dirty = False  # what is still short waits for room (a capacity change retries it)

    # ------------------------------------------------------------------ training

    def arrival(self, index: int) -> None:
        c = self.cluster
        gang = c.gangs[index]
        z = c.train_zone.get(gang.pool)
        if z is None or c.zone_nodes[z] == 0 or gang.nodes <= 0:
            c.counters.gangs_rejected += 1  # no such pool (trace) or a pool wholly reserved for inference
        else:
            nodes = min(gang.nodes, c.zone_nodes[z])  # a gang larger than its pool waits forever: cap it
            if nodes != gang.nodes:
                c.gangs[index] = Gang(gang.arrival_s, nodes, gang.duration_s, gang.pool)
            c.waiting[index] = self.events.now
            c.waiting_train_gpus += nodes * c.zone_gpn[z]
            c.admit_dirty = True
        if index + 1 < len(c.gangs):
            self.events.push(c.gangs[index + 1].arrival_s, ARRIVAL, index + 1)

    def admit(self) -> None:
        """Volcano's enqueue then allocate, as the stack configures them (priority, gang, proportion).

        enqueue: a gang becomes Inqueue — and only then does the job controller create its pods — while the
        training queue's allocated plus Inqueue GPUs stay within the queue's real capability (all on-prem
        GPUs training may use); a gang that does not fit is passed over, not waited for. allocate: an Inqueue
        gang starts when its pool has enough nodes without training (inference on them is preempted).
        Only Inqueue gangs have (unschedulable) pods, so only they count as pending training GPUs. With the
        handover on, an Inqueue gang's pods carry the gate: allocate passes it over until the core lifts it.
        """
        c = self.cluster
        if c.waiting:
            per_pool = c.model.queue_per_pool
            # Room per training queue: key -1 is the one queue over every pool, else the pool's zone.
            rooms: dict[int, int] = (
                {z: c.zone_nodes[z] * c.zone_gpn[z] - c.zone_train[z] - c.zone_pend[z]
                 for z in c.train_zone.values()}
                if per_pool else {-1: c.train_capacity - c.train_gpus - c.pending_train_gpus}
            )
            if not c.model.enqueue_gate:
                rooms = dict.fromkeys(rooms, 1 << 60)  # every gang Inqueue on arrival: pending at once
            for index in list(c.waiting):
                if max(rooms.values()) < c.min_gpn:
                    break
                gang = c.gangs[index]
                z = c.train_zone[gang.pool]
                key = z if per_pool else -1
                gpus = gang.nodes * c.zone_gpn[z]
                if gpus <= rooms[key]:
                    c.queue[z][index] = c.waiting.pop(index)
                    c.waiting_train_gpus -= gpus
                    c.pending_train_gpus += gpus
                    c.zone_pend[z] += gpus
                    rooms[key] -= gpus
                    if c.handover:
                        c.gated[index] = None  # the pods are created behind the handover gate
                        c.handover_seq += 1
        gated = c.gated
        mode = self.topology_mode
        for z, queue in c.queue.items():
            if not queue or c.zone_avail[z] == 0:
                continue
            fabric = self.fabrics.get(z) if mode is not None else None
            for index in list(queue):
                gang = c.gangs[index]
                if gang.nodes > c.zone_avail[z] or index in gated:
                    continue
                placed = None
                if fabric is not None and mode is not None:
                    placed = fabric.place(c.buckets[z], gang.nodes, mode)
                    if placed is None:
                        continue  # hard: pending until one switch of its tier has room
                arrived = queue.pop(index)
                self.start_gang(index, gang, z, arrived, placed)
                if c.zone_avail[z] == 0:
                    break

    def start_gang(self, index: int, gang: Gang, z: int, arrived: float, placed: list[int] | None = None) -> None:
        """Start a gang on `placed` (the fabric's choice) or, in a flat pool, on the emptiest nodes."""
        c = self.cluster
        assert index not in c.gated
        gpn = c.zone_gpn[z]
        buckets = c.buckets[z]
        chosen: list[int] = []
        if placed is None:
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
        else:
            for node in placed:
                del buckets[c.node_free[node]][node]
            chosen = placed
        c.zone_avail[z] -= gang.nodes
        now = self.events.now
        measuring = now >= self.events.warmup
        hit: set[int] = set()
        for node in chosen:
            c.node_job[node] = index
            for pid in list(c.node_pods[node]):
                pod = c.pods[pid]
                hit.add(pod.svc)
                c.remove_pod(pod)
                if measuring:
                    c.counters.preemptions += 1
            c.node_free[node] = 0
        c.train_gpus += gang.nodes * gpn
        c.pending_train_gpus -= gang.nodes * gpn
        c.zone_train[z] += gang.nodes * gpn
        c.zone_pend[z] -= gang.nodes * gpn
        c.jobs[index] = Job(z, chosen)
        if measuring:
            c.counters.gang_waits.append(now - arrived)
            fabric = self.fabrics.get(z)
            if fabric is not None:
                c.counters.gang_placements.append(GangPlacement(
                    gang.nodes, leaves_spanned(chosen, fabric.leaf_of), fabric.fewest(gang.nodes), now - arrived))
        self.events.push(now + gang.duration_s, JOB_END, index)
        for s in sorted(hit):
            self.replicasets.reconcile(s, replacement=True)  # the ReplicaSets replace what the gang deleted
            if c.services[s].rt_replicas:
                self.replicasets.reconcile_return(s)  # and the bridge's Deployment its own

    def job_end(self, index: int) -> None:
        c = self.cluster
        z, nodes = c.jobs.pop(index)
        gpn = c.zone_gpn[z]
        for node in nodes:
            c.node_job[node] = -1
            c.node_free[node] = gpn
            c.buckets[z][gpn][node] = None
        c.zone_avail[z] += len(nodes)
        c.train_gpus -= len(nodes) * gpn
        c.zone_train[z] -= len(nodes) * gpn
        c.capacity_changed = True
        c.admit_dirty = True

    def stranded_gpus(self) -> tuple[int, int]:
        """(free GPUs on partly used leaves, free GPUs) over the training zones of pools with a fabric."""
        stranded = free = 0
        for fabric in self.fabrics.values():
            s, f = fabric.stranded(self.cluster.node_free)
            stranded += s
            free += f
        return stranded, free

    # ------------------------------------------------------------------ inference pods

    def place(self, pod: Pod) -> bool:
        """Bind `pod` and start it; False when nothing has room (it stays unplaced)."""
        c = self.cluster
        if pod.standby:
            return self.place_virtual(pod, any_taint=True)
        g = pod.gpus
        buckets = c.buckets
        for f in range(g, c.max_gpn + 1):
            for z in c.inf_zones:
                if f >= len(buckets[z]):
                    continue
                b = buckets[z][f]
                if b:
                    c.bind_onprem(pod, next(iter(b)), z, f)
                    c.start_pod(pod, self.onprem_lat)
                    return True
        if pod.home:
            return False  # the return bridge is pinned on-prem (required affinity): it waits for room
        return self.place_virtual(pod, any_taint=False)

    def place_virtual(self, pod: Pod, any_taint: bool) -> bool:
        """The first virtual node in fill order (cheapest provider first) with GPU and pod room that is open (or
        any, for a pod tolerating our taint)."""
        c = self.cluster
        g = pod.gpus
        if c.warm_ready:  # a warm placeholder of the pod's own service: the replica takes its instance over
            for v in c.vn_order:
                if (any_taint or c.vn_taint[v] is None) and c.take_warm(pod.svc, v):
                    c.bind_virtual(pod, v)
                    c.start_pod(pod, self.warm_lat)
                    return True
        for v in c.vn_order:
            if (any_taint or c.vn_taint[v] is None) and c.vn_used[v] + g <= c.vn_cap[v] \
                    and len(c.vn_pods[v]) < c.vn_podcap[v]:
                if c.vn_warm[v]:
                    c.make_room(v, g)  # placeholders have the lowest priority: any replica preempts them
                c.bind_virtual(pod, v)
                c.start_pod(pod, self.external_lat)
                return True
        return False

    def retry_pending(self) -> None:
        c = self.cluster
        if not c.pending and not c.sb_pending and not c.rt_pending:
            return
        failed_at = 1 << 30
        for pid in list(c.pending):
            pod = c.pods[pid]
            if pod.gpus >= failed_at:
                continue
            if self.place(pod):
                del c.pending[pid]
                c.pending_inf_gpus -= pod.gpus
            else:
                failed_at = pod.gpus
        failed_at = 1 << 30  # bridge pods: on-prem only, after the replicas (the same priority, created later)
        for pid in list(c.rt_pending):
            pod = c.pods[pid]
            if pod.gpus >= failed_at:
                continue
            if self.place(pod):
                del c.rt_pending[pid]
            else:
                failed_at = pod.gpus
        failed_at = 1 << 30  # standby pods have their own placement (any virtual node): own cut-off
        for pid in list(c.sb_pending):
            pod = c.pods[pid]
            if pod.gpus >= failed_at:
                continue
            if self.place(pod):
                del c.sb_pending[pid]
            else:
                failed_at = pod.gpus
