"""NVSentinel's scale test, side by side: many nodes go bad, staggered over 0-30 s, on a scale shape.

Every GPU node's DCGM and InfiniBand series come from one scrape target (tools/localcluster/fleet_standin.py)
that a real Prometheus scrapes at the stack's DCGM interval; the health guard runs with its real shell, as the
stack's ServiceAccount, polling that Prometheus with its real queries. Faults (XID 79: fatal) are injected at
seeded times spread over ``spread_s``; each node's latency runs from the first scrape that served its fault to
the moment a node watch sees the guard's taint on it. With ``rails="open"`` the guard may take every faulted
node; with ``rails="stack"`` it runs the stack's own rails, and the breaker must trip at its limit and hold.
"""

from __future__ import annotations

import contextlib
import json
import random
import shutil
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NamedTuple

from agents.node_taints import health_taint_key
from tools.localcluster import control
from tools.localcluster.plan import Layout, NodePlan
from tools.localcluster.scalemeasure import percentiles
from tools.localcluster.watching import following

STANDIN = "fleet-standin"
PROMETHEUS = "prometheus-scale"
GUARD = "health-guard"
FATAL_XID = 79
#: The "open" rails' node limits: more than any shape has nodes.
OPEN_RAIL = 100_000


def say(msg: str) -> None:
    print(f"scale storm: {msg}", flush=True)


def fault_schedule(nodes: Sequence[str], faults: int, spread_s: float, seed: int) -> list[tuple[float, str]]:
    """``faults`` nodes spread evenly over the fleet (every leaf and pool gets its share), each at a seeded
    offset in ``[0, spread_s)``, in time order."""
    if not 0 < faults <= len(nodes):
        raise ValueError(f"{faults} faults on {len(nodes)} nodes: need 1 to {len(nodes)}")
    step = len(nodes) / faults
    chosen = [nodes[int(i * step)] for i in range(faults)]
    rng = random.Random(seed)
    return sorted((round(rng.uniform(0, spread_s), 3), node) for node in chosen)


def _get(url: str, timeout: float = 10) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return json.loads(resp.read())


def _post(url: str, body: dict[str, Any]) -> None:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        resp.read()


def post_faults(standin: str, faults: dict[str, dict[str, Any]]) -> None:
    """Set (or, with ``{}``, clear) nodes' faults on the fleet stand-in."""
    _post(f"{standin}/faults", faults)


def served(standin: str) -> dict[str, Any]:
    """Node -> epoch time of the first scrape that served its current fault."""
    answer: dict[str, Any] = _get(f"{standin}/served")
    return answer


def start_scrape_path(lay: Layout, plan: NodePlan, interval_s: float) -> tuple[str, str]:
    """The fleet stand-in and a Prometheus scraping it; returns (stand-in URL, Prometheus URL) once every GPU's
    temperature series is in Prometheus."""
    import sys

    binary = shutil.which("prometheus")
    if binary is None:
        raise control.ClusterError("prometheus is not installed: run `make observability-tools`")
    gpu_nodes = [n.name for n in plan.by_kind("gpu")]
    ports = control.free_ports(["standin", "prometheus"])
    nodes_file = lay.state / "fleet-nodes.txt"
    nodes_file.write_text("\n".join(gpu_nodes) + "\n")
    control.start_process(lay, STANDIN, [sys.executable, "-m", "tools.localcluster.fleet_standin",
                                         f"--nodes-file={nodes_file}", f"--port={ports['standin']}"],
                          env={"PYTHONPATH": str(control.ROOT)})
    home = lay.state / "prometheus-scale"
    shutil.rmtree(home, ignore_errors=True)
    home.mkdir(parents=True)
    (home / "prometheus.yml").write_text(
        f"global: {{scrape_interval: {interval_s:g}s, evaluation_interval: {interval_s:g}s, "
        f"scrape_timeout: {interval_s:g}s}}\n"
        f"scrape_configs: [{{job_name: dcgm, honor_labels: true, "
        f"static_configs: [{{targets: ['127.0.0.1:{ports['standin']}']}}]}}]\n")
    control.start_process(lay, PROMETHEUS, [binary, f"--config.file={home / 'prometheus.yml'}",
                                            f"--storage.tsdb.path={home / 'data'}",
                                            f"--web.listen-address=127.0.0.1:{ports['prometheus']}"])
    standin = f"http://127.0.0.1:{ports['standin']}"
    prom = f"http://127.0.0.1:{ports['prometheus']}"
    want = len(gpu_nodes) * 8

    def series_in() -> bool:
        answer = _get(f"{prom}/api/v1/query?query=count(DCGM_FI_DEV_GPU_TEMP)")
        result = answer["data"]["result"]
        return bool(result) and int(float(result[0]["value"][1])) >= want

    control.wait_for(f"{want} GPU temperature series in Prometheus", series_in, 180, control.load_proc(lay, PROMETHEUS))
    return standin, prom


def wait_no_xid(prometheus_url: str) -> None:
    """A guard started while Prometheus still holds an earlier run's XIDs (its last scrape before the fault was
    cleared) would quarantine on them: wait until none is left."""
    control.wait_for("no XID left in Prometheus", lambda: not _get(
        f"{prometheus_url}/api/v1/query?query=DCGM_FI_DEV_XID_ERRORS%20%3E%200")["data"]["result"], 120)


def scrape_seconds(prometheus_url: str, window_s: float) -> dict[str, float]:
    """The stand-in's scrape durations over the last ``window_s`` (mean and max): the one target serves every GPU of
    the fleet, so each scrape carries the whole fleet's samples, where a real fleet's exporters are scraped one node
    at a time. A fault is queryable only once its scrape is in, so this is part of every latency a storm reports
    that a real fleet's would not have."""
    window = f"{max(1, round(window_s))}s"
    out: dict[str, float] = {}
    for stat in ("avg", "max"):
        query = urllib.parse.urlencode({"query": f'{stat}_over_time(scrape_duration_seconds{{job="dcgm"}}[{window}])'})
        result = _get(f"{prometheus_url}/api/v1/query?{query}")["data"]["result"]
        if result:
            out[{"avg": "mean", "max": "max"}[stat]] = round(float(result[0]["value"][1]), 3)
    return out


def restart_guard(lay: Layout, stack: str, prometheus_url: str, rails: str, faults: int,
                  poll_s: int | None = None, extra: dict[str, Any] | None = None) -> None:
    """The guard again, pointed at the scale Prometheus; ``open`` rails let it take every faulted node, of this
    storm and the ones before it (the per-hour rail counts the node history the guard keeps on the nodes);
    ``poll_s`` in place of the stack's poll; ``extra``: more of its settings in place of the stack's."""
    from tools.localcluster.stackup import start_agents

    proc = control.load_proc(lay, GUARD)
    if proc is not None:
        control.stop_process(lay, proc)
    overrides: dict[str, Any] = {"prometheus_url": prometheus_url, **({"poll_seconds": poll_s} if poll_s else {}),
                                 **(extra or {})}
    if rails == "open":
        overrides.update({"max_nodes_quarantined": OPEN_RAIL, "max_nodes_per_hour": OPEN_RAIL,
                          "max_pool_percent_quarantined": 100, "max_pool_percent_per_hour": 100})
    elif rails != "stack":
        raise ValueError(f"rails must be 'open' or 'stack', got {rails!r}")
    notes = [n for n in start_agents(lay, stack, guard_overrides=overrides) if n.startswith(GUARD)]
    if notes:
        raise control.ClusterError(f"the health guard did not start: {notes}")


@contextlib.contextmanager
def node_watch(lay: Layout, holds: Callable[[Any], bool]) -> Iterator[dict[str, float]]:
    """Node -> epoch time the watch first saw ``holds(node)`` true."""
    from kubernetes import client

    seen: dict[str, float] = {}
    api = client.CoreV1Api(control.api_client(lay))

    def saw(_: str, node: Any) -> None:
        if holds(node):
            seen.setdefault(node.metadata.name, time.time())

    with following(api.list_node, saw):
        yield seen


def taint_watch(lay: Layout, key: str) -> contextlib.AbstractContextManager[dict[str, float]]:
    """Node -> epoch time the watch first saw taint ``key`` on it."""
    return node_watch(lay, lambda node: any(t.key == key for t in node.spec.taints or []))


def condition_watch(lay: Layout, kind: str, status: str) -> contextlib.AbstractContextManager[dict[str, float]]:
    """Node -> epoch time the watch first saw its condition ``kind`` at ``status``."""
    return node_watch(lay, lambda node: any(c.type == kind and c.status == status
                                            for c in (node.status.conditions if node.status else None) or []))


def _guard_metrics(lay: Layout) -> str | None:
    """The guard's own metrics text (None when it serves none)."""
    proc = control.load_proc(lay, GUARD)
    if proc is None or "--metrics-port" not in proc.argv[:-1]:
        return None
    port = proc.argv[proc.argv.index("--metrics-port") + 1]
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        text: str = resp.read().decode()
    return text


class GuardReadings(NamedTuple):
    """What a storm reads from the guard's metrics: its breaker gauge and the mean seconds of each cycle phase and
    of each Prometheus query (which one holds a cycle at scale)."""

    breaker: float | None
    phases: dict[str, float]
    queries: dict[str, float]


def guard_readings(text: str | None) -> GuardReadings:
    """:class:`GuardReadings` from the guard's metrics text (empty ones when it serves none)."""
    if text is None:
        return GuardReadings(None, {}, {})
    from prometheus_client.parser import text_string_to_metric_families

    breaker: float | None = None
    sums: dict[tuple[str, str], float] = {}
    counts: dict[tuple[str, str], float] = {}
    histograms = {"gpucluster_health_cycle_phase_seconds": "phase", "gpucluster_health_query_seconds": "query"}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "gpucluster_health_breaker_tripped":
                breaker = sample.value
            for prefix, label in histograms.items():
                if sample.name == f"{prefix}_sum":
                    sums[prefix, sample.labels[label]] = sample.value
                elif sample.name == f"{prefix}_count":
                    counts[prefix, sample.labels[label]] = sample.value

    def means(prefix: str) -> dict[str, float]:
        return {key: round(sums[p, key] / counts[p, key], 3) for p, key in sums if p == prefix and counts.get((p, key))}

    return GuardReadings(breaker, means("gpucluster_health_cycle_phase_seconds"),
                         means("gpucluster_health_query_seconds"))


def storm(lay: Layout, stack: str, plan: NodePlan, label_prefix: str, standin: str, prometheus_url: str,
          faults: int, rails: str = "open", spread_s: float = 30.0, seed: int = 47, settle_s: float = 60.0,
          timeout: float = 600.0, rotate: int = 0, guard_poll_s: int | None = None) -> dict[str, Any]:
    """One storm: ``faults`` fatal faults over ``spread_s``; latencies of the taints, and the breaker's state.
    ``rotate`` shifts which nodes are chosen (a storm on other nodes than an earlier one's); ``guard_poll_s``
    replaces the stack's poll of the guard."""
    gpu_nodes = [n.name for n in plan.by_kind("gpu")]
    gpu_nodes = gpu_nodes[rotate:] + gpu_nodes[:rotate]
    schedule = fault_schedule(gpu_nodes, faults, spread_s, seed)
    wait_no_xid(prometheus_url)
    restart_guard(lay, stack, prometheus_url, rails, faults, guard_poll_s)
    time.sleep(5)  # the guard's first poll sees a healthy fleet
    key = health_taint_key(label_prefix)
    with taint_watch(lay, key) as tainted:
        time.sleep(2)  # the watch's first list: what is tainted before any fault
        before = set(tainted)
        started = time.monotonic()
        injected: dict[str, float] = {}
        for offset, node in schedule:
            delay = offset - (time.monotonic() - started)
            if delay > 0:
                time.sleep(delay)
            post_faults(standin, {node: {"xid": FATAL_XID}})
            injected[node] = time.time()
        faulted = {node for _, node in schedule}
        deadline = time.monotonic() + timeout
        last_change, count = time.monotonic(), 0
        while time.monotonic() < deadline:
            now_count = len(faulted & set(tainted))
            if now_count != count:
                last_change, count = time.monotonic(), now_count
            if count == len(faulted) or (rails == "stack" and time.monotonic() - last_change > settle_s):
                break
            time.sleep(0.5)
        first_served = {k: float(v) for k, v in served(standin).items()}
        breaker, phases, queries = guard_readings(_guard_metrics(lay))
        scrapes = scrape_seconds(prometheus_url, time.monotonic() - started)
        wrong = sorted(set(tainted) - faulted - before)
    latencies = [tainted[n] - first_served[n] for n in faulted if n in tainted and n in first_served]
    early = sorted(n for n in faulted if n in tainted and n in first_served and tainted[n] < first_served[n])
    if early:
        raise control.ClusterError(f"tainted before their fault was served (left from an earlier storm?): {early}")
    post_faults(standin, {n: {} for n in faulted})
    out: dict[str, Any] = {"faults": faults, "rails": rails, "spread_s": spread_s, "seed": seed,
                           "tainted": len(latencies), "healthy_nodes_tainted": len(wrong), "breaker_tripped": breaker,
                           "tainted_before_the_storm": len(before), "guard_cycle_phase_mean_s": phases,
                           "guard_query_mean_s": queries, "fleet_scrape_s": scrapes}
    if wrong:
        out["healthy_nodes_tainted_names"] = wrong[:20]
    if latencies:
        out.update({k: round(v, 2) for k, v in percentiles(latencies).items() if k != "n"})
        # From the fault itself: adds the wait for Prometheus' next scrape of it (the DCGM interval).
        out["from_fault"] = {k: round(v, 2) for k, v in percentiles(
            [tainted[n] - injected[n] for n in faulted if n in tainted]).items() if k != "n"}
    say(f"{faults} faults ({rails} rails): {out}")
    return out


#: The guard's probation in the switch storm, in place of the stack's half hour: the release is measured, not waited
#: out (the mechanics do not depend on its length).
SWITCH_PROBATION_S = 20


def switch_storm(lay: Layout, stack: str, label_prefix: str, standin: str, prometheus_url: str, leaf: str,
                 leaf_nodes: Sequence[str], spread_s: float = 5.0, timeout: float = 300.0,
                 probation_s: int = SWITCH_PROBATION_S) -> dict[str, Any]:
    """A leaf switch fails: every node under ``leaf`` loses its InfiniBand ports within ``spread_s``. Read as it
    must be, that is one fault: every node of the leaf fenced with the switch-fault taint naming the leaf and its
    switch condition false, none of them quarantined (and so drained) on its own, nothing outside the leaf
    touched, and the stack's own rails (the guard runs with them) not counting it, so the breaker stays closed.
    Latencies run from the first scrape that served a node's port down to its fence and to its condition; the port
    signal's hold is part of them. Then the switch is fixed: the ports come back, one node of the leaf gets the
    switch's repair mark (a port down makes the fault fatal), and the release is timed from the mark to the last
    fence gone, the guard's probation (``probation_s``) included."""
    from kubernetes import client

    from agents.health_guard.contract import SWITCH_CONDITION_TYPE, Names

    names = Names(label_prefix)
    wait_no_xid(prometheus_url)
    restart_guard(lay, stack, prometheus_url, "stack", len(leaf_nodes), extra={"probation_seconds": probation_s})
    time.sleep(5)  # the guard's first poll sees a healthy fleet
    wanted = set(leaf_nodes)
    with (taint_watch(lay, names.switch_fault) as fenced, taint_watch(lay, names.taint) as quarantined,
          condition_watch(lay, SWITCH_CONDITION_TYPE, "False") as conditioned):
        time.sleep(2)
        before = set(fenced) | set(quarantined)
        started = time.monotonic()
        for i, node in enumerate(leaf_nodes):
            delay = spread_s * i / max(1, len(leaf_nodes)) - (time.monotonic() - started)
            if delay > 0:
                time.sleep(delay)
            post_faults(standin, {node: {"ib_state": 1}})
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not (wanted <= set(fenced) and wanted <= set(conditioned)):
            time.sleep(0.5)
        time.sleep(5)  # a quarantine or a fence outside the leaf would show by now
        first_served = {k: float(v) for k, v in served(standin).items()}
        breaker, phases, queries = guard_readings(_guard_metrics(lay))
        seen_fenced, seen_quarantined = set(fenced) - before, set(quarantined) - before
        seen_conditioned = set(conditioned) & wanted
    api: Any = client.CoreV1Api(control.api_client(lay))
    values = {n.metadata.name: t.value for n in api.list_node().items for t in n.spec.taints or []
              if t.key == names.switch_fault and n.metadata.name in wanted}
    latencies = [fenced[n] - first_served[n] for n in wanted if n in fenced and n in first_served]
    to_condition = [conditioned[n] - first_served[n] for n in wanted if n in conditioned and n in first_served]
    out: dict[str, Any] = {
        "leaf": leaf, "nodes": len(wanted), "fenced": len(seen_fenced & wanted),
        "fenced_naming_the_leaf": sum(1 for v in values.values() if v == leaf),
        "fenced_outside_the_leaf": len(seen_fenced - wanted), "quarantined": len(seen_quarantined),
        # The guard drains only the nodes it quarantines: a switch fault drains none.
        "nodes_drained": len(seen_quarantined & wanted), "conditions": len(seen_conditioned),
        "breaker_tripped": breaker, "spread_s": spread_s, "guard_cycle_phase_mean_s": phases,
        "guard_query_mean_s": queries, "probation_s": probation_s}
    if seen_quarantined:
        out["quarantined_names"] = sorted(seen_quarantined)[:20]
    if latencies:
        out.update({k: round(v, 2) for k, v in percentiles(latencies).items() if k != "n"})
    if to_condition:
        out["to_condition_s"] = {k: round(v, 2) for k, v in percentiles(to_condition).items() if k != "n"}
    out.update(_switch_release(api, names, standin, leaf_nodes, timeout + probation_s))
    say(f"switch {leaf} down ({len(wanted)} nodes): {out}")
    return out


def _switch_release(api: Any, names: Any, standin: str, leaf_nodes: Sequence[str], timeout: float) -> dict[str, Any]:
    """The switch fixed: its ports back, then its repair mark on one node of the leaf; how long until no node of the
    leaf is fenced, and how many were released."""
    post_faults(standin, {n: {} for n in leaf_nodes})
    api.patch_node(leaf_nodes[0], {"metadata": {"labels": {names.switch_repaired: "scale-bench"}}})
    marked = time.monotonic()
    wanted = set(leaf_nodes)
    deadline = marked + timeout
    fenced = wanted
    while time.monotonic() < deadline:
        fenced = {n.metadata.name for n in api.list_node().items
                  if n.metadata.name in wanted and any(t.key == names.switch_fault for t in n.spec.taints or [])}
        if not fenced:
            break
        time.sleep(1)
    out: dict[str, Any] = {"released": len(wanted - fenced)}
    if not fenced:
        out["release_after_repair_s"] = round(time.monotonic() - marked, 2)
    return out


def clear(lay: Layout, label_prefix: str) -> int:
    """Between storms: stop the guard, then take its marks off every node (the quarantine's taint, label, reasons
    and history, and a switch fault's fence), as a bulk repair would, so the next storm starts from a fleet with no
    quarantine in its last hour and no fenced leaf."""
    from kubernetes import client

    from agents.health_guard.contract import Names

    proc = control.load_proc(lay, GUARD)
    if proc is not None:
        control.stop_process(lay, proc)
    names = Names(label_prefix)
    api: Any = client.CoreV1Api(control.api_client(lay))
    cleared = 0
    for node in api.list_node().items:
        taints = node.spec.taints or []
        annotations = node.metadata.annotations or {}
        marks = [k for k in (names.since, names.reasons, names.detail, names.history, names.overridden,
                             names.switch_reasons, names.switch_since, names.switch_repaired) if k in annotations]
        ours = (names.taint, names.switch_fault)
        if not marks and not any(t.key in ours for t in taints):
            continue
        body = {"metadata": {"labels": dict.fromkeys((*ours, names.switch_repaired)),
                             "annotations": dict.fromkeys(marks), "resourceVersion": node.metadata.resource_version},
                "spec": {"taints": [t.to_dict() for t in taints if t.key not in ours]}}
        api.patch_node(node.metadata.name, body)
        cleared += 1
    return cleared
