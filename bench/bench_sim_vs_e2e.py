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
(`LOCAL_DESCHEDULER_INTERVAL_S`, which `tools.localcluster.plan.descheduler_command` runs it at), not the CronJob's
schedule.
"""

from __future__ import annotations

from collections.abc import Mapping
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

STACK = "local"
#: Pod start to Ready on the local control plane (kwok nodes, mock virtual-kubelet): about a second.
LOCAL_LATENCIES = Latencies(onprem_start_s=1.0, external_start_s=1.0, hpa_period_s=15.0)
#: The local cluster runs the descheduler as a process every this many seconds (its CronJob's schedule is a minute).
LOCAL_DESCHEDULER_INTERVAL_S = 20
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


#: The gang's gate lifted (the scale run's phase too: where the standby never becomes ready, the handover's timeout
#: lifts it).
UNGATE = "time_to_ungate_s"
#: Phases timed from the gang's end (the others from its creation).
AFTER_END = ("time_to_close_s", "time_to_return_s", "time_to_return_standby_gone_s")
#: Phases that only mean something once another has held (gone again only after it came): always chained.
CHAINED = {"time_to_standby_gone_s": "time_to_gang_running_s",
           "time_to_return_standby_gone_s": "time_to_return_s"}


@dataclass(frozen=True)
class PhaseView:
    """What one moment of the scenario shows, per service, in the terms the phases are defined on; the simulator
    and the scale run (tools/localcluster/scaleburst.py) each fill one, so the phases are defined once."""

    #: Main replicas each service holds in the scenario (its demand: minReplicas or maxReplicas).
    wanted: Mapping[str, int]
    #: Ready main replicas, anywhere; on the gang pool's nodes; on the virtual nodes.
    ready: Mapping[str, int]
    ready_in_pool: Mapping[str, int]
    ready_external: Mapping[str, int]
    #: Standby replicas asked for (the Deployment's replicas), ready, and alive (any state).
    standby_asked: Mapping[str, int]
    standby_ready: Mapping[str, int]
    standby_live: Mapping[str, int]
    #: The burst taint's effect on each virtual node (None: off).
    taints: tuple[str | None, ...]
    gang_ungated: bool
    gang_running: bool

    def holds(self) -> dict[str, bool]:
        """Each phase's condition at this moment (:data:`PHASES` and :data:`UNGATE`)."""
        svcs = list(self.wanted)
        asked = [s for s in svcs if self.standby_asked.get(s, 0) > 0]
        gone = all(self.standby_live.get(s, 0) == 0 for s in svcs)
        return {
            UNGATE: self.gang_ungated,
            "time_to_standby_ready_s": bool(asked) and all(
                self.standby_ready.get(s, 0) >= self.standby_asked[s] for s in asked),
            "time_to_preempt_s": all(self.ready_in_pool.get(s, 0) == 0 for s in svcs),
            "time_to_open_s": bool(self.taints) and all(t is None for t in self.taints),
            "time_to_ready_external_s": all(self.ready.get(s, 0) >= self.wanted[s]
                                            and self.ready_in_pool.get(s, 0) == 0 for s in svcs),
            "time_to_gang_running_s": self.gang_running,
            "time_to_standby_gone_s": gone,
            "time_to_close_s": bool(self.taints) and all(t == "NoSchedule" for t in self.taints),
            "time_to_return_s": all(self.ready_external.get(s, 0) == 0 and self.ready.get(s, 0) >= self.wanted[s]
                                    for s in svcs),
            "time_to_return_standby_gone_s": gone,
        }


@dataclass
class PhaseClock:
    """When each phase first held, from the gang's creation (:data:`AFTER_END`: from its end). ``chained``: a
    phase counts only once the one before it has, as the e2e waits for one after another; otherwise each counts
    at its first hold (the scale run samples them side by side), except :data:`CHAINED`."""

    chained: bool = True
    phases: dict[str, float] = field(default_factory=dict)

    def see(self, since_arrival: float, view: PhaseView, since_end: float | None) -> None:
        holds = view.holds()
        order = [UNGATE, *PHASES]
        for i, key in enumerate(order):
            if key in self.phases or not holds[key]:
                continue
            if key in AFTER_END and since_end is None:
                continue
            before = CHAINED.get(key) or (order[i - 1] if self.chained and i > 1 and key != AFTER_END[0] else None)
            if before is not None and before not in self.phases:
                continue
            self.phases[key] = since_end if key in AFTER_END and since_end is not None else since_arrival


@dataclass
class Trace:
    """What the simulated scenario did: phase times and the core's decisions in order."""

    phases: dict[str, float] = field(default_factory=dict)
    decisions: list[tuple[float, str]] = field(default_factory=list)


@dataclass(frozen=True)
class Scenario:
    """The burst scenario's shape: the pool the gang takes whole (None: the first), the demand every service is
    held at (``"min"``: minReplicas, as the local e2e's idle metric keeps it; ``"max"``: maxReplicas, the scale
    run's) and gangs already running elsewhere when the scenario's gang arrives (what leaves on-prem short).
    ``chained``: phases timed one after another, as the e2e waits for them (:class:`PhaseClock`)."""

    pool: str | None = None
    demand: str = "min"
    background: tuple[Gang, ...] = ()
    run_s: float = RUN_S
    #: How long the simulation runs on after the gang's end: the close hold and the return's cycles fit in it.
    after_s: float = 900.0
    chained: bool = True


class ScenarioSimulator(Simulator):
    """The engine, checking after every event which phase has just been reached (:class:`PhaseView`)."""

    def __init__(self, model: ClusterModel, workload: Workload, settings: BurstSettings, seconds: float,
                 gang: int = 0, chained: bool = True) -> None:
        super().__init__(model, workload, controller(model, settings), seconds, check=True)
        self.trace = Trace()
        self.clock = PhaseClock(chained, self.trace.phases)
        self.gang = gang
        self.zone = self.cluster.train_zone[workload.gangs[gang].pool]
        self.peak = isinstance(workload, PeakWorkload)
        self.ended: float | None = None
        self.ungated = False
        assert self.controller is not None
        core = self.controller.decide_fn

        def logged(snapshot: Snapshot, state: BurstState, now: float, s: BurstSettings) -> Decision:
            decision = core(snapshot, state, now, s)
            for line in describe(decision):
                self.trace.decisions.append((now, line))
                self.ungated = self.ungated or (line == "ungate the gang" and now >= ARRIVAL_S)
            return decision

        self.controller.decide_fn = logged

    def check(self) -> None:
        super().check()
        c, t = self.cluster, self.now
        if t < ARRIVAL_S:
            return
        if self.ended is None and "time_to_gang_running_s" in self.trace.phases and self.gang not in c.jobs:
            self.ended = t
        svcs = c.services
        view = PhaseView(
            wanted={s.name: int(s.max if self.peak else s.min) for s in svcs},
            ready={s.name: s.ready_ext + sum(s.ready_zone) for s in svcs},
            ready_in_pool={s.name: s.ready_zone[self.zone] for s in svcs},
            ready_external={s.name: s.ready_ext for s in svcs},
            standby_asked={s.name: s.sb_replicas for s in svcs},
            standby_ready={s.name: len(s.sb_ready) for s in svcs},
            standby_live={s.name: s.sb_count() for s in svcs},
            taints=tuple(c.vn_taint), gang_ungated=self.ungated, gang_running=self.gang in c.jobs)
        self.clock.see(t - ARRIVAL_S, view, None if self.ended is None else t - self.ended)


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


class PeakWorkload(Workload):
    """Demand that holds every service at maxReplicas (the scale run applies them there)."""

    def demand(self, service: str, max_replicas: int, t: float) -> float:
        return float(max_replicas)


def local_descheduler_interval_s() -> float:
    """The interval the local cluster runs the descheduler at (seconds)."""
    return float(LOCAL_DESCHEDULER_INTERVAL_S)


def simulate_scenario(model: ClusterModel | None = None, settings: BurstSettings | None = None,
                      scenario: Scenario = Scenario()) -> Trace:
    """The scenario in the simulator: by default the local stack's, with the local cluster's latencies and
    descheduler interval; the scale run passes its shape's model (those latencies too) and scenario."""
    if model is None or settings is None:
        setup = load_stack(STACK)
        model = replace(setup.model, latencies=LOCAL_LATENCIES,
                        descheduler=replace(setup.model.descheduler, interval_s=local_descheduler_interval_s()))
        settings = setup.settings
    pool = next((p for p in model.pools if p.name == scenario.pool), None) if scenario.pool else model.pools[0]
    if pool is None:
        raise ValueError(f"scenario pool {scenario.pool!r} is not one of the model's {[p.name for p in model.pools]}")
    gang = Gang(arrival_s=ARRIVAL_S, nodes=pool.nodes, duration_s=scenario.run_s, pool=pool.name)
    kind = PeakWorkload if scenario.demand == "max" else FlatWorkload
    gangs = (*scenario.background, gang)
    sim = ScenarioSimulator(model, kind(gangs=gangs), settings, ARRIVAL_S + scenario.run_s + scenario.after_s,
                            gang=len(gangs) - 1, chained=scenario.chained)
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
