"""Settings of the thermal guard, validated once at start so a bad ConfigMap fails loudly, not at 3 a.m."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

_QUALIFIED_KEY = re.compile(
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
)
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")


class SettingsError(ValueError):
    """Invalid settings; the message names every offending key."""


@dataclass(frozen=True)
class ThermalSettings:
    """What the guard needs to know. Defaults are the platform's: 78 C held for 2 minutes."""

    threshold_celsius: float = 78.0
    """A node whose hottest GPU stays at or above this for ``hold_seconds`` is tainted."""
    hold_seconds: int = 120
    """Long enough to ignore a single hot sample, short enough that a cooking GPU does not take new work."""
    warning_band: float = 5.0
    """Degrees below the threshold reported as ``warning`` in the guard's metrics."""
    prometheus_url: str = "http://prometheus-operated.monitoring.svc:9090"
    taint_key: str = "gpucluster.io/thermal"
    label_prefix: str = "gpucluster.io"
    poll_seconds: int = 15
    inference_tolerates: bool = True
    """Inference pods carry a toleration for the taint (they run fine on a hot GPU); training does not."""
    node_label: str = "Hostname"
    """Label of DCGM_FI_DEV_GPU_TEMP naming the node: ``Hostname`` in the pinned dcgm-exporter 4.2.x."""
    node_selector: str = "gpucluster.io/location=onprem"
    """Nodes the guard watches; virtual nodes have no GPUs of ours to cool."""

    @property
    def taint_value(self) -> str:
        return "hot"

    @property
    def reason_label(self) -> str:
        return f"{self.label_prefix}/thermal-reason"

    @property
    def since_annotation(self) -> str:
        return f"{self.label_prefix}/thermal-since"

    @property
    def detail_annotation(self) -> str:
        return f"{self.label_prefix}/thermal-detail"

    @property
    def release_key(self) -> str:
        """Label or annotation an operator sets (to any value) to release a node: the only way out."""
        return f"{self.label_prefix}/thermal-release"

    @property
    def warning_celsius(self) -> float:
        return self.threshold_celsius - self.warning_band

    def query(self) -> str:
        """PromQL for the hottest GPU per node."""
        return f"max by ({self.node_label}) (DCGM_FI_DEV_GPU_TEMP)"

    @classmethod
    def from_mapping(cls, raw: Mapping[str, Any], source: str = "settings") -> ThermalSettings:
        """Build from a parsed ConfigMap/JSON mapping; unknown keys and wrong types are errors.

        Every problem is reported at once, each naming its key and ``source``, so one edit fixes all.
        """
        known = {f.name: f for f in fields(cls)}
        problems: list[str] = [f"{source}: unknown key {key!r}" for key in raw if key not in known]
        values: dict[str, Any] = {}
        for key, value in raw.items():
            if key not in known:
                continue
            default = known[key].default
            if isinstance(default, bool):
                ok = isinstance(value, bool)
            elif isinstance(default, int):
                ok = isinstance(value, int) and not isinstance(value, bool)
            elif isinstance(default, float):
                ok = isinstance(value, int | float) and not isinstance(value, bool)
                value = float(value) if ok else value
            else:
                ok = isinstance(value, str)
            if not ok:
                problems.append(f"{source}: {key} must be {type(default).__name__}, got {value!r}")
                continue
            values[key] = value
        if problems:
            raise SettingsError("; ".join(problems))
        settings = cls(**values)
        settings.validate(source)
        return settings

    def validate(self, source: str = "settings") -> None:
        problems: list[str] = []
        if not 0 < self.threshold_celsius < 120:
            problems.append(f"threshold_celsius must be in (0, 120), got {self.threshold_celsius}")
        if self.hold_seconds <= 0:
            problems.append(f"hold_seconds must be > 0, got {self.hold_seconds}")
        if not 0 <= self.warning_band < self.threshold_celsius:
            problems.append(f"warning_band must be >= 0 and below the threshold, got {self.warning_band}")
        if self.poll_seconds <= 0:
            problems.append(f"poll_seconds must be > 0, got {self.poll_seconds}")
        if 0 < self.hold_seconds < self.poll_seconds:
            problems.append(
                f"poll_seconds ({self.poll_seconds}) must not exceed hold_seconds ({self.hold_seconds}): "
                "the hold could not be observed"
            )
        if not self.prometheus_url.startswith(("http://", "https://")):
            problems.append(f"prometheus_url must start with http:// or https://, got {self.prometheus_url!r}")
        if not _QUALIFIED_KEY.match(self.taint_key) or "/" not in self.taint_key:
            problems.append(
                f"taint_key must be a prefixed Kubernetes key like gpucluster.io/thermal, got {self.taint_key!r}"
            )
        if not _DNS_SUBDOMAIN.match(self.label_prefix):
            problems.append(f"label_prefix must be a DNS subdomain like gpucluster.io, got {self.label_prefix!r}")
        if not _LABEL_NAME.match(self.node_label):
            problems.append(f"node_label must be a Prometheus label name, got {self.node_label!r}")
        if problems:
            raise SettingsError("; ".join(f"{source}: {p}" for p in problems))
