"""Burst controller: decision time per incremental watch event, and the shell's hot-loop figure.

Decision time: for clusters of 100, 1,000 and 4,000 GPU nodes with 20 pods each (plus two virtual nodes), one
event is `ClusterView.apply_*` + `snapshot()` + `decide()` — exactly what the shell does per event. The baseline
rebuilds the view from the full lists before deciding, which is what a controller without an incremental
view would pay per event. Target: under 1 ms per event at 4,000 nodes, flat with cluster size.

Hot loop: the real shell (`BurstShell`) against the in-memory API port in simulated time, 100 pod events per
second for 10 s while both virtual nodes' patches fail for good (403). Counted: node patch attempts and
reconciles. The baseline row is the shell's previous behaviour, kept measurable by its two switches (a
reconcile per event, failed actions retried at every reconcile). Target: at most 10 attempts.
"""

from __future__ import annotations

import gc
import json
import logging
import random
import statistics
import time
from typing import Any

from kubernetes.client.exceptions import ApiException

from agents.burst_controller.contract import BurstSettings
from agents.burst_controller.decide import decide, state_from_snapshot
from agents.burst_controller.shell import NODES, PODS, BurstShell
from agents.burst_controller.view import ClusterView
from fakes.burst_objects import gpu_pod, onprem_node, virtual_node
from fakes.kube_api import MemoryApi

SIZES = (100, 1_000, 4_000)
PODS_PER_NODE = 20
GPU_PODS_PER_NODE = 8  # the other 12 are CPU-only (daemons, sidecar services)
EVENTS = 20_000
BASELINE_REPS = 3
TARGET_US = 1_000.0


def build(nodes: int, settings: BurstSettings) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    node_objs = [onprem_node(f"n{i:05d}", 8) for i in range(nodes)]
    node_objs += [virtual_node("vk-a", "gpucloud"), virtual_node("vk-b", "othercloud", burst_effect=None)]
    pods: list[dict[str, Any]] = []
    for i in range(nodes):
        for j in range(PODS_PER_NODE):
            gpus = 1 if j < GPU_PODS_PER_NODE else 0
            workload = "training" if i % 2 else "inference"
            pods.append(gpu_pod(f"p{i:05d}-{j:02d}", gpus, node=f"n{i:05d}", workload=workload))
    return node_objs, pods


def events(nodes: int, pods: list[dict[str, Any]], settings: BurstSettings) -> list[tuple[str, str, Any]]:
    """A repeating mix: pods finishing and coming back, new pending pods, a node pulled for heat and back."""
    out: list[tuple[str, str, Any]] = []
    step = max(1, len(pods) // 997)
    for k in range(EVENTS // 4):
        pod = pods[(k * step) % len(pods)]
        out.append(("pod", "DELETED", pod))
        out.append(("pod", "ADDED", pod))
        pending = gpu_pod(f"pending-{k % 50}", 1, unschedulable=True)
        out.append(("pod", "ADDED" if (k // 50) % 2 == 0 else "DELETED", pending))
        node = f"n{(k * 7919) % nodes:05d}"
        out.append(("node", "MODIFIED", onprem_node(node, 8, thermal=k % 2 == 0, settings=settings)))
    return out


def measure(nodes: int) -> dict[str, float]:
    settings = BurstSettings()
    node_objs, pods = build(nodes, settings)
    t0 = time.perf_counter()
    view = ClusterView.from_lists(node_objs, pods, settings, 0.0)
    build_ms = (time.perf_counter() - t0) * 1e3
    state = state_from_snapshot(view.snapshot(), 0.0)
    evs = events(nodes, pods, settings)
    gc.collect()
    gc.freeze()  # as the shell does after a full list: the long-lived view is not rescanned by every GC pass
    samples: list[float] = []
    perf = time.perf_counter
    for i, (kind, etype, obj) in enumerate(evs):
        now = float(i)
        start = perf()
        if kind == "pod":
            view.apply_pod(etype, obj)
        else:
            view.apply_node(etype, obj)
        view.mark_fresh(now)
        state = decide(view.snapshot(), state, now, settings).state
        samples.append(perf() - start)
    gc.unfreeze()
    samples.sort()
    baseline: list[float] = []
    for _ in range(BASELINE_REPS):
        start = perf()
        full = ClusterView.from_lists(node_objs, pods, settings, 0.0)
        decide(full.snapshot(), state, float(len(evs)), settings)
        baseline.append(perf() - start)
    return {
        "nodes": nodes,
        "pods": len(pods),
        "events": len(samples),
        "event_us_mean": round(statistics.fmean(samples) * 1e6, 2),
        "event_us_p50": round(samples[len(samples) // 2] * 1e6, 2),
        "event_us_p99": round(samples[int(len(samples) * 0.99)] * 1e6, 2),
        "full_recompute_ms_per_event": round(statistics.fmean(baseline) * 1e3, 2),
        "initial_list_ms": round(build_ms, 1),
    }


HOT_LOOP_SECONDS = 10.0
HOT_LOOP_LONG_SECONDS = 60.0  # where the action backoff, beyond coalescing, shows
HOT_LOOP_EVENTS_PER_SECOND = 100
HOT_LOOP_TARGET = 10


class _SimClock:
    def __init__(self) -> None:
        self.t = 1_700_000_000.0

    def __call__(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        self.t += seconds


def hot_loop(coalesce: bool, action_backoff: bool, status: int = 403) -> dict[str, int]:
    """Patch attempts and reconciles of the real shell in 10 (and 60) simulated seconds: 100 pod events/s, every
    node patch refused with `status`; the lease renewed every retry period and the loop paced by
    `reconcile_due`, as `BurstShell.run` paces it."""
    settings = BurstSettings(open_below_free_gpus=1, close_at_free_gpus=8, open_hold_seconds=0)
    if not action_backoff:
        settings = settings.replace(action_backoff_base_seconds=0.0)
    clock = _SimClock()
    api = MemoryApi(clock)
    api.put(NODES, onprem_node("n1", 8))
    api.put(NODES, virtual_node("vk-a"))
    api.put(NODES, virtual_node("vk-b", "othercloud"))
    api.put(PODS, gpu_pod("train-0", 8, node="n1", workload="training", namespace="train"))
    shell = BurstShell(settings, api, identity="bench", clock=clock, monotonic=clock, sleep=clock.sleep,
                       rng=random.Random(1), coalesce=coalesce)
    shell.elector.step()
    shell.relist(NODES)
    shell.relist(PODS)
    api.fail_always("patch:nodes", ApiException(status=status, reason="Refused"))
    patches_before, reconciles = api.count("patch:nodes"), 0
    start, renew_at = clock.t, clock.t + settings.retry_period_seconds
    end = start + HOT_LOOP_LONG_SECONDS
    at_10s: dict[str, int] = {}
    step = 1.0 / HOT_LOOP_EVENTS_PER_SECOND
    i = 0
    while clock.t < end:
        if not at_10s and clock.t >= start + HOT_LOOP_SECONDS:
            at_10s = {"patch_attempts_10s": api.count("patch:nodes") - patches_before, "reconciles_10s": reconciles}
        with shell.lock:
            shell.view.apply_pod("MODIFIED", gpu_pod(f"churn-{i % 50}", 0, node="n1"))
            shell.view.mark_fresh(clock.t)
        shell.dirty.set()
        i += 1
        if clock.t >= renew_at:
            shell.elector.step()
            renew_at += settings.retry_period_seconds
        if shell.reconcile_due(clock.t, shell.dirty.is_set()):
            shell.dirty.clear()
            shell.reconcile()
            reconciles += 1
        clock.t += step
    return {**at_10s, "patch_attempts_60s": api.count("patch:nodes") - patches_before}


def hot_loop_rows() -> dict[str, dict[str, int]]:
    """The previous shell's behaviour as the baseline row, each fix alone, and both (the shell as shipped)."""
    logging.getLogger("burst_controller").setLevel(logging.ERROR)  # 2,000 refused patches would each log
    try:
        return {
            "previous (reconcile per event, no action backoff)": hot_loop(coalesce=False, action_backoff=False),
            "coalescing only": hot_loop(coalesce=True, action_backoff=False),
            "action backoff only": hot_loop(coalesce=False, action_backoff=True),
            "now (coalescing + action backoff)": hot_loop(coalesce=True, action_backoff=True),
            "now, patch answering 422": hot_loop(coalesce=True, action_backoff=True, status=422),
        }
    finally:
        logging.getLogger("burst_controller").setLevel(logging.NOTSET)


def run() -> dict[str, Any]:
    """Measure every size; the result is what `make bench` gathers into bench/report.json."""
    results = {str(n): measure(n) for n in SIZES}
    rows = hot_loop_rows()
    largest = results[str(SIZES[-1])]
    smallest = results[str(SIZES[0])]
    return {
        "name": "burst_controller_decision_per_event",
        "unit": "microseconds",
        "target_us_at_4000_nodes": TARGET_US,
        "pods_per_node": PODS_PER_NODE,
        "sizes": results,
        "meets_target": largest["event_us_p99"] < TARGET_US,
        "growth_4000_vs_100": round(largest["event_us_mean"] / smallest["event_us_mean"], 2),
        "hot_loop_events_per_second": HOT_LOOP_EVENTS_PER_SECOND,
        "hot_loop_target_patch_attempts_10s": HOT_LOOP_TARGET,
        "hot_loop_meets_target": rows["now (coalescing + action backoff)"]["patch_attempts_10s"] <= HOT_LOOP_TARGET,
        "hot_loop": rows,
    }


if __name__ == "__main__":
    report = run()
    print("hot loop:", json.dumps(report["hot_loop"], indent=2))
    print(json.dumps(report, indent=2))
    print()
    print(f"{'nodes':>6} {'pods':>7} {'mean µs':>9} {'p50 µs':>8} {'p99 µs':>8} {'full recompute ms':>18}")
    for row in report["sizes"].values():
        print(
            f"{row['nodes']:>6} {row['pods']:>7} {row['event_us_mean']:>9} {row['event_us_p50']:>8}"
            f" {row['event_us_p99']:>8} {row['full_recompute_ms_per_event']:>18}"
        )
