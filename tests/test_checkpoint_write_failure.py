"""A checkpoint that cannot be written (a full disk) says where, which step, and what is kept, and keeps it.

The failure is injected into the store's own I/O: its file writes (a full disk can cut one short), its fsyncs and
its renames, at any one of them.
"""

from __future__ import annotations

import errno
import os
import signal
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from training_runtime import CheckpointStore, CheckpointWriteError, LocalCollective, TrainingRuntime
from training_runtime import store as store_module
from training_runtime.checkpointer import AsyncCheckpointer
from training_runtime.metrics import TrainingMetrics
from training_runtime.settings import CheckpointSettings, DistEnv, Settings
from training_runtime.store import STAGING

ATTEMPT = DistEnv(0, 1, "127.0.0.1", 1, 1, "run").attempt_key


def enospc() -> OSError:
    return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


class FullDisk:
    """The store's I/O, failing with ENOSPC at call number ``fail_at`` (0-based) of the writes, fsyncs and renames;
    a failing write lands half its bytes first (``partial``)."""

    def __init__(self, fail_at: int | None, partial: bool = True) -> None:
        self.fail_at, self.partial, self.calls = fail_at, partial, 0
        self.failed = False

    def _next(self) -> bool:
        hit = self.calls == self.fail_at
        self.calls += 1
        self.failed |= hit
        return hit

    def open_file(self, path: Any, mode: str = "r", *args: Any, **kwargs: Any) -> IO[Any]:
        """The builtin ``open`` as the store sees it."""
        fh: IO[Any] = open(path, mode, *args, **kwargs)  # noqa: SIM115 - returned to the caller's with
        if "w" not in mode:
            return fh
        disk = self
        real_write = fh.write

        def write(data: bytes) -> int:
            if disk._next():
                if disk.partial:
                    real_write(data[: len(data) // 2])
                    fh.flush()
                raise enospc()
            return real_write(data)

        fh.write = write  # type: ignore[method-assign]
        return fh

    def fsync(self, fd: int) -> None:
        if self._next():
            raise enospc()
        os.fsync(fd)

    def replace(self, src: Any, dst: Any) -> None:
        if self._next():
            raise enospc()
        os.replace(src, dst)

    def __getattr__(self, name: str) -> Any:  # the rest of ``os`` as it is
        return getattr(os, name)


@pytest.fixture
def full_disk() -> Iterator[FullDisk]:
    disk = FullDisk(fail_at=None)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(store_module, "open", disk.open_file, raising=False)
        mp.setattr(store_module, "os", disk)
        yield disk


@pytest.fixture
def own_signals() -> Iterator[None]:
    """checkpoint_and_stop installs signal handlers in this process; put pytest's back."""
    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    yield
    for s, h in before.items():
        signal.signal(s, h)


def runtime(root: Path) -> TrainingRuntime:
    ck = CheckpointSettings(directory=root, interval_steps=10, interval_seconds=None, keep_last=3, resume=True)
    return TrainingRuntime(Settings(dist=DistEnv(0, 1, "127.0.0.1", 1, 1), checkpoint=ck, collective_timeout_seconds=5,
                                    metrics_port=0, heartbeat_metric="hb"), LocalCollective())


@pytest.mark.usefixtures("own_signals")
def test_a_full_disk_at_the_emergency_checkpoint_names_the_directory_and_step_and_keeps_the_previous(
        tmp_path: Path, full_disk: FullDisk) -> None:
    rt = runtime(tmp_path)
    assert rt.resume() is None
    for step in range(1, 11):
        rt.maybe_checkpoint(step, lambda step=step: {"w": f"weights {step}".encode()})  # type: ignore[misc]
    assert rt.checkpointer is not None
    rt.checkpointer.wait()
    full_disk.fail_at = full_disk.calls  # the next write: the emergency checkpoint's first file
    rt.request_stop()
    assert rt.should_stop()
    with pytest.raises(CheckpointWriteError) as caught:
        rt.checkpoint_and_stop(13, lambda: {"w": b"weights 13", "ballast": b"x" * 4096})
    message = str(caught.value)
    assert message.startswith(f"checkpoint step 13 could not be written to {tmp_path}: [Errno 28] No space left on "
                              "device (the checkpoint filesystem is full). step-00000013 is not published; ")
    assert message.endswith(f"the previous complete checkpoint, step 10 ({tmp_path / 'step-00000010'}), is kept "
                            "and a restart resumes from it")
    assert (caught.value.errno, caught.value.step, caught.value.directory) == (errno.ENOSPC, 13, tmp_path)
    found = CheckpointStore(tmp_path).latest_complete()
    assert found is not None and found.step == 10
    assert CheckpointStore(tmp_path).read_shard(found, 0) == {"w": b"weights 10"}
    assert not list((tmp_path / STAGING).iterdir()), "the partial files were removed"


def test_a_full_disk_before_any_checkpoint_says_there_is_none(tmp_path: Path, full_disk: FullDisk) -> None:
    rt = runtime(tmp_path)
    rt.resume()
    full_disk.fail_at = 0
    rt.maybe_checkpoint(10, lambda: {"w": b"x"})
    with pytest.raises(CheckpointWriteError, match=r"no earlier complete checkpoint exists, so a restart starts from "
                                                   r"step 0$"):
        rt.close()


def ranks_write(root: Path, world: int, step: int) -> list[BaseException]:
    """Every rank writes ``step`` (rank 0 last, so it commits what the others delivered); their failures."""
    ck = CheckpointSettings(directory=root, interval_steps=10, interval_seconds=None, keep_last=3, resume=True)
    errors: list[BaseException] = []
    for rank in [*range(1, world), 0]:
        writer = AsyncCheckpointer(CheckpointStore(root), ck, DistEnv(rank, world, "127.0.0.1", 1, 1, "run"),
                                   LocalCollective(), TrainingMetrics("hb", rank), timeout_seconds=0.2)
        writer.save(step, lambda rank=rank: {"w": bytes([rank, step % 256]) * 64})  # type: ignore[misc]
        try:
            writer.close()
        except BaseException as exc:
            errors.append(exc)
    return errors


@settings(max_examples=80, deadline=None)
@given(world=st.integers(1, 3), fail_at=st.integers(0, 30), partial=st.booleans())
def test_whatever_write_fails_the_newest_complete_checkpoint_stays_loadable(world: int, fail_at: int,
                                                                             partial: bool) -> None:
    disk = FullDisk(fail_at=None, partial=partial)
    with tempfile.TemporaryDirectory() as tmp, pytest.MonkeyPatch.context() as mp:
        root = Path(tmp)
        mp.setattr(store_module, "open", disk.open_file, raising=False)
        mp.setattr(store_module, "os", disk)
        assert ranks_write(root, world, 10) == []
        disk.fail_at = disk.calls + fail_at
        errors = ranks_write(root, world, 20)
        mp.undo()
        store = CheckpointStore(root)
        newest = store.latest_complete()
        assert newest is not None and newest.step in (10, 20)
        for rank in range(world):
            assert store.read_shard(newest, rank) == {"w": bytes([rank, newest.step]) * 64}
        if not disk.failed:
            assert errors == [] and newest.step == 20
            return
        assert errors, "a failed write is never silent"
        for exc in errors:
            assert isinstance(exc, CheckpointWriteError), repr(exc)
            assert str(exc).startswith(f"checkpoint step 20 could not be written to {root}: "), str(exc)
            assert f"the previous complete checkpoint, step 10 ({root / 'step-00000010'}), is kept" in str(exc)
        assert store.verify(root / "step-00000010") is not None, "the previous checkpoint is untouched"
        assert not store.staging_dir(ATTEMPT, 20).exists(), "no partial files left behind"
