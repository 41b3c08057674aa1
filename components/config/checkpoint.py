"""Checkpoint filesystems per backend, the time budget, the throughput check, and their checks."""

from __future__ import annotations

import re
from enum import StrEnum
from typing import TYPE_CHECKING, Annotated, Literal, Self

from pydantic import Field, model_validator

from components.checkpoint_sizing import sizing_problems
from components.config.base import (
    DNS_SUBDOMAIN,
    ConfigModel,
    DnsLabel,
    PinnedImage,
    PositiveInt,
    Problem,
    unique_names,
)
from components.naming import checkpoint_claim_name

if TYPE_CHECKING:
    from components.config.cluster import ClusterConfig


class CheckpointBackend(StrEnum):
    NFS = "nfs"
    LUSTRE = "lustre"
    WEKA = "weka"
    VAST = "vast"
    STATIC = "static"


#: The CSI driver (StorageClass ``provisioner``) behind each dynamically provisioned backend.
CHECKPOINT_DRIVERS: dict[CheckpointBackend, str] = {
    CheckpointBackend.NFS: "nfs.csi.k8s.io",
    CheckpointBackend.LUSTRE: "fsx.csi.aws.com",
    CheckpointBackend.WEKA: "csi.weka.io",
    CheckpointBackend.VAST: "csi.vastdata.com",
}

#: Backend-specific keys (camelCase, as in the stack file) and the backend each belongs to; a key set
#: on another backend is a mistake the driver would silently ignore (or, for FSx, reject at provision).
_BACKEND_KEYS: dict[str, CheckpointBackend] = {
    "server": CheckpointBackend.NFS,
    "share": CheckpointBackend.NFS,
    "subnetId": CheckpointBackend.LUSTRE,
    "securityGroupIds": CheckpointBackend.LUSTRE,
    "deploymentType": CheckpointBackend.LUSTRE,
    "perUnitStorageThroughput": CheckpointBackend.LUSTRE,
    "filesystemName": CheckpointBackend.WEKA,
    "apiSecretName": CheckpointBackend.WEKA,
    "vipPool": CheckpointBackend.VAST,
    "rootExport": CheckpointBackend.VAST,
    "viewPolicy": CheckpointBackend.VAST,
    "driver": CheckpointBackend.STATIC,
    "volumeHandle": CheckpointBackend.STATIC,
    "volumeAttributes": CheckpointBackend.STATIC,
}

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


class Filesystem(ConfigModel):
    """A shared filesystem for checkpoints. Backend-specific fields are checked per backend.

    ``renamedFrom`` lists earlier names of this entry, oldest first. The Kubernetes objects keep the
    oldest name (a PVC cannot be renamed; a new name would be a new, empty volume) and the Pulumi
    resources carry aliases to the earlier logical names, so renaming an entry is a no-op diff.
    """

    name: DnsLabel
    backend: CheckpointBackend
    capacity_gi: PositiveInt = 102_400
    #: Sustained aggregate write bandwidth the backend is sized for (GB/s).
    write_gbps: Annotated[float, Field(gt=0)]
    mount_options: list[str] = Field(default_factory=list)
    renamed_from: list[DnsLabel] = Field(default_factory=list)
    #: Extra StorageClass parameters (escape hatch); may not override the typed ones.
    extra_parameters: dict[str, str] = Field(default_factory=dict)
    # nfs
    server: str | None = None
    share: str | None = None
    # lustre (FSx for Lustre)
    subnet_id: str | None = None
    security_group_ids: list[str] = Field(default_factory=list)
    deployment_type: str | None = None
    per_unit_storage_throughput: PositiveInt | None = None
    # weka
    filesystem_name: str | None = None
    api_secret_name: DnsLabel | None = None
    api_secret_namespace: DnsLabel = "csi-wekafs"
    capacity_enforcement: Literal["HARD", "SOFT"] = "HARD"
    # vast
    vip_pool: str | None = None
    root_export: str | None = None
    view_policy: str | None = None
    lb_strategy: Literal["roundrobin", "random"] = "roundrobin"
    # static
    driver: str | None = None
    volume_handle: str | None = None
    volume_attributes: dict[str, str] = Field(default_factory=dict)

    @property
    def object_name(self) -> str:
        """The name the Kubernetes objects carry: the oldest name, stable across renames."""
        return checkpoint_claim_name(self.renamed_from[0] if self.renamed_from else self.name)

    @property
    def driver_name(self) -> str:
        if self.backend is CheckpointBackend.STATIC:
            assert self.driver is not None
            return self.driver
        return CHECKPOINT_DRIVERS[self.backend]

    @model_validator(mode="after")
    def _backend_fields(self) -> Self:
        backend = self.backend
        for key, owner in _BACKEND_KEYS.items():
            if owner is not backend and getattr(self, _snake(key)) not in (None, [], {}):
                raise ValueError(f"{key} applies only to backend '{owner}', not '{backend}'")
        if self.name in self.renamed_from:
            raise ValueError(f"renamedFrom must list earlier names, not the current name '{self.name}'")
        check = {
            CheckpointBackend.NFS: self._nfs,
            CheckpointBackend.LUSTRE: self._lustre,
            CheckpointBackend.WEKA: self._weka,
            CheckpointBackend.VAST: self._vast,
            CheckpointBackend.STATIC: self._static,
        }[backend]
        check()
        return self

    def _require(self, *keys: str) -> None:
        missing = [k for k in keys if not getattr(self, _snake(k))]
        if missing:
            raise ValueError(f"backend '{self.backend}' needs {' and '.join(missing)}")

    def _nfs(self) -> None:
        self._require("server", "share")
        assert self.share is not None
        if not self.share.startswith("/"):
            raise ValueError(f"share must be an absolute export path such as '/exports/checkpoints' "
                             f"(got '{self.share}')")

    def _lustre(self) -> None:
        self._require("subnetId", "securityGroupIds", "perUnitStorageThroughput")
        if not _SUBNET.match(self.subnet_id or ""):
            raise ValueError(f"subnetId must be one subnet id like 'subnet-0abc1234' (got '{self.subnet_id}'); "
                             "FSx for Lustre takes exactly one subnet")
        bad = [g for g in self.security_group_ids if not _SECURITY_GROUP.match(g)]
        if bad:
            raise ValueError(f"securityGroupIds must be ids like 'sg-0abc1234' (got {bad})")
        kind = self.deployment_type or "PERSISTENT_2"
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
        provisioned = self.lustre_provisioned_gbps
        if provisioned is not None and self.write_gbps > provisioned:
            raise ValueError(f"writeGbps ({self.write_gbps:g}) exceeds what FSx provisions for capacityGi × "
                             f"perUnitStorageThroughput ({provisioned:.1f} GB/s)")
        unknown = sorted(k for k in self.extra_parameters
                         if k not in LUSTRE_PARAMETER_KEYS and not k.startswith("csi.storage.k8s.io/"))
        if unknown:
            raise ValueError(f"extraParameters {unknown} are not FSx CSI StorageClass parameters; "
                             "the driver would refuse to provision")

    @property
    def lustre_provisioned_gbps(self) -> float | None:
        """FSx for Lustre throughput: storage TiB × MB/s per TiB, in GB/s."""
        if self.backend is not CheckpointBackend.LUSTRE or self.per_unit_storage_throughput is None:
            return None
        return self.capacity_gi / 1024 * self.per_unit_storage_throughput / 1000

    def _weka(self) -> None:
        # WEKA CSI 3.0 removed the unauthenticated mode: every class references the API secret.
        self._require("filesystemName", "apiSecretName")

    def _vast(self) -> None:
        self._require("vipPool", "rootExport", "viewPolicy")
        assert self.root_export is not None
        if not self.root_export.startswith("/"):
            raise ValueError(f"rootExport must be an absolute path such as '/k8s' (got '{self.root_export}')")

    def _static(self) -> None:
        self._require("driver", "volumeHandle")
        assert self.driver is not None
        if not DNS_SUBDOMAIN.match(self.driver):
            raise ValueError(f"driver must be a CSI driver name such as 'spectrumscale.csi.ibm.com' "
                             f"(got '{self.driver}')")
        if self.extra_parameters:
            raise ValueError("extraParameters apply to StorageClasses; a static volume takes volumeAttributes")


def _snake(key: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", key).lower()


class CheckpointBudget(ConfigModel):
    """How fast a checkpoint must land: ``sizeTb`` (decimal TB) in ``seconds`` from ``writers`` ranks."""

    size_tb: Annotated[float, Field(gt=0)] = 1.0
    seconds: Annotated[float, Field(gt=0)] = 30.0
    writers: PositiveInt = 256
    #: One client's link (GB/s): an NDR 400 Gb/s port moves about 50 GB/s.
    client_link_gbps: Annotated[float, Field(gt=0)] = 50.0


class ThroughputCheck(ConfigModel):
    """The fio check: ``nodes`` × ``writersPerNode`` concurrent writers, each ``sizePerWriterGi``."""

    enabled: bool = False
    filesystem: DnsLabel | None = None
    #: GPU pool the writers run on; default the first pool.
    pool: DnsLabel | None = None
    nodes: PositiveInt = 8
    writers_per_node: PositiveInt = 8
    size_per_writer_gi: PositiveInt = 16
    #: Run weekly (CronJob at a per-stack random minute/hour/day) instead of once per change.
    weekly: bool = False
    deadline_seconds: PositiveInt = 3600
    #: Image carrying fio and the reducer; default the pinned checkpoint-check agent image.
    image: PinnedImage | None = None


class Checkpoint(ConfigModel):
    filesystems: list[Filesystem] = Field(default_factory=list)
    budget: CheckpointBudget = CheckpointBudget()
    #: Fail validation (instead of warning) when a filesystem cannot meet the budget.
    strict: bool = False
    throughput_check: ThroughputCheck = ThroughputCheck()


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

