"""Checkpoint filesystems (one model per backend), the time budget, the throughput check, and their checks."""

from __future__ import annotations

import re
from abc import abstractmethod
from typing import TYPE_CHECKING, Annotated, ClassVar, Literal, Self

from pydantic import Field, field_validator, model_validator

from components.config.base import (
    DNS_SUBDOMAIN,
    ConfigModel,
    DnsLabel,
    NonEmptyStr,
    PinnedImage,
    PositiveInt,
    Problem,
    register_union,
    unique_names,
)
from components.config.sizing import requirement_from_budget, sizing_problems
from components.naming import checkpoint_claim_name

if TYPE_CHECKING:
    from components.config.cluster import ClusterConfig


#: FSx for Lustre throughput tiers (MB/s per TiB of storage) by deployment type. SCRATCH types are
#: absent on purpose: their data is not replicated, and a checkpoint must survive a file server loss.
LUSTRE_THROUGHPUT_TIERS: dict[str, tuple[int, ...]] = {
    "PERSISTENT_1": (50, 100, 200),
    "PERSISTENT_2": (125, 250, 500, 1000),
}

#: StorageClass parameters the FSx CSI driver accepts; it refuses CreateVolume on any other key
#: (keys prefixed ``csi.storage.k8s.io/`` are the external provisioner's and always allowed).
LUSTRE_PARAMETER_KEYS = frozenset({
    "subnetId", "securityGroupIds", "deploymentType", "perUnitStorageThroughput", "autoImportPolicy",
    "s3ImportPath", "s3ExportPath", "kmsKeyId", "storageType", "driveCacheType",
    "automaticBackupRetentionDays", "dailyAutomaticBackupStartTime", "copyTagsToBackups",
    "dataCompressionType", "weeklyMaintenanceStartTime", "fileSystemTypeVersion", "extraTags",
    "efaEnabled", "metadataConfigurationMode", "metadataIops",
})

_SUBNET = re.compile(r"^subnet-[0-9a-f]{8,17}$")
_SECURITY_GROUP = re.compile(r"^sg-[0-9a-f]{8,17}$")


class FilesystemBase(ConfigModel):
    """What every checkpoint filesystem has; one subclass per backend adds its own keys and checks.

    ``renamedFrom`` lists earlier names of this entry, oldest first. The Kubernetes objects keep the
    oldest name (a PVC cannot be renamed; a new name would be a new, empty volume) and the Pulumi
    resources carry aliases to the earlier logical names, so renaming an entry is a no-op diff.
    A key of another backend is rejected as unknown here (``extra="forbid"``); the loader names its backend.
    """

    name: DnsLabel
    """Name training jobs and the throughput check use for this filesystem; its objects are named
    `checkpoints-<name>` after the oldest name (`renamedFrom[0]`)."""
    capacity_gi: PositiveInt = 102_400
    """Storage the claim requests (GiB); for FSx for Lustre 1200 or a multiple of 2400."""
    write_gbps: Annotated[float, Field(gt=0)]
    """Sustained aggregate write bandwidth the backend is sized for (GB/s): checked against the checkpoint
    budget, and it sizes the workers' termination grace for an emergency checkpoint."""
    mount_options: list[str] = Field(default_factory=list)
    """`mountOptions` of the StorageClass (or of the static volume)."""
    renamed_from: list[DnsLabel] = Field(default_factory=list)
    """Earlier names of this entry, oldest first: the objects keep the oldest name and the resources alias the
    others, so a rename changes nothing in the cluster."""
    extra_parameters: dict[str, str] = Field(default_factory=dict)
    """Extra StorageClass parameters (an escape hatch); they may add keys but not override the typed ones."""

    #: The backend's CSI driver (StorageClass ``provisioner``); a static volume names its own.
    DRIVER: ClassVar[str] = ""

    @property
    def object_name(self) -> str:
        """The name the Kubernetes objects carry: the oldest name, stable across renames."""
        return checkpoint_claim_name(self.renamed_from[0] if self.renamed_from else self.name)

    @property
    def driver_name(self) -> str:
        return self.DRIVER

    @property
    def dynamic(self) -> bool:
        """Whether the driver provisions the volume from a StorageClass (else a pre-provisioned volume)."""
        return True

    @abstractmethod
    def driver_parameters(self) -> dict[str, str]:
        """The driver's own StorageClass parameters (values are strings, as the API wants)."""

    def storage_class_parameters(self) -> dict[str, str]:
        """The driver's parameters plus ``extraParameters``, which may add keys but never override one."""
        params = self.driver_parameters()
        clashes = sorted(set(self.extra_parameters) & set(params))
        if clashes:
            raise ValueError(f"extraParameters {clashes} would override typed fields of '{self.name}'")
        return {**params, **self.extra_parameters}

    @model_validator(mode="after")
    def _not_renamed_from_itself(self) -> Self:
        if self.name in self.renamed_from:
            raise ValueError(f"renamedFrom must list earlier names, not the current name '{self.name}'")
        if self.dynamic:
            clashes = sorted(set(self.extra_parameters) & set(self.driver_parameters()))
            if clashes:
                raise ValueError(f"extraParameters {clashes} would override typed fields of '{self.name}'")
        return self


class NfsFilesystem(FilesystemBase):
    """An NFS export through csi-driver-nfs."""

    backend: Literal["nfs"]
    """`nfs`: an NFS export through csi-driver-nfs."""
    server: NonEmptyStr
    """Host name or address of the NFS server."""
    share: NonEmptyStr
    """Absolute export path under which the driver creates one directory per volume."""

    DRIVER: ClassVar[str] = "nfs.csi.k8s.io"

    @field_validator("share")
    @classmethod
    def _absolute_share(cls, share: str) -> str:
        if not share.startswith("/"):
            raise ValueError("must be an absolute export path such as '/exports/checkpoints'")
        return share

    def driver_parameters(self) -> dict[str, str]:
        # onDelete=retain: even if a PV's reclaim policy were changed to Delete, the driver keeps the directory.
        return {"server": self.server, "share": self.share, "onDelete": "retain"}


class LustreFilesystem(FilesystemBase):
    """FSx for Lustre through the FSx CSI driver: persistent deployment types only, sized in FSx steps."""

    backend: Literal["lustre"]
    """`lustre`: FSx for Lustre through the FSx CSI driver."""
    subnet_id: NonEmptyStr
    """The one subnet FSx places the filesystem in (`subnet-…`)."""
    security_group_ids: Annotated[list[str], Field(min_length=1)]
    """Security groups of the filesystem's network interfaces (`sg-…`)."""
    deployment_type: str = "PERSISTENT_2"
    """`PERSISTENT_1` or `PERSISTENT_2`; SCRATCH types are refused because they do not replicate data."""
    per_unit_storage_throughput: PositiveInt
    """Throughput per TiB of storage (MB/s), one of the deployment type's tiers; with `capacityGi` it bounds
    `writeGbps`."""

    DRIVER: ClassVar[str] = "fsx.csi.aws.com"

    @model_validator(mode="after")
    def _fsx_rules(self) -> Self:
        if not _SUBNET.match(self.subnet_id):
            raise ValueError(f"subnetId must be one subnet id like 'subnet-0abc1234' (got '{self.subnet_id}'); "
                             "FSx for Lustre takes exactly one subnet")
        bad = [g for g in self.security_group_ids if not _SECURITY_GROUP.match(g)]
        if bad:
            raise ValueError(f"securityGroupIds must be ids like 'sg-0abc1234' (got {bad})")
        kind = self.deployment_type
        if kind.startswith("SCRATCH"):
            raise ValueError(f"deploymentType '{kind}' does not replicate data; checkpoints need "
                             f"one of {sorted(LUSTRE_THROUGHPUT_TIERS)}")
        if kind not in LUSTRE_THROUGHPUT_TIERS:
            raise ValueError(f"deploymentType must be one of {sorted(LUSTRE_THROUGHPUT_TIERS)} (got '{kind}')")
        tiers = LUSTRE_THROUGHPUT_TIERS[kind]
        if self.per_unit_storage_throughput not in tiers:
            raise ValueError(f"perUnitStorageThroughput for {kind} must be one of {list(tiers)} MB/s/TiB "
                             f"(got {self.per_unit_storage_throughput})")
        if self.capacity_gi != 1200 and self.capacity_gi % 2400:
            raise ValueError(f"capacityGi for FSx for Lustre must be 1200 or a multiple of 2400 "
                             f"(got {self.capacity_gi})")
        if self.write_gbps > self.provisioned_gbps:
            raise ValueError(f"writeGbps ({self.write_gbps:g}) exceeds what FSx provisions for capacityGi × "
                             f"perUnitStorageThroughput ({self.provisioned_gbps:.1f} GB/s)")
        unknown = sorted(k for k in self.extra_parameters
                         if k not in LUSTRE_PARAMETER_KEYS and not k.startswith("csi.storage.k8s.io/"))
        if unknown:
            raise ValueError(f"extraParameters {unknown} are not FSx CSI StorageClass parameters; "
                             "the driver would refuse to provision")
        return self

    @property
    def provisioned_gbps(self) -> float:
        """FSx for Lustre throughput: storage TiB × MB/s per TiB, in GB/s."""
        return self.capacity_gi / 1024 * self.per_unit_storage_throughput / 1000

    def driver_parameters(self) -> dict[str, str]:
        return {
            "subnetId": self.subnet_id,
            "securityGroupIds": ",".join(self.security_group_ids),
            "deploymentType": self.deployment_type,
            "perUnitStorageThroughput": str(self.per_unit_storage_throughput),
        }


#: The stages at which the WEKA CSI plugin reads its API credentials; one secret serves them all.
WEKA_SECRET_STAGES = ("provisioner", "controller-publish", "controller-expand", "node-stage", "node-publish")


class WekaFilesystem(FilesystemBase):
    """A WEKA filesystem through csi-wekafs (3.0 removed the unauthenticated mode: the API secret is required)."""

    backend: Literal["weka"]
    """`weka`: a WEKA filesystem through csi-wekafs."""
    filesystem_name: NonEmptyStr
    """The WEKA filesystem whose directories the volumes are (`filesystemName`, volume type `dir/v1`)."""
    api_secret_name: DnsLabel
    """Secret holding the WEKA API credentials, which the CSI plugin reads at every stage."""
    api_secret_namespace: DnsLabel = "csi-wekafs"
    """Namespace of that Secret."""
    capacity_enforcement: Literal["HARD", "SOFT"] = "HARD"
    """Whether a volume's capacity is a hard or a soft quota (`capacityEnforcement`)."""

    DRIVER: ClassVar[str] = "csi.weka.io"

    def driver_parameters(self) -> dict[str, str]:
        params = {"volumeType": "dir/v1", "filesystemName": self.filesystem_name,
                  "capacityEnforcement": self.capacity_enforcement}
        for stage in WEKA_SECRET_STAGES:
            params[f"csi.storage.k8s.io/{stage}-secret-name"] = self.api_secret_name
            params[f"csi.storage.k8s.io/{stage}-secret-namespace"] = self.api_secret_namespace
        return params


class VastFilesystem(FilesystemBase):
    """A VAST view through the VAST CSI driver, spread over a VIP pool."""

    backend: Literal["vast"]
    """`vast`: a VAST view through the VAST CSI driver."""
    vip_pool: NonEmptyStr
    """VIP pool the driver spreads the mounts over (`vip_pool_name`)."""
    root_export: NonEmptyStr
    """Absolute export path under which the driver creates the volumes (`root_export`)."""
    view_policy: NonEmptyStr
    """VAST view policy of the volumes' views (`view_policy`)."""
    lb_strategy: Literal["roundrobin", "random"] = "roundrobin"
    """How the driver picks a VIP of the pool for each mount (`lb_strategy`)."""

    DRIVER: ClassVar[str] = "csi.vastdata.com"

    @field_validator("root_export")
    @classmethod
    def _absolute_export(cls, root_export: str) -> str:
        if not root_export.startswith("/"):
            raise ValueError("must be an absolute path such as '/k8s'")
        return root_export

    def driver_parameters(self) -> dict[str, str]:
        return {"vip_pool_name": self.vip_pool, "root_export": self.root_export, "view_policy": self.view_policy,
                "lb_strategy": self.lb_strategy}


class StaticFilesystem(FilesystemBase):
    """A pre-provisioned volume of any CSI driver, bound to its claim; no StorageClass."""

    backend: Literal["static"]
    """`static`: a pre-provisioned volume of any CSI driver, without a StorageClass."""
    driver: NonEmptyStr
    """Name of the volume's CSI driver, e.g. `spectrumscale.csi.ibm.com`."""
    volume_handle: NonEmptyStr
    """The volume's id in its driver (`csi.volumeHandle`)."""
    volume_attributes: dict[str, str] = Field(default_factory=dict)
    """The driver's settings for the volume (`csi.volumeAttributes`)."""

    @field_validator("driver")
    @classmethod
    def _driver_name(cls, driver: str) -> str:
        if not DNS_SUBDOMAIN.match(driver):
            raise ValueError("must be a CSI driver name such as 'spectrumscale.csi.ibm.com'")
        return driver

    @model_validator(mode="after")
    def _no_class_parameters(self) -> Self:
        if self.extra_parameters:
            raise ValueError("extraParameters apply to StorageClasses; a static volume takes volumeAttributes")
        return self

    @property
    def driver_name(self) -> str:
        return self.driver

    @property
    def dynamic(self) -> bool:
        return False

    def driver_parameters(self) -> dict[str, str]:
        """None: a static volume has no StorageClass (its driver settings are ``volumeAttributes``)."""
        return {}


#: A checkpoint filesystem, chosen by its ``backend`` key. A new backend is one class above and one member here.
Filesystem = Annotated[
    NfsFilesystem | LustreFilesystem | WekaFilesystem | VastFilesystem | StaticFilesystem,
    Field(discriminator="backend"),
]
register_union(Filesystem)


class CheckpointBudget(ConfigModel):
    """How fast a checkpoint must land: ``sizeTb`` (decimal TB) in ``seconds`` from ``writers`` ranks."""

    size_tb: Annotated[float, Field(gt=0)] = 1.0
    """Size of one checkpoint (decimal TB)."""
    seconds: Annotated[float, Field(gt=0)] = 30.0
    """Time one checkpoint may take to land (seconds); the CheckpointOverBudget alert fires past it."""
    writers: PositiveInt = 256
    """Ranks writing one checkpoint in parallel: each one's share of the bandwidth must fit one client link."""
    client_link_gbps: Annotated[float, Field(gt=0)] = 50.0
    """One client's link (GB/s): an NDR 400 Gb/s port moves about 50 GB/s."""

    @property
    def aggregate_gbps(self) -> float:
        """The bandwidth one checkpoint needs to land in time (GB/s): what the throughput check must reach."""
        return requirement_from_budget(self).aggregate_gbps


class ThroughputCheck(ConfigModel):
    """The fio check: ``nodes`` × ``writersPerNode`` concurrent writers, each ``sizePerWriterGi``."""

    enabled: bool = False
    """Measure `filesystem` with fio from the GPU nodes, against the checkpoint budget."""
    filesystem: DnsLabel | None = None
    """Name of the checkpoint filesystem to measure; required when enabled."""
    pool: DnsLabel | None = None
    """GPU pool the writers run on; the first pool when unset."""
    nodes: PositiveInt = 8
    """Nodes the check runs on, one pod each holding all the node's GPUs so nothing else shares its links."""
    writers_per_node: PositiveInt = 8
    """Concurrent fio writers per node (`--numjobs`)."""
    size_per_writer_gi: PositiveInt = 16
    """Data each writer writes (GiB), one file each, removed afterwards."""
    weekly: bool = False
    """Run weekly (a CronJob at a per-stack random minute, hour and day) instead of once per change."""
    deadline_seconds: PositiveInt = 3600
    """Longest one run may take (the Job's `activeDeadlineSeconds`), and how long the reducer waits for every
    node's result (seconds)."""
    image: PinnedImage | None = None
    """Image carrying fio and the reducer; the pinned checkpoint-check agent image when unset."""


class Checkpoint(ConfigModel):
    filesystems: list[Filesystem] = Field(default_factory=list)
    """Shared filesystems for checkpoints, each chosen by its `backend`; their claims and volumes are never
    deleted or replaced by the stack."""
    budget: CheckpointBudget = CheckpointBudget()
    """How fast one checkpoint must land; every filesystem is checked against it."""
    strict: bool = False
    """Fail validation (instead of warning) when a filesystem cannot meet the budget."""
    throughput_check: ThroughputCheck = ThroughputCheck()
    """A fio job that measures one filesystem's write bandwidth from the GPU nodes."""


def checkpoint_problems(cfg: ClusterConfig) -> list[Problem]:
    """Distinct names and claims, the sizing budget (strict only), the throughput check's pool, nodes, filesystem."""
    filesystems = cfg.checkpoint.filesystems
    problems = unique_names(enumerate(f.name for f in filesystems), "checkpoint.filesystems", "filesystem")
    problems += [Problem(path, message, value) for path, message, value in sizing_problems(cfg, strict_only=True)]
    check = cfg.checkpoint.throughput_check
    if check.enabled:
        pool_names = [p.name for p in cfg.pools]
        pool = check.pool or pool_names[0]
        if pool not in pool_names:
            problems.append(Problem("checkpoint.throughputCheck.pool",
                                    f"unknown pool; expected one of {sorted(pool_names)}", pool))
        elif check.nodes > len(cfg.pool(pool).node_names):
            problems.append(Problem("checkpoint.throughputCheck.nodes",
                                    f"pool '{pool}' has only {len(cfg.pool(pool).node_names)} nodes", check.nodes))
        fs_names = {f.name for f in filesystems}
        if check.filesystem not in fs_names:
            problems.append(
                Problem("checkpoint.throughputCheck.filesystem",
                        f"must name a declared filesystem; expected one of {sorted(fs_names)}", check.filesystem)
            )
    names = [f.object_name for f in filesystems]
    for index, fs in enumerate(filesystems):
        if names.count(fs.object_name) > 1:
            problems.append(Problem(f"checkpoint.filesystems[{index}].renamedFrom",
                                    f"two filesystems would own the claim '{fs.object_name}'", fs.name))
    return problems

