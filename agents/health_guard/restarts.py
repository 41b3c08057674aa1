"""Every gang restart counts: the ones the guard causes and the ones Volcano makes after an application crash.

The guard knows the restarts it causes (it evicted the gang from a node it quarantined). Volcano restarts a
gang after any failed pod too and counts it in the job's ``status.retryCount``. :func:`account` turns the
retry counts into restarts since the last look, and takes off the ones the guard already counted, so a
restart the guard caused is counted once (as the guard's, with its node) and an application crash once
(as the application's, without a node). The ledger lives in memory: after a restart the first look only
sets the baseline, since a retry that happened before cannot be placed in time any more.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

Key = tuple[str, str]
"""(namespace, job)"""


@dataclass(frozen=True)
class GangJob:
    namespace: str
    name: str
    pool: str
    retries: int


@dataclass(frozen=True)
class Ledger:
    seen: Mapping[Key, int] = field(default_factory=dict)
    """Retry count last seen per job."""
    caused: Mapping[Key, int] = field(default_factory=dict)
    """Restarts the guard caused (and counted) that the job's retry count does not show yet."""


def guard_caused(ledger: Ledger, key: Key) -> Ledger:
    """The guard just restarted ``key`` (and counted it): the next retry of that job is not counted again."""
    return replace(ledger, caused={**ledger.caused, key: ledger.caused.get(key, 0) + 1})


def account(ledger: Ledger, jobs: Iterable[GangJob]) -> tuple[Ledger, dict[GangJob, int]]:
    """Restarts by application crashes since the last look, per job; and the new ledger."""
    seen: dict[Key, int] = {}
    caused: dict[Key, int] = {}
    counted: dict[GangJob, int] = {}
    for job in jobs:
        key = (job.namespace, job.name)
        seen[key] = job.retries
        before = ledger.seen.get(key)
        pending = ledger.caused.get(key, 0)
        # First sight, or a job recreated under the same name (its count starts over): a baseline only.
        delta = 0 if before is None or job.retries < before else job.retries - before
        by_guard = min(delta, pending)
        if pending - by_guard:
            caused[key] = pending - by_guard
        if delta - by_guard:
            counted[job] = delta - by_guard
    return Ledger(seen, caused), counted


def gang_job(raw: Mapping[str, Any], pool_key: str) -> GangJob | None:
    """A Volcano Job as the ledger needs it; ``None`` for one without a name. The pool is the one its workers
    are pinned to (the template's required node affinity on ``pool_key``), ``""`` when it has none."""
    metadata = _map(raw.get("metadata"))
    name, namespace = metadata.get("name"), metadata.get("namespace")
    if not isinstance(name, str) or not isinstance(namespace, str):
        return None
    status = _map(raw.get("status"))
    retries = status.get("retryCount", 0)
    if not isinstance(retries, int) or isinstance(retries, bool) or retries < 0:
        retries = 0
    return GangJob(namespace, name, _pool(raw, pool_key), retries)


def _pool(raw: Mapping[str, Any], pool_key: str) -> str:
    tasks = _map(raw.get("spec")).get("tasks")
    for task in tasks if isinstance(tasks, list) else []:
        try:
            terms = task["template"]["spec"]["affinity"]["nodeAffinity"][
                "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
        except (KeyError, TypeError):
            continue
        for term in terms if isinstance(terms, list) else []:
            for expr in (term.get("matchExpressions") or []) if isinstance(term, Mapping) else []:
                values = expr.get("values") if isinstance(expr, Mapping) else None
                if expr.get("key") == pool_key and expr.get("operator") == "In" and values:
                    return str(values[0])
    return ""


def _map(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}
