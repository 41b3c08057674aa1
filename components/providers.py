"""External GPU providers: one virtual-kubelet node per provider, marked external, tainted by its provider.

Each provider runs its own virtual-kubelet binary (VK is a library). The provider's model (one per kind,
in ``components/config/providers.py``) holds its keys and checks; a preset per kind here holds what that
binary really needs: its pinned image, flags, environment and RBAC. What every preset
shares is decided here:

- the node carries ``<prefix>/location=external``, ``<prefix>/provider``, ``<prefix>/gpu-model`` and
  ``type=virtual-kubelet`` (server-side applied labels, so training's required affinity excludes it);
- the provider's own taint stays, always as ``NoSchedule``: the node-cli taint variables
  (``VKUBELET_TAINT_KEY/VALUE/EFFECT``) set it, which also overrides Liqo's ``NoExecute`` default. A
  ``NoExecute`` taint would evict running inference the moment a provider restarts. Inference tolerates
  the provider taint only with effect ``NoSchedule``, so a provider that ignored the override fails
  closed (no burst there) instead of evicting;
- the burst taint (``<prefix>/burst``) is *not* set here: the burst controller owns it, and a second
  field manager would fight it on every ``pulumi up``;
- credentials come only from Pulumi secret config into a Kubernetes Secret;
- RBAC follows what each provider serves: its own Node by name at cluster scope, writes in the namespaces
  whose pods it runs (the inference namespace), heartbeats by name in kube-node-lease;
- a generic (node-cli) provider's kubelet API (logs, exec) serves a key pair its ``serving-cert`` init
  container makes at pod start, and takes only client certificates of the cluster CA (or of
  ``kubeletClientCaConfigMap``'s), each call authorized by a SubjectAccessReview.

What Liqo's virtual kubelet needs, by feature (its upstream local ClusterRole grants all of it cluster-wide):

- pod offloading: pods read through one informer over every namespace (field-selected on its node), pod
  writes, status and evictions in offloaded namespaces; namespaces and Liqo's own resources read;
- its serving certificate (logs/exec): a CertificateSigningRequest (cluster-scoped), and a Secret named after
  its node in its tenant namespace holding the key, CSR and signed certificate (``create`` + ``update``);
- Service/EndpointSlice/ConfigMap/Secret reflection: reads in offloaded namespaces (the copies are written in
  the peered cluster with the peering's credentials, not here); events reflected back: event writes there;
- apiserver support (``--enable-apiserver-support``, upstream default on): ``serviceaccounts/token`` create for
  the offloaded pods' accounts, whose tokens land in Secrets of the peered cluster. Off here by default
  (``apiServerSupport``); when on, granted in the offloaded namespaces only;
- storage and ingress reflection (PVs, PVCs, StorageClasses, Ingresses): not enabled, not granted.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pulumi
import pulumi_kubernetes as k8s

from agents import serving_cert
from components import images, rbac
from components.config import ClusterConfig, ExternalProvider, LiqoProvider, VirtualKubeletProvider
from components.naming import EXTERNAL, VK_PROVIDER_TAINT, Keys, common_labels
from components.pins import MOCK_VK_PROVIDER
from components.security import API_CLIENT, checkov_skips, container_security_context, resources
from components.stack import secret_value
from components.system_agent import Placement, SystemAgent

#: Namespace where node-heartbeat Leases live (one per node, named after it).
NODE_LEASE_NAMESPACE = "kube-node-lease"
#: Liqo's own virtual-node taint (NoExecute upstream; overridden to NoSchedule here).
LIQO_TAINT = "virtual-node.liqo.io/not-allowed"
CREDENTIALS_KEY = "kubeconfig"
CONFIG_DIR = "/etc/virtual-kubelet"
#: The in-memory volume the serving-cert init container writes the kubelet API's key pair into.
SERVING_DIR = "/var/run/virtual-kubelet/serving"
#: The cluster CA every pod gets with its token: it signs the API server's kubelet client certificate on
#: kubeadm-style clusters, so node-cli requires it of callers of the kubelet API (logs, exec).
CLUSTER_CA_FILE = "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt"
#: Where a provider's ``kubeletClientCaConfigMap`` is mounted, and its key.
KUBELET_CLIENT_CA_DIR = "/etc/virtual-kubelet/kubelet-client-ca"
CA_KEY = "ca.crt"
#: Our image that carries ``serving-cert`` (agents/serving_cert.py).
SERVING_CERT_IMAGE_AGENT = "burst-controller"
METRICS_PORT = 10255
KUBELET_PORT = 10250
#: Per-object checkov skips for every virtual-kubelet Deployment, with the reasons.
VK_CHECKOV_SKIPS = {
    "CKV_K8S_38": API_CLIENT,
    # The metrics port serves /stats/summary, which calls the provider's remote API: no probe target.
    "CKV_K8S_8": "no provider-independent health endpoint; a wedged virtual kubelet stops renewing its node "
                 "Lease and the node goes NotReady",
    "CKV_K8S_9": "serves no Service traffic; the virtual node reports readiness through its node Lease",
}
Rule = rbac.Rule


def _rule(groups: list[str], resources_: list[str], verbs: list[str]) -> Rule:
    return Rule(api_groups=groups, resources=resources_, verbs=verbs)


def _named(groups: list[str], resources_: list[str], verbs: list[str], names: list[str]) -> Rule:
    return Rule(api_groups=groups, resources=resources_, verbs=verbs, resource_names=names)


#: Where each grant of a virtual kubelet goes. RBAC cannot say "pods bound to my node", so each preset splits
#: its binary's needs by scope:
#:
#: - cluster scope (``cluster_rules``): its own Node by name (``get``/``list``/``watch``/``patch``/``update``
#:   with ``resourceNames``; a list or watch is then authorised only with a ``metadata.name`` field selector),
#:   plus ``create`` on nodes, which RBAC cannot restrict by name (the object does not exist when the request
#:   is authorised), and the reads its binary makes through cluster-wide informers (pods, field-selected on
#:   ``spec.nodeName``, which RBAC cannot express);
#: - the namespaces whose pods it runs (``workload_rules``, one Role per namespace: the inference namespace):
#:   pod writes and status, the objects those pods reference, their events;
#: - its own namespace (``own_rules``): what the binary keeps for itself (Liqo's serving-certificate Secret).
#:
#: Node heartbeats (Leases) get a Role in kube-node-lease, by name.
def _node_rules(node: str) -> tuple[Rule, ...]:
    return (
        _rule([""], ["nodes"], ["create"]),
        _named([""], ["nodes"], ["get", "list", "watch", "patch", "update"], [node]),
        _named([""], ["nodes/status"], ["get", "update", "patch"], [node]),
    )


#: Generic node-cli virtual kubelet and its node: it creates the node (``create`` cannot be named), reads it
#: before each status update and patches its status (a three-way patch of ``nodes/status``, so the spec, the
#: burst controller's taint included, is never written). Nothing else of the node: measured against the real
#: virtual-kubelet v1.14.1 in ``make e2e`` (tools/localcluster/rbac_usage.py; the issue-21 note lists what was
#: used and what was removed).
def _vk_node_rules(node: str) -> tuple[Rule, ...]:
    return (
        _rule([""], ["nodes"], ["create"]),
        _named([""], ["nodes"], ["get"], [node]),
        _named([""], ["nodes/status"], ["patch"], [node]),
    )


#: node-cli's kubelet API, with a client CA set, requires a client certificate of that CA in the TLS handshake
#: and then authorizes each caller (the API server, for logs and exec) by a SubjectAccessReview, as a kubelet
#: does. A caller with a bearer token only (metrics-server reading ``/metrics/resource``) is dropped in the
#: handshake, so ``tokenreviews`` would serve nothing and is not granted.
VK_KUBELET_API_RULES: tuple[Rule, ...] = (
    _rule(["authorization.k8s.io"], ["subjectaccessreviews"], ["create"]),
)


#: Generic node-cli virtual kubelet, cluster scope beyond its node: node-cli's informers for pods (filtered on
#: ``spec.nodeName``) and for the ConfigMaps, Secrets and Services its pods reference are cluster-wide, so
#: these reads cannot be namespaced without a rebuilt binary; the Secret read is excepted with its reason in
#: policies/rules/allow_lists.py. Informers only (its code reads through their caches): ``watch``, and
#: ``list``, which client-go falls back to where the API server cannot stream the initial list of a watch.
#: Every write is namespaced.
BASE_CLUSTER_READS: tuple[Rule, ...] = (
    _rule([""], ["pods"], ["list", "watch"]),
    _rule([""], ["configmaps", "secrets", "services"], ["list", "watch"]),
)
#: Generic virtual kubelet in each namespace whose pods it runs: delete its pods once the provider has (after
#: their grace period), report their status (``update`` of ``pods/status``), record their events (client-go's
#: recorder patches an event that repeats).
BASE_WORKLOAD_RULES: tuple[Rule, ...] = (
    _rule([""], ["pods"], ["delete"]),
    _rule([""], ["pods/status"], ["update"]),
    _rule([""], ["events"], ["create", "patch"]),
)

#: Liqo's virtual kubelet at cluster scope (upstream liqo-virtual-kubelet-local ClusterRole, reduced): pods
#: through its node-filtered cluster-wide informer, namespaces (which ones are offloaded), its serving
#: certificate's CertificateSigningRequest (cluster-scoped; a new CSR cannot be named in advance), and read-only
#: Liqo resources (peering, IPAM, network and offloading state). No Secret and no token grant at this scope.
LIQO_CLUSTER_READS: tuple[Rule, ...] = (
    _rule([""], ["pods"], ["get", "list", "watch"]),
    _rule([""], ["namespaces"], ["get", "list", "watch"]),
    _rule(["certificates.k8s.io"], ["certificatesigningrequests"], ["create", "get", "list", "watch"]),
    _rule(["core.liqo.io"], ["foreignclusters", "foreignclusters/status"], ["get", "list", "watch"]),
    _rule(["ipam.liqo.io"], ["ips"], ["get", "list", "watch"]),
    _rule(["networking.liqo.io"], ["configurations"], ["get", "list", "watch"]),
    _rule(["offloading.liqo.io"], ["namespacemaps", "virtualnodes"], ["get", "list", "watch"]),
)
#: Liqo in each offloaded namespace: its pod and status writes, evictions, and the reflection of Services,
#: EndpointSlices, ConfigMaps and Secrets (read here, written only in the peered cluster) and of remote
#: events back here. Storage and ingress reflection, which this platform does not enable, are left out.
LIQO_WORKLOAD_RULES: tuple[Rule, ...] = (
    _rule([""], ["pods"], ["patch", "update", "delete"]),
    _rule([""], ["pods/status"], ["get", "update", "patch"]),
    _rule([""], ["pods/eviction"], ["create"]),
    _rule([""], ["configmaps", "secrets", "services", "services/status"], ["get", "list", "watch"]),
    _rule(["discovery.k8s.io"], ["endpointslices"], ["get", "list", "watch"]),
    _rule([""], ["events"], ["create", "patch", "update"]),
)
#: Liqo's apiserver support (``--enable-apiserver-support``, on upstream, off here unless the stack sets
#: ``apiServerSupport: true``): offloaded pods get tokens of their service accounts minted here and copied into
#: Secrets of the peered cluster, where whoever reads Secrets there can act as those accounts here. When on, the
#: grant is a Role in the offloaded namespaces only, never cluster-wide.
LIQO_TOKEN_RULES: tuple[Rule, ...] = (_rule([""], ["serviceaccounts/token"], ["create"]),)
APISERVER_SUPPORT_FLAG = "--enable-apiserver-support"


def _liqo_own_rules(node: str, secret: str) -> tuple[Rule, ...]:
    """Liqo in its tenant namespace: the Secret named after its node holds the key and CSR of its serving
    certificate (created once, then updated with the signed certificate; ``create`` cannot be restricted by
    name), and it reads the peered cluster's kubeconfig Secret."""
    return (
        _rule([""], ["secrets"], ["create"]),
        _named([""], ["secrets"], ["get", "update", "patch"], [node]),
        _named([""], ["secrets"], ["get"], [secret]),
    )


#: Node heartbeats: the kubelet-style Lease named after the node (``create`` cannot be restricted by name).
def _lease_rules(node: str) -> tuple[Rule, ...]:
    return (
        _rule(["coordination.k8s.io"], ["leases"], ["create"]),
        _named(["coordination.k8s.io"], ["leases"], ["get", "update"], [node]),
    )


@dataclass(frozen=True)
class ProviderPreset:
    """What one provider kind's virtual-kubelet binary needs."""

    kind: str
    #: Pinned upstream image, or None where every provider ships its own binary (config must name it).
    image: str | None
    command: tuple[str, ...]
    taint_key: str
    #: The provider's own taint value; None means the provider name (virtual-kubelet's default).
    taint_value: str | None
    #: The effect the provider sets when left alone (we always override to NoSchedule).
    upstream_effect: str
    #: Grants at cluster scope: its own node by name, and the reads its binary makes cluster-wide.
    cluster_rules: Callable[[Any], tuple[Rule, ...]] = field(repr=False)
    #: Grants in each namespace whose pods it runs.
    workload_rules: Callable[[Any], tuple[Rule, ...]] = field(repr=False)
    args: Callable[[Any, str, str], list[str]] = field(repr=False)
    #: Grants in its own namespace (given the provider and its credentials Secret); none by default.
    own_rules: Callable[[Any, str], tuple[Rule, ...]] = field(repr=False, default=lambda p, secret: ())
    #: Whether the capacity file (--provider-config) is how this binary learns its node's capacity.
    capacity_file: bool = True
    #: Whether the pod makes the kubelet API's serving certificate at start (node-cli reads it from
    #: ``APISERVER_CERT_LOCATION``/``APISERVER_KEY_LOCATION`` and exits without it); Liqo requests its own.
    serving_cert: bool = False


def _vk_args(p: VirtualKubeletProvider, namespace: str, secret: str) -> list[str]:
    """virtual-kubelet node-cli flags (shared by node-cli based providers)."""
    return [
        f"--nodename={p.node_name}",
        f"--provider={p.vk_provider}",
        f"--provider-config={CONFIG_DIR}/provider.json",
        # node-cli's accepted values are lower case ("linux", "windows"); "Linux" exits at start.
        "--os=linux",
        f"--metrics-addr=:{METRICS_PORT}",
        "--enable-node-lease",
        "--startup-timeout=120s",
        *p.extra_args,
    ]


def _liqo_args(p: LiqoProvider, namespace: str, secret: str) -> list[str]:
    """Flags Liqo's controller-manager passes its virtual kubelet (pkg/vkMachinery/forge)."""
    return [
        f"--foreign-cluster-id={p.foreign_cluster_id}",
        f"--nodename={p.node_name}",
        "--node-ip=$(POD_IP)",
        f"--tenant-namespace={namespace}",
        f"--liqo-namespace={p.liqo_namespace}",
        f"--home-cluster-id={p.home_cluster_id}",
        f"--local-podcidr={p.local_pod_cidr}",
        f"--foreign-kubeconfig-secret-name={secret}",
        "--create-node=true",
        "--metrics-enabled=true",
        f"--metrics-address=:{METRICS_PORT}",
        f"{APISERVER_SUPPORT_FLAG}={str(p.api_server_support).lower()}",
        *p.extra_args,
    ]


def _liqo_workload_rules(p: LiqoProvider) -> tuple[Rule, ...]:
    return LIQO_WORKLOAD_RULES + (LIQO_TOKEN_RULES if p.api_server_support else ())


#: One preset per supported kind (admiralty is rejected by the config with the reason).
PRESETS: dict[str, ProviderPreset] = {
    "virtual-kubelet": ProviderPreset(
        kind="virtual-kubelet",
        image=None,
        command=(),
        taint_key=VK_PROVIDER_TAINT,
        taint_value=None,
        upstream_effect="NoSchedule",
        cluster_rules=lambda p: (*_vk_node_rules(p.node_name), *BASE_CLUSTER_READS, *VK_KUBELET_API_RULES),
        workload_rules=lambda p: BASE_WORKLOAD_RULES,
        args=_vk_args,
        serving_cert=True,
    ),
    "liqo": ProviderPreset(
        kind="liqo",
        image=images.LIQO_VIRTUAL_KUBELET,
        command=("/usr/bin/virtual-kubelet",),
        taint_key=LIQO_TAINT,
        taint_value="true",
        upstream_effect="NoExecute",
        cluster_rules=lambda p: (*_node_rules(p.node_name), *LIQO_CLUSTER_READS),
        workload_rules=_liqo_workload_rules,
        own_rules=lambda p, secret: _liqo_own_rules(p.node_name, secret),
        args=_liqo_args,
        capacity_file=False,
    ),
}


def provider_taint(p: ExternalProvider) -> dict[str, str]:
    """The provider's own taint as this platform sets it: always NoSchedule."""
    preset = PRESETS[p.kind]
    return {"key": preset.taint_key, "value": preset.taint_value or p.name, "effect": "NoSchedule"}


def provider_toleration(p: ExternalProvider) -> k8s.core.v1.TolerationArgs:
    """What inference needs to land on this provider's node (never the burst taint)."""
    taint = provider_taint(p)
    return k8s.core.v1.TolerationArgs(key=taint["key"], operator="Equal", value=taint["value"], effect="NoSchedule")


def app_name(p: ExternalProvider) -> str:
    """The provider's Deployment and ServiceAccount (``vk-<name>``)."""
    return f"vk-{p.name}"


def node_labels(keys: Keys, p: ExternalProvider) -> dict[str, str]:
    return {
        keys.location: EXTERNAL,
        keys.provider: p.name,
        keys.gpu_model: p.gpu_model,
        "type": "virtual-kubelet",
    }


def capacity(p: ExternalProvider, gpu_resource: str) -> dict[str, dict[str, str]]:
    """The node-cli capacity file: node name -> allocatable resources."""
    return {
        p.node_name: {
            "cpu": str(p.cpu),
            "memory": f"{p.memory_gi}Gi",
            "pods": str(p.pods),
            "ephemeral-storage": f"{p.ephemeral_storage_gi}Gi",
            gpu_resource: str(p.gpus),
        }
    }


#: The resources the mock provider reads by name; it reads every other one under ``others`` and drops the rest.
MOCK_NAMED = ("cpu", "memory", "pods")


def provider_config(p: ExternalProvider, gpu_resource: str) -> dict[str, dict[str, Any]]:
    """The file ``--provider-config`` names, in the format the provider's binary reads.

    The generic node-cli file is :func:`capacity`. The mock provider reads ``cpu``, ``memory`` and ``pods`` and
    takes every other resource from ``others`` only: given the generic file it silently drops the GPUs and
    registers a node that refuses every GPU pod.
    """
    generic = capacity(p, gpu_resource)
    if not (isinstance(p, VirtualKubeletProvider) and p.vk_provider == MOCK_VK_PROVIDER):
        return generic
    return {node: {**{k: v for k, v in res.items() if k in MOCK_NAMED},
                   "others": {k: v for k, v in res.items() if k not in MOCK_NAMED}}
            for node, res in generic.items()}


@dataclass(frozen=True)
class ExternalGpuProviderArgs:
    provider: ExternalProvider
    label_prefix: str
    gpu_resource: str
    placement: Placement
    #: The namespaces whose pods this provider runs (inference bursts there): its workload Roles go there.
    workload_namespaces: tuple[str, ...] = ()
    #: Where the serving-cert init container's image (one of our agents) comes from.
    agent_registry: str = images.AGENT_REGISTRY

    @classmethod
    def from_config(cls, cfg: ClusterConfig, provider: ExternalProvider) -> ExternalGpuProviderArgs:
        return cls(
            provider=provider,
            label_prefix=cfg.label_prefix,
            gpu_resource=cfg.gpu_resource,
            placement=Placement(provider.namespace(cfg.system_namespace), cfg.priorities.system.name,
                                cfg.system_pool_selector),
            workload_namespaces=(cfg.inference_namespace,),
            agent_registry=cfg.agent_registry,
        )


class ExternalGpuProvider(pulumi.ComponentResource):
    """One provider's virtual-kubelet: Secret, ServiceAccount, RBAC, Deployment and node labels."""

    node_name: pulumi.Output[str]
    taint: pulumi.Output[dict[str, str]]

    def __init__(self, name: str, args: ExternalGpuProviderArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("gpu-cluster:burst:ExternalGpuProvider", name, None, opts)
        p = args.provider
        preset = PRESETS[p.kind]
        keys = Keys(args.label_prefix)
        ns = args.placement.namespace
        app = app_name(p)
        labels = {**common_labels(app, "virtual-kubelet"), keys.provider: p.name}
        child = pulumi.ResourceOptions(parent=self)
        meta = k8s.meta.v1.ObjectMetaArgs
        agent = SystemAgent(self, app, labels, args.placement)
        self.agent = agent

        secret = k8s.core.v1.Secret(
            f"{app}-credentials",
            metadata=meta(name=f"{app}-credentials", namespace=ns, labels=labels),
            type="Opaque",
            string_data={CREDENTIALS_KEY: secret_value(p.credentials_secret)},
            opts=child,
        )
        role_name = f"gpu-cluster:{app}"
        agent.grant_cluster(preset.cluster_rules(p), name=role_name)
        agent.grant_namespace("lease", _lease_rules(p.node_name), name=role_name, namespace=NODE_LEASE_NAMESPACE)
        for workload_ns in args.workload_namespaces:
            agent.grant_namespace(f"pods-{workload_ns}", preset.workload_rules(p), name=role_name,
                                  namespace=workload_ns)
        own = preset.own_rules(p, f"{app}-credentials")
        if own:
            agent.grant_namespace("own", own, name=role_name)

        volumes = [k8s.core.v1.VolumeArgs(name="credentials", secret=k8s.core.v1.SecretVolumeSourceArgs(
            secret_name=f"{app}-credentials", default_mode=0o440))]
        mounts = [k8s.core.v1.VolumeMountArgs(name="credentials", mount_path=f"{CONFIG_DIR}/credentials",
                                              read_only=True)]
        if preset.capacity_file:
            agent.settings("config", {"provider.json": json.dumps(provider_config(p, args.gpu_resource), indent=2,
                                                                  sort_keys=True)})
            volumes.append(k8s.core.v1.VolumeArgs(
                name="config", config_map=k8s.core.v1.ConfigMapVolumeSourceArgs(name=f"{app}-config")))
            mounts.append(k8s.core.v1.VolumeMountArgs(name="config", mount_path=f"{CONFIG_DIR}/provider.json",
                                                      sub_path="provider.json", read_only=True))
        taint = provider_taint(p)
        source = k8s.core.v1.EnvVarSourceArgs
        env = [
            k8s.core.v1.EnvVarArgs(name="POD_IP", value_from=source(
                field_ref=k8s.core.v1.ObjectFieldSelectorArgs(field_path="status.podIP"))),
            k8s.core.v1.EnvVarArgs(name="POD_NAME", value_from=source(
                field_ref=k8s.core.v1.ObjectFieldSelectorArgs(field_path="metadata.name"))),
            k8s.core.v1.EnvVarArgs(name="POD_NAMESPACE", value_from=source(
                field_ref=k8s.core.v1.ObjectFieldSelectorArgs(field_path="metadata.namespace"))),
            k8s.core.v1.EnvVarArgs(name="VKUBELET_POD_IP", value="$(POD_IP)"),
            k8s.core.v1.EnvVarArgs(name="KUBELET_PORT", value=str(KUBELET_PORT)),
            k8s.core.v1.EnvVarArgs(name="VKUBELET_TAINT_KEY", value=taint["key"]),
            k8s.core.v1.EnvVarArgs(name="VKUBELET_TAINT_VALUE", value=taint["value"]),
            k8s.core.v1.EnvVarArgs(name="VKUBELET_TAINT_EFFECT", value=taint["effect"]),
            k8s.core.v1.EnvVarArgs(name="PROVIDER_CREDENTIALS_FILE",
                                   value=f"{CONFIG_DIR}/credentials/{CREDENTIALS_KEY}"),
            k8s.core.v1.EnvVarArgs(name="PROVIDER_REGION", value=p.region),
        ]
        init_containers = []
        if preset.serving_cert:
            volumes.append(k8s.core.v1.VolumeArgs(name="serving-cert", empty_dir=k8s.core.v1.EmptyDirVolumeSourceArgs(
                medium="Memory", size_limit="1Mi")))
            mounts.append(k8s.core.v1.VolumeMountArgs(name="serving-cert", mount_path=SERVING_DIR, read_only=True))
            ca_file = CLUSTER_CA_FILE
            if isinstance(p, VirtualKubeletProvider) and p.kubelet_client_ca_config_map:
                volumes.append(k8s.core.v1.VolumeArgs(name="kubelet-client-ca", config_map=(
                    k8s.core.v1.ConfigMapVolumeSourceArgs(name=p.kubelet_client_ca_config_map, items=[
                        k8s.core.v1.KeyToPathArgs(key=CA_KEY, path=CA_KEY)]))))
                mounts.append(k8s.core.v1.VolumeMountArgs(name="kubelet-client-ca", mount_path=KUBELET_CLIENT_CA_DIR,
                                                          read_only=True))
                ca_file = f"{KUBELET_CLIENT_CA_DIR}/{CA_KEY}"
            env += serving_cert_env(ca_file)
            init_containers.append(serving_cert_container(p.node_name, args.agent_registry))
        image = p.image or preset.image
        assert image is not None  # the config requires an image where the preset has none
        self.deployment = agent.deploy(
            [k8s.core.v1.ContainerArgs(
                name="virtual-kubelet",
                image=image,
                command=list(preset.command) or None,
                args=preset.args(p, ns, f"{app}-credentials"),
                env=env,
                ports=[
                    k8s.core.v1.ContainerPortArgs(name="kubelet", container_port=KUBELET_PORT),
                    k8s.core.v1.ContainerPortArgs(name="metrics", container_port=METRICS_PORT),
                ],
                resources=resources(p.kubelet_resources.cpu, p.kubelet_resources.memory),
                security_context=container_security_context(),
                volume_mounts=mounts,
            )],
            # Exactly one process may own a node: two would race on its status and pods.
            replicas=1,
            strategy="Recreate",
            annotations=checkov_skips(VK_CHECKOV_SKIPS),
            depends_on=[secret],
            volumes=volumes,
            init_containers=init_containers or None,
        )
        # The node exists once the virtual kubelet registered it; labels go on by server-side apply.
        self.node_patch = k8s.core.v1.NodePatch(
            f"node-{p.node_name}",
            metadata=k8s.meta.v1.ObjectMetaPatchArgs(name=p.node_name, labels=node_labels(keys, p)),
            opts=pulumi.ResourceOptions(parent=self, depends_on=[self.deployment]),
        )
        self.node_name = pulumi.Output.from_input(p.node_name)
        self.taint = pulumi.Output.from_input(taint)
        self.register_outputs({"node_name": self.node_name, "taint": self.taint})


def serving_cert_env(ca_file: str) -> list[k8s.core.v1.EnvVarArgs]:
    """Where node-cli finds its kubelet API's key pair and the CA its callers' client certificates must chain to."""
    return [
        k8s.core.v1.EnvVarArgs(name="APISERVER_CERT_LOCATION", value=f"{SERVING_DIR}/{serving_cert.CERT_FILE}"),
        k8s.core.v1.EnvVarArgs(name="APISERVER_KEY_LOCATION", value=f"{SERVING_DIR}/{serving_cert.KEY_FILE}"),
        k8s.core.v1.EnvVarArgs(name="APISERVER_CA_CERT_LOCATION", value=ca_file),
    ]


def serving_cert_container(node_name: str, registry: str = images.AGENT_REGISTRY) -> k8s.core.v1.ContainerArgs:
    """The init container that makes the kubelet API's certificate for the node name and the pod IP."""
    return k8s.core.v1.ContainerArgs(
        name="serving-cert",
        image=images.agent_image(SERVING_CERT_IMAGE_AGENT, registry),
        command=["serving-cert"],
        args=[f"--dir={SERVING_DIR}", f"--name={node_name}", "--ip=$(POD_IP)"],
        env=[k8s.core.v1.EnvVarArgs(name="POD_IP", value_from=k8s.core.v1.EnvVarSourceArgs(
            field_ref=k8s.core.v1.ObjectFieldSelectorArgs(field_path="status.podIP")))],
        resources=resources("50m", "64Mi"),
        security_context=container_security_context(),
        volume_mounts=[k8s.core.v1.VolumeMountArgs(name="serving-cert", mount_path=SERVING_DIR)],
    )


def external_providers(cfg: ClusterConfig, opts: pulumi.ResourceOptions) -> list[ExternalGpuProvider]:
    """One component per configured provider."""
    return [
        ExternalGpuProvider(f"provider-{p.name}", ExternalGpuProviderArgs.from_config(cfg, p), opts)
        for p in cfg.providers
    ]


def summary_rows(cfg: ClusterConfig) -> list[tuple[str, str]]:
    """Providers with their GPUs, kind, node and taint."""
    rows = []
    for p in cfg.providers:
        taint = provider_taint(p)
        region = f", {p.region}" if p.region else ""
        rows.append((
            f"provider {p.name}",
            f"{p.kind}{region}: node {p.node_name}, {p.gpus} × {p.gpu_model}, "
            f"taint {taint['key']}={taint['value']}:NoSchedule, pods routable: {str(p.routable).lower()}",
        ))
    total = sum(p.gpus for p in cfg.providers)
    rows.append(("external GPUs", str(total)))
    return rows
