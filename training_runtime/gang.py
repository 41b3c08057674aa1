"""Run N copies of a training command as one gang on this machine; any failure restarts all of them.

This is Volcano's ``RestartJob`` policy in miniature (``PodFailed``/``PodEvicted`` → restart the whole
job, up to ``maxRetry``): a partial NCCL ring cannot make progress, so survivors are stopped and every
rank starts again with ``TRAINING_ATTEMPT`` one higher, like the ``volcano.sh/job-retry-count`` annotation.
Each rank gets ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` and ``MASTER_PORT`` as Volcano's pytorch
plugin sets them.

    python -m training_runtime.gang --workers 4 --max-restarts 3 -- python -m training_runtime.examples.tiny_trainer
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path

log = logging.getLogger("training_runtime.gang")


class Action(Enum):
    WAIT = "wait"
    DONE = "done"
    RESTART = "restart"
    GIVE_UP = "give-up"


def decide(exit_codes: Sequence[int | None], restarts: int, max_restarts: int) -> Action:
    """Pure gang policy: ``None`` = still running. Any non-zero exit restarts the gang while retries last."""
    if any(code not in (None, 0) for code in exit_codes):
        return Action.RESTART if restarts < max_restarts else Action.GIVE_UP
    if all(code == 0 for code in exit_codes):
        return Action.DONE
    return Action.WAIT


@dataclass
class GangResult:
    attempts: int
    succeeded: bool
    #: Per attempt: the exit code of every rank (the failing one first noticed, then the ones we stopped).
    exit_codes: list[list[int]] = field(default_factory=list)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _write_state(path: Path | None, state: dict[str, object]) -> None:
    if path is None:
        return
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(state))
    os.replace(tmp, path)


def _stop(procs: list[subprocess.Popen[bytes]], grace_seconds: float) -> None:
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace_seconds
    for p in procs:
        try:
            p.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def run_gang(command: Sequence[str], workers: int, *, max_restarts: int, env: Mapping[str, str] | None = None,
             state_file: Path | None = None, metrics_base_port: int = 0, grace_seconds: float = 5.0,
             poll_seconds: float = 0.02) -> GangResult:
    base_env = dict(os.environ if env is None else env)
    result = GangResult(attempts=0, succeeded=False)
    attempt = 0
    run_id = f"gang-{uuid.uuid4().hex[:12]}"
    while True:
        port = free_port()
        procs = []
        for rank in range(workers):
            rank_env = {**base_env, "RANK": str(rank), "WORLD_SIZE": str(workers), "MASTER_ADDR": "127.0.0.1",
                        "MASTER_PORT": str(port), "TRAINING_ATTEMPT": str(attempt), "TRAINING_RUN_ID": run_id,
                        "TRAINING_METRICS_PORT": str(metrics_base_port + rank if metrics_base_port else 0)}
            procs.append(subprocess.Popen(list(command), env=rank_env))
        result.attempts = attempt + 1
        _write_state(state_file, {"attempt": attempt, "pids": [p.pid for p in procs]})
        while (action := decide([p.poll() for p in procs], attempt, max_restarts)) is Action.WAIT:
            time.sleep(poll_seconds)
        failed = [(r, p.returncode) for r, p in enumerate(procs) if p.returncode not in (None, 0)]
        _stop(procs, grace_seconds)
        result.exit_codes.append([int(p.returncode) for p in procs])
        if action is Action.DONE:
            result.succeeded = True
            _write_state(state_file, {"attempt": attempt, "pids": [], "done": True})
            return result
        if action is Action.GIVE_UP:
            log.error("gang attempt %d: ranks %s failed; %d restarts used, giving up", attempt, failed, attempt)
            _write_state(state_file, {"attempt": attempt, "pids": [], "done": False})
            return result
        log.warning("gang attempt %d: rank(s) %s exited with %s; restarting the whole gang",
                    attempt, [r for r, _ in failed], [c for _, c in failed])
        attempt += 1


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--workers", type=int, required=True)
    parser.add_argument("--max-restarts", type=int, default=3)
    parser.add_argument("--state-file", type=Path)
    parser.add_argument("--metrics-base-port", type=int, default=0, help="rank r serves /metrics on base+r")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command or args.workers < 1:
        parser.error("need --workers >= 1 and a command after --")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    result = run_gang(command, args.workers, max_restarts=args.max_restarts, state_file=args.state_file,
                      metrics_base_port=args.metrics_base_port)
    return 0 if result.succeeded else 1


if __name__ == "__main__":
    sys.exit(main())
