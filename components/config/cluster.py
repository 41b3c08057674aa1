"""The whole stack: :class:`ClusterConfig` and the list of cross-field checks run on it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated

from pydantic import Field, field_validator

from agents.defaults import DEFAULT_GPU_RESOURCE, DEFAULT_LABEL_PREFIX
from components.config.admission import Admission, admission_problems
from components.config.base import (
    RESERVED_NAMESPACES,
    AbsolutePath,
    Cidr,
    ConfigModel,
    DnsLabel,
    ExtendedResource,
    LabelPrefix,
    Problem,
)
from components.config.burst import Burst, burst_problems
from components.config.checkpoint import Checkpoint, Filesystem, checkpoint_problems
from components.config.descheduler import Descheduler
from components.config.footprint import footprint_problems
from components.config.inference import Inference, inference_problems
from components.config.observability import Observability, observability_problems
from components.config.pools import GpuPool, NodePoolAgent, SystemPool, pools_problems
from components.config.priorities import Priorities
from components.config.providers import ExternalProvider, providers_problems
from components.config.scheduling import Scheduling, scheduling_problems
from components.config.training import Training, training_problems
from components.images import AGENT_REGISTRY, REGISTRY

#: Kubernetes' default kubelet ``--root-dir``.
DEFAULT_KUBELET_ROOT = "/var/lib/kubelet"


class ClusterConfig(ConfigModel):
    """The whole stack, as declared in ``Pulumi.<stack>.yaml``."""

    kubernetes_version: Annotated[str, Field(pattern=r"^1\.\d+(\.\d+)?$")] = "1.34"
    """Version of the cluster's API server (`1.<minor>[.<patch>]`): it decides which gang scheduler is
    accepted, whether the admission policies are declared (1.30+) and which MutatingAdmissionPolicy API
    `admission.mutating: auto` uses."""
    label_prefix: LabelPrefix = DEFAULT_LABEL_PREFIX
    """Prefix of every label, taint and scheduling-gate key the platform sets (`<prefix>/pool`,
    `<prefix>/burst`…): a DNS subdomain such as `gpucluster.io`."""
    gpu_resource: ExtendedResource = DEFAULT_GPU_RESOURCE
    """Extended resource the device plugin advertises GPUs as: what pods request, queues cap and virtual nodes
    report."""
    system_namespace: DnsLabel = "gpu-system"
    """Namespace of the platform's controllers (burst controller, descheduler, health guard, metrics adapter,
    virtual kubelets other than Liqo's); Pod Security `restricted`."""
    telemetry_namespace: DnsLabel = "gpu-telemetry"
    """Namespace of the node telemetry exporters (DCGM, InfiniBand): the only one whose Pod Security level is
    `privileged`, so the system namespace, with every controller, can enforce `restricted`."""
    training_namespace: DnsLabel = "training"
    """Namespace of the training jobs, the checkpoint claims and the throughput check; Pod Security
    `baseline`, every GPU pod checked by the admission policies."""
    inference_namespace: DnsLabel = "inference"
    """Namespace of the inference services and their standbys; Pod Security `baseline`. Virtual kubelets run
    pods and the descheduler evicts only here."""
    monitoring_namespace: DnsLabel = "monitoring"
    """Namespace of the Prometheus Operator's Prometheus: the alert rules and dashboards go there, and the
    metrics adapter finds Prometheus there by default. Pod Security `restricted`."""
    api_server_cidrs: list[Cidr] = Field(default_factory=lambda: ["0.0.0.0/0"], min_length=1)
    """Where the API server answers (its addresses or the control plane's range): the only egress our
    controllers' NetworkPolicy allows on 443/6443. Every address until a site narrows it."""
    dns_cidrs: list[Cidr] = Field(default_factory=list)
    """Where the cluster's DNS answers besides its kube-dns pods, which the DNS egress rule admits by label: a
    NodeLocal DNSCache's link-local address (`169.254.20.10/32`) or a resolver on the nodes. Under default-deny a
    pod whose resolv.conf names an address no rule admits resolves nothing."""
    kubelet_root_dir: AbsolutePath = DEFAULT_KUBELET_ROOT
    """The GPU nodes' kubelet `--root-dir`. dcgm-exporter maps GPUs to pods through the kubelet's pod-resources
    socket under it (`<root>/pod-resources`); a node without that directory leaves the exporter's pod in
    ContainerCreating and `pulumi up` waiting on the DaemonSet. Kubernetes' default; distributions such as k0s
    (`/var/lib/k0s/kubelet`) and MicroK8s (`/var/snap/microk8s/common/var/lib/kubelet`) move it."""
    agent_registry: str = AGENT_REGISTRY
    """Where our agents' images are pulled from (`host[:port]/path`, no tag): every site pushes them to its
    own."""
    pools: list[GpuPool]
    """On-prem GPU pools, at least one: their nodes are labelled and tainted, and their GPUs are what training,
    inference and the burst thresholds count."""
    system_pool: SystemPool
    """CPU nodes the platform's own components run on."""
    node_pool_agent: NodePoolAgent = NodePoolAgent()
    """The agent that keeps the GPU pools' nodes labelled and tainted."""
    priorities: Priorities = Priorities()
    """PriorityClasses of the four tiers: system, training, inference and default."""
    scheduling: Scheduling = Scheduling()
    """The gang scheduler every on-prem GPU pod goes through, its queues and the research teams."""
    providers: list[ExternalProvider] = Field(default_factory=list)
    """External GPU providers, each one virtual node that inference may burst onto; chosen by `kind`."""
    inference: Inference = Inference()
    """Inference services, the Gateway they attach to and the metrics adapter."""
    burst: Burst = Burst()
    """The burst controller: when inference may use the providers' virtual nodes, and the handover."""
    descheduler: Descheduler = Descheduler()
    """The descheduler that brings burst pods back on-prem a few at a time."""
    observability: Observability = Observability()
    """GPU and InfiniBand exporters, alert rules, dashboards and the health guard."""
    checkpoint: Checkpoint = Checkpoint()
    """Checkpoint filesystems, the time budget one checkpoint must meet and the throughput check."""
    training: Training = Training()
    """Training jobs and the NCCL and metrics settings every worker gets."""
    admission: Admission = Admission()
    """Admission policies inside the cluster."""

    @property
    def pod_resources_dir(self) -> str:
        """The kubelet's pod-resources directory on the GPU nodes (under :attr:`kubelet_root_dir`)."""
        return self.kubelet_root_dir.rstrip("/") + "/pod-resources"

    @field_validator("agent_registry")
    @classmethod
    def _registry(cls, value: str) -> str:
        if not REGISTRY.fullmatch(value):
            raise ValueError(f"'{value}' is not an image registry path (host[:port]/path, lower case, no tag or "
                             "digest), for example registry.example.com/platform")
        return value

    @field_validator("pools")
    @classmethod
    def _some_pools(cls, value: list[GpuPool]) -> list[GpuPool]:
        if not value:
            raise ValueError("must declare at least one on-prem GPU pool")
        return value

    @property
    def k8s_minor(self) -> tuple[int, int]:
        major, minor = self.kubernetes_version.split(".")[:2]
        return int(major), int(minor)

    @property
    def system_pool_selector(self) -> dict[str, str]:
        """The node selector that places platform components on the system pool."""
        return {f"{self.label_prefix}/pool": self.system_pool.name}

    @property
    def handover_active(self) -> bool:
        """Training waits at the handover gate: only with inference to protect and somewhere to put a standby."""
        return self.burst.handover.enabled and bool(self.providers) and bool(self.inference.services)

    @property
    def handover_services(self) -> dict[str, int]:
        """Inference services the handover protects, with the minimum each keeps ready; empty when off."""
        return {s.name: s.min_replicas for s in self.inference.services} if self.handover_active else {}

    @property
    def inference_pools(self) -> tuple[str, ...]:
        """The pools inference services are confined to, sorted; empty when one may run in every pool."""
        services = self.inference.services
        if not services or any(s.pool is None for s in services):
            return ()
        return tuple(sorted({s.pool for s in services if s.pool is not None}))

    @property
    def onprem_gpus(self) -> int:
        return sum(p.gpu_count for p in self.pools)

    def pool(self, name: str) -> GpuPool:
        return next(p for p in self.pools if p.name == name)

    def filesystem(self, name: str) -> Filesystem:
        return next(f for f in self.checkpoint.filesystems if f.name == name)



def namespace_problems(cfg: ClusterConfig) -> list[Problem]:
    """The platform's namespaces are its own: none of Kubernetes' reserved ones, training, inference, the system
    and the telemetry namespace apart, so quotas, policies and admission rules (the telemetry namespace's
    ``privileged`` level above all) of one never apply to another."""
    declared = [("systemNamespace", cfg.system_namespace), ("trainingNamespace", cfg.training_namespace),
                ("inferenceNamespace", cfg.inference_namespace), ("telemetryNamespace", cfg.telemetry_namespace),
                ("monitoringNamespace", cfg.monitoring_namespace)]
    problems = [Problem(key, "is reserved by Kubernetes; choose a namespace of the platform's own", name)
                for key, name in declared if name in RESERVED_NAMESPACES]
    first: dict[str, str] = {}
    for key, name in declared[:4]:
        if name in first:
            problems.append(Problem(key, f"is the same namespace as {first[name]}; each needs its own", name))
        first.setdefault(name, key)
    if cfg.monitoring_namespace in (cfg.training_namespace, cfg.inference_namespace):
        problems.append(Problem("monitoringNamespace", "must not be the training or inference namespace",
                                cfg.monitoring_namespace))
    if cfg.monitoring_namespace == cfg.telemetry_namespace:
        problems.append(Problem("telemetryNamespace", "must not be the monitoring namespace: it is the one privileged "
                                "namespace, and monitoring enforces restricted", cfg.telemetry_namespace))
    return problems


#: The cross-field checks, one per section, in the order the sections appear in the stack file. Each
#: returns its problems rather than raising, so one run reports them all.
CROSS_CHECKS: list[Callable[[ClusterConfig], list[Problem]]] = [
    namespace_problems,
    pools_problems,
    scheduling_problems,
    providers_problems,
    inference_problems,
    burst_problems,
    observability_problems,
    checkpoint_problems,
    training_problems,
    admission_problems,
    footprint_problems,
]


def cross_check(cfg: ClusterConfig) -> list[Problem]:
    """Every rule that spans fields or sections, across the whole stack."""
    return [problem for check in CROSS_CHECKS for problem in check(cfg)]
