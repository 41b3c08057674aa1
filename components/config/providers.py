"""External GPU providers (virtual nodes) and their check: one distinct virtual node each."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from components.config.base import (
    ConfigModel,
    DnsLabel,
    DnsSubdomain,
    LabelValue,
    PinnedImage,
    PositiveInt,
    Problem,
    register_union,
    short_label,
    unique_names,
)

if TYPE_CHECKING:
    from components.config.cluster import ClusterConfig


class ProviderBase(ConfigModel):
    """External GPU capacity exposed as one virtual node; one subclass per kind adds its own keys and checks."""

    #: Also in the virtual kubelet's names and labels (``vk-<name>``).
    name: Annotated[DnsLabel, short_label(3)]
    node_name: DnsLabel
    gpu_model: LabelValue = "H100-SXM5-80GB"
    gpus: PositiveInt
    cpu: PositiveInt = 512
    memory_gi: PositiveInt = 4096
    pods: PositiveInt = 500
    #: Ephemeral storage the virtual node reports: every pod of ours requests some, and a node that reports
    #: none is refused by the scheduler for all of them.
    ephemeral_storage_gi: PositiveInt = 2048
    #: Name of a *secret* config key (``pulumi config set --secret <key> …``) holding the credentials.
    credentials_secret: str
    #: The virtual-kubelet image; kinds with a pinned upstream image take this as an override.
    image: PinnedImage | None = None
    extra_args: list[str] = Field(default_factory=list)
    region: str = ""
    #: What one GPU-hour on this provider costs (US dollars). A burst fills the cheaper providers first (inference
    #: pods prefer them, `components.provider_rank`); the simulator costs a burst with it. Unset: ranked last,
    #: not costed.
    price_per_gpu_hour: Annotated[float, Field(ge=0, allow_inf_nan=False)] | None = None
    #: Whether pods on this node get cluster-routable IPs (a Service can reach them); default per kind.
    pods_routable: bool | None = None

    #: Whether a kind's pods are routable when ``podsRoutable`` is unset.
    ROUTABLE_BY_DEFAULT: ClassVar[bool] = False

    @field_validator("extra_args")
    @classmethod
    def _flags(cls, args: list[str]) -> list[str]:
        for arg in args:
            if not arg.startswith("--"):
                raise ValueError(f"entry '{arg}' must be a --flag or --flag=value")
        return args

    @property
    def routable(self) -> bool:
        return self.ROUTABLE_BY_DEFAULT if self.pods_routable is None else self.pods_routable

    def namespace(self, system_namespace: str) -> str:
        """Where the provider's virtual kubelet runs."""
        return system_namespace


class VirtualKubeletProvider(ProviderBase):
    """A GPU cloud behind its own API: each virtual-kubelet provider ships its own binary."""

    kind: Literal["virtual-kubelet"]
    #: The provider's pinned virtual-kubelet image.
    image: PinnedImage
    #: The ``--provider`` name compiled into the provider binary (e.g. ``azure``).
    vk_provider: DnsLabel
    #: A ConfigMap in the provider's namespace whose ``ca.crt`` is the CA of the API server's kubelet client
    #: certificate, where that is not the cluster CA (the default, as on kubeadm-style clusters): the virtual
    #: kubelet accepts logs and exec calls only from client certificates of this CA.
    kubelet_client_ca_config_map: DnsSubdomain | None = None


class LiqoProvider(ProviderBase):
    """A peered cluster through Liqo: its network fabric makes pods routable by default."""

    kind: Literal["liqo"]
    #: The peered cluster's ID, this cluster's ID, and this cluster's pod CIDR (see ``liqoctl info``).
    foreign_cluster_id: DnsLabel
    home_cluster_id: DnsLabel
    local_pod_cidr: Annotated[str, Field(pattern=r"^\d{1,3}(\.\d{1,3}){3}/\d{1,2}$")]
    liqo_namespace: DnsLabel = "liqo"
    #: The namespace `liqoctl peer` created for this peering; default ``liqo-tenant-<foreignClusterId>``.
    tenant_namespace: DnsLabel | None = None
    #: Liqo's apiserver support: offloaded pods get tokens of their service accounts, copied into Secrets of the
    #: peered cluster (its Secret readers can then act as those accounts here). Off unless a service needs it.
    api_server_support: bool = False

    ROUTABLE_BY_DEFAULT: ClassVar[bool] = True

    def namespace(self, system_namespace: str) -> str:
        return self.tenant_namespace or f"liqo-tenant-{self.foreign_cluster_id}"


class AdmiraltyProvider(ProviderBase):
    """Refused with the reason: Admiralty's shared agent names its virtual nodes itself."""

    kind: Literal["admiralty"]

    @model_validator(mode="before")
    @classmethod
    def _refused(cls, data: Any) -> Any:
        raise ValueError(
            "kind 'admiralty' has no preset: Admiralty's shared agent names its virtual nodes itself "
            "(admiralty-<namespace>-<target>-<hash>), so nodeName, the external labels and the burst taint "
            "cannot be pinned; use 'liqo' for a peered cluster or 'virtual-kubelet' for a GPU cloud"
        )


#: An external provider, chosen by its ``kind`` key. A new kind is one class above, one member here, and
#: the preset of its binary in ``components/providers.py``.
ExternalProvider = Annotated[
    VirtualKubeletProvider | LiqoProvider | AdmiraltyProvider,
    Field(discriminator="kind"),
]
register_union(ExternalProvider)


def providers_problems(cfg: ClusterConfig) -> list[Problem]:
    """Provider names are distinct; each virtual node has its own name, none an on-prem node's."""
    problems = unique_names(enumerate(p.name for p in cfg.providers), "providers", "provider")
    onprem = {node for pool in cfg.pools for node in pool.node_names}
    system = set(cfg.system_pool.node_names)
    for index, provider in enumerate(cfg.providers):
        if provider.node_name in onprem:
            problems.append(
                Problem(f"providers[{index}].nodeName", "virtual node name collides with an on-prem node",
                        provider.node_name)
            )
        elif provider.node_name in system:
            problems.append(
                Problem(f"providers[{index}].nodeName",
                        f"virtual node name collides with a node of the system pool '{cfg.system_pool.name}'",
                        provider.node_name)
            )
    if len({p.node_name for p in cfg.providers}) != len(cfg.providers):
        problems.append(Problem("providers", "each provider needs its own nodeName"))
    return problems
