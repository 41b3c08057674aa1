"""The stack at production size on the local control plane (`make bench-scale`): gangs, fault storms, Pulumi, and
what it all costs the API server.

The runs take many minutes per shape, so `make bench` reports what the last `make bench-scale` wrote
(``.state/scale/results.json``, one entry per shape) rather than running it again; the report says when it has
not run. Every figure is measured on this machine's control plane (kwok nodes, real API server, etcd and Volcano).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent.parent / ".state" / "scale" / "results.json"
#: Where the figures' plot is drawn; ``bench/run.py`` copies it beside the report as ``scale.png``.
PLOT = RESULTS.parent / "scale.png"
#: The published anchors the figures stand beside (DESIGN.md, fourth round; NVSentinel's tests/scale-tests).
ANCHORS: dict[str, Any] = {
    "gang_bind_goal_s": 30.0,
    "apiserver_mutating_slo_s": 1.0,
    "nvsentinel_taint_s": {"150": {"min": 1.79, "p50": 16.75, "p90": 28.15, "p99": 31.35},
                           "375": {"p50": 91.0, "p90": 163.0}},
    "storm_goal_s": {"p50": 2.0, "p90": 5.0},
    "pulumi_up_goal_s": 300.0,
    "pulumi_preview_nochange_goal_s": 60.0,
    "gang_evict_goal_s": 60.0,
}


#: The gang size the bind goal is set at (Llama 3's training size, one pod per 8-GPU node).
GOAL_GANG_PODS = 2048
#: What holds each goal on this machine where it is missed (docs/scale.md, "What this machine bounds"): the
#: component, what it spends the time on, and what was tried. Kept beside the figures so a missed goal in the report
#: always names its component.
BOUNDED_BY: dict[str, str] = {
    "gang_bind": "vc-scheduler: filtering and scoring every pod against the nodes on a CPU it shares with the API "
                 "server (its own CPU seconds to place the gang are in the gang table), plus one discarded session "
                 "while the handover gates are lifted (Volcano 1.14.1 counts a gated pod as a valid gang member); "
                 "tried: percentageOfNodesToFind, GPU-packing scoring, the controllers' client rate",
    "storm": "the fleet stand-in's one scrape of every GPU (a fault is queryable only once that scrape is in) and "
             "Prometheus ingesting it beside the guard's queries on two cores; tried: queries side by side, a fixed-"
             "rate cycle, one XID selection, taints first (a 1 s poll meets the goal at 150 faults)",
    "gang_evict": "vc-controller-manager: Volcano's RestartJob kills a gang pod after pod (killPods: a patch and a "
                  "delete per pod, one at a time), whatever its client rate; the stack's answer is not to restart "
                  "the whole gang (replace one, restart in place: docs/training.md)",
    "apiserver_mutating": "kube-apiserver on two cores shared with etcd, kwok and Volcano while thousands of pods "
                          "are created, bound and patched",
    "pulumi_up": "the Pulumi engine", "pulumi_preview": "the Pulumi engine",
}


def _goal(goal: str, kind: str, target: float, measured: float | None) -> dict[str, Any]:
    met = None if measured is None else measured <= target
    return {"goal": goal, "target_s": target, "measured_s": None if measured is None else round(measured, 3),
            "met": met, "bounded_by": BOUNDED_BY[kind] if met is False else None}


def _mapping(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _figure(value: Any) -> float | None:
    """A measured figure (seconds, MiB): a finite, non-negative number, else None (not measured, or not one)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < math.inf:
        return None
    return float(value)


def _sizes(figures: dict[str, Any]) -> list[int]:
    """The sizes ``figures`` is keyed by, as the runs write them (a size's digits, no sign, no leading zero)."""
    return sorted(int(k) for k in figures
                  if isinstance(k, str) and k.isascii() and k.isdigit() and str(int(k)) == k)


def goals(shape: dict[str, Any], anchors: dict[str, Any] = ANCHORS) -> list[dict[str, Any]]:
    """Every goal the shape has a figure for, measured against its target; a missed one names what holds it. A
    figure that is not a number of seconds reads as not measured (the results file is read, not trusted)."""
    out: list[dict[str, Any]] = []
    binds = _mapping(shape.get("gang_bind_s"))
    if str(GOAL_GANG_PODS) in binds:
        out.append(_goal(f"{GOAL_GANG_PODS:,}-pod gang bound, p99", "gang_bind", anchors["gang_bind_goal_s"],
                         _figure(_mapping(binds[str(GOAL_GANG_PODS)]).get("p99"))))
    for key, poll_key in (("storm_taint_s", "storm_guard_poll_s"), ("storm_taint_fast_poll_s", "storm_fast_poll_s")):
        storms = _mapping(shape.get(key))
        # The storm goal is set at NVSentinel's two sizes.
        for faults in (n for n in _sizes(storms) if str(n) in anchors["nvsentinel_taint_s"]):
            for pct in ("p50", "p90"):
                out.append(_goal(f"{faults:,} faults tainted, {pct} (guard poll {shape.get(poll_key)} s)", "storm",
                                 anchors["storm_goal_s"][pct], _figure(_mapping(storms[str(faults)]).get(pct))))
    evictions = _mapping(shape.get("gang_evict_s"))
    if _sizes(evictions):
        size = _sizes(evictions)[-1]
        out.append(_goal(f"{size:,}-pod gang evicted after a fatal fault, p50", "gang_evict",
                         anchors["gang_evict_goal_s"], _figure(_mapping(evictions[str(size)]).get("p50"))))
    for key, when in (("steady_apiserver_mutating_p99_s", "the shape at rest"),
                      ("apiserver_mutating_p99_s", "the gang runs"), ("storm_apiserver_mutating_p99_s", "the storms")):
        if shape.get(key) is not None:
            out.append(_goal(f"mutating API calls p99 over {when}", "apiserver_mutating",
                             anchors["apiserver_mutating_slo_s"], _figure(shape[key])))
    for key, goal, kind, target in (("pulumi_up_s", "first `pulumi up`", "pulumi_up", "pulumi_up_goal_s"),
                                    ("pulumi_preview_nochange_s", "no-change `pulumi preview`", "pulumi_preview",
                                     "pulumi_preview_nochange_goal_s")):
        if shape.get(key) is not None:
            out.append(_goal(goal, kind, anchors[target], _figure(shape[key])))
    return out


def agent_rss(shape: dict[str, Any]) -> dict[str, float]:
    """Each process's largest resident set over every reading of the shape's runs (at rest, after the gangs, around
    the storms), largest first."""
    out: dict[str, float] = {}
    for key in ("process_usage_at_rest", "process_usage_after", "storms_process_usage_at_rest",
                "storms_process_usage_after"):
        for process, usage in _mapping(shape.get(key)).items():
            rss = _figure(_mapping(usage).get("rss_mib"))
            if rss is not None:
                out[process] = max(out.get(process, 0.0), rss)
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def topology_figures(shape: dict[str, Any]) -> dict[str, Any]:
    """The fabric's figures under the names the topology work reports them by: leaves each gang size spanned
    against the fewest it could, and the switch fault's time to its condition and the nodes it drained (none)."""
    out: dict[str, Any] = {}
    gangs = _mapping(shape.get("gangs"))
    spans = {str(n): {"p50": _figure(_mapping(_mapping(gangs[str(n)]).get("leaves_spanned")).get("p50")),
                      "max": _figure(_mapping(_mapping(gangs[str(n)]).get("leaves_spanned")).get("max")),
                      "minimum": _figure(_mapping(gangs[str(n)]).get("fewest_leaves"))} for n in _sizes(gangs)}
    spans = {k: v for k, v in spans.items() if v["p50"] is not None}
    if spans:
        out["leaves_spanned"] = spans
    switch = _mapping(shape.get("switch_fault"))
    if "to_condition_s" in switch:
        out["switch_fault_to_condition_s"] = switch["to_condition_s"]
    if "nodes_drained" in switch:
        out["switch_fault_nodes_drained"] = switch["nodes_drained"]
    return out


#: Keys ``run`` derives from the measured ones each time it reads them (never kept in the results file).
DERIVED = ("cpu_cores_during_runs", "agent_rss_mib", "goals", "leaves_spanned", "switch_fault_to_condition_s",
           "switch_fault_nodes_drained")


def run(path: Path = RESULTS) -> dict[str, Any]:
    if not path.is_file():
        return {"status": "not run here: run `make bench-scale` first"}
    data: dict[str, Any] = json.loads(path.read_text())
    shapes = data.get("shapes", {})
    for shape in shapes.values():
        # Derived here, from what the runs measured.
        shape["cpu_cores_during_runs"] = cpu_cores(shape)
        shape["agent_rss_mib"] = agent_rss(shape)
        shape["goals"] = goals(shape)
        shape.update(topology_figures(shape))
        # A shape that ran whole was stopped by nothing; a run that fell over records its component itself.
        shape.setdefault("limited_by", None)
    result: dict[str, Any] = {"anchors": ANCHORS, "shapes": shapes}
    if plot(result, path.parent / PLOT.name):
        result["plot"] = str(path.parent / PLOT.name)
    return result


def plot(result: dict[str, Any], out: Path) -> bool:
    """Bind time against gang size (p50, with p99 above it) beside the goal, and each open-rails storm's latency
    percentiles beside NVSentinel's published ones; False when there is nothing to draw."""
    shapes, anchors = result["shapes"], result["anchors"]
    gangs = [(name, sorted((int(size), g["bound"]) for size, g in (sh.get("gangs") or {}).items()))
             for name, sh in shapes.items()]
    storms = [(name, run) for name, sh in shapes.items() for run in (sh.get("storm_taint_s") or {}).values()
              if run.get("rails") == "open" and run.get("p50") is not None]
    if not any(points for _, points in gangs) and not storms:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    for name, points in gangs:
        if points:
            sizes = [size for size, _ in points]
            (line,) = left.plot(sizes, [b["p50"] for _, b in points], marker="o", label=f"{name}: p50")
            left.scatter(sizes, [b.get("p99", b["p50"]) for _, b in points], marker="^", s=20,
                         color=line.get_color(), label=f"{name}: p99")
    left.axhline(anchors["gang_bind_goal_s"], color="grey", linestyle="--", label="goal (p99)")
    left.set(xscale="log", yscale="log", xlabel="gang size (pods, 8 GPUs each)",
             ylabel="seconds until every pod is bound", title="Gang bind time")
    left.legend(fontsize=7)
    order = ("min", "p50", "p90", "p99")
    for name, run in storms:
        right.plot(order, [run.get(k) for k in order], marker="o", label=f"{name}: {run['faults']} faults")
    for faults, ref in anchors["nvsentinel_taint_s"].items():
        keys = [k for k in order if k in ref]
        right.plot(keys, [ref[k] for k in keys], marker="x", linestyle=":", label=f"NVSentinel: {faults} faults")
    right.axhline(anchors["storm_goal_s"]["p50"], color="grey", linestyle="--", linewidth=0.8, label="goal p50")
    right.axhline(anchors["storm_goal_s"]["p90"], color="grey", linestyle="-.", linewidth=0.8, label="goal p90")
    right.set(yscale="log", xlabel="percentile", ylabel="seconds from the served fault to the taint",
              title="Fault storm: fault to quarantine")
    right.legend(fontsize=7)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=90)
    plt.close(fig)
    return True


def cpu_cores(shape: dict[str, Any]) -> dict[str, float]:
    """Cores each process used on average from the rest reading to the one after the gangs and the storms."""
    rest, after = shape.get("process_usage_at_rest") or {}, shape.get("process_usage_after") or {}
    span = shape.get("usage_span_s")
    if not span:
        return {}
    out = {p: round((after[p]["cpu_s"] - rest[p]["cpu_s"]) / span, 2) for p in after if p in rest}
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def _cell(stats: dict[str, Any] | None, key: str) -> str:
    return "–" if not stats or stats.get(key) is None else f"{stats[key]:.1f}"


def _gang_table(shapes: dict[str, Any]) -> list[str]:
    lines = ["| shape | nodes | GPUs | up (s) | gang pods | runs | all created | all ungated | all bound p50 | "
             "bound p99 | scheduler CPU to bind p50 | all Running p50 | Running p99 | gone after cancel p50 | "
             "leaves spanned (fewest) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, shape in shapes.items():
        for size, gang in shape.get("gangs", {}).items():
            spanned = gang.get("leaves_spanned")
            leaves = f"{spanned['max']:g} ({gang['fewest_leaves']})" if spanned else "–"
            lines.append(
                f"| {name} | {shape['nodes']:,} | {shape['gpus']:,} | {shape['up_s']} | {int(size):,} | "
                f"{gang['bound']['n']} | {_cell(gang.get('created'), 'p50')} | {_cell(gang.get('ungated'), 'p50')} | "
                f"{_cell(gang['bound'], 'p50')} | {_cell(gang['bound'], 'p99')} | "
                f"{_cell(gang.get('scheduler_cpu_s'), 'p50')} | {_cell(gang['running'], 'p50')} | "
                f"{_cell(gang['running'], 'p99')} | {_cell(gang.get('deleted'), 'p50')} | {leaves} |")
    return lines


def _storm_table(shapes: dict[str, Any], anchors: dict[str, Any]) -> list[str]:
    lines = ["| shape | faults | rails | guard poll (s) | tainted | healthy nodes tainted | min | p50 | p90 | p99 | "
             "from the fault p50 / p90 | guard cycle: observe / act (mean s) | slowest query (mean s) | "
             "stand-in scrape mean (s) | breaker | NVSentinel p50 / p90 |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, shape in shapes.items():
        poll = shape.get("storm_guard_poll_s")
        runs = [(run, poll) for run in (shape.get("storm_taint_s") or {}).values()]
        runs += [(run, shape.get("storm_fast_poll_s")) for run in (shape.get("storm_taint_fast_poll_s") or {}).values()]
        if shape.get("storm_stack_rails"):
            runs.append((shape["storm_stack_rails"], poll))
        for run, run_poll in runs:
            ref = anchors["nvsentinel_taint_s"].get(str(run["faults"]))
            nvs = f"{ref['p50']} / {ref['p90']}" if ref and run["rails"] == "open" else "–"
            phases = run.get("guard_cycle_phase_mean_s") or {}
            queries = run.get("guard_query_mean_s") or {}
            slowest = max(queries.items(), key=lambda kv: kv[1]) if queries else None
            lines.append(f"| {name} | {run['faults']} | {run['rails']} | {run_poll if run_poll is not None else '–'} | "
                         f"{run['tainted']} | {run['healthy_nodes_tainted']} | {_cell(run, 'min')} | "
                         f"{_cell(run, 'p50')} | {_cell(run, 'p90')} | {_cell(run, 'p99')} | "
                         f"{_cell(run.get('from_fault'), 'p50')} / {_cell(run.get('from_fault'), 'p90')} | "
                         f"{_cell(phases, 'observe')} / {_cell(phases, 'act')} | "
                         f"{f'{slowest[0]} {slowest[1]:g}' if slowest else '–'} | "
                         f"{_cell(run.get('fleet_scrape_s'), 'mean')} | "
                         f"{'tripped' if run.get('breaker_tripped') else 'held'} | {nvs} |")
    return lines


def _switch_table(shapes: dict[str, Any]) -> list[str]:
    lines = ["| shape | leaf | nodes | fenced as one switch fault | switch condition false | quarantined (drained) on "
             "their own | fenced outside the leaf | breaker | served to fenced p50 | p90 | max | served to condition "
             "p50 | released after the repair mark (s, probation) |", "|---" * 13 + "|"]
    for name, shape in shapes.items():
        sw = shape.get("switch_fault")
        if sw:
            released = "–" if "released" not in sw else (
                f"{sw['released']} in {sw['release_after_repair_s']} s ({sw.get('probation_s', '?')} s)"
                if "release_after_repair_s" in sw else f"{sw['released']} of {sw['nodes']}, not all")
            lines.append(f"| {name} | {sw['leaf']} | {sw['nodes']} | {sw['fenced_naming_the_leaf']} | "
                         f"{sw.get('conditions', '–')} | {sw['quarantined']} | {sw['fenced_outside_the_leaf']} | "
                         f"{'tripped' if sw.get('breaker_tripped') else 'held'} | {_cell(sw, 'p50')} | "
                         f"{_cell(sw, 'p90')} | {_cell(sw, 'max')} | {_cell(sw.get('to_condition_s'), 'p50')} | "
                         f"{released} |")
    return lines if len(lines) > 2 else []


def _crash_table(shapes: dict[str, Any]) -> list[str]:
    lines = ["| shape | gang pods | runs | detect p50 | evict p50 | evict p99 | Volcano's pod writes meanwhile | "
             "old pods gone p50 | reschedule p50 | fault to Running again p50 | p99 |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, shape in shapes.items():
        for size, crash in (shape.get("crash") or {}).items():
            w = crash.get("evict_writes_by_volcano")
            writes = f"{w['calls']:,} × {w['p50_s']:.3f} s, {w['most_in_flight']} at once" if w else "–"
            lines.append(f"| {name} | {int(size):,} | {crash['evict_s']['n']} | {_cell(crash['detect_s'], 'p50')} | "
                         f"{_cell(crash['evict_s'], 'p50')} | {_cell(crash['evict_s'], 'p99')} | {writes} | "
                         f"{_cell(crash.get('gone_s'), 'p50')} | "
                         f"{_cell(crash['reschedule_s'], 'p50')} | {_cell(crash['running_again_s'], 'p50')} | "
                         f"{_cell(crash['running_again_s'], 'p99')} |")
    return lines if len(lines) > 2 else []


#: The burst phases in the order the scenario reaches them, and what each means (bench/bench_sim_vs_e2e.py).
BURST_PHASES = (("time_to_ungate_s", "the gang's gate lifted"),
                ("time_to_standby_ready_s", "every standby asked for ready"),
                ("time_to_preempt_s", "no ready replica left in the gang's pool"),
                ("time_to_open_s", "the burst taint off every virtual node"),
                ("time_to_ready_external_s", "every replica ready again, the displaced ones outside"),
                ("time_to_gang_running_s", "the whole gang Running"),
                ("time_to_standby_gone_s", "the standby back to zero"),
                ("time_to_close_s", "the taint back (NoSchedule), from the gang's end"),
                ("time_to_return_s", "every replica home, from the gang's end"),
                ("time_to_return_standby_gone_s", "the return's standby gone, from the gang's end"))


def _burst_table(shapes: dict[str, Any]) -> list[str]:
    """Each shape's burst run beside the simulator's prediction for the same shape and settings, phase by phase."""
    runs = {name: _mapping(shape.get("burst")) for name, shape in shapes.items() if _mapping(shape.get("burst"))}
    if not runs:
        return []
    lines = ["| phase | " + " | ".join(f"{n} real s | {n} simulated s" for n in runs) + " |",
             "|---|" + "---|---|" * len(runs)]
    for key, meaning in BURST_PHASES:
        cells = []
        for run in runs.values():
            real, sim = _mapping(run.get("phases")).get(key), _mapping(run.get("simulated")).get(key)
            cells += ["never" if _figure(real) is None else f"{_figure(real):g}",
                      "never" if _figure(sim) is None else f"{_figure(sim):g}"]
        lines.append(f"| {meaning} | " + " | ".join(cells) + " |")
    lines.append("")
    for name, run in runs.items():
        plan = _mapping(run.get("plan"))
        listed = run.get("descheduler_evictions_per_cycle")
        cycles = [c for c in listed if _figure(c) is not None] if isinstance(listed, list) else []
        measured = _mapping(shapes.get(name)).get("measured_burst", "?")
        stalled = _mapping(run.get("stalled"))
        clear = run.get("clear_after_s")
        lines.append(
            f"- {name} ({run.get('timings', '?')} timings, measured {measured}): the services at maxReplicas "
            f"({plan.get('inference_gpus')} GPUs), {plan.get('background_pods')} pods of other training, then a "
            f"gang of {plan.get('gang_pods')} pods over pool {plan.get('pool')}: on-prem "
            f"{plan.get('displaced_gpus')} GPUs short, the providers hold {plan.get('external_gpus')}. Most "
            f"replicas ready outside at once {run.get('most_external_ready')}; fewest ready per service "
            f"{run.get('fewest_ready')} (minReplicas {run.get('min_replicas')}); burst taint effects seen "
            f"{run.get('burst_taint_effects')}; descheduler evictions per cycle "
            f"{max(cycles) if cycles else '–'} at most over {len(cycles)} cycles "
            f"(limit {run.get('descheduler_limit')}); mutating calls p99 {run.get('apiserver_mutating_p99_s')} s."
            + (f" The handover cleared the gang's room after {_figure(clear):g} s (reserving its nodes first); its "
               f"evictions by answer {run.get('burst_controller_evictions') or {}}." if _figure(clear) else "")
            + (f" **Stalled**: {stalled.get('reason')}." if stalled else ""))
    return [*lines, ""]


def _goals_table(shapes: dict[str, Any]) -> list[str]:
    rows = [(name, g) for name, shape in shapes.items() for g in shape.get("goals") or []]
    if not rows:
        return []
    lines = ["**Goals** (each shape's figures against the issue's targets; a missed goal names what holds it on this",
             "machine):", "", "| shape | goal | target (s) | measured (s) | met | what holds it |",
             "|---|---|---|---|---|---|"]
    lines += [f"| {name} | {g['goal']} | {g['target_s']:g} | {'–' if g['measured_s'] is None else g['measured_s']} | "
              f"{ {True: 'yes', False: '**no**', None: '–'}[g['met']] } | {g['bounded_by'] or ''} |"
              for name, g in rows]
    return [*lines, ""]


def to_markdown(result: dict[str, Any]) -> str:
    if "shapes" not in result:
        return str(result.get("status", "no results"))
    shapes, anchors = result["shapes"], result["anchors"]
    lines = [
        "Each shape runs on this machine's control plane (2 cores): etcd, the API server, the controller manager,",
        "kwok for the nodes, Volcano's scheduler and controllers, the burst controller, health guard and descheduler",
        "as the stack's ServiceAccounts; the stack's own objects applied; gangs of 8-GPU pods submitted through",
        "`gpucluster train submit`, one after the other. Seconds from the submit until the gang's last pod reached",
        "each stage, and the CPU seconds Volcano's scheduler spent meanwhile until the last bind (what placing the",
        "gang costs it, whatever share of the two cores it got) (docs/scale.md).",
        "",
        *_gang_table(shapes),
        "",
        f"Goal: a 2,048-pod gang bound in under {anchors['gang_bind_goal_s']:.0f} s p99.",
        "",
        *([f"![Gang bind time against gang size; fault-storm latency beside NVSentinel's]({result['plot']})", ""]
          if result.get("plot") else []),
        "**Fault storms** (seconds from the first scrape that served a node's fault to the guard's taint, and from the",
        "fault itself, which adds the wait for the next scrape; NVSentinel's own test: 1,503 nodes, faults over",
        "0–30 s). Goal: p50 under "
        f"{anchors['storm_goal_s']['p50']:.0f} s and p90 under {anchors['storm_goal_s']['p90']:.0f} s.",
        "",
        *_storm_table(shapes, anchors),
        "",
    ]
    switches = _switch_table(shapes)
    if switches:
        lines += ["**A leaf switch down** (every node under one leaf loses its InfiniBand ports within seconds, the",
                  "guard on the stack's own rails: one switch fault fences the leaf, no node is quarantined on its own",
                  "and the breaker does not count it; seconds from the first scrape that served a node's ports down",
                  "to its fence, the port signal's hold included).", "", *switches, ""]
    crashes = _crash_table(shapes)
    if crashes:
        lines += ["**Let it crash** (a fatal fault on one node under a running gang: the guard's taint, every pod of",
                  "the gang marked for deletion by the guard and Volcano's RestartJob, then gone (kwok's pace here),",
                  "the new generation bound, then Running; seconds; Volcano's pod writes: its job controller's",
                  "writes to the pods from the taint until the last was marked, their p50 latency and the most in",
                  "flight at once, from the audit log). Goal: the whole gang evicted in under "
                  f"{anchors['gang_evict_goal_s']:.0f} s.", "",
                  *crashes, ""]
    bursts = _burst_table(shapes)
    if bursts:
        lines += ["**Burst at scale** (the stack's services at maxReplicas, other training leaving on-prem short, a",
                  "gang over a whole pool: the handover, the burst onto the providers' virtual nodes (kwok nodes as",
                  "their virtual kubelets register them), the gang's end, the descheduler's return; each phase's",
                  "first moment, sampled every second, from the gang's creation unless said; beside the simulator's",
                  "prediction for the same shape, settings and start times; `never`: not reached in the run).", "",
                  *bursts]
    lines += _goals_table(shapes)
    for name, shape in shapes.items():
        lines += [f"### {name}", ""]
        if shape.get("storm_stack_rails_dropped"):
            lines += [f"The storm with the stack's rails is not reported: {shape['storm_stack_rails_dropped']}.", ""]
        if "pulumi_up_s" in shape:
            lines += [f"Pulumi (measured {shape.get('measured_pulumi', '?')}, {shape.get('pulumi_nodes', '?')} nodes, "
                      f"{shape.get('resources', '?')} resources, state {shape.get('state_bytes', 0) / 1e6:.1f} MB, "
                      f"parallelism: {shape.get('parallel', '?')}): first `pulumi up` {shape['pulumi_up_s']} s "
                      f"(goal {anchors['pulumi_up_goal_s']:.0f} s), no-change preview "
                      f"{shape.get('pulumi_preview_nochange_s')} s "
                      f"(goal {anchors['pulumi_preview_nochange_goal_s']:.0f} s), no-change `pulumi up --refresh` "
                      f"{shape.get('pulumi_up_nochange_s')} s.", ""]
        p99 = shape.get("apiserver_mutating_p99_s")
        storm_p99 = shape.get("storm_apiserver_mutating_p99_s")
        if shape.get("conditions"):
            lines += [f"Measured {shape['conditions']}: its timings are upper bounds of upper bounds.", ""]
        storms_at = f" (storms {shape['measured_storms']})" if shape.get("measured_storms") else ""
        measured = shape.get("measured_bench", shape.get("measured", "?"))
        lines += [f"Measured {measured}{storms_at}. Mutating API calls p99 "
                  f"{'–' if p99 is None else f'{p99:.3f} s'} over the gang runs, "
                  f"{'–' if storm_p99 is None else f'{storm_p99:.3f} s'} over the storms (SLO ≤ "
                  f"{anchors['apiserver_mutating_slo_s']:.0f} s). Stack objects applied "
                  f"{shape.get('objects_applied')}, left out {shape.get('objects_left_out')}.", ""]
        for title, key in (("over the gang runs", "apiserver_mutating_p99_by_call"),
                           ("over the storms", "storm_apiserver_mutating_p99_by_call")):
            calls = shape.get(key) or {}
            if calls:
                lines += [f"Slowest mutating calls {title} (p99 per resource and verb, as the SLO takes them): "
                          + ", ".join(f"`{call}` {v['p99_s']} s ({v['calls']:,} calls)" for call, v in calls.items())
                          + ".", ""]
        if shape.get("node_pools_converged_s") is not None:
            lines += [f"The node-pool agent had recorded every GPU node {shape['node_pools_converged_s']} s after "
                      "the agents started (one patch per node; the pools' labels and taints were already there).",
                      ""]
        for title, key in (("at rest (steady state, before any gang)", "steady_requests_per_s_by_agent"),
                           ("over the gang runs", "requests_per_s_by_agent"),
                           ("over the storms", "storm_requests_per_s_by_agent")):
            agents = shape.get(key) or {}
            if agents:
                lines += [f"Requests per agent {title}:", "", "| agent | requests/s | mutating/s | requests |",
                          "|---|---|---|---|"]
                lines += [f"| {a} | {v['requests_per_s']} | {v['mutating_per_s']} | {v['requests']:,} |"
                          for a, v in list(agents.items())[:12]]
                lines.append("")
        usage = shape.get("process_usage_after") or {}
        if usage:
            rest = shape.get("process_usage_at_rest") or {}
            cores = shape.get("cpu_cores_during_runs") or {}
            lines += ["| process | RSS MiB at rest | RSS MiB after | cores used meanwhile |", "|---|---|---|---|"]
            lines += [f"| {p} | {rest.get(p, {}).get('rss_mib', '–')} | {u['rss_mib']} | {cores.get(p, '–')} |"
                      for p, u in usage.items()]
            lines.append("")
        tuning = shape.get("tuning") or []
        if tuning:
            lines += ["Control-plane settings for this size:", ""]
            lines += [f"- `{t['component']} {t['flag']}`: {t['why']}" for t in tuning]
            lines.append("")
    return "\n".join(lines)
