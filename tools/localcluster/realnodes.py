"""Real nodes beside the kwok ones: a kubelet on its own containerd + runc + bridge CNI (pure plan).

Every real node shares the host's network namespace but has its own containerd (socket, root, state), its own
kubelet (root dir, ports, cgroup root ``/gpucluster/<node>``), its own CNI bridge and pod subnet, all under
``.state/localcluster/nodes/<node>``. The API server is reached at :data:`APISERVER_IP`, an address the
local cluster adds to ``lo`` so pods can reach it (it advertises that address, so the ``kubernetes`` Service
has an endpoint and in-cluster clients work). The nodes share one more address on ``lo``, :data:`NODE_IP`, as
they share the host (the kubelet insists its ``--node-ip`` is a local address, and the API server reaches each
kubelet there, on the node's own port): kube-router's firewall takes as its own the pods whose ``hostIP`` is its
node's address, so one firewall on the host polices the pods of every real node.

A GPU node advertises fake ``nvidia.com/gpu`` devices through our device plugin (cmd/fake-gpu-plugin).
Real nodes are tainted :data:`REAL_NODE_TAINT` so only pods that ask for a real kubelet land there: the
stack's own pods keep running on kwok nodes until their images exist here.

Nothing here touches the host; :mod:`tools.localcluster.nodehost` does.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agents.defaults import DEFAULT_GPU_RESOURCE, DEFAULT_LABEL_PREFIX
from tools.image_local import PAUSE_IMAGE

#: Where pods reach the API server: an address on ``lo`` that is not loopback (the endpoint reconciler
#: refuses 127.0.0.0/8, and the kubelet's KUBE-FIREWALL drops non-local traffic to it).
APISERVER_IP = "10.255.255.1"
#: Every real node's InternalIP: the host's one address for them (``policy_node``).
NODE_IP = "10.255.255.10"
#: Real pods' addresses: one /24 per node, away from kwok's fake 10.244.0.0/16.
POD_SUPERNET = "10.88"
#: Only pods tolerating this land on a real node.
REAL_NODE_TAINT = {"key": "gpucluster.io/real-node", "value": "true", "effect": "NoSchedule"}
#: The runtime handlers containerd offers: runc, and ``nvidia`` (the RuntimeClass the GPU operator adds,
#: which our training pods name) mapped to runc as well: there is no GPU to hook here.
RUNTIME_HANDLERS = ("runc", "nvidia")
RUNC = "/usr/sbin/runc"
#: The images each kind of node imports (``make images`` archives by name): what runs there, nothing more, since
#: every import unpacks the whole image (each node says how long its imports took). The pause image goes everywhere.
IMAGES_BY_KIND = {
    "system": ("pause", "burst-controller", "health-guard", "node-pools", "virtual-kubelet-mock", "descheduler",
               "prometheus-server", "prometheus-operator", "prometheus-config-reloader"),
    "gpu": ("pause", "ib-exporter", "checkpoint-check", "training-runtime", "dcgm-exporter-standin"),
}
#: The real GPU nodes' pool: a pool of its own beside the stack's (``stack_overrides`` declares it to the stack), so
#: a gang submitted to it runs for real while the stack's own pools stay on kwok.
REAL_GPU_POOL = "real-gpu"
#: The real GPU nodes and the fake GPUs each advertises: a gang of two workers spans two kubelets, and when the health
#: guard takes one node out the gang restarts on the other two.
REAL_GPU_NODES = ("real-gpu-01", "real-gpu-02", "real-gpu-03")
REAL_GPUS_PER_NODE = 2
REAL_GPU_MODEL = "H100-SXM5-80GB"
#: The real pool's warm spares: the gangs take the other two nodes, and a quarantine under one releases it.
REAL_GPU_SPARES = 1
#: Distinct real GPU nodes the health guard may take out within an hour: one turns degraded and, once it is back,
#: another turns fatal (the let-it-crash loop of ``tests/test_e2e_stack_in_pods.py``). One at a time still: the
#: stack's own share of a pool quarantined at once is left as it is.
REAL_GPU_NODES_PER_HOUR = 2
CNI_BIN_DIR = "/usr/lib/cni"


@dataclass(frozen=True)
class RealNode:
    """One real node: its name, kind (``system`` or ``gpu``), index (addresses, ports) and labels."""

    name: str
    kind: str
    index: int
    gpus: int = 0
    labels: Mapping[str, str] = field(default_factory=dict)
    taints: tuple[Mapping[str, str], ...] = ()

    @property
    def ip(self) -> str:
        return NODE_IP

    @property
    def pod_cidr(self) -> str:
        return f"{POD_SUPERNET}.{self.index}.0/24"

    @property
    def gateway(self) -> str:
        return f"{POD_SUPERNET}.{self.index}.1"

    @property
    def bridge(self) -> str:
        """The CNI bridge (at most 15 characters, the kernel's limit)."""
        return f"gpucl{self.index}"

    @property
    def network(self) -> str:
        return f"gpucluster-{self.name}"

    @property
    def kubelet_port(self) -> int:
        return 10250 + 10 * self.index

    @property
    def healthz_port(self) -> int:
        return 10248 + 10 * self.index

    @property
    def cgroup_root(self) -> str:
        return f"/gpucluster/{self.name}"


@dataclass(frozen=True)
class NodePaths:
    """Everything of one node under ``<state>/nodes/<node>``."""

    base: Path

    @property
    def containerd_root(self) -> Path:
        return self.base / "containerd" / "root"

    @property
    def containerd_state(self) -> Path:
        return self.base / "containerd" / "state"

    @property
    def containerd_socket(self) -> Path:
        return self.base / "containerd" / "containerd.sock"

    @property
    def containerd_config(self) -> Path:
        return self.base / "containerd" / "config.toml"

    @property
    def cni_conf_dir(self) -> Path:
        return self.base / "cni" / "net.d"

    @property
    def cni_data_dir(self) -> Path:
        return self.base / "cni" / "ipam"

    @property
    def kubelet_root(self) -> Path:
        return self.base / "kubelet"

    @property
    def pod_logs(self) -> Path:
        """The kubelet's pod log directory (``podLogsDir``; /var/log/pods otherwise)."""
        return self.base / "pod-logs"

    @property
    def kubelet_config(self) -> Path:
        return self.base / "kubelet-config.yaml"

    @property
    def kubeconfig(self) -> Path:
        return self.base / "kubelet.kubeconfig"

    @property
    def plugins_registry(self) -> Path:
        """The kubelet's plugin-watcher directory, where our device plugin registers (its own per kubelet: the
        device manager's socket, /var/lib/kubelet/device-plugins/kubelet.sock, ignores --root-dir)."""
        return self.kubelet_root / "plugins_registry"

    @property
    def unhealthy_gpus(self) -> Path:
        """Device IDs listed here are reported Unhealthy by the node's device plugin."""
        return self.base / "unhealthy-gpus"


def node_paths(state: Path, node: RealNode) -> NodePaths:
    return NodePaths(state / "nodes" / node.name)


def real_nodes(system_pool: str, gpu_pool: str, gpus: int = 8, prefix: str = DEFAULT_LABEL_PREFIX,
               gpu_model: str = REAL_GPU_MODEL, system_node: str | None = None,
               gpu_nodes: Sequence[Any] = ()) -> tuple[RealNode, ...]:
    """One system-pool node (our agents) and the GPU nodes, each with fake devices.

    ``system_node`` names a node the stack declares in its system pool: the real kubelet registers it in kwok's
    place, untainted, so everything the stack schedules onto the system pool runs for real there. Without it
    the system node is an extra one, tainted :data:`REAL_NODE_TAINT`.

    ``gpu_nodes`` are the plan's nodes of a pool the stack declares (``plan.NodeSpec``): each becomes real with the
    labels, taints and GPU count the stack gave it, so the stack's pool taint (not ours) keeps other pods off and
    a job of that pool lands there. Without them one extra GPU node with ``gpus`` devices joins ``gpu_pool``,
    tainted :data:`REAL_NODE_TAINT`. (Only labels outside ``kubernetes.io`` and ``k8s.io`` go on the kubelet's
    command line, which refuses the others; the node-pool agent adds the rest.)
    """
    if gpus < 1:
        raise ValueError(f"a real GPU node needs at least one fake GPU, got {gpus}")
    real_label = {f"{prefix}/real-node": "true"}
    system = RealNode(
        name=system_node or "real-system-01", kind="system", index=1,
        labels={f"{prefix}/pool": system_pool, **real_label},
        taints=() if system_node else (REAL_NODE_TAINT,))
    if not gpu_nodes:
        gpu = RealNode(
            name="real-gpu-01", kind="gpu", index=2, gpus=gpus,
            labels={f"{prefix}/pool": gpu_pool, f"{prefix}/location": "onprem", f"{prefix}/gpu-model": gpu_model,
                    **real_label},
            taints=(REAL_NODE_TAINT,))
        return (system, gpu)
    declared = []
    for i, spec in enumerate(gpu_nodes):
        if spec.gpus < 1:
            raise ValueError(f"a real GPU node needs at least one fake GPU, got {spec.gpus} for {spec.name}")
        labels = {k: v for k, v in spec.labels.items() if not k.split("/")[0].endswith(("kubernetes.io", "k8s.io"))}
        declared.append(RealNode(name=spec.name, kind="gpu", index=2 + i, gpus=spec.gpus,
                                 labels={**labels, **real_label}, taints=tuple(t.manifest() for t in spec.taints)))
    return (system, *declared)


def real_nodes_for(plan: Any, gpus: int = 8) -> tuple[RealNode, ...]:
    """The real nodes of a local cluster: the plan's first system node becomes real (the stack's agents run on it),
    and so does every node of :data:`REAL_GPU_POOL` when the plan has that pool (``stack_overrides`` declares it);
    otherwise one GPU node joins in that pool undeclared, so the stack never counts it."""
    systems = plan.by_kind("system")
    declared = [n for n in plan.by_kind("gpu") if n.pool == REAL_GPU_POOL]
    if not systems:
        return real_nodes("system", REAL_GPU_POOL, gpus=gpus, prefix=plan.label_prefix, gpu_nodes=declared)
    return real_nodes(systems[0].pool, REAL_GPU_POOL, gpus=gpus, prefix=plan.label_prefix,
                      system_node=systems[0].name, gpu_nodes=declared)


def stack_overrides(values: Mapping[str, Any]) -> dict[str, Any]:
    """The stack config values (keys without the project) that put the real GPU nodes in the stack: their pool,
    :data:`REAL_GPU_POOL` with :data:`REAL_GPU_SPARES` warm spare, after the stack's own, so a researcher's
    ``gpucluster train submit`` can name it.

    Inference services that may use every pool are kept to the stack's first pool: their images come from a
    registry this machine cannot reach, and a replica on a real node would wait for a pull for ever. The health
    guard's hourly rails are raised, never lowered, to :data:`REAL_GPU_NODES_PER_HOUR` nodes of the real pool:
    a pool of three at the stack's 50 %/h allows one, and a second fault in the hour would trip the breaker. Pure; the
    plan (``load_plan(real_nodes=True)``) and ``pulumi up`` (``stackup.pulumi_up(in_pods=True)``) both apply it.
    """
    pools = [dict(p) for p in values.get("pools") or ()]
    names = [p.get("name") for p in pools]
    if REAL_GPU_POOL in names:
        raise ValueError(f"pools: the stack already has a pool named {REAL_GPU_POOL!r}, the name the real GPU nodes "
                         "take; rename it")
    if not pools:
        raise ValueError("pools: the stack declares no GPU pool; the real GPU nodes join beside one")
    # One warm spare: the gangs of the real-node scenarios take one node less than the pool, and the node a
    # quarantine takes from them is replaced by the spare the node-pool agent releases (docs/training.md).
    real = {"name": REAL_GPU_POOL, "nodes": list(REAL_GPU_NODES), "gpuModel": REAL_GPU_MODEL,
            "gpusPerNode": REAL_GPUS_PER_NODE, "spareNodes": REAL_GPU_SPARES}
    # The real nodes' pods resolve through CoreDNS on the host (CLUSTER_DNS_IP), not a kube-dns pod.
    out: dict[str, Any] = {"pools": [*pools, real], "dnsCidrs": [f"{CLUSTER_DNS_IP}/32"]}
    inference = values.get("inference")
    if isinstance(inference, Mapping) and inference.get("services"):
        services = [{**s, "pool": s.get("pool") or names[0]} for s in inference["services"]]
        out["inference"] = {**inference, "services": services}
    observability = values.get("observability") or {}
    if not isinstance(observability, Mapping) or not isinstance(observability.get("health") or {}, Mapping):
        return out  # not a section: the stack's own validation names it
    health = dict(observability.get("health") or {})
    per_hour = math.ceil(100 * REAL_GPU_NODES_PER_HOUR / len(REAL_GPU_NODES))
    for key, floor in (("maxPoolPercentPerHour", per_hour), ("maxNodesPerHour", REAL_GPU_NODES_PER_HOUR)):
        if _unset_or_below(health.get(key), floor):
            health[key] = floor
    out["observability"] = {**observability, "health": health}
    return out


def _unset_or_below(value: Any, floor: float) -> bool:
    """Unset, or a number under ``floor``; any other value is left for the stack's validation to name."""
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    return value is None or (number and value < floor)


def policy_node(nodes: Sequence[RealNode]) -> str:
    """The node kube-router's firewall runs as: the system node. The nodes share the host's network namespace, where
    one kube-router owns the chains (a second would delete the first's pod chains as stale), and they share
    :data:`NODE_IP`, so that one firewall treats every real node's pods as local and polices them all (v2.1.0 picks
    a node's pods by ``status.hostIP``)."""
    return next(n.name for n in nodes if n.kind == "system")


def to_record(nodes: Sequence[RealNode]) -> list[dict[str, Any]]:
    return [{"name": n.name, "kind": n.kind, "index": n.index, "gpus": n.gpus, "labels": dict(n.labels),
             "taints": [dict(t) for t in n.taints]} for n in nodes]


def from_record(data: Sequence[Mapping[str, Any]]) -> tuple[RealNode, ...]:
    return tuple(RealNode(name=str(d["name"]), kind=str(d["kind"]), index=int(d["index"]), gpus=int(d["gpus"]),
                          labels=dict(d["labels"]), taints=tuple(dict(t) for t in d["taints"])) for d in data)


def _toml_str(value: str) -> str:
    return json.dumps(value)  # a JSON string is a valid TOML basic string


def containerd_config(node: RealNode, paths: NodePaths) -> str:
    """containerd 1.6's config (version 2): CRI with runc on cgroupfs, overlayfs, our CNI dirs and pause image.

    ``restrict_oom_score_adj``: this host refuses a negative ``oom_score_adj`` (runc then fails with
    "can't get final child's PID from pipe").
    """
    runtimes = []
    for handler in RUNTIME_HANDLERS:
        runtimes.append(f"""
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.{handler}]
  runtime_type = "io.containerd.runc.v2"
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.{handler}.options]
  BinaryName = {_toml_str(RUNC)}
  SystemdCgroup = false
""")
    return f"""version = 2
root = {_toml_str(str(paths.containerd_root))}
state = {_toml_str(str(paths.containerd_state))}
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.aufs",
  "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]

[grpc]
  address = {_toml_str(str(paths.containerd_socket))}

[ttrpc]
  address = {_toml_str(str(paths.containerd_socket) + ".ttrpc")}

[plugins."io.containerd.internal.v1.opt"]
  path = {_toml_str(str(paths.base / "containerd" / "opt"))}

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = {_toml_str(PAUSE_IMAGE)}
  restrict_oom_score_adj = true
  enable_selinux = false
  disable_apparmor = true

[plugins."io.containerd.grpc.v1.cri".containerd]
  snapshotter = "overlayfs"
  default_runtime_name = "runc"
{"".join(runtimes)}
[plugins."io.containerd.grpc.v1.cri".cni]
  bin_dir = {_toml_str(CNI_BIN_DIR)}
  conf_dir = {_toml_str(str(paths.cni_conf_dir))}
  max_conf_num = 1
"""


def cni_conflist(node: RealNode, paths: NodePaths) -> dict[str, Any]:
    """The node's CNI network: a bridge of its own, host-local addresses from its /24 (state under .state),
    no masquerade (pods reach the API server and each other on this host; nothing else is out there)."""
    return {
        "cniVersion": "0.4.0",
        "name": node.network,
        "plugins": [
            {
                "type": "bridge", "bridge": node.bridge, "isGateway": True, "ipMasq": False,
                "hairpinMode": True,
                "ipam": {
                    "type": "host-local", "dataDir": str(paths.cni_data_dir),
                    "ranges": [[{"subnet": node.pod_cidr, "gateway": node.gateway}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                },
            },
            {"type": "portmap", "capabilities": {"portMappings": True}},
        ],
    }


def kubelet_config(node: RealNode, paths: NodePaths, ca_file: Path, tls_cert: Path, tls_key: Path) -> dict[str, Any]:
    """The KubeletConfiguration of a real node.

    cgroup v1 here (``failCgroupV1: false``), cgroupfs under the node's own root so two kubelets never share
    ``/kubepods``; webhook authentication and authorization (the API server's kubelet client is bound to
    ``system:kubelet-api-admin``); no read-only port; evictions only when the disk or memory is nearly
    full (a shared build machine's disk is busy, not ours to guard).
    """
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "failCgroupV1": False,
        "cgroupDriver": "cgroupfs",
        "cgroupRoot": node.cgroup_root,
        "cgroupsPerQOS": True,
        "enforceNodeAllocatable": ["pods"],
        "containerRuntimeEndpoint": f"unix://{paths.containerd_socket}",
        "address": node.ip,
        "port": node.kubelet_port,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": node.healthz_port,
        "tlsCertFile": str(tls_cert),
        "tlsPrivateKeyFile": str(tls_key),
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": True},
            "x509": {"clientCAFile": str(ca_file)},
        },
        "authorization": {"mode": "Webhook"},
        "registerNode": True,
        "registerWithTaints": [dict(t) for t in node.taints],
        "failSwapOn": False,
        "protectKernelDefaults": False,
        "makeIPTablesUtilChains": True,
        "serializeImagePulls": False,
        "maxPods": 40,
        "evictionHard": {"memory.available": "100Mi", "nodefs.available": "1%", "imagefs.available": "1%",
                         "nodefs.inodesFree": "1%"},
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "volumePluginDir": str(paths.base / "volume-plugins"),
        "podLogsDir": str(paths.pod_logs),
        "resolvConf": "/etc/resolv.conf",
        "clusterDNS": [CLUSTER_DNS_IP],
        "clusterDomain": CLUSTER_DOMAIN,
        "staticPodPath": "",
        "shutdownGracePeriod": "0s",
        "nodeStatusReportFrequency": "10s",
        "nodeStatusUpdateFrequency": "5s",
        "syncFrequency": "10s",
        "fileCheckFrequency": "10s",
    }


def kubelet_command(bin_dir: Path, node: RealNode, paths: NodePaths) -> list[str]:
    labels = ",".join(f"{k}={v}" for k, v in sorted(node.labels.items()))
    return [
        str(bin_dir / "kubelet"), f"--config={paths.kubelet_config}", f"--kubeconfig={paths.kubeconfig}",
        f"--root-dir={paths.kubelet_root}", f"--cert-dir={paths.base / 'pki'}", f"--hostname-override={node.name}",
        f"--node-ip={node.ip}", f"--node-labels={labels}", "--v=1",
    ]


def containerd_command(paths: NodePaths) -> list[str]:
    return ["containerd", f"--config={paths.containerd_config}", "--log-level=warn"]


def device_plugin_command(bin_dir: Path, node: RealNode, paths: NodePaths,
                          resource: str = DEFAULT_GPU_RESOURCE) -> list[str]:
    return [
        str(bin_dir / "fake-gpu-plugin"), f"--registry-dir={paths.plugins_registry}", f"--resource={resource}",
        f"--count={node.gpus}", f"--id-prefix={node.name}", f"--unhealthy-file={paths.unhealthy_gpus}",
    ]


def kube_proxy_config(kubeconfig: Path, cluster_cidr: str = f"{POD_SUPERNET}.0.0/16") -> dict[str, Any]:
    """One kube-proxy for the host (every real node shares its network namespace): iptables mode; Services
    reach real pods only (kwok's pod addresses go nowhere, so traffic from outside the pod range is not
    masqueraded into them)."""
    return {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "mode": "iptables",
        "clientConnection": {"kubeconfig": str(kubeconfig)},
        "clusterCIDR": cluster_cidr,
        "bindAddress": "127.0.0.1",
        "healthzBindAddress": "127.0.0.1:10356",
        "metricsBindAddress": "127.0.0.1:10349",
        "conntrack": {"maxPerCore": 0},
        "nodePortAddresses": ["127.0.0.1/32"],
    }


#: The API server's port with real nodes: the stack's NetworkPolicies let controllers reach it on 443 or 6443 only
#: (the ``kubernetes`` Service's 443 is DNAT'ed to this port before the policy engine sees the packet).
APISERVER_PORT = 6443
def kube_router_command(bin_dir: Path, kubeconfig: Path, node: str,
                        service_cidr: str = "10.96.0.0/16") -> list[str]:
    """kube-router v2.1.0's NetworkPolicy firewall alone, beside kube-proxy (no routing, no proxy, no CNI of its
    own: IPVS is not in this kernel, and the bridge CNI already wires the pods)."""
    return [
        str(bin_dir / "kube-router"), f"--kubeconfig={kubeconfig}", f"--hostname-override={node}",
        "--run-firewall=true", "--run-router=false", "--run-service-proxy=false", "--enable-cni=false",
        "--enable-pod-egress=false", "--health-port=0", f"--service-cluster-ip-range={service_cidr}", "--v=1",
    ]


#: Where the real nodes' pods find cluster DNS: CoreDNS on the host, at the address the API server advertises (a pod
#: reaches its node there; the kubelets write it into every pod's resolv.conf).
CLUSTER_DNS_IP = APISERVER_IP
CLUSTER_DOMAIN = "cluster.local"
#: The user CoreDNS's kubernetes plugin reads the API as, and what it may read (upstream's system:coredns role,
#: less the pods: ``pods disabled``).
COREDNS_USER = "system:gpucluster-local-coredns"
COREDNS_RULES = (
    {"apiGroups": [""], "resources": ["services", "namespaces"], "verbs": ["list", "watch"]},
    {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["list", "watch"]},
)


def corefile(kubeconfig: Path, listen: str = CLUSTER_DNS_IP, domain: str = CLUSTER_DOMAIN) -> str:
    """CoreDNS's configuration: the cluster's Services (and reverse lookups of their addresses) from the API server.
    No upstream: this machine reaches no resolver, so every other name is refused at once instead of timing out."""
    return (f"{domain}:53 in-addr.arpa:53 {{\n"
            f"    bind {listen}\n"
            "    errors\n"
            f"    kubernetes {domain} in-addr.arpa {{\n"
            f"        kubeconfig {kubeconfig}\n"
            "        pods disabled\n"
            "        ttl 5\n"
            "    }\n"
            "    cache 5\n"
            "}\n")


def coredns_command(bin_dir: Path, config: Path) -> list[str]:
    return [str(bin_dir / "coredns"), "-conf", str(config)]


def node_ready_condition(node_status: Mapping[str, Any]) -> bool:
    """Whether a Node's status says Ready (the kubelet's own report)."""
    for cond in node_status.get("conditions") or ():
        if cond.get("type") == "Ready":
            return bool(cond.get("status") == "True")
    return False


def addresses(nodes: Sequence[RealNode]) -> list[str]:
    """Every address the real nodes need on ``lo``, once each: the API server's, then the nodes' (:data:`NODE_IP`)."""
    return list(dict.fromkeys([APISERVER_IP, *(n.ip for n in nodes)]))
