"""The agent kit on its own: the error taxonomy, the fence, the elector's release, the renewer, the retry
policy and the in-memory API's patch semantics (the agents' suites test them in use)."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from kubernetes.client.exceptions import ApiException

from agents.kit.calls import Retry, event, event_problem
from agents.kit.errors import KINDS, ApiError, classify, kind_of_status
from agents.kit.lease import LeaseElector
from agents.kit.loop import lease_loop
from agents.kit.port import EVENTS, LEASES, NODES, STRATEGIC_MERGE_PATCH, Fenced
from fakes.kube_api import MemoryApi, strategic_merge


def elector(api: MemoryApi, identity: str, clock: list[float]) -> LeaseElector:
    return LeaseElector(api, "sys", "agent", identity, lease_duration_seconds=15, renew_deadline_seconds=10,
                        request_timeout_seconds=2, monotonic=lambda: clock[0], wall=lambda: 1e9 + clock[0])


@given(st.integers(400, 599))
def test_every_error_status_has_one_kind_of_the_taxonomy(status: int) -> None:
    kind = kind_of_status(status)
    assert kind in KINDS and kind != "other"
    assert classify(ApiException(status=status)) == kind == ApiError(kind, status=status).kind


def test_the_fence_refuses_writes_before_sending_and_passes_reads() -> None:
    api, allowed = MemoryApi(), [False]
    api.put(NODES, {"metadata": {"name": "n1"}})
    fenced = Fenced(api, lambda: allowed[0])
    assert fenced.get(NODES, "n1")["metadata"]["name"] == "n1"
    with pytest.raises(ApiError) as refused:
        fenced.patch(NODES, "n1", {"metadata": {"labels": {"a": "b"}}})
    assert refused.value.kind == "not_leader" and fenced.refused == 1
    assert api.writes() == []  # nothing reached the API
    allowed[0] = True
    fenced.patch(NODES, "n1", {"metadata": {"labels": {"a": "b"}}})
    assert api.objects["nodes"]["n1"]["metadata"]["labels"] == {"a": "b"}


def test_after_release_the_elector_never_takes_the_lease_back() -> None:
    """A renewal racing the shutdown (the renewer thread) must not re-acquire what release gave up."""
    api, clock = MemoryApi(), [0.0]
    mine, other = elector(api, "a", clock), elector(api, "b", clock)
    assert mine.step() and mine.can_write()
    assert mine.release()
    assert api.objects["leases"]["sys/agent"]["spec"]["holderIdentity"] is None
    writes = len(api.writes())
    assert mine.step() is False and not mine.can_write()
    assert len(api.writes()) == writes
    assert other.step()  # at once: the holder is empty


def test_can_write_leaves_a_whole_request_timeout_before_the_lease_could_pass() -> None:
    api, clock = MemoryApi(), [0.0]
    mine = elector(api, "a", clock)
    assert mine.step()
    clock[0] = 9.9
    assert mine.is_leader and mine.can_write()  # 9.9 + 2 < 15
    clock[0] = 10.0
    assert not mine.is_leader and not mine.can_write()  # past the renew deadline


def test_the_renewer_survives_an_unexpected_error() -> None:
    stop, seen = threading.Event(), []

    def step() -> bool:
        if len(seen) == 3:
            stop.set()
        if len(seen) == 1:
            raise RuntimeError("a bug in one step")
        return True

    lease_loop(step, seen.append, 0.0, stop)
    assert seen == [True, False, True, True]


def test_retry_backs_off_on_retryable_errors_rereads_on_conflict_and_gives_up_with_the_last_kind() -> None:
    sleeps: list[float] = []
    errors: list[str] = []
    calls: list[int] = []
    rereads: list[int] = []
    failures = [ApiError("conflict"), ApiError("server_error"), ApiError("timeout")]

    def call() -> str:
        calls.append(1)
        if failures:
            raise failures.pop(0)
        return "done"

    retry = Retry(5, 0.5, 4, sleeps.append, errors.append)
    assert retry(call, on_conflict=lambda: rereads.append(1)) == "done"
    assert (len(calls), rereads, errors, sleeps) == (4, [1], ["conflict", "server_error", "timeout"], [1.0, 2.0])
    with pytest.raises(ApiError) as gave_up:
        Retry(3, 0.5, 4, lambda s: None)(lambda: (_ for _ in ()).throw(ApiError("unreachable")))
    assert gave_up.value.kind == "unreachable"
    with pytest.raises(ApiError) as refused:
        Retry(3, 0.5, 4, lambda s: None)(lambda: (_ for _ in ()).throw(ApiError("forbidden")))
    assert refused.value.kind == "forbidden"  # not retried


def test_memory_api_is_optimistic_like_the_api_server() -> None:
    api = MemoryApi()
    node = api.put(NODES, {"metadata": {"name": "n1"}, "status": {"conditions": [{"type": "Ready"}]}})
    stale = node["metadata"]["resourceVersion"]
    api.patch(NODES, "n1", {"metadata": {"resourceVersion": stale, "labels": {"x": "1"}}})
    with pytest.raises(ApiError) as conflict:
        api.patch(NODES, "n1", {"metadata": {"resourceVersion": stale, "labels": {"x": "2"}}})
    assert conflict.value.kind == "conflict"
    api.patch(NODES, "n1", {"status": {"conditions": [{"type": "GpuHealthy", "status": "False"}]}},
              content_type=STRATEGIC_MERGE_PATCH, subresource="status")
    assert [c["type"] for c in api.objects["nodes"]["n1"]["status"]["conditions"]] == ["Ready", "GpuHealthy"]
    with pytest.raises(ApiError) as invalid:
        api.replace(LEASES, "x", {"metadata": {"name": "x"}}, "sys")
    assert invalid.value.kind == "not_found"


json_leaf = st.none() | st.booleans() | st.integers() | st.text(max_size=4)
json_doc: Any = st.recursive(json_leaf, lambda inner: st.dictionaries(st.text(max_size=4), inner, max_size=3)
                             | st.lists(inner, max_size=3), max_leaves=10)


@given(json_doc, json_doc)
def test_strategic_merge_never_mutates_its_inputs(target: Any, patch: Any) -> None:
    import copy

    before_target, before_patch = copy.deepcopy(target), copy.deepcopy(patch)
    strategic_merge(target, patch)
    assert (target, patch) == (before_target, before_patch)


# --------------------------------------------------------------------------- Events: where the API server keeps them

NAMESPACES = st.sampled_from(["", "default", "gpu-system", "gpu-burst", "kube-system"])


@given(involved_ns=NAMESPACES, kind=st.sampled_from(["Node", "Lease", "Pod"]))
def test_an_event_is_created_where_the_api_server_accepts_it(involved_ns: str, kind: str) -> None:
    """Whatever it is about, the Event lands in its object's namespace, or default for a cluster-scoped one; the
    in-memory API, like the real one, takes it."""
    involved = {"kind": kind, "name": "x", **({"namespace": involved_ns} if involved_ns else {})}
    body = event(name_prefix="x", involved=involved, reason="R", message="m", component="c", instance="i",
                 warning=False, now=0.0)
    assert event_problem(body) is None
    assert body["metadata"]["namespace"] == (involved_ns or "default")
    api = MemoryApi()
    created = api.create(EVENTS, body, body["metadata"]["namespace"])
    assert created["involvedObject"] == involved


@pytest.mark.parametrize(("namespace", "involved_ns", "problem"), [
    ("gpu-system", "",
     "involvedObject.namespace: an Event about a cluster-scoped object must be in namespace 'default', "
     "not 'gpu-system'"),
    ("default", "gpu-system", "involvedObject.namespace 'gpu-system' does not match event.namespace 'default'"),
    ("gpu-a", "gpu-b", "involvedObject.namespace 'gpu-b' does not match event.namespace 'gpu-a'"),
])
def test_the_in_memory_api_refuses_an_event_the_api_server_would(namespace: str, involved_ns: str,
                                                                 problem: str) -> None:
    """The defect the real API server found: Node Events created in the agent's own namespace were refused (422) and
    dropped, while every in-memory test took them."""
    body = {"metadata": {"generateName": "n.", "namespace": namespace}, "reason": "BurstOpened",
            "involvedObject": {"kind": "Node", "name": "vk-a", **({"namespace": involved_ns} if involved_ns else {})}}
    assert event_problem(body) == problem
    api = MemoryApi()
    with pytest.raises(ApiError) as err:
        api.create(EVENTS, body, namespace)
    assert err.value.kind == "invalid" and err.value.status == 422 and problem in str(err.value)
    assert api.events == []
