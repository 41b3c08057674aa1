"""The guard's Prometheus series, in a registry of its own, and what a cycle's decision sets them to."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from agents.health_guard.contract import HealthClass, Signal
from agents.health_guard.decide import Decision, NodeStatus, NodeView, Quarantine, Reading, Release, fenced_leaves


class GuardMetrics:
    """The guard's series, in a registry of its own."""

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry(auto_describe=True)
        p = "gpucluster_health_"
        self.leader = Gauge(f"{p}leader", "1 while this replica holds the lease.", registry=r)
        self.events = Counter(f"{p}signal_events", "Signals seen starting to fire, per signal and class.",
                              ["signal", "class"], registry=r)
        self.firing = Gauge(f"{p}signal_firing", "Nodes on which the signal fires now.", ["signal"], registry=r)
        self.unknown = Gauge(f"{p}signal_unknown_nodes", "Nodes the signal cannot judge (stale or missing).",
                             ["signal"], registry=r)
        self.quarantined = Gauge(f"{p}nodes_quarantined", "Nodes carrying the health taint, per class and pool.",
                                 ["class", "pool"], registry=r)
        self.pool_share = Gauge(f"{p}pool_quarantined_ratio", "Share of the pool's nodes quarantined.", ["pool"],
                                registry=r)
        self.node_quarantined = Gauge(f"{p}node_quarantined", "1 while the node is quarantined.",
                                      ["node", "class"], registry=r)
        self.switch_faults = Gauge(
            f"{p}switch_faults", "1 while the leaf switch is at fault: its nodes carry the switch-fault taint (no new "
            "pods; nothing evicted) until it is released.", ["leaf"], registry=r)
        self.nodes = Gauge(f"{p}nodes", "Watched nodes by status.", ["status"], registry=r)
        self.taints = Counter(f"{p}taints_applied", "Health taints applied (escalations included).",
                              ["class", "pool"], registry=r)
        self.releases = Counter(f"{p}releases", "Nodes released.", ["class"], registry=r)
        self.suppressed = Counter(f"{p}suppressed", "Quarantines refused by the rate limit or the breaker.",
                                  ["pool"], registry=r)
        self.breaker = Gauge(f"{p}breaker_tripped", "1 while the rate-limit breaker is tripped (a person resets it).",
                             registry=r)
        self.evictions = Counter(f"{p}evictions", "Eviction attempts by workload and result.",
                                 ["workload", "result"], registry=r)
        self.gang_restarts = Counter(
            f"{p}gang_restarts", "Gang restarts: cause=guard (an eviction from a quarantined node, with the node) or "
            "cause=application (Volcano's retry after a failed pod).", ["namespace", "job", "pool", "node", "cause"],
            registry=r)
        self.between_failures = Histogram(
            f"{p}seconds_between_failures", "Seconds between consecutive quarantines in a pool.", ["pool"],
            buckets=(300, 900, 1800, 3600, 3 * 3600, 6 * 3600, 12 * 3600, 86400, 3 * 86400, 7 * 86400),
            registry=r)
        self.errors = Counter(f"{p}errors", "Failed steps of a cycle.", ["stage"], registry=r)
        self.cycle_phase = Histogram(
            f"{p}cycle_phase_seconds", "Seconds each phase of a cycle took: observe (the Prometheus queries), decide, "
            "act (patches, conditions, events, evictions) and publish.", ["phase"],
            buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 4, 8, 16, 32), registry=r)
        self.query_seconds = Histogram(
            f"{p}query_seconds", "Seconds each Prometheus query of a cycle took, answered or not, per query (a "
            "signal's name, or freshness:<exporter>).", ["query"],
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 4, 8), registry=r)
        self.last_cycle = Gauge(f"{p}last_cycle_timestamp_seconds", "End of the last completed cycle.", registry=r)
        for stage in ("query", "list", "patch", "status", "event", "evict", "lease", "fenced", "cycle"):
            self.errors.labels(stage)
        self.breaker.set(0)

    def publish(self, decision: Decision, views: Mapping[str, NodeView], signals: Sequence[Signal],
                firing_before: set[tuple[str, str]]) -> set[tuple[str, str]]:
        """Set the series from one cycle's decision; ``firing_before`` is the (node, signal) pairs that fired last
        cycle (a pair new this cycle counts one signal event). Returns this cycle's pairs."""
        self.breaker.set(1 if decision.breaker_tripped else 0)
        self.switch_faults.clear()
        for leaf in fenced_leaves(decision):
            self.switch_faults.labels(leaf).set(1)
        counts = dict.fromkeys(NodeStatus, 0)
        for status in decision.status.values():
            counts[status] += 1
        for status, count in counts.items():
            self.nodes.labels(status.value).set(count)
        classes: dict[str, HealthClass] = {v.name: v.quarantined for v in views.values() if v.quarantined is not None}
        for a in decision.actions:
            if isinstance(a, Quarantine):
                classes[a.node] = a.health_class
            elif isinstance(a, Release):
                classes.pop(a.node, None)
        self.node_quarantined.clear()
        self.quarantined.clear()
        pools: dict[str, int] = {}
        per: dict[tuple[str, str], int] = {}
        for v in views.values():
            pools[v.pool] = pools.get(v.pool, 0) + 1
        for name, cls in classes.items():
            self.node_quarantined.labels(name, str(cls)).set(1)
            key = (str(cls), views[name].pool)
            per[key] = per.get(key, 0) + 1
        for cls in HealthClass:
            for pool in pools:
                self.quarantined.labels(str(cls), pool).set(per.get((str(cls), pool), 0))
        for pool, size in pools.items():
            out = sum(1 for name in classes if views[name].pool == pool)
            self.pool_share.labels(pool).set(out / size if size else 0)
        firing_now = set(firing_before)
        for signal in signals:
            firing = [n for n, r in decision.readings.items() if r.get(signal.name) is Reading.FIRING]
            self.firing.labels(signal.name).set(len(firing))
            self.unknown.labels(signal.name).set(
                sum(1 for r in decision.readings.values() if r.get(signal.name) is Reading.UNKNOWN))
            for n in firing:
                if (n, signal.name) not in firing_before:
                    self.events.labels(signal.name, str(signal.health_class)).inc()
            firing_now = {k for k in firing_now if k[1] != signal.name} | {(n, signal.name) for n in firing}
        return firing_now
