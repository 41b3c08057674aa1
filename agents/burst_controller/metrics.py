"""The burst controller's Prometheus series, in a registry per instance (tests stay independent)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

from agents.burst_controller.decide import BurstState, Decision, Mode, Snapshot


class Metrics:
    """Prometheus metrics of one controller; a registry per instance keeps tests independent."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.node_open = Gauge(
            "gpucluster_burst_virtual_node_open",
            "1 when inference may land on the virtual node (no burst taint)",
            ["node", "provider"],
            registry=r,
        )
        self.mode_open = Gauge(
            "gpucluster_burst_mode_open", "1 when the controller wants bursting on", registry=r
        )
        self.flips = Counter("gpucluster_burst_flips", "Mode changes by direction", ["direction"], registry=r)
        self.free = Gauge("gpucluster_burst_onprem_free_gpus", "Free schedulable on-prem GPUs", registry=r)
        self.effective_free = Gauge(
            "gpucluster_burst_onprem_effective_free_gpus",
            "Free on-prem GPUs minus GPUs wanted by pending training pods",
            registry=r,
        )
        self.allocatable = Gauge(
            "gpucluster_burst_onprem_allocatable_gpus", "Schedulable on-prem GPUs", registry=r
        )
        self.pending = Gauge(
            "gpucluster_burst_pending_gpus", "GPUs of unschedulable pods", ["workload"], registry=r
        )
        self.external = Gauge(
            "gpucluster_burst_external_gpus_in_use", "GPUs used by pods on virtual nodes", registry=r
        )
        self.errors = Counter(
            "gpucluster_burst_errors", "API and processing errors by kind", ["kind"], registry=r
        )
        self.visible = Gauge(
            "gpucluster_burst_cluster_visible",
            "1 when the last list/watch succeeded; 0 means taints are left as they are",
            registry=r,
        )
        self.leader = Gauge("gpucluster_burst_leader", "1 while this replica holds the lease", registry=r)
        self.actions = Counter(
            "gpucluster_burst_actions", "Actions applied successfully", ["kind"], registry=r
        )
        self.standby = Gauge(
            "gpucluster_burst_standby_replicas",
            "Standby replicas wanted per inference service (covering replicas at risk of a handover)",
            ["service"],
            registry=r,
        )
        self.infeasible = Gauge(
            "gpucluster_burst_infeasible_training_gangs",
            "Training gangs that can never fit their pool (larger than it, or a pod larger than every node)",
            registry=r,
        )
        self.gated = Gauge(
            "gpucluster_burst_gated_training_pods",
            "Training pods held at the handover gate until the standby covers what they displace",
            registry=r,
        )
        self._node_labels: set[tuple[str, str]] = set()

    def observe(self, snapshot: Snapshot, decision: Decision, state: BurstState) -> None:
        self.observe_inputs(snapshot)
        if decision.effective_free_gpus is not None:
            self.effective_free.set(decision.effective_free_gpus)
        for service in snapshot.services:
            self.standby.labels(service).set(decision.standby.get(service, 0))
        self.mode_open.set(1 if state.mode is Mode.OPEN else 0)

    def observe_inputs(self, snapshot: Snapshot) -> None:
        """What the cluster looks like; followers export it too, so a standby's dashboard is not empty."""
        self.free.set(snapshot.onprem_free_gpus)
        self.allocatable.set(snapshot.onprem_allocatable_gpus)
        self.pending.labels("inference").set(snapshot.pending_inference_gpus)
        self.pending.labels("training").set(snapshot.pending_training_gpus)
        self.external.set(snapshot.external_gpus_in_use)
        self.gated.set(len(snapshot.gated_pods))
        labels = {(v.name, v.provider) for v in snapshot.virtual_nodes.values()}
        for gone in self._node_labels - labels:
            self.node_open.remove(*gone)
        for v in snapshot.virtual_nodes.values():
            self.node_open.labels(v.name, v.provider).set(0 if v.closed else 1)
        self._node_labels = labels
