"""PyTorch adapter: process group from the gang environment, the collective timeout, tensor snapshots.

Imports torch lazily (inside each function) so the core runs where PyTorch is not installed.

    rt = TrainingRuntime.from_env(collective=torch_adapter.init_process_group())
    ...
    rt.maybe_checkpoint(step, lambda: torch_adapter.snapshot({"model": model, "optim": opt}))

The collective timeout is ``TRAINING_COLLECTIVE_TIMEOUT_SECONDS`` (default 600 s, PyTorch's own NCCL
default): no environment variable of NCCL or PyTorch sets it, only ``init_process_group(timeout=...)``.
When a collective exceeds it, the NCCL watchdog (``TORCH_NCCL_ASYNC_ERROR_HANDLING``) aborts the
communicator and the process exits, which is what restarts the gang.
"""

from __future__ import annotations

import io
import os
from collections.abc import Iterable, Mapping
from datetime import timedelta
from typing import Any

from training_runtime.settings import Settings


def init_process_group(backend: str | None = None, env: Mapping[str, str] | None = None) -> TorchCollective:
    """``torch.distributed.init_process_group`` from the gang environment with the documented timeout."""
    import torch
    import torch.distributed as dist

    settings = Settings.from_env(os.environ if env is None else env)
    d = settings.dist
    if backend is None:
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    timeout = timedelta(seconds=settings.collective_timeout_seconds)
    if d.under_torchrun:
        # torchrun's agent already serves the store on MASTER_PORT; env:// joins it.
        dist.init_process_group(backend=backend, init_method="env://", timeout=timeout)
    else:
        # Explicit rank: under Volcano the pytorch plugin's RANK is off by one for a single task (see settings).
        dist.init_process_group(backend=backend, init_method=f"tcp://{d.master_addr}:{d.master_port}",
                                rank=d.rank, world_size=d.world_size, timeout=timeout)
    return TorchCollective()


class TorchCollective:
    """Small Python objects over the default process group (resume step, time-based checkpoint decision)."""

    def allgather(self, obj: Any) -> list[Any]:
        import torch.distributed as dist

        out: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(out, obj)
        return out

    def broadcast(self, obj: Any, src: int = 0) -> Any:
        # One object from one rank: cost independent of the world size, unlike an allgather.
        import torch.distributed as dist

        box = [obj]
        dist.broadcast_object_list(box, src=src)
        return box[0]


def _to_cpu(value: Any) -> Any:
    import torch

    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", copy=True)
    if isinstance(value, Mapping):
        return {k: _to_cpu(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_to_cpu(v) for v in value)
    return value


class TorchSnapshot:
    """CPU copies of state dicts taken in the step (the stall); ``torch.save`` runs in the writer thread."""

    def __init__(self, states: Mapping[str, Any]) -> None:
        self._states = {name: _to_cpu(state) for name, state in states.items()}

    def files(self) -> Iterable[tuple[str, bytes]]:
        import torch

        for name, state in self._states.items():
            buffer = io.BytesIO()
            torch.save(state, buffer)
            yield f"{name}.pt", buffer.getvalue()


def snapshot(objects: Mapping[str, Any]) -> TorchSnapshot:
    """Snapshot modules and optimizers (anything with ``state_dict()``) or plain state dicts."""
    return TorchSnapshot({k: (v.state_dict() if hasattr(v, "state_dict") else v) for k, v in objects.items()})


def load(files: Mapping[str, bytes], name: str) -> Any:
    """A state dict back from a resumed checkpoint's files."""
    import torch

    return torch.load(io.BytesIO(files[f"{name}.pt"]), map_location="cpu", weights_only=True)
