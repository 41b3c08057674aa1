"""The network faults of the chaos soak, on a real API server: each reaches the agents' own port (agents/kit) as
the kind of error the agents decide on, a watch streams through the proxy, and a fault aimed at one agent spares
the others. The proxy (cmd/apiproxy) is what the real nodes' pods reach the API server through; here it stands in
front of a control plane without real nodes, so no host privileges are needed."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from typing import Any

import pytest

from agents.kit.errors import ApiError
from agents.kit.port import LEASES, HttpPort
from tools.localcluster import apiproxy, control
from tools.localcluster.apiproxy import NetFault
from tools.localcluster.plan import Layout
from tools.localcluster.processes import ClusterError, start_process, wait_for
from tools.localcluster.realcluster import BUILT, linked_state

NAMESPACE = "default"
AGENT = "burst-controller"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@pytest.fixture(scope="module")
def proxied(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Layout, str, str]]:
    """A control plane, the proxy in front of it, and a ServiceAccount token that may use Leases."""
    missing = control.binaries_missing(Layout(BUILT)) + control.binaries_missing(Layout(BUILT), (apiproxy.NAME,))
    if missing:
        pytest.skip(f"local control plane or its proxy not built ({', '.join(missing)}); run `make localcluster`")
    from kubernetes import client

    lay = linked_state(tmp_path_factory.mktemp("apiproxy-cluster"))
    try:
        control.up(lay, timeout=300)
        ports = control.load_ports(lay) or {}
        listen = _free_port()
        proc = start_process(lay, apiproxy.NAME, apiproxy.command(lay, ports, "127.0.0.1", port=listen))
        wait_for("the proxy's control", lambda: _answers(lay), 30, proc)
        api = control.api_client(lay)
        core: Any = client.CoreV1Api(api)
        rbac: Any = client.RbacAuthorizationV1Api(api)
        core.create_namespaced_service_account(NAMESPACE, {"metadata": {"name": "agent"}})
        rbac.create_namespaced_role(NAMESPACE, {
            "metadata": {"name": "agent-leases"},
            "rules": [{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
                       "verbs": ["get", "list", "watch", "create", "update"]}]})
        rbac.create_namespaced_role_binding(NAMESPACE, {
            "metadata": {"name": "agent-leases"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "agent-leases"},
            "subjects": [{"kind": "ServiceAccount", "name": "agent", "namespace": NAMESPACE}]})
        token = core.create_namespaced_service_account_token("agent", NAMESPACE, {"spec": {}}).status.token
        yield lay, f"https://127.0.0.1:{listen}", token
    finally:
        control.down(lay, quiet=True)


def _answers(lay: Layout) -> bool:
    try:
        apiproxy.state(lay)
    except ClusterError:
        return False
    return True


def agent_port(lay: Layout, url: str, token: str, user_agent: str = f"{AGENT}/pod-0",
               timeout: float = 2.0) -> HttpPort:
    """The agents' own port (agents/kit/port.py) as a pod builds it: bearer token, the cluster's CA."""
    from kubernetes import client

    cfg = client.Configuration()
    cfg.host = url
    cfg.ssl_ca_cert = str(lay.pki / "ca.crt")
    cfg.api_key = {"authorization": token}
    cfg.api_key_prefix = {"authorization": "Bearer"}
    return HttpPort.on(cfg, timeout, user_agent)


def lease(name: str) -> dict[str, Any]:
    return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"name": name},
            "spec": {"holderIdentity": "pod-0", "leaseDurationSeconds": 15}}


def test_calls_pass_through_with_the_pods_token_and_a_watch_streams(proxied: tuple[Layout, str, str]) -> None:
    lay, url, token = proxied
    port = agent_port(lay, url, token)
    port.create(LEASES, lease("through"), NAMESPACE)
    assert port.get(LEASES, "through", NAMESPACE)["spec"]["holderIdentity"] == "pod-0"
    began = time.monotonic()
    first = next(iter(port.watch(LEASES, "", 30, NAMESPACE)))
    assert first["type"] == "ADDED" and time.monotonic() - began < 10, first
    assert apiproxy.state(lay)["fault"]["kind"] == "none"


@pytest.mark.parametrize(("fault", "kinds"), [
    (NetFault("status", status=429), {"throttled"}),
    (NetFault("status", status=503), {"server_error"}),
    (NetFault("reset"), {"unreachable", "server_error"}),
    (NetFault("hang"), {"timeout"}),
], ids=["429", "503", "reset", "hang"])
def test_each_network_fault_reaches_the_agent_as_a_retryable_error(
        proxied: tuple[Layout, str, str], fault: NetFault, kinds: set[str]) -> None:
    """What the agents' backoff and Lease renewal see: a 429 is throttled, a 503 a server error, a reset
    connection unreachable, a call never answered a timeout after the port's request timeout — each retryable."""
    lay, url, token = proxied
    port = agent_port(lay, url, token, timeout=1.0)
    apiproxy.set_fault(lay, NetFault(fault.kind, seconds=20, status=fault.status, user_agents=(f"{AGENT}/",)))
    try:
        began = time.monotonic()
        with pytest.raises(ApiError) as raised:
            port.get(LEASES, "anything", NAMESPACE)
        took = time.monotonic() - began
    finally:
        apiproxy.set_fault(lay, NetFault("none"))
    assert raised.value.kind in kinds and raised.value.retryable, raised.value
    assert took < 5, f"the call took {took:.1f}s; the port's request timeout is 1s"
    assert apiproxy.state(lay)["applied"].get(fault.kind, 0) >= 1


def test_latency_slows_the_call_and_a_fault_aimed_at_one_agent_spares_the_others(
        proxied: tuple[Layout, str, str]) -> None:
    lay, url, token = proxied
    mine, other = agent_port(lay, url, token), agent_port(lay, url, token, user_agent="health-guard/pod-0")
    mine.create(LEASES, lease("slow"), NAMESPACE)
    apiproxy.set_fault(lay, NetFault("latency", seconds=20, latency_ms=700, user_agents=(f"{AGENT}/",)))
    try:
        began = time.monotonic()
        assert mine.get(LEASES, "slow", NAMESPACE)["metadata"]["name"] == "slow"
        slowed = time.monotonic() - began
        began = time.monotonic()
        assert other.get(LEASES, "slow", NAMESPACE)["metadata"]["name"] == "slow"
        spared = time.monotonic() - began
    finally:
        apiproxy.set_fault(lay, NetFault("none"))
    assert slowed >= 0.7 and spared < 0.7, (slowed, spared)


@pytest.mark.parametrize(("fault", "message"), [
    (NetFault("status", seconds=5, status=200), "status must be 400-599"),
    (NetFault("latency", seconds=5), "latency_ms must be within"),
    (NetFault("reset", seconds=5, share=1.5), "share must be within"),
    (NetFault("reset"), "seconds must be within"),
    (NetFault("flood", seconds=5), "kind must be one of"),
])
def test_a_fault_the_proxy_cannot_apply_is_refused_naming_why(proxied: tuple[Layout, str, str], fault: NetFault,
                                                              message: str) -> None:
    lay, _, _ = proxied
    with pytest.raises(ClusterError, match=message):
        apiproxy.set_fault(lay, fault)
    assert apiproxy.state(lay)["fault"]["kind"] == "none"
