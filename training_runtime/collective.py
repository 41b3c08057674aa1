"""The few collectives the runtime needs: every rank agrees on the resume step and on time-based checkpoints.

:class:`FileCollective` works through the shared checkpoint filesystem with no framework at all (the
core's reference trainer and its gang tests use it); PyTorch jobs use the adapter's collective over the
process group instead (``training_runtime.torch_adapter.TorchCollective``), which is faster and cannot
see a previous incarnation's files.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any, Protocol


class CollectiveTimeout(TimeoutError):
    """A rank did not arrive within the collective timeout: the gang should crash and restart."""


class Collective(Protocol):
    def allgather(self, obj: Any) -> list[Any]:
        """Every rank's ``obj`` (JSON-serialisable), in rank order, on every rank."""
        ...

    def broadcast(self, obj: Any, src: int = 0) -> Any:
        """Rank ``src``'s ``obj`` on every rank (every rank calls it; only ``src``'s value counts)."""
        ...


def broadcast(collective: Collective, obj: Any, src: int = 0) -> Any:
    return collective.broadcast(obj, src)


class LocalCollective:
    """World size 1: nothing to agree with."""

    def allgather(self, obj: Any) -> list[Any]:
        return [obj]

    def broadcast(self, obj: Any, src: int = 0) -> Any:
        return obj


class FileCollective:
    """Allgather through files under ``root/<run>-a<attempt>/`` on a filesystem every rank mounts.

    Each operation has a sequence number; rank *r* writes ``op-<seq>-r<r>.json`` atomically (write, rename)
    and waits for every rank's file. A file is accepted only if it was written no earlier than this
    process's start minus the timeout: a second guard, after the run id in the directory name, against a
    directory left by an earlier incarnation. Files two operations old are removed by their writer: by
    then every rank has read them.
    """

    def __init__(self, root: Path, rank: int, world_size: int, attempt_key: str, timeout_seconds: float,
                 *, poll_seconds: float = 0.002) -> None:
        self.dir = Path(root) / attempt_key
        self.dir.mkdir(parents=True, exist_ok=True)
        self.rank, self.world_size, self.timeout = rank, world_size, timeout_seconds
        self.poll_seconds = poll_seconds
        self.started = time.time()
        self.seq = 0

    def broadcast(self, obj: Any, src: int = 0) -> Any:
        # An allgather: its files double as the proof that every rank has read the older ones (see above).
        return self.allgather(obj)[src]

    def _path(self, seq: int, rank: int) -> Path:
        return self.dir / f"op-{seq}-r{rank}.json"

    def allgather(self, obj: Any) -> list[Any]:
        seq, self.seq = self.seq, self.seq + 1
        tmp = self.dir / f".op-{seq}-r{self.rank}.tmp"
        tmp.write_text(json.dumps({"at": time.time(), "value": obj}))
        os.replace(tmp, self._path(seq, self.rank))
        out: list[Any] = [None] * self.world_size
        pending = set(range(self.world_size))
        deadline = time.monotonic() + self.timeout
        while pending:
            for rank in sorted(pending):
                try:
                    record = json.loads(self._path(seq, rank).read_text())
                except (FileNotFoundError, json.JSONDecodeError):
                    continue
                if record["at"] >= self.started - self.timeout:
                    out[rank] = record["value"]
                    pending.discard(rank)
            if pending:
                if time.monotonic() > deadline:
                    raise CollectiveTimeout(f"collective {seq}: ranks {sorted(pending)} did not arrive within "
                                            f"{self.timeout:g} s")
                time.sleep(self.poll_seconds)
        if seq >= 2:
            self._path(seq - 2, self.rank).unlink(missing_ok=True)
        return out
