"""A process counts as gone for a restart only once every thread of it has exited (tools/localcluster/processes.py):
its main thread can be a zombie while its other threads still hold its files, listening sockets among them."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

from tools.localcluster.plan import Layout
from tools.localcluster.processes import Proc, exited, start_ticks, stop_process

#: A child whose main thread exits (pthread_exit) while another thread keeps a listening socket open for a while:
#: the shape of a killed Go program between its main thread's death and its last thread's.
CHILD = """
import ctypes, socket, sys, threading, time
ln = socket.socket(); ln.bind(("127.0.0.1", 0)); ln.listen()
print(ln.getsockname()[1], flush=True)
def hold():
    time.sleep(float(sys.argv[1])); ln.close()
threading.Thread(target=hold).start()
ctypes.CDLL(None).pthread_exit(None)
"""


def _free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def test_a_zombie_main_thread_with_a_live_thread_has_not_exited_and_its_port_is_still_taken() -> None:
    child = subprocess.Popen([sys.executable, "-c", CHILD, "1.5"], stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None
    port = int(child.stdout.readline())
    try:
        ticks = None
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:  # the main thread is gone: /proc says zombie for the process
            stat = Path(f"/proc/{child.pid}/stat").read_text().rsplit(")", 1)[-1].split()
            if stat[0] == "Z":
                ticks = int(stat[19])
                break
            time.sleep(0.01)
        assert ticks is not None, "the child's main thread never exited"
        assert start_ticks(child.pid) is None  # what `alive` reads: the old test called this gone
        assert not exited(child.pid, ticks) and not _free(port)
        deadline = time.monotonic() + 10
        while not exited(child.pid, ticks):
            assert time.monotonic() < deadline, "the child's last thread never exited"
            time.sleep(0.05)
        assert _free(port), "every thread exited, yet the port is taken"
    finally:
        child.kill()
        child.wait()


def test_stop_process_returns_once_every_thread_has_exited(tmp_path: Path) -> None:
    child = subprocess.Popen([sys.executable, "-c", CHILD, "1.0"], stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None
    port = int(child.stdout.readline())
    lay = Layout(tmp_path)
    (tmp_path / "run").mkdir()
    ticks = int(Path(f"/proc/{child.pid}/stat").read_text().rsplit(")", 1)[-1].split()[19])  # zombie or not
    proc = Proc(name="holder", pid=child.pid, argv=[], log="", start_ticks=ticks)
    try:
        stop_process(lay, proc, grace=5.0)
        assert proc.exited() and _free(port)
    finally:
        child.kill()
        child.wait()


def test_a_reused_pid_or_a_reaped_process_has_exited() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    ticks = start_ticks(child.pid)
    child.wait()
    assert ticks is not None and exited(child.pid, ticks)
    me = start_ticks(1)
    assert me is not None and exited(1, me + 1)  # pid 1 runs, but it is not the process started then
