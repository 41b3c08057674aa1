"""The ReplicaSet controller: keep each service's pods (and its standby Deployment's) at the count asked for.

New pods go to the scheduler at once (`place`): the simulated control plane has no lag between a ReplicaSet
creating a pod and the scheduler trying to bind it, and keeping that order keeps runs reproducible.
"""

from __future__ import annotations

from collections.abc import Callable

from bench.sim.cluster import ClusterState
from bench.sim.objects import Pod, Service


class ReplicaSets:
    """Scale a service to `Service.replicas` and its standby to `Service.sb_replicas`."""

    def __init__(self, cluster: ClusterState, place: Callable[[Pod], bool]) -> None:
        self.cluster = cluster
        self.place = place

    def create_pod(self, s: int, replacement: bool = False) -> None:
        c = self.cluster
        pod = c.new_pod(s, replacement=replacement)
        if not self.place(pod):
            c.pending[pod.id] = None
            c.pending_inf_gpus += pod.gpus

    def create_standby(self, s: int) -> None:
        c = self.cluster
        pod = c.new_pod(s, standby=True)
        if not self.place(pod):
            c.sb_pending[pod.id] = None

    def reconcile(self, s: int, replacement: bool = False) -> None:
        """Create or delete pods until the service has `replicas` of them (`replacement`: the new ones replace
        pods taken away, rather than scaling up)."""
        svc = self.cluster.services[s]
        diff = svc.replicas - svc.count()
        for _ in range(diff):
            self.create_pod(s, replacement)
        if diff < 0:
            for pod in self.deletion_order(svc, -diff):
                self.cluster.remove_pod(pod)

    def reconcile_standby(self, s: int) -> None:
        """Scale the standby to `sb_replicas`, deleting unplaced, then not ready, newest first (standby pods all
        sit on virtual nodes with the same deletion cost: that is the whole ranking)."""
        c = self.cluster
        svc = c.services[s]
        diff = svc.sb_replicas - svc.sb_count()
        for _ in range(diff):
            self.create_standby(s)
        for group in (svc.sb_pending, svc.sb_starting, svc.sb_ready):
            for pid in reversed(list(group)):
                if diff >= 0:
                    return
                c.remove_pod(c.pods[pid])
                diff += 1

    def reconcile_return(self, s: int) -> None:
        """Scale the on-prem return bridge to `rt_replicas`: new pods go on-prem or wait unplaced; down removes
        unplaced, then not ready, newest first (all on-prem, no deletion cost: that is the ranking)."""
        c = self.cluster
        svc = c.services[s]
        diff = svc.rt_replicas - svc.rt_count()
        for _ in range(diff):
            pod = c.new_pod(s, home=True)
            if not self.place(pod):
                c.rt_pending[pod.id] = None
        for group in (svc.rt_pending, svc.rt_starting, svc.rt_ready):
            for pid in reversed(list(group)):
                if diff >= 0:
                    return
                c.remove_pod(c.pods[pid])
                diff += 1

    def reconcile_warm(self, s: int, latency: float) -> None:
        """The warm pool's Deployment: placeholders up to `warm_target` wherever an open virtual node has
        room beside the replicas (cheapest provider first, where the service's replicas land first; they do
        not tolerate the burst taint); fewer are placed when none has room (the rest wait Pending, which the
        controller's view does not count as pending inference). Down: not yet warm first, then the dearest
        provider's."""
        c = self.cluster
        svc = c.services[s]
        diff = svc.warm_target - svc.warm_count
        if diff > 0:
            for v in c.vn_order:
                while diff > 0 and c.vn_taint[v] is None and c.room_virtual(v, svc.gpus):
                    c.add_warm(s, v, latency)
                    diff -= 1
                if not diff:
                    break
        elif diff < 0:
            mine = [w for w, e in c.warm.items() if e[0] == s]
            rank = {v: i for i, v in enumerate(c.vn_order)}
            mine.sort(key=lambda w: (c.warm[w][2], -rank[c.warm[w][1]], -w))
            for w in mine[:-diff]:
                c.remove_warm(w)

    def deletion_order(self, svc: Service, n: int) -> list[Pod]:
        """Upstream ReplicaSet ranking, reduced to what differs here: unplaced, not ready, cost, newest."""
        out: list[Pod] = []
        pods = self.cluster.pods
        for group in (svc.pending, svc.starting):
            for pid in reversed(list(group)):
                if len(out) == n:
                    return out
                out.append(pods[pid])
        # Lower pod-deletion-cost first (the dearest provider's replicas, then other external ones), newest first
        # among equals (a stable sort of the newest-first list).
        ready = sorted((pods[pid] for pid in reversed(list(svc.ready))), key=_deletion_cost)
        return out + ready[: n - len(out)]


def _deletion_cost(pod: Pod) -> int:
    return pod.cost
