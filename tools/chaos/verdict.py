"""The soak's judgement, pure: the HA agents' writes from the API server's audit log (fencing, one eviction per pod),
and what its sampler saw on the nodes (the burst taint's hysteresis, the health guard's quarantines against the GPU
faults served), each bound taken from the stack's own settings."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from agents.health_guard.contract import HealthSettings
from components.health_guard import settings_from_config as guard_settings
from tools.localcluster.history import (
    GpuFault,
    Violation,
    burst_flip_violations,
    fencing_violations,
    quarantine_violations,
    repeated_evictions,
    taint_flips,
    unquarantined_faults,
)
from tools.localcluster.rbac_usage import Request

#: The guard's signals that read the XIDs the soak serves (agents/health_guard/contract.py).
XID_SIGNALS = ("xid-degraded", "xid-fatal")
#: Every invariant `audit_violations` judges, so a report lists each, a zero included.
AUDIT_INVARIANTS = ("write-while-another-held-the-lease", "write-after-refused-renewal", "one-eviction-per-pod")
#: Every invariant `node_violations` judges, so a report lists each, a zero included.
NODE_INVARIANTS = ("burst-taint-hysteresis", "more-than-one-quarantine-per-fault", "quarantine-without-a-fault",
                   "released-before-clear-and-probation", "fault-not-quarantined")

Samples = Sequence[tuple[float, str, bool]]


def audit_violations(requests: Sequence[Request], agents: Iterable[tuple[str, str, str]], *, since: float,
                     gpu_faults: Sequence[GpuFault]) -> list[Violation]:
    """Each HA agent's (app, its Lease's namespace, its Lease) writes: none while another replica held its Lease or
    after a refused renewal, and one eviction per pod between two GPU faults (from ``since``)."""
    faults = [g.start for g in gpu_faults]
    out: list[Violation] = []
    for app, namespace, lease in agents:
        out += fencing_violations(requests, agent=app, namespace=namespace, lease=lease)
        out += repeated_evictions(requests, agent=app, since=since, faults=faults)
    return out


def quarantine_bound_s(guard: HealthSettings) -> float:
    """The longest the guard may take to quarantine a node once its GPU fault is queryable: the XID signals' longest
    hold, one poll, and one cycle's deadline (its Lease renewal deadline: no cycle runs longer)."""
    signals = {s.name: s for s in guard.signals}
    return max(signals[name].hold_seconds for name in XID_SIGNALS) + guard.poll_seconds + guard.renew_deadline_seconds


def node_violations(cfg: Any, burst_taint: Samples, quarantine: Samples, gpu_faults: Sequence[GpuFault],
                    breaker: Sequence[tuple[float, bool]]) -> list[Violation]:
    """The node-level invariants of the stack ``cfg`` over the sampler's readings (epoch seconds, node, tainted) of
    every node's burst and quarantine taints, the GPU faults served and the guard's breaker readings."""
    b = cfg.burst
    return [
        *burst_flip_violations(taint_flips(burst_taint), open_after_close_s=min(b.open_hold_seconds,
                                                                                b.pending_grace_seconds),
                               close_after_open_s=b.close_hold_seconds),
        *quarantine_violations(taint_flips(quarantine), gpu_faults,
                               probation_s=cfg.observability.health.probation_seconds),
        *unquarantined_faults(quarantine, gpu_faults, within_s=quarantine_bound_s(guard_settings(cfg)),
                              breaker=breaker),
    ]
