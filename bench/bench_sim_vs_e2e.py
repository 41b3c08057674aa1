"""Simulator vs real: the local stack's burst scenario in the simulator, next to the phases `make e2e` measured.

The same scenario as tests/test_e2e.py::test_burst_scenario, on the model of Pulumi.local.yaml (4 nodes × 8
GPUs, one 16-GPU provider, one service at minReplicas, the stack's burst, handover and descheduler
settings): inference runs on-prem with the taint on; a gang that needs every on-prem GPU arrives behind
the handover gate; once it has run, it ends and inference returns. The simulator records when each phase
the e2e waits for holds, with the same definitions and in the same order (the e2e waits for one phase
after another, so a phase that came first is timed when its predecessor is), and the controller core's
decisions (the same `decide`) in order. Phase times count from the gang's creation, close and return from
the gang's end, as the e2e counts them. The real side is the last `make e2e`
(.state/localcluster/e2e-phases.json, else the committed bench/report.json).

Two environment facts differ from production and the model takes them from the local cluster: pods start in
about a second (kwok nodes, the mock virtual-kubelet), not the production defaults (60 s on-prem, 180 s
external); and the local cluster runs the descheduler as a process on its own interval
(`tools.localcluster.plan.descheduler_command`), not the CronJob's schedule.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from bench import bench_e2e
from bench.committed import REPORT, committed_result
from bench.sim.controller_adapter import ActionKind, BurstSettings, BurstState, Decision, Snapshot
from bench.sim.engine import Simulator
from bench.sim.model import ClusterModel, Latencies
from bench.sim.policies import controller
from bench.sim.run import load_stack
from bench.sim.workload import Gang, Workload
from tools.localcluster.plan import descheduler_command

STACK = "local"
#: Pod start to Ready on the local control plane (kwok nodes, mock virtual-kubelet): about a second.
LOCAL_LATENCIES = Latencies(onprem_start_s=1.0, external_start_s=1.0, hpa_period_s=15.0)
ARRIVAL_S = 600.0  # inference settled on-prem, the taint on, the descheduler cycling
RUN_S = 120.0  # how long the gang runs before the scenario ends it (phases after the end count from there)

#: Phase key (the e2e's) -> what the e2e waits for; the simulator checks the same condition.
PHASES: dict[str, str] = {
    "time_to_standby_ready_s": "minReplicas standby replicas ready on the virtual node",
    "time_to_preempt_s": "no main replica ready on-prem (the gang reclaimed them)",
    "time_to_open_s": "the burst taint off every virtual node",
    "time_to_ready_external_s": "minReplicas main replicas ready on the virtual node",
    "time_to_gang_running_s": "the whole gang running",
    "time_to_standby_gone_s": "the standby back to zero after the handover",
    "time_to_close_s": "the burst taint back (NoSchedule), from the gang's end",
    "time_to_return_s": "no main replica external and minReplicas on-prem, from the gang's end",
    "time_to_return_standby_gone_s": "the standby back to zero after the return, from the gang's end",
}

#: Why a phase differs between the two, by mechanism (the figures are in the table next to it).
WHY: dict[str, str] = {
    "time_to_standby_ready_s": "real: the gated pods' creation by Volcano's job controller, the controller's "
    "watch round trip and the standby Deployment's rollout; simulated: the next 5 s tick, then a 1 s start",
    "time_to_preempt_s": "real: Volcano preempts after its session sees the ungated pods (1 s period) and the "
    "evicted pods terminate gracefully; simulated: the gang deletes inference the instant it is ungated",
    "time_to_open_s": "both: pending inference for pendingGraceSeconds (5 s) opens the burst; real adds the "
    "replacement pods' scheduling attempt and the watch delay, simulated rounds to the 5 s tick",
    "time_to_ready_external_s": "real: the virtual-kubelet's pod start after the taint leaves; simulated: a "
    "pending replica binds in the same event as the flip, ready 1 s later",
    "time_to_gang_running_s": "real: kwok reports the gang's pods Running after binding; simulated: the gang "
    "starts with the preemption, in one event",
    "time_to_standby_gone_s": "both: the standby stays until the main Deployment is ready at its goal; real waits "
    "for a controller pass after the external replicas turn ready, simulated for the next tick",
    "time_to_close_s": "both: closeHoldSeconds (20 s) of enough free GPUs, plus the return standby's start; real "
    "adds the job's deletion and the pods' termination before GPUs count as free",
    "time_to_return_s": "both: the descheduler's cycle (the local process's interval), minPodAgeSeconds and its "
    "per-node limit bound it; the cycles' phase against the gang's end differs (real: from the process's "
    "start; simulated: from the run's start), and real adds each replacement's scheduling and start",
    "time_to_return_standby_gone_s": "both: the next controller pass once the replicas are home",
}


@dataclass
class Trace:
    """What the simulated scenario did: phase times and the core's decisions in order."""

    phases: dict[str, float] = field(default_factory=dict)
    decisions: list[tuple[float, str]] = field(default_factory=list)


class ScenarioSimulator(Simulator):
    """The engine, checking after every event which e2e phase has just been reached."""

    def __init__(self, model: ClusterModel, workload: Workload, settings: BurstSettings, seconds: float) -> None:
        super().__init__(model, workload, controller(model, settings), seconds, check=True)
        self.trace = Trace()
        self.service = self.cluster.services[0]
        self.ended: float | None = None
        assert self.controller is not None
        core = self.controller.decide_fn

        def logged(snapshot: Snapshot, state: BurstState, now: float, s: BurstSettings) -> Decision:
            decision = core(snapshot, state, now, s)
            for line in describe(decision):
                self.trace.decisions.append((now, line))
            return decision

        self.controller.decide_fn = logged

    def check(self) -> None:
        super().check()
        c, svc, t, phases = self.cluster, self.service, self.now, self.trace.phases
        since = t - ARRIVAL_S

        def mark(key: str, holds: bool, start: float = ARRIVAL_S, after: str | None = None) -> None:
            if key not in phases and holds and t >= start and (after is None or after in phases):
                phases[key] = t - start

        # The e2e waits for its phases one after another: a phase counts once the one before it has.
        mark("time_to_standby_ready_s", len(svc.sb_ready) >= svc.min)
        mark("time_to_preempt_s", sum(svc.ready_zone) == 0, after="time_to_standby_ready_s")
        mark("time_to_open_s", all(x is None for x in c.vn_taint), after="time_to_preempt_s")
        mark("time_to_ready_external_s", svc.ready_ext >= svc.min, after="time_to_open_s")
        mark("time_to_gang_running_s", 0 in c.jobs, after="time_to_ready_external_s")
        mark("time_to_standby_gone_s", svc.sb_count() == 0, after="time_to_gang_running_s")
        if self.ended is None and since > 0 and "time_to_gang_running_s" in phases and 0 not in c.jobs:
            self.ended = t
        if self.ended is not None:
            end = self.ended
            mark("time_to_close_s", all(x == "NoSchedule" for x in c.vn_taint), end)
            home = svc.ready_ext == 0 and sum(svc.ready_zone) >= svc.min
            mark("time_to_return_s", home, end, after="time_to_close_s")
            mark("time_to_return_standby_gone_s", svc.sb_count() == 0, end, after="time_to_return_s")


def describe(decision: Decision) -> list[str]:
    """The decision's steps the e2e names: flips, standby scale, gate lifts."""
    out: list[str] = []
    if decision.flipped is not None:  # the flip's own reason, "open: ..." or "close: ..."
        out.extend(r for r in decision.reasons if r.startswith(("open:", "close:")))
    for action in decision.actions:
        if action.kind is ActionKind.SET_STANDBY:
            out.append(f"standby -> {action.replicas}")
        elif action.kind is ActionKind.UNGATE:
            out.append("ungate the gang")
    return out


class FlatWorkload(Workload):
    """Demand that keeps every service at minReplicas (the e2e's idle CPU metric does the same)."""

    def demand(self, service: str, max_replicas: int, t: float) -> float:
        return 1.0


def local_descheduler_interval_s() -> float:
    """The interval the local cluster runs the descheduler at (its command's default, e.g. "20s")."""
    default = str(inspect.signature(descheduler_command).parameters["interval"].default)
    if not default.endswith("s") or not default[:-1].isdigit():
        raise ValueError(f"tools.localcluster.plan.descheduler_command: cannot read the interval {default!r}")
    return float(default[:-1])


def simulate_scenario() -> Trace:
    setup = load_stack(STACK)
    model = replace(setup.model, latencies=LOCAL_LATENCIES,
                    descheduler=replace(setup.model.descheduler, interval_s=local_descheduler_interval_s()))
    pool = model.pools[0]
    gang = Gang(arrival_s=ARRIVAL_S, nodes=pool.nodes, duration_s=RUN_S, pool=pool.name)
    sim = ScenarioSimulator(model, FlatWorkload(gangs=(gang,)), setup.settings, ARRIVAL_S + RUN_S + 900.0)
    sim.run()
    trace = sim.trace
    trace.decisions = [(round(t - ARRIVAL_S, 1), line) for t, line in trace.decisions if t >= ARRIVAL_S]
    return trace


def real_phases(phases: Path = bench_e2e.PHASES, report: Path = REPORT) -> tuple[dict[str, float], str]:
    """The last e2e's phases: this machine's last `make e2e`, else the committed report's."""
    measured = bench_e2e.run(phases)
    if "status" not in measured:
        return {k: v for k, v in measured.items() if k in PHASES}, f"make e2e at {measured['measured_at']}"
    result = committed_result("bench_e2e", report) or {}
    if "measured_at" in result:
        return ({k: v for k, v in result.items() if k in PHASES},
                f"bench/report.json (make e2e at {result['measured_at']})")
    return {}, "no e2e run recorded"


def run() -> dict[str, Any]:
    trace = simulate_scenario()
    real, source = real_phases()
    rows = []
    for key, meaning in PHASES.items():
        sim = trace.phases.get(key)
        e2e = real.get(key)
        rows.append({"phase": key, "meaning": meaning, "simulated_s": None if sim is None else round(sim, 1),
                     "e2e_s": None if e2e is None else round(e2e, 1),
                     "difference_s": None if sim is None or e2e is None else round(e2e - sim, 1),
                     "why": WHY[key]})
    return {
        "name": "simulator vs real: the local stack's burst scenario",
        "stack": STACK,
        "latencies": {"onprem_start_s": LOCAL_LATENCIES.onprem_start_s,
                      "external_start_s": LOCAL_LATENCIES.external_start_s},
        "descheduler_interval_s": local_descheduler_interval_s(),
        "e2e_source": source,
        "phases": rows,
        "simulated_decisions": [f"{t:+.1f} s {line}" for t, line in trace.decisions],
    }


def to_markdown(result: dict[str, Any]) -> str:
    def cell(v: float | None) -> str:
        return "–" if v is None else f"{v:g}"

    lines = [f"### Simulator vs real ({result['stack']} stack; real: {result['e2e_source']})", "",
             "| phase | simulated s | e2e s | e2e − sim | why |", "|---|---|---|---|---|"]
    for row in result["phases"]:
        lines.append(f"| {row['meaning']} | {cell(row['simulated_s'])} | {cell(row['e2e_s'])} | "
                     f"{cell(row['difference_s'])} | {row['why']} |")
    lines += ["", "Simulated decisions (seconds from the gang's creation):", "", "```text",
              *result["simulated_decisions"], "```"]
    return "\n".join(lines)


if __name__ == "__main__":
    print(to_markdown(run()))
