"""Monitoring, the health guard and the InfiniBand exporter; the thermal threshold is checked per pool."""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Annotated, Any, Literal, Self

from pydantic import Field, model_validator

from agents.health_guard import contract as health_contract
from agents.ib_exporter import contract as ib_contract
from components.config.base import ConfigModel, DnsLabel, Labels, PlainUrl, PositiveInt, Problem

if TYPE_CHECKING:
    from components.config.cluster import ClusterConfig


XidNumber = Annotated[int, Field(ge=1, le=999)]


#: The guard's own defaults (its contract): the stack's defaults are the same numbers, not a copy of them.
_GUARD = health_contract.HealthSettings()


class HealthGuardConfig(ConfigModel):
    """``observability.health``: the health guard's signal → class mapping and guard rails.

    The signals and their default classes (with sources) are documented in
    :mod:`agents.health_guard.contract`; the thermal signal takes the limit, band and hold above. Deploy
    switch, poll interval and metrics port are ``healthGuard``, ``healthGuardPollSeconds`` and
    ``healthGuardPort``.
    """

    #: XIDs that make a node fatal (training and inference leave): NVIDIA's XID catalogue.
    fatal_xids: list[XidNumber] = Field(default_factory=lambda: list(health_contract.FATAL_XIDS))
    #: XIDs that make a node degraded (training leaves, inference may stay).
    degraded_xids: list[XidNumber] = Field(default_factory=lambda: list(health_contract.DEGRADED_XIDS))
    #: Per-signal override of the class, or ``off``: e.g. ``{nvlink-errors: fatal, ib-link-errors: off}``.
    signal_classes: dict[str, Literal["fatal", "degraded", "off"]] = Field(default_factory=dict)
    #: A node whose exporter has been silent this long is not judged: never unhealthy, never released.
    stale_after_seconds: Annotated[int, Field(ge=15)] = _GUARD.stale_after_seconds
    #: Healthy this long without a break before a node is released (fatal ones also need the repair mark).
    probation_seconds: Annotated[int, Field(ge=0)] = _GUARD.probation_seconds
    #: Guard rails: past any of these the guard stops quarantining until a person resets its breaker.
    max_nodes_per_hour: Annotated[int, Field(ge=0)] = _GUARD.max_nodes_per_hour
    max_nodes_quarantined: Annotated[int, Field(ge=0)] = _GUARD.max_nodes_quarantined
    max_pool_percent_per_hour: Annotated[float, Field(ge=0, le=100)] = _GUARD.max_pool_percent_per_hour
    max_pool_percent_quarantined: Annotated[float, Field(ge=0, le=100)] = _GUARD.max_pool_percent_quarantined
    #: Quarantined this often within the window, even a degraded node waits for the repair mark.
    flap_limit: Annotated[int, Field(ge=2)] = _GUARD.flap_limit
    flap_window_seconds: PositiveInt = _GUARD.flap_window_seconds
    #: Evict inference from fatal nodes too (through the Eviction API: PodDisruptionBudgets hold).
    evict_inference_on_fatal: bool = _GUARD.evict_inference_on_fatal

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


class Observability(ConfigModel):
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
    #: At least 60 °C: a busy GPU runs warmer than that, so a lower threshold would quarantine the whole fleet.
    thermal_threshold_celsius: Annotated[int, Field(ge=60)] = health_contract.THERMAL_LIMIT_CELSIUS
    thermal_hold_seconds: PositiveInt = health_contract.THERMAL_HOLD_SECONDS
    thermal_warning_band_celsius: PositiveInt = health_contract.THERMAL_BAND_CELSIUS
    inference_tolerates_thermal: bool = True
    step_heartbeat_metric: Annotated[str, Field(pattern=r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")] = (
        "training_step_heartbeat_timestamp_seconds"
    )
    hang_window_minutes: PositiveInt = 10
    dashboards: bool = True
    #: Deploy the InfiniBand exporter DaemonSet on the GPU pools (nodes without HCAs export nothing).
    ib_exporter: bool = True
    ib_exporter_port: Annotated[int, Field(ge=1024, le=65535)] = ib_contract.DEFAULT_PORT
    #: The rate an InfiniBand port must train at; lower raises InfinibandRateBelowNominal (NDR: 400).
    ib_nominal_rate_gbps: PositiveInt = 400
    #: Deploy the health guard (quarantines faulty and hot nodes); off leaves only the alerts.
    health_guard: bool = True
    #: How often the health guard queries Prometheus and decides.
    health_guard_poll_seconds: PositiveInt = _GUARD.poll_seconds
    health_guard_port: Annotated[int, Field(ge=1024, le=65535)] = health_contract.METRICS_PORT
    #: Prometheus the health guard queries.
    prometheus_url: Annotated[PlainUrl, Field(pattern=r"^https?://")] = "http://prometheus-operated.monitoring.svc:9090"
    #: Scrape interval of our ServiceMonitors; at most the hold so the guard's rule can see the hold.
    scrape_interval_seconds: Annotated[int, Field(ge=1, le=60)] = 15
    #: Labels the Prometheus Operator selects ServiceMonitors and PrometheusRules by (e.g. release).
    monitor_labels: Labels = Field(default_factory=dict)
    #: RuntimeClass that gives dcgm-exporter the GPUs (the NVIDIA container runtime); null for the default.
    dcgm_runtime_class: DnsLabel | None = "nvidia"
    #: The health guard (deployed when ``healthGuard`` is on): signal classes and guard rails.
    health: HealthGuardConfig = HealthGuardConfig()

    @model_validator(mode="after")
    def _thermal_consistent(self) -> Self:
        if self.thermal_warning_band_celsius >= self.thermal_threshold_celsius:
            raise ValueError(
                f"thermalWarningBandCelsius ({self.thermal_warning_band_celsius}) must be below "
                f"thermalThresholdCelsius ({self.thermal_threshold_celsius})"
            )
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
                    threshold,
                )
            )
    return problems
