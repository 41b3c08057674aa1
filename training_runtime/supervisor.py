"""Restart in place: a supervisor in each pod runs the training worker and, when a rank dies for a reason that
is not its node's, restarts every rank's worker inside the same pods, on the same nodes, with no pod deleted.

Why: a gang restart through Volcano (``RestartJob``) deletes and recreates every pod: at 2,048 pods that is an
eviction, a rescheduling and a container start per pod before the first step. After an application crash, an
NCCL timeout or an OOM, the same nodes running the same code usually run on for hours, so only the processes
need to start again (torchrun's elastic agent does this inside one pod; this does it across the gang).

How: supervisors agree through small files on the shared checkpoint filesystem
(``<CHECKPOINT_DIR>/.supervise/<run>/r<rank>.json``), each rewritten every second with the supervisor's restart
round, its phase, a beat counter and the time. Round *n* starts when every rank is ready for it; a
worker that exits non-zero marks round *n* failed; every other supervisor sees that, kills its worker (a graceful
stop needs the lost rank) and gets ready for round *n*+1; the workers resume from the newest complete
checkpoint under a new rendezvous key (``TRAINING_INPLACE_RESTARTS``). Volcano sees no pod failure.

Replace one node: when a pod is evicted (the health guard quarantined its node), Volcano recreates that pod only
(the template's ``PodEvicted → RestartPod``); the others' workers stop with it at a step boundary (their exit code
:data:`~training_runtime.settings.PEER_STOP_EXIT`), their supervisors wait for the next round, and the
replacement's supervisor, started on another node, joins it. Rounds are the run's, not Volcano's attempt's: the
replaced pod carries a higher attempt than the ranks it meets, and a gang Volcano restarts whole starts past the
last round, so no two rounds share a rendezvous.

Bounds: a worker that dies ``restartsBeforeReplace`` times in this pod makes the pod fail for real (its node
may be the cause after all), and the gang falls back to Volcano's restart; a round whose ranks do not all
come within ``replaceTimeoutSeconds`` (a pod that is gone and being replaced) ends every supervisor with a
failure, the same fallback. A SIGTERM to the supervisor (an eviction, a queue reclaim) is passed to the
worker, which stops gracefully: no restart follows.

The decision (:func:`decide`) is pure and table-tested; :class:`Supervisor` is its I/O shell.

    python -m training_runtime.supervisor -- python -m training_runtime.examples.tiny_trainer --steps 100
"""

from __future__ import annotations

import argparse
import contextlib
import enum
import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from training_runtime.settings import (
    CHECKPOINT_DIR,
    DEFAULT_REPLACE_TIMEOUT_SECONDS,
    DEFAULT_RESTARTS_BEFORE_REPLACE,
    INPLACE_RESTARTS,
    PEER_STOP_EXIT,
    DistEnv,
    InPlaceSettings,
    SettingsError,
)

log = logging.getLogger("training_runtime.supervisor")

SUPERVISE_DIR = ".supervise"
#: Exit code of a supervisor whose gang could not restart in place: the pod fails and Volcano takes over.
FALLBACK_EXIT = 75


class Phase(enum.StrEnum):
    READY = "ready"  # waiting for every rank to be ready for this round
    RUNNING = "running"  # this round's worker runs
    FAILED = "failed"  # this round's worker died; the gang restarts in place
    DONE = "done"  # the worker finished (exit 0): nothing more to do
    GAVE_UP = "gave-up"  # too many failures here, or the round never filled: the pod fails for real
    STOPPING = "stopping"  # asked to stop (SIGTERM): the worker stops gracefully, no restart


@dataclass(frozen=True)
class Peer:
    """Another rank's supervisor as its file shows it; ``alive`` is False once its beat has stopped."""

    round: int
    phase: Phase
    alive: bool = True


@dataclass(frozen=True)
class Me:
    rank: int
    world_size: int
    round: int
    phase: Phase
    #: The worker's exit code once it has exited (None while it runs or before it starts).
    worker_exit: int | None = None
    worker_running: bool = False
    #: Workers of this pod that died by themselves (not stopped by us), over every round.
    failures: int = 0
    #: When this supervisor became ready for its round (its own monotonic clock).
    ready_since: float = 0.0


class Act(enum.StrEnum):
    WAIT = "wait"
    START = "start"  # start the worker for ``Me.round``
    STOP_WORKER = "stop-worker"  # another rank failed this round: stop ours
    NEXT_ROUND = "next-round"  # become ready for round + 1 (after our worker is gone)
    JOIN = "join"  # become ready for a later round others are already in
    EXIT = "exit"


@dataclass(frozen=True)
class Decision:
    act: Act
    #: The phase to write for this step (and the round with it).
    phase: Phase
    round: int
    exit_code: int = 0
    reason: str = ""


def decide(me: Me, peers: Mapping[int, Peer | None], now: float, *, restarts_before_replace: int,
           replace_timeout: float) -> Decision:
    """What this supervisor does next, from its own state and every other rank's file. Pure."""
    n = me.round
    others = {r: p for r, p in peers.items() if r != me.rank}
    live = [p for p in others.values() if p is not None and p.alive]
    stay = Decision(Act.WAIT, me.phase, n)
    if me.phase is Phase.STOPPING:
        if me.worker_running:
            return stay
        stop_code = 0 if me.worker_exit in (None, PEER_STOP_EXIT) else me.worker_exit
        return Decision(Act.EXIT, Phase.STOPPING, n, stop_code or 0, "stopped gracefully on request")
    if me.worker_running and me.phase is not Phase.RUNNING:  # only a round's worker runs; never leave one behind
        return Decision(Act.STOP_WORKER, me.phase, n, reason=f"{me.phase.value}: the worker must go first")
    if me.phase in (Phase.DONE, Phase.GAVE_UP):
        return Decision(Act.EXIT, me.phase, n, (me.worker_exit or 0) if me.phase is Phase.DONE else FALLBACK_EXIT)
    gave_up = sorted(r for r, p in others.items() if p is not None and p.phase is Phase.GAVE_UP)
    if gave_up:
        if me.worker_running:
            return Decision(Act.STOP_WORKER, me.phase, n, reason=f"rank(s) {gave_up} gave up: the gang restarts")
        return Decision(Act.EXIT, Phase.GAVE_UP, n, FALLBACK_EXIT,
                        f"rank(s) {gave_up} gave up restarting in place; Volcano restarts the gang")
    later = max((p.round for p in live if p.round > n), default=None)
    failed_here = sorted(r for r, p in others.items()
                         if p is not None and p.round == n and p.phase is Phase.FAILED)
    if me.phase is Phase.RUNNING:
        if me.worker_running:
            if later is not None or failed_here:
                who = failed_here or sorted(r for r, p in others.items() if p is not None and p.round > n)
                return Decision(Act.STOP_WORKER, Phase.RUNNING, n, reason=f"rank(s) {who} restart round {n + 1}")
            return stay
        code = me.worker_exit
        if code == 0:
            return Decision(Act.EXIT, Phase.DONE, n, 0, "the worker finished")
        if code == PEER_STOP_EXIT:  # a clean stop for another rank's eviction: this pod stays for the next round
            return Decision(Act.NEXT_ROUND, Phase.READY, n + 1,
                            reason=f"round {n} stopped for another rank's pod; waiting for its replacement")
        # Not this pod's failure when another rank failed first or died (its worker then fails ours: the
        # collective's peer-lost error), nor when we stopped it.
        dead = any(p is not None and not p.alive for p in others.values())
        stopped_by_us = later is not None or bool(failed_here) or dead
        failures = me.failures + (0 if stopped_by_us else 1)
        if failures > restarts_before_replace:
            return Decision(Act.EXIT, Phase.GAVE_UP, n, FALLBACK_EXIT,
                            f"the worker died {failures} times in this pod (restartsBeforeReplace "
                            f"{restarts_before_replace}): the pod fails so its node can be replaced")
        if not stopped_by_us:
            return Decision(Act.NEXT_ROUND, Phase.FAILED, n, code or 1, f"the worker exited {code}: restart in place")
        return Decision(Act.NEXT_ROUND, Phase.READY, n + 1, reason=f"round {n} ends: another rank failed")
    if me.phase is Phase.FAILED:
        return Decision(Act.NEXT_ROUND, Phase.READY, n + 1, reason=f"round {n + 1}: waiting for every rank")
    # READY: join a later round, start when every rank is ready, or give the round up after the timeout.
    if later is not None:
        return Decision(Act.JOIN, Phase.READY, later, reason=f"rank(s) already in round {later}")
    present = {r for r, p in others.items()
               if p is not None and p.alive and p.round == n and p.phase in (Phase.READY, Phase.RUNNING)}
    if len(present) == me.world_size - 1:
        return Decision(Act.START, Phase.RUNNING, n, reason=f"every rank is ready for round {n}")
    if now - me.ready_since > replace_timeout:
        missing = sorted(set(range(me.world_size)) - present - {me.rank})
        return Decision(Act.EXIT, Phase.GAVE_UP, n, FALLBACK_EXIT,
                        f"rank(s) {missing} did not join round {n} within {replace_timeout:g} s: Volcano restarts "
                        "the gang")
    return stay


#: The phases of a peer whose round a starting supervisor joins. A pod that is stopping (the previous gang, still
#: terminating while Volcano restarts it whole), finished or gave up is no round to join.
JOINABLE = frozenset({Phase.READY, Phase.RUNNING, Phase.FAILED})


def first_round(peers: Mapping[int, Peer | None]) -> int:
    """The round a supervisor that starts now joins: the one the live gang is in (a replacement pod joins the
    restart under way); with nobody alive, one past every round the run's files remember (a gang Volcano restarted
    whole never meets a rendezvous of the one before), or 0 for a new run."""
    live = [p.round + (1 if p.phase is Phase.FAILED else 0) for p in peers.values()
            if p is not None and p.alive and p.phase in JOINABLE]
    if live:
        return max(live)
    known = [p.round for p in peers.values() if p is not None]
    return max(known) + 1 if known else 0


class Supervisor:
    """The I/O shell: the worker process, this rank's file, the peers' files, signals."""

    def __init__(self, command: Sequence[str], dist: DistEnv, root: Path, *, env: Mapping[str, str] | None = None,
                 restarts_before_replace: int = DEFAULT_RESTARTS_BEFORE_REPLACE,
                 replace_timeout: float = DEFAULT_REPLACE_TIMEOUT_SECONDS, poll_seconds: float = 0.2,
                 beat_seconds: float = 1.0, dead_after_seconds: float = 10.0) -> None:
        self.command = list(command)
        self.dist = dist
        self.dir = Path(root) / SUPERVISE_DIR / dist.run_id
        self.dir.mkdir(parents=True, exist_ok=True)
        self.env = dict(os.environ if env is None else env)
        self.restarts_before_replace = restarts_before_replace
        self.replace_timeout = replace_timeout
        self.poll, self.beat_every, self.dead_after = poll_seconds, beat_seconds, dead_after_seconds
        self.worker: subprocess.Popen[bytes] | None = None
        self._beat = 0
        self._last_write = 0.0
        #: Each peer's last beat and when (our clock) we saw it move; None until it has moved while we watched.
        self._seen: dict[int, tuple[int, float | None]] = {}
        self._fresh_at_first_sight: dict[int, bool] = {}
        self._stop_requested = False

    def path(self, rank: int) -> Path:
        return self.dir / f"r{rank}.json"

    def _write(self, me: Me) -> None:
        self._beat += 1
        record = {"round": me.round, "phase": me.phase.value, "beat": self._beat, "at": time.time(),
                  "attempt": self.dist.attempt,
                  "worker_pid": self.worker.pid if self.worker and self.worker.poll() is None else None}
        tmp = self.dir / f".r{self.dist.rank}.tmp"
        tmp.write_text(json.dumps(record))
        os.replace(tmp, self.path(self.dist.rank))
        self._last_write = time.monotonic()

    def read_peers(self, now: float) -> dict[int, Peer | None]:
        """Every rank's file. A peer is alive while its beat has moved within ``dead_after`` seconds of our clock;
        at first sight nobody is: a file written a second before its pod was killed looks as fresh as a live one,
        and only a beat that moves while we watch proves a supervisor behind it."""
        out: dict[int, Peer | None] = {}
        for rank in range(self.dist.world_size):
            if rank == self.dist.rank:
                continue
            try:
                record = json.loads(self.path(rank).read_text())
                peer = Peer(round=int(record["round"]), phase=Phase(record["phase"]))
                beat = int(record["beat"])
                written = float(record.get("at", 0.0))
            except (FileNotFoundError, ValueError, KeyError, TypeError):
                out[rank] = None
                continue
            seen = self._seen.get(rank)
            if seen is None:
                self._seen[rank] = (beat, None)
                self._fresh_at_first_sight[rank] = time.time() - written <= self.dead_after
            elif seen[0] != beat:
                self._seen[rank] = (beat, now)
            moved_at = self._seen[rank][1]
            out[rank] = replace(peer, alive=moved_at is not None and now - moved_at <= self.dead_after)
        return out

    def settle(self) -> dict[int, Peer | None]:
        """The peers as a supervisor that starts now must see them to pick its round: any whose file is fresh by
        the wall clock is watched for one beat (and a poll) so a live one shows its beat move; a file of a pod that
        is gone never does. With no fresh file (a new run, a gang restarted whole after its files went stale) there
        is nothing to wait for."""
        peers = self.read_peers(time.monotonic())
        deadline = time.monotonic() + self.beat_every + 2 * self.poll
        while time.monotonic() < deadline:
            watched = {r for r, fresh in self._fresh_at_first_sight.items() if fresh}
            if all((peer := peers.get(r)) is not None and peer.alive for r in watched):
                break
            time.sleep(self.poll)
            peers = self.read_peers(time.monotonic())
        return peers

    def _start(self, round_: int) -> None:
        env = {**self.env, INPLACE_RESTARTS: str(round_)}
        log.info("rank %d: starting the worker for round %d", self.dist.rank, round_)
        # Its own session, so a restart stops everything the worker started (a torchrun's children too).
        self.worker = subprocess.Popen(self.command, env=env, start_new_session=True)

    def _stop_worker(self) -> int | None:
        """Kill the worker and everything it started (its own session). Not a graceful stop: a rank of the gang is
        gone, so the collective a graceful stop needs cannot complete, and the progress since the newest
        checkpoint is lost either way; the checkpoint store stays consistent (every write is staged, then
        renamed)."""
        worker = self.worker
        if worker is None or worker.poll() is not None:
            return worker.returncode if worker else None
        with contextlib.suppress(ProcessLookupError):
            os.killpg(worker.pid, signal.SIGKILL)
        return worker.wait()

    def _on_sigterm(self, signum: int, frame: object) -> None:
        """The pod is asked to stop: the worker gets the SIGTERM (its graceful stop), and no restart follows."""
        self._stop_requested = True
        if self.worker is not None and self.worker.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.worker.pid, signal.SIGTERM)

    def run(self) -> int:
        """Supervise until the worker finishes, the pod is asked to stop, or the gang falls back to Volcano."""
        signal.signal(signal.SIGTERM, self._on_sigterm)
        start_round = first_round(self.settle())
        me = Me(rank=self.dist.rank, world_size=self.dist.world_size, round=start_round, phase=Phase.READY,
                ready_since=time.monotonic())
        self._write(me)
        while True:
            now = time.monotonic()
            worker = self.worker
            running = worker is not None and worker.poll() is None
            me = replace(me, worker_running=running, worker_exit=None if running or worker is None
                         else worker.returncode)
            if self._stop_requested and me.phase is not Phase.STOPPING:
                me = replace(me, phase=Phase.STOPPING)
            decision = decide(me, self.read_peers(now), now, restarts_before_replace=self.restarts_before_replace,
                              replace_timeout=self.replace_timeout)
            if decision.reason and decision.act is not Act.WAIT:
                log.info("rank %d round %d: %s", self.dist.rank, decision.round, decision.reason)
            if decision.act is Act.EXIT:
                me = replace(me, phase=decision.phase)
                self._write(me)
                return decision.exit_code
            if decision.act is Act.STOP_WORKER:
                self._stop_worker()
                continue
            if decision.act is Act.START:
                self._start(decision.round)
                me = replace(me, phase=Phase.RUNNING, worker_running=True, worker_exit=None)
            elif decision.act is Act.NEXT_ROUND:
                if decision.phase is Phase.FAILED:
                    me = replace(me, phase=Phase.FAILED, failures=me.failures + 1)
                    self._write(me)  # the others see the failure before we move on
                    continue
                me = replace(me, round=decision.round, phase=Phase.READY, worker_exit=None, ready_since=now)
                self.worker = None
            elif decision.act is Act.JOIN:
                me = replace(me, round=decision.round, phase=Phase.READY, ready_since=now)
            if decision.act is not Act.WAIT or now - self._last_write >= self.beat_every:
                self._write(me)
            time.sleep(self.poll)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="training-supervise", description=__doc__.splitlines()[0])
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- the worker command")
    args = parser.parse_args(argv)
    command = [c for c in args.command if c != "--"] if args.command[:1] == ["--"] else args.command
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    if not command:
        parser.error("no worker command after --")
    env = dict(os.environ)
    try:
        dist = DistEnv.from_env(env)
        root = env.get(CHECKPOINT_DIR, "").strip()
        if dist.world_size > 1 and not root:
            raise SettingsError(f"{CHECKPOINT_DIR} is not set: the supervisors meet on the checkpoint filesystem")
        bounds = InPlaceSettings.from_env(env)
    except SettingsError as exc:
        print(f"training-supervise: {exc}", file=sys.stderr)
        return 2
    if dist.world_size == 1 and not root:
        return subprocess.call(command)  # nothing to agree with, nowhere to meet
    return Supervisor(command, dist, Path(root), env=env, restarts_before_replace=bounds.restarts_before_replace,
                      replace_timeout=bounds.replace_timeout_seconds).run()


if __name__ == "__main__":
    sys.exit(main())
