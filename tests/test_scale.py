"""The scale shapes, the control plane's tuning for them and the measurements (pure parts; no cluster)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agents.node_pools.contract import parse_settings
from agents.node_pools.decide import node_patch
from components.config import ConfigError, parse_config
from components.mockrt import raw_from_stack
from tools.localcluster import scale, scalerun
from tools.localcluster.plan import Layout as PlanLayout
from tools.localcluster.plan import component_commands, volcano_controller_flags
from tools.localcluster.scalemeasure import (
    GangTimes,
    Generations,
    agent_of,
    histogram_quantile,
    parse_histogram,
    percentiles,
    requests_by_agent,
    writes_of,
)

ROOT = Path(__file__).resolve().parents[1]


# --------------------------------------------------------------------------- shapes


@pytest.mark.parametrize(("name", "gpu_nodes", "system_nodes", "gpus"), [
    ("small", 64, 2, 512), ("prod", 256, 12, 2048), ("llama3", 2048, 12, 16384)])
def test_each_shape_has_its_size(name: str, gpu_nodes: int, system_nodes: int, gpus: int) -> None:
    plan = scale.shape_plan(scale.shape(name), ROOT)
    assert len(plan.by_kind("gpu")) == gpu_nodes
    assert len(plan.by_kind("system")) == system_nodes
    assert plan.onprem_gpus == gpus
    assert len({n.name for n in plan.nodes}) == len(plan.nodes)


def test_the_prod_shape_is_the_prod_stack_as_declared() -> None:
    """The stack as declared, but for restart in place, which kwok's process-less pods cannot do, and warm spares
    (the gangs measured take whole pools)."""
    values = scale.shape_values(scale.shape("prod"), ROOT)
    assert values["training"].pop("restartInPlace") == {"enabled": False}
    assert [p.pop("spareNodes") for p in values["pools"]] == [0, 0]
    assert values == raw_from_stack("prod")


def test_a_resized_shape_keeps_the_teams_share_of_the_gpus_and_validates() -> None:
    prod = {t["name"]: t for t in raw_from_stack("prod")["scheduling"]["teams"]}
    for name, ratio in (("small", 512 / 2048), ("llama3", 16384 / 2048)):
        values = scale.shape_values(scale.shape(name), ROOT)
        for team in values["scheduling"]["teams"]:
            assert team["guaranteeGpus"] == int(prod[team["name"]]["guaranteeGpus"] * ratio)
            if team is values["scheduling"]["teams"][0]:
                assert "capabilityGpus" not in team  # the gang team may use the whole cluster
                assert scale.gang_team(scale.shape(name), ROOT) == team["name"]
            else:
                assert team["capabilityGpus"] == int(prod[team["name"]]["capabilityGpus"] * ratio)
        assert values["training"]["jobs"] == []
        parse_config(values, f"scale shape {name}")  # the whole stack's rules, not only the cluster shape


def test_an_unknown_shape_is_refused_listing_the_known_ones() -> None:
    with pytest.raises(ValueError, match=r"unknown scale shape 'huge'; known: small, prod, llama3"):
        scale.shape("huge")


def test_every_gang_size_of_a_shape_fits_its_largest_pool() -> None:
    for sh in scale.SHAPES.values():
        plan = scale.shape_plan(sh, ROOT)
        largest = max(sum(n.pool == p for n in plan.by_kind("gpu")) for p in {n.pool for n in plan.by_kind("gpu")})
        assert sh.gang_sizes and max(sh.gang_sizes) <= largest, sh.name


def test_kwok_nodes_carry_the_labels_and_taints_the_node_pool_agent_applies() -> None:
    """The agent finds only its record to add: the plan is the stack's own pools."""
    sh = scale.shape("small")
    plan = scale.shape_plan(sh, ROOT)
    cm = next(o for o in scalerun.stack_objects(sh) if o["kind"] == "ConfigMap"
              and o["metadata"]["name"] == "node-pools-settings")
    pools = parse_settings(json.loads(cm["data"]["settings.json"]))
    members = pools.membership()
    assert {n.name for n in plan.by_kind("gpu")} == set(members)
    for node in plan.by_kind("gpu"):
        patch = node_patch(node.manifest(plan.gpu_resource), members[node.name], pools.applied_annotation)
        assert patch is not None and set(patch) == {"metadata"}
        assert set(patch["metadata"]) == {"resourceVersion", "annotations"}


# --------------------------------------------------------------------------- what is applied


def test_workloads_missing_crds_and_virtual_node_patches_are_left_out_and_counted() -> None:
    sh = scale.shape("small")
    plan = scale.shape_plan(sh, ROOT)
    objects = scalerun.stack_objects(sh)
    keep, left = scalerun.split_objects(objects, {n.name for n in plan.kwok_nodes})
    assert sum(left.values()) + len(keep) == len(objects)
    assert left[scalerun.NODE_NOT_FAKED] == len(plan.by_kind("virtual"))
    assert left["Deployment"] and left["APIService"]
    kinds = [o["kind"] for o in keep]
    assert not set(kinds) & set(scalerun.LEFT_OUT)
    # What others refer to comes first; each kind is one run (applied side by side).
    assert kinds.index("Namespace") < kinds.index("Queue") < kinds.index("ValidatingAdmissionPolicyBinding")
    runs = [k for i, k in enumerate(kinds) if i == 0 or kinds[i - 1] != k]
    assert len(runs) == len(set(runs))
    # Only the system pool's nodes are patched one by one; the GPU pools are the node-pool agent's ConfigMap.
    node_names = {o["metadata"]["name"] for o in keep if o["kind"] == "Node"}
    assert node_names == {n.name for n in plan.by_kind("system")}


# --------------------------------------------------------------------------- tuning


def _commands(tmp_path: Path) -> dict[str, list[str]]:
    ports = {name: 10000 + i for i, name in enumerate(("etcd", "etcd_peer", "apiserver", "kwok",
                                                        "vc_scheduler_metrics", "vc_scheduler_healthz",
                                                        "vc_controller_metrics", "vc_controller_healthz",
                                                        "descheduler"))}
    return component_commands(PlanLayout(tmp_path), ports)


def test_tuning_replaces_a_flag_already_set_instead_of_repeating_it(tmp_path: Path) -> None:
    cmds = _commands(tmp_path)
    tuning = scale.Tuning((scale.Setting("kwok", "--node-lease-duration-seconds", "60", "why"),
                           scale.Setting("kube-apiserver", "--max-requests-inflight", "900", "why")))
    tuned = tuning.apply(cmds)
    assert [a for a in tuned["kwok"] if a.startswith("--node-lease-duration-seconds")] == [
        "--node-lease-duration-seconds=60"]
    assert tuned["kube-apiserver"][-1] == "--max-requests-inflight=900"
    assert tuned["etcd"] == cmds["etcd"]


def test_tuning_for_a_component_the_control_plane_does_not_run_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="does not run: kube-proxy"):
        scale.Tuning((scale.Setting("kube-proxy", "--x", "1", "why"),)).apply(_commands(tmp_path))


def test_small_clusters_run_stock_settings_and_large_ones_name_a_reason_for_each() -> None:
    assert scale.tuning_for(66).settings == ()
    big = scale.tuning_for(2060)
    assert big.settings and all(s.why for s in big.settings)
    flags = {(s.component, s.flag): int(s.value) for s in big.settings if s.value.isdigit()}
    assert flags[("kube-apiserver", "--max-requests-inflight")] > 400
    assert flags[("kube-apiserver", "--max-mutating-requests-inflight")] > 200
    assert big.kwok_options["nodeLeaseParallelism"] > 4
    assert big.kwok_options["podPlayStageParallelism"] == 4  # more races on pod IPs; left out it would be 0
    doc = big.kwok_config()
    assert "kind: KwokConfiguration" in doc and "kind: Stage" not in doc


def test_the_local_volcano_controllers_run_at_the_stacks_client_rate() -> None:
    cfg = scale.shape_config(scale.shape("prod"), ROOT)
    rate = cfg.scheduling.controller_client
    assert volcano_controller_flags(cfg) == [f"--kube-api-qps={rate.qps}", f"--kube-api-burst={rate.burst}"]


def test_a_client_burst_below_its_rate_is_refused_naming_the_key() -> None:
    raw = raw_from_stack("prod")
    raw["scheduling"]["controllerClient"] = {"qps": 400, "burst": 100}
    with pytest.raises(ConfigError, match=r"scheduling\.controllerClient.*burst \(100\) must be at least qps \(400\)"):
        parse_config(raw, "Pulumi.prod.yaml")


# --------------------------------------------------------------------------- measurements


def test_gang_times_report_when_the_last_pod_reached_each_stage() -> None:
    times = GangTimes(start=100.0)
    for i in range(3):
        times.see(f"p{i}", bound=False, phase="Pending", now=100.5 + i, gated=True)
    for i in range(3):
        times.see(f"p{i}", bound=False, phase="Pending", now=103.0 + i / 10)
    for i in range(3):
        times.see(f"p{i}", bound=True, phase="Pending", now=104.0 + i, node=f"gpu-a-{i:03d}")
        times.see(f"p{i}", bound=True, phase="Running", now=104.5 + i, node=f"gpu-a-{i:03d}")
    times.see("p0", bound=True, phase="Running", now=200.0)  # a later event changes no first time
    assert sorted(times.nodes()) == ["gpu-a-000", "gpu-a-001", "gpu-a-002"]
    assert times.summary(3) == {"all_created_s": 2.5, "all_ungated_s": 3.2, "first_bound_s": 4.0,
                                "all_bound_s": 6.0, "all_running_s": 6.5}
    assert times.running() == 3
    times.see("p1", bound=True, phase="Running", now=210.0, deleted=True)
    assert times.running() == 2 and times.alive() == 2
    assert sorted(times.nodes()) == ["gpu-a-000", "gpu-a-002"]  # the gang's live pods only


def test_a_partial_gang_is_an_error_naming_the_stage_never_a_figure() -> None:
    times = GangTimes(start=0.0)
    times.see("a", bound=True, phase="Running", now=1.0)
    times.see("b", bound=True, phase="Pending", now=1.0)
    with pytest.raises(ValueError, match="1 of 2 pods reached 'running'"):
        times.summary(2)


@given(st.lists(st.floats(min_value=0, max_value=1e6, allow_nan=False), min_size=1, max_size=50))
def test_percentiles_are_observed_values_ordered_by_rank(values: list[float]) -> None:
    p = percentiles(values)
    assert {p["p50"], p["p90"], p["p99"]} <= set(values)
    assert p["min"] <= p["p50"] <= p["p90"] <= p["p99"] <= p["max"]
    assert p["n"] == len(values)


def test_percentiles_of_nothing_are_refused() -> None:
    with pytest.raises(ValueError, match="no values"):
        percentiles([])


HISTOGRAM = """# HELP apiserver_request_duration_seconds x
# TYPE apiserver_request_duration_seconds histogram
apiserver_request_duration_seconds_bucket{verb="POST",resource="pods",le="0.1"} 80
apiserver_request_duration_seconds_bucket{verb="POST",resource="pods",le="1"} 98
apiserver_request_duration_seconds_bucket{verb="POST",resource="pods",le="+Inf"} 100
apiserver_request_duration_seconds_sum{verb="POST",resource="pods"} 9
apiserver_request_duration_seconds_count{verb="POST",resource="pods"} 100
apiserver_request_duration_seconds_bucket{verb="GET",resource="pods",le="0.1"} 0
apiserver_request_duration_seconds_bucket{verb="GET",resource="pods",le="1"} 0
apiserver_request_duration_seconds_bucket{verb="GET",resource="pods",le="+Inf"} 1000
"""


def test_the_api_servers_histogram_is_read_for_the_verbs_asked_and_its_quantile_as_prometheus_takes_it() -> None:
    buckets = parse_histogram(HISTOGRAM, "apiserver_request_duration_seconds", {"verb": ("POST", "PUT")})
    assert buckets == {0.1: 80.0, 1.0: 98.0, math.inf: 100.0}
    assert histogram_quantile(0.5, buckets) == pytest.approx(0.0625)
    assert histogram_quantile(0.9, buckets) == pytest.approx(0.1 + 0.9 * 10 / 18)
    assert histogram_quantile(0.99, buckets) == 1.0  # in the +Inf bucket: the largest finite bound
    assert histogram_quantile(0.99, {0.1: 0.0, math.inf: 0.0}) is None


def test_mutating_calls_are_told_apart_per_resource_and_verb_as_the_slo_takes_them() -> None:
    """The aggregate p99 hides which call is slow; the SLI is per (resource, verb): the slowest kinds are named,
    counted over the window only (the scrape before is subtracted), reads left out."""
    from tools.localcluster.scalerun import mutating_p99, mutating_p99_by_call

    def exposition(rows: list[tuple[str, str, str, tuple[int, int, int]]]) -> str:
        lines = ["# TYPE apiserver_request_duration_seconds histogram"]
        for verb, resource, sub, counts in rows:
            labels = f'verb="{verb}",resource="{resource}"' + (f',subresource="{sub}"' if sub else "")
            lines += [f"apiserver_request_duration_seconds_bucket{{{labels},le=\"{le}\"}} {n}"
                      for le, n in zip(("0.1", "8", "+Inf"), counts, strict=True)]
        return "\n".join(lines) + "\n"

    before = exposition([("PATCH", "pods", "status", (50, 50, 50)), ("POST", "pods", "binding", (10, 10, 10)),
                         ("GET", "nodes", "", (0, 0, 0))])
    after = exposition([("PATCH", "pods", "status", (150, 150, 150)), ("POST", "pods", "binding", (10, 100, 110)),
                        ("GET", "nodes", "", (0, 0, 9000))])
    calls = mutating_p99_by_call(before, after)
    assert list(calls) == ["POST pods/binding", "PATCH pods/status"]
    assert calls["POST pods/binding"] == {"p99_s": 8.0, "calls": 100}  # 10 of 100 past 8 s: the largest bound
    assert calls["PATCH pods/status"]["calls"] == 100 and calls["PATCH pods/status"]["p99_s"] <= 0.1
    assert mutating_p99(before, after) == 8.0  # rank 198 of 200, past the 190 under 8 s
    assert mutating_p99_by_call(after, after) == {}  # nothing in the window


def test_text_that_is_not_an_exposition_is_an_error() -> None:
    with pytest.raises(ValueError, match="not Prometheus text exposition"):
        parse_histogram("apiserver_request_duration_seconds_bucket{le=0.1 oops", "apiserver_request_duration_seconds")


@given(st.lists(st.integers(min_value=0, max_value=1000), min_size=1, max_size=8), st.floats(0, 1), st.floats(0, 1))
def test_histogram_quantiles_are_monotone_and_within_the_bounds(increments: list[int], q1: float, q2: float) -> None:
    bounds = [0.005 * 2**i for i in range(len(increments))] + [math.inf]
    counts, total = [], 0
    for inc in [*increments, 0]:
        total += inc
        counts.append(float(total))
    buckets = dict(zip(bounds, counts, strict=True))
    a, b = histogram_quantile(min(q1, q2), buckets), histogram_quantile(max(q1, q2), buckets)
    if total == 0:
        assert a is None and b is None
        return
    assert a is not None and b is not None
    assert 0 <= a <= b <= bounds[-2]


def _event(ts: str, agent: str, verb: str, user: str = "admin") -> dict[str, object]:
    return {"requestReceivedTimestamp": ts, "userAgent": agent, "verb": verb, "user": {"username": user}}


def test_requests_per_agent_in_a_window() -> None:
    events = [
        _event("2026-12-06T05:00:00.500000Z", "vc-scheduler/v1.14.1 (linux/amd64) kubernetes/abc", "update"),
        _event("2026-12-06T05:00:01.000000Z", "vc-scheduler/v1.14.1 (linux/amd64) kubernetes/abc", "get"),
        _event("2026-12-06T05:00:01.500000Z", "OpenAPI-Generator/37.0.2/python", "create", "system:admin"),
        _event("2026-12-06T05:00:09.000000Z", "kwok/v0.8.0", "patch"),  # outside the window
        {"userAgent": "no-timestamp", "verb": "get"},
        _event("not a time", "bad", "get"),
    ]
    start = 1796533200.0  # 2026-12-06T05:00:00Z
    rates = requests_by_agent(events, start, start + 2)
    assert rates == {"vc-scheduler": {"requests_per_s": 1.0, "mutating_per_s": 0.5, "requests": 2},
                     "OpenAPI-Generator (system:admin)": {"requests_per_s": 0.5, "mutating_per_s": 0.5,
                                                          "requests": 1}}
    with pytest.raises(ValueError, match="empty window"):
        requests_by_agent(events, start, start)


VC = "vc-controller-manager/v1.14.1 (linux/amd64) kubernetes/abc"
T0 = 1796533200.0  # 2026-12-06T05:00:00Z


def _write(start: float, seconds: float, verb: str = "delete", resource: str = "pods", ua: str = VC,
           subresource: str | None = None) -> dict[str, object]:
    def stamp(t: float) -> str:
        from datetime import UTC, datetime

        return datetime.fromtimestamp(T0 + t, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")

    ref = {"resource": resource, **({"subresource": subresource} if subresource else {})}
    return {"stage": "ResponseComplete", "verb": verb, "userAgent": ua, "objectRef": ref,
            "requestReceivedTimestamp": stamp(start), "stageTimestamp": stamp(start + seconds)}


def test_a_writer_one_call_after_another_is_told_from_one_in_parallel() -> None:
    serial = [_write(i * 0.1, 0.08, "patch" if i % 2 == 0 else "delete") for i in range(10)]
    noise = [
        _write(0.05, 0.5, ua="kwok/v0.8.0"),  # another agent
        _write(0.05, 0.5, resource="nodes"),  # another resource
        _write(0.05, 0.5, subresource="status"),  # a status write is not the pod's
        _write(0.05, 0.5, verb="get"),  # not a write
        _write(50.0, 0.5),  # outside the window
        {**_write(0.05, 0.5), "stage": "ResponseStarted"},
        {**_write(0.05, 0.5), "stageTimestamp": "not a time"},
    ]
    assert writes_of(serial + noise, "vc-controller-manager", "pods", T0, T0 + 5) == {
        "calls": 10, "p50_s": 0.08, "most_in_flight": 1}
    parallel = [_write(0.01 * i, 0.5) for i in range(16)]
    assert writes_of(parallel, "vc-controller-manager", "pods", T0, T0 + 5)["most_in_flight"] == 16
    # the next generation's creates go side by side, and are not the kill's writes
    creates = [_write(0.5 + 0.01 * i, 0.5, "create") for i in range(16)]
    assert writes_of(serial + creates, "vc-controller-manager", "pods", T0, T0 + 5)["most_in_flight"] == 1
    assert writes_of(creates, "vc-controller-manager", "pods", T0, T0 + 5, verbs=("create",))["calls"] == 16
    with pytest.raises(ValueError, match="no pods write by vc-controller-manager"):
        writes_of(noise, "vc-controller-manager", "pods", T0, T0 + 5)


@given(st.lists(st.tuples(st.integers(0, 1000), st.integers(0, 300)), min_size=1, max_size=40))
def test_the_most_in_flight_is_the_largest_overlap(spans: list[tuple[int, int]]) -> None:
    events = [_write(start / 100, length / 100) for start, length in spans]
    got = writes_of(events, "vc-controller-manager", "pods", T0, T0 + 20)
    ms = [(round(a / 100, 6), round((a + n) / 100, 6)) for a, n in spans]
    # at each start, the calls already begun and not yet ended (one ending as another begins does not overlap)
    brute = max(sum(1 for a, b in ms if a <= t and (b > t or a == b == t)) for t, _ in ms)
    assert got["calls"] == len(spans)
    assert 1 <= got["most_in_flight"] <= len(spans)
    assert got["most_in_flight"] == brute


@pytest.mark.parametrize(("ua", "user", "agent"), [
    ("vc-controller-manager/v0.0.0 (linux/amd64) kubernetes/$Format", None, "vc-controller-manager"),
    ("kube-apiserver/v1.35.3", "system:apiserver", "kube-apiserver"),
    ("", "system:admin", "unknown (system:admin)"),
    (None, None, "unknown"),
    ("Go-http-client/2.0", "system:serviceaccount:x:y", "Go-http-client (system:serviceaccount:x:y)"),
])
def test_agent_names(ua: str | None, user: str | None, agent: str) -> None:
    assert agent_of(ua, user) == agent


def test_results_keep_the_last_run_of_each_shape(tmp_path: Path) -> None:
    path, none = tmp_path / "results.json", tmp_path / "no-report.json"
    scalerun.merge_results({"shape": "small", "nodes": 66, "gangs": {}}, path, none)
    scalerun.merge_results({"shape": "prod", "nodes": 268, "gangs": {}}, path, none)
    scalerun.merge_results({"shape": "small", "nodes": 67, "gang_bind_s": {}, "gangs": {}}, path, none)
    scalerun.merge_results({"shape": "small", "pulumi_up_s": 12.5}, path, none)
    shapes = json.loads(path.read_text())["shapes"]
    assert {k: v["nodes"] for k, v in shapes.items()} == {"small": 67, "prod": 268}
    assert shapes["small"]["pulumi_up_s"] == 12.5 and shapes["small"]["gang_bind_s"] == {}
    assert {"measured_bench", "measured_pulumi"} <= set(shapes["small"])


def test_a_machine_without_results_starts_from_the_committed_report_and_a_storm_run_keeps_the_gangs(
        tmp_path: Path) -> None:
    """A fresh clone has no results of its own: one shape's storm run must not drop the other shapes, nor its own
    gang figures, from the report; it is dated apart from them."""
    report = tmp_path / "report.json"
    report.write_text(json.dumps({"benchmarks": {"bench_scale": {"result": {"shapes": {
        "prod": {"shape": "prod", "nodes": 268, "cpu_cores_during_runs": 1.5},
        "llama3": {"shape": "llama3", "nodes": 2060, "gangs": {"2048": {}}, "measured_bench": "then"}}}}}}))
    path = tmp_path / "results.json"
    scalerun.merge_results({"shape": "llama3", "nodes": 2060, "storm_taint_s": {"150": {}}}, path, report)
    shapes = json.loads(path.read_text())["shapes"]
    assert set(shapes) == {"prod", "llama3"} and "cpu_cores_during_runs" not in shapes["prod"]
    assert shapes["llama3"]["gangs"] == {"2048": {}} and shapes["llama3"]["storm_taint_s"] == {"150": {}}
    assert shapes["llama3"]["measured_bench"] == "then" and "measured_storms" in shapes["llama3"]
    # A burst run alone is dated as one, not as storms it did not run.
    scalerun.merge_results({"shape": "llama3", "nodes": 2060, "burst": {"phases": {}}}, path, report)
    again = json.loads(path.read_text())["shapes"]["llama3"]
    assert "measured_burst" in again and again["measured_storms"] == shapes["llama3"]["measured_storms"]
    for broken in ("", "[]", '{"benchmarks": {"bench_scale": {"result": {"shapes": []}}}}'):
        report.write_text(broken)
        assert scalerun.committed_shapes(report) == {}


# --------------------------------------------------------------------------- the storm's schedule


@given(st.integers(min_value=1, max_value=300), st.integers(min_value=0, max_value=2**31))
def test_a_storm_faults_distinct_nodes_spread_over_the_fleet_within_the_window(faults: int, seed: int) -> None:
    from tools.localcluster.scalestorm import fault_schedule

    nodes = [f"gpu-{i:04d}" for i in range(300)]
    schedule = fault_schedule(nodes, faults, 30.0, seed)
    assert len({n for _, n in schedule}) == faults
    assert all(0 <= t < 30.0 or t == 30.0 for t, _ in schedule)
    assert [t for t, _ in schedule] == sorted(t for t, _ in schedule)
    assert schedule == fault_schedule(nodes, faults, 30.0, seed)  # seeded: the same storm again
    # Spread: no half of the fleet gets more than its share plus one.
    first_half = sum(nodes.index(n) < 150 for _, n in schedule)
    assert abs(first_half - faults / 2) <= 1


def test_a_storm_larger_than_the_fleet_is_refused() -> None:
    from tools.localcluster.scalestorm import fault_schedule

    with pytest.raises(ValueError, match="3 faults on 2 nodes"):
        fault_schedule(["a", "b"], 3, 30.0, 1)


def test_objects_in_a_namespace_another_controller_makes_are_left_out_by_name() -> None:
    objects = [{"kind": "Namespace", "apiVersion": "v1", "metadata": {"name": "ours"}},
               {"kind": "ServiceAccount", "apiVersion": "v1", "metadata": {"name": "a", "namespace": "ours"}},
               {"kind": "ServiceAccount", "apiVersion": "v1", "metadata": {"name": "b", "namespace": "liqo-tenant-x"}},
               {"kind": "ConfigMap", "apiVersion": "v1", "metadata": {"name": "c", "namespace": "kube-system"}}]
    keep, left = scalerun.split_objects(objects, set())
    assert [o["metadata"]["name"] for o in keep] == ["ours", "a", "c"]
    assert left == {scalerun.FOREIGN_NAMESPACE: 1}


# --------------------------------------------------------------------------- Pulumi at scale


def test_pulumi_runs_the_local_environment_at_the_shapes_size() -> None:
    from components.config import parse_config
    from tools.localcluster.scalepulumi import local_env_shape, overrides

    for name, gpu_nodes, system in (("prod", 256, 12), ("llama3", 2048, 12)):
        env = local_env_shape(scale.shape(name))
        plan = scale.shape_plan(env, ROOT)
        assert (len(plan.by_kind("gpu")), len(plan.by_kind("system"))) == (gpu_nodes, system)
        # The local stack's providers (mock virtual kubelets this machine runs), not the prod ones.
        assert {n.name for n in plan.by_kind("virtual")} == {"vk-local-cloud", "vk-backup-cloud"}
        keys = overrides(env)
        assert set(keys) == {"gpu-cluster:pools", "gpu-cluster:systemPool", "gpu-cluster:training"}
        values = {**raw_from_stack("local"), **{k.split(":", 1)[1]: v for k, v in keys.items()}}
        parse_config(values, f"local stack at {name}")


# --------------------------------------------------------------------------- a gang across its restart


@given(st.lists(st.tuples(st.sampled_from(["u1", "u2", "u3", "v1", "v2", "v3"]),
                          st.sampled_from(["Pending", "Running", "Succeeded"]), st.booleans(), st.booleans(),
                          st.sampled_from([None, "node-x"])), max_size=30))
def test_generations_count_only_pods_that_were_not_alive_at_the_mark(
        events: list[tuple[str, str, bool, bool, str | None]]) -> None:
    gens = Generations()
    for uid in ("u1", "u2", "u3"):
        gens.see(uid, f"node-{uid}", "Running")
    assert gens.mark() == {"u1", "u2", "u3"} and not gens.first_gone() and not gens.first_leaving()
    for uid, phase, deleted, leaving, node in events:
        gens.see(uid, node, phase, deleted=deleted, leaving=leaving)
    assert gens.first_gone() == ({"u1", "u2", "u3"} <= gens.deleted)
    assert gens.first_leaving() == ({"u1", "u2", "u3"} <= gens.leaving)
    assert gens.deleted <= gens.leaving  # gone implies it was leaving
    new = {u for u, *_ in events if u.startswith("v")} - gens.deleted
    assert gens.next_running() == len({u for u, p, d, *_ in events if p == "Running" and not d} & new)
    assert gens.next_bound() == len({u for u, _, _, _, n in events if n} & new)
    assert all(gens.nodes[u] == f"node-{u}" for u in ("u1", "u2", "u3") if not any(
        e[0] == u and e[4] for e in events))


def test_the_guards_breaker_cycle_phases_and_queries_are_read_from_its_own_metrics() -> None:
    from prometheus_client import generate_latest

    from agents.health_guard.metrics import GuardMetrics
    from tools.localcluster.scalestorm import guard_readings

    m = GuardMetrics()
    m.breaker.set(1)
    for seconds in (0.5, 1.5):
        m.cycle_phase.labels("observe").observe(seconds)
    m.cycle_phase.labels("act").observe(0.2)
    for seconds in (0.25, 0.75):
        m.query_seconds.labels("xid-fatal").observe(seconds)
    m.query_seconds.labels("freshness:dcgm").observe(0.1)
    assert guard_readings(generate_latest(m.registry).decode()) == (
        1.0, {"observe": 1.0, "act": 0.2}, {"xid-fatal": 0.5, "freshness:dcgm": 0.1})
    assert guard_readings(None) == (None, {}, {})
    assert guard_readings("# nothing here\n") == (None, {}, {})


# --------------------------------------------------------------------------- Volcano's share of nodes per pod


def test_percentage_of_nodes_to_find_reaches_the_charts_scheduler_and_the_local_one() -> None:
    from components.gang_scheduler import SCHEDULER_DEPLOYMENT, with_scheduler_args
    from tools.localcluster.plan import volcano_scheduler_flags

    deployment = {"kind": "Deployment", "metadata": {"name": SCHEDULER_DEPLOYMENT}, "spec": {"template": {"spec": {
        "containers": [{"name": SCHEDULER_DEPLOYMENT, "args": ["--logtostderr", "--percentage-nodes-to-find=50"]},
                       {"name": "sidecar", "args": ["--x"]}]}}}}
    out = with_scheduler_args(deployment, ["--percentage-nodes-to-find=10"])
    assert out is not None
    containers = out["spec"]["template"]["spec"]["containers"]
    assert containers[0]["args"] == ["--logtostderr", "--percentage-nodes-to-find=10"]  # replaced, not repeated
    assert containers[1]["args"] == ["--x"]
    assert deployment["spec"]["template"]["spec"]["containers"][0]["args"][-1].endswith("=50")  # input untouched
    assert with_scheduler_args({**deployment, "kind": "Service"}, ["--a"]) is None
    assert with_scheduler_args({"kind": "Deployment", "metadata": {"name": "volcano-controllers"}}, ["--a"]) is None
    values = raw_from_stack("prod")
    cfg = parse_config({**values, "scheduling": {**values.get("scheduling", {}), "percentageOfNodesToFind": 10}},
                       "Pulumi.prod.yaml")
    assert volcano_scheduler_flags(cfg) == ["--percentage-nodes-to-find=10"]
    unset = {**values, "scheduling": {k: v for k, v in values.get("scheduling", {}).items()
                                      if k != "percentageOfNodesToFind"}}
    assert volcano_scheduler_flags(parse_config(unset, "Pulumi.prod.yaml")) == []
    with pytest.raises(ConfigError, match="percentageOfNodesToFind"):
        parse_config({**values, "scheduling": {**values.get("scheduling", {}), "percentageOfNodesToFind": 0}},
                     "Pulumi.prod.yaml")


def test_the_gangs_go_to_the_shapes_largest_pool() -> None:
    assert {name: scale.gang_pool(scale.shape(name), ROOT) for name in ("small", "prod", "llama3")} == {
        "small": "h100-a", "prod": "h100-a", "llama3": "h100-a"}  # equal pools: the first
    bigger_second = scale.Shape("x", "b larger", pools=(
        {"name": "a", "nodes": ["n-[1-4]"], "gpusPerNode": 8}, {"name": "b", "nodes": ["m-[1-9]"], "gpusPerNode": 8}))
    assert scale.gang_pool(bigger_second, ROOT) == "b"


def test_a_burst_run_can_turn_the_handovers_clearing_on_or_off_and_refuses_a_negative_wait(
        capsys: pytest.CaptureFixture[str]) -> None:
    from dataclasses import replace

    from tools.localcluster import scalerun

    prod = scale.shape("prod")
    assert scale.shape_config(prod, ROOT).burst.handover.clear_after_seconds == 0.0
    on = scale.shape_config(replace(prod, quick_burst=True, clear_after_s=30.0), ROOT)
    assert on.burst.handover.clear_after_seconds == 30.0
    assert on.burst.handover.timeout_seconds == 60.0, "the quick timings stay beside it"
    assert scalerun.main(["bench", "--shape", "prod", "--clear-after", "-1"]) == 1
    assert "--clear-after: must be 0 or more seconds, got -1" in capsys.readouterr().err
