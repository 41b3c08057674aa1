"""The only module that knows the burst controller's API: simulator state in, the real core's actions out.

The simulator keeps its own aggregates (it has no API objects), so instead of feeding `ClusterView` JSON it
builds the core's `Snapshot` directly with the same meaning the view gives each field: on-prem free GPUs on
schedulable nodes, GPUs of inference/training pods the scheduler could not place, virtual nodes with our
taint's effect and the GPUs bound to them, and live external pods still lacking the deletion cost. For the
handover: per handover service its main and standby pods by readiness and place, the standby's GPUs on
virtual nodes, the gated gangs, and unplaced training per pool. In the simulator every Inqueue gang is
unplaced (gated, or released and waiting for whole nodes; a gang binds all its nodes at once), so unplaced
training equals pending training per pool. The decision itself is `agents.burst_controller.decide.decide`,
called as the shell calls it.

Quiet ticks: when the inputs are identical to the previous call, and that call flipped nothing, emitted no
action, left every hold timer unset (the handover's gate timer included) and saw no service's replica
count change within the ramp window (the handover's ramp would move with the clock alone), calling the core
again can only return the same answer (its conditions are all false and stay false), so the call is
skipped and counted.
The only field that would differ is `last_now`, whose one effect (restarting holds after a long gap) is a
no-op while no hold runs.
`exact_ticks=True` turns the shortcut off; a test checks both give identical outcomes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from agents.burst_controller.contract import BurstSettings
from agents.burst_controller.decide import (
    ActionKind,
    BurstState,
    Decision,
    Mode,
    PodRef,
    PoolGpus,
    ServiceReplicas,
    Snapshot,
    VirtualNode,
    decide,
    state_from_snapshot,
)

__all__ = [
    "ActionKind",
    "BurstSettings",
    "BurstState",
    "ClusterPort",
    "ControllerAdapter",
    "Decision",
    "Mode",
    "PodRef",
    "PoolGpus",
    "ServiceReplicas",
    "Snapshot",
    "TickStats",
    "VirtualNode",
    "decide",
    "naive_settings",
    "state_from_snapshot",
]

def naive_settings(settings: BurstSettings) -> BurstSettings:
    """The naive burst: the same core with no hysteresis — zero holds and adjacent thresholds — and no
    handover (it opens at once and comes back at once, it does not make before it breaks)."""
    data: dict[str, Any] = settings.to_mapping()
    data.update(
        open_hold_seconds=0.0,
        close_hold_seconds=0.0,
        pending_grace_seconds=0.0,
        close_at_free_gpus=settings.open_below_free_gpus + 1,
        handover_services={},
    )
    return BurstSettings.from_mapping(data, source="naive burst")


# One handover service as the port reports it, field for field `ServiceReplicas` (min, live, ready, ready
# external, ready on-prem per pool, starting on-prem per pool, standby live and ready, GPUs per replica, warm
# placeholders, return bridge live, ready and pending).
ServiceRow = tuple[int, int, int, int, dict[str, int], dict[str, int], int, int, int, int, int, int, int, int]


class ClusterPort(Protocol):
    """What the adapter reads from and writes to the simulator (implemented by `port.ControllerPort`)."""

    def onprem_allocatable_gpus(self) -> int: ...
    def onprem_free_gpus(self) -> int: ...
    def pending_inference_gpus(self) -> int: ...
    def pending_training_gpus(self) -> int: ...
    def pool_gpus(self) -> dict[str, tuple[int, int]]: ...
    def pool_shapes(self) -> dict[str, tuple[dict[int, int], dict[int, int]]]: ...
    def virtual_nodes(self) -> list[tuple[str, str, str | None, int, float | None]]: ...
    def pods_needing_cost(self, limit: int) -> list[tuple[str, str, str]]: ...
    def set_taint(self, node: str, effect: str | None, now: float) -> None: ...
    def set_deletion_cost(self, namespace: str, pod: str, cost: int) -> None: ...
    def quiet_key(self) -> tuple[object, ...]: ...
    def service_replicas(self) -> dict[str, ServiceRow]: ...
    def external_replicas(self) -> dict[str, list[tuple[str, str]]]: ...
    def gated_pods(self) -> list[tuple[str, str]]: ...
    def standby_external_gpus(self) -> int: ...
    def set_standby(self, service: str, replicas: int) -> None: ...
    def set_warm(self, service: str, replicas: int) -> None: ...
    def set_return(self, service: str, replicas: int) -> None: ...
    def evict(self, namespace: str, pod: str) -> bool: ...
    def ungate(self, namespace: str, pod: str) -> None: ...


@dataclass
class TickStats:
    calls: int = 0
    skipped: int = 0
    flips: int = 0
    node_patches: int = 0
    cost_patches: int = 0
    standby_scales: int = 0
    warm_scales: int = 0
    return_scales: int = 0
    evictions: int = 0
    ungates: int = 0


class ControllerAdapter:
    """Runs the real core once per controller tick against the simulated cluster."""

    def __init__(self, settings: BurstSettings, port: ClusterPort, exact_ticks: bool = False,
                 on_flip: Callable[[Mode, float], None] | None = None, per_pool: bool = True) -> None:
        self.settings = settings
        self.port = port
        self.per_pool = per_pool
        self.exact_ticks = exact_ticks
        self.on_flip = on_flip
        self.decide_fn: Callable[[Snapshot, BurstState, float, BurstSettings], Decision] = decide
        # ^ the controller's own function; the tests compare it by identity
        self.stats = TickStats()
        self.state: BurstState | None = None
        self._quiet_key: tuple[Any, ...] | None = None
        self._rows: list[tuple[str, str, str | None, int, float | None]] | None = None
        self._nodes: dict[str, VirtualNode] = {}

    def snapshot(self, now: float) -> Snapshot:
        port = self.port
        rows = port.virtual_nodes()
        if rows != self._rows:  # virtual nodes change rarely; reuse the (immutable) mapping otherwise
            self._rows = rows
            self._nodes = {
                name: VirtualNode(name=name, provider=provider, taint_effect=effect, gpus_in_use=used,
                                  changed_at=changed)
                for name, provider, effect, used, changed in rows
            }
        nodes = self._nodes
        needing = port.pods_needing_cost(self.settings.max_cost_patches_per_cycle)
        refs = tuple(PodRef(ns, name) for ns, name, _ in needing)
        costs = ({PodRef(ns, name): self.settings.deletion_cost_for(provider) for ns, name, provider in needing}
                 if self.settings.provider_deletion_costs else {})
        pools = port.pool_gpus()  # pool -> (free on-prem GPUs, GPUs of Inqueue gangs for the pool)
        pending_training = port.pending_training_gpus()
        # Unplaced training is a sparse map, as the view keeps it; without per-pool accounting every gang
        # counts under "" (not confined to one pool), like the rest of that baseline's input.
        if self.per_pool:
            unplaced = {p: pending for p, (_, pending) in pools.items() if pending}
        else:
            unplaced = {"": pending_training} if pending_training else {}
        services = {
            name: ServiceReplicas(min_replicas=lo, main_live=live, main_ready=ready, main_ready_external=ext,
                                  main_ready_onprem=onprem, main_starting_onprem=starting, standby_live=sb_live,
                                  standby_ready=sb_ready, standby_unschedulable=sb_unplaced, gpus_per_replica=gpus,
                                  warm_live=warm, return_live=rt_live, return_ready=rt_ready,
                                  return_pending=rt_pending)
            for name, (lo, live, ready, ext, onprem, starting, sb_live, sb_ready, sb_unplaced, gpus, warm, rt_live,
                       rt_ready, rt_pending) in port.service_replicas().items()
        }
        external = ({name: tuple(PodRef(ns, pod) for ns, pod in rows)
                     for name, rows in port.external_replicas().items()}
                    if self.settings.return_surge_share > 0 else {})
        return Snapshot(
            synced=True,
            observed_at=now,
            onprem_allocatable_gpus=port.onprem_allocatable_gpus(),
            onprem_free_gpus=port.onprem_free_gpus(),
            pending_inference_gpus=port.pending_inference_gpus(),
            pending_training_gpus=pending_training,
            virtual_nodes=nodes,
            pods_needing_cost=refs,
            deletion_costs=costs,
            pools=self._pools(pools) if self.per_pool else {},
            services=services,
            unplaced_training=unplaced,
            gated_pods=tuple(PodRef(ns, name) for ns, name in port.gated_pods()),
            standby_external_gpus=port.standby_external_gpus(),
            external_replicas=external,
        )

    def _pools(self, pools: Mapping[str, tuple[int, int]]) -> dict[str, PoolGpus]:
        """Free and pending GPUs per pool; with the handover, also free GPUs node by node and the waiting pods
        (what the view keeps), so the core can tell whether a gang fits without reclaiming inference."""
        if not self.settings.handover_services:
            return {p: PoolGpus(free, pending) for p, (free, pending) in pools.items()}
        shapes = self.port.pool_shapes()
        return {
            p: PoolGpus(free, pending, free_nodes=shapes.get(p, ({}, {}))[0], unplaced_pods=shapes.get(p, ({}, {}))[1])
            for p, (free, pending) in pools.items()
        }

    def start(self, now: float) -> None:
        """The restart path of the real controller: recover the mode from the taints."""
        self.state = state_from_snapshot(self.snapshot(now), now)

    def tick(self, now: float) -> None:
        port = self.port
        if not self.exact_ticks:
            key = port.quiet_key()
            if key == self._quiet_key:
                self.stats.skipped += 1
                return
        else:
            key = None
        if self.state is None:
            self.start(now)
        assert self.state is not None
        snapshot = self.snapshot(now)
        decision = self.decide_fn(snapshot, self.state, now, self.settings)
        self.stats.calls += 1
        self.state = decision.state
        for action in decision.actions:
            if action.kind is ActionKind.OPEN_NODE:
                port.set_taint(action.node, None, now)
                self.stats.node_patches += 1
            elif action.kind is ActionKind.CLOSE_NODE:
                port.set_taint(action.node, "NoSchedule", now)
                self.stats.node_patches += 1
            elif action.kind is ActionKind.SET_DELETION_COST:
                port.set_deletion_cost(action.namespace, action.pod, action.deletion_cost)
                self.stats.cost_patches += 1
            elif action.kind is ActionKind.SET_STANDBY:
                port.set_standby(action.service, action.replicas)
                self.stats.standby_scales += 1
            elif action.kind is ActionKind.SET_WARM:
                port.set_warm(action.service, action.replicas)
                self.stats.warm_scales += 1
            elif action.kind is ActionKind.SET_RETURN:
                port.set_return(action.service, action.replicas)
                self.stats.return_scales += 1
            elif action.kind is ActionKind.EVICT:
                self.stats.evictions += port.evict(action.namespace, action.pod)
            elif action.kind is ActionKind.UNGATE:
                port.ungate(action.namespace, action.pod)
                self.stats.ungates += 1
        if decision.flipped is not None:
            self.stats.flips += 1
            if self.on_flip is not None:
                self.on_flip(decision.flipped, now)
        st = decision.state
        quiet = (
            not decision.actions
            and decision.flipped is None
            and st.low_since is None
            and st.pending_since is None
            and st.close_since is None
            and st.gated_since is None
            # A replica count that changed within the ramp window makes the handover's ramp move with the
            # clock alone: the next tick must run.
            and all(len(points) <= 1 for points in st.replicas_seen.values())
        )
        # A quiet decision applied no action, so the key read before it still describes the cluster.
        self._quiet_key = key if quiet else None

    def is_open(self) -> bool:
        return self.state is not None and self.state.mode is Mode.OPEN
