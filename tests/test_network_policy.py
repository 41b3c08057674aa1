"""NetworkPolicies on the rendered stack, judged by a small evaluator of the NetworkPolicy semantics.

The local control plane has no CNI, so it stores these objects and enforces none of them; what can be tested
here is what they allow. ``allowed`` answers "may a pod with these labels in this namespace reach that pod on
this port" the way a conforming CNI does: a pod selected by any policy of a direction is isolated in that
direction, and a connection needs the source's egress and the destination's ingress to allow it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from components.config import ConfigError, parse_config
from components.mockrt import RunResult, raw_from_stack
from components.network_policy import url_port
from tests.conftest import StackRunner

SYS, TEL, INF, MON = "gpu-system", "gpu-telemetry", "inference", "monitoring"
TENANT = "liqo-tenant-dr-cluster-eu-west-4"


@dataclass(frozen=True)
class Pod:
    namespace: str
    labels: dict[str, str]
    #: Named ports: name -> number.
    ports: dict[str, int] = field(default_factory=dict)


#: Outside the cluster (the API server on the host network, a broker, a provider's API).
HOST = Pod("", {})


def app(ns: str, name: str, **ports: int) -> Pod:
    return Pod(ns, {"app.kubernetes.io/name": name}, ports)


def matches(selector: dict[str, Any] | None, labels: dict[str, str]) -> bool:
    selector = selector or {}
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for expr in selector.get("matchExpressions") or []:
        assert expr["operator"] in ("In", "DoesNotExist"), expr
        if expr["operator"] == "DoesNotExist" and expr["key"] in labels:
            return False
        if expr["operator"] == "In" and labels.get(expr["key"]) not in expr["values"]:
            return False
    return True


def peer_matches(peer: dict[str, Any], pod: Pod) -> bool:
    if "ipBlock" in peer:
        return pod is HOST and peer["ipBlock"]["cidr"] == "0.0.0.0/0"
    if pod is HOST:
        return False
    ns_ok = matches(peer.get("namespaceSelector"), {"kubernetes.io/metadata.name": pod.namespace}) \
        if "namespaceSelector" in peer else None
    pod_ok = matches(peer.get("podSelector"), pod.labels) if "podSelector" in peer else True
    return (ns_ok if ns_ok is not None else True) and pod_ok


def port_matches(rule_ports: list[dict[str, Any]] | None, target: Pod, port: int, protocol: str) -> bool:
    if not rule_ports:
        return True
    for p in rule_ports:
        number = target.ports.get(p["port"]) if isinstance(p["port"], str) else p["port"]
        if p.get("protocol", "TCP") == protocol and number == port:
            return True
    return False


class Policies:
    def __init__(self, result: RunResult) -> None:
        self.items = [(p.metadata["namespace"], p.inputs["spec"]) for p in result.by_kind("NetworkPolicy")]

    def _direction(self, pod: Pod, kind: str) -> list[dict[str, Any]] | None:
        """The rules of one direction that apply to ``pod``, or None when it is not isolated that way."""
        if pod is HOST:
            return None
        selected = [spec for ns, spec in self.items
                    if ns == pod.namespace and kind in spec["policyTypes"] and matches(spec["podSelector"], pod.labels)]
        if not selected:
            return None
        key = "ingress" if kind == "Ingress" else "egress"
        return [rule for spec in selected for rule in (spec.get(key) or [])]

    def allowed(self, src: Pod, dst: Pod, port: int, protocol: str = "TCP") -> bool:
        egress = self._direction(src, "Egress")
        if egress is not None and not any(
                (not r.get("to") or any(peer_matches(p, dst) for p in r["to"]))
                and port_matches(r.get("ports"), dst, port, protocol) for r in egress):
            return False
        ingress = self._direction(dst, "Ingress")
        return ingress is None or any(
            (not r.get("from") or any(peer_matches(p, src) for p in r["from"]))
            and port_matches(r.get("ports"), dst, port, protocol) for r in ingress)


PROMETHEUS = Pod(MON, {"app.kubernetes.io/name": "prometheus"}, {"web": 9090})
DNS = Pod("kube-system", {"k8s-app": "kube-dns"})
BURST = app(SYS, "burst-controller", metrics=9310)
GUARD = app(SYS, "health-guard", metrics=9316)
DCGM = app(TEL, "dcgm-exporter", metrics=9400)
IB = app(TEL, "ib-exporter", metrics=9315)
ADAPTER = app(SYS, "prometheus-adapter", https=6443)
VK = app(SYS, "vk-lambda-east", kubelet=10250, metrics=10255)
LIQO_VK = app(TENANT, "vk-dr-cluster", kubelet=10250, metrics=10255)
LIQO_GATEWAY = Pod(TENANT, {"app": "liqo-gateway"})
TRAINING = Pod("training", {"app.kubernetes.io/name": "worker"})


def server(name: str) -> Pod:
    return Pod(INF, {"gpucluster.io/service": name, "app.kubernetes.io/name": name}, {"http": 8000})


@pytest.fixture(scope="module")
def policies(prod: RunResult) -> Policies:
    return Policies(prod)


def test_default_deny_in_the_platform_namespaces(prod: RunResult, policies: Policies) -> None:
    denies = {(p.metadata["namespace"], p.metadata["name"]): p.inputs["spec"] for p in prod.by_kind("NetworkPolicy")
              if p.metadata["name"] == "default-deny"}
    assert set(denies) == {(SYS, "default-deny"), (TEL, "default-deny"), (INF, "default-deny")}
    assert all(s == {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]} for s in denies.values())
    # Anything not listed is refused: pod to pod inside the namespace, and from training.
    assert not policies.allowed(BURST, GUARD, 9316)
    assert not policies.allowed(TRAINING, BURST, 9310)
    assert not policies.allowed(DCGM, HOST, 443)
    # ...while every pod there still resolves names.
    for pod in (BURST, server("sdxl-turbo"), LIQO_VK):
        assert policies.allowed(pod, DNS, 53, "UDP") and policies.allowed(pod, DNS, 53, "TCP")


def test_the_privileged_exporters_are_only_scraped(prod: RunResult, policies: Policies) -> None:
    """The telemetry namespace (root, SYS_ADMIN, hostPath) takes the scrape from monitoring and nothing else:
    no egress at all, not even DNS, and no path from the controllers' namespace."""
    telemetry = sorted(p.metadata["name"] for p in prod.by_kind("NetworkPolicy") if p.metadata["namespace"] == TEL)
    assert telemetry == ["allow-metrics-scrape", "default-deny"]
    for pod in (DCGM, IB):
        assert policies.allowed(PROMETHEUS, pod, pod.ports["metrics"])
        assert not policies.allowed(BURST, pod, pod.ports["metrics"]) and not policies.allowed(GUARD, pod, 9400)
        assert not policies.allowed(pod, DNS, 53, "UDP") and not policies.allowed(pod, HOST, 443)
        assert not policies.allowed(pod, BURST, 9310) and not policies.allowed(pod, PROMETHEUS, 9090)


def test_metrics_ports_only_from_the_monitoring_namespace(policies: Policies) -> None:
    for pod in (BURST, GUARD, DCGM, IB, VK, LIQO_VK):
        port = pod.ports["metrics"]
        assert policies.allowed(PROMETHEUS, pod, port), pod
        assert not policies.allowed(TRAINING, pod, port), pod
        assert not policies.allowed(HOST, pod, port), pod
        assert not policies.allowed(server("sdxl-turbo"), pod, port), pod


def test_controllers_reach_the_api_server_and_nothing_else_outside(policies: Policies) -> None:
    for pod in (BURST, GUARD, ADAPTER, app(SYS, "descheduler"), VK, LIQO_VK):
        assert policies.allowed(pod, HOST, 443) and policies.allowed(pod, HOST, 6443), pod
        assert not policies.allowed(pod, HOST, 22), pod
    # Exporters hold no token and call nothing.
    assert not policies.allowed(DCGM, HOST, 6443)
    # The health guard and the adapter query Prometheus; the burst controller does not.
    assert policies.allowed(GUARD, PROMETHEUS, 9090) and policies.allowed(ADAPTER, PROMETHEUS, 9090)
    assert not policies.allowed(BURST, PROMETHEUS, 9090)


@pytest.mark.parametrize("stack", ["prod", "local"])
def test_every_pod_of_ours_that_mounts_a_token_reaches_the_api_server(stack: str, request: pytest.FixtureRequest
                                                                      ) -> None:
    """The rule behind a defect the stack-in-pods e2e found: the node-pool agent, added later, was left out of the
    API server egress rule, so under default deny its pods never reached the API server. Any pod template the stack
    renders in the namespaces it isolates that keeps its ServiceAccount token must be allowed there."""
    result: RunResult = request.getfixturevalue(stack)
    rules = Policies(result)
    isolated = {p.metadata["namespace"] for p in result.by_kind("NetworkPolicy")
                if p.metadata["name"] == "default-deny"}
    checked = []
    for kind in ("Deployment", "DaemonSet", "StatefulSet"):
        for obj in result.by_kind(kind):
            template = obj.inputs["spec"]["template"]
            spec = template.get("spec") or {}
            if obj.metadata.get("namespace") not in isolated or spec.get("automountServiceAccountToken") is False:
                continue
            pod = Pod(obj.metadata["namespace"], (template.get("metadata") or {}).get("labels") or {})
            assert rules.allowed(pod, HOST, 443) or rules.allowed(pod, HOST, 6443), (
                f"{kind} {obj.metadata['namespace']}/{obj.metadata['name']} keeps its token but cannot reach the "
                "API server under the stack's NetworkPolicies")
            checked.append(obj.metadata["name"])
    assert "node-pools" in checked and "health-guard" in checked, checked


def test_the_api_server_reaches_the_adapter_and_the_virtual_kubelets(policies: Policies) -> None:
    assert policies.allowed(HOST, ADAPTER, 6443)
    assert policies.allowed(HOST, VK, 10250) and policies.allowed(HOST, LIQO_VK, 10250)
    assert not policies.allowed(HOST, BURST, 9310)


def test_liqos_namespace_is_left_to_liqo(policies: Policies) -> None:
    """Only our virtual kubelet is selected in the tenant namespace; Liqo's own pods keep their traffic."""
    assert policies.allowed(LIQO_GATEWAY, HOST, 5871, "UDP")
    assert policies.allowed(HOST, LIQO_GATEWAY, 5871, "UDP")


def test_inference_ingress_only_from_its_gateway_or_queue_path(prod: RunResult, policies: Policies) -> None:
    gateway = Pod(INF, {"app.kubernetes.io/name": "inference-gateway"})
    chat, sdxl = server("llama-70b-chat"), server("sdxl-turbo")
    # A gateway service: requests from the gateway's namespace, scrapes from monitoring, nothing else.
    assert policies.allowed(gateway, chat, 8000)
    assert policies.allowed(PROMETHEUS, chat, 8000)
    assert not policies.allowed(TRAINING, chat, 8000) and not policies.allowed(HOST, chat, 8000)
    assert not policies.allowed(chat, HOST, 443)
    # Servers do not talk to each other.
    assert not policies.allowed(sdxl, chat, 8000)
    # A queue worker takes no requests; it reaches its broker's port and nothing else.
    assert not policies.allowed(gateway, sdxl, 8000)
    assert policies.allowed(sdxl, HOST, 5671)
    assert not policies.allowed(sdxl, HOST, 443)
    # Every service is covered, standby replicas included (they carry the service label).
    names = {p.metadata["name"] for p in prod.by_kind("NetworkPolicy") if p.metadata["namespace"] == INF}
    assert {"inference-llama-70b-chat", "inference-sdxl-turbo", "inference-whisper-large"} <= names


def test_training_is_not_isolated(policies: Policies) -> None:
    """Gangs talk pod to pod on any port (NCCL, gloo) and to their data sources."""
    other = Pod("training", {"app.kubernetes.io/name": "worker-2"})
    assert policies.allowed(TRAINING, other, 29500) and policies.allowed(TRAINING, HOST, 443)


def test_local_stack_renders_the_same_policies(local: RunResult) -> None:
    names = {(p.metadata["namespace"], p.metadata["name"]) for p in local.by_kind("NetworkPolicy")}
    assert {(SYS, "default-deny"), (INF, "default-deny"), (SYS, "allow-dns"), (SYS, "vk-local-cloud")} <= names


@pytest.mark.parametrize(("url", "port"), [("amqps://q.example:5671/jobs", 5671), ("amqps://q.example/jobs", 5671),
                                           ("http://prometheus-operated.monitoring.svc:9090/", 9090),
                                           ("https://x.example", 443)])
def test_url_port(url: str, port: int) -> None:
    assert url_port(url) == port


def test_url_port_without_a_known_default_names_the_url() -> None:
    with pytest.raises(ValueError, match="gopher://x"):
        url_port("gopher://x")


def test_api_server_cidrs_come_from_the_stack(run_stack: StackRunner) -> None:
    def edit(config: dict[str, Any]) -> None:
        config["gpu-cluster:apiServerCidrs"] = ["10.0.0.1/32", "10.0.0.2/32"]

    result = run_stack("local", edit)
    spec = next(p.inputs["spec"] for p in result.by_kind("NetworkPolicy") if p.metadata["name"] == "allow-api-server")
    assert [peer["ipBlock"]["cidr"] for peer in spec["egress"][0]["to"]] == ["10.0.0.1/32", "10.0.0.2/32"]


def test_a_bad_api_server_cidr_is_refused_by_name() -> None:
    raw = raw_from_stack("local")
    raw["apiServerCidrs"] = ["10.0.0.1/8"]
    with pytest.raises(ConfigError) as refused:
        parse_config(raw, "Pulumi.local.yaml")
    assert "apiServerCidrs" in str(refused.value) and "10.0.0.1/8" in str(refused.value)


def test_dns_that_is_not_a_kube_dns_pod_is_admitted_by_its_cidrs(run_stack: StackRunner) -> None:
    def edit(config: dict[str, Any]) -> None:
        config["gpu-cluster:dnsCidrs"] = ["169.254.20.10/32"]  # NodeLocal DNSCache

    result = run_stack("local", edit)
    for policy in result.by_kind("NetworkPolicy"):
        if policy.metadata["name"] == "allow-dns":
            (rule,) = policy.inputs["spec"]["egress"]
            kube_dns, cache = rule["to"]
            assert kube_dns["podSelector"]["matchLabels"] == {"k8s-app": "kube-dns"}
            assert cache == {"ipBlock": {"cidr": "169.254.20.10/32"}}
            assert {(p["protocol"], p["port"]) for p in rule["ports"]} == {("UDP", 53), ("TCP", 53)}
    # Without the key, only kube-dns's pods: nothing else on port 53.
    for policy in run_stack("local", lambda c: None).by_kind("NetworkPolicy"):
        if policy.metadata["name"] == "allow-dns":
            assert len(policy.inputs["spec"]["egress"][0]["to"]) == 1


def test_a_bad_dns_cidr_is_refused_by_name() -> None:
    raw = raw_from_stack("local")
    raw["dnsCidrs"] = ["169.254.20.10/8"]
    with pytest.raises(ConfigError) as refused:
        parse_config(raw, "Pulumi.local.yaml")
    assert "dnsCidrs" in str(refused.value) and "169.254.20.10/8" in str(refused.value)
