"""The thermal guard's settings: one model for the threshold, its hold and its warning band.

The stack's ``observability`` section derives from :class:`Thermal`, so the keys, bounds and defaults are
written here once; the alert rules, the fleet dashboard and the health guard's thermal signal all read the
same validated object (``alert_thresholds.AlertThresholds.thermal``, ``gpu_fleet.DashboardOptions.thermal``,
``contract.default_signals``). Nothing else checks these numbers again.
"""

from __future__ import annotations

from typing import Annotated, Self

from pydantic import Field, model_validator

from agents.kit.settings import Number, SettingsModel

THERMAL_LIMIT_CELSIUS = 78
"""A GPU held at or above this is pulled (fleet lesson: it throttles and slows the whole gang)."""
THERMAL_BAND_CELSIUS = 5
"""Released below limit − band, so a GPU hovering at the limit does not flap."""
THERMAL_HOLD_SECONDS = 120
"""How long the limit must hold before the node is pulled (a short spike is not a fault)."""


class Thermal(SettingsModel):
    """When a hot GPU pages, when it warns first, and when the guard pulls and releases its node."""

    thermal_threshold_celsius: Annotated[float, Number, Field(ge=60, lt=120)] = THERMAL_LIMIT_CELSIUS
    """GPU temperature (°C) that, held for `thermalHoldSeconds`, pages (GpuTemperatureCritical) and makes the
    health guard quarantine the node. At least 60: a busy GPU runs warmer, so a lower threshold would
    quarantine the whole fleet; below every pool's hardware slowdown limit."""
    thermal_hold_seconds: Annotated[int, Number, Field(gt=0)] = THERMAL_HOLD_SECONDS
    """How long the threshold must hold before the alert fires and the guard acts (seconds): a short spike is
    not a fault."""
    thermal_warning_band_celsius: Annotated[float, Number, Field(gt=0)] = THERMAL_BAND_CELSIUS
    """Degrees below the threshold where GpuTemperatureWarning starts; the guard releases a hot node only
    below threshold minus band, so a GPU hovering at the limit does not flap."""

    @model_validator(mode="after")
    def _band_below_threshold(self) -> Self:
        if self.thermal_warning_band_celsius >= self.thermal_threshold_celsius:
            k = self.spell
            raise ValueError(
                f"{k('thermal_warning_band_celsius')} ({self.thermal_warning_band_celsius:g}) must be below "
                f"{k('thermal_threshold_celsius')} ({self.thermal_threshold_celsius:g})")
        return self

    @property
    def thermal_warning_celsius(self) -> float:
        """Where the warning starts (and under which the guard releases a hot node)."""
        return self.thermal_threshold_celsius - self.thermal_warning_band_celsius

    def thermal(self) -> Thermal:
        """Only the thermal settings (a stack section holds more)."""
        return Thermal(**{name: getattr(self, name) for name in Thermal.model_fields})
