"""Settings of the burst controller, loaded from the ConfigMap the deploying component mounts.

Every knob has a default that encodes the design (NoSchedule-only taint, asymmetric hysteresis);
a bad value fails at start with an error that names the key and the file, never later at runtime.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

POD_DELETION_COST_ANNOTATION = "controller.kubernetes.io/pod-deletion-cost"
"""Upstream annotation the ReplicaSet controller reads to choose which pods go first on scale-down."""


class SettingsError(ValueError):
    """A settings value is missing, unknown or out of range; the message names the key."""


@dataclass(frozen=True)
class BurstSettings:
    """All tunables of the controller; thresholds are GPU counts, durations are seconds."""

    label_prefix: str = "gpucluster.io"
    # Empty means "<label_prefix>/burst"; resolved in __post_init__ so the key follows the prefix.
    taint_key: str = ""
    taint_value: str = "closed"
    gpu_resource: str = "nvidia.com/gpu"
    # Hysteresis band: open below `open_below_free_gpus`, close at `close_at_free_gpus` + GPUs in use
    # externally. The gap between the two is what keeps the taint from flapping.
    open_below_free_gpus: int = 1
    close_at_free_gpus: int = 8
    open_hold_seconds: float = 60.0
    close_hold_seconds: float = 600.0
    pending_grace_seconds: float = 30.0
    external_deletion_cost: int = -100
    max_cost_patches_per_cycle: int = 50
    resync_seconds: float = 300.0
    tick_seconds: float = 5.0
    stale_after_seconds: float = 120.0
    watch_timeout_seconds: int = 60
    namespace: str = "gpu-burst"
    lease_name: str = "burst-controller"
    lease_duration_seconds: float = 15.0
    renew_deadline_seconds: float = 10.0
    retry_period_seconds: float = 2.0
    event_namespace: str = "default"
    request_timeout_seconds: float = 10.0
    api_retry_attempts: int = 5
    backoff_base_seconds: float = 0.5
    backoff_max_seconds: float = 10.0
    # Make-before-break handover: inference service -> minReplicas. Training pods carry the handover
    # scheduling gate; the controller scales each service's standby Deployment on virtual nodes until the
    # replicas a gang (or the return home) is about to take away are covered, and only then lifts the gate
    # or closes the burst. Empty: no standby is managed and gated pods are released at once.
    handover_services: dict[str, int] = field(default_factory=dict)
    # Training outranks inference: a gate is lifted after this long even if the standby is not ready.
    handover_timeout_seconds: float = 300.0
    # "current": the standby replaces every replica at risk up to the service's current count (capacity is
    # kept); "minimum": only up to minReplicas (the floor is kept, fewer external GPUs).
    handover_cover: str = "current"
    inference_namespace: str = "inference"
    # Derived names, filled from label_prefix.
    pool_label: str = field(default="", init=False)
    location_label: str = field(default="", init=False)
    provider_label: str = field(default="", init=False)
    workload_label: str = field(default="", init=False)
    thermal_taint_key: str = field(default="", init=False)
    changed_at_annotation: str = field(default="", init=False)
    service_label: str = field(default="", init=False)
    role_label: str = field(default="", init=False)
    handover_gate: str = field(default="", init=False)

    def __post_init__(self) -> None:
        p = self.label_prefix
        derived = {
            "pool_label": f"{p}/pool",
            "location_label": f"{p}/location",
            "provider_label": f"{p}/provider",
            "workload_label": f"{p}/workload",
            "thermal_taint_key": f"{p}/thermal",
            "changed_at_annotation": f"{p}/burst-changed-at",
            "service_label": f"{p}/service",
            "role_label": f"{p}/role",
            "handover_gate": f"{p}/handover",
        }
        for name, value in derived.items():
            object.__setattr__(self, name, value)
        if not self.taint_key:
            object.__setattr__(self, "taint_key", f"{p}/burst")
        self._validate()

    def _validate(self) -> None:
        if not self.label_prefix or "/" in self.label_prefix:
            raise SettingsError(f"label_prefix: must be a DNS prefix without '/', got {self.label_prefix!r}")
        if "/" not in self.taint_key:
            raise SettingsError(f"taint_key: must look like '<prefix>/<name>', got {self.taint_key!r}")
        if self.taint_key.startswith("virtual-kubelet.io/"):
            raise SettingsError("taint_key: the provider's own taint is not ours to manage")
        for name in ("open_below_free_gpus", "close_at_free_gpus", "max_cost_patches_per_cycle"):
            if getattr(self, name) < 0:
                raise SettingsError(f"{name}: must be >= 0, got {getattr(self, name)}")
        if self.close_at_free_gpus <= self.open_below_free_gpus:
            raise SettingsError(
                f"close_at_free_gpus: must exceed open_below_free_gpus ({self.open_below_free_gpus}) "
                f"or the taint flaps, got {self.close_at_free_gpus}"
            )
        holds = (
            "open_hold_seconds",
            "close_hold_seconds",
            "pending_grace_seconds",
            "backoff_base_seconds",
            "handover_timeout_seconds",
        )
        for name in holds:
            if getattr(self, name) < 0:
                raise SettingsError(f"{name}: must be >= 0, got {getattr(self, name)}")
        for name in (
            "resync_seconds",
            "tick_seconds",
            "stale_after_seconds",
            "watch_timeout_seconds",
            "lease_duration_seconds",
            "renew_deadline_seconds",
            "retry_period_seconds",
            "request_timeout_seconds",
            "api_retry_attempts",
            "backoff_max_seconds",
        ):
            if getattr(self, name) <= 0:
                raise SettingsError(f"{name}: must be > 0, got {getattr(self, name)}")
        if self.renew_deadline_seconds >= self.lease_duration_seconds:
            raise SettingsError(
                "renew_deadline_seconds: must be below lease_duration_seconds "
                f"({self.lease_duration_seconds}) so a leader steps down before another can take over"
            )
        if self.watch_timeout_seconds >= self.stale_after_seconds:
            raise SettingsError(
                f"watch_timeout_seconds: must be below stale_after_seconds ({self.stale_after_seconds}), "
                "otherwise a quiet cluster looks stale"
            )
        if not -(2**31) <= self.external_deletion_cost <= 2**31 - 1:
            raise SettingsError("external_deletion_cost: must fit in int32 (the annotation's range)")
        if self.handover_cover not in ("current", "minimum"):
            raise SettingsError(f"handover_cover: must be 'current' or 'minimum', got {self.handover_cover!r}")
        for service, minimum in self.handover_services.items():
            if not service or isinstance(minimum, bool) or not isinstance(minimum, int) or minimum < 1:
                raise SettingsError(
                    f"handover_services: {service!r} must map to a minReplicas >= 1, got {minimum!r}"
                )
        for name in (
            "namespace",
            "lease_name",
            "event_namespace",
            "gpu_resource",
            "taint_value",
            "inference_namespace",
        ):
            if not getattr(self, name):
                raise SettingsError(f"{name}: must not be empty")

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], source: str = "settings") -> BurstSettings:
        """Build settings from a plain mapping (a parsed ConfigMap); unknown keys are errors, not ignored."""
        fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
        kwargs: dict[str, Any] = {}
        for key, value in data.items():
            if key not in fields:
                allowed = ", ".join(sorted(fields))
                raise SettingsError(f"{source}: unknown key {key!r}; allowed keys: {allowed}")
            kwargs[key] = _coerce(key, fields[key].type, value, source)
        try:
            return cls(**kwargs)
        except SettingsError as exc:
            raise SettingsError(f"{source}: {exc}") from None

    @classmethod
    def from_file(cls, path: str | Path) -> BurstSettings:
        """Load YAML or JSON (YAML is a superset, so one parser serves both); empty file = defaults."""
        p = Path(path)
        try:
            text = p.read_text(encoding="utf-8")
        except OSError as exc:
            raise SettingsError(f"{p}: cannot read settings: {exc.strerror}") from None
        try:
            data = yaml.safe_load(text) if text.strip() else {}
        except yaml.YAMLError as exc:
            raise SettingsError(f"{p}: not valid YAML/JSON: {exc}") from None
        if not isinstance(data, dict):
            raise SettingsError(f"{p}: top level must be a mapping of settings keys")
        return cls.from_mapping(data, source=str(p))

    def to_json(self) -> str:
        """Serialise the init fields, the shape `from_mapping` accepts (used by the deploying component)."""
        return json.dumps({f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.init})


def standby_deployment(service: str) -> str:
    """Name of a service's standby Deployment (the deploying component and the controller agree on it)."""
    return f"{service}-standby"


def _coerce(key: str, type_name: Any, value: Any, source: str) -> Any:
    """Accept the value types a ConfigMap realistically carries; reject bools posing as numbers."""
    kind = str(type_name)
    if kind == "dict[str, int]":
        if not isinstance(value, Mapping):
            raise SettingsError(f"{source}: key {key!r} must be a mapping of names to integers, got {value!r}")
        return {str(k): _coerce(f"{key}.{k}", "int", v, source) for k, v in value.items()}
    if kind == "int":
        if isinstance(value, bool) or not isinstance(value, int | str):
            raise SettingsError(f"{source}: key {key!r} must be an integer, got {value!r}")
        try:
            return int(value)
        except ValueError:
            raise SettingsError(f"{source}: key {key!r} must be an integer, got {value!r}") from None
    if kind == "float":
        if isinstance(value, bool) or not isinstance(value, int | float | str):
            raise SettingsError(f"{source}: key {key!r} must be a number of seconds, got {value!r}")
        try:
            number = float(value)
        except ValueError:
            raise SettingsError(f"{source}: key {key!r} must be a number of seconds, got {value!r}") from None
        if not math.isfinite(number):
            raise SettingsError(f"{source}: key {key!r} must be finite, got {value!r}")
        return number
    if not isinstance(value, str):
        raise SettingsError(f"{source}: key {key!r} must be a string, got {value!r}")
    return value
