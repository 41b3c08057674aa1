"""Typed stack configuration: one schema for the whole cluster, validated before any resource exists.

Every key of ``Pulumi.<stack>.yaml`` under the ``gpu-cluster:`` namespace maps onto a field of
:class:`ClusterConfig`. Defaults encode the operating lessons (78 °C thermal limit, NoSchedule-only
burst taint, gradual return, Retain for checkpoints); cross-field rules reject configurations that
would break the design (inference outranking training, a gang scheduler the cluster version no longer
serves, a node claimed by two pools). :func:`parse_config` turns every problem into a
:class:`ConfigError` naming the key path, the bad value, what was expected and the stack file.

One module per section of the stack file; each holds the section's models and its cross-field check
(``<section>_problems``), and ``cluster.CROSS_CHECKS`` lists those checks. ``base`` holds what every
section shares, ``loading`` the way from the engine's config map to a validated ``ClusterConfig``.
Import from this package (``from components.config import ClusterConfig``), not from the modules.
"""

from agents.node_names import expand_node_names
from components.config.admission import Admission, MutatingMode
from components.config.base import (
    PROJECT,
    TAGGED_UNIONS,
    DnsLabel,
    NonEmptyStr,
    NonNegativeInt,
    PinnedImage,
    PositiveInt,
    Problem,
    TaggedUnion,
)
from components.config.burst import (
    Burst,
    Handover,
)
from components.config.checkpoint import (
    LUSTRE_PARAMETER_KEYS,
    LUSTRE_THROUGHPUT_TIERS,
    Checkpoint,
    CheckpointBudget,
    Filesystem,
    FilesystemBase,
    LustreFilesystem,
    NfsFilesystem,
    StaticFilesystem,
    ThroughputCheck,
    VastFilesystem,
    WekaFilesystem,
)
from components.config.cluster import (
    CROSS_CHECKS,
    ClusterConfig,
    cross_check,
)
from components.config.descheduler import (
    Descheduler,
)
from components.config.inference import (
    FORECAST_INTERVAL_SECONDS,
    Forecast,
    GatewayRef,
    Inference,
    InferenceService,
    MetricsAdapter,
    Scaling,
    ScalingMetric,
    Traffic,
    TrafficShape,
)
from components.config.loading import (
    ConfigError,
    load_stack,
    parse_config,
    plain_values,
    problems_from_validation,
    raw_from_pulumi_config,
    stack_path,
)
from components.config.observability import (
    Observability,
)
from components.config.pools import (
    GPU_HARDWARE_LIMITS_CELSIUS,
    GpuPool,
    SystemPool,
)
from components.config.priorities import (
    MAX_PRIORITY_VALUE,
    Priorities,
    PriorityTier,
    TierName,
)
from components.config.providers import (
    AdmiraltyProvider,
    ExternalProvider,
    LiqoProvider,
    ProviderBase,
    VirtualKubeletProvider,
)
from components.config.scheduling import (
    SCHEDULER_K8S_SUPPORT,
    Queue,
    Scheduling,
    SchedulingEngine,
    Team,
)
from components.config.topology import (
    LEAF_TIER,
    SPINE_TIER,
    TIER_NAMES,
    Leaf,
    PoolTopology,
    Spine,
    TopologyMode,
    fewest_leaves,
    gang_tier,
    nodes_for,
)
from components.config.training import (
    CheckpointMount,
    Nccl,
    RestartInPlace,
    Training,
    TrainingJob,
)

__all__ = [
    "CROSS_CHECKS",
    "FORECAST_INTERVAL_SECONDS",
    "GPU_HARDWARE_LIMITS_CELSIUS",
    "LEAF_TIER",
    "LUSTRE_PARAMETER_KEYS",
    "LUSTRE_THROUGHPUT_TIERS",
    "MAX_PRIORITY_VALUE",
    "PROJECT",
    "SCHEDULER_K8S_SUPPORT",
    "SPINE_TIER",
    "TAGGED_UNIONS",
    "TIER_NAMES",
    "AdmiraltyProvider",
    "Admission",
    "Burst",
    "Checkpoint",
    "CheckpointBudget",
    "CheckpointMount",
    "ClusterConfig",
    "ConfigError",
    "Descheduler",
    "DnsLabel",
    "ExternalProvider",
    "Filesystem",
    "FilesystemBase",
    "Forecast",
    "GatewayRef",
    "GpuPool",
    "Handover",
    "Inference",
    "InferenceService",
    "Leaf",
    "LiqoProvider",
    "LustreFilesystem",
    "MetricsAdapter",
    "MutatingMode",
    "Nccl",
    "NfsFilesystem",
    "NonEmptyStr",
    "NonNegativeInt",
    "Observability",
    "PinnedImage",
    "PoolTopology",
    "PositiveInt",
    "Priorities",
    "PriorityTier",
    "Problem",
    "ProviderBase",
    "Queue",
    "RestartInPlace",
    "Scaling",
    "ScalingMetric",
    "Scheduling",
    "SchedulingEngine",
    "Spine",
    "StaticFilesystem",
    "SystemPool",
    "TaggedUnion",
    "Team",
    "ThroughputCheck",
    "TierName",
    "TopologyMode",
    "Traffic",
    "TrafficShape",
    "Training",
    "TrainingJob",
    "VastFilesystem",
    "VirtualKubeletProvider",
    "WekaFilesystem",
    "cross_check",
    "expand_node_names",
    "fewest_leaves",
    "gang_tier",
    "load_stack",
    "nodes_for",
    "parse_config",
    "plain_values",
    "problems_from_validation",
    "raw_from_pulumi_config",
    "stack_path",
]
