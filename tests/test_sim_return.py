"""The make-before-break return in the simulator: bridge pods on-prem only (they wait unplaced for room), an
eviction only under the PDB with the replacement placed on-prem at once, the invariants, and the controller on
the small stack bringing external replicas home while the burst is open, with no availability lost, fewer
external GPU·h, and quiet ticks equal to exact ones."""

from __future__ import annotations

from dataclasses import replace

import pytest

from bench.sim.engine import Simulator, simulate
from bench.sim.objects import PENDING
from bench.sim.policies import CONTROLLER, Policy
from bench.sim.workload import Workload
from tests.test_sim import FLAT, HANDOVER, ONE, OURS, quiet_and_exact, small_stack

HOME = replace(OURS, settings=HANDOVER.replace(return_surge_share=1.0))


def idle() -> Simulator:
    sim = Simulator(ONE, Workload((), (), FLAT), HOME, 6000.0, check=True)
    sim.cluster.vn_taint[0] = None
    return sim


def test_bridge_pods_go_on_prem_only_and_wait_when_there_is_no_room() -> None:
    sim = idle()
    c, s = sim.cluster, 0
    free = c.onprem_free_gpus()
    g = c.services[s].gpus
    sim.port.set_return(c.services[s].name, free // g + 1)
    svc = c.services[s]
    assert len(svc.rt_pending) == 1 and len(c.rt_pending) == 1  # the one that found no on-prem room
    assert all(c.pods[p].node >= 0 for p in svc.rt_starting)
    assert c.ext_gpus == 0  # never on a virtual node, open as it is
    c.check()
    sim.port.set_return(svc.name, 0)
    assert svc.rt_count() == 0 and not c.rt_pending
    c.check()


def test_an_eviction_obeys_the_pdb_and_its_replacement_lands_on_prem() -> None:
    sim = idle()
    c = sim.cluster
    svc = c.services[0]
    # Two replicas on the virtual node, Ready (as if the burst had put them there).
    svc.replicas = 2
    for _ in range(2):
        pod = c.new_pod(0)
        c.bind_virtual(pod, 0)
        c.start_pod(pod, 0.0)
    assert svc.ready_ext == 2
    c.check()
    ext = list(svc.ready)
    unready = c.new_pod(0)  # a third main pod not Ready: the PDB (maxUnavailable) has nothing left to give
    svc.replicas = 3
    c.bind_virtual(unready, 0)
    c.start_pod(unready, 1000.0)
    if svc.maxunav <= 1:
        assert not sim.port.evict("inference", f"p{ext[0]}")
    c.remove_pod(unready)
    svc.replicas = 2
    assert sim.port.evict("inference", f"p{ext[0]}")
    assert sim.counters.return_evictions == 1 and svc.ready_ext == 1
    new = [c.pods[p] for p in (*svc.pending, *svc.starting)]
    assert len(new) == 1 and new[0].node >= 0 and new[0].replacement  # on-prem, a replacement
    assert not sim.port.evict("inference", f"p{ext[0]}")  # already gone
    c.check()


def test_the_invariants_catch_a_misfiled_bridge_pod() -> None:
    sim = idle()
    c = sim.cluster
    sim.port.set_return(c.services[0].name, 1)
    pid = next(iter(c.services[0].rt_starting))
    c.pods[pid].home = False
    with pytest.raises(AssertionError, match="misfiled"):
        c.check()
    c.pods[pid].home = True
    c.services[0].rt_replicas = 2
    with pytest.raises(AssertionError, match="bridge"):
        c.check()


def test_the_controller_brings_replicas_home_without_a_dip_and_quiet_ticks_change_nothing() -> None:
    model, settings, workload = small_stack()
    home = Policy("controller", CONTROLLER, settings.replace(return_surge_share=0.25), model.descheduler)
    sims, quiet, _ = quiet_and_exact(model, workload, home, check=True)
    assert sims[0].counters.return_evictions > 0
    base = simulate(model, workload, replace(home, settings=settings), 0.5 * 86400, 0.25 * 86400)
    # Make before break: no availability lost, and the replicas that waited on open virtual nodes while
    # on-prem had room come home (fewer external GPU·h, that wait and the descheduler's wait both shorter).
    assert quiet.inference_availability >= base.inference_availability
    assert quiet.worst_window_availability >= base.worst_window_availability
    assert quiet.external_gpu_hours < base.external_gpu_hours
    assert quiet.movable_gpu_hours < base.movable_gpu_hours
    assert quiet.returning_gpu_hours <= base.returning_gpu_hours
    assert quiet.taint_flips <= base.taint_flips
    # Bridge pods are on-prem: none of the external GPU·h is theirs; nothing is left running at the end
    # that the core no longer wants.
    c = sims[0].cluster
    assert all(c.pods[p].node >= 0 for svc in c.services for p in (*svc.rt_starting, *svc.rt_ready))
    assert all(c.pods[p].state == PENDING for p in c.rt_pending)
