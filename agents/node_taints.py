"""Node taint keys more than one agent reads, spelled once and standard library only.

The health guard writes the health taint and the burst controller reads it; their images share no other
module (the guard's carries no burst controller, the controller's no pydantic), so the key lives here.
"""

from __future__ import annotations

HEALTH_TAINT_NAME = "gpu-health"


def health_taint_key(prefix: str) -> str:
    """``<prefix>/gpu-health``: the guard's quarantine taint (value fatal or degraded, effect NoSchedule)."""
    return f"{prefix}/{HEALTH_TAINT_NAME}"
