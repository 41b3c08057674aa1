"""The reference trainer on PyTorch: a tiny MLP, DDP over gloo on CPU, the runtime for resume and checkpoints.

Runs under the gang launcher (``python -m training_runtime.gang --workers 2 -- python -m
training_runtime.examples.torch_trainer``) or torchrun. ``--crash-rank``/``--crash-at-step`` make one
rank kill itself in the first attempt, to watch the gang come back from its newest checkpoint.
``make train-demo`` runs both (it installs PyTorch into its own virtualenv first).
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import time
from collections.abc import Sequence

from training_runtime import TrainingRuntime, torch_adapter


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--crash-rank", type=int, default=-1)
    parser.add_argument("--crash-at-step", type=int, default=-1)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    log = logging.getLogger("torch_trainer")

    import torch
    from torch.nn.parallel import DistributedDataParallel

    rt = TrainingRuntime.from_env(collective=torch_adapter.init_process_group(backend="gloo"))
    rt.handle_sigterm()
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(),
                                                        torch.nn.Linear(32, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    step = 0
    resumed = rt.resume()
    if resumed is not None:
        model.module.load_state_dict(torch_adapter.load(resumed.files, "model"))
        opt.load_state_dict(torch_adapter.load(resumed.files, "optim"))
        step = resumed.step
    target = torch.arange(16, dtype=torch.float32) / 16
    started = time.monotonic()
    while step < args.steps:
        gen = torch.Generator().manual_seed(step * 100 + rt.rank)
        x = torch.randn(32, 16, generator=gen)
        loss = torch.nn.functional.mse_loss(model(x).squeeze(-1), x @ target)
        opt.zero_grad()
        loss.backward()
        opt.step()
        step += 1
        rt.step_done(step)
        rt.maybe_checkpoint(step, lambda: torch_adapter.snapshot({"model": model.module, "optim": opt}))
        if rt.should_stop():
            log.info("rank %d: asked to stop; checkpointing step %d", rt.rank, step)
            code = rt.checkpoint_and_stop(step, lambda: torch_adapter.snapshot({"model": model.module, "optim": opt}))
            torch.distributed.destroy_process_group()
            return code
        if rt.dist.attempt == 0 and rt.rank == args.crash_rank and step == args.crash_at_step:
            log.warning("rank %d: crashing on purpose at step %d", rt.rank, step)
            os.kill(os.getpid(), signal.SIGKILL)
    rt.close()
    log.info("rank %d done at step %d, loss %.4f, %.1f steps/s", rt.rank, step, loss.item(),
             step / (time.monotonic() - started))
    torch.distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
