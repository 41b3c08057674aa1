"""The shell's own rules against the in-memory API port (no HTTP), in simulated time (issue 16, items 3, 6, 10-12).

No hot loop: failed actions back off per action with jitter and watch events are coalesced into one reconcile
per tick. No write without the lease: checked before every attempt, retries and conflict re-reads included.
A resync is not a failure, and freshness is per kind and only what the server confirmed.
"""

from __future__ import annotations

import itertools
import random
import threading
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from agents.burst_controller.contract import GANG_ANNOTATION, BurstSettings
from agents.burst_controller.shell import NODES, PODS, BurstShell, WatchEnd
from fakes.burst_objects import gpu_pod, onprem_node, virtual_node
from fakes.kube_api import MemoryApi

S = BurstSettings(
    open_below_free_gpus=1,
    close_at_free_gpus=8,
    open_hold_seconds=0,
    close_hold_seconds=0,
    pending_grace_seconds=0,
    request_timeout_seconds=1,
    backoff_base_seconds=2,
    backoff_max_seconds=8,
    watch_timeout_seconds=30,
    stale_after_seconds=60,
    lease_duration_seconds=15,
    renew_deadline_seconds=10,
    tick_seconds=5,
    action_backoff_base_seconds=2,
    action_backoff_max_seconds=60,
)
START = 1_700_000_000.0
VK_TAINT = {"key": "virtual-kubelet.io/provider", "value": "gpucloud", "effect": "NoSchedule"}
BURST_TAINT = {"key": "gpucluster.io/burst", "value": "closed", "effect": "NoSchedule"}


class Clock:
    """Wall and monotonic time in one; `sleep` advances it (the shell's backoff sleeps take simulated time)."""

    def __init__(self) -> None:
        self.t = START

    def __call__(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        self.t += seconds


def exhausted(api: MemoryApi) -> None:
    """Every on-prem GPU taken by training, two closed virtual nodes: the core wants both opened."""
    api.put(NODES, onprem_node("n1", 8))
    api.put(NODES, virtual_node("vk-a"))
    api.put(NODES, virtual_node("vk-b", "othercloud"))
    api.put(PODS, gpu_pod("train-0", 8, node="n1", workload="training", namespace="train"))


def leading_shell(settings: BurstSettings = S, coalesce: bool = True) -> tuple[BurstShell, MemoryApi, Clock]:
    clock = Clock()
    api = MemoryApi(clock)
    exhausted(api)
    sh = BurstShell(settings, api, identity="a", clock=clock, monotonic=clock, sleep=clock.sleep,
                    rng=random.Random(7), coalesce=coalesce)
    assert sh.elector.step() and sh.relist(NODES) and sh.relist(PODS)
    return sh, api, clock


def drive(sh: BurstShell, clock: Clock, seconds: float, events_per_second: int, renew: bool = True) -> None:
    """The run loop in simulated time: pod events at a steady rate, the lease renewed every retry period, and a
    reconcile whenever `reconcile_due` says so."""
    step = 1.0 / events_per_second
    end = clock.t + seconds
    next_renewal = clock.t + S.retry_period_seconds
    i = 0
    while clock.t < end:
        sh.view.apply_pod("MODIFIED", gpu_pod(f"churn-{i % 50}", 0, node="n1"))
        sh.view.mark_fresh(clock.t)
        sh.dirty.set()
        i += 1
        if renew and clock.t >= next_renewal:
            sh.elector.step()
            next_renewal += S.retry_period_seconds
        if sh.reconcile_due(clock.t, sh.dirty.is_set()):
            sh.dirty.clear()
            sh.reconcile()
        clock.t += step


# -- 10. no hot loop -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("status", [403, 422])
def test_a_patch_that_fails_for_good_is_not_hammered(status: int) -> None:
    sh, api, clock = leading_shell()
    api.fail_always("patch:nodes", ApiException(status=status, reason="Refused"))
    drive(sh, clock, 10, events_per_second=100)
    assert api.count("patch:nodes") <= 10
    assert api.count("patch:nodes") >= 2  # each node was tried, and tried again after its backoff


def test_the_previous_shell_hammered_the_api() -> None:
    """The baseline the benchmark keeps: a reconcile per event and no per-action backoff."""
    sh, api, clock = leading_shell(S.replace(action_backoff_base_seconds=0), coalesce=False)
    api.fail_always("patch:nodes", ApiException(status=403, reason="Forbidden"))
    drive(sh, clock, 10, events_per_second=100)
    assert api.count("patch:nodes") >= 1000


def test_events_are_coalesced_into_one_reconcile_per_tick() -> None:
    sh, _api, clock = leading_shell()
    reconciles: list[float] = []
    real = sh.reconcile

    def counted() -> Any:
        reconciles.append(clock.t)
        return real()

    sh.reconcile = counted  # type: ignore[method-assign]
    drive(sh, clock, 20, events_per_second=100)
    assert len(reconciles) == 4  # t = 0, 5, 10, 15
    assert all(b - a >= S.tick_seconds for a, b in itertools.pairwise(reconciles))


def test_action_backoff_doubles_with_jitter_and_resets_on_success() -> None:
    sh, api, clock = leading_shell()
    api.fail_always("patch:nodes", ApiException(status=403, reason="Forbidden"))
    for _ in range(60):  # one reconcile per simulated second for a minute
        sh.reconcile()
        clock.t += 1
        sh.elector.step()
    for node in ("vk-a", "vk-b"):  # each node's patch has its own backoff
        tries = [t for name, target, t in api.calls if name == "patch:nodes" and target == node]
        gaps = [b - a for a, b in itertools.pairwise(tries)]
        # 2, 4, 8, 16 s ±20 % jitter, rounded up to the next reconcile (one per second here)
        assert gaps[:4] == pytest.approx([2, 4, 8, 16], rel=0.2, abs=1)
    api.fail_always("patch:nodes", None)
    clock.t += 60
    sh.elector.step()
    sh.view.mark_fresh(clock.t)
    sh.reconcile()
    assert api.objects["nodes"]["vk-a"]["spec"]["taints"] == [VK_TAINT]
    assert sh._backoff == {}


# -- 11. no writes without the lease ---------------------------------------------------------------------------


def test_retries_stop_before_the_lease_could_pass_to_another_replica() -> None:
    sh, api, clock = leading_shell()
    renewed = clock.t
    api.fail("patch:nodes", *[ApiException(status=503, reason="Unavailable")] * 4)
    sh.reconcile()  # no renewal while it retries: backoff sleeps of 2, 4, 8 s take simulated time
    writes = [t for name, _, t in api.calls if name == "patch:nodes"]
    assert writes, "the first attempt is made while the lease is fresh"
    assert all(t + S.request_timeout_seconds < renewed + S.lease_duration_seconds for t in writes)
    assert sh.metrics.registry.get_sample_value("gpucluster_burst_errors_total", {"kind": "not_leader"}) == 1


def test_a_conflict_retry_after_the_lease_lapsed_writes_nothing() -> None:
    sh, api, clock = leading_shell()
    # Our cached resourceVersion is stale: the first patch answers 409. By then the lease is too old to write.
    node = api.objects["nodes"]["vk-a"]
    api.put(NODES, node)

    def late_conflict(*args: Any, real: Any = api.patch, **kwargs: Any) -> dict[str, Any]:
        clock.t += 7  # a slow answer: by then this replica is past its renew deadline
        return real(*args, **kwargs)  # type: ignore[no-any-return]

    api.patch = late_conflict  # type: ignore[method-assign]
    clock.t += 4
    sh.reconcile()
    # The re-read is a read; the patch after it is refused by the fence before anything is sent.
    assert [name for name, target, _ in api.calls if target == "vk-a"] == ["patch:nodes", "get:nodes"]
    assert sh.api.refused >= 1


def test_a_replica_that_lost_the_lease_writes_nothing() -> None:
    sh, api, clock = leading_shell()
    clock.t += S.renew_deadline_seconds  # no renewal for the renew deadline
    assert sh.reconcile() is None
    assert api.count("patch:nodes") == api.count("create:events") == 0


def test_a_leader_frozen_between_deciding_and_writing_writes_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    """The acceptance scenario for the controller: the lease changes hands after the leader decided and before
    it wrote; the woken leader writes nothing (not even an Event) and the standby acts once."""
    from agents.burst_controller import shell as shell_mod

    sh, api, clock = leading_shell()
    standby = BurstShell(S, api, identity="b", clock=clock, monotonic=clock, sleep=clock.sleep,
                         rng=random.Random(8))
    assert not standby.elector.step()  # it sees the leader's fresh record
    assert standby.relist(NODES) and standby.relist(PODS)
    real_decide = shell_mod.decide
    writes_at_wake: list[int] = []

    def decide_then_freeze(*args: Any, **kwargs: Any) -> Any:
        decision = real_decide(*args, **kwargs)
        if not writes_at_wake:
            clock.t += S.lease_duration_seconds + 1  # SIGSTOP past the lease; the standby takes it meanwhile
            assert standby.elector.step()
            writes_at_wake.append(len(api.writes()))
        return decision

    monkeypatch.setattr(shell_mod, "decide", decide_then_freeze)
    decision = sh.reconcile()
    assert decision is not None and decision.actions  # it meant to open both virtual nodes
    assert api.writes()[writes_at_wake[0]:] == []
    assert standby.reconcile() is not None
    opened = [target for name, target, _ in api.writes() if name == "patch:nodes"]
    assert sorted(opened) == ["vk-a", "vk-b"]  # the standby opened each once


# -- 12. a resync is not a failure; freshness per kind, confirmed by the server --------------------------------


class CountingStop(threading.Event):
    """A stop event that records the watch loop's backoff waits and stops after `rounds` of them or calls."""

    def __init__(self, rounds: int) -> None:
        super().__init__()
        self.rounds = rounds
        self.waits: list[float] = []
        self.checks = 0

    def is_set(self) -> bool:
        self.checks += 1
        return self.checks > self.rounds or super().is_set()

    def wait(self, timeout: float | None = None) -> bool:
        self.waits.append(timeout or 0.0)
        return False


def test_watches_ending_at_their_timeout_and_resyncs_never_back_off() -> None:
    sh, api, _clock = leading_shell()
    for _ in range(6):
        api.watch_answers["pods"].append([])  # the server ends each watch at its timeout, quietly
    stop = CountingStop(rounds=6)
    informer = sh.informers[PODS]
    original = informer.watch_once

    def with_resync() -> str:
        informer.needs_list = True  # the run loop's periodic resync asks for a re-list every time
        return original()

    informer.watch_once = with_resync  # type: ignore[method-assign]
    informer.run(stop, S.backoff_base_seconds, S.backoff_max_seconds)
    assert stop.waits == []
    assert api.count("list:nodes") + api.count("list:pods") == 2 + 6  # two initial lists, one re-list per resync


def test_a_failing_watch_still_backs_off() -> None:
    sh, api, _clock = leading_shell()
    for _ in range(3):
        api.watch_answers["pods"].append(ApiException(status=500, reason="Internal"))
    api.fail("list:pods", *[ApiException(status=500, reason="Internal")] * 2)
    stop = CountingStop(rounds=3)
    sh.informers[PODS].run(stop, S.backoff_base_seconds, S.backoff_max_seconds)
    assert stop.waits == [4, 8, 8]  # base 2 s doubled per failure, capped at 8 s


def test_freshness_is_per_kind_and_only_what_the_server_confirmed() -> None:
    sh, api, clock = leading_shell()
    clock.t += 50
    api.watch_answers["nodes"].append([{"type": "MODIFIED", "object": api.objects["nodes"]["n1"]}])
    api.watch_answers["pods"].append([])  # quiet, no bookmark: nothing confirms the pods
    assert sh.watch_once(NODES) == WatchEnd.OK and sh.watch_once(PODS) == WatchEnd.OK
    assert sh.view.observed == {"nodes": START + 50, "pods": START}
    assert sh.view.snapshot().observed_at == START  # as old as the staler kind
    bookmark = {"type": "BOOKMARK", "object": {"kind": "Pod", "metadata": {"resourceVersion": str(api.rv)}}}
    api.watch_answers["pods"].append([bookmark])
    sh.watch_once(PODS)
    assert sh.view.snapshot().observed_at == START + 50
    assert sh.informers[PODS].resource_version == str(api.rv)


def test_quiet_pods_for_longer_than_the_staleness_limit_stop_the_controller() -> None:
    sh, api, clock = leading_shell()
    clock.t += S.stale_after_seconds + 1
    api.watch_answers["nodes"].append([{"type": "MODIFIED", "object": api.objects["nodes"]["n1"]}])
    api.watch_answers["pods"].append([])
    sh.watch_once(NODES)
    sh.watch_once(PODS)
    sh.elector.step()
    decision = sh.reconcile()
    assert decision is not None and decision.actions == ()
    assert decision.reasons[-1].startswith("cluster data 61s old")


# -- 3 and 6 as the shell applies and reports them --------------------------------------------------------------


def test_closing_removes_every_copy_of_the_burst_taint_and_adds_one_noschedule() -> None:
    clock = Clock()
    api = MemoryApi(clock)
    api.put(NODES, onprem_node("n1", 8))
    node = virtual_node("vk-a", burst_effect="NoSchedule")
    node["spec"]["taints"].append({**BURST_TAINT, "effect": "NoExecute"})
    api.put(NODES, node)
    sh = BurstShell(S, api, identity="a", clock=clock, monotonic=clock, sleep=clock.sleep)
    assert sh.elector.step() and sh.relist(NODES) and sh.relist(PODS)
    sh.reconcile()
    assert api.objects["nodes"]["vk-a"]["spec"]["taints"] == [VK_TAINT, BURST_TAINT]


def test_training_that_can_never_fit_is_reported_once() -> None:
    sh, api, _clock = leading_shell()
    for i in range(2):
        pod = gpu_pod(f"big-{i}", 8, workload="training", namespace="train", pool="gpu", unschedulable=True)
        pod["metadata"]["annotations"][GANG_ANNOTATION] = "big"
        api.put(PODS, pod)
    sh.relist(PODS)
    sh.reconcile()
    sh.reconcile()
    cannot = [e for e in api.events if e["reason"] == "TrainingCannotFit"]
    assert len(cannot) == 1
    assert cannot[0]["type"] == "Warning" and cannot[0]["involvedObject"]["kind"] == "Lease"
    assert "train/big (2 pods, 16 GPUs) can never fit: gang needs 16 GPUs, pool gpu has 8" in cannot[0]["message"]
    assert sh.metrics.registry.get_sample_value("gpucluster_burst_infeasible_training_gangs") == 1
