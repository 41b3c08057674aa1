"""Kill one worker of a running gang and measure what the restart cost: the drill behind the gang tests and
``make bench``.

The tiny trainer runs as N OS processes under the gang launcher; once the gang passes ``kill_at_step`` one
worker gets SIGKILL. The launcher stops the rest and starts the whole gang again; every rank resumes from
the newest complete checkpoint. Lost steps = the furthest step any rank reached before the kill minus
the step the gang resumed from. With asynchronous checkpoints a kill while the newest checkpoint is still
being written falls back to the one before: the bound is one interval plus the steps that write had been
running (``inflight_steps``), and the drill reports both.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class DrillResult:
    attempts: int
    launcher_rc: int
    reached_step: int
    resume_steps: dict[int, int]
    lost_steps: int
    interval_steps: int
    #: Most steps a checkpoint needed to become durable before the kill (0: durable within its own step).
    durable_lag_steps: int
    #: The newest checkpoint step the gang had started before the kill, and the newest it saw committed.
    newest_started: int
    newest_durable_seen: int
    #: Steps the newest checkpoint had been writing at the kill when the gang had to fall back past it, else 0.
    inflight_steps: int
    final_steps: dict[int, int]
    output: str


def read_events(events: Path, workers: int) -> list[dict[str, Any]]:
    out = []
    for rank in range(workers):
        path = Path(f"{events}.rank-{rank}")
        if path.exists():
            for line in path.read_text().splitlines():
                if line.endswith("}"):
                    out.append({**json.loads(line), "rank": rank})
    return out


def trainer_env(workdir: Path, interval_steps: int, keep_last: int = 3) -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
        "CHECKPOINT_DIR": str(workdir / "checkpoints"),
        "CHECKPOINT_INTERVAL_STEPS": str(interval_steps),
        "CHECKPOINT_KEEP_LAST": str(keep_last),
        "TRAINING_COLLECTIVE_TIMEOUT_SECONDS": "60",
    }


def gang_command(workdir: Path, workers: int, steps: int, step_seconds: float, payload_bytes: int,
                 max_restarts: int = 2) -> list[str]:
    return [sys.executable, "-m", "training_runtime.gang", "--workers", str(workers),
            "--max-restarts", str(max_restarts), "--state-file", str(workdir / "gang.json"), "--",
            sys.executable, "-m", "training_runtime.examples.tiny_trainer", "--steps", str(steps),
            "--step-seconds", str(step_seconds), "--payload-bytes", str(payload_bytes),
            "--events", str(workdir / "events")]


def run_gang_once(workdir: Path, *, workers: int, steps: int, interval_steps: int, step_seconds: float = 0.0,
                  payload_bytes: int = 16 * 1024, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    """The gang to completion, no faults (used to lay down checkpoints)."""
    workdir.mkdir(parents=True, exist_ok=True)
    return subprocess.run(gang_command(workdir, workers, steps, step_seconds, payload_bytes),
                          env=trainer_env(workdir, interval_steps), capture_output=True, text=True,
                          timeout=timeout, cwd=REPO, check=False)


def signal_at_step(workdir: Path, *, sig: signal.Signals, workers: int, steps: int, interval_steps: int,
                   at_step: int, victim: int, step_seconds: float, payload_bytes: int, timeout: float) -> int:
    """Run the gang until it passes ``at_step`` in its first attempt, send ``sig`` to worker ``victim``, and wait
    for the launcher; its exit code. Events go to ``<workdir>/events``, the launcher's output to gang.log."""
    workdir.mkdir(parents=True, exist_ok=True)
    events = workdir / "events"
    log_path = workdir / "gang.log"
    with open(log_path, "w") as log:
        launcher = subprocess.Popen(gang_command(workdir, workers, steps, step_seconds, payload_bytes),
                                    env=trainer_env(workdir, interval_steps), stdout=log, stderr=subprocess.STDOUT,
                                    cwd=REPO, text=True)
        try:
            deadline = time.monotonic() + timeout
            while True:
                if time.monotonic() > deadline or launcher.poll() is not None:
                    raise RuntimeError(f"the gang never reached step {at_step}:\n{log_path.read_text()}")
                reached = [e["step"] for e in read_events(events, workers)
                           if e["event"] == "step" and e["attempt"] == 0]
                if reached and max(reached) >= at_step:
                    break
                time.sleep(0.005)
            pids = json.loads((workdir / "gang.json").read_text())["pids"]
            os.kill(pids[victim], sig)
            return launcher.wait(timeout=max(1.0, deadline - time.monotonic()))
        finally:
            if launcher.poll() is None:
                launcher.kill()
                launcher.wait()


def kill_and_resume(workdir: Path, *, workers: int = 3, steps: int = 80, interval_steps: int = 10,
                    kill_at_step: int = 35, victim: int = 1, step_seconds: float = 0.02,
                    payload_bytes: int = 16 * 1024, timeout: float = 180) -> DrillResult:
    rc = signal_at_step(workdir, sig=signal.SIGKILL, workers=workers, steps=steps, interval_steps=interval_steps,
                        at_step=kill_at_step, victim=victim, step_seconds=step_seconds,
                        payload_bytes=payload_bytes, timeout=timeout)
    events = workdir / "events"
    log_path = workdir / "gang.log"
    seen = read_events(events, workers)
    first = [e for e in seen if e["attempt"] == 0]
    reached_step = max(e["step"] for e in first if e["event"] == "step")
    resumes = {e["rank"]: e["step"] for e in seen if e["event"] == "resume" and e["attempt"] == 1}
    lags = [e["at_step"] - e["step"] for e in first if e["event"] == "durable" and e["rank"] == 0]
    finals = {e["rank"]: e["step"] for e in seen if e["event"] == "done"}
    attempts = 1 + max(e["attempt"] for e in seen)
    resume = min(resumes.values()) if resumes else 0
    newest_started = reached_step // interval_steps * interval_steps
    durable_seen = max((e["step"] for e in first if e["event"] == "durable"), default=0)
    return DrillResult(newest_started=newest_started, newest_durable_seen=durable_seen,
                       inflight_steps=reached_step - newest_started if resume < newest_started else 0,
                       attempts=attempts, launcher_rc=rc, reached_step=reached_step, resume_steps=resumes,
                       lost_steps=reached_step - resume, interval_steps=interval_steps,
                       durable_lag_steps=max(lags, default=0), final_steps=finals, output=log_path.read_text())


@dataclass(frozen=True)
class GracefulResult:
    first_rc: int
    #: Furthest step any rank reached before it stopped, the step it stopped (and checkpointed) at per rank.
    reached_step: int
    stopped_steps: dict[int, int]
    resume_steps: dict[int, int]
    lost_steps: int
    output: str


def terminate_and_resume(workdir: Path, *, workers: int = 3, steps: int = 80, interval_steps: int = 10,
                         stop_at_step: int = 35, victim: int = 1, step_seconds: float = 0.02,
                         payload_bytes: int = 16 * 1024, timeout: float = 180) -> GracefulResult:
    """SIGTERM one worker (an eviction, a reclaim, a preemption); the gang checkpoints, exits 0, starts again."""
    rc = signal_at_step(workdir, sig=signal.SIGTERM, workers=workers, steps=steps, interval_steps=interval_steps,
                        at_step=stop_at_step, victim=victim, step_seconds=step_seconds,
                        payload_bytes=payload_bytes, timeout=timeout)
    events = workdir / "events"
    log_path = workdir / "gang.log"
    first = read_events(events, workers)
    reached_step = max(e["step"] for e in first if e["event"] == "step")
    stopped = {e["rank"]: e["step"] for e in first if e["event"] == "graceful"}
    again = run_gang_once(workdir, workers=workers, steps=steps, interval_steps=interval_steps,
                          payload_bytes=payload_bytes, timeout=timeout)
    seen = read_events(events, workers)[len(first):]
    resumes = {e["rank"]: e["step"] for e in seen if e["event"] == "resume"}
    resume = min(resumes.values()) if resumes else 0
    return GracefulResult(first_rc=rc, reached_step=reached_step, stopped_steps=stopped, resume_steps=resumes,
                          lost_steps=reached_step - resume,
                          output=log_path.read_text() + again.stdout + again.stderr)
