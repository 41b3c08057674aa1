"""External GPU providers (virtual nodes) and their check: one distinct virtual node each."""

from __future__ import annotations

from enum import StrEnum
from typing import TYPE_CHECKING, Annotated, Self

from pydantic import Field, model_validator

from components.config.base import ConfigModel, DnsLabel, PinnedImage, PositiveInt, Problem, unique_names

if TYPE_CHECKING:
    from components.config.cluster import ClusterConfig


class ProviderKind(StrEnum):
    VIRTUAL_KUBELET = "virtual-kubelet"
    ADMIRALTY = "admiralty"
    LIQO = "liqo"


#: Provider kinds whose preset cannot pin the virtual node name, its labels and the burst taint, and why.
UNSUPPORTED_PROVIDER_KINDS: dict[ProviderKind, str] = {
    ProviderKind.ADMIRALTY: (
        "kind 'admiralty' has no preset: Admiralty's shared agent names its virtual nodes itself "
        "(admiralty-<namespace>-<target>-<hash>), so nodeName, the external labels and the burst taint "
        "cannot be pinned; use 'liqo' for a peered cluster or 'virtual-kubelet' for a GPU cloud"
    ),
}


class ExternalProvider(ConfigModel):
    """External GPU capacity exposed as one virtual-kubelet node."""

    name: DnsLabel
    kind: ProviderKind
    node_name: DnsLabel
    gpu_model: str = "H100-SXM5-80GB"
    gpus: PositiveInt
    cpu: PositiveInt = 512
    memory_gi: PositiveInt = 4096
    pods: PositiveInt = 500
    image: PinnedImage | None = None
    #: Name of a *secret* config key (``pulumi config set --secret <key> …``) holding the credentials.
    credentials_secret: str
    extra_args: list[str] = Field(default_factory=list)
    region: str = ""
    #: virtual-kubelet: the ``--provider`` name compiled into the provider binary (e.g. ``azure``).
    vk_provider: DnsLabel | None = None
    #: Whether pods on this node get cluster-routable IPs (a Service can reach them). Default per kind:
    #: liqo yes (its network fabric), virtual-kubelet no (a GPU cloud behind its own API).
    pods_routable: bool | None = None
    #: liqo: the peered cluster's ID, this cluster's ID, and this cluster's pod CIDR.
    foreign_cluster_id: DnsLabel | None = None
    home_cluster_id: DnsLabel | None = None
    local_pod_cidr: Annotated[str, Field(pattern=r"^\d{1,3}(\.\d{1,3}){3}/\d{1,2}$")] | None = None
    liqo_namespace: DnsLabel = "liqo"
    #: liqo: the namespace `liqoctl peer` created for this peering; default ``liqo-tenant-<foreignClusterId>``.
    tenant_namespace: DnsLabel | None = None

    @model_validator(mode="after")
    def _kind_fields(self) -> Self:
        if self.kind in UNSUPPORTED_PROVIDER_KINDS:
            raise ValueError(UNSUPPORTED_PROVIDER_KINDS[self.kind])
        if self.kind is ProviderKind.VIRTUAL_KUBELET:
            missing = [k for k, v in (("image", self.image), ("vkProvider", self.vk_provider)) if v is None]
            if missing:
                raise ValueError(
                    f"kind 'virtual-kubelet' needs {' and '.join(missing)}: each virtual-kubelet provider ships "
                    "its own binary, so name the pinned image and its --provider"
                )
        if self.kind is ProviderKind.LIQO:
            missing = [
                k
                for k, v in (
                    ("foreignClusterId", self.foreign_cluster_id),
                    ("homeClusterId", self.home_cluster_id),
                    ("localPodCidr", self.local_pod_cidr),
                )
                if not v
            ]
            if missing:
                raise ValueError(f"kind 'liqo' needs {', '.join(missing)} (see `liqoctl info`)")
        for arg in self.extra_args:
            if not arg.startswith("--"):
                raise ValueError(f"extraArgs entry '{arg}' must be a --flag or --flag=value")
        return self

    @property
    def routable(self) -> bool:
        if self.pods_routable is not None:
            return self.pods_routable
        return self.kind is ProviderKind.LIQO



def providers_problems(cfg: ClusterConfig) -> list[Problem]:
    """Provider names are distinct; each virtual node has its own name, none an on-prem node's."""
    problems = unique_names(enumerate(p.name for p in cfg.providers), "providers", "provider")
    onprem = {node for pool in cfg.pools for node in pool.node_names}
    for index, provider in enumerate(cfg.providers):
        if provider.node_name in onprem:
            problems.append(
                Problem(f"providers[{index}].nodeName", "virtual node name collides with an on-prem node",
                        provider.node_name)
            )
    if len({p.node_name for p in cfg.providers}) != len(cfg.providers):
        problems.append(Problem("providers", "each provider needs its own nodeName"))
    return problems
