"""Warm external capacity in the simulator: placeholders on open virtual nodes, a replica taking a ready one of
its service over (a warm start), any replica preempting them, their GPU·h, the invariants, and the controller
keeping the pool on the small stack exactly as with every tick decided."""

from __future__ import annotations

from dataclasses import replace

import pytest

from bench.sim.cost import CostedSimulator
from bench.sim.engine import Simulator, simulate
from bench.sim.model import ProviderModel
from bench.sim.objects import POD_READY, WARM_READY
from bench.sim.policies import CONTROLLER, Policy
from bench.sim.workload import Workload
from tests.test_sim import FLAT, HANDOVER, ONE, OURS, quiet_and_exact, small_stack

WARM = replace(OURS, settings=HANDOVER.replace(warm_pool_share=1.0))
COLD_S, WARM_S = ONE.latencies.external_start_s, ONE.latencies.external_warm_start_s


def idle(room: tuple[int, int] = (16, 100)) -> Simulator:
    """The one-node cluster without demand or training, its virtual node open and not yet run."""
    model = replace(ONE, providers=(ProviderModel("cloud", "vk-cloud", *room),))
    sim = Simulator(model, Workload((), (), FLAT), WARM, 6000.0, check=True)
    sim.cluster.vn_taint[0] = None
    return sim


def scale_warm(sim: Simulator, target: int) -> None:
    c = sim.cluster
    c.services[0].warm_target = target
    c.warm_dirty = True
    sim.scheduler.run_pass()
    c.check()


def ready_at(sim: Simulator, kind: int, arg: int) -> float:
    return next(t for t, _, k, a in sim.events.heap if (k, a) == (kind, arg))


def replica(sim: Simulator) -> int:
    """One more replica of the service, placed on the virtual node (on-prem is out of the picture)."""
    c = sim.cluster
    c.services[0].replicas += 1
    pod = c.new_pod(0)
    assert sim.scheduler.place_virtual(pod, any_taint=False)
    c.check()
    return pod.id


def test_a_replica_beside_a_ready_placeholder_of_its_service_starts_warm() -> None:
    sim = idle()
    c = sim.cluster
    scale_warm(sim, 1)
    (wid,) = c.warm
    assert (c.warm_gpus, c.ext_gpus, c.vn_warm_gpus) == (1, 0, [1])
    assert ready_at(sim, WARM_READY, wid) == COLD_S  # a placeholder's own start is a cold one
    c.warm_became_ready(wid)
    pid = replica(sim)
    assert ready_at(sim, POD_READY, pid) == WARM_S
    # It took the placeholder's place; the Deployment recreates one, which starts cold again.
    assert wid not in c.warm and c.vn_used == [1] and c.warm_dirty
    sim.scheduler.run_pass()
    c.check()
    (again,) = c.warm
    assert c.warm[again][2] == 0 and c.warm_gpus == 1


def test_a_placeholder_not_yet_warm_gives_a_cold_start() -> None:
    sim = idle()
    scale_warm(sim, 1)
    pid = replica(sim)
    assert ready_at(sim, POD_READY, pid) == COLD_S
    assert sim.cluster.warm_gpus == 1  # room for both: nothing preempted


@pytest.mark.parametrize("room", [(2, 100), (16, 2)], ids=["gpu-room", "pod-room"])
def test_any_replica_preempts_a_placeholder_for_room(room: tuple[int, int]) -> None:
    sim = idle(room)
    c = sim.cluster
    scale_warm(sim, 2)
    assert c.warm_gpus == 2 and not c.warm_ready
    pid = replica(sim)
    assert ready_at(sim, POD_READY, pid) == COLD_S
    assert (c.vn_used, c.warm_gpus, c.services[0].warm_count) == ([1], 1, 1)
    # The Deployment still wants two: the second waits for room (none), and the controller sees both.
    sim.scheduler.run_pass()
    c.check()
    assert c.services[0].warm_count == 1 and sim.controller is not None
    assert sim.controller.port.service_replicas()["svc"].warm_live == 2  # type: ignore[attr-defined]
    # Room comes back when the replica goes: the placeholder is placed again.
    c.services[0].replicas -= 1
    c.remove_pod(c.pods[pid])
    sim.scheduler.run_pass()
    c.check()
    assert c.services[0].warm_count == 2


def test_placeholders_land_only_on_open_nodes_and_scale_down_at_once() -> None:
    sim = idle()
    c = sim.cluster
    c.vn_taint[0] = "NoSchedule"
    scale_warm(sim, 2)
    assert c.warm_gpus == 0  # they do not tolerate the burst taint
    c.vn_taint[0] = None
    c.capacity_changed = True
    sim.scheduler.run_pass()
    assert c.warm_gpus == 2
    scale_warm(sim, 0)
    assert (c.warm, c.warm_gpus, c.vn_warm_gpus) == ({}, 0, [0])


def test_placeholders_count_in_the_external_gpu_hours_and_the_bill() -> None:
    model = replace(ONE, providers=(ProviderModel("cloud", "vk-cloud", 16, 100, 2.0),))
    sim = CostedSimulator(model, Workload((), (), FLAT), WARM, 7200.0)
    c = sim.cluster
    c.vn_taint[0] = None
    scale_warm(sim, 2)
    replica(sim)
    sim._integrate(0.0, 3600.0)
    out = sim._outcome(0.0)
    assert (out.warm_gpu_hours, out.external_gpu_hours) == pytest.approx((2.0, 3.0))
    assert sim.vn_gpu_seconds == [3 * 3600.0]


def test_the_invariants_catch_misfiled_placeholders() -> None:
    sim = idle()
    c = sim.cluster
    scale_warm(sim, 2)
    c.vn_warm_gpus[0] += 1
    with pytest.raises(AssertionError):
        c.check()
    c.vn_warm_gpus[0] -= 1
    c.services[0].warm_target = 1  # more placed than the Deployment wants
    with pytest.raises(AssertionError, match="placeholders"):
        c.check()


def test_the_controller_keeps_a_warm_pool_and_quiet_ticks_change_nothing() -> None:
    model, settings, workload = small_stack()
    warm = Policy("controller", CONTROLLER, settings.replace(warm_pool_share=0.25, warm_pool_ramp_seconds=180.0),
                  model.descheduler)
    sims, quiet, _ = quiet_and_exact(model, workload, warm, check=True)
    assert sims[0].controller is not None and sims[0].controller.stats.warm_scales > 0
    assert 0 < quiet.warm_gpu_hours < quiet.external_gpu_hours
    base = simulate(model, workload, replace(warm, settings=settings), 0.5 * 86400, 0.25 * 86400)
    assert base.warm_gpu_hours == 0.0
    # Everything left closed at the end holds no placeholder.
    c = sims[0].cluster
    if all(t is not None for t in c.vn_taint):
        assert c.warm_gpus == 0
