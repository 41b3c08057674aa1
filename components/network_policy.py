"""NetworkPolicies: default deny in the platform namespaces, then only the paths the platform uses.

- **Default deny** (ingress and egress) in the system namespace (controllers, metrics adapter, generic virtual
  kubelets) and the inference namespace; every pod there may resolve names (DNS). The telemetry namespace
  (the DCGM and InfiniBand exporters, privileged) denies everything but the scrape: its exporters read the
  node, never the network, so they get no egress at all, not even DNS.
- **Metrics** ports (named ``metrics``) and inference servers' ``http`` port for scraping accept traffic only
  from the monitoring namespace.
- **Inference** ingress on ``http`` only from its gateway's namespace (``gateway`` services); ``queue-worker``
  services take no request traffic at all and may reach only their broker's port (egress). Where the gateway
  shares the inference namespace, its pods (those without the service label) may send requests to the
  gateway services; whatever else its data plane needs (its control plane) is the site's own policy.
- **Controllers** (the pods that hold a ServiceAccount token) may reach the API server on 443/6443; the
  health guard and the metrics adapter reach Prometheus in the monitoring namespace; a virtual kubelet also
  reaches its provider's API on 443, and accepts the API server's kubelet calls (logs, exec) on its kubelet
  port; the metrics adapter accepts the API server's aggregated-API calls.

DNS is kube-dns's pods in kube-system, plus the addresses of stack key ``dnsCidrs`` where the cluster resolves
elsewhere (a NodeLocal DNSCache's link-local address, a resolver on the nodes).

The API server is not a pod (it runs on the host network), so no pod or namespace selector matches it:
its egress rule is an IP block (stack key ``apiServerCidrs``, every address until a site narrows it) on its ports,
and the ingress rules for its calls name only the port. Liqo's tenant namespace belongs to Liqo (its gateway
and fabric run there): only our virtual kubelet's pod is selected, never the namespace.

The training namespace is left open on purpose, by an explicit allow-all policy: a gang talks pod to pod on
any port (NCCL, gloo) and to data sources each site chooses. Enforcement is the CNI's: a cluster without a
NetworkPolicy-capable CNI stores these objects and enforces none of them (the local control plane is such a
cluster). Most CNIs let the kubelet's own probes through regardless of policy.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import pulumi
import pulumi_kubernetes as k8s

from agents.node_pools.contract import APP as NODE_POOLS
from components.config import ClusterConfig, TrafficShape
from components.config.inference import DEFAULT_PORTS
from components.metrics_adapter import MetricsAdapterArgs
from components.naming import Keys, common_labels
from components.providers import KUBELET_PORT
from components.security import kube_score_ignores

NAMESPACE_LABEL = "kubernetes.io/metadata.name"
#: Where the cluster's DNS answers (kube-dns and CoreDNS both carry this label).
DNS_NAMESPACE = "kube-system"
DNS_SELECTOR = {"k8s-app": "kube-dns"}
#: The API server's addresses (stack key ``apiServerCidrs``); every address until a site narrows it (it is not
#: a pod, so only an IP block can name it).
API_SERVER_CIDRS: tuple[str, ...] = ("0.0.0.0/0",)
API_SERVER_PORTS = (443, 6443)
#: Our controllers: the pods that call the API server with their ServiceAccount token.
CONTROLLERS = ("burst-controller", "health-guard", NODE_POOLS, "descheduler", "prometheus-adapter")
ADAPTER = "prometheus-adapter"
HEALTH_GUARD = "health-guard"

Peer = k8s.networking.v1.NetworkPolicyPeerArgs
Port = k8s.networking.v1.NetworkPolicyPortArgs


def url_port(url: str) -> int:
    """The TCP port a URL points at (its own, else its scheme's default)."""
    parts = urlsplit(url)
    if parts.port:
        return parts.port
    if parts.scheme not in DEFAULT_PORTS:
        raise ValueError(f"no default port for scheme '{parts.scheme}' in {url!r}; write the port in the URL")
    return DEFAULT_PORTS[parts.scheme]


def namespace_peer(namespace: str, pods: dict[str, str] | None = None) -> Peer:
    return Peer(namespace_selector=k8s.meta.v1.LabelSelectorArgs(match_labels={NAMESPACE_LABEL: namespace}),
                pod_selector=k8s.meta.v1.LabelSelectorArgs(match_labels=pods) if pods else None)


def tcp(*ports: int | str) -> list[Port]:
    return [Port(protocol="TCP", port=p) for p in ports]


def app_selector(*apps: str) -> k8s.meta.v1.LabelSelectorArgs:
    """Pods by their ``app.kubernetes.io/name``."""
    if len(apps) == 1:
        return k8s.meta.v1.LabelSelectorArgs(match_labels={"app.kubernetes.io/name": apps[0]})
    return k8s.meta.v1.LabelSelectorArgs(match_expressions=[k8s.meta.v1.LabelSelectorRequirementArgs(
        key="app.kubernetes.io/name", operator="In", values=sorted(apps))])


ALL_PODS = k8s.meta.v1.LabelSelectorArgs()
ANYWHERE = [Peer(ip_block=k8s.networking.v1.IPBlockArgs(cidr="0.0.0.0/0"))]


@dataclass(frozen=True)
class InferencePaths:
    """One inference service's network paths."""

    name: str
    shape: TrafficShape
    #: The broker's port (queue-worker services).
    broker_port: int | None = None


@dataclass(frozen=True)
class NetworkPoliciesArgs:
    system_namespace: str
    telemetry_namespace: str
    inference_namespace: str
    training_namespace: str
    monitoring_namespace: str
    gateway_namespace: str
    prometheus_port: int
    services: tuple[InferencePaths, ...]
    #: Whether the stack runs the metrics adapter (some service scales on a request-level metric).
    metrics_adapter: bool
    #: Virtual kubelets: (app, namespace).
    virtual_kubelets: tuple[tuple[str, str], ...]
    #: The label naming an inference service on its pods (main and standby replicas alike).
    service_label: str = "gpucluster.io/service"
    api_server_cidrs: tuple[str, ...] = API_SERVER_CIDRS
    #: DNS that is not a kube-dns pod (stack key ``dnsCidrs``): a node-local cache, a resolver on the nodes.
    dns_cidrs: tuple[str, ...] = ()
    controllers: tuple[str, ...] = field(default=CONTROLLERS)

    @classmethod
    def from_config(cls, cfg: ClusterConfig) -> NetworkPoliciesArgs:
        adapter_url = cfg.inference.adapter.prometheus_url or cfg.observability.prometheus_url
        services = tuple(
            InferencePaths(s.name, s.traffic.shape,
                           url_port(s.traffic.queue_url) if s.traffic.queue_url else None)
            for s in cfg.inference.services
        )
        return cls(
            system_namespace=cfg.system_namespace,
            telemetry_namespace=cfg.telemetry_namespace,
            inference_namespace=cfg.inference_namespace,
            training_namespace=cfg.training_namespace,
            monitoring_namespace=cfg.monitoring_namespace,
            gateway_namespace=cfg.inference.gateway.namespace or cfg.inference_namespace,
            prometheus_port=url_port(adapter_url),
            metrics_adapter=bool(MetricsAdapterArgs.from_config(cfg).services),
            services=services,
            virtual_kubelets=tuple((f"vk-{p.name}", p.namespace(cfg.system_namespace)) for p in cfg.providers),
            service_label=Keys(cfg.label_prefix).service,
            api_server_cidrs=tuple(cfg.api_server_cidrs),
            dns_cidrs=tuple(cfg.dns_cidrs),
        )


class NetworkPolicies(pulumi.ComponentResource):
    """Every NetworkPolicy of the platform, kept by ``namespace/name`` in :attr:`policies`."""

    def __init__(self, name: str, args: NetworkPoliciesArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("gpu-cluster:core:NetworkPolicies", name, None, opts)
        self.args = args
        self.policies: dict[str, k8s.networking.v1.NetworkPolicy] = {}
        monitoring = namespace_peer(args.monitoring_namespace)
        dns = [k8s.networking.v1.NetworkPolicyEgressRuleArgs(
            to=[namespace_peer(DNS_NAMESPACE, DNS_SELECTOR),
                *(Peer(ip_block=k8s.networking.v1.IPBlockArgs(cidr=c)) for c in args.dns_cidrs)],
            ports=[Port(protocol="UDP", port=53), Port(protocol="TCP", port=53)])]
        api_server = [Peer(ip_block=k8s.networking.v1.IPBlockArgs(cidr=c)) for c in args.api_server_cidrs]
        sys_ns, inf_ns = args.system_namespace, args.inference_namespace

        for ns in (sys_ns, inf_ns):
            self._policy(ns, "default-deny", ALL_PODS, ingress=[], egress=[])
            self._policy(ns, "allow-dns", ALL_PODS, egress=dns)
        # Training stays open, and says so: a gang talks pod to pod on any port and to its data sources.
        everything = k8s.networking.v1.NetworkPolicyIngressRuleArgs()
        self._policy(args.training_namespace, "allow-all", ALL_PODS, ingress=[everything],
                     egress=[k8s.networking.v1.NetworkPolicyEgressRuleArgs()],
                     annotations=kube_score_ignores({"networkpolicy-targets-pod": "selects the gangs' pods, created "
                                                     "by Volcano Jobs (a CRD kube-score does not read)"}))

        # Exporters and controllers: their metrics port only from the monitoring namespace.
        scrape = [k8s.networking.v1.NetworkPolicyIngressRuleArgs(from_=[monitoring], ports=tcp("metrics"))]
        self._policy(sys_ns, "allow-metrics-scrape", ALL_PODS, ingress=scrape)
        # The privileged exporters: scraped from monitoring, nothing else in or out.
        self._policy(args.telemetry_namespace, "default-deny", ALL_PODS, ingress=[], egress=[])
        self._policy(args.telemetry_namespace, "allow-metrics-scrape", ALL_PODS, ingress=scrape)
        self._policy(sys_ns, "allow-api-server", app_selector(*args.controllers), egress=[
            k8s.networking.v1.NetworkPolicyEgressRuleArgs(to=api_server, ports=tcp(*API_SERVER_PORTS))])
        self._policy(sys_ns, "allow-prometheus", app_selector(HEALTH_GUARD, ADAPTER), egress=[
            k8s.networking.v1.NetworkPolicyEgressRuleArgs(to=[monitoring], ports=tcp(args.prometheus_port))])
        # The API server calls the aggregated metrics APIs; it is not a pod, so only the port is named.
        if args.metrics_adapter:
            self._policy(sys_ns, "allow-aggregated-api", app_selector(ADAPTER), ingress=[
                k8s.networking.v1.NetworkPolicyIngressRuleArgs(ports=tcp("https"))])

        for app, ns in args.virtual_kubelets:
            # Selects only our virtual kubelet's pod: in Liqo's tenant namespace nothing else is ours.
            self._policy(ns, app, app_selector(app), ingress=[
                k8s.networking.v1.NetworkPolicyIngressRuleArgs(ports=tcp(KUBELET_PORT)),
                k8s.networking.v1.NetworkPolicyIngressRuleArgs(from_=[monitoring], ports=tcp("metrics")),
            ], egress=[
                *dns,
                k8s.networking.v1.NetworkPolicyEgressRuleArgs(to=api_server, ports=tcp(*API_SERVER_PORTS)),
                # The provider's own API (a GPU cloud, or the peered cluster's API server) is outside.
                k8s.networking.v1.NetworkPolicyEgressRuleArgs(to=ANYWHERE, ports=tcp(443)),
            ])

        gateway = namespace_peer(args.gateway_namespace)
        for svc in args.services:
            ingress = [k8s.networking.v1.NetworkPolicyIngressRuleArgs(from_=[monitoring], ports=tcp("http"))]
            egress: list[k8s.networking.v1.NetworkPolicyEgressRuleArgs] = []
            if svc.shape is TrafficShape.GATEWAY:
                ingress.append(k8s.networking.v1.NetworkPolicyIngressRuleArgs(from_=[gateway], ports=tcp("http")))
            if svc.broker_port is not None:
                egress.append(k8s.networking.v1.NetworkPolicyEgressRuleArgs(to=ANYWHERE, ports=tcp(svc.broker_port)))
            self._policy(inf_ns, f"inference-{svc.name}", k8s.meta.v1.LabelSelectorArgs(
                match_labels={args.service_label: svc.name}), ingress=ingress, egress=egress)
        gateway_services = [svc.name for svc in args.services if svc.shape is TrafficShape.GATEWAY]
        if gateway_services and args.gateway_namespace == inf_ns:
            # The gateway's data plane runs beside the servers: pods that are not servers may send it requests.
            self._policy(inf_ns, "gateway-to-services", annotations=kube_score_ignores({
                "networkpolicy-targets-pod": "selects the gateway's data-plane pods, which its own controller "
                                             "creates (not part of this stack)"}),
                selector=k8s.meta.v1.LabelSelectorArgs(match_expressions=[
                k8s.meta.v1.LabelSelectorRequirementArgs(key=args.service_label, operator="DoesNotExist")]),
                egress=[k8s.networking.v1.NetworkPolicyEgressRuleArgs(
                    to=[Peer(pod_selector=k8s.meta.v1.LabelSelectorArgs(match_expressions=[
                        k8s.meta.v1.LabelSelectorRequirementArgs(key=args.service_label, operator="In",
                                                                 values=sorted(gateway_services))]))],
                    ports=tcp("http"))])
        self.register_outputs({"policies": sorted(self.policies)})

    def _policy(self, namespace: str, name: str, selector: k8s.meta.v1.LabelSelectorArgs, *,
                ingress: Sequence[k8s.networking.v1.NetworkPolicyIngressRuleArgs] | None = None,
                egress: Sequence[k8s.networking.v1.NetworkPolicyEgressRuleArgs] | None = None,
                annotations: dict[str, str] | None = None) -> k8s.networking.v1.NetworkPolicy:
        """One policy; a direction given (even empty) is in ``policyTypes``, so ``[]`` denies it."""
        types = [t for t, rules in (("Ingress", ingress), ("Egress", egress)) if rules is not None]
        policy = k8s.networking.v1.NetworkPolicy(
            f"netpol-{namespace}-{name}",
            metadata=k8s.meta.v1.ObjectMetaArgs(name=name, namespace=namespace, annotations=annotations,
                                                labels=common_labels(name, "network-policy")),
            spec=k8s.networking.v1.NetworkPolicySpecArgs(
                pod_selector=selector, policy_types=types,
                ingress=list(ingress) if ingress else None, egress=list(egress) if egress else None),
            opts=pulumi.ResourceOptions(parent=self),
        )
        self.policies[f"{namespace}/{name}"] = policy
        return policy
