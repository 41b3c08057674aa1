"""The controller port: what the burst controller's adapter reads from the simulated cluster and the actions it
applies there (`controller_adapter.ClusterPort`).

The reads are O(zones), O(services × zones) or O(virtual nodes) from counts the models keep as pods change,
never a scan of the pods. Rows are named tuples: the adapter unpacks them as the plain tuples its port
protocol spells, and everything else reads them by field name.
"""

from __future__ import annotations

from typing import NamedTuple

from bench.sim.cluster import ClusterState
from bench.sim.controller_adapter import Mode, ServiceRow
from bench.sim.objects import INFERENCE_NAMESPACE, READY, TRAINING_NAMESPACE, Counters
from bench.sim.replicasets import ReplicaSets


class PoolCounts(NamedTuple):
    """One pool: free on-prem GPUs, and GPUs of Inqueue gangs waiting for it."""

    free: int
    pending: int


class PoolShape(NamedTuple):
    """One pool node by node: free GPUs on a node -> nodes without training with that many, and GPUs per
    waiting gang pod -> pods."""

    free_nodes: dict[int, int]
    unplaced_pods: dict[int, int]


class ServiceCounts(NamedTuple):
    """One handover service as the core sees it (`decide.ServiceReplicas`, field for field)."""

    min_replicas: int
    main_live: int
    main_ready: int
    main_ready_external: int
    main_ready_onprem: dict[str, int]  # ready main pods per on-prem pool
    main_starting_onprem: dict[str, int]  # main pods starting on an on-prem pool's nodes
    standby_live: int
    standby_ready: int
    standby_unschedulable: int
    gpus_per_replica: int
    warm_live: int
    return_live: int
    return_ready: int
    return_pending: int


class VirtualNodeRow(NamedTuple):
    name: str
    provider: str
    taint_effect: str | None
    gpus_in_use: int
    changed_at: float | None


class PodName(NamedTuple):
    namespace: str
    name: str


# The adapter's protocol spells rows as plain tuples in dicts and lists (both invariant), so the signatures
# below use its spelling; the values are the named tuples above.
_PoolRow = tuple[int, int]
_ShapeRow = tuple[dict[int, int], dict[int, int]]
_NodeRow = tuple[str, str, str | None, int, float | None]


class ControllerPort:
    """The simulated cluster behind `controller_adapter.ClusterPort`."""

    def __init__(self, cluster: ClusterState, replicasets: ReplicaSets, counters: Counters) -> None:
        self.cluster = cluster
        self.replicasets = replicasets
        self.counters = counters

    # ------------------------------------------------------------------ reads

    def onprem_allocatable_gpus(self) -> int:
        return self.cluster.capacity

    def onprem_free_gpus(self) -> int:
        return self.cluster.onprem_free_gpus()

    def pending_inference_gpus(self) -> int:
        return self.cluster.pending_inf_gpus

    def pending_training_gpus(self) -> int:
        return self.cluster.pending_train_gpus

    def standby_external_gpus(self) -> int:
        return self.cluster.sb_ext_gpus

    def pool_gpus(self) -> dict[str, _PoolRow]:
        """Per pool: free on-prem GPUs and GPUs of Inqueue gangs waiting for it; O(zones)."""
        c = self.cluster
        out: dict[str, _PoolRow] = {}
        for z in c.zones:
            free = c.zone_nodes[z] * c.zone_gpn[z] - c.zone_train[z] - c.zone_inf[z]
            f, p = out.get(c.zone_pool[z], (0, 0))
            out[c.zone_pool[z]] = PoolCounts(f + free, p + c.zone_pend[z])
        return out

    def pool_shapes(self) -> dict[str, _ShapeRow]:
        """Per pool, node by node (`PoolShape`). Gangs here take whole nodes, so each Inqueue gang is `nodes`
        pods of the zone's GPUs per node. O(zones × GPUs per node)."""
        c = self.cluster
        out: dict[str, _ShapeRow] = {}
        for z in c.zones:
            free_nodes, pods = out.setdefault(c.zone_pool[z], PoolShape({}, {}))
            for f, nodes in enumerate(c.buckets[z]):
                if f and nodes:
                    free_nodes[f] = free_nodes.get(f, 0) + len(nodes)
            gpn = c.zone_gpn[z]
            if c.zone_pend[z]:
                pods[gpn] = pods.get(gpn, 0) + c.zone_pend[z] // gpn
        return out

    def quiet_key(self) -> tuple[object, ...]:
        """Everything the core's input depends on, cheaply: equal keys mean equal snapshots (but the clock).

        While training waits under the handover, where the free GPUs are (node by node) matters too.
        """
        c = self.cluster
        shapes: tuple[object, ...] = ()
        if c.handover and c.pending_train_gpus:
            shapes = tuple(tuple(len(b) for b in c.buckets[z]) for z in c.zones if c.zone_pend[z])
        return (c.train_gpus + c.onprem_inf_gpus, c.pending_inf_gpus, c.pending_train_gpus,
                tuple(c.vn_used), tuple(c.vn_taint), tuple(c.vn_changed), len(c.needing_cost),
                tuple(c.zone_train), tuple(c.zone_inf), tuple(c.zone_pend), c.handover_seq, shapes)

    def _per_pool(self, per_zone: list[int]) -> dict[str, int]:
        """Counts per on-prem zone summed per pool, sparse (pools with none left out)."""
        out: dict[str, int] = {}
        for z, n in enumerate(per_zone):
            if n:
                pool = self.cluster.zone_pool[z]
                out[pool] = out.get(pool, 0) + n
        return out

    def service_replicas(self) -> dict[str, ServiceRow]:
        """Per handover service, its `ServiceCounts`; O(services × zones) from the kept counts.

        minReplicas is the simulated service's own (the stack derives its handover services from the same
        field), so a model scaled to another size keeps the standby's cap and the HPA's floor equal.
        """
        c = self.cluster
        out: dict[str, ServiceRow] = {}
        for svc in c.services:
            if not svc.handover:
                continue
            onprem, starting = self._per_pool(svc.ready_zone), self._per_pool(svc.start_zone)
            out[svc.name] = ServiceCounts(
                min_replicas=svc.min, main_live=svc.count(), main_ready=len(svc.ready),
                main_ready_external=svc.ready_ext, main_ready_onprem=onprem, main_starting_onprem=starting,
                standby_live=svc.sb_count(),
                standby_ready=len(svc.sb_ready), standby_unschedulable=len(svc.sb_pending),
                gpus_per_replica=svc.gpus,
                # The warm Deployment's pods in any state: placed ones, and those its ReplicaSet recreated after
                # a preemption that wait (Pending) for room; scaling down removes them at once.
                warm_live=svc.warm_target,
                return_live=svc.rt_count(), return_ready=len(svc.rt_ready), return_pending=len(svc.rt_pending),
            )
        return out

    def external_replicas(self) -> dict[str, list[tuple[str, str]]]:
        """Per handover service with ready main pods on virtual nodes: those pods, lowest deletion cost first
        (the dearest provider's), newest first among equals, as the view ranks them. O(ready pods)."""
        c = self.cluster
        out: dict[str, list[tuple[str, str]]] = {}
        for svc in c.services:
            if not svc.handover or not svc.ready_ext:
                continue
            pods = [c.pods[pid] for pid in reversed(list(svc.ready))]
            ext = sorted((p for p in pods if p.node <= -2), key=lambda p: p.cost)
            out[svc.name] = [PodName(INFERENCE_NAMESPACE, f"p{p.id}") for p in ext]
        return out

    def gated_pods(self) -> list[tuple[str, str]]:
        """One pod reference per gated gang (the core releases them all at once anyway)."""
        return [PodName(TRAINING_NAMESPACE, f"gang-{index}") for index in self.cluster.gated]

    def virtual_nodes(self) -> list[_NodeRow]:
        c = self.cluster
        return [
            VirtualNodeRow(c.vn_name[v], c.vn_provider[v], c.vn_taint[v], c.vn_used[v], c.vn_changed[v])
            for v in range(len(c.vn_name))
        ]

    def pods_needing_cost(self, limit: int) -> list[tuple[str, str, str]]:
        """External replicas without their deletion cost yet: namespace, name and their node's provider."""
        c = self.cluster
        out: list[tuple[str, str, str]] = []
        for pid in c.needing_cost:
            if len(out) >= limit:
                break
            out.append((INFERENCE_NAMESPACE, f"p{pid}", c.vn_provider[-2 - c.pods[pid].node]))
        return out

    # ------------------------------------------------------------------ actions

    def set_taint(self, node: str, effect: str | None, now: float) -> None:
        c = self.cluster
        v = c.vn_index[node]
        c.vn_taint[v] = effect
        c.vn_changed[v] = now
        if now >= c.events.warmup:
            self.counters.node_patches += 1
        if effect is None:
            c.capacity_changed = True

    def set_deletion_cost(self, namespace: str, pod: str, cost: int) -> None:
        pid = int(pod[1:])
        p = self.cluster.pods.get(pid)
        if p is not None:
            p.cost = cost
            self.cluster.needing_cost.pop(pid, None)

    def set_standby(self, service: str, replicas: int) -> None:
        c = self.cluster
        s = c.service_index.get(service)
        if s is None:
            return  # a handover service the model does not run: no standby Deployment to scale
        c.services[s].sb_replicas = replicas
        self.replicasets.reconcile_standby(s)

    def set_warm(self, service: str, replicas: int) -> None:
        """Scale the service's warm-pool placeholder Deployment (placed at the end of the event's pass)."""
        c = self.cluster
        s = c.service_index.get(service)
        if s is None:
            return
        c.services[s].warm_target = replicas
        c.warm_dirty = True

    def set_return(self, service: str, replicas: int) -> None:
        """Scale the service's on-prem return bridge Deployment; its pods are placed at once (on-prem only)."""
        c = self.cluster
        s = c.service_index.get(service)
        if s is None:
            return
        c.services[s].rt_replicas = replicas
        self.replicasets.reconcile_return(s)

    def evict(self, namespace: str, pod: str) -> bool:
        """The Eviction API on an external replica: refused (False) when the pod is gone or the service's PDB
        (maxUnavailable over every pod it selects: main, standby, bridge) does not allow it; else the pod goes
        and its ReplicaSet creates the replacement at once (placed on-prem first)."""
        c = self.cluster
        p = c.pods.get(int(pod[1:]))
        if p is None or p.standby or p.home:
            return False
        svc = c.services[p.svc]
        healthy_after = len(svc.ready) + len(svc.sb_ready) + len(svc.rt_ready) - (1 if p.state == READY else 0)
        if healthy_after < svc.replicas + svc.sb_replicas + svc.rt_replicas - svc.maxunav:
            return False
        s = p.svc
        c.remove_pod(p)
        if c.events.now >= c.events.warmup:
            self.counters.return_evictions += 1
        self.replicasets.reconcile(s, replacement=True)
        return True

    def ungate(self, namespace: str, pod: str) -> None:
        c = self.cluster
        index = int(pod.removeprefix("gang-"))
        if index in c.gated:
            del c.gated[index]
            c.handover_seq += 1
            c.admit_dirty = True  # allocate at the end of this event, as the scheduler would at once

    def on_flip(self, mode: Mode, now: float) -> None:
        """The adapter's flip callback: count flips and surges, and start timing a surge's return."""
        c = self.cluster
        counters = self.counters
        if now >= c.events.warmup:
            counters.flips += 1
        if mode is Mode.CLOSED:
            counters.surges += 1 if now >= c.events.warmup else 0
            c.surge_closed_at = now if c.ext_gpus else None
        else:
            c.surge_closed_at = None
