"""Scrape time of ``ib-exporter`` next to node_exporter's infiniband collector: same tree, same run.

Both exporters serve HTTP ``/metrics`` from the same fake sysfs tree (8 HCAs, every IB counter and a full
set of mlx5 hw_counters), and the benchmark times complete HTTP scrapes of each, alternating between
them so that machine noise hits both alike. The median is reported because a single slow scrape (a
context switch on a shared CI core) says nothing about the exporter.

Targets: median scrape within 2x of node_exporter's and under 20 ms.

A second figure holds ``IDLE_SOCKETS`` idle connections (127.0.0.1 only) open against ib-exporter and
reads its resident memory and thread count from /proc while they are held, then scrapes it: the
process must stay under the DaemonSet's memory limit and still answer.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from fakes.ib_sysfs import full_node

NODE_EXPORTER = "prometheus-node-exporter"
HCAS = 8
SCRAPES = 200
TARGET_RATIO = 2.0
TARGET_MS = 20.0
IDLE_SOCKETS = 3000
POD_MEMORY_LIMIT_MIB = 64.0
"""The ib-exporter container's memory limit (components/observability.py, ``resources(..., "64Mi")``)."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def fetch(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:
        body: bytes = response.read()
    return body.decode("utf-8")


def _wait_ready(url: str, proc: subprocess.Popen[bytes]) -> None:
    """Poll the landing page, not /metrics, so that readiness does not count as a scrape."""
    for _ in range(400):
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args!r} exited with {proc.returncode} before serving {url}")
        try:
            fetch(url)
            return
        except OSError:
            time.sleep(0.025)
    raise RuntimeError(f"{url} did not answer")


@contextmanager
def serve(argv: list[str], port: int) -> Iterator[str]:
    """Run an exporter process and yield its metrics URL once it answers."""
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_ready(f"http://127.0.0.1:{port}/", proc)
        yield f"http://127.0.0.1:{port}/metrics"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def node_exporter_binary() -> str:
    path = shutil.which(NODE_EXPORTER)
    if path is None:
        raise RuntimeError(f"{NODE_EXPORTER} not found: run `make observability-tools` (Debian package)")
    return path


@contextmanager
def node_exporter(sysfs_root: str) -> Iterator[str]:
    """node_exporter with only the infiniband collector, reading ``sysfs_root``."""
    port = free_port()
    argv = [
        node_exporter_binary(),
        f"--path.sysfs={sysfs_root}",
        "--collector.disable-defaults",
        "--collector.infiniband",
        "--web.disable-exporter-metrics",
        f"--web.listen-address=127.0.0.1:{port}",
    ]
    with serve(argv, port) as url:
        yield url


@contextmanager
def ib_exporter(sysfs_root: str) -> Iterator[str]:
    """Our exporter, started the way the DaemonSet starts it (same interpreter as the caller)."""
    port = free_port()
    argv = [
        sys.executable,
        "-m",
        "agents.ib_exporter.cli",
        f"--sysfs-root={sysfs_root}",
        f"--listen-address=127.0.0.1:{port}",
    ]
    with serve(argv, port) as url:
        yield url


def _proc_status(pid: int) -> dict[str, str]:
    with open(f"/proc/{pid}/status", encoding="ascii") as handle:
        return dict(line.rstrip("\n").split(":\t", 1) for line in handle if ":\t" in line)


def _rss_mib(status: dict[str, str]) -> float:
    return int(status["VmRSS"].split()[0]) / 1024


def idle_sockets(sysfs_root: str, sockets: int = IDLE_SOCKETS) -> dict[str, Any]:
    """Hold ``sockets`` idle loopback connections against ib-exporter; its memory, threads, one scrape."""
    port = free_port()
    argv = [sys.executable, "-m", "agents.ib_exporter.cli", f"--sysfs-root={sysfs_root}",
            f"--listen-address=127.0.0.1:{port}"]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    held: list[socket.socket] = []
    try:
        _wait_ready(f"http://127.0.0.1:{port}/", proc)
        fetch(f"http://127.0.0.1:{port}/metrics")
        before = _rss_mib(_proc_status(proc.pid))
        refused = 0
        for _ in range(sockets):
            try:
                held.append(socket.create_connection(("127.0.0.1", port), timeout=10))
            except OSError:
                refused += 1
        time.sleep(1.0)  # let the server take in what is queued before reading its footprint
        status = _proc_status(proc.pid)
        started = time.perf_counter()
        try:
            scrape_ok = "infiniband_exporter_scrapes_total" in fetch(f"http://127.0.0.1:{port}/metrics")
        except OSError:
            scrape_ok = False
        scrape_ms = (time.perf_counter() - started) * 1000
        peak = _rss_mib(_proc_status(proc.pid))
    finally:
        for sock in held:
            sock.close()
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    rss = max(_rss_mib(status), peak)
    return {
        "idle_sockets": sockets,
        "idle_connect_refused": refused,
        "idle_rss_before_mib": round(before, 1),
        "idle_rss_held_mib": round(rss, 1),
        "idle_threads_held": int(status["Threads"]),
        "idle_scrape_ok": scrape_ok,
        "idle_scrape_ms": round(scrape_ms, 1),
        "idle_within_memory_limit": scrape_ok and rss < POD_MEMORY_LIMIT_MIB,
    }


def _time_ms(url: str) -> float:
    started = time.perf_counter()
    fetch(url)
    return (time.perf_counter() - started) * 1000


def run(scrapes: int = SCRAPES, hcas: int = HCAS) -> dict[str, Any]:
    """Benchmark both exporters on one fresh tree; returns medians, p90s, the ratio and the verdict."""
    with tempfile.TemporaryDirectory(prefix="bench-ib-") as root:
        full_node(root, hcas)
        with ib_exporter(root) as ours_url, node_exporter(root) as peer_url:
            ours_series = sum(1 for line in fetch(ours_url).splitlines() if line.startswith("infiniband_"))
            peer_series = sum(1 for line in fetch(peer_url).splitlines() if line.startswith("node_infiniband_"))
            for _ in range(10):  # warm both (imports, first-scrape allocations) before timing
                fetch(ours_url)
                fetch(peer_url)
            ours: list[float] = []
            peer: list[float] = []
            for _ in range(scrapes):
                ours.append(_time_ms(ours_url))
                peer.append(_time_ms(peer_url))
        idle = idle_sockets(root)
    ours_median = statistics.median(ours)
    peer_median = statistics.median(peer)
    ratio = ours_median / peer_median
    return {
        "name": "ib_exporter_scrape",
        "hcas": hcas,
        "scrapes": scrapes,
        "ib_exporter_series": ours_series,
        "node_exporter_series": peer_series,
        "ib_exporter_median_ms": round(ours_median, 3),
        "ib_exporter_p90_ms": round(statistics.quantiles(ours, n=10)[-1], 3),
        "node_exporter_median_ms": round(peer_median, 3),
        "node_exporter_p90_ms": round(statistics.quantiles(peer, n=10)[-1], 3),
        "ratio": round(ratio, 3),
        # Our exporter also serves the mlx5 hw_counters node_exporter 1.5 does not read: cost per series
        # shows whether a gap in the ratio is work done or overhead.
        "ib_exporter_us_per_series": round(ours_median * 1000 / ours_series, 2),
        "node_exporter_us_per_series": round(peer_median * 1000 / peer_series, 2),
        "target_ratio": TARGET_RATIO,
        "target_ms": TARGET_MS,
        "meets_target": ratio <= TARGET_RATIO and ours_median < TARGET_MS and idle["idle_within_memory_limit"],
        **idle,
        "pod_memory_limit_mib": POD_MEMORY_LIMIT_MIB,
        "cpu_count": os.cpu_count(),
    }


def to_markdown(result: dict[str, Any]) -> str:
    verdict = "meets" if result["meets_target"] else "MISSES"
    return "\n".join(
        [
            f"### InfiniBand exporter scrape ({result['hcas']} HCAs, full hw_counters, "
            f"{result['scrapes']} scrapes each)",
            "",
            "| exporter | series | median ms | p90 ms |",
            "|---|---|---|---|",
            f"| ib-exporter | {result['ib_exporter_series']} | {result['ib_exporter_median_ms']} "
            f"| {result['ib_exporter_p90_ms']} |",
            f"| node_exporter 1.5 (infiniband only) | {result['node_exporter_series']} "
            f"| {result['node_exporter_median_ms']} | {result['node_exporter_p90_ms']} |",
            "",
            f"Ratio {result['ratio']}x; target <= {result['target_ratio']}x and < {result['target_ms']} ms: "
            f"{verdict}. node_exporter 1.5 does not read hw_counters, so ib-exporter serves more series: "
            f"{result['ib_exporter_us_per_series']} us per series against "
            f"{result['node_exporter_us_per_series']} us.",
            "",
            f"With {result['idle_sockets']} idle loopback connections held open: "
            f"{result['idle_rss_held_mib']} MiB resident (from {result['idle_rss_before_mib']} MiB, limit "
            f"{result['pod_memory_limit_mib']} MiB), {result['idle_threads_held']} threads, a scrape "
            f"{'answered' if result['idle_scrape_ok'] else 'FAILED'} in {result['idle_scrape_ms']} ms.",
            "",
        ]
    )


if __name__ == "__main__":
    outcome = run()
    print(json.dumps(outcome, indent=2))
    print(to_markdown(outcome))
