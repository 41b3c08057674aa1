"""The descheduler model: every interval, on virtual nodes that carry our NoSchedule taint, evict pods older than
the minimum age, within the per-node/namespace/total limits, only when the pod fits on-prem (nodeFit) and the
service's PDB (maxUnavailable) allows; the ReplicaSet's replacement is scheduled at once. Standby pods
tolerate our taint, so they are not its to move. With `prefer_onprem` (RemovePodsViolatingNodeAffinity,
preferred mode) it does the same on open virtual nodes too: a pod there violates its preferred on-prem
affinity whenever an on-prem node could take it. The taint plugin runs first, so closed nodes go first.
"""

from __future__ import annotations

from bench.sim.cluster import ClusterState
from bench.sim.model import DeschedulerLimits
from bench.sim.objects import READY
from bench.sim.replicasets import ReplicaSets


class Descheduler:
    """The gradual return: a bounded number of evictions per cycle from closed virtual nodes (and open ones with
    `prefer_onprem`)."""

    def __init__(self, cluster: ClusterState, replicasets: ReplicaSets, limits: DeschedulerLimits) -> None:
        self.cluster = cluster
        self.replicasets = replicasets
        self.limits = limits

    def run(self, t: float) -> None:
        c = self.cluster
        lim = self.limits
        total = min(x for x in (lim.max_total, lim.max_per_namespace, 1 << 30) if x is not None)
        closed = [v for v in range(len(c.vn_name)) if c.vn_taint[v] == "NoSchedule"]
        open_ = [v for v in range(len(c.vn_name)) if c.vn_taint[v] is None] if lim.prefer_onprem else []
        for v in closed + open_:
            if total <= 0:
                break
            per_node = lim.max_per_node if lim.max_per_node is not None else 1 << 30
            for pid in list(c.vn_pods[v]):
                if per_node <= 0 or total <= 0:
                    break
                pod = c.pods.get(pid)
                if pod is None or pod.standby or t - pod.created < lim.min_pod_age_s:
                    continue  # a standby pod tolerates our taint: not the descheduler's to move
                svc = c.services[pod.svc]
                # The PDB selects by service, so standby pods count as healthy and their Deployment's scale
                # as expected pods.
                healthy_after = len(svc.ready) + len(svc.sb_ready) + len(svc.rt_ready) \
                    - (1 if pod.state == READY else 0)
                if healthy_after < svc.replicas + svc.sb_replicas + svc.rt_replicas - svc.maxunav:
                    continue  # PDB: the eviction API refuses
                if not c.fits_onprem(pod.gpus):
                    continue  # nodeFit
                s = pod.svc
                c.remove_pod(pod)
                if t >= c.events.warmup:
                    c.counters.desched_evictions += 1
                per_node -= 1
                total -= 1
                self.replicasets.reconcile(s, replacement=True)
