"""Loading the controller's settings file (the mounted ConfigMap key); the names and the type live in `contract`.

Importers of the names from here keep working: they are the contract's own objects, re-exported.
"""

from __future__ import annotations

from pathlib import Path

from agents.burst_controller.contract import (
    GANG_ANNOTATION,
    POD_DELETION_COST_ANNOTATION,
    BurstKeys,
    BurstSettings,
    Cover,
    SettingsError,
    Sizing,
    return_deployment,
    standby_deployment,
    warm_deployment,
)
from agents.kit.loop import load_settings

__all__ = [
    "GANG_ANNOTATION",
    "POD_DELETION_COST_ANNOTATION",
    "BurstKeys",
    "BurstSettings",
    "Cover",
    "SettingsError",
    "Sizing",
    "load_file",
    "return_deployment",
    "standby_deployment",
    "warm_deployment",
]


def load_file(path: str | Path) -> BurstSettings:
    """Load YAML or JSON (the kit's one settings loader); an empty file means the defaults."""
    try:
        return load_settings(path, lambda data, source: BurstSettings.from_mapping(dict(data), source=source))
    except SettingsError:
        raise
    except ValueError as exc:
        raise SettingsError(str(exc)) from None
