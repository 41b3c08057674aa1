"""A tiny data-parallel trainer on the framework-free core: linear regression, gradients averaged every step.

The averaging goes through the runtime's file collective, so the ranks move in lockstep like an NCCL
ring: when one dies the others stall at the next step until the gang is restarted. Each rank checkpoints
its weights plus ``--payload-bytes`` of ballast (so a checkpoint has a size worth truncating). With
``--events`` every rank appends JSON lines (resume, step, durable) that tests and the benchmark read to
measure what a restart lost.
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO

from training_runtime import TrainingRuntime

DIM = 8
TRUE_WEIGHTS = [0.5 * (i + 1) for i in range(DIM)]


def batch(rank: int, step: int, size: int = 16) -> list[tuple[list[float], float]]:
    rng = random.Random(step * 1_000_003 + rank)
    rows = []
    for _ in range(size):
        x = [rng.uniform(-1, 1) for _ in range(DIM)]
        rows.append((x, sum(w * v for w, v in zip(TRUE_WEIGHTS, x, strict=True))))
    return rows


def gradient(weights: list[float], rows: list[tuple[list[float], float]]) -> list[float]:
    grad = [0.0] * DIM
    for x, y in rows:
        err = sum(w * v for w, v in zip(weights, x, strict=True)) - y
        for i in range(DIM):
            grad[i] += 2 * err * x[i] / len(rows)
    return grad


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--step-seconds", type=float, default=0.0, help="extra time per step (compute stand-in)")
    parser.add_argument("--payload-bytes", type=int, default=64 * 1024)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--events", type=Path, help="append JSON event lines to <events>.rank-<r>")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")

    rt = TrainingRuntime.from_env()
    rt.handle_sigterm()
    events: IO[str] | None = None
    if args.events is not None:
        events = open(f"{args.events}.rank-{rt.rank}", "a", buffering=1)  # noqa: SIM115 - lives as long as main

    def emit(event: str, **fields: object) -> None:
        if events is not None:
            events.write(json.dumps({"event": event, "attempt": rt.dist.attempt, "inplace": rt.dist.inplace_restarts,
                                     "t": time.time(), **fields}) + "\n")

    weights = [0.0] * DIM
    ballast = bytes(random.Random(rt.rank).getrandbits(8) for _ in range(args.payload_bytes))
    resumed = rt.resume()
    step = 0
    if resumed is not None:
        step = resumed.step
        weights = json.loads(resumed.files["weights.json"])
        if resumed.files["ballast.bin"] != ballast:
            raise SystemExit(f"rank {rt.rank}: ballast of step {step} does not round-trip")
    emit("resume", step=step, source=resumed.source if resumed else None,
         load_seconds=resumed.load_seconds if resumed else None)
    durable = rt.checkpointer.last_durable_step if rt.checkpointer else None
    while step < args.steps:
        local = gradient(weights, batch(rt.rank, step))
        grads = rt.collective.allgather(local)
        mean = [sum(g[i] for g in grads) / len(grads) for i in range(DIM)]
        weights = [w - args.lr * g for w, g in zip(weights, mean, strict=True)]
        if args.step_seconds:
            time.sleep(args.step_seconds)
        step += 1
        rt.step_done(step)
        emit("step", step=step)
        frozen = json.dumps(weights).encode()

        def capture(frozen: bytes = frozen) -> dict[str, bytes]:
            return {"weights.json": frozen, "ballast.bin": ballast}

        rt.maybe_checkpoint(step, capture)
        if rt.checkpointer and rt.checkpointer.last_durable_step != durable:
            durable = rt.checkpointer.last_durable_step
            emit("durable", step=durable, at_step=step)
        if rt.should_stop():
            code = rt.checkpoint_and_stop(step, capture)
            emit("graceful", step=step)
            return code
    rt.close()
    if rt.checkpointer and rt.checkpointer.last_durable_step != durable:
        emit("durable", step=rt.checkpointer.last_durable_step, at_step=step)
    error = max(abs(w - t) for w, t in zip(weights, TRUE_WEIGHTS, strict=True))
    emit("done", step=step, error=error)
    logging.getLogger("tiny_trainer").info("rank %d finished at step %d, max weight error %.2e", rt.rank, step, error)
    return 0


if __name__ == "__main__":
    sys.exit(main())
