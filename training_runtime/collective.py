"""The few collectives the runtime needs: every rank agrees on the resume step and on time-based checkpoints.

:class:`FileCollective` works through the shared checkpoint filesystem with no framework at all (the
core's reference trainer and its gang tests use it); PyTorch jobs use the adapter's collective over the
process group instead (``training_runtime.torch_adapter.TorchCollective``), which is faster and cannot
see a previous incarnation's files.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any, Protocol


class CollectiveTimeout(TimeoutError):
    """A rank did not arrive within the collective timeout: the gang should crash and restart."""


class PeerLost(CollectiveTimeout):
    """A rank's heartbeat stopped while others waited for it: its process died, and no wait brings it back."""


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

    Each rank also beats: a thread rewrites ``alive-r<rank>`` with a new value every ``heartbeat_seconds``. A rank
    waited for whose beat has not changed for ``dead_after_seconds`` of the waiter's own clock died (a crash, an OOM
    kill, SIGKILL), so the wait ends at once with :class:`PeerLost` instead of at the collective timeout. Only the
    waiter's monotonic clock is read, so clocks that differ between nodes cannot make a live peer look dead. It
    matters most on the way out: when one rank crashes, Volcano stops the others with SIGTERM, and a rank blocked
    here would otherwise hold its pod (and the gang's restart) until the grace period ran out. A rank not beating
    yet is not dead: it may be starting.
    """

    def __init__(self, root: Path, rank: int, world_size: int, attempt_key: str, timeout_seconds: float,
                 *, poll_seconds: float = 0.002, heartbeat_seconds: float = 1.0,
                 dead_after_seconds: float = 10.0) -> None:
        if not 0 < heartbeat_seconds < dead_after_seconds:
            raise ValueError(f"the heartbeat ({heartbeat_seconds:g} s) must be positive and shorter than the time "
                             f"after which a silent peer counts as dead ({dead_after_seconds:g} s)")
        self.dir = Path(root) / attempt_key
        self.dir.mkdir(parents=True, exist_ok=True)
        self.rank, self.world_size, self.timeout = rank, world_size, timeout_seconds
        self.poll_seconds = poll_seconds
        self.dead_after = dead_after_seconds
        self.started = time.time()
        self.seq = 0
        #: Per peer: its last beat seen and when it changed, on this process's monotonic clock.
        self._beats: dict[int, tuple[str, float]] = {}
        self._beating = threading.Event()
        self._beat_count = 0
        self._beat()
        self._beater = threading.Thread(target=self._beat_forever, args=(heartbeat_seconds,), daemon=True,
                                        name=f"collective-heartbeat-r{rank}")
        self._beater.start()

    def _alive_path(self, rank: int) -> Path:
        return self.dir / f"alive-r{rank}"

    def _beat(self) -> None:
        tmp = self.dir / f".alive-r{self.rank}.tmp"
        self._beat_count += 1
        tmp.write_text(f"{self._beat_count} {time.time()!r}")  # a new value every beat, whatever the clock says
        os.replace(tmp, self._alive_path(self.rank))

    def _beat_forever(self, every: float) -> None:
        while not self._beating.wait(every):
            try:
                self._beat()
            except OSError:  # a filesystem hiccup: the next beat tries again; only silence counts
                continue

    def stop_beating(self) -> None:
        """Stop the heartbeat (what a process's death does; tests and shutdown)."""
        self._beating.set()

    def _silent_for(self, rank: int, now: float) -> float | None:
        """Seconds (of ``now``, this process's monotonic clock) since ``rank``'s beat last changed, or None when it
        has not beaten in this attempt (yet)."""
        try:
            beat = self._alive_path(rank).read_text()
        except FileNotFoundError:
            return None
        seen = self._beats.get(rank)
        if seen is None or seen[0] != beat:
            self._beats[rank] = (beat, now)
            return 0.0
        return now - seen[1]

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
        next_check = time.monotonic() + 0.5
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
                mono = time.monotonic()
                if mono > deadline:
                    raise CollectiveTimeout(f"collective {seq}: ranks {sorted(pending)} did not arrive within "
                                            f"{self.timeout:g} s")
                if mono >= next_check:
                    next_check = mono + 0.5
                    silent = {r: age for r in sorted(pending)
                              if (age := self._silent_for(r, mono)) is not None and age > self.dead_after}
                    if silent:
                        ages = ", ".join(f"rank {r} silent for {a:.0f} s" for r, a in silent.items())
                        raise PeerLost(f"collective {seq}: {ages} (over {self.dead_after:g} s): its process died; "
                                       "the gang restarts from the newest complete checkpoint")
                time.sleep(self.poll_seconds)
        if seq >= 2:
            self._path(seq - 2, self.rank).unlink(missing_ok=True)
        return out
