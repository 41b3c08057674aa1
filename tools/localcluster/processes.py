"""The local cluster's primitives: processes it starts and records, waiting, ports, and the API client.

The orchestrator (``control``: up, down, status) and the modules it drives (``nodehost`` for real kubelets,
``prometheus_operator``) all stand on these; none of them imports the orchestrator, so there is no circle.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tools.localcluster.plan import Layout

ROOT = Path(__file__).resolve().parents[2]


class ClusterError(RuntimeError):
    """A step of up/down failed; the message says which and where its log is."""


def say(msg: str) -> None:
    print(f"localcluster: {msg}", flush=True)


# --------------------------------------------------------------------------- processes


def _stat(path: Path) -> list[str]:
    """The fields of a ``/proc/.../stat`` file after the command name (state first); empty if it is gone."""
    try:
        return path.read_text().rsplit(")", 1)[-1].split()
    except OSError:
        return []


def start_ticks(pid: int) -> int | None:
    """The process start time (clock ticks since boot) from /proc: with the pid it names one process."""
    fields = _stat(Path(f"/proc/{pid}/stat"))
    if not fields or fields[0] in ("Z", "X"):
        return None
    return int(fields[19])


def exited(pid: int, ticks: int) -> bool:
    """Every thread of the process ``pid`` started at ``ticks`` has exited, so its files (listening sockets among
    them) are closed. Not the same as :func:`start_ticks` being None: a killed Go program's main thread turns zombie
    while its other threads are still closing its files, and a restart in that window finds its port in use (etcd,
    killed by the chaos soak, never came back: ``bind: address already in use`` on its own peer port)."""
    fields = _stat(Path(f"/proc/{pid}/stat"))
    if not fields or int(fields[19]) != ticks:
        return True  # reaped, or the pid names another process now
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return True
    return all((_stat(t / "stat") or ["X"])[0] in ("Z", "X") for t in tasks)


def children(pid: int) -> list[int]:
    """The process's children (Linux's ``/proc/<pid>/task/<pid>/children``); empty when it has none or is gone."""
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except (OSError, ValueError):
        return []


@dataclass(frozen=True)
class Proc:
    name: str
    pid: int
    argv: list[str]
    log: str
    start_ticks: int | None = None
    #: Started under :mod:`tools.localcluster.supervise`: ``pid`` is the supervisor, ``argv`` the component's.
    supervised: bool = False

    def alive(self) -> bool:
        """Still running and still the process we started (not a reused pid)."""
        ticks = start_ticks(self.pid)
        return ticks is not None and ticks == self.start_ticks

    def exited(self) -> bool:
        """Every thread gone: what a restart must wait for (:func:`exited`)."""
        return self.start_ticks is None or exited(self.pid, self.start_ticks)

    def component(self) -> tuple[int, int] | None:
        """The running component's pid and start ticks: the supervisor's child when supervised (None between a
        component's exit and its restart), else the process itself (None once it is gone)."""
        if not self.alive():
            return None
        if not self.supervised:
            return (self.pid, self.start_ticks) if self.start_ticks is not None else None
        for pid in children(self.pid):
            ticks = start_ticks(pid)
            if ticks is not None:
                return pid, ticks
        return None


def _record(lay: Layout, name: str) -> Path:
    return lay.run / f"{name}.json"


def load_proc(lay: Layout, name: str) -> Proc | None:
    path = _record(lay, name)
    if not path.exists():
        return None
    data = json.loads(path.read_text())
    return Proc(name=name, pid=int(data["pid"]), argv=list(data["argv"]), log=str(data["log"]),
                start_ticks=data.get("start_ticks"), supervised=bool(data.get("supervised", False)))


def recorded(lay: Layout) -> list[Proc]:
    procs = [load_proc(lay, p.stem) for p in sorted(lay.run.glob("*.json"))] if lay.run.exists() else []
    return [p for p in procs if p is not None]


def start_process(lay: Layout, name: str, argv: Sequence[str], env: Mapping[str, str] | None = None,
                  supervised: bool = False) -> Proc:
    """Start ``argv`` detached (own session), log to ``logs/<name>.log``, record it for ``down``. ``supervised``:
    under :mod:`tools.localcluster.supervise`, which starts it again whenever it exits (as a kubelet does a static
    pod); the record keeps the component's own ``argv``."""
    existing = load_proc(lay, name)
    if existing and existing.alive():
        return existing
    lay.logs.mkdir(parents=True, exist_ok=True)
    lay.run.mkdir(parents=True, exist_ok=True)
    log = lay.logs / f"{name}.log"
    command = [sys.executable, "-m", "tools.localcluster.supervise", "--", *argv] if supervised else list(argv)
    environment = {**os.environ, **(env or {})}
    if supervised:
        environment["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), environment.get("PYTHONPATH")) if p)
    with log.open("ab") as out:
        child = subprocess.Popen(
            command, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, cwd=lay.state,
            start_new_session=True, env=environment,
        )
    proc = Proc(name=name, pid=child.pid, argv=list(argv), log=str(log), start_ticks=start_ticks(child.pid),
                supervised=supervised)
    _record(lay, name).write_text(json.dumps(
        {"pid": proc.pid, "argv": proc.argv, "log": proc.log, "start_ticks": proc.start_ticks,
         "supervised": supervised}))
    return proc


def end_process(pid: int, ticks: int, grace: float, first: int = signal.SIGTERM) -> None:
    """Send ``first`` to the process ``pid`` started at ``ticks``, SIGKILL it if it has not exited after ``grace``;
    returns once every thread of it has exited (:func:`exited`), or ``grace`` after the SIGKILL."""
    for sig in (first, signal.SIGKILL):
        if exited(pid, ticks):
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
        deadline = time.monotonic() + grace
        while not exited(pid, ticks) and time.monotonic() < deadline:
            time.sleep(0.05)


def stop_process(lay: Layout, proc: Proc, grace: float = 10.0) -> None:
    """SIGTERM, SIGKILL after ``grace``; returns once every thread of it has exited (its ports are free again) —
    of the component too, when supervised (the supervisor passes the SIGTERM on; killed, the kernel kills the
    component)."""
    component = proc.component() if proc.supervised else None
    if proc.start_ticks is not None:  # not alive() alone: a process mid-exit still holds its ports until it is gone
        end_process(proc.pid, proc.start_ticks, grace + (2 if proc.supervised else 0))  # the supervisor's grace first
    deadline = time.monotonic() + grace
    while component is not None and not exited(*component) and time.monotonic() < deadline:
        time.sleep(0.05)
    _record(lay, proc.name).unlink(missing_ok=True)


def log_tail(path: str | Path, lines: int = 15) -> str:
    try:
        return "\n".join(Path(path).read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def wait_for(what: str, check: Callable[[], bool], timeout: float, proc: Proc | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and not proc.alive():
            raise ClusterError(f"{proc.name} exited while waiting for {what}; log {proc.log}:\n"
                               f"{log_tail(proc.log)}")
        try:
            if check():
                return
        except Exception:
            pass
        time.sleep(0.5)
    tail = f"; log {proc.log}:\n{log_tail(proc.log)}" if proc else ""
    raise ClusterError(f"timed out after {timeout:.0f}s waiting for {what}{tail}")


# --------------------------------------------------------------------------- ports and endpoints


#: Where the kernel takes the source ports of outgoing connections (``ip_local_port_range``).
EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
#: Linux's default ephemeral range, when the file cannot be read.
DEFAULT_EPHEMERAL = (32768, 60999)
#: The lowest port our processes listen on, and the fewest candidates a range must offer to be used.
LISTEN_FLOOR = 20000
MIN_CANDIDATES = 1000


def ephemeral_range(path: Path = EPHEMERAL_RANGE_FILE) -> tuple[int, int]:
    """The kernel's ephemeral port range (its default when the file is missing or not two port numbers)."""
    try:
        lo, hi = (int(x) for x in path.read_text().split())
    except (OSError, ValueError):
        return DEFAULT_EPHEMERAL
    if not 1 <= lo <= hi <= 65535:
        return DEFAULT_EPHEMERAL
    return lo, hi


def listen_candidates(ephemeral: tuple[int, int], floor: int = LISTEN_FLOOR) -> range:
    """Ports to listen on outside the ephemeral range: below it from ``floor``, else above it, else (a range that
    leaves neither side room) every unprivileged port."""
    lo, hi = ephemeral
    below, above = range(floor, lo), range(max(hi + 1, 1024), 65536)
    for pool in (below, above):
        if len(pool) >= MIN_CANDIDATES:
            return pool
    return range(1024, 65536)


def free_ports(names: Sequence[str], rng: random.Random | None = None,
               candidates: range | None = None) -> dict[str, int]:
    """A free port for each name, outside the kernel's ephemeral range. A port the kernel hands out as the source
    of an outgoing connection cannot be listened on while that connection lives: a process restarted after a kill
    (etcd, in the chaos soak) found its port taken by one and never came back."""
    pool = candidates if candidates is not None else listen_candidates(ephemeral_range())
    pick = rng or random.SystemRandom()
    socks: list[socket.socket] = []
    ports: dict[str, int] = {}
    try:
        for name in names:
            for _ in range(200):
                port = pick.choice(pool)
                if port in ports.values():
                    continue
                s = socket.socket()
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    s.close()
                    continue
                socks.append(s)
                ports[name] = port
                break
            else:
                raise ClusterError(f"no free port for {name} in {pool.start}-{pool.stop - 1}")
    finally:
        for s in socks:
            s.close()
    return ports


def _ssl_context(lay: Layout) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(lay.pki / "ca.crt"))
    ctx.load_cert_chain(str(lay.pki / "admin.crt"), str(lay.pki / "admin.key"))
    return ctx


def api_get(lay: Layout, port: int, path: str, timeout: float = 5.0) -> tuple[int, str]:
    url = f"https://127.0.0.1:{port}{path}"
    try:
        with urllib.request.urlopen(url, context=_ssl_context(lay), timeout=timeout) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode(errors="replace")


def http_ok(url: str) -> bool:
    with urllib.request.urlopen(url, timeout=3) as resp:
        return bool(resp.status == 200)


def load_ports(lay: Layout) -> dict[str, int] | None:
    path = lay.run / "ports.yaml"
    if not path.exists():
        return None
    data = yaml.safe_load(path.read_text()) or {}
    return {str(k): int(v) for k, v in data.items()}


# --------------------------------------------------------------------------- the API


def api_client(lay: Layout) -> Any:
    from kubernetes import config

    return config.new_client_from_config(config_file=str(lay.kubeconfig))  # type: ignore[no-untyped-call]


#: Node creates in flight at once: a 2,048-node plan is created in seconds instead of one round trip at a time.


def crds_established(lay: Layout, names: Sequence[str]) -> bool:
    from kubernetes import client

    ext = client.ApiextensionsV1Api(api_client(lay))
    for name in names:
        crd = ext.read_custom_resource_definition(name)
        conds = {c.type: c.status for c in (crd.status.conditions or [])} if crd.status else {}
        if conds.get("Established") != "True":
            return False
    return True
