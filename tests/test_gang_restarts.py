"""Every gang restart counts once: the guard's (with the node) and the application's (Volcano's retryCount)."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from agents.health_guard.restarts import GangJob, Ledger, account, gang_job, guard_caused
from components.mockrt import RunResult

A = ("training", "llm")


def job(retries: int, name: str = "llm") -> GangJob:
    return GangJob("training", name, "h100-a", retries)


def test_first_sight_is_a_baseline_then_each_retry_counts() -> None:
    ledger, counted = account(Ledger(), [job(3)])
    assert counted == {}
    ledger, counted = account(ledger, [job(4)])
    assert counted == {job(4): 1}
    ledger, counted = account(ledger, [job(6)])
    assert counted == {job(6): 2}


def test_a_restart_the_guard_caused_is_not_counted_again() -> None:
    ledger, _ = account(Ledger(), [job(0)])
    ledger = guard_caused(ledger, A)
    ledger, counted = account(ledger, [job(0)])  # Volcano has not restarted it yet
    assert counted == {} and ledger.caused == {A: 1}
    ledger, counted = account(ledger, [job(2)])  # the guard's restart, and one application crash
    assert counted == {job(2): 1} and ledger.caused == {}


def test_a_job_recreated_under_the_same_name_starts_a_new_baseline() -> None:
    ledger, _ = account(Ledger(), [job(7)])
    ledger, counted = account(ledger, [job(0)])
    assert counted == {}
    _, counted = account(ledger, [job(1)])
    assert counted == {job(1): 1}


@given(st.lists(st.tuples(st.integers(0, 3), st.booleans()), min_size=1, max_size=12))
def test_every_restart_is_counted_exactly_once(steps: list[tuple[int, bool]]) -> None:
    """Over any interleaving of application crashes and guard restarts, guard + application = retries."""
    ledger, _ = account(Ledger(), [job(0)])
    retries, by_guard, by_app = 0, 0, 0
    for crashes, guard in steps:
        if guard:
            ledger = guard_caused(ledger, A)
            by_guard += 1
            retries += 1
        retries += crashes
        ledger, counted = account(ledger, [job(retries)])
        by_app += sum(counted.values())
    assert by_guard + by_app == retries


JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=4),
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
                    max_leaves=20)


@given(st.dictionaries(st.sampled_from(["metadata", "status", "spec", "kind"]), JSON, max_size=4))
def test_any_object_from_the_api_is_read_or_skipped_never_raised(raw: dict[str, Any]) -> None:
    found = gang_job(raw, "gpucluster.io/pool")
    assert found is None or (found.retries >= 0 and isinstance(found.pool, str))


def test_the_pool_comes_from_the_template_the_stack_renders(local: RunResult) -> None:
    rendered = local.one("Job", "smoke-gang")
    raw = {**rendered.inputs, "status": {"retryCount": 2}}
    assert gang_job(raw, "gpucluster.io/pool") == GangJob("training", "smoke-gang", "local-gpu", 2)
