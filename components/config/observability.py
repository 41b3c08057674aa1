"""Monitoring, the health guard and the InfiniBand exporter; the thermal threshold is checked per pool."""

from __future__ import annotations

import difflib
import warnings
from typing import TYPE_CHECKING, Annotated, Any, Literal, Self

from pydantic import Field, ValidationInfo, field_validator, model_validator

from agents.health_guard import contract as health_contract
from agents.health_guard.thermal import Thermal
from agents.ib_exporter import contract as ib_contract
from components.config.base import ConfigModel, ContainerRequests, DnsLabel, Labels, PlainUrl, PositiveInt, Problem

if TYPE_CHECKING:
    from components.config.cluster import ClusterConfig


XidNumber = Annotated[int, Field(ge=1, le=999)]


#: The signals the guard judges (its contract's defaults); `signalClasses` may name only these.
SIGNAL_NAMES = tuple(sorted(s.name for s in health_contract.default_signals()))


class HealthGuardConfig(ConfigModel, health_contract.GuardTunables):
    """``observability.health``: the health guard's signal → class mapping and guard rails.

    The rails and the judgement's timings are the guard's own keys (its contract's ``GuardTunables``), plus the XID
    lists and ``signalClasses``, from which the guard's signals are built. The signals and their default classes
    (with sources) are documented in :mod:`agents.health_guard.contract`; the thermal signal takes the limit, band
    and hold above. Deploy switch, poll interval and metrics port are ``healthGuard``, ``healthGuardPollSeconds``
    and ``healthGuardPort``.
    """

    fatal_xids: list[XidNumber] = Field(default_factory=lambda: list(health_contract.FATAL_XIDS))
    """XIDs that make a node fatal (training and inference leave) and page (GpuCriticalXid); numbers from
    NVIDIA's XID catalogue. Never empty (the alert needs it; `signalClasses: {xid-fatal: off}` stops the guard)."""
    degraded_xids: list[XidNumber] = Field(default_factory=lambda: list(health_contract.DEGRADED_XIDS))
    """XIDs that make a node degraded (training leaves, inference may stay). Never empty: to judge none, set
    `signalClasses: {xid-degraded: off}`."""
    signal_classes: dict[str, Literal["fatal", "degraded", "off"]] = Field(default_factory=dict)
    """Per-signal override of its class, or `off`: e.g. `{nvlink-errors: fatal, ib-link-errors: off}`. Keys are the
    guard's signal names (`agents/health_guard/contract.py`); an unknown one is refused."""
    resources: ContainerRequests | None = None
    """Requests of the health guard's container (`cpu`, `memory`; the memory is its limit too).
    Unset: 50m and 128Mi, or more where the stack's nodes need it: the agent keeps every node it watches
    in memory, so the memory is sized from the nodes (docs/scale.md); a memory set below what the agent holds at this
    size is refused."""

    @field_validator("signal_classes")
    @classmethod
    def _known_signals(cls, classes: dict[str, str]) -> dict[str, str]:
        """A misspelt signal would leave the real one in its default class; refused here, at load, not at deploy."""
        unknown = sorted(set(classes) - set(SIGNAL_NAMES))
        if unknown:
            hints = [f"'{close[0]}' for '{name}'" for name in unknown
                     if (close := difflib.get_close_matches(name, SIGNAL_NAMES, n=1))]
            raise ValueError(f"unknown signal(s) {', '.join(unknown)}"
                             + (f" (did you mean {', '.join(hints)}?)" if hints else "")
                             + f"; the signals are {', '.join(SIGNAL_NAMES)}")
        return classes

    @field_validator("fatal_xids", "degraded_xids")
    @classmethod
    def _some_xids(cls, xids: list[int], info: ValidationInfo) -> list[int]:
        """An empty list would give the guard a signal that can never fire (and the XID alert no rule): refused
        here, with the key that turns the signal off, rather than when the guard's query is built."""
        if not xids:
            signal = "xid-fatal" if info.field_name == "fatal_xids" else "xid-degraded"
            raise ValueError(f"is empty: list at least one XID, or turn the signal off with "
                             f"signalClasses: {{{signal}: off}}" + (" (the GpuCriticalXid alert still needs the "
                             "list)" if signal == "xid-fatal" else ""))
        return xids

    @model_validator(mode="after")
    def _xids_disjoint(self) -> Self:
        both = sorted(set(self.fatal_xids) & set(self.degraded_xids))
        if both:
            raise ValueError(f"XIDs {both} are in both fatalXids and degradedXids")
        return self


#: Keys that configured the health guard under the name of the agent it replaced: old → new. The old names are
#: accepted for one release, with a warning that names the new one; both at once is an error.
RENAMED_KEYS = {
    "thermalGuard": "healthGuard",
    "thermalPollSeconds": "healthGuardPollSeconds",
    "thermalGuardPort": "healthGuardPort",
}


class Observability(ConfigModel, Thermal):
    """Metrics, alerts, dashboards and the health guard; the thermal keys are the guard's own `Thermal` model."""

    @model_validator(mode="before")
    @classmethod
    def _renamed_keys(cls, data: Any) -> Any:
        if not isinstance(data, dict) or not set(data) & set(RENAMED_KEYS):
            return data
        data = dict(data)
        for old, new in RENAMED_KEYS.items():
            if old not in data:
                continue
            if new in data:
                raise ValueError(f"{old} and {new} are both set: {old} is the old name of {new}, keep only {new}")
            data[new] = data.pop(old)
            warnings.warn(f"observability.{old} is renamed observability.{new}; the old name is accepted until "
                          "the next release", FutureWarning, stacklevel=2)
        return data

    @model_validator(mode="before")
    @classmethod
    def _one_xid_list(cls, data: Any) -> Any:
        """``criticalXids`` was a second XID list beside ``health.fatalXids``; the two had drifted apart."""
        if isinstance(data, dict) and "criticalXids" in data:
            raise ValueError(
                "criticalXids is gone: one list decides both the page (GpuCriticalXid) and the quarantine, "
                "set observability.health.fatalXids instead"
            )
        return data

    dcgm_interval_ms: Annotated[int, Field(ge=1000, le=30000)] = 5000
    """How often dcgm-exporter samples the GPUs (`DCGM_EXPORTER_INTERVAL`, milliseconds)."""
    inference_tolerates_thermal: bool = True
    """Inference tolerates the guard's `degraded` taint (a hot GPU, an NVLink or InfiniBand error burst) and
    keeps serving there; fatal nodes are tolerated by nothing."""
    step_heartbeat_metric: Annotated[str, Field(pattern=r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")] = (
        "training_step_heartbeat_timestamp_seconds"
    )
    """Metric a training job moves once per step (the runtime reads its name from
    `TRAINING_HEARTBEAT_METRIC`); TrainingHeartbeatStalled fires when it stays flat for `hangWindowMinutes`."""
    hang_window_minutes: PositiveInt = 10
    """How long a training job's heartbeat may stay flat, or its tensor cores idle, before the hang alerts fire
    (minutes)."""
    dashboards: bool = True
    """Deploy the GPU fleet and GPU health Grafana dashboards as ConfigMaps in the monitoring namespace."""
    ib_exporter: bool = True
    """Deploy the InfiniBand exporter DaemonSet on the GPU pools (nodes without HCAs export nothing)."""
    ib_exporter_port: Annotated[int, Field(ge=1024, le=65535)] = ib_contract.DEFAULT_PORT
    """Port of the InfiniBand exporter's /metrics endpoint."""
    ib_nominal_rate_gbps: PositiveInt = 400
    """The rate an InfiniBand port must train at (Gb/s; NDR: 400); lower raises InfinibandRateBelowNominal."""
    health_guard: bool = True
    """Deploy the health guard (quarantines faulty and hot nodes); off leaves only the alerts."""
    health_guard_poll_seconds: PositiveInt = health_contract.HealthSettings.model_fields["poll_seconds"].default
    """How often the health guard queries Prometheus and decides (seconds); at most `thermalHoldSeconds`."""
    health_guard_port: Annotated[int, Field(ge=1024, le=65535)] = health_contract.METRICS_PORT
    """Port of the health guard's /metrics endpoint."""
    prometheus_url: Annotated[PlainUrl, Field(pattern=r"^https?://")] = "http://prometheus-operated.monitoring.svc:9090"
    """Prometheus the health guard queries."""
    scrape_interval_seconds: Annotated[int, Field(ge=1, le=60)] = 15
    """Scrape interval of our ServiceMonitors and PodMonitors (seconds); at most `thermalHoldSeconds`, so the
    guard's rule can see the hold."""
    monitor_labels: Labels = Field(default_factory=dict)
    """Labels the Prometheus Operator selects our monitors and PrometheusRules by (e.g. `release`)."""
    dcgm_runtime_class: DnsLabel | None = "nvidia"
    """RuntimeClass that gives dcgm-exporter the GPUs (the NVIDIA container runtime); null for the default."""
    health: HealthGuardConfig = HealthGuardConfig()
    """The health guard (deployed when `healthGuard` is on): signal classes and guard rails."""

    @model_validator(mode="after")
    def _thermal_consistent(self) -> Self:
        if self.health_guard_poll_seconds > self.thermal_hold_seconds:
            raise ValueError(
                f"healthGuardPollSeconds ({self.health_guard_poll_seconds}) must not exceed thermalHoldSeconds "
                f"({self.thermal_hold_seconds}): the guard could not observe the hold"
            )
        if self.scrape_interval_seconds > self.thermal_hold_seconds:
            raise ValueError(
                f"scrapeIntervalSeconds ({self.scrape_interval_seconds}) must not exceed thermalHoldSeconds "
                f"({self.thermal_hold_seconds})"
            )
        return self



def observability_problems(cfg: ClusterConfig) -> list[Problem]:
    """The thermal threshold sits below every pool's hardware slowdown limit."""
    problems: list[Problem] = []
    threshold = cfg.observability.thermal_threshold_celsius
    for index, pool in enumerate(cfg.pools):
        if threshold >= pool.hardware_limit:
            problems.append(
                Problem(
                    "observability.thermalThresholdCelsius",
                    f"must be below the hardware slowdown limit of pool '{pool.name}' "
                    f"({pool.gpu_model}: {pool.hardware_limit} °C, pools[{index}]); "
                    "the GPU would throttle before the guard pulls it",
                    int(threshold) if float(threshold).is_integer() else threshold,
                )
            )
    return problems
