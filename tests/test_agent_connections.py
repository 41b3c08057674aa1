"""Each agent's connection pool fits the calls it has in flight at once.

On the 2,048-node scale shape the burst controller lifted a gang's gates sixteen at a time through a pool of ten (the
kubernetes client's default: five per CPU of the host), so every lift past the tenth opened a TLS connection of its
own and threw it away afterwards ("Connection pool is full, discarding connection" in its log, once per lift). The
pool is now sized from what the agent declares (``AgentSpec.connections``), held here on the real client over HTTP.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from agents.burst_controller import cli as burst_cli
from agents.burst_controller.contract import BurstSettings
from agents.burst_controller.shell import UNGATE_CONCURRENCY, WATCHED
from agents.health_guard import cli as guard_cli
from agents.health_guard.contract import parse_settings
from agents.health_guard.shell import ACTION_CONCURRENCY
from agents.kit import loop
from agents.kit.port import BASE_CONNECTIONS, NODES, HttpPort
from agents.node_pools import cli as pools_cli
from agents.node_pools.contract import NodePoolSettings
from agents.node_pools.shell import PATCH_CONCURRENCY
from tests.fake_kube_api import FakeApi, http_port, serve
from tests.test_health_guard_shell import k8s_node

POOL_FULL = "Connection pool is full"


@pytest.fixture
def api() -> Iterator[tuple[FakeApi, str]]:
    fake = FakeApi()
    for i in range(UNGATE_CONCURRENCY):
        fake.put(NODES, k8s_node(f"gpu-{i:02d}"))
    with serve(fake) as url:
        yield fake, url


def side_by_side(port: Any, fake: FakeApi, calls: int) -> None:
    """``calls`` patches at once, each held by the server long enough that all are in flight together (two seconds:
    the threads start well within that even on a loaded machine)."""
    for _ in range(calls):
        fake.fault("PATCH", r"/nodes/", ("delay", 2.0))
    with ThreadPoolExecutor(calls) as pool:
        list(pool.map(lambda i: port.patch(NODES, f"gpu-{i:02d}", {"metadata": {"labels": {"x": "y"}}}),
                      range(calls)))


def test_a_gangs_gate_lifts_reuse_the_burst_controllers_pool(api: tuple[FakeApi, str],
                                                               caplog: pytest.LogCaptureFixture) -> None:
    fake, url = api
    port = http_port(url, connections=burst_cli.SPEC.connections(BurstSettings()))
    with caplog.at_level(logging.WARNING, logger="urllib3.connectionpool"):
        side_by_side(port, fake, UNGATE_CONCURRENCY)
    assert fake.max_in_flight == UNGATE_CONCURRENCY  # they were all in flight at once
    assert not [r for r in caplog.records if POOL_FULL in r.getMessage()]


def test_a_pool_smaller_than_the_calls_throws_connections_away(api: tuple[FakeApi, str],
                                                               caplog: pytest.LogCaptureFixture) -> None:
    """What the scale shape showed, so the test above can fail: a pool of five under sixteen calls."""
    fake, url = api
    port = http_port(url, connections=1)
    with caplog.at_level(logging.WARNING, logger="urllib3.connectionpool"):
        side_by_side(port, fake, UNGATE_CONCURRENCY)
    assert len([r for r in caplog.records if POOL_FULL in r.getMessage()]) >= UNGATE_CONCURRENCY - 5


@pytest.mark.parametrize(("spec", "settings", "writes", "watches"), [
    (burst_cli.SPEC, BurstSettings(), UNGATE_CONCURRENCY, len(WATCHED)),
    (guard_cli.SPEC, parse_settings({"training_namespaces": ["a", "b", "c"]}, source="test"), ACTION_CONCURRENCY,
     1 + 3),
    (pools_cli.SPEC, NodePoolSettings(label_prefix="gpucluster.io"), PATCH_CONCURRENCY, 2),
], ids=["burst-controller", "health-guard", "node-pools"])
def test_each_agent_declares_its_watches_lease_and_side_by_side_writes(spec: Any, settings: Any, writes: int,
                                                                       watches: int) -> None:
    assert spec.connections(settings) == writes + watches + BASE_CONNECTIONS


def test_the_process_entry_sizes_the_pool_from_the_spec(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    seen: dict[str, Any] = {}

    def connect(kubeconfig: Any, timeout: float, user_agent: str | None = None, connections: int = 0) -> Any:
        seen["connections"] = connections
        raise RuntimeError("stop here")

    monkeypatch.setattr(loop.HttpPort, "connect", connect)
    config = tmp_path / "burst.yaml"
    config.write_text("{}\n")
    assert loop.main(burst_cli.SPEC, ["--config", str(config)]) == 2
    assert seen["connections"] == burst_cli.SPEC.connections(BurstSettings())


def test_a_pool_of_no_connections_is_refused() -> None:
    from kubernetes import client

    with pytest.raises(ValueError, match=r"connections: must be at least 1 \(got 0\)"):
        HttpPort.on(client.Configuration(), 5.0, connections=0)
