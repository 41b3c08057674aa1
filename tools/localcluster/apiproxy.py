"""The real nodes' pods reach the API server through a proxy (cmd/apiproxy), as production pods reach an HA control
plane through its load balancer; the chaos soak injects its network faults there (latency, 429/5xx answers,
connections reset, responses that never come) on exactly the path our agents' calls take.

The proxy listens on the API server's pod-reachable address at :data:`PORT` (a port the stack's NetworkPolicies
let controllers reach), and the ``kubernetes`` Service's endpoints name it; the API server runs with
``--endpoint-reconciler-type=none`` so nothing writes them back to itself. Kubelets, kube-proxy, kube-router,
CoreDNS and the control plane keep talking to the API server directly: only what runs in pods goes through it.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from tools.localcluster.plan import Layout
from tools.localcluster.processes import ClusterError, load_ports, start_process, wait_for

NAME = "apiproxy"
#: Where pods reach the API server: 443 is the ``kubernetes`` Service's own port, and one the stack's
#: NetworkPolicies let controllers reach (components/network_policy.API_SERVER_PORTS).
PORT = 443
CONTROL_PORT = "apiproxy_control"
MANAGED_BY = "localcluster.gpucluster.io"


@dataclass(frozen=True)
class NetFault:
    """One fault on the pods' path to the API server, for ``seconds`` (cmd/apiproxy checks it and ends it)."""

    kind: str  # latency, status, reset, hang, none
    seconds: float = 0.0
    share: float = 1.0
    latency_ms: int = 0
    status: int = 0
    #: Only requests whose User-Agent starts with one of these (our agents send ``<agent>/<identity>``); none: all.
    user_agents: tuple[str, ...] = ()


def command(lay: Layout, ports: Mapping[str, int], listen_ip: str, port: int = PORT) -> list[str]:
    pki = lay.pki
    return [
        str(lay.bin / NAME), f"--listen={listen_ip}:{port}", f"--control=127.0.0.1:{ports[CONTROL_PORT]}",
        f"--upstream=https://127.0.0.1:{ports['apiserver']}",
        f"--tls-cert-file={pki / 'apiserver.crt'}", f"--tls-private-key-file={pki / 'apiserver.key'}",
        f"--ca-file={pki / 'ca.crt'}",
    ]


def kubernetes_endpoints(ip: str, port: int = PORT) -> tuple[dict[str, Any], dict[str, Any]]:
    """The ``kubernetes`` Service's Endpoints and EndpointSlice, naming the proxy (the Endpoints is not mirrored:
    its slice is written here beside it, as the API server's own reconciler does)."""
    endpoints = {
        "apiVersion": "v1", "kind": "Endpoints",
        "metadata": {"name": "kubernetes", "namespace": "default",
                     "labels": {"endpointslice.kubernetes.io/skip-mirror": "true"}},
        "subsets": [{"addresses": [{"ip": ip}], "ports": [{"name": "https", "port": port, "protocol": "TCP"}]}],
    }
    endpoint_slice = {
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": "kubernetes", "namespace": "default",
                     "labels": {"kubernetes.io/service-name": "kubernetes",
                                "endpointslice.kubernetes.io/managed-by": MANAGED_BY}},
        "addressType": "IPv4",
        "endpoints": [{"addresses": [ip], "conditions": {"ready": True}}],
        "ports": [{"name": "https", "port": port, "protocol": "TCP"}],
    }
    return endpoints, endpoint_slice


def _control_url(lay: Layout) -> str:
    ports = load_ports(lay) or {}
    if CONTROL_PORT not in ports:
        raise ClusterError(f"no {NAME} in this cluster ({lay.run / 'ports.yaml'} names no {CONTROL_PORT})")
    return f"http://127.0.0.1:{ports[CONTROL_PORT]}/fault"


def _call(lay: Layout, body: bytes | None = None) -> dict[str, Any]:
    request = urllib.request.Request(_control_url(lay), data=body, method="PUT" if body is not None else "GET",
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=5) as resp:
            answer: dict[str, Any] = json.loads(resp.read())
            return answer
    except urllib.error.HTTPError as err:
        raise ClusterError(f"{NAME}: {err.read().decode(errors='replace').strip()}") from None
    except OSError as err:
        raise ClusterError(f"{NAME} does not answer on {_control_url(lay)}: {err}") from None


def set_fault(lay: Layout, fault: NetFault) -> dict[str, Any]:
    """Put ``fault`` in force; returns the proxy's state. A fault the proxy refuses raises naming why."""
    return _call(lay, json.dumps(asdict(fault)).encode())


def state(lay: Layout) -> dict[str, Any]:
    """The fault in force, its seconds left, and how many requests each kind of fault took."""
    return _call(lay)


def start(lay: Layout, ports: Mapping[str, int], listen_ip: str, timeout: float = 30.0) -> None:
    """Start the proxy and point the ``kubernetes`` Service at it."""
    from kubernetes import client

    from tools.localcluster.processes import api_client

    proc = start_process(lay, NAME, command(lay, ports, listen_ip))

    def answers() -> bool:
        try:
            state(lay)
        except ClusterError:
            return False
        return True

    wait_for(f"{NAME} control", answers, timeout, proc)
    api = api_client(lay)
    core: Any = client.CoreV1Api(api)
    discovery: Any = client.DiscoveryV1Api(api)
    endpoints, endpoint_slice = kubernetes_endpoints(listen_ip)
    _put(endpoints, lambda: core.read_namespaced_endpoints("kubernetes", "default"),
         lambda body: core.create_namespaced_endpoints("default", body),
         lambda body: core.replace_namespaced_endpoints("kubernetes", "default", body))
    _put(endpoint_slice, lambda: discovery.read_namespaced_endpoint_slice("kubernetes", "default"),
         lambda body: discovery.create_namespaced_endpoint_slice("default", body),
         lambda body: discovery.replace_namespaced_endpoint_slice("kubernetes", "default", body))


def _put(body: dict[str, Any], read: Callable[[], Any], create: Callable[[dict[str, Any]], Any],
         replace: Callable[[dict[str, Any]], Any]) -> None:
    """Create ``body``, or replace what is there (at the version read)."""
    from kubernetes.client import ApiException

    try:
        have = read()
    except ApiException as exc:
        if exc.status != 404:
            raise
        create(body)
        return
    replace({**body, "metadata": {**body["metadata"], "resourceVersion": have.metadata.resource_version}})
