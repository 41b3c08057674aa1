"""The one rule on an agent's lease timings, standard library only: every agent's settings model checks it, and
the CLI, which ships those models, ships this module and nothing else of the kit."""

from __future__ import annotations


def lease_timing_problem(request_timeout_seconds: float, renew_deadline_seconds: float,
                         lease_duration_seconds: float) -> str | None:
    """The one rule on an agent's lease timings, or ``None`` when it holds: a call that starts before the renew
    deadline must end before the lease runs out, or a leader could still be writing when a standby takes over."""
    if request_timeout_seconds < renew_deadline_seconds < lease_duration_seconds:
        return None
    return (f"request_timeout_seconds ({request_timeout_seconds}) < renew_deadline_seconds "
            f"({renew_deadline_seconds}) < lease_duration_seconds ({lease_duration_seconds}) must "
            "hold, or a leader could still be writing when a standby takes over")
