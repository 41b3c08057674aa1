"""A whole day in simulated time: the incremental view and the decision core against a small cluster model.

The model is deliberately plain: a first-fit scheduler (on-prem first, then virtual nodes without the burst
taint), gang preemption that evicts inference after a grace period (as a batch scheduler's victims take
their termination grace), an HPA that removes the lowest pod-deletion-cost pods first, and a descheduler
that moves a few inference pods per cycle off closed virtual nodes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from agents.burst_controller.contract import POD_DELETION_COST_ANNOTATION, BurstSettings
from agents.burst_controller.decide import ActionKind, BurstState, Mode, decide, state_from_snapshot
from agents.burst_controller.view import ClusterView
from fakes.burst_objects import gpu_pod, onprem_node, virtual_node

S = BurstSettings(
    open_below_free_gpus=8,
    close_at_free_gpus=16,
    open_hold_seconds=60,
    close_hold_seconds=600,
    pending_grace_seconds=30,
    stale_after_seconds=120,
    watch_timeout_seconds=60,
)
STEP = 30
HOUR = 3600
ONPREM_NODES = 16  # x 8 GPUs
VIRTUAL_CAPACITY = 64
GANG_PODS, GANG_GPUS = 2, 8
PREEMPT_AFTER = 90  # victims' graceful termination before the gang binds
DESCHEDULE_EVERY, DESCHEDULE_MAX = 120, 4


def inference_demand(t: int) -> int:
    """Replicas the HPA wants: a daytime spike, and a night spike beyond on-prem capacity."""
    if 13 * HOUR <= t < 15 * HOUR:
        return 70
    if 21 * HOUR <= t < 22 * HOUR:
        return 140
    return 40


def training_gangs(t: int) -> int:
    """Training gangs alive: one more every 20 minutes from 08:00, seven in all, all done at 18:00."""
    if 8 * HOUR <= t < 18 * HOUR:
        return min(7, (t - 8 * HOUR) // 1200 + 1)
    return 0


@dataclass
class Cluster:
    view: ClusterView
    nodes: dict[str, dict[str, Any]] = field(default_factory=dict)
    pods: dict[str, dict[str, Any]] = field(default_factory=dict)
    gang_pending_since: dict[int, int] = field(default_factory=dict)
    serial: int = 0
    taint_effects_seen: set[str] = field(default_factory=set)

    def put_node(self, obj: dict[str, Any]) -> None:
        self.nodes[obj["metadata"]["name"]] = obj
        self.view.apply_node("MODIFIED", obj)

    def put_pod(self, obj: dict[str, Any]) -> None:
        self.pods[obj["metadata"]["name"]] = obj
        self.view.apply_pod("MODIFIED", obj)

    def delete_pod(self, name: str) -> None:
        self.view.apply_pod("DELETED", self.pods.pop(name))

    # -- helpers ---------------------------------------------------------------------------------

    def used(self, node: str) -> int:
        return sum(p["gpus"] for p in self._live() if p["node"] == node)

    def _live(self) -> list[dict[str, Any]]:
        return [
            {
                "name": n,
                "node": p["spec"].get("nodeName"),
                "gpus": int(p["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"]),
                "workload": p["metadata"]["labels"]["gpucluster.io/workload"],
                "cost": int(p["metadata"]["annotations"].get(POD_DELETION_COST_ANNOTATION, "0")),
            }
            for n, p in self.pods.items()
        ]

    def capacity(self, node: str) -> int:
        return int(self.nodes[node]["status"]["allocatable"]["nvidia.com/gpu"])

    def onprem_schedulable(self) -> list[str]:
        return [
            n
            for n, o in self.nodes.items()
            if o["metadata"]["labels"]["gpucluster.io/location"] == "onprem"
            and not any(t["key"] == "gpucluster.io/thermal" for t in o["spec"]["taints"])
        ]

    def virtual_open(self) -> list[str]:
        return [
            n
            for n, o in self.nodes.items()
            if o["metadata"]["labels"]["gpucluster.io/location"] == "external"
            and not any(t["key"] == S.taint_key for t in o["spec"]["taints"])
        ]

    def new_inference(self) -> None:
        self.serial += 1
        self.put_pod(gpu_pod(f"inf-{self.serial}", 1))

    def bind(self, name: str, node: str) -> None:
        pod = self.pods[name]
        workload = pod["metadata"]["labels"]["gpucluster.io/workload"]
        gpus = int(pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"])
        self.put_pod(gpu_pod(name, gpus, node=node, workload=workload, namespace=pod["metadata"]["namespace"]))

    def mark_unschedulable(self, name: str) -> None:
        pod = self.pods[name]
        if pod["status"]["conditions"]:
            return
        workload = pod["metadata"]["labels"]["gpucluster.io/workload"]
        gpus = int(pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"])
        self.put_pod(
            gpu_pod(name, gpus, workload=workload, namespace=pod["metadata"]["namespace"], unschedulable=True)
        )

    # -- the world's actors ----------------------------------------------------------------------

    def workloads(self, t: int) -> None:
        live_gangs = {int(p.split("-")[1]) for p in self.pods if p.startswith("gang-")}
        wanted = training_gangs(t)
        for g in range(wanted):
            if g not in live_gangs:
                for i in range(GANG_PODS):
                    self.put_pod(gpu_pod(f"gang-{g}-{i}", GANG_GPUS, workload="training", namespace="train"))
                self.gang_pending_since[g] = t
        if wanted == 0:
            for name in [p for p in self.pods if p.startswith("gang-")]:
                self.delete_pod(name)
        inference = [p for p in self._live() if p["workload"] == "inference"]
        target = inference_demand(t)
        if len(inference) < target:
            for _ in range(min(2, target - len(inference))):  # HPA scale-up policy: 2 pods per step
                self.new_inference()
        elif len(inference) > target:
            # ReplicaSet scale-down: unscheduled first, then lowest pod-deletion-cost.
            victims = sorted(inference, key=lambda p: (p["node"] is not None, p["cost"]))
            for p in victims[: min(4, len(inference) - target)]:
                self.delete_pod(p["name"])

    def deschedule(self, t: int) -> None:
        if t % DESCHEDULE_EVERY:
            return
        closed = [n for n in self.nodes if n.startswith("vk-") and n not in self.virtual_open()]
        moved = 0
        for p in self._live():
            if p["node"] in closed and p["workload"] == "inference" and moved < DESCHEDULE_MAX:
                self.delete_pod(p["name"])
                self.new_inference()  # the ReplicaSet replaces it; the scheduler places it on-prem
                moved += 1

    def schedule(self, t: int) -> None:
        for gang in sorted({int(p.split("-")[1]) for p in self.pods if p.startswith("gang-")}):
            members = [f"gang-{gang}-{i}" for i in range(GANG_PODS)]
            if all(self.pods[m]["spec"].get("nodeName") for m in members):
                continue
            free_nodes = [n for n in self.onprem_schedulable() if self.used(n) == 0]
            if len(free_nodes) >= GANG_PODS:
                for member, node in zip(members, free_nodes, strict=False):
                    self.bind(member, node)
                continue
            for member in members:
                self.mark_unschedulable(member)
            if t - self.gang_pending_since[gang] >= PREEMPT_AFTER:
                no_training = [
                    n
                    for n in self.onprem_schedulable()
                    if not any(p["node"] == n and p["workload"] == "training" for p in self._live())
                ]
                targets = sorted(no_training, key=self.used)[:GANG_PODS]
                for node in targets:
                    for p in self._live():
                        if p["node"] == node:
                            self.delete_pod(p["name"])
                            self.new_inference()
                for member, node in zip(members, targets, strict=False):
                    self.bind(member, node)
        for p in self._live():
            if p["node"] is None and p["workload"] == "inference":
                for node in self.onprem_schedulable() + self.virtual_open():
                    if self.used(node) < self.capacity(node):
                        self.bind(p["name"], node)
                        break
                else:
                    self.mark_unschedulable(p["name"])

    def apply(self, kind: ActionKind, node: str = "", pod: str = "", cost: int = 0) -> None:
        if kind is ActionKind.SET_DELETION_COST:
            obj = self.pods[pod]
            obj["metadata"]["annotations"][POD_DELETION_COST_ANNOTATION] = str(cost)
            self.put_pod(obj)
            return
        obj = self.nodes[node]
        taints = [t for t in obj["spec"]["taints"] if t["key"] != S.taint_key]
        if kind is ActionKind.CLOSE_NODE:
            taints.append({"key": S.taint_key, "value": S.taint_value, "effect": "NoSchedule"})
        obj["spec"]["taints"] = taints
        self.put_node(obj)
        self.taint_effects_seen.update(t["effect"] for t in taints if t["key"] == S.taint_key)


def run_day() -> tuple[Cluster, list[tuple[int, Mode]], list[int], int]:
    view = ClusterView(S)
    cluster = Cluster(view)
    view.replace_nodes([], 0)
    view.replace_pods([], 0)
    for i in range(ONPREM_NODES):
        cluster.put_node(onprem_node(f"n{i:02d}", 8))
    cluster.put_node(virtual_node("vk-a", "gpucloud", gpus=VIRTUAL_CAPACITY))
    cluster.put_node(virtual_node("vk-b", "othercloud", gpus=VIRTUAL_CAPACITY))
    state: BurstState | None = None
    flips: list[tuple[int, Mode]] = []
    stranded: list[int] = []
    max_external = 0
    for t in range(0, 24 * HOUR, STEP):
        if t == 3 * HOUR or t == 4 * HOUR:  # a node pulled for heat for an hour
            node = cluster.nodes["n00"]
            node["spec"]["taints"] = (
                [{"key": "gpucluster.io/thermal", "value": "hot", "effect": "NoSchedule"}] if t == 3 * HOUR else []
            )
            cluster.put_node(node)
        cluster.workloads(t)
        cluster.deschedule(t)
        cluster.schedule(t)
        pending_inference = [
            n
            for n, p in cluster.pods.items()
            if not p["spec"].get("nodeName") and p["metadata"]["labels"]["gpucluster.io/workload"] == "inference"
        ]
        if pending_inference:
            stranded.append(t)
        view.mark_fresh(t)
        snapshot = view.snapshot()
        max_external = max(max_external, snapshot.external_gpus_in_use)
        if state is None:
            state = state_from_snapshot(snapshot, t)
        decision = decide(snapshot, state, t, S)
        state = decision.state
        if decision.flipped is not None:
            flips.append((t, decision.flipped))
        for a in decision.actions:
            cluster.apply(a.kind, node=a.node, pod=a.pod, cost=a.deletion_cost)
    return cluster, flips, stranded, max_external


def test_whole_day() -> None:
    cluster, flips, stranded, max_external = run_day()
    # Surge 1 (training from 08:00, inference spike 13-15, training ends 18:00): one open, one close.
    surge1 = [(t, m) for t, m in flips if 8 * HOUR <= t < 21 * HOUR]
    surge2 = [(t, m) for t, m in flips if t >= 21 * HOUR]
    assert [m for _, m in surge1] == [Mode.OPEN, Mode.CLOSED]
    assert [m for _, m in surge2] == [Mode.OPEN, Mode.CLOSED]
    assert [m for t, m in flips if t < 8 * HOUR] == []
    # It opened before the sixth gang's preemption evicted inference, and closed only after training ended.
    assert 8 * HOUR + 5 * 1200 < surge1[0][0] < 8 * HOUR + 5 * 1200 + PREEMPT_AFTER
    assert 18 * HOUR + 600 <= surge1[1][0] < 18 * HOUR + 600 + 2 * STEP
    # Inference was never left without a schedulable node: no inference pod pending after any scheduling pass.
    assert stranded == []
    assert cluster.taint_effects_seen == {"NoSchedule"}
    assert max_external > 0
    # The day ends closed, with everything back home.
    assert all(any(t["key"] == S.taint_key for t in cluster.nodes[n]["spec"]["taints"]) for n in ("vk-a", "vk-b"))
    assert [p for p in cluster.pods.values() if p["spec"].get("nodeName", "").startswith("vk-")] == []


def run_two_pools(gang_names_pool: bool) -> tuple[list[tuple[int, Mode]], int]:
    """Pool a is full of training with another gang pending for it all day; pool b serves inference.

    Inference spikes from 02:00 to 03:00 beyond pool b (32 GPUs), so the burst opens; after the spike pool b
    has room again. Whether the burst can close depends on netting a's backlog against a's GPUs only.
    """
    view = ClusterView(S)
    view.replace_nodes([], 0)
    view.replace_pods([], 0)
    pool_b = [f"b{i}" for i in range(4)]
    for i in range(4):
        view.apply_node("ADDED", onprem_node(f"a{i}", 8, pool="a"))
        view.apply_node("ADDED", onprem_node(pool_b[i], 8, pool="b"))
        view.apply_pod("ADDED", gpu_pod(f"run-{i}", 8, node=f"a{i}", workload="training", namespace="train"))
    for i in range(2):
        view.apply_pod("ADDED", gpu_pod(f"wait-{i}", 8, workload="training", namespace="train", unschedulable=True,
                                        pool="a" if gang_names_pool else None))
    closed = virtual_node("vk-a", gpus=VIRTUAL_CAPACITY)
    view.apply_node("ADDED", closed)
    placed: dict[str, str | None] = {}  # inference pod -> node (None: unschedulable)
    is_open = False
    state: BurstState | None = None
    flips: list[tuple[int, Mode]] = []
    for t in range(0, 6 * HOUR, STEP):
        target = 40 if 2 * HOUR <= t < 3 * HOUR else 8
        while len(placed) < target:
            placed[f"inf-{len(placed)}"] = None
        if len(placed) > target:  # scale-down removes external pods first (their deletion cost)
            for name in sorted(placed, key=lambda n: (placed[n] != "vk-a", n))[: len(placed) - target]:
                view.apply_pod("DELETED", gpu_pod(name, 1))
                del placed[name]
        if not is_open and t % DESCHEDULE_EVERY == 0:  # the descheduler brings a few home per cycle
            for name in [n for n, node in placed.items() if node == "vk-a"][:DESCHEDULE_MAX]:
                view.apply_pod("DELETED", gpu_pod(name, 1, node="vk-a"))
                placed[name] = None
        used = {n: sum(1 for node in placed.values() if node == n) for n in [*pool_b, "vk-a"]}
        for name, node in placed.items():
            if node is not None:
                continue
            home = next((n for n in pool_b if used[n] < 8), None)
            where = home or ("vk-a" if is_open and used["vk-a"] < VIRTUAL_CAPACITY else None)
            if where is not None:
                used[where] += 1
            placed[name] = where
            view.apply_pod("MODIFIED", gpu_pod(name, 1, node=where, unschedulable=where is None))
        view.mark_fresh(t)
        snapshot = view.snapshot()
        state = state or state_from_snapshot(snapshot, t)
        decision = decide(snapshot, state, t, S)
        state = decision.state
        if decision.flipped is not None:
            flips.append((t, decision.flipped))
        for action in decision.actions:
            if action.kind in (ActionKind.OPEN_NODE, ActionKind.CLOSE_NODE):
                is_open = action.kind is ActionKind.OPEN_NODE
                view.apply_node("MODIFIED", virtual_node("vk-a", gpus=VIRTUAL_CAPACITY,
                                                         burst_effect=None if is_open else "NoSchedule"))
    return flips, sum(1 for node in placed.values() if node == "vk-a")


def test_backlog_on_one_pool_does_not_keep_the_burst_open() -> None:
    flips, external = run_two_pools(gang_names_pool=True)
    assert [m for _, m in flips] == [Mode.OPEN, Mode.CLOSED]
    assert 2 * HOUR < flips[0][0] < 2 * HOUR + 120
    assert 3 * HOUR + 600 <= flips[1][0] < 3 * HOUR + 600 + 2 * STEP
    assert external == 0  # back home by the end of the day
    # The same pending gang without a pool in its affinity counts against every pool: the burst stays open.
    flips, _ = run_two_pools(gang_names_pool=False)
    assert [m for _, m in flips] == [Mode.OPEN]
