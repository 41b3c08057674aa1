"""Incremental cluster view: keeps the aggregates `decide` needs, updated in O(1) per watch event.

Objects are the API's own JSON (camelCase dicts, as a list or watch returns them), so the shell never pays
for typed deserialisation of tens of thousands of pods. Every event first removes the old object's
contribution and then adds the new one, so the sums cannot drift however events interleave; a pod that
names a node not seen yet parks its GPUs on a placeholder until the node arrives.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace
from itertools import islice

from agents.burst_controller.contract import (
    GANG_ANNOTATION,
    POD_DELETION_COST_ANNOTATION,
    RETURN_ROLE,
    WARM_ROLE,
    BurstSettings,
)
from agents.burst_controller.objects import (
    MISSING,
    ONPREM,
    TERMINAL_PHASES,
    VIRTUAL,
    GangEntry,
    NodeEntry,
    NodeRecord,
    NodeReplicas,
    Obj,
    PodEntry,
    ServiceCounts,
    add_count,
    name_of,
    parse_timestamp,
    pod_gpus,
    pod_pool,
    read_node,
)
from agents.burst_controller.snapshot import (
    InfeasibleGang,
    NodeRoom,
    PodRef,
    PoolGpus,
    Snapshot,
    VirtualNode,
)


class ClusterView:
    """Aggregates for `decide`, fed by list and watch; `snapshot()` costs O(virtual nodes)."""

    def __init__(self, settings: BurstSettings) -> None:
        self._s = settings
        self._nodes: dict[str, NodeEntry] = {}
        self._pods: dict[str, PodEntry] = {}
        self._virtual: set[str] = set()
        # Pod key -> the pod and the deletion cost its provider's replicas carry, for pods still lacking it.
        self._needing_cost: dict[str, tuple[PodRef, int]] = {}
        self.onprem_allocatable = 0
        self.onprem_free = 0
        self.pending_inference = 0
        self.pending_training = 0
        # Per on-prem pool: free GPUs on its eligible nodes, GPUs of training pods pending for it.
        self._pool_free: dict[str, int] = {}
        self._pool_pending: dict[str, int] = {}
        self._services = {name: ServiceCounts() for name in settings.handover_services}
        self._onprem = NodeReplicas()
        self._gated: dict[str, PodRef] = {}
        self._gated_at: dict[PodRef, float] = {}
        self.standby_external_gpus = 0
        self._unplaced_gpus: dict[str, int] = {}  # training not bound to a node yet, per pool ("" = any)
        # Per pool: free GPUs on a node -> nodes with that many; GPUs per unplaced training pod -> pods.
        self._pool_free_nodes: dict[str, dict[int, int]] = {}
        # Per pool with a topology: free GPUs per leaf switch.
        self._leaf_free: dict[str, dict[str, int]] = {}
        self._unplaced_pods: dict[str, dict[int, int]] = {}
        self._gated_pool: dict[PodRef, str] = {}
        # On-prem nodes carrying the handover's reservation taint -> its value (the pool reserved for).
        self._reserved: dict[str, str] = {}
        # Cluster-wide free GPUs per node (every pool) -> nodes, for training confined to no pool.
        self._free_nodes_all: dict[int, int] = {}
        # Listed on-prem GPU nodes, eligible or not: GPUs per pool and node sizes, for "can this ever fit".
        self._capacity: dict[str, int] = {}
        self._node_sizes: dict[str, dict[int, int]] = {}
        self.onprem_gpu_nodes = 0
        self._gangs: dict[str, GangEntry] = {}
        self.nodes_synced = False
        self.pods_synced = False
        # Freshness per kind: the snapshot is as old as the staler of the two.
        self.observed: dict[str, float | None] = {"nodes": None, "pods": None}

    @classmethod
    def from_lists(
        cls, nodes: Iterable[Obj], pods: Iterable[Obj], settings: BurstSettings, now: float
    ) -> ClusterView:
        """A view from full lists, as at start or after a re-list."""
        view = cls(settings)
        view.replace_nodes(nodes, now)
        view.replace_pods(pods, now)
        return view

    # -- freshness -------------------------------------------------------------------------------

    def mark_fresh(self, now: float, kind: str | None = None) -> None:
        """Record that the API confirmed `kind` (nodes, pods; None: both) as of `now`: an event, a bookmark, a
        list, or a resourceVersion it served."""
        for k in (kind,) if kind is not None else ("nodes", "pods"):
            seen = self.observed[k]
            self.observed[k] = now if seen is None else max(seen, now)

    @property
    def observed_at(self) -> float | None:
        """When the staler of the two kinds was last confirmed (None until both were)."""
        nodes, pods = self.observed["nodes"], self.observed["pods"]
        return None if nodes is None or pods is None else min(nodes, pods)

    def mark_unsynced(self, nodes: bool = True, pods: bool = True) -> None:
        """A watch broke and a re-list is due: the core must not act on what may be missing."""
        if nodes:
            self.nodes_synced = False
        if pods:
            self.pods_synced = False

    # -- nodes -----------------------------------------------------------------------------------

    def replace_nodes(self, nodes: Iterable[Obj], now: float) -> None:
        """Apply a full node list: upsert every item, drop the ones no longer there."""
        seen: set[str] = set()
        for node in nodes:
            seen.add(name_of(node))
            self.apply_node("MODIFIED", node)
        for name in [n for n, rec in self._nodes.items() if rec.kind != MISSING and n not in seen]:
            self.apply_node("DELETED", {"metadata": {"name": name}})
        self.nodes_synced = True
        self.mark_fresh(now, "nodes")

    def apply_node(self, event_type: str, node: Obj) -> None:
        """Apply one watch event (ADDED, MODIFIED, DELETED) for a node."""
        name = name_of(node)
        rec = self._nodes.get(name)
        if rec is None:
            if event_type == "DELETED":
                return
            rec = self._nodes[name] = NodeEntry(name)
        self.onprem_allocatable -= rec.onprem_alloc()
        self._add_free(rec, -rec.onprem_free())
        self._add_capacity(rec, -1)
        was_virtual = rec.kind == VIRTUAL
        provider = rec.provider
        where = (rec.kind, rec.pool)
        if event_type == "DELETED":
            rec.forget()
        else:
            read_node(self._s, rec, node)
        if self._services and where != (rec.kind, rec.pool):
            # Rare (a node appears after its pods, or is relabelled); pods per node are few.
            for key in rec.pods:
                self._count_service(self._pods[key], *where, -1)
                self._count_service(self._pods[key], rec.kind, rec.pool, +1)
        self.onprem_allocatable += rec.onprem_alloc()
        self._add_free(rec, rec.onprem_free())
        self._add_capacity(rec, +1)
        if rec.kind == VIRTUAL:
            self._virtual.add(name)
        else:
            self._virtual.discard(name)
        if rec.reserved is None:
            self._reserved.pop(name, None)
        else:
            self._reserved[name] = rec.reserved
        if was_virtual != (rec.kind == VIRTUAL) or provider != rec.provider:
            for key in rec.pods:  # rare: a node turned virtual, went away or changed provider; pods per node are few
                self._update_cost_need(self._pods[key])
        if rec.kind == MISSING and not rec.pods:
            del self._nodes[name]

    def _add_capacity(self, rec: NodeEntry, sign: int) -> None:
        """Count (sign 1) or uncount (-1) a listed on-prem GPU node, eligible or not."""
        if rec.kind != ONPREM or rec.allocatable <= 0:
            return
        self.onprem_gpu_nodes += sign
        for pool in {rec.pool, ""}:  # "" = every pool, for training confined to none
            add_count(self._capacity, pool, sign * rec.allocatable)
            add_count(self._node_sizes.setdefault(pool, {}), rec.allocatable, sign)

    def node_record(self, name: str) -> NodeRecord | None:
        """Last seen taints and resourceVersion of a node, for an optimistic patch."""
        rec = self._nodes.get(name)
        if rec is None or rec.kind == MISSING:
            return None
        return NodeRecord(name, tuple(rec.taints), rec.resource_version, rec.provider)

    # -- pods ------------------------------------------------------------------------------------

    def replace_pods(self, pods: Iterable[Obj], now: float) -> None:
        """Apply a full pod list: upsert every item, drop the ones no longer there."""
        seen: set[str] = set()
        for pod in pods:
            rec = self._read_pod(pod)
            seen.add(rec.key)
            self._set_pod(rec.key, rec)
        for key in [k for k in self._pods if k not in seen]:
            self._set_pod(key, None)
        self.pods_synced = True
        self.mark_fresh(now, "pods")

    def apply_pod(self, event_type: str, pod: Obj) -> None:
        """Apply one watch event (ADDED, MODIFIED, DELETED) for a pod."""
        rec = self._read_pod(pod)
        self._set_pod(rec.key, None if event_type == "DELETED" else rec)

    def mark_leaving(self, namespace: str, name: str) -> None:
        """A pod we just evicted counts as being deleted until the watch says more (a no-op if unknown)."""
        key = f"{namespace}/{name}"
        old = self._pods.get(key)
        if old is not None and not old.deleting:
            self._set_pod(key, replace(old, deleting=True))

    def _read_pod(self, pod: Obj) -> PodEntry:
        s = self._s
        meta = pod.get("metadata") or {}
        spec = pod.get("spec") or {}
        status = pod.get("status") or {}
        namespace = str(meta.get("namespace", ""))
        name = str(meta.get("name", ""))
        node = str(spec.get("nodeName") or "")
        phase = status.get("phase") or "Pending"
        unschedulable = (
            not node
            and phase == "Pending"
            and any(
                (c.get("type"), c.get("status"), c.get("reason"))
                == ("PodScheduled", "False", "Unschedulable")
                for c in status.get("conditions") or ()
            )
        )
        labels = meta.get("labels") or {}
        workload = str(labels.get(s.workload_label, ""))
        gated = not node and any(
            isinstance(g, dict) and g.get("name") == s.handover_gate for g in spec.get("schedulingGates") or ()
        )
        service = str(labels.get(s.service_label, "")) if workload == "inference" else ""
        gang = ""
        if workload == "training" and not node:
            group = (meta.get("annotations") or {}).get(GANG_ANNOTATION)
            gang = f"{namespace}/{group}" if group else f"{namespace}/{name}"
        return PodEntry(
            key=f"{namespace}/{name}",
            namespace=namespace,
            name=name,
            node=node,
            gpus=pod_gpus(pod, s.gpu_resource),
            workload=workload,
            # Only pending training is netted per pool; other pods skip the affinity walk.
            pool=pod_pool(pod, s.pool_label) if not node and workload == "training" else "",
            live=phase not in TERMINAL_PHASES,
            unschedulable=unschedulable,
            deleting=meta.get("deletionTimestamp") is not None,
            cost=(meta.get("annotations") or {}).get(POD_DELETION_COST_ANNOTATION),
            gated=gated and workload == "training",
            created=parse_timestamp(meta.get("creationTimestamp")) if gated else None,
            service=service if service in self._services else "",
            standby=labels.get(s.role_label) == "standby",
            warm=labels.get(s.role_label) == WARM_ROLE,
            home=labels.get(s.role_label) == RETURN_ROLE,
            ready=phase == "Running"
            and any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or ()),
            gang=gang,
        )

    def _set_pod(self, key: str, new: PodEntry | None) -> None:
        old = self._pods.pop(key, None)
        self._needing_cost.pop(key, None)
        if old is not None:
            self._pod_contribution(old, -1)
        if new is not None:
            self._pods[key] = new
            self._pod_contribution(new, +1)

    def _pod_contribution(self, pod: PodEntry, sign: int) -> None:
        if pod.warm:
            # A placeholder serves nobody and holds no burst open (it waits Pending for room, it leaves at a
            # close): it is its service's warm_live and nothing else, not even a virtual node's GPUs in use.
            if pod.service and pod.live and not pod.deleting:
                self._services[pod.service].warm_live += sign
            return
        if pod.unschedulable and pod.gpus and pod.workload == "inference" and not pod.standby and not pod.home:
            # A standby waiting for room on a virtual node is no reason to open the burst, nor a return bridge
            # pod waiting for on-prem room (it is only ever made while the external replica still serves).
            self.pending_inference += sign * pod.gpus
        elif pod.waiting and pod.workload == "training":
            self.pending_training += sign * pod.gpus
            if pod.pool:
                add_count(self._pool_pending, pod.pool, sign * pod.gpus)
        unplaced = pod.workload == "training" and not pod.node and pod.live and not pod.deleting and pod.gpus > 0
        if unplaced:
            add_count(self._unplaced_gpus, pod.pool, sign * pod.gpus)
            add_count(self._unplaced_pods.setdefault(pod.pool, {}), pod.gpus, sign)
        if pod.gang and (unplaced or (pod.waiting and pod.workload == "training")):
            self._count_gang(pod, unplaced, sign)
        if pod.gated:
            ref = PodRef(pod.namespace, pod.name)
            if sign > 0:
                self._gated[pod.key] = ref
                self._gated_pool[ref] = pod.pool
                if pod.created is not None:
                    self._gated_at[ref] = pod.created
            else:
                self._gated.pop(pod.key, None)
                self._gated_at.pop(ref, None)
                self._gated_pool.pop(ref, None)
        rec = self._nodes.get(pod.node) if pod.node else None
        if pod.service:
            self._count_service(pod, rec.kind if rec else MISSING, rec.pool if rec else "", sign)
        if not pod.node:
            return
        if rec is None:
            rec = self._nodes[pod.node] = NodeEntry(pod.node)
        self._add_free(rec, -rec.onprem_free())
        if sign > 0:
            rec.pods.add(pod.key)
            if pod.live:
                rec.requested += pod.gpus
        else:
            rec.pods.discard(pod.key)
            if pod.live:
                rec.requested -= pod.gpus
        self._add_free(rec, rec.onprem_free())
        if sign > 0:
            self._update_cost_need(pod)
        elif rec.kind == MISSING and not rec.pods:
            del self._nodes[pod.node]

    def _count_gang(self, pod: PodEntry, unplaced: bool, sign: int) -> None:
        """Add (sign 1) or remove (-1) an unplaced training pod's part of its gang's sums."""
        key = f"{pod.gang}|{pod.pool}"
        gang = self._gangs.get(key)
        if gang is None:
            namespace, _, name = pod.gang.partition("/")
            gang = self._gangs[key] = GangEntry(namespace, name, pod.pool)
        if pod.waiting:
            gang.waiting += sign * pod.gpus
        if unplaced:
            gang.unplaced += sign * pod.gpus
            add_count(gang.sizes, pod.gpus, sign)
        ref = PodRef(pod.namespace, pod.name)
        if sign > 0:
            gang.pods.add(ref)
        else:
            gang.pods.discard(ref)
        if not gang.pods:
            del self._gangs[key]

    def _count_service(self, pod: PodEntry, kind: str, pool: str, sign: int) -> None:
        """Add (sign 1) or remove (-1) one pod of a handover service, by role, readiness and location."""
        if not pod.service or not pod.live:
            return
        counts = self._services[pod.service]
        if pod.deleting:
            if not (pod.standby or pod.home):
                counts.main_leaving += sign
                if kind == ONPREM:
                    add_count(self._onprem.leaving, pod.node, sign * pod.gpus)
            return
        if pod.home:
            counts.return_live += sign
            counts.return_ready += sign * pod.ready
            counts.return_pending += sign * (not pod.node)
            return
        if pod.standby:
            if kind == VIRTUAL:
                self.standby_external_gpus += sign * pod.gpus
            counts.standby_live += sign
            counts.standby_ready += sign * pod.ready
            counts.standby_unschedulable += sign * (pod.unschedulable and not pod.node)
            return
        counts.main_live += sign
        add_count(counts.gpus, pod.gpus, sign)
        if kind == ONPREM:
            self._onprem.count(pod.node, pod.key, PodRef(pod.namespace, pod.name), pod.gpus, sign)
        if not pod.ready:
            if kind == ONPREM:
                add_count(counts.main_starting_onprem, pool, sign)
            return
        counts.main_ready += sign
        if kind == VIRTUAL:
            counts.main_ready_external += sign
            if sign > 0:
                rec = self._nodes.get(pod.node)
                cost = self._s.deletion_cost_for(rec.provider) if rec is not None else 0
                counts.external[pod.key] = (PodRef(pod.namespace, pod.name), cost)
            else:
                counts.external.pop(pod.key, None)
        elif kind == ONPREM:
            add_count(counts.main_ready_onprem, pool, sign)

    def _clearable(self, unplaced: Mapping[str, int]) -> dict[str, tuple[NodeRoom, ...]]:
        """Per pool with unplaced training, its eligible nodes holding main replicas; O(nodes with replicas)."""
        pools = {pool for pool, gpus in unplaced.items() if pool and gpus > 0}
        nodes = {n: rec for n in self._onprem.nodes() if (rec := self._nodes.get(n)) and rec.eligible} if pools else {}
        return self._onprem.rooms({n: (rec.pool, rec.onprem_free(), rec.leaf) for n, rec in nodes.items()
                                   if rec.pool in pools})

    def _add_free(self, rec: NodeEntry, gpus: int) -> None:
        """Add a node's free GPUs (negative: remove them) to the cluster total and to its pool's.

        Callers always remove a node's whole free count and add it back after a change, so the pool's
        histogram of free GPUs per node moves the node from one bucket to another.
        """
        if not gpus:
            return
        self.onprem_free += gpus
        add_count(self._free_nodes_all, abs(gpus), 1 if gpus > 0 else -1)
        if rec.pool:
            self._pool_free[rec.pool] = self._pool_free.get(rec.pool, 0) + gpus
            add_count(self._pool_free_nodes.setdefault(rec.pool, {}), abs(gpus), 1 if gpus > 0 else -1)
            if rec.leaf:
                add_count(self._leaf_free.setdefault(rec.pool, {}), rec.leaf, gpus)

    def _update_cost_need(self, pod: PodEntry) -> None:
        rec = self._nodes.get(pod.node)
        on_virtual = rec is not None and rec.kind == VIRTUAL
        # A standby's pods are all external: the cost would order nothing within its ReplicaSet. Pods of other
        # namespaces are not ours to patch (the controller's pod Role is the inference namespace's alone).
        ours = pod.namespace == self._s.inference_namespace
        wanted = self._s.deletion_cost_for(rec.provider) if on_virtual and rec is not None else 0
        if on_virtual and ours and pod.live and not pod.deleting and pod.cost != str(wanted) and not pod.standby:
            self._needing_cost[pod.key] = (PodRef(pod.namespace, pod.name), wanted)
        else:
            self._needing_cost.pop(pod.key, None)

    # -- output ----------------------------------------------------------------------------------

    @property
    def node_count(self) -> int:
        return sum(1 for rec in self._nodes.values() if rec.kind != MISSING)

    @property
    def pod_count(self) -> int:
        return len(self._pods)

    def snapshot(self) -> Snapshot:
        """The aggregates as the core's input; O(virtual nodes + pools + waiting gangs + pods awaiting a cost)."""
        virtual = {
            name: VirtualNode(
                name=name,
                provider=rec.provider,
                taint_effect=rec.taint_effect,
                gpus_in_use=rec.requested,
                changed_at=rec.changed_at,
                provider_taint_missing=rec.provider_taint_missing,
            )
            for name in self._virtual
            for rec in (self._nodes[name],)
        }
        infeasible, hopeless = self._infeasible()
        needing = tuple(islice(self._needing_cost.values(), self._s.max_cost_patches_per_cycle))
        ranked = bool(self._s.provider_deletion_costs)
        pending_training = self.pending_training - sum(g.waiting for g in hopeless)
        pool_pending, unplaced_gpus, unplaced_pods = self._pool_pending, self._unplaced_gpus, self._unplaced_pods
        if hopeless:  # rare: leave the training that can never fit out of every count, on copies
            pool_pending, unplaced_gpus = dict(pool_pending), dict(unplaced_gpus)
            unplaced_pods = {pool: dict(sizes) for pool, sizes in unplaced_pods.items()}
            for gang in hopeless:
                if gang.pool:
                    add_count(pool_pending, gang.pool, -gang.waiting)
                add_count(unplaced_gpus, gang.pool, -gang.unplaced)
                for size, count in gang.sizes.items():
                    add_count(unplaced_pods.setdefault(gang.pool, {}), size, -count)
        return Snapshot(
            synced=self.nodes_synced and self.pods_synced,
            observed_at=self.observed_at,
            onprem_allocatable_gpus=self.onprem_allocatable,
            onprem_free_gpus=self.onprem_free,
            pending_inference_gpus=self.pending_inference,
            pending_training_gpus=pending_training,
            virtual_nodes=virtual,
            pods_needing_cost=tuple(ref for ref, _ in needing),
            deletion_costs={ref: cost for ref, cost in needing} if ranked else {},
            pools=self._pools(pool_pending, unplaced_pods),
            services={name: c.replicas(self._s.handover_services[name]) for name, c in self._services.items()},
            # The dearest provider's first (lowest cost), then by name: a stable order a new leader repeats.
            external_replicas={
                name: tuple(ref for ref, _ in sorted(c.external.values(), key=lambda e: (e[1], e[0].name)))
                for name, c in self._services.items() if c.external
            } if self._s.return_surge_share > 0 else {},
            unplaced_training=dict(unplaced_gpus),
            clearable=self._clearable(unplaced_gpus),
            reserved=dict(self._reserved),
            standby_external_gpus=self.standby_external_gpus,
            gated_pods=tuple(self._gated.values()),
            gated_at=dict(self._gated_at),
            gated_pool=dict(self._gated_pool),
            onprem_gpu_nodes=self.onprem_gpu_nodes,
            # Only needed (and built) while training confined to no pool waits to be placed.
            poolless=PoolGpus(
                free=self.onprem_free,
                free_nodes=dict(self._free_nodes_all),
                unplaced_pods=dict(unplaced_pods[""]),
            ) if unplaced_pods.get("") else None,
            infeasible=infeasible,
        )

    def _infeasible(self) -> tuple[tuple[InfeasibleGang, ...], list[GangEntry]]:
        """Gangs that can never fit: more GPUs than their pool has, or a pod larger than its largest node.

        Judged against every listed on-prem GPU node, eligible or not (a hot node comes back). O(waiting gangs).
        """
        found: list[InfeasibleGang] = []
        hopeless: list[GangEntry] = []
        for gang in self._gangs.values():
            if gang.unplaced <= 0 and gang.waiting <= 0:
                continue
            where = f"pool {gang.pool} has" if gang.pool else "the on-prem pools have"
            capacity = self._capacity.get(gang.pool, 0)
            largest_pod = max(gang.sizes, default=0)
            largest_node = max(self._node_sizes.get(gang.pool) or {0: 0})
            if gang.unplaced > capacity:
                reason = f"gang needs {gang.unplaced} GPUs, {where} {capacity}"
            elif largest_pod > largest_node:
                node = f"the largest node in pool {gang.pool} has" if gang.pool else "the largest on-prem node has"
                reason = f"a pod asks for {largest_pod} GPUs, {node} {largest_node}"
            else:
                continue
            hopeless.append(gang)
            found.append(InfeasibleGang(gang.namespace, gang.name, gang.pool, gang.unplaced, reason,
                                        tuple(sorted(gang.pods, key=lambda r: (r.namespace, r.name)))))
        return tuple(found), hopeless

    def _pools(self, pending: Mapping[str, int], unplaced: Mapping[str, Mapping[int, int]]) -> dict[str, PoolGpus]:
        """Every pool seen on a node or named by pending training; O(pools).

        Training pending for a pool without (free) nodes nets to zero there: it can take no other pool's
        GPUs, so it must not keep the burst open (a pod naming a pool that does not exist never starts).
        """
        free = self._pool_free
        # Pools with nothing free, pending or unplaced add nothing; leaving them out keeps the snapshot the
        # same whichever order events arrived in (a drained pool's entry lingers at zero).
        return {
            pool: PoolGpus(
                free=free.get(pool, 0),
                pending_training=pending.get(pool, 0),
                free_nodes=dict(self._pool_free_nodes.get(pool) or {}),
                unplaced_pods=dict(unplaced.get(pool) or {}),
                free_by_leaf=dict(self._leaf_free.get(pool) or {}),
            )
            for pool in free.keys() | pending.keys() | unplaced.keys()
            if pool and (free.get(pool, 0) or pending.get(pool, 0) or unplaced.get(pool))
        }
