"""No agent lists a whole resource per cycle: each keeps nodes (and what else it reads every pass) from one list
and then a watch, as client-go's informers do. At 2,048 nodes a list per poll is the heaviest request an agent can
make of the API server, so the rule is held here for every agent that reads the API in a loop, on the real client
over HTTP with a watch that streams."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from agents.health_guard.shell import Guard
from agents.kit.port import NODES, VOLCANO_JOBS
from agents.node_pools.contract import NodePoolSettings, Pool
from agents.node_pools.shell import NodePools
from tests.fake_kube_api import http_port, serve
from tests.test_health_guard_shell import NODES as GUARD_NODES
from tests.test_health_guard_shell import SETTINGS, FakePrometheus, HttpCluster, k8s_node

PREFIX = "gpucluster.io"


class CountingPrometheus(FakePrometheus):
    def __init__(self) -> None:
        super().__init__()
        self.queries = 0

    def query_raw(self, promql: str) -> Any:
        self.queries += 1
        return super().query_raw(promql)


@pytest.fixture
def cluster() -> Iterator[tuple[HttpCluster, Any]]:
    fake = HttpCluster()
    fake.watch_hold_seconds = 0.5
    for n in GUARD_NODES:
        fake.put(NODES, k8s_node(n))
    fake.put(VOLCANO_JOBS, {"metadata": {"name": "gang", "namespace": "training"}, "status": {"retryCount": 0}})
    with serve(fake) as url:
        yield fake, http_port(url)


def running(agent: Any, seconds: float) -> threading.Thread:
    stop = threading.Event()
    thread = threading.Thread(target=agent.run, args=(stop,), daemon=True)
    thread.start()
    time.sleep(seconds)
    stop.set()
    thread.join(timeout=10)
    assert not thread.is_alive()
    return thread


def wait_for(check: Any, seconds: float = 5.0) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_the_guard_lists_nodes_and_jobs_once_and_acts_on_what_the_watch_brings(cluster: tuple[HttpCluster, Any]
                                                                                ) -> None:
    fake, port = cluster
    prom = CountingPrometheus()
    guard = Guard(SETTINGS.model_copy(update={"poll_seconds": 1, "watch_timeout_seconds": 1}), prom, port,
                  identity="g")
    stop = threading.Event()
    thread = threading.Thread(target=guard.run, args=(stop,), daemon=True)
    thread.start()
    try:
        wait_for(lambda: prom.queries > 0 and guard.nodes.synced)
        # Someone changes the node after the guard's list: only the watch tells it the new resourceVersion, and a
        # quarantine computed on the old one would be refused (409).
        fake.edit_node("gpu-02", lambda n: n["metadata"]["labels"].update({"rack": "r7"}))
        prom.xid = {"gpu-02": 1}
        wait_for(lambda: ("gpucluster.io/gpu-health", "fatal", "NoSchedule") in fake.taints("gpu-02"))
        cycles_before = prom.queries
        time.sleep(2.5)
        assert prom.queries > cycles_before  # it kept cycling
    finally:
        stop.set()
        thread.join(timeout=10)
    assert not thread.is_alive()
    assert fake.count("list:nodes") == 1 and fake.count("list:jobs") == 1
    assert fake.count("watch:nodes") >= 2  # the watch ran, and was restarted without a list


def test_the_node_pool_agent_lists_nodes_once_and_labels_a_node_that_joins_later(cluster: tuple[HttpCluster, Any]
                                                                                 ) -> None:
    fake, port = cluster
    pool = Pool(name="a", nodes=["gpu-0[1-5]"], labels={f"{PREFIX}/pool": "a"})
    agent = NodePools(NodePoolSettings(label_prefix=PREFIX, pools=[pool], watch_timeout_seconds=1,
                                       retry_period_seconds=0.2, renew_deadline_seconds=1, lease_duration_seconds=2,
                                       request_timeout_seconds=0.5), port, identity="p")
    stop = threading.Event()
    thread = threading.Thread(target=agent.run, args=(stop,), daemon=True)
    thread.start()
    try:
        annotation = agent.settings.applied_annotation
        wait_for(lambda: all(annotation in fake.nodes[n]["metadata"]["annotations"] for n in GUARD_NODES))
        fake.put(NODES, k8s_node("gpu-05"))
        wait_for(lambda: annotation in fake.nodes["gpu-05"]["metadata"]["annotations"])
        time.sleep(1.5)
    finally:
        stop.set()
        thread.join(timeout=10)
    assert fake.count("list:nodes") == 1
    assert fake.count("patch:nodes") == 5  # one per node: nothing is rewritten once it is right
