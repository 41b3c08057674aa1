"""Loading the controller's settings file (the mounted ConfigMap key); the names and the type live in `contract`.

Importers of the names from here keep working: they are the contract's own objects, re-exported.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from agents.burst_controller.contract import (
    GANG_ANNOTATION,
    POD_DELETION_COST_ANNOTATION,
    BurstKeys,
    BurstSettings,
    Cover,
    SettingsError,
    Sizing,
    standby_deployment,
)

__all__ = [
    "GANG_ANNOTATION",
    "POD_DELETION_COST_ANNOTATION",
    "BurstKeys",
    "BurstSettings",
    "Cover",
    "SettingsError",
    "Sizing",
    "load_file",
    "standby_deployment",
]


def load_file(path: str | Path) -> BurstSettings:
    """Load YAML or JSON (YAML is a superset, so one parser serves both); an empty file means the defaults."""
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
    return BurstSettings.from_mapping(data, source=str(p))
