"""The scale path on the small shape (66 kwok nodes): what `make bench-scale` runs at 268 and 2,060 nodes.

The prod stack's objects at that size are applied to a real control plane, gangs go through `gpucluster train
submit`, and the report's figures are taken from what the watch, the API server's metrics and its audit log saw.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import bench_scale
from tools.localcluster import control, scale, scalerun
from tools.localcluster.plan import Layout

BUILT = control.DEFAULT_STATE


@pytest.fixture(scope="module")
def result(tmp_path_factory: pytest.TempPathFactory) -> dict:
    missing = control.binaries_missing(Layout(BUILT), (*control.REQUIRED, *control.VOLCANO))
    if missing:
        pytest.skip(f"local control plane not built ({', '.join(missing)} missing in {BUILT / 'bin'}); "
                    "`make localcluster` builds it")
    state: Path = tmp_path_factory.mktemp("scale")
    return scalerun.bench(scale.shape("small"), runs=2, sizes=[16, 32], state=state, timeout=300, storm_faults=[8],
                          crash_sizes=[16], steady_s=20, burst=True)


def test_every_gang_is_bound_and_running_and_its_pods_leave_after_the_cancel(result: dict) -> None:
    assert result["nodes"] == 66 and result["gpus"] == 512
    for size in ("16", "32"):
        gang = result["gangs"][size]
        assert len(gang["runs"]) == 2
        for run in gang["runs"]:
            # Stages in order, each taken when the last of the gang's pods reached it.
            assert 0 < run["all_created_s"] <= run["all_bound_s"] <= run["all_running_s"]
            assert run["first_bound_s"] <= run["all_bound_s"]
            assert run["deleted_s"] >= 0
            assert run["scheduler_cpu_s"] >= 0  # Volcano's own CPU until the last bind, read from /proc
        assert gang["scheduler_cpu_s"]["n"] == 2
        assert result["gang_bind_s"][size]["n"] == 2
        # Placed by the fabric: a gang that fits the pool's one 32-node leaf stays in it.
        assert gang["fewest_leaves"] == 1 and gang["leaves_spanned"]["max"] == 1


def test_the_node_pool_agent_records_every_gpu_node(result: dict) -> None:
    assert "node-pools" not in " ".join(result["agent_notes"])
    assert result["node_pools_converged_s"] is not None and result["node_pools_converged_s"] >= 0


def test_the_stacks_objects_are_applied_and_what_is_left_out_is_counted(result: dict) -> None:
    assert result["objects_applied"] > 2  # the system pool's node patches alone are 2
    assert result["objects_left_out"]["Deployment"] >= 1
    assert result["objects_left_out"][scalerun.NODE_NOT_FAKED] == 2


def test_the_api_servers_cost_is_measured_per_agent(result: dict) -> None:
    p99 = result["apiserver_mutating_p99_s"]
    assert p99 is not None and p99 > 0
    agents = result["requests_per_s_by_agent"]
    # Volcano's controllers created the pods, its scheduler bound them, kwok ran them.
    for agent in ("vc-controller-manager", "vc-scheduler", "kwok"):
        assert agents[agent]["mutating_per_s"] > 0, agents
    usage = result["process_usage_after"]
    assert usage["kube-apiserver"]["rss_mib"] > 0 and usage["etcd"]["rss_mib"] > 0


def test_the_report_section_renders_the_shape(result: dict, tmp_path: Path) -> None:
    path = tmp_path / "results.json"
    scalerun.merge_results(result, path)
    text = bench_scale.to_markdown(bench_scale.run(path))
    assert "| small | 66 | 512 |" in text
    assert "vc-scheduler" in text
    plot = tmp_path / "scale.png"  # drawn beside the results, referenced by the section
    assert plot.is_file() and plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and f"]({plot})" in text


def test_at_rest_no_agent_asks_much_of_the_api_server(result: dict) -> None:
    """Steady state: watches, Lease renewals and each agent's own writes; a list per cycle would show here."""
    steady = result["steady_requests_per_s_by_agent"]
    assert result["steady_window_s"] == 20
    for agent in ("health-guard", "burst-controller", "node-pools"):
        rate = next((v["requests_per_s"] for a, v in steady.items() if a.startswith(agent)), 0.0)
        assert rate < 5, (agent, steady)


def test_a_leaf_switch_down_is_one_switch_fault_and_no_node_is_quarantined_for_it(result: dict) -> None:
    cfg = scale.shape_config(scale.shape("small"), Path(__file__).resolve().parents[1])
    leaf = cfg.pool("h100-a").topology.leaves[0]
    sw = result["switch_fault"]
    assert (sw["leaf"], sw["nodes"]) == (leaf.name, 32)
    assert sw["fenced"] == sw["fenced_naming_the_leaf"] == 32  # the whole leaf, each fence naming its switch
    assert sw["conditions"] == 32  # and its switch condition false on every node of it
    assert sw["quarantined"] == sw["nodes_drained"] == 0 and sw["fenced_outside_the_leaf"] == 0
    assert sw["breaker_tripped"] == 0.0  # the stack's rails never count a switch fault
    assert 0 < sw["min"] <= sw["p50"] <= sw["max"]
    assert sw["to_condition_s"]["p50"] > 0


def test_a_fixed_switch_releases_its_whole_leaf_after_its_repair_mark_and_the_probation(result: dict) -> None:
    sw = result["switch_fault"]
    assert sw["released"] == sw["nodes"] == 32
    assert sw["release_after_repair_s"] >= sw["probation_s"] > 0  # never before the ports held clear that long


def test_the_storm_quarantines_every_faulted_node_and_no_other_and_the_stack_rails_trip_the_breaker(
        result: dict) -> None:
    storm = result["storm_taint_s"]["8"]
    assert storm["tainted"] == storm["faults"] == 8
    assert storm["healthy_nodes_tainted"] == 0
    assert 0 < storm["min"] <= storm["p50"] <= storm["p99"]
    # The guard's own readings: every query of its cycle timed, and the stand-in's scrapes beside the latencies.
    from agents.health_guard.contract import HealthSettings

    assert set(storm["guard_query_mean_s"]) == {*(f"freshness:{e}" for e in HealthSettings().exporters),
                                                *(s.name for s in HealthSettings().signals)}
    assert 0 < storm["fleet_scrape_s"]["mean"] <= storm["fleet_scrape_s"]["max"]
    # Again with the guard polling every second (the stack's is two): every faulted node, no other.
    fast = result["storm_taint_fast_poll_s"]["8"]
    assert result["storm_fast_poll_s"] == 1 and fast["tainted"] == fast["faults"] == 8
    assert fast["healthy_nodes_tainted"] == 0 and fast["tainted_before_the_storm"] == 0
    rails = result["storm_stack_rails"]
    cfg = scale.shape_config(scale.shape("small"), Path(__file__).resolve().parents[1])
    # The prod rails: at most maxNodesPerHour in an hour, then the breaker holds (a person resets it).
    assert rails["tainted"] == min(cfg.observability.health.max_nodes_per_hour,
                                   cfg.observability.health.max_nodes_quarantined)
    assert rails["breaker_tripped"] == 1.0
    assert rails["healthy_nodes_tainted"] == 0 and rails["tainted_before_the_storm"] == 0
    assert result["breaker_tripped_at"] == rails["tainted"]


def test_a_fatal_fault_under_a_running_gang_restarts_it_whole_on_other_nodes(result: dict) -> None:
    crash = result["crash"]["16"]
    assert len(crash["runs"]) == 2
    for run in crash["runs"]:
        # Each term measured, in order: the taint, every old pod leaving, then gone, the new generation bound, then
        # Running.
        assert run["detect_s"] >= 0 and run["from_fault_s"] >= run["detect_s"]
        assert 0 <= run["evict_s"] <= run["gone_s"] and run["reschedule_s"] > 0
        assert run["running_again_s"] >= run["from_fault_s"] + run["gone_s"] + run["reschedule_s"] - 0.05
        # What bounds the eviction, from the audit log: Volcano's job controller writes each of the gang's other
        # pods (an out-of-sync patch, then a delete) one after another.
        writes = run["evict_writes_by_volcano"]
        assert writes["calls"] >= 15 and writes["most_in_flight"] == 1 and writes["p50_s"] > 0
    assert result["gang_evict_s"]["16"]["n"] == 2 and result["gang_running_again_s"]["16"]["p50"] > 0


def test_the_burst_at_scale_releases_the_gang_early_and_runs_every_phase(result: dict) -> None:
    """The services at maxReplicas, a gang over a whole pool while other training leaves on-prem short. The standby
    asked for is larger than the providers hold, so the gate must not wait its timeout, and is cut to what they
    placed, so the PDBs let the return through. The phases of the local e2e are then reached, in its order, up to the
    return."""
    burst = result["burst"]
    phases = burst["phases"]
    assert burst["sampler_errors"] == [], burst["sampler_errors"]
    assert burst["stalled"] is None, burst["stalled"]
    assert phases["time_to_ungate_s"] < scale.quick_burst(control.ROOT)["burst"]["handover"]["timeoutSeconds"], phases
    assert set(phases) >= {"time_to_preempt_s", "time_to_open_s", "time_to_gang_running_s", "time_to_close_s"}, phases
    assert phases["time_to_ungate_s"] <= phases["time_to_gang_running_s"]
    # A standby the providers cannot hold whole asks only for what was placed (its unplaced pods would count as
    # expected in the service's PDB, which would then allow no disruption and the descheduler move nothing home).
    assert burst["return_blocked"] is None, burst["return_blocked"]
    assert phases["time_to_close_s"] <= phases["time_to_return_s"] <= phases["time_to_return_standby_gone_s"]
    assert burst["most_external_ready"] > 0  # the displaced replicas ran on the virtual nodes
    # The controller's evictions, if any (the clearing is off by default), went through the Eviction API.
    assert set(burst["burst_controller_evictions"]) <= {"201", "429"}, burst["burst_controller_evictions"]
    # Never a NoExecute taint, never a service under its minReplicas, never more evictions a cycle than allowed.
    assert burst["burst_taint_effects"] == ["NoSchedule"]
    assert all(burst["fewest_ready"][s] >= n for s, n in burst["min_replicas"].items()), burst["fewest_ready"]
    cycles = burst["descheduler_evictions_per_cycle"]
    assert cycles and max(cycles) <= burst["descheduler_limit"], cycles
    # The simulator's prediction for the same shape sits beside every phase.
    assert {row["phase"] for row in burst["side_by_side"]} >= set(phases)
    assert all(row["simulated_s"] is not None for row in burst["side_by_side"]), burst["side_by_side"]
