"""``make scale-up`` / ``make bench-scale``: a scale shape on the local control plane, and what it measures.

The shape (tools/localcluster/scale.py) runs on the same control plane as ``make up`` (etcd, API server,
controller manager, kwok, Volcano's scheduler and controllers), in its own state folder
(``.state/scale/<shape>``), with the control plane tuned for its size. Onto it go the stack's own objects as
the mock runtime renders them for that shape (namespaces, priority classes, Volcano queues, admission policies,
RBAC, the published training settings, the checkpoint claims, the node patches); workloads and the kinds whose
CRDs this control plane does not serve (certificates, gateway routes) and the metrics APIService are left
out and counted. Gangs are then submitted through ``gpucluster train submit``, exactly as a researcher does.

The measurements are pure functions in :mod:`tools.localcluster.scalemeasure`; this module is the I/O.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.bench_scale import DERIVED
from bench.committed import REPORT, committed_result
from tools.localcluster import control
from tools.localcluster.plan import Layout
from tools.localcluster.scale import (
    Shape,
    gang_pool,
    gang_team,
    shape,
    shape_config,
    shape_plan,
    shape_values,
    tuning_for,
)
from tools.localcluster.scalejobs import (
    SCALE_STATE,
    apply_objects,
    audit_events,
    cancel,
    layout,
    published_settings,
    say,
    submit,
    wait,
    watching,
)
from tools.localcluster.scalemeasure import (
    agent_of,
    histogram_quantile,
    parse_histogram,
    parse_histograms,
    percentiles,
    requests_by_agent,
)

ROOT = control.ROOT
RESULTS = SCALE_STATE / "results.json"
#: Kinds of the rendered stack that are not applied, and why (reported with their counts).
LEFT_OUT = {
    "Deployment": "workload: its pods would take the nodes the gangs are measured on",
    "DaemonSet": "workload: one pod per GPU node, applied by the fault-storm runs",
    "CronJob": "workload",
    "Certificate": "cert-manager is not installed here",
    "Issuer": "cert-manager is not installed here",
    "HTTPRoute": "no Gateway API here",
    "APIService": "an aggregated API without its server breaks discovery for every client",
}
#: Apply order: what others refer to first.
KIND_ORDER = ("Namespace", "PriorityClass", "StorageClass", "ClusterRole", "ClusterRoleBinding", "ServiceAccount",
              "Role", "RoleBinding", "ConfigMap", "Secret", "Queue", "ValidatingAdmissionPolicy",
              "ValidatingAdmissionPolicyBinding", "MutatingAdmissionPolicy", "MutatingAdmissionPolicyBinding")


# --------------------------------------------------------------------------- the stack's objects


def stack_objects(sh: Shape) -> list[dict[str, Any]]:
    """Every Kubernetes object of the stack at the shape's size, as the mock runtime renders it."""
    from components.config.base import PROJECT
    from components.mockrt import run_program, stack_config
    from tools.render import manifests

    config, secrets = stack_config(sh.stack, ROOT)
    merged = {k: v for k, v in config.items() if k in secrets}
    merged.update({f"{PROJECT}:{k}": v for k, v in shape_values(sh, ROOT).items()})
    return list(manifests(run_program(sh.stack, config=merged, secret_keys=secrets)).values())


#: A node patch whose node kwok does not fake: a provider's virtual node (no provider runs at scale).
NODE_NOT_FAKED = "Node (virtual)"
#: Namespaces every cluster has; an object in any other namespace the stack does not declare (Liqo's tenant
#: namespace, made by Liqo when it peers) is left out.
BUILT_IN_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")
FOREIGN_NAMESPACE = "any kind, in a namespace another controller makes (Liqo's tenant)"


def split_objects(objects: Sequence[dict[str, Any]], kwok_nodes: Collection[str]
                  ) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """(the objects to apply in order, count of each kind left out). A node patch is applied only to a node
    kwok fakes: applied to any other, server-side apply would create a Node no kubelet keeps."""
    left: dict[str, int] = {}
    keep: list[dict[str, Any]] = []
    namespaces = {*BUILT_IN_NAMESPACES, *(o["metadata"]["name"] for o in objects if o["kind"] == "Namespace")}
    for obj in objects:
        kind = obj["kind"]
        meta = obj.get("metadata") or {}
        if kind == "Node" and meta.get("name") not in kwok_nodes:
            kind = NODE_NOT_FAKED
        elif meta.get("namespace") and meta["namespace"] not in namespaces:
            kind = FOREIGN_NAMESPACE
        if kind in LEFT_OUT or kind in (NODE_NOT_FAKED, FOREIGN_NAMESPACE):
            left[kind] = left.get(kind, 0) + 1
        else:
            keep.append(obj)
    rank = {k: i for i, k in enumerate(KIND_ORDER)}
    keep.sort(key=lambda o: (rank.get(o["kind"], len(rank)), o["kind"]))
    return keep, left


# --------------------------------------------------------------------------- the control plane


@dataclass
class Probe:
    """What ``up`` measured."""

    nodes: int
    gpus: int
    up_s: float
    objects_applied: int
    objects_left_out: dict[str, int]
    tuning: list[dict[str, str]] = field(default_factory=list)
    #: Agents that could not start, and why (stackup.start_agents).
    agent_notes: list[str] = field(default_factory=list)
    #: Seconds from the agents' start until the node-pool agent had recorded every GPU node; None: not started.
    node_pools_converged_s: float | None = None


def up(sh: Shape, state: Path | None = None) -> tuple[Layout, Probe]:
    lay = layout(sh, state)
    plan = shape_plan(sh, ROOT)
    tuning = tuning_for(len(plan.kwok_nodes))
    started = time.monotonic()
    control.up(lay, stack=sh.stack, timeout=600, plan=plan, tuning=tuning)
    up_s = time.monotonic() - started
    objects, left = split_objects(stack_objects(sh), {n.name for n in plan.kwok_nodes})
    applied = apply_objects(lay, objects)
    # The agents with their real shells, as the stack's ServiceAccounts, fed by the ConfigMaps just applied: the
    # burst controller lifts the handover gate every gang waits behind, the health guard watches every node.
    from tools.localcluster.stackup import start_agents

    notes = start_agents(lay, sh.stack)
    converged = None if any(n.startswith("node-pools:") for n in notes) else pools_converged(lay, plan, 600)
    say(f"{sh.name}: {len(plan.kwok_nodes)} nodes Ready in {up_s:.1f}s; {applied} stack objects applied, "
        f"left out {left}")
    return lay, Probe(nodes=len(plan.kwok_nodes), gpus=plan.onprem_gpus, up_s=round(up_s, 1),
                      objects_applied=applied, objects_left_out=left,
                      tuning=[{"component": s.component, "flag": s.arg, "why": s.why} for s in tuning.settings],
                      agent_notes=notes, node_pools_converged_s=converged)


def pools_converged(lay: Layout, plan: Any, timeout: float) -> float:
    """Seconds until every GPU node carries the node-pool agent's record (it labels and taints as the pools say).

    Polled once a second from the API server's watch cache (``resourceVersion=0``), as plain JSON: a typed list of
    2,060 nodes a second would cost this 2-core machine more than the agent being timed.
    """
    from kubernetes import client

    from agents.node_pools.contract import NodePoolSettings

    annotation = NodePoolSettings(label_prefix=plan.label_prefix).applied_annotation
    want = {n.name for n in plan.by_kind("gpu")}
    api = client.CoreV1Api(control.api_client(lay))
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        raw: Any = api.list_node(resource_version="0", _preload_content=False)
        items = json.loads(raw.data)["items"]
        done = {i["metadata"]["name"] for i in items if annotation in (i["metadata"].get("annotations") or {})}
        if want <= done:
            return round(time.monotonic() - started, 1)
        time.sleep(1.0)
    raise control.ClusterError(f"the node-pool agent had not recorded {len(want - done)} of {len(want)} GPU nodes "
                               f"after {timeout:.0f}s")


# --------------------------------------------------------------------------- gangs


#: Volcano's scheduler as the local control plane records its process.
VOLCANO_SCHEDULER = "vc-scheduler"


def gang_run(lay: Layout, namespace: str, pods: int, pool: str, run: int, spec_dir: Path, timeout: float,
             team: str | None = None, topology: Any = None) -> dict[str, float]:
    """Submit one gang of ``pods`` x 8 GPUs through the CLI; seconds to all bound and all Running, then to
    all gone after the cancel. In a pool with a ``topology`` (its ``PoolTopology``), also the leaf switches the
    gang's nodes span and the fewest its nodes could fill."""
    from gpucluster_cli.render import worker_selector

    settings = published_settings(lay, namespace)
    name = f"scale-{pods}-{run}"
    with watching(lay, settings.training_namespace, worker_selector(settings, name)) as times:
        cpu_before = process_usage(lay).get(VOLCANO_SCHEDULER, {}).get("cpu_s")
        submit(lay, namespace, name, pods, pool, spec_dir, team)
        submitted = time.monotonic() - times.start
        wait(f"{pods} pods of {name} bound", lambda: times.bound() >= pods, timeout)
        cpu_after = process_usage(lay).get(VOLCANO_SCHEDULER, {}).get("cpu_s")
        wait(f"{pods} pods of {name} Running", lambda: times.running() >= pods, timeout)
        result = times.summary(pods)
        result["submit_s"] = round(submitted, 2)
        if cpu_before is not None and cpu_after is not None:
            # The scheduler's own CPU from the submit to the last bind: what placing the gang costs it, whatever
            # share of this machine's two cores it got meanwhile.
            result["scheduler_cpu_s"] = round(cpu_after - cpu_before, 1)
        if topology is not None and not topology.by_label:
            from components.config import fewest_leaves

            leaf_of = topology.leaf_of()
            nodes = set(times.nodes())
            result["leaves_spanned"] = len({leaf_of.get(n, "?") for n in nodes})
            result["fewest_leaves"] = fewest_leaves(topology, len(nodes))
        cancel(lay, namespace, name)
        gone_from = time.monotonic()
        wait(f"the pods of {name} deleted", lambda: times.alive() == 0, timeout)
        result["deleted_s"] = round(time.monotonic() - gone_from, 2)
    return result


# --------------------------------------------------------------------------- the API server's cost


def apiserver_metrics(lay: Layout) -> str:
    ports = control.load_ports(lay)
    if ports is None:
        raise control.ClusterError(f"no control plane recorded in {lay.run}")
    status, body = control.api_get(lay, ports["apiserver"], "/metrics", timeout=30)
    if status != 200:
        raise control.ClusterError(f"GET /metrics answered {status}")
    return body


#: Verbs of the mutating calls the SLO covers (APPLY: server-side apply, labelled apart).
MUTATING_VERBS = ("POST", "PUT", "PATCH", "APPLY", "DELETE")
#: The histogram's labels that name one kind of call: Kubernetes' SLI is the p99 per (resource, verb) pair.
CALL_LABELS = ("verb", "resource", "subresource")


def mutating_p99(before: str, after: str) -> float | None:
    """p99 (seconds) of every mutating request between two scrapes, from the API server's own histogram."""
    a = parse_histogram(after, "apiserver_request_duration_seconds", {"verb": MUTATING_VERBS})
    b = parse_histogram(before, "apiserver_request_duration_seconds", {"verb": MUTATING_VERBS})
    return histogram_quantile(0.99, {le: a.get(le, 0.0) - b.get(le, 0.0) for le in a})


def mutating_p99_by_call(before: str, after: str, top: int = 6) -> dict[str, dict[str, float]]:
    """The ``top`` slowest kinds of mutating call between two scrapes (``VERB resource[/subresource]`` -> p99
    seconds and how many), as Kubernetes' SLI takes them (per resource and verb): which calls hold the p99."""
    a = parse_histograms(after, "apiserver_request_duration_seconds", {"verb": MUTATING_VERBS}, CALL_LABELS)
    b = parse_histograms(before, "apiserver_request_duration_seconds", {"verb": MUTATING_VERBS}, CALL_LABELS)
    out: dict[str, dict[str, float]] = {}
    for (verb, resource, subresource), buckets in a.items():
        earlier = b.get((verb, resource, subresource), {})
        delta = {le: n - earlier.get(le, 0.0) for le, n in buckets.items()}
        p99 = histogram_quantile(0.99, delta)
        if p99 is not None:
            call = f"{verb} {resource}/{subresource}" if subresource else f"{verb} {resource}"
            out[call] = {"p99_s": round(p99, 3), "calls": int(max(delta.values()))}
    return dict(sorted(out.items(), key=lambda kv: -kv[1]["p99_s"])[:top])


def audit_window(lay: Layout, since: float, until: float) -> dict[str, dict[str, float]]:
    """Requests per second per agent (user agent) between two wall-clock times, from the audit log."""
    return requests_by_agent(audit_events(lay), since, until)


def process_usage(lay: Layout) -> dict[str, dict[str, float]]:
    """Resident memory (MiB) and CPU seconds of every recorded process."""
    tick = os.sysconf("SC_CLK_TCK")
    out: dict[str, dict[str, float]] = {}
    for proc in control.recorded(lay):
        component = proc.component()  # the component itself, not its supervisor
        if component is None:
            continue
        pid = component[0]
        with contextlib.suppress(OSError, ValueError, IndexError):
            status = Path(f"/proc/{pid}/status").read_text()
            rss_kib = next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:"))
            stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()
            out[proc.name] = {"rss_mib": round(rss_kib / 1024, 1),
                              "cpu_s": round((int(stat[11]) + int(stat[12])) / tick, 1)}
    return out


# --------------------------------------------------------------------------- the bench


STACK_RAILS_SEED = 4747


#: The guard's poll for the storms run a second time faster than the stack's (seconds; the settings' least).
FAST_POLL_S = 1


def storm_runs(lay: Layout, sh: Shape, plan: Any, fault_counts: Sequence[int], crash_sizes: Sequence[int] = (),
               crash_runs: int = 1, spec_dir: Path | None = None, timeout: float = 900) -> dict[str, Any]:
    """NVSentinel's storm at each fault count with rails that allow it; then, for each of ``crash_sizes``, a fatal
    fault under a running gang of that size (:mod:`tools.localcluster.scalecrash`); then, where the gang pool has a
    fabric, its first leaf switch down (one switch fault, nothing quarantined); then once more the largest
    storm with the stack's own rails, where the breaker must trip at its limit and hold (last: a tripped breaker
    stays tripped until a person resets it)."""
    from tools.localcluster import scalecrash, scalestorm

    cfg = shape_config(sh, ROOT)
    interval = cfg.observability.dcgm_interval_ms / 1000
    standin, prom = scalestorm.start_scrape_path(lay, plan, interval)
    wall0 = time.time()
    before = apiserver_metrics(lay)
    out: dict[str, Any] = {"storm_scrape_interval_s": interval,
                           "storm_guard_poll_s": cfg.observability.health_guard_poll_seconds}
    if fault_counts:
        out["storm_taint_s"] = {}
    for faults in fault_counts:
        out["storm_taint_s"][str(faults)] = scalestorm.storm(lay, sh.stack, plan, cfg.label_prefix, standin, prom,
                                                             faults, rails="open")
        say(f"storm of {faults}: cleared the guard's marks from {scalestorm.clear(lay, cfg.label_prefix)} nodes")
    if fault_counts and cfg.observability.health_guard_poll_seconds > FAST_POLL_S:
        # The same storms with the guard polling faster: what a shorter `healthGuardPollSeconds` buys, beside what
        # it costs (a cycle's queries that much more often).
        out["storm_fast_poll_s"] = FAST_POLL_S
        out["storm_taint_fast_poll_s"] = {}
        for faults in fault_counts:
            out["storm_taint_fast_poll_s"][str(faults)] = scalestorm.storm(
                lay, sh.stack, plan, cfg.label_prefix, standin, prom, faults, rails="open", guard_poll_s=FAST_POLL_S)
            say(f"storm of {faults}, {FAST_POLL_S}s poll: cleared the guard's marks from "
                f"{scalestorm.clear(lay, cfg.label_prefix)} nodes")
    if crash_sizes:
        pool = gang_pool(sh, ROOT)
        crashes: dict[str, Any] = {}
        for pods in crash_sizes:
            per_run = [scalecrash.crash_run(lay, sh.stack, cfg.label_prefix, standin, prom, cfg.training_namespace,
                                            pods, pool, i, spec_dir or lay.state, timeout, gang_team(sh, ROOT))
                       for i in range(crash_runs)]
            crashes[str(pods)] = {"runs": per_run, **{term: percentiles([r[term] for r in per_run]) for term in (
                "detect_s", "evict_s", "gone_s", "reschedule_s", "running_again_s")},
                **({"evict_writes_by_volcano": per_run[0]["evict_writes_by_volcano"]}
                   if "evict_writes_by_volcano" in per_run[0] else {})}
        out["crash"] = crashes
        out["gang_evict_s"] = {k: v["evict_s"] for k, v in crashes.items()}
        out["gang_running_again_s"] = {k: v["running_again_s"] for k, v in crashes.items()}
    topology = cfg.pool(gang_pool(sh, ROOT)).topology
    if topology is not None and topology.leaves[0].nodes:
        # One leaf switch down: one fault, not a leaf of bad nodes (before the stack-rails storm trips the breaker).
        leaf = topology.leaves[0]
        scalestorm.clear(lay, cfg.label_prefix)
        out["switch_fault"] = scalestorm.switch_storm(lay, sh.stack, cfg.label_prefix, standin, prom, leaf.name,
                                                      leaf.node_names)
        say(f"switch storm: cleared the fence from {scalestorm.clear(lay, cfg.label_prefix)} nodes")
    if fault_counts:
        # Other nodes than the open storms' and other times: the stack's rails count the fleet's last hour.
        stack_rails = scalestorm.storm(lay, sh.stack, plan, cfg.label_prefix, standin, prom, max(fault_counts),
                                       rails="stack", seed=STACK_RAILS_SEED, rotate=1)
        out["storm_stack_rails"] = stack_rails
        out["breaker_tripped_at"] = stack_rails["tainted"] if stack_rails.get("breaker_tripped") else None
    after = apiserver_metrics(lay)
    out["storm_apiserver_mutating_p99_s"] = mutating_p99(before, after)
    out["storm_apiserver_mutating_p99_by_call"] = mutating_p99_by_call(before, after)
    out["storm_requests_per_s_by_agent"] = audit_window(lay, wall0, time.time())
    return out


#: How long the shape is watched at rest, before any gang (seconds): what the agents, Volcano and the control plane
#: ask of the API server in steady state.
STEADY_S = 60.0


def steady_state(lay: Layout, seconds: float) -> dict[str, Any]:
    """Requests per second per agent and the mutating calls' p99 over ``seconds`` of the shape at rest."""
    before, since = apiserver_metrics(lay), time.time()
    time.sleep(seconds)
    after = apiserver_metrics(lay)
    return {"steady_requests_per_s_by_agent": audit_window(lay, since, time.time()),
            "steady_apiserver_mutating_p99_s": mutating_p99(before, after), "steady_window_s": seconds}


def bench(sh: Shape, runs: int, sizes: Sequence[int], keep: bool = False, timeout: float = 900,
          state: Path | None = None, storm_faults: Sequence[int] = (), crash_sizes: Sequence[int] = (),
          steady_s: float = STEADY_S, burst: bool = False) -> dict[str, Any]:
    """Bring the shape up, watch it at rest for ``steady_s``, run ``runs`` gangs of each size in ``sizes`` one after
    the other, then (``burst``) the burst scenario at the shape's size (:mod:`tools.localcluster.scaleburst`), then
    the fault storms of ``storm_faults`` nodes, and report; the control plane goes down afterwards unless ``keep``."""
    lay, probe = up(sh, state)
    try:
        plan = shape_plan(sh, ROOT)
        pool = gang_pool(sh, ROOT)
        pool_nodes = sum(1 for n in plan.by_kind("gpu") if n.pool == pool)
        namespace = shape_config(sh, ROOT).training_namespace
        spec_dir = lay.state / "specs"
        spec_dir.mkdir(exist_ok=True)
        steady = steady_state(lay, steady_s) if runs and steady_s > 0 else {}
        usage_rest = process_usage(lay)
        rest_at = time.monotonic()
        before = apiserver_metrics(lay)
        wall0 = time.time()
        gangs: dict[str, Any] = {}
        for pods in sizes if runs else ():
            if pods > pool_nodes:
                raise ValueError(f"a gang of {pods} pods does not fit pool {pool} ({pool_nodes} nodes)")
            topology = shape_config(sh, ROOT).pool(pool).topology
            per_run = [gang_run(lay, namespace, pods, pool, i, spec_dir, timeout, gang_team(sh, ROOT), topology)
                       for i in range(runs)]
            gangs[str(pods)] = {
                "runs": per_run,
                **({"leaves_spanned": percentiles([r["leaves_spanned"] for r in per_run]),
                    "fewest_leaves": per_run[0]["fewest_leaves"]} if "leaves_spanned" in per_run[0] else {}),
                "bound": percentiles([r["all_bound_s"] for r in per_run]),
                "running": percentiles([r["all_running_s"] for r in per_run]),
                "created": percentiles([r["all_created_s"] for r in per_run]),
                "ungated": percentiles([r["all_ungated_s"] for r in per_run]),
                "deleted": percentiles([r["deleted_s"] for r in per_run]),
                **({"scheduler_cpu_s": percentiles([r["scheduler_cpu_s"] for r in per_run])}
                   if all("scheduler_cpu_s" in r for r in per_run) else {}),
            }
            say(f"{sh.name}: gang of {pods}: bound p50 {gangs[str(pods)]['bound']['p50']}s, "
                f"running p50 {gangs[str(pods)]['running']['p50']}s")
        after = apiserver_metrics(lay)
        wall1 = time.time()
        burst_keys = burst_measured(lay, sh, plan, spec_dir, timeout) if burst else {}
        storms = storm_runs(lay, sh, plan, storm_faults, crash_sizes, max(1, min(runs, 3)), spec_dir, timeout
                            ) if storm_faults or crash_sizes else {}
        gang_keys: dict[str, Any] = {
            "gang_pool": pool, "runs_per_size": runs,
            "gang_bind_s": {k: v["bound"] for k, v in gangs.items()},
            "gang_running_s": {k: v["running"] for k, v in gangs.items()},
            "gangs": gangs,
            "apiserver_mutating_p99_s": mutating_p99(before, after),
            "apiserver_mutating_p99_by_call": mutating_p99_by_call(before, after),
            "requests_per_s_by_agent": audit_window(lay, wall0, wall1),
        } if runs else {}  # no gangs: an earlier run's figures stay in the results
        return {
            "shape": sh.name, "description": sh.description, "nodes": probe.nodes, "gpus": probe.gpus,
            "up_s": probe.up_s, "objects_applied": probe.objects_applied, "objects_left_out": probe.objects_left_out,
            "tuning": probe.tuning, "agent_notes": probe.agent_notes,
            "node_pools_converged_s": probe.node_pools_converged_s, **steady, **gang_keys,
            # Without gangs, the footprints after the storms alone: the gang run's stay in the results.
            **{("" if runs else "storms_") + key: value for key, value in (
                ("process_usage_at_rest", usage_rest), ("process_usage_after", process_usage(lay)),
                ("usage_span_s", round(time.monotonic() - rest_at, 1)))},
            **burst_keys, **storms,
        }
    finally:
        if not keep:
            control.down(lay)


def burst_measured(lay: Layout, sh: Shape, plan: Any, spec_dir: Path, timeout: float) -> dict[str, Any]:
    """The burst scenario's figures, with the API server's cost while it ran."""
    from tools.localcluster import scaleburst

    before, wall0 = apiserver_metrics(lay), time.time()
    result = scaleburst.burst_run(lay, plan, shape_config(sh, ROOT), stack_objects(sh), gang_pool(sh, ROOT),
                                  spec_dir, timeout)
    after = apiserver_metrics(lay)
    return {"burst": {**result, "timings": "quick (Pulumi.local.yaml's holds)" if sh.quick_burst else "the stack's",
                      "apiserver_mutating_p99_s": mutating_p99(before, after),
                      "apiserver_mutating_p99_by_call": mutating_p99_by_call(before, after),
                      "requests_per_s_by_agent": audit_window(lay, wall0, time.time())}}


#: The committed report, whose shapes a machine without results of its own starts from.
COMMITTED_REPORT = REPORT


def committed_shapes(report: Path = COMMITTED_REPORT) -> dict[str, Any]:
    """The shapes the committed report carries: on a machine that has not run ``make bench-scale`` yet, a run of one
    shape (or one part of it) must not drop every other shape's figures from the report."""
    shapes = (committed_result("bench_scale", report) or {}).get("shapes")
    if not isinstance(shapes, dict):
        return {}
    # Derived when the report is written (bench/bench_scale.py), not measured.
    return {name: {k: v for k, v in shape.items() if k not in DERIVED and not (k == "limited_by" and v is None)}
            for name, shape in shapes.items() if isinstance(shape, dict)}


def merge_results(entry: dict[str, Any], path: Path = RESULTS, committed: Path = COMMITTED_REPORT) -> dict[str, Any]:
    """One entry per shape in the results file: a run's keys replace that shape's, the others stay (the gang
    bench and the Pulumi run of one shape are separate runs), each part with the time it was measured."""
    data: dict[str, Any] = json.loads(path.read_text()) if path.is_file() else {"shapes": committed_shapes(committed)}
    shapes = data.setdefault("shapes", {})
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    # A run without gangs (storms only) keeps the gang figures of an earlier run, so it is dated apart from them.
    part = ("pulumi" if "pulumi_up_s" in entry else "bench" if "gangs" in entry
            else "storms" if any(k.startswith(("storm", "crash", "switch")) for k in entry) else "burst")
    shapes[entry["shape"]] = {**shapes.get(entry["shape"], {}), **entry, "measured": now, f"measured_{part}": now}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2) + "\n")
    return data


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="scale", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("up", "down", "bench", "pulumi"):
        p = sub.add_parser(name)
        p.add_argument("--shape", default="small")
        if name == "bench":
            p.add_argument("--runs", type=int, default=5, help="runs per gang size; 0: storms only")
            p.add_argument("--sizes", default="", help="comma-separated gang sizes (pods); the shape's by default")
            p.add_argument("--keep", action="store_true", help="leave the control plane up afterwards")
            p.add_argument("--storms", default="", help="comma-separated fault counts; the shape's by default, "
                           "'none' for none")
            p.add_argument("--crashes", default="", help="comma-separated gang sizes to crash under a fault; the "
                           "shape's by default, 'none' for none")
            p.add_argument("--burst", choices=("stack", "quick", "none"), default="stack",
                           help="the burst scenario with the stack's timings, the local stack's (short), or none")
            p.add_argument("--clear-after", type=float, default=None, metavar="SECONDS",
                           help="the burst run's burst.handover.clearAfterSeconds (the stack's by default; 0: off)")
            p.add_argument("--conditions", default="", help="what else held the machine meanwhile, for the report "
                           "(e.g. 'beside a chaos soak'); empty: nothing")
    args = parser.parse_args(argv)
    try:
        sh = shape(args.shape)
        if args.command == "up":
            up(sh)
        elif args.command == "down":
            control.down(layout(sh))
        elif args.command == "pulumi":
            from tools.localcluster import scalepulumi

            merge_results({"shape": sh.name, **scalepulumi.run(sh)})
            say(f"results in {RESULTS}")
        else:
            sizes = [int(s) for s in args.sizes.split(",") if s.strip()] or list(sh.gang_sizes)
            storms = [] if args.storms == "none" else (
                [int(s) for s in args.storms.split(",") if s.strip()] or list(sh.storm_faults))
            crashes = [] if args.crashes == "none" else (
                [int(s) for s in args.crashes.split(",") if s.strip()] or list(sh.crash_sizes))
            from dataclasses import replace

            if args.burst == "quick":
                sh = replace(sh, quick_burst=True)
            if args.clear_after is not None:
                if args.clear_after < 0:
                    raise ValueError(f"--clear-after: must be 0 or more seconds, got {args.clear_after:g}")
                sh = replace(sh, clear_after_s=args.clear_after)
            entry = bench(sh, args.runs, sizes, keep=args.keep, storm_faults=storms, crash_sizes=crashes,
                          burst=args.burst != "none")
            merge_results({**entry, "conditions": args.conditions.strip() or None})
            say(f"results in {RESULTS}")
    except (control.ClusterError, ValueError) as exc:
        print(f"scale: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())


__all__ = ["agent_of", "main"]
