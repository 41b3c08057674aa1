"""External GPU providers (virtual nodes) and their check: one distinct virtual node each."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from components.config.base import (
    ConfigModel,
    ContainerRequests,
    DnsLabel,
    DnsSubdomain,
    Ipv4Cidr,
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


#: The NoExecute taint effect in a flag or its value, however a binary spells its taint flags (``--taint``,
#: ``--node-taints``, ``--register-with-taints``: ``key[=value]:NoExecute``, lists, an effect on its own): in any
#: letter case and anywhere in an argument, as the policy pack's `no-noexecute-taints` would refuse it at preview.
NO_EXECUTE = re.compile(r"no-?execute", re.IGNORECASE)
#: A flag whose value, if any, is the next entry (``--taint`` ``key:NoSchedule``, as Go's pflag reads an argv).
_BARE_FLAG = re.compile(r"--?[^=\s]+")


def evicting_arg(args: list[str]) -> str | None:
    """The first argument that names the NoExecute effect, in any form a flag takes (``--flag=value``,
    ``--flag value`` in one entry, or ``--flag`` and its value in the next entry, quoted together); None if none."""
    for index, arg in enumerate(args):
        if NO_EXECUTE.search(arg):
            before = args[index - 1] if index else ""
            flag = before if not arg.startswith("-") and _BARE_FLAG.fullmatch(before) else ""
            return f"{flag} {arg}".strip()
    return None


class ProviderBase(ConfigModel):
    """External GPU capacity exposed as one virtual node; one subclass per kind adds its own keys and checks."""

    name: Annotated[DnsLabel, short_label(3)]
    """Provider name: the `<labelPrefix>/provider` label of its node and part of its virtual kubelet's names
    (`vk-<name>`)."""
    node_name: DnsLabel
    """Name of the virtual node the virtual kubelet registers; no on-prem or system node may have it."""
    gpu_model: LabelValue = "H100-SXM5-80GB"
    """GPU model, set as the `<labelPrefix>/gpu-model` label of the virtual node."""
    gpus: PositiveInt
    """GPUs the virtual node offers (the node-cli capacity file); no inference replica may need more."""
    cpu: PositiveInt = 512
    """CPUs the virtual node reports (the node-cli capacity file; Liqo reports the peered cluster's own)."""
    memory_gi: PositiveInt = 4096
    """Memory the virtual node reports (GiB; the node-cli capacity file)."""
    pods: PositiveInt = 500
    """Pods the virtual node admits (the node-cli capacity file)."""
    kubelet_resources: ContainerRequests = ContainerRequests(cpu="500m", memory="512Mi")
    """The virtual kubelet's own container, on a system node (not the capacity its node reports): it keeps every
    external pod's status and the node's lease."""
    ephemeral_storage_gi: PositiveInt = 2048
    """Ephemeral storage the virtual node reports (GiB; the node-cli capacity file): every pod of ours
    requests some, and a node that reports none is refused by the scheduler for all of them."""
    credentials_secret: str
    """Name of a *secret* config key (`pulumi config set --secret <key> …`) holding the provider's
    credentials; they reach the virtual kubelet through a Secret."""
    image: PinnedImage | None = None
    """The virtual-kubelet image; kinds with a pinned upstream image take this as an override."""
    extra_args: list[str] = Field(default_factory=list)
    """Extra `--flag` or `--flag=value` arguments appended to the virtual kubelet's own; none may set a NoExecute
    taint (it would evict every pod on the virtual node)."""
    region: str = ""
    """The provider's region, given to the virtual kubelet as `PROVIDER_REGION`."""
    price_per_gpu_hour: Annotated[float, Field(ge=0, allow_inf_nan=False)] | None = None
    """What one GPU-hour on this provider costs (US dollars). A burst fills the cheaper providers first
    (inference pods prefer them) and a scale-down empties the dearer ones first; the simulator costs a burst
    with it. Unset: ranked last, not costed."""
    pods_routable: bool | None = None
    """Whether pods on this node get cluster-routable IPs (a Service can reach them); unset: `liqo` yes,
    `virtual-kubelet` no."""

    #: Whether a kind's pods are routable when ``podsRoutable`` is unset.
    ROUTABLE_BY_DEFAULT: ClassVar[bool] = False

    @field_validator("extra_args")
    @classmethod
    def _flags(cls, args: list[str], info: ValidationInfo) -> list[str]:
        written = evicting_arg(args)
        if written is not None:
            who = f"provider '{info.data['name']}'" if "name" in info.data else "the provider"
            raise ValueError(
                f"'{written}' sets a NoExecute taint on the virtual node of {who}: a NoExecute taint evicts "
                "every pod running there at once, and the burst never evicts by taint (the platform sets the "
                "provider's taint as NoSchedule itself); drop the argument")
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
    """`virtual-kubelet`: a GPU cloud behind its own virtual-kubelet provider binary."""
    image: PinnedImage
    """The provider's pinned virtual-kubelet image."""
    vk_provider: DnsLabel
    """The `--provider` name compiled into the provider binary (e.g. `azure`)."""
    kubelet_client_ca_config_map: DnsSubdomain | None = None
    """A ConfigMap in the provider's namespace whose `ca.crt` is the CA of the API server's kubelet client
    certificate, where that is not the cluster CA (the default, as on kubeadm-style clusters): the virtual
    kubelet accepts logs and exec calls only from client certificates of this CA."""


class LiqoProvider(ProviderBase):
    """A peered cluster through Liqo: its network fabric makes pods routable by default."""

    kind: Literal["liqo"]
    """`liqo`: a peered cluster through Liqo, whose network fabric makes pods routable."""
    foreign_cluster_id: DnsLabel
    """The peered cluster's ID (see `liqoctl info`)."""
    home_cluster_id: DnsLabel
    """This cluster's Liqo ID (see `liqoctl info`)."""
    local_pod_cidr: Ipv4Cidr
    """This cluster's pod CIDR, an IPv4 network such as `10.64.0.0/12` (see `liqoctl info`)."""
    liqo_namespace: DnsLabel = "liqo"
    """Namespace Liqo is installed in."""
    tenant_namespace: DnsLabel | None = None
    """The namespace `liqoctl peer` created for this peering, where the virtual kubelet runs;
    `liqo-tenant-<foreignClusterId>` when unset."""
    api_server_support: bool = False
    """Liqo's apiserver support: offloaded pods get tokens of their service accounts, copied into Secrets of the
    peered cluster (its Secret readers can then act as those accounts here). Off unless a service needs it."""

    ROUTABLE_BY_DEFAULT: ClassVar[bool] = True

    def namespace(self, system_namespace: str) -> str:
        return self.tenant_namespace or f"liqo-tenant-{self.foreign_cluster_id}"


class AdmiraltyProvider(ProviderBase):
    """Refused with the reason: Admiralty's shared agent names its virtual nodes itself."""

    kind: Literal["admiralty"]
    """`admiralty`: refused, because Admiralty names its virtual nodes itself; use `liqo` or
    `virtual-kubelet`."""

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
    first: dict[str, int] = {}
    for index, provider in enumerate(cfg.providers):
        earlier = first.setdefault(provider.node_name, index)
        if earlier != index:
            problems.append(Problem(
                f"providers[{index}].nodeName",
                f"provider '{provider.name}' (providers[{index}]) and provider '{cfg.providers[earlier].name}' "
                f"(providers[{earlier}]) both name virtual node '{provider.node_name}'; each provider needs its own "
                "nodeName", provider.node_name))
    return problems
