"""What the local cluster looks like: fake nodes and component command lines (pure functions).

The node plan comes from the local stack's configuration when it loads (``Pulumi.local.yaml``): every
on-prem pool node becomes a kwok node with the pool's GPU capacity, labels and taint (the same values
the node-pool agent applies, so it only adds its record), every system-pool
node a CPU node. Every external provider's virtual node is registered by a real virtual-kubelet that
runs the stack's provider Deployment as a local process (:func:`virtual_kubelet_process`); its plan entry
is what that node must look like once registered and labelled. Without a loadable stack file a built-in
plan of the same shape is used.
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from agents.defaults import DEFAULT_GPU_RESOURCE, DEFAULT_LABEL_PREFIX
from components.pins import MOCK_VK_PROVIDER
from tools.localcluster.realnodes import stack_overrides

#: kwok manages only nodes carrying this annotation; real nodes (none here) are left alone.
KWOK_ANNOTATION = "kwok.x-k8s.io/node"
VK_PROVIDER_TAINT = "virtual-kubelet.io/provider"


@dataclass(frozen=True)
class Taint:
    key: str
    value: str
    effect: str = "NoSchedule"

    def manifest(self) -> dict[str, str]:
        return {"key": self.key, "value": self.value, "effect": self.effect}


@dataclass(frozen=True)
class NodeSpec:
    """One fake node: capacity, labels and taints as a real node of that kind would register them."""

    name: str
    kind: str  # "gpu", "system" or "virtual"
    pool: str
    gpus: int = 0
    cpu: int = 64
    memory_gi: int = 512
    pods: int = 110
    #: Real kubelets report their root disk as ephemeral-storage; every pod of ours requests some.
    ephemeral_storage_gi: int = 400
    labels: Mapping[str, str] = field(default_factory=dict)
    taints: tuple[Taint, ...] = ()

    def manifest(self, gpu_resource: str) -> dict[str, Any]:
        capacity = {
            "cpu": str(self.cpu),
            "memory": f"{self.memory_gi}Gi",
            "ephemeral-storage": f"{self.ephemeral_storage_gi}Gi",
            "pods": str(self.pods),
        }
        if self.gpus:
            capacity[gpu_resource] = str(self.gpus)
        labels = {
            "kubernetes.io/hostname": self.name,
            "kubernetes.io/os": "linux",
            "kubernetes.io/arch": "amd64",
            "type": "kwok",
            **self.labels,
        }
        return {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": self.name, "labels": labels, "annotations": {KWOK_ANNOTATION: "fake"}},
            "spec": {"taints": [t.manifest() for t in self.taints]},
            # kwok's node-initialize stage keeps capacity/allocatable and fills conditions and nodeInfo.
            "status": {"capacity": capacity, "allocatable": dict(capacity)},
        }


@dataclass(frozen=True)
class NodePlan:
    nodes: tuple[NodeSpec, ...]
    gpu_resource: str = DEFAULT_GPU_RESOURCE
    label_prefix: str = DEFAULT_LABEL_PREFIX
    source: str = "built-in default"

    def by_kind(self, kind: str) -> list[NodeSpec]:
        return [n for n in self.nodes if n.kind == kind]

    @property
    def kwok_nodes(self) -> tuple[NodeSpec, ...]:
        """The nodes kwok fakes: every one but the virtual nodes, which virtual-kubelets register."""
        return tuple(n for n in self.nodes if n.kind != "virtual")

    @property
    def onprem_gpus(self) -> int:
        return sum(n.gpus for n in self.by_kind("gpu"))


def _gpu_node(name: str, pool: str, gpus: int, model: str, prefix: str, taint: bool) -> NodeSpec:
    labels = {
        f"{prefix}/pool": pool,
        f"{prefix}/location": "onprem",
        f"{prefix}/gpu-model": model,
        "app.kubernetes.io/name": pool,
        "app.kubernetes.io/component": "gpu-node-pool",
        "app.kubernetes.io/part-of": "unified-gpu-cluster",
        "app.kubernetes.io/managed-by": "pulumi",
    }
    taints = (Taint(f"{prefix}/pool", pool),) if taint else ()
    return NodeSpec(name=name, kind="gpu", pool=pool, gpus=gpus, cpu=128, memory_gi=2048, labels=labels,
                    taints=taints)


def _system_node(name: str, pool: str, prefix: str) -> NodeSpec:
    labels = {
        f"{prefix}/pool": pool,
        "app.kubernetes.io/name": pool,
        "app.kubernetes.io/component": "system-pool",
        "app.kubernetes.io/part-of": "unified-gpu-cluster",
        "app.kubernetes.io/managed-by": "pulumi",
    }
    return NodeSpec(name=name, kind="system", pool=pool, cpu=32, memory_gi=128, labels=labels)


def _virtual_node(name: str, provider: str, gpus: int, model: str, prefix: str, cpu: int = 512,
                  memory_gi: int = 4096, pods: int = 500, vk_provider: str | None = None,
                  ephemeral_storage_gi: int = 2048) -> NodeSpec:
    labels = {
        f"{prefix}/location": "external",
        f"{prefix}/provider": provider,
        f"{prefix}/gpu-model": model,
        "type": "virtual-kubelet",
        "kubernetes.io/role": "agent",
    }
    return NodeSpec(name=name, kind="virtual", pool=provider, gpus=gpus, cpu=cpu, memory_gi=memory_gi,
                    pods=pods, ephemeral_storage_gi=ephemeral_storage_gi, labels=labels,
                    taints=(Taint(VK_PROVIDER_TAINT, vk_provider or provider),))


def default_plan() -> NodePlan:
    """4 on-prem nodes x 8 GPUs, one system node and one external provider of 32 GPUs."""
    p = DEFAULT_LABEL_PREFIX
    gpu = tuple(_gpu_node(f"gpu-local-{i:02d}", "local", 8, "H100-SXM5-80GB", p, True) for i in range(1, 5))
    system = (_system_node("system-local-01", "system", p),)
    virtual = (_virtual_node("vk-external-gpu", "external-gpu", 32, "H100-SXM5-80GB", p),)
    return NodePlan(nodes=gpu + system + virtual)


def plan_from_config(cfg: Any, source: str) -> NodePlan:
    """The plan for a validated ``components.config.ClusterConfig`` (duck-typed to keep this module pure)."""
    prefix: str = cfg.label_prefix
    nodes: list[NodeSpec] = []
    from agents.node_taints import leaf_label_key, spine_label_key

    for pool in cfg.pools:
        # A pool's fabric by name: each node carries its leaf and spine, as the node-pool agent labels it.
        leaf_of = pool.topology.leaf_of() if pool.topology is not None else {}
        spine_of = pool.topology.spine_of() if pool.topology is not None else {}
        for name in pool.node_names:
            node = _gpu_node(name, pool.name, pool.gpus_per_node, pool.gpu_model, prefix, pool.taint)
            if name in leaf_of:
                node = replace(node, labels={**node.labels, leaf_label_key(prefix): leaf_of[name],
                                             spine_label_key(prefix): spine_of[leaf_of[name]]})
            nodes.append(node)
    from components.config import expand_node_names

    for name in expand_node_names(cfg.system_pool.nodes):
        nodes.append(_system_node(name, cfg.system_pool.name, prefix))
    from components.providers import provider_taint

    for prov in cfg.providers:
        # The taint the stack's virtual kubelet sets (VKUBELET_TAINT_VALUE), which is what inference
        # tolerates: the provider's name, not the binary's --provider.
        nodes.append(_virtual_node(prov.node_name, prov.name, prov.gpus, prov.gpu_model, prefix,
                                   cpu=prov.cpu, memory_gi=prov.memory_gi, pods=prov.pods,
                                   vk_provider=provider_taint(prov)["value"],
                                   ephemeral_storage_gi=prov.ephemeral_storage_gi))
    return NodePlan(nodes=tuple(nodes), gpu_resource=cfg.gpu_resource, label_prefix=prefix, source=source)


def stack_config_values(stack_file: Path) -> dict[str, Any]:
    """The plain ``gpu-cluster:<key>`` values of a Pulumi stack file, keys without the project prefix: the stack
    loader's reading (:func:`components.config.plain_values`), duplicates and YAML errors refused with their line."""
    from components.config import plain_values

    return plain_values(stack_file)


def load_stack_config(root: Path, stack: str = "local", real_nodes: bool = False) -> Any | None:
    """The stack's ``ClusterConfig`` validated as ``pulumi up`` validates it, or None without a stack file or the
    components package; with ``real_nodes``, as ``pulumi up`` of a cluster with real nodes sees it
    (``realnodes.stack_overrides``)."""
    stack_file = root / f"Pulumi.{stack}.yaml"
    if not stack_file.exists():
        return None
    try:
        from components.config import load_stack, plain_values
    except ImportError:
        return None
    overrides: dict[str, Any] = {}
    if real_nodes:

        overrides = stack_overrides(plain_values(stack_file))
    return load_stack(stack_file, overrides)


def load_plan(root: Path, stack: str = "local", real_nodes: bool = False) -> NodePlan:
    """The node plan of ``Pulumi.<stack>.yaml`` if it exists and validates, else :func:`default_plan`; with
    ``real_nodes``, the stack's pools plus the real GPU nodes' (``realnodes.stack_overrides``)."""
    cfg = load_stack_config(root, stack, real_nodes)
    if cfg is None:
        return default_plan()
    return plan_from_config(cfg, source=f"Pulumi.{stack}.yaml")


# --------------------------------------------------------------------------- component command lines


@dataclass(frozen=True)
class Layout:
    """Where everything lives under the state folder."""

    state: Path

    @property
    def bin(self) -> Path:
        return self.state / "bin"

    @property
    def pki(self) -> Path:
        return self.state / "pki"

    @property
    def logs(self) -> Path:
        return self.state / "logs"

    @property
    def run(self) -> Path:
        return self.state / "run"

    @property
    def etcd_data(self) -> Path:
        return self.state / "etcd"

    @property
    def volumes(self) -> Path:
        """With real nodes: the directories the provisioner makes the cluster's volumes of (its checkpoints)."""
        return self.state / "volumes"

    @property
    def crd(self) -> Path:
        return self.state / "crd"

    @property
    def kubeconfig(self) -> Path:
        return self.state / "kubeconfig"

    @property
    def volcano_conf(self) -> Path:
        return self.state / "volcano-scheduler.conf"

    @property
    def descheduler_policy(self) -> Path:
        return self.state / "descheduler-policy.yaml"

    @property
    def audit_policy(self) -> Path:
        return self.state / "audit-policy.yaml"

    @property
    def audit_log(self) -> Path:
        return self.logs / "audit.log"

    def virtual_kubelet(self, provider: str) -> Path:
        """A provider's virtual-kubelet files: its kubeconfig (a token, no admin), capacity file, serving key."""
        return self.state / "virtual-kubelet" / provider


PORT_NAMES = ("etcd", "etcd_peer", "apiserver", "kwok", "vc_scheduler_metrics", "vc_scheduler_healthz",
              "vc_controller_metrics", "vc_controller_healthz", "descheduler", "apiproxy_control")

SERVICE_CIDR = "10.96.0.0/16"
SERVICE_ACCOUNT_ISSUER = "https://kubernetes.default.svc.cluster.local"


def component_commands(lay: Layout, ports: Mapping[str, int], pod_reachable_ip: str | None = None
                       ) -> dict[str, list[str]]:
    """Command lines in start order. Everything binds to 127.0.0.1 or serves nothing (port 0).

    With real nodes (``pod_reachable_ip``, tools/localcluster/realnodes.APISERVER_IP) the API server listens on
    every address; pods reach it through the proxy (tools/localcluster/apiproxy.py), which the ``kubernetes``
    Service's endpoints name, so the API server leaves them alone.
    """
    b, pki, kc = lay.bin, lay.pki, str(lay.kubeconfig)
    etcd_url = f"http://127.0.0.1:{ports['etcd']}"
    if pod_reachable_ip:
        # Kubelets are reached at their InternalIP (the node names resolve nowhere).
        addresses = ["--bind-address=0.0.0.0", f"--advertise-address={pod_reachable_ip}",
                     "--endpoint-reconciler-type=none", "--kubelet-preferred-address-types=InternalIP,Hostname"]
    else:
        # The 'kubernetes' Service endpoint would be 127.0.0.1, which endpoints reject.
        addresses = ["--bind-address=127.0.0.1", "--advertise-address=127.0.0.1", "--endpoint-reconciler-type=none"]
    return {
        "etcd": [
            str(b / "etcd"), "--name=local", f"--data-dir={lay.etcd_data}",
            f"--listen-client-urls={etcd_url}", f"--advertise-client-urls={etcd_url}",
            f"--listen-peer-urls=http://127.0.0.1:{ports['etcd_peer']}",
            f"--initial-advertise-peer-urls=http://127.0.0.1:{ports['etcd_peer']}",
            f"--initial-cluster=local=http://127.0.0.1:{ports['etcd_peer']}",
            "--quota-backend-bytes=4294967296", "--log-level=warn",
            # Fast local disk is not guaranteed on shared machines; the data is throwaway.
            "--unsafe-no-fsync",
        ],
        "kube-apiserver": [
            str(b / "kube-apiserver"), f"--etcd-servers={etcd_url}",
            *addresses, f"--secure-port={ports['apiserver']}",
            f"--tls-cert-file={pki / 'apiserver.crt'}", f"--tls-private-key-file={pki / 'apiserver.key'}",
            f"--client-ca-file={pki / 'ca.crt'}",
            f"--kubelet-client-certificate={pki / 'kubelet-client.crt'}",
            f"--kubelet-client-key={pki / 'kubelet-client.key'}",
            f"--service-account-issuer={SERVICE_ACCOUNT_ISSUER}",
            f"--service-account-key-file={pki / 'sa.pub'}",
            f"--service-account-signing-key-file={pki / 'sa.key'}",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            # Node: a real kubelet may read only what its pods need (and NodeRestriction: change only its Node).
            "--authorization-mode=Node,RBAC", "--enable-admission-plugins=NodeRestriction", "--allow-privileged=true",
            # Requests of service accounts (only the virtual kubelets authenticate as one here), with the
            # RBAC decision: which grants they use, and any they lack (see tools/localcluster/rbac_usage.py).
            f"--audit-policy-file={lay.audit_policy}", f"--audit-log-path={lay.audit_log}",
            "--audit-log-format=json", "--audit-log-maxsize=200", "--audit-log-maxbackup=1",
            # MutatingAdmissionPolicy is beta and off by default in 1.34/1.35: served here so a stack with
            # admission.mutating: v1beta1 can be proven end to end (tests/test_e2e_researcher.py).
            "--feature-gates=MutatingAdmissionPolicy=true",
            "--runtime-config=admissionregistration.k8s.io/v1beta1=true",
            "--profiling=false", "--v=1",
        ],
        "kube-controller-manager": [
            str(b / "kube-controller-manager"), f"--kubeconfig={kc}", "--leader-elect=false",
            "--bind-address=127.0.0.1", "--secure-port=0",
            f"--service-account-private-key-file={pki / 'sa.key'}", f"--root-ca-file={pki / 'ca.crt'}",
            f"--cluster-signing-cert-file={pki / 'ca.crt'}", f"--cluster-signing-key-file={pki / 'ca.key'}",
            "--use-service-account-credentials=false", "--controllers=*,-nodeipam",
            "--profiling=false", "--v=1",
        ],
        "kube-scheduler": [
            str(b / "kube-scheduler"), f"--kubeconfig={kc}", "--leader-elect=false",
            "--bind-address=127.0.0.1", "--secure-port=0", "--profiling=false", "--v=1",
        ],
        "kwok": [
            str(b / "kwok"), f"--kubeconfig={kc}", f"--manage-nodes-with-annotation-selector={KWOK_ANNOTATION}=fake",
            "--node-ip=127.0.0.1", "--cidr=10.244.0.0/16", "--node-lease-duration-seconds=40",
            f"--server-address=127.0.0.1:{ports['kwok']}",
        ],
        "vc-controller-manager": [
            str(b / "vc-controller-manager"), f"--kubeconfig={kc}", "--leader-elect=false",
            f"--healthz-address=127.0.0.1:{ports['vc_controller_healthz']}", "--enable-healthz=true",
            f"--listen-address=127.0.0.1:{ports['vc_controller_metrics']}",
            "--scheduler-name=volcano", "--logtostderr", "--v=2",
        ],
        "vc-scheduler": [
            str(b / "vc-scheduler"), f"--kubeconfig={kc}", "--leader-elect=false",
            f"--scheduler-conf={lay.volcano_conf}", "--scheduler-name=volcano", "--schedule-period=1s",
            f"--listen-address=127.0.0.1:{ports['vc_scheduler_metrics']}",
            f"--healthz-address=127.0.0.1:{ports['vc_scheduler_healthz']}", "--enable-healthz=true",
            # LOCALCLUSTER_VC_V=4 logs every reclaim/preempt decision (victims, queue shares);
            # LOCALCLUSTER_VC_PPROF=1 serves Go's profiles on the metrics address (/debug/pprof/).
            "--logtostderr", f"--v={os.environ.get('LOCALCLUSTER_VC_V', '2')}",
            *(["--enable-pprof"] if os.environ.get("LOCALCLUSTER_VC_PPROF") == "1" else []),
        ],
    }


def volcano_scheduler_flags(cfg: Any) -> list[str]:
    """The stack's ``scheduling.percentageOfNodesToFind`` on the scheduler's command line, as the stack's chart
    transform sets it (``components.gang_scheduler``)."""
    pct = cfg.scheduling.percentage_of_nodes_to_find
    return [] if pct is None else [f"--percentage-nodes-to-find={pct}"]


def volcano_controller_flags(cfg: Any) -> list[str]:
    """The stack's client rate for Volcano's controllers (``scheduling.controllerClient``), as the chart sets it, so
    the local control plane creates a gang's pods at the pace production does."""
    rate = cfg.scheduling.controller_client
    return [f"--kube-api-qps={rate.qps}", f"--kube-api-burst={rate.burst}"]


def descheduler_command(lay: Layout, ports: Mapping[str, int], kubeconfig: Path | None = None) -> list[str]:
    """The descheduler runs on demand with a policy file (the stack's, for ``make up`` and e2e), as its own
    ServiceAccount where ``kubeconfig`` holds that account's token (the admin kubeconfig otherwise), on the interval
    the simulator models the local cluster with."""
    from bench.bench_sim_vs_e2e import LOCAL_DESCHEDULER_INTERVAL_S

    interval = f"{LOCAL_DESCHEDULER_INTERVAL_S}s"
    return [
        str(lay.bin / "descheduler"), f"--kubeconfig={kubeconfig or lay.kubeconfig}",
        f"--policy-config-file={lay.descheduler_policy}", f"--descheduling-interval={interval}",
        "--bind-address=127.0.0.1", f"--secure-port={ports['descheduler']}", "--v=2",
    ]


def volcano_conf(cfg: Any = None) -> dict[str, Any]:
    """The stack's Volcano scheduler configuration, so the local scheduler decides as production does (with the
    topology plugin where ``cfg`` has a pool with a fabric topology, as ``GangSchedulerArgs`` decides).

    No fallback: a local cluster running any other configuration would prove nothing about the stack.
    """
    from components.gang_scheduler import volcano_scheduler_conf

    if cfg is None:
        return volcano_scheduler_conf()
    return volcano_scheduler_conf(cfg.gpu_resource, topology=any(p.topology is not None for p in cfg.pools))


def audit_policy(everyone: bool = False) -> dict[str, Any]:
    """Metadata (who, verb, object, RBAC decision) of every request a service account makes; nothing else.

    The control plane and the agents authenticate with the admin certificate, so the log holds the virtual
    kubelets' requests only: small, and exactly what their RBAC is measured against. With ``everyone`` (the scale
    shapes) every request but the node leases' renewals is logged, with its user agent, so the requests per agent
    can be counted; the leases (hundreds a second at 2,048 nodes) are counted from the API server's metrics.
    """
    if everyone:
        return {
            "apiVersion": "audit.k8s.io/v1", "kind": "Policy", "omitStages": ["RequestReceived"],
            "rules": [{"level": "None", "resources": [{"group": "coordination.k8s.io", "resources": ["leases"]}],
                       "namespaces": ["kube-node-lease"]},
                      {"level": "Metadata"}],
        }
    return {
        "apiVersion": "audit.k8s.io/v1", "kind": "Policy", "omitStages": ["RequestReceived"],
        "rules": [{"level": "Metadata", "userGroups": ["system:serviceaccounts"]}, {"level": "None"}],
    }


# --------------------------------------------------------------------------- the stack's virtual kubelets

#: The binary build.sh builds from the pinned virtual-kubelet module (its built-in ``mock`` provider).
VIRTUAL_KUBELET = "virtual-kubelet"
#: The only provider that binary carries.
MOCK_PROVIDER = MOCK_VK_PROVIDER
#: What the pod's downward-API fields are for a local process.
_FIELD_VALUES = {"status.podIP": "127.0.0.1", "status.hostIP": "127.0.0.1"}
#: Flags naming paths or addresses inside the pod: the local process gets its own.
_LOCAL_FLAGS = ("--provider-config", "--metrics-addr", "--kubeconfig")
_REF = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


@dataclass(frozen=True)
class VirtualKubeletFiles:
    """Where a provider's local virtual-kubelet finds what its pod would have mounted."""

    kubeconfig: Path
    provider_config: Path
    serving_cert: Path
    serving_key: Path
    ca_cert: Path


def _expand(value: str, env: Mapping[str, str]) -> str:
    """``$(VAR)`` references as the kubelet expands them (an unknown one stays as written)."""
    return _REF.sub(lambda m: env.get(m.group(1), m.group(0)), value)


def _local_env(container: Mapping[str, Any], what: str, fields: Mapping[str, str]) -> dict[str, str]:
    """A container's environment as a local process gets it: values with ``$(VAR)`` expanded, downward-API
    ``fields`` as given; any other source (a Secret, a ConfigMap) is refused, naming ``what`` and the variable."""
    env: dict[str, str] = {}
    for var in container.get("env") or ():
        key = str(var["name"])
        if not var.get("valueFrom"):  # the API server drops an empty value
            env[key] = _expand(str(var.get("value") or ""), env)
            continue
        path = str(((var.get("valueFrom") or {}).get("fieldRef") or {}).get("fieldPath"))
        if path not in fields:
            raise ValueError(f"{what}: env {key} comes from {var.get('valueFrom')!r}, which a local process "
                             "cannot reproduce")
        env[key] = fields[path]
    return env


def _flag(arg: str) -> str:
    return arg.split("=", 1)[0]


def virtual_kubelet_process(bin_dir: Path, container: Mapping[str, Any], pod_name: str, namespace: str,
                            files: VirtualKubeletFiles, kubelet_port: int,
                            metrics_port: int) -> tuple[list[str], dict[str, str]]:
    """Command line and environment of the stack's virtual-kubelet container, run as a local process.

    Everything the stack sets is kept (node name, ``--provider``, taint variables, flags) except what names
    the pod's own paths and addresses: the capacity file, the metrics address (loopback) and the kubeconfig,
    which holds a token of the provider's ServiceAccount and nothing else. The kubelet API's key pair and client
    CA are where the stack puts them, mapped to local files: the pair its init container made
    (:func:`serving_cert_process`), the local CA where the stack names the pod's cluster CA. A stack that sets no
    key pair is refused: the upstream binary exits without one. The provider's credentials file is left out: the
    mock provider reads none, and the Secret stays in the cluster. Anything this cannot reproduce (a Secret or
    ConfigMap reference in the environment, a ``--provider`` other than the binary's ``mock``) is refused,
    naming it.
    """
    name = str(container.get("name", "?"))
    args = [str(a) for a in container.get("args") or ()]
    providers = [a.split("=", 1)[1] for a in args if a.startswith("--provider=")]
    if providers != [MOCK_PROVIDER]:
        raise ValueError(f"container {name!r} in {namespace}: the local virtual-kubelet carries only the "
                         f"{MOCK_PROVIDER!r} provider, the stack asks for {providers or 'none'} (--provider)")
    argv = [str(bin_dir / VIRTUAL_KUBELET)]
    argv += [a for a in args if _flag(a) not in _LOCAL_FLAGS]
    argv += [f"--provider-config={files.provider_config}", f"--metrics-addr=127.0.0.1:{metrics_port}",
             f"--kubeconfig={files.kubeconfig}"]
    env = _local_env(container, f"container {name!r} in {namespace}",
                     {**_FIELD_VALUES, "metadata.name": pod_name, "metadata.namespace": namespace})
    env.pop("PROVIDER_CREDENTIALS_FILE", None)
    missing = [k for k in SERVING_VARIABLES if not env.get(k)]
    if missing:
        raise ValueError(f"container {name!r} in {namespace}: {' and '.join(missing)} not set: virtual-kubelet "
                         "exits at start without the key pair of its kubelet API (logs, exec)")
    env.update({
        "KUBELET_PORT": str(kubelet_port),
        "KUBECONFIG": str(files.kubeconfig),
        "APISERVER_CERT_LOCATION": str(files.serving_cert),
        "APISERVER_KEY_LOCATION": str(files.serving_key),
    })
    if env.get("APISERVER_CA_CERT_LOCATION"):
        env["APISERVER_CA_CERT_LOCATION"] = str(files.ca_cert)
    return argv, env


#: Where node-cli reads its kubelet API's key pair; it exits at start when either is unset.
SERVING_VARIABLES = ("APISERVER_CERT_LOCATION", "APISERVER_KEY_LOCATION")
#: The command of the stack's init container that makes the key pair (agents/serving_cert.py).
SERVING_CERT_COMMAND = "serving-cert"


def serving_cert_process(init_containers: Sequence[Mapping[str, Any]], namespace: str,
                         directory: Path) -> list[str]:
    """The stack's ``serving-cert`` init container as a local command writing into ``directory``.

    Its arguments are kept except ``--dir`` (the pod's in-memory volume); ``$(VAR)`` references resolve from its
    environment, downward-API fields as a local process sees them. Any other init container is refused, naming
    it: the local process would start without what that container prepares.
    """
    argv: list[str] | None = None
    for init in init_containers:
        name = str(init.get("name", "?"))
        if list(init.get("command") or ()) != [SERVING_CERT_COMMAND]:
            raise ValueError(f"init container {name!r} in {namespace}: runs {init.get('command')!r}, which the "
                             f"local harness cannot reproduce (it runs only {SERVING_CERT_COMMAND!r})")
        env = _local_env(init, f"init container {name!r} in {namespace}", _FIELD_VALUES)
        args = [_expand(str(a), env) for a in init.get("args") or ()]
        argv = [sys.executable, "-m", "agents.serving_cert", *(a for a in args if _flag(a) != "--dir"),
                f"--dir={directory}"]
    if argv is None:
        raise ValueError(f"no {SERVING_CERT_COMMAND!r} init container in {namespace}: the stack's virtual kubelet "
                         "would have no key pair for its kubelet API")
    return argv


def check_mock_provider_config(text: str, source: str) -> str:
    """The stack's ``--provider-config`` file for the mock provider, checked before the binary reads it.

    The stack writes the mock's own format (components/providers.py ``provider_config``): ``cpu``, ``memory`` and
    ``pods`` by name, every other resource under ``others``. A resource outside those the mock would silently drop,
    which is a node that refuses pods; that is refused here, naming it.
    """
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise ValueError(f"{source}: not JSON ({err.msg} at line {err.lineno} column {err.colno})") from None
    if not isinstance(data, dict) or not data:
        raise ValueError(f"{source}: expected an object of node name -> resources, got {type(data).__name__}")
    for node, resources in data.items():
        if not isinstance(resources, dict):
            raise ValueError(f"{source}: node {node!r}: expected resource -> quantity, got {type(resources).__name__}")
        others = resources.get("others", {})
        named = {k: v for k, v in resources.items() if k != "others"}
        if not isinstance(others, dict) or not all(isinstance(v, str) for v in [*named.values(), *others.values()]):
            raise ValueError(f"{source}: node {node!r}: expected resource -> quantity (a string)")
        dropped = sorted(set(named) - {"cpu", "memory", "pods"})
        if dropped:
            raise ValueError(f"{source}: node {node!r}: the mock provider reads {', '.join(dropped)} only under "
                             "'others'; the node would register without it")
    return text


def required_grants(namespaces: Sequence[str], node: str) -> list[dict[str, str]]:
    """One request per kind of grant the virtual kubelet needs before it starts (SubjectAccessReview
    attributes): once the API server allows all of them, its RBAC is in place and it cannot start forbidden."""
    checks = [{"verb": "create", "resource": "nodes"},
              {"verb": "get", "group": "coordination.k8s.io", "resource": "leases", "namespace": "kube-node-lease",
               "name": node},
              {"verb": "watch", "resource": "pods"}]
    checks += [{"verb": "update", "resource": "pods", "subresource": "status", "namespace": ns} for ns in namespaces]
    return checks
