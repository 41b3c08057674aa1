"""A training gang through the soak: a researcher submits it with the CLI, it trains on the real GPU nodes while
every fault lands, and its ranks' event lines (``training_runtime/examples/tiny_trainer.py --events``) say what
each fault cost.

The history it is judged by (pure, :class:`GangHistory` and the functions below):

- each restart's cost: the furthest step the broken round reached less the step the next round resumed at;
- the newest complete checkpoint never goes backward: a round never resumes below the step every rank had made
  durable before it began;
- a fault costs at most its bound (:data:`STEP_BOUND`): a worker or pod killed loses at most two checkpoint
  intervals (the newest complete checkpoint is at most one behind, plus the one being written), a graceful
  eviction nothing (it checkpoints on SIGTERM), nor does the guard's eviction from a degraded node; a fatal GPU
  fault (its worker killed, then its pod evicted) what a killed worker may; any other
  fault (a control-plane restart, a leader change, a network fault) must not restart the gang at all.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tools.chaos.schedule import Fault

#: Checkpoint every this many steps; a step takes this long beside the compute (the e2e gang's figures).
INTERVAL, STEP_S = 10, 0.25
#: Steps a fault of each kind may cost the gang; a kind not listed must not restart it.
STEP_BOUND: Mapping[Fault, int] = {
    Fault.TRAINER_KILLED: 2 * INTERVAL,
    Fault.TRAINER_POD_KILLED: 2 * INTERVAL,
    Fault.TRAINER_EVICTED: 0,
    # The guard evicts the gang's pod from a degraded node gracefully: an emergency checkpoint, nothing lost.
    Fault.GPU_DEGRADED: 0,
    # A fatal one kills the rank's worker with its GPU first (a restart in place from the last checkpoint), then the
    # guard evicts the pod off the node: what a killed worker may cost.
    Fault.GPU_FATAL: 2 * INTERVAL,
}


def gang_spec(name: str, image: str, steps: int, workers: int, gpus_per_node: int, pool: str,
              max_retries: int = 100) -> dict[str, Any]:
    """The job a researcher submits with ``gpucluster train submit``: the reference trainer, one whole node per
    worker (the gang spans several kubelets), a checkpoint every :data:`INTERVAL` steps, its events on the
    checkpoint volume; ``max_retries`` Volcano restarts (a soak kills its pods again and again: the most the CLI
    takes)."""
    trainer = ["python3", "-m", "training_runtime.examples.tiny_trainer", "--steps", str(steps),
               "--step-seconds", str(STEP_S), "--events", "$(CHECKPOINT_DIR)/events"]
    return {
        "name": name, "image": image, "command": trainer,
        "gpus": {"nodes": workers, "gpusPerNode": gpus_per_node},
        "pool": pool, "checkpointInterval": INTERVAL, "maxRetries": max_retries,
        # What a 2-core build machine's kubelet can hold beside the node's daemons.
        "cpuPerWorker": "250m", "memoryPerWorker": "512Mi",
    }


def round_of(event: Mapping[str, Any]) -> int:
    """The supervisor's round of an event: one per start of the gang, in place or through Volcano, never reused in
    a run (a replaced pod carries Volcano's next attempt but joins the others' round)."""
    return int(event.get("inplace", 0))


def event_files(volumes: Path, gang: str) -> list[Path]:
    """Every rank's event file, from the checkpoint volume's host directory (``provisioner --hostpath-root``)."""
    return sorted(volumes.glob(f"*/{gang}/events.rank-*"))


def _parsed(text: str, rank: int) -> list[dict[str, Any]]:
    """The events in ``text``, each with its ``rank``; a torn line (a crash mid-write, a full volume) is none."""
    out: list[dict[str, Any]] = []
    for line in text.splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if isinstance(event, dict):
            out.append({**event, "rank": rank})
    return out


def _rank(path: Path) -> int:
    return int(path.name.rsplit("-", 1)[1])


def read_events(volumes: Path, gang: str) -> list[dict[str, Any]]:
    """Every rank's event lines, each with its ``rank``."""
    return [e for path in event_files(volumes, gang) for e in _parsed(path.read_text(), _rank(path))]


class EventTail:
    """The lines appended to a gang's event files since the last read (a soak reads them every second for hours:
    never the whole files again). A line still being written is left for the next read."""

    def __init__(self, volumes: Path, gang: str) -> None:
        self.volumes, self.gang = volumes, gang
        self.offsets: dict[Path, int] = {}

    def read(self) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for path in event_files(self.volumes, self.gang):
            with path.open("rb") as f:
                f.seek(self.offsets.get(path, 0))
                data = f.read()
            complete = data[: data.rfind(b"\n") + 1]
            self.offsets[path] = self.offsets.get(path, 0) + len(complete)
            out += _parsed(complete.decode("utf-8", "replace"), _rank(path))
        return out


@dataclass(frozen=True)
class Restart:
    """The gang started again: round ``round`` resumed at ``resumed`` (wall time ``at``) after the rounds before it
    reached ``reached``; ``lost`` steps are trained again. The round it followed began at ``broken_began`` (wall
    time; None: the run's first)."""

    round: int
    at: float
    reached: int
    resumed: int
    broken_began: float | None = None

    @property
    def lost(self) -> int:
        return max(0, self.reached - self.resumed)


@dataclass
class GangHistory:
    """What the soak keeps of a gang's events: per round the furthest step and the resumes, every durable
    checkpoint, the newest step's time. Fed event by event (:meth:`add`), O(rounds + checkpoints) in memory."""

    reached: dict[int, int] = field(default_factory=dict)
    resumes: dict[int, list[tuple[float, int]]] = field(default_factory=dict)
    durable: list[tuple[float, int, int]] = field(default_factory=list)  # (t, rank, step)
    last_step_at: float | None = None
    ranks_stepped: dict[int, set[int]] = field(default_factory=dict)
    done: set[int] = field(default_factory=set)

    def add(self, events: Iterable[Mapping[str, Any]]) -> None:
        for e in events:
            kind, r, t = e.get("event"), round_of(e), float(e.get("t", 0.0))
            step = int(e.get("step") or 0)
            if kind == "step":
                self.reached[r] = max(self.reached.get(r, 0), step)
                self.ranks_stepped.setdefault(r, set()).add(int(e["rank"]))
                self.last_step_at = max(self.last_step_at or t, t)
            elif kind == "resume":
                self.resumes.setdefault(r, []).append((t, step))
            elif kind == "durable":
                self.durable.append((t, int(e["rank"]), step))
            elif kind == "done":
                self.done.add(int(e["rank"]))

    def training(self, workers: int, now: float, stalled_after_s: float) -> bool:
        """Every rank stepped in the newest round (one that has only resumed so far is the newest), and a step came
        within ``stalled_after_s`` of ``now``."""
        if not self.ranks_stepped or self.last_step_at is None:
            return False
        newest = max(set(self.ranks_stepped) | set(self.resumes))
        return (len(self.ranks_stepped.get(newest, ())) == workers
                and now - self.last_step_at <= stalled_after_s)

    def restarts(self) -> list[Restart]:
        """Each round that resumed after another had stepped, with what the rounds since the last such resume
        reached (a round that never stepped redoes nothing)."""
        out: list[Restart] = []
        rounds = sorted(set(self.reached) | set(self.resumes))
        for before, this in itertools.pairwise(rounds):
            if before in self.reached and self.resumes.get(this):
                at = min(t for t, _ in self.resumes[this])
                resumed = min(s for _, s in self.resumes[this])
                began = min((t for t, _ in self.resumes.get(before, ())), default=None)
                out.append(Restart(this, at, self.reached[before], resumed, began))
        return out

    def complete_checkpoint_before(self, t: float) -> int:
        """The newest checkpoint every rank had made durable before wall time ``t`` (0: none)."""
        newest: dict[int, int] = {}
        for at, rank, step in self.durable:
            if at < t:
                newest[rank] = max(newest.get(rank, 0), step)
        return min(newest.values(), default=0)

    def checkpoints_lost(self) -> list[str]:
        """Each round that resumed below the newest complete checkpoint: that checkpoint was lost."""
        out = []
        for r in sorted(self.resumes):
            if r == 0:
                continue
            at = min(t for t, _ in self.resumes[r])
            resumed = min(s for _, s in self.resumes[r])
            complete = self.complete_checkpoint_before(at)
            if resumed < complete:
                out.append(f"round {r} resumed at step {resumed}, below the complete checkpoint of step {complete}")
        return out


def cause(restart: Restart, injected: Sequence[tuple[float, Fault, str]]) -> tuple[float, Fault, str] | None:
    """The fault a restart follows (wall time, kind, target), among those put in place while the round it followed
    ran or the gang was between rounds (after that round began, before the next resumed): the last that may restart
    training, else the last of them, else the last before the resume; None before any. Not simply the last before
    the resume: a whole-gang restart through Volcano can outlast the 30 s between faults, and the next fault, put in
    place meanwhile, was blamed for it."""
    before = [i for i in injected if i[0] <= restart.at]
    if not before:
        return None
    window = [i for i in before if restart.broken_began is None or i[0] >= restart.broken_began]
    restarting = [i for i in window if i[1] in STEP_BOUND]
    return max(restarting or window or before, key=lambda i: i[0])


def judge(history: GangHistory, injected: Sequence[tuple[float, Fault, str]]) -> dict[str, Any]:
    """The gang's figures and its violations: steps lost per fault over the fault's bound, restarts that follow a
    fault that must not restart training, checkpoints lost."""
    lost_by_fault: dict[tuple[float, Fault, str] | None, int] = {}
    restarts_by_kind: dict[str, int] = {}
    details: list[str] = []
    charged: list[dict[str, Any]] = []
    not_ours = 0
    for restart in history.restarts():
        key = cause(restart, injected)
        kind = key[1].value if key else "none"
        began = None if restart.broken_began is None else round(restart.broken_began, 3)
        charged.append({"round": restart.round, "resumed_at": round(restart.at, 3), "lost": restart.lost,
                        "broken_round_began_at": began,
                        "charged_to": None if key is None else [round(key[0], 3), kind, key[2]]})
        restarts_by_kind[kind] = restarts_by_kind.get(kind, 0) + 1
        lost_by_fault[key] = lost_by_fault.get(key, 0) + restart.lost
        if key is None or key[1] not in STEP_BOUND:
            not_ours += 1
            details.append(f"round {restart.round} restarted after {kind} {key[2] if key else ''}".rstrip()
                           + f": a fault that must not restart training ({restart.lost} steps lost)")
    over = 0
    for key, lost in lost_by_fault.items():
        if key is not None and key[1] in STEP_BOUND and lost > STEP_BOUND[key[1]]:
            over += 1
            details.append(f"{key[1].value} on {key[2]}: {lost} steps lost, bound {STEP_BOUND[key[1]]}")
    regressions = history.checkpoints_lost()
    return {
        "violations": {"training-restarted-by-another-fault": not_ours, "training-steps-over-bound": over,
                       "checkpoint-went-backward": len(regressions)},
        "details": details + regressions,
        "training_steps_lost": sum(lost_by_fault.values()),
        "checkpoints_lost": len(regressions),
        "training_restarts_by_fault": dict(sorted(restarts_by_kind.items())),
        "training_step_reached": max(history.reached.values(), default=0),
        # Each restart and the fault it was charged to: the run can be judged again without its volume.
        "training_restarts": charged,
    }
