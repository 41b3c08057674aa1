"""A small training runtime: gang environment, asynchronous atomic checkpoints, resume agreement, metrics.

No framework in the core; ``training_runtime.torch_adapter`` brings PyTorch in when it is installed.
"""

from training_runtime.checkpointer import AsyncCheckpointer, BytesSnapshot, CheckpointWriteError, Snapshot
from training_runtime.collective import Collective, CollectiveTimeout, FileCollective, LocalCollective
from training_runtime.local_cache import LocalShardCache
from training_runtime.manifest import Manifest, ManifestError, parse_manifest
from training_runtime.runtime import Resumed, TrainingRuntime
from training_runtime.settings import DistEnv, Settings, SettingsError
from training_runtime.store import CheckpointCorrupt, CheckpointStore, Published, WorldSizeMismatch

__all__ = [
    "AsyncCheckpointer",
    "BytesSnapshot",
    "CheckpointCorrupt",
    "CheckpointStore",
    "CheckpointWriteError",
    "Collective",
    "CollectiveTimeout",
    "DistEnv",
    "FileCollective",
    "LocalCollective",
    "LocalShardCache",
    "Manifest",
    "ManifestError",
    "Published",
    "Resumed",
    "Settings",
    "SettingsError",
    "Snapshot",
    "TrainingRuntime",
    "WorldSizeMismatch",
    "parse_manifest",
]
