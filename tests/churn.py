"""Random watch-event churn for the incremental view: apply events one by one, compare with a full re-list."""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

from agents.burst_controller.contract import BurstSettings
from agents.burst_controller.decide import Snapshot
from agents.burst_controller.view import ClusterView

Obj = dict[str, Any]


def churn(
    settings: BurstSettings,
    rng: random.Random,
    *,
    node_names: int,
    pod_names: int,
    make_node: Callable[[str], Obj],
    make_pod: Callable[[str], Obj],
    check: Callable[[Snapshot, Snapshot], None],
    steps: int = 3000,
    every: int = 500,
) -> None:
    """`steps` events (15 % node, 85 % pod; a fifth of node and a quarter of pod events delete), then
    `check(incremental, full)` every `every` steps and at the end; `now` is fixed (freshness is not tested)."""
    now = 10_000.0
    view = ClusterView(settings)
    view.replace_nodes([], now)
    view.replace_pods([], now)
    nodes: dict[str, Obj] = {}
    pods: dict[str, Obj] = {}
    for step in range(steps):
        if rng.random() < 0.15:
            name = f"n{rng.randrange(node_names)}"
            if rng.random() < 0.2 and name in nodes:
                view.apply_node("DELETED", nodes.pop(name))
            else:
                nodes[name] = make_node(name)
                view.apply_node("MODIFIED", nodes[name])
        else:
            name = f"p{rng.randrange(pod_names)}"
            if rng.random() < 0.25 and name in pods:
                view.apply_pod("DELETED", pods.pop(name))
            else:
                pods[name] = make_pod(name)
                view.apply_pod("ADDED", pods[name])
        if step % every == 0 or step == steps - 1:
            check(view.snapshot(), ClusterView.from_lists(nodes.values(), pods.values(), settings, now).snapshot())
