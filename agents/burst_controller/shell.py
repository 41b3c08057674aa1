"""The I/O shell: list/watch into the view, run the core, apply its actions if this replica leads.

Every API call goes through the `ClusterApi` port (`KubeApi` implements it over the kubernetes client), so
the shell's behaviour is tested against an in-memory port and only the client's own behaviour needs HTTP.

Failure behaviour (each is counted in `gpucluster_burst_errors_total{kind}`):
- cannot list or watch: `cluster_visible` = 0, that kind goes unsynced and the core changes nothing;
- watch expired (410 Gone) or broken: re-list that kind, then watch from the new resourceVersion; only a
  failure grows the watch backoff, a watch that ends at its timeout or a periodic resync does not;
- freshness is kept per kind and only what the server confirmed counts: a list, an event or a bookmark;
- patch conflict (409): re-read the node and patch again on its fresh resourceVersion;
- 5xx, 429, timeouts, connection errors: exponential backoff, bounded attempts; an action that still fails
  (or fails for good: 403, 422) waits its own exponential backoff with jitter before it is tried again;
- watch events are coalesced: at most one reconcile per tick, however many events arrive;
- the lease is checked before every write, retries and conflict re-reads included: a write starts only if it
  can finish (its request timeout) before the lease could pass to another replica.

Handover actions are idempotent: scaling a standby Deployment writes the wanted count through the scale
subresource (a repeat is skipped until the next resync), and lifting the gate is a strategic-merge delete
of our gate alone, so other gates on the pod stay and a pod already released is a no-op.
"""

from __future__ import annotations

import gc
import json
import logging
import random
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol, cast

import urllib3
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from prometheus_client import CollectorRegistry, Counter, Gauge

from agents.burst_controller.contract import POD_DELETION_COST_ANNOTATION, BurstSettings, standby_deployment
from agents.burst_controller.decide import (
    Action,
    ActionKind,
    BurstState,
    Decision,
    InfeasibleGang,
    Mode,
    Snapshot,
    decide,
    state_from_snapshot,
)
from agents.burst_controller.view import ClusterView

log = logging.getLogger("burst_controller")

NODES = "nodes"
PODS = "pods"
LIST_PAGE = 500  # keeps each list response small on clusters with tens of thousands of pods
MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"
COMPONENT = "burst-controller"


class ClusterApi(Protocol):
    """Every API call the shell makes, on plain JSON objects; errors are the client's exceptions."""

    def list(self, kind: str, limit: int, token: str | None) -> dict[str, Any]: ...
    def watch(self, kind: str, resource_version: str) -> Iterator[dict[str, Any]]: ...
    def read_node(self, name: str) -> dict[str, Any]: ...
    def patch_node(self, name: str, body: dict[str, Any]) -> dict[str, Any]: ...
    def patch_pod(self, namespace: str, name: str, body: dict[str, Any], content_type: str) -> dict[str, Any]: ...
    def scale(self, namespace: str, deployment: str, replicas: int) -> None: ...
    def create_event(self, namespace: str, body: dict[str, Any]) -> None: ...
    def read_lease(self, namespace: str, name: str) -> dict[str, Any] | None: ...
    def create_lease(self, namespace: str, body: dict[str, Any]) -> None: ...
    def replace_lease(self, namespace: str, name: str, body: dict[str, Any]) -> None: ...


class KubeApi:
    """`ClusterApi` over the kubernetes client: raw JSON in and out (no typed models for tens of thousands of pods)."""

    def __init__(self, api_client: client.ApiClient, settings: BurstSettings) -> None:
        self.core = client.CoreV1Api(api_client)
        self.apps = client.AppsV1Api(api_client)
        self.coordination = client.CoordinationV1Api(api_client)
        self._s = settings

    @property
    def _timeout(self) -> float:
        return self._s.request_timeout_seconds

    def _list_fn(self, kind: str) -> Callable[..., Any]:
        return self.core.list_node if kind == NODES else self.core.list_pod_for_all_namespaces

    def list(self, kind: str, limit: int, token: str | None) -> dict[str, Any]:
        return _json(self._list_fn(kind)(limit=limit, _continue=token, _preload_content=False,
                                         _request_timeout=self._timeout))

    def watch(self, kind: str, resource_version: str) -> Iterator[dict[str, Any]]:
        s = self._s
        resp = self._list_fn(kind)(
            watch=True,
            resource_version=resource_version,
            allow_watch_bookmarks=True,
            timeout_seconds=s.watch_timeout_seconds,
            _preload_content=False,
            _request_timeout=(s.request_timeout_seconds, s.watch_timeout_seconds + s.request_timeout_seconds),
        )
        try:
            buffer = b""
            for chunk in resp.stream(amt=None, decode_content=False):
                buffer += chunk
                *lines, buffer = buffer.split(b"\n")
                for line in lines:
                    if line.strip():
                        event = json.loads(line)
                        if not isinstance(event, dict):
                            raise ValueError("watch event is not an object")
                        yield event
        finally:
            resp.release_conn()

    def read_node(self, name: str) -> dict[str, Any]:
        return _json(self.core.read_node(name, _preload_content=False, _request_timeout=self._timeout))

    def patch_node(self, name: str, body: dict[str, Any]) -> dict[str, Any]:
        return _json(self.core.patch_node(name, body, _content_type=MERGE_PATCH, _preload_content=False,
                                          _request_timeout=self._timeout))

    def patch_pod(self, namespace: str, name: str, body: dict[str, Any], content_type: str) -> dict[str, Any]:
        return _json(self.core.patch_namespaced_pod(name, namespace, body, _content_type=content_type,
                                                    _preload_content=False, _request_timeout=self._timeout))

    def scale(self, namespace: str, deployment: str, replicas: int) -> None:
        self.apps.patch_namespaced_deployment_scale(deployment, namespace, {"spec": {"replicas": replicas}},
                                                    _content_type=MERGE_PATCH, _request_timeout=self._timeout)

    def create_event(self, namespace: str, body: dict[str, Any]) -> None:
        self.core.create_namespaced_event(namespace, cast(Any, body), _request_timeout=self._timeout)  # JSON as is

    def read_lease(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return _json(self.coordination.read_namespaced_lease(name, namespace, _preload_content=False,
                                                                 _request_timeout=self._timeout))
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def create_lease(self, namespace: str, body: dict[str, Any]) -> None:
        self.coordination.create_namespaced_lease(namespace, cast(Any, body), _request_timeout=self._timeout)

    def replace_lease(self, namespace: str, name: str, body: dict[str, Any]) -> None:
        self.coordination.replace_namespaced_lease(name, namespace, cast(Any, body), _request_timeout=self._timeout)


def _json(resp: Any) -> dict[str, Any]:
    try:
        data = json.loads(resp.data)
    finally:
        resp.release_conn()
    if not isinstance(data, dict):
        raise ValueError("API answer is not an object")
    return data


class CallFailed(Exception):
    """An API call failed for good (after retries, or with an error retrying cannot fix)."""

    def __init__(self, kind: str, detail: str) -> None:
        super().__init__(f"{kind}: {detail}")
        self.kind = kind


def classify(exc: BaseException) -> str:
    """Map an exception from the client to the error kind used in metrics and retry decisions."""
    if isinstance(exc, CallFailed):
        return exc.kind
    if isinstance(exc, ApiException):
        status = exc.status or 0
        if status == 409:
            return "conflict"
        if status == 410:
            return "gone"
        if status == 404:
            return "not_found"
        if status == 429 or status >= 500:
            return "server_error"
        return "client_error"
    if isinstance(exc, urllib3.exceptions.MaxRetryError) and exc.reason is not None:
        return classify(exc.reason)
    # Checked before timeouts: urllib3 derives NewConnectionError from ConnectTimeoutError.
    if isinstance(exc, urllib3.exceptions.NewConnectionError | ConnectionRefusedError):
        return "unreachable"
    if isinstance(exc, urllib3.exceptions.TimeoutError | TimeoutError):
        return "timeout"
    if isinstance(exc, urllib3.exceptions.HTTPError | OSError):
        return "unreachable"
    if isinstance(exc, ValueError):
        return "bad_response"
    return "other"


RETRYABLE = frozenset({"server_error", "timeout", "unreachable"})


class Metrics:
    """Prometheus metrics of one controller; a registry per instance keeps tests independent."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.node_open = Gauge(
            "gpucluster_burst_virtual_node_open",
            "1 when inference may land on the virtual node (no burst taint)",
            ["node", "provider"],
            registry=r,
        )
        self.mode_open = Gauge(
            "gpucluster_burst_mode_open", "1 when the controller wants bursting on", registry=r
        )
        self.flips = Counter("gpucluster_burst_flips", "Mode changes by direction", ["direction"], registry=r)
        self.free = Gauge("gpucluster_burst_onprem_free_gpus", "Free schedulable on-prem GPUs", registry=r)
        self.effective_free = Gauge(
            "gpucluster_burst_onprem_effective_free_gpus",
            "Free on-prem GPUs minus GPUs wanted by pending training pods",
            registry=r,
        )
        self.allocatable = Gauge(
            "gpucluster_burst_onprem_allocatable_gpus", "Schedulable on-prem GPUs", registry=r
        )
        self.pending = Gauge(
            "gpucluster_burst_pending_gpus", "GPUs of unschedulable pods", ["workload"], registry=r
        )
        self.external = Gauge(
            "gpucluster_burst_external_gpus_in_use", "GPUs used by pods on virtual nodes", registry=r
        )
        self.errors = Counter(
            "gpucluster_burst_errors", "API and processing errors by kind", ["kind"], registry=r
        )
        self.visible = Gauge(
            "gpucluster_burst_cluster_visible",
            "1 when the last list/watch succeeded; 0 means taints are left as they are",
            registry=r,
        )
        self.leader = Gauge("gpucluster_burst_leader", "1 while this replica holds the lease", registry=r)
        self.actions = Counter(
            "gpucluster_burst_actions", "Actions applied successfully", ["kind"], registry=r
        )
        self.standby = Gauge(
            "gpucluster_burst_standby_replicas",
            "Standby replicas wanted per inference service (covering replicas at risk of a handover)",
            ["service"],
            registry=r,
        )
        self.infeasible = Gauge(
            "gpucluster_burst_infeasible_training_gangs",
            "Training gangs that can never fit their pool (larger than it, or a pod larger than every node)",
            registry=r,
        )
        self.gated = Gauge(
            "gpucluster_burst_gated_training_pods",
            "Training pods held at the handover gate until the standby covers what they displace",
            registry=r,
        )
        self._node_labels: set[tuple[str, str]] = set()

    def observe(self, snapshot: Snapshot, decision: Decision, state: BurstState) -> None:
        self.observe_inputs(snapshot)
        if decision.effective_free_gpus is not None:
            self.effective_free.set(decision.effective_free_gpus)
        for service in snapshot.services:
            self.standby.labels(service).set(decision.standby.get(service, 0))
        self.mode_open.set(1 if state.mode is Mode.OPEN else 0)

    def observe_inputs(self, snapshot: Snapshot) -> None:
        """What the cluster looks like; followers export it too, so a standby's dashboard is not empty."""
        self.free.set(snapshot.onprem_free_gpus)
        self.allocatable.set(snapshot.onprem_allocatable_gpus)
        self.pending.labels("inference").set(snapshot.pending_inference_gpus)
        self.pending.labels("training").set(snapshot.pending_training_gpus)
        self.external.set(snapshot.external_gpus_in_use)
        self.gated.set(len(snapshot.gated_pods))
        labels = {(v.name, v.provider) for v in snapshot.virtual_nodes.values()}
        for gone in self._node_labels - labels:
            self.node_open.remove(*gone)
        for v in snapshot.virtual_nodes.values():
            self.node_open.labels(v.name, v.provider).set(0 if v.closed else 1)
        self._node_labels = labels


def _now_rfc3339(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaseElector:
    """Leader election on a coordination.k8s.io/v1 Lease, one `step()` at a time.

    Expiry is judged by how long the lease record has stayed unchanged on *our* monotonic clock
    (as client-go does), so skewed wall clocks between replicas cannot steal a live lease.
    """

    def __init__(
        self,
        api: ClusterApi,
        settings: BurstSettings,
        identity: str,
        monotonic: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self._api = api
        self._s = settings
        self.identity = identity
        self._mono = monotonic
        self._wall = wall
        self._observed: tuple[str, str] | None = None
        self._observed_at = 0.0
        self._renewed_at: float | None = None

    @property
    def is_leader(self) -> bool:
        """True only while the last successful renewal is within the renew deadline."""
        return (
            self._renewed_at is not None and self._mono() - self._renewed_at < self._s.renew_deadline_seconds
        )

    def can_write(self) -> bool:
        """A write may start: we lead, and even a write that takes its whole request timeout lands before the
        lease, counted from our last renewal, could pass to another replica."""
        if not self.is_leader or self._renewed_at is None:
            return False
        finish = self._mono() + self._s.request_timeout_seconds
        return finish < self._renewed_at + self._s.lease_duration_seconds

    def step(self) -> bool:
        """Try once to acquire or renew; returns whether this replica leads now."""
        s = self._s
        now_mono = self._mono()
        try:
            lease = self._api.read_lease(s.namespace, s.lease_name)
            if lease is None:
                self._api.create_lease(s.namespace, self._record(None))
                self._renewed_at = now_mono
                return True
            spec = lease.get("spec") or {}
            holder = str(spec.get("holderIdentity") or "")
            seen = (holder, str(spec.get("renewTime")))
            if seen != self._observed:
                self._observed, self._observed_at = seen, now_mono
            duration = float(spec.get("leaseDurationSeconds") or s.lease_duration_seconds)
            expired = now_mono - self._observed_at >= duration
            if holder and holder != self.identity and not expired:
                self._renewed_at = None
                return False
            body = self._record(lease)
            self._api.replace_lease(s.namespace, s.lease_name, body)
            self._observed = (self.identity, str(body["spec"]["renewTime"]))
            self._observed_at = now_mono
            self._renewed_at = now_mono
            return True
        except (ApiException, urllib3.exceptions.HTTPError, OSError, ValueError) as exc:
            log.warning("lease %s/%s: %s", s.namespace, s.lease_name, classify(exc))
            return self.is_leader

    def _record(self, current: dict[str, Any] | None) -> dict[str, Any]:
        now = _now_rfc3339(self._wall())
        spec = (current or {}).get("spec") or {}
        same = spec.get("holderIdentity") == self.identity
        transitions = int(spec.get("leaseTransitions") or 0)
        meta: dict[str, Any] = {"name": self._s.lease_name, "namespace": self._s.namespace}
        rv = ((current or {}).get("metadata") or {}).get("resourceVersion")
        if rv:
            meta["resourceVersion"] = rv
        return {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": meta,
            "spec": {
                "holderIdentity": self.identity,
                "leaseDurationSeconds": int(self._s.lease_duration_seconds),
                "acquireTime": spec.get("acquireTime") if same and spec.get("acquireTime") else now,
                "renewTime": now,
                "leaseTransitions": transitions if same or current is None else transitions + 1,
            },
        }

    def release(self) -> None:
        """Give the lease up on a clean shutdown so the next replica need not wait for expiry."""
        if not self.is_leader:
            return
        s = self._s
        try:
            lease = self._api.read_lease(s.namespace, s.lease_name)
            spec = (lease or {}).get("spec") or {}
            if lease is not None and spec.get("holderIdentity") == self.identity:
                spec["holderIdentity"] = None
                spec["leaseDurationSeconds"] = 1
                lease["spec"] = spec
                self._api.replace_lease(s.namespace, s.lease_name, lease)
        except (ApiException, urllib3.exceptions.HTTPError, OSError, ValueError) as exc:
            log.warning("lease release: %s", classify(exc))
        self._renewed_at = None


@dataclass
class _Cursor:
    resource_version: str = ""
    needs_list: bool = True


@dataclass
class _Backoff:
    failures: int
    next_at: float


class WatchEnd:
    """How one `watch_once` ended: only FAILED grows the watch loop's backoff."""

    OK = "ok"
    FAILED = "failed"


class BurstShell:
    """Glue between the API and the core; every method is one step so tests can drive it.

    `coalesce=False` and `action_backoff_base_seconds=0` give the shell's earlier behaviour (a reconcile per
    watch event, failed actions retried at every reconcile); the benchmark keeps it as its baseline row.
    """

    def __init__(
        self,
        settings: BurstSettings,
        api: ClusterApi,
        identity: str | None = None,
        metrics: Metrics | None = None,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        rng: random.Random | None = None,
        coalesce: bool = True,
    ) -> None:
        self.settings = settings
        self.api = api
        # Standby counts written since the last resync: a decision repeats its wish until pods show up.
        self._standby_written: dict[str, int] = {}
        self.identity = identity or f"{COMPONENT}-{uuid.uuid4().hex[:8]}"
        self.metrics = metrics or Metrics()
        self.clock = clock
        self.monotonic = monotonic
        self.sleep = sleep
        self.rng = rng or random.Random()
        self.coalesce = coalesce
        self.elector = LeaseElector(api, settings, self.identity, monotonic, clock)
        self.view = ClusterView(settings)
        self.state: BurstState | None = None
        self.lock = threading.Lock()
        self.dirty = threading.Event()
        self.cursors = {NODES: _Cursor(), PODS: _Cursor()}
        self.last_decision: Decision | None = None
        self.last_reconcile: float | None = None  # monotonic
        self._backoff: dict[Action, _Backoff] = {}
        self._failed: set[Action] = set()  # actions whose last apply raised (not: nothing to do)
        self._reported: set[tuple[str, str, str]] = set()  # infeasible gangs already announced

    # -- reading the cluster -----------------------------------------------------------------------

    def _error(self, kind: str) -> None:
        self.metrics.errors.labels(kind).inc()

    def relist(self, kind: str) -> bool:
        """Full, paged list of one kind into the view; False (and cluster_visible 0) when it fails."""
        items: list[dict[str, Any]] = []
        token: str | None = None
        try:
            while True:
                page = self.api.list(kind, LIST_PAGE, token)
                items.extend(page.get("items") or ())
                meta = page.get("metadata") or {}
                token = meta.get("continue") or None
                if token is None:
                    break
        except Exception as exc:
            error = classify(exc)
            self._error(f"list_{error}")
            self.metrics.visible.set(0)
            with self.lock:
                self.view.mark_unsynced(nodes=kind == NODES, pods=kind == PODS)
            log.warning("list %s failed: %s", kind, error)
            return False
        with self.lock:
            if kind == NODES:
                self.view.replace_nodes(items, self.clock())
            else:
                self.view.replace_pods(items, self.clock())
        cursor = self.cursors[kind]
        cursor.resource_version, cursor.needs_list = str(meta.get("resourceVersion", "")), False
        del items
        # The view is long-lived and acyclic: freezing it keeps full GC passes from rescanning tens of
        # thousands of pod records, which otherwise shows up as millisecond stalls on single events.
        gc.freeze()
        self.metrics.visible.set(1)
        self.dirty.set()
        return True

    def watch_once(self, kind: str) -> str:
        """One watch request from the saved resourceVersion; on 410 or any error the kind is re-listed.

        Returns `WatchEnd.OK` when the watch (or the re-list a resync asked for) ended as the server meant it
        to, `WatchEnd.FAILED` otherwise. A watch that ends quietly refreshes nothing by itself: the kind stays
        as fresh as the last event, bookmark or list the server sent.
        """
        cursor = self.cursors[kind]
        if cursor.needs_list and not self.relist(kind):
            return WatchEnd.FAILED
        try:
            for event in self.api.watch(kind, cursor.resource_version):
                self._apply_event(kind, cursor, event)
        except Exception as exc:
            error = classify(exc)
            self._error(f"watch_{error}")
            cursor.needs_list = True
            with self.lock:  # events may have been missed: blind for this kind until the re-list
                self.view.mark_unsynced(nodes=kind == NODES, pods=kind == PODS)
            log.info("watch %s ended (%s): re-listing", kind, error)
            if error == "gone":  # the history was compacted: an expected end, re-list at once
                return WatchEnd.OK
            self.metrics.visible.set(0)
            return WatchEnd.FAILED
        return WatchEnd.OK

    def _apply_event(self, kind: str, cursor: _Cursor, event: dict[str, Any]) -> None:
        etype = event.get("type")
        obj = event.get("object") or {}
        if etype == "ERROR":
            code = obj.get("code")
            raise ApiException(
                status=int(code) if isinstance(code, int) else 500, reason=str(obj.get("reason"))
            )
        rv = str((obj.get("metadata") or {}).get("resourceVersion", ""))
        with self.lock:
            if etype in ("ADDED", "MODIFIED", "DELETED"):
                if kind == NODES:
                    self.view.apply_node(etype, obj)
                else:
                    self.view.apply_pod(etype, obj)
                self.dirty.set()
            if rv:  # the server vouched for this kind as of now (an object or a bookmark's resourceVersion)
                self.view.mark_fresh(self.clock(), kind)
        if rv:
            cursor.resource_version = rv
        self.metrics.visible.set(1)

    # -- deciding and acting ---------------------------------------------------------------------

    def reconcile_due(self, now_mono: float, dirty: bool) -> bool:
        """Whether the loop reconciles now: once per tick, however many events arrived (coalesced); without
        coalescing, also at every event."""
        if self.last_reconcile is None or now_mono - self.last_reconcile >= self.settings.tick_seconds:
            return True
        return dirty and not self.coalesce

    def reconcile(self) -> Decision | None:
        """Run the core on the current view; apply its actions only while leading."""
        now = self.clock()
        self.last_reconcile = self.monotonic()
        leading = self.elector.is_leader
        self.metrics.leader.set(1 if leading else 0)
        with self.lock:
            snapshot = self.view.snapshot()
        if not snapshot.synced:
            return None
        if not leading:
            # A follower keeps no memory: on takeover the mode comes from the taints, holds restart.
            self.state = None
            self.metrics.observe_inputs(snapshot)
            return None
        if self.state is None:
            self.state = state_from_snapshot(snapshot, now)
        decision = decide(snapshot, self.state, now, self.settings)
        self.state = decision.state
        self.last_decision = decision
        if decision.flipped is not None:
            self.metrics.flips.labels(decision.flipped.value).inc()
            log.info("burst %s: %s", decision.flipped.value, "; ".join(decision.reasons))
        if any(a.kind is ActionKind.UNGATE for a in decision.actions):
            log.info("%s", "; ".join(r for r in decision.reasons if r.startswith("handover")))
        wanted = set(decision.actions)
        for stale in [a for a in self._backoff if a not in wanted]:
            del self._backoff[stale]  # no longer wanted: a later wish starts afresh
        for action in decision.actions:
            if not self.elector.can_write():  # the lease may lapse while we work through a batch
                break
            waiting = self._backoff.get(action)
            if waiting is not None and self.monotonic() < waiting.next_at:
                continue
            if self.apply(action):
                self._backoff.pop(action, None)
                self.metrics.actions.labels(action.kind.value).inc()
                if action.kind in (ActionKind.OPEN_NODE, ActionKind.CLOSE_NODE, ActionKind.TAINT_PROVIDER):
                    self._event(action, decision)
            elif action in self._failed:
                self._back_off(action)
        self._report_infeasible(snapshot.infeasible)
        with self.lock:
            after = self.view.snapshot()
        self.metrics.observe(after, decision, decision.state)
        return decision

    def _back_off(self, action: Action) -> None:
        """Schedule the next try of a failed action: base × 2^(failures−1), capped, ±20 % jitter."""
        s = self.settings
        self._failed.discard(action)
        if s.action_backoff_base_seconds <= 0:
            return
        failures = (self._backoff[action].failures if action in self._backoff else 0) + 1
        delay = min(s.action_backoff_max_seconds, s.action_backoff_base_seconds * 2 ** (failures - 1))
        delay *= 1 + self.rng.uniform(-0.2, 0.2)
        self._backoff[action] = _Backoff(failures, self.monotonic() + delay)

    def apply(self, action: Action) -> bool:
        """Apply one action; False when it could not be applied (it will be re-emitted next time)."""
        try:
            if action.kind is ActionKind.SET_DELETION_COST:
                return self._set_deletion_cost(action.namespace, action.pod, action.deletion_cost)
            if action.kind is ActionKind.SET_STANDBY:
                return self._set_standby(action.service, action.replicas)
            if action.kind is ActionKind.UNGATE:
                return self._ungate(action.namespace, action.pod)
            if action.kind is ActionKind.TAINT_PROVIDER:
                return self._taint_provider(action.node)
            return self._set_taint(action.node, close=action.kind is ActionKind.CLOSE_NODE)
        except CallFailed as exc:
            self._error(exc.kind)
            self._failed.add(action)
            log.warning("%s %s%s failed: %s", action.kind.value, action.node, action.pod, exc)
            return False

    def _retrying(self, call: Callable[[], Any], on_conflict: Callable[[], None] | None = None) -> Any:
        """Run a write with backoff on server errors/timeouts; on 409 run `on_conflict` and try again.

        The lease is checked before every attempt and before a conflict's re-read: a write never starts
        unless it can land while this replica still holds the lease.
        """
        s = self.settings
        last = "other"
        for attempt in range(s.api_retry_attempts):
            if not self.elector.can_write():
                raise CallFailed("not_leader", "lease not held long enough to write")
            try:
                return call()
            except Exception as exc:
                last = classify(exc)
                if last == "conflict" and on_conflict is not None:
                    self._error("conflict")
                    if not self.elector.can_write():
                        raise CallFailed("not_leader", "lease not held long enough to write") from None
                    on_conflict()
                    continue
                if last not in RETRYABLE:
                    raise CallFailed(last, str(exc)) from None
                self._error(last)
                self.sleep(min(s.backoff_max_seconds, s.backoff_base_seconds * 2**attempt))
        raise CallFailed(last, f"gave up after {s.api_retry_attempts} attempts")

    def _set_taint(self, node: str, close: bool) -> bool:
        """Set (close) or remove (open) our NoSchedule burst taint; every copy of our key goes first."""
        s = self.settings

        def edit(taints: list[dict[str, Any]]) -> list[dict[str, Any]]:
            keep = [t for t in taints if t.get("key") != s.taint_key]  # a NoExecute copy included
            return [*keep, {"key": s.taint_key, "value": s.taint_value, "effect": "NoSchedule"}] if close else keep

        return self._edit_taints(node, edit, annotate=True)

    def _taint_provider(self, node: str) -> bool:
        """Add the provider's own taint (NoSchedule) to its node when no copy of it is there; nothing else."""
        with self.lock:
            record = self.view.node_record(node)
        wanted = self.settings.provider_taints.get(record.provider) if record is not None else None
        if wanted is None:
            return False
        key, _, value = wanted.partition("=")

        def edit(taints: list[dict[str, Any]]) -> list[dict[str, Any]]:
            if any(t.get("key") == key and str(t.get("value", "")) == value for t in taints):
                return taints
            return [*taints, {"key": key, "value": value, "effect": "NoSchedule"}]

        return self._edit_taints(node, edit, annotate=False)

    def _edit_taints(
        self, node: str, edit: Callable[[list[dict[str, Any]]], list[dict[str, Any]]], annotate: bool
    ) -> bool:
        """Patch a node's taints to ``edit(current)`` under its resourceVersion (a 409 re-reads and edits again)."""
        s = self.settings
        with self.lock:
            record = self.view.node_record(node)
        current: dict[str, Any] = {}
        if record is not None:
            current = {"taints": list(record.taints), "rv": record.resource_version}

        def reread() -> None:
            obj = self.api.read_node(node)
            current["taints"] = list((obj.get("spec") or {}).get("taints") or [])
            current["rv"] = str((obj.get("metadata") or {}).get("resourceVersion", ""))

        def patch() -> bool:
            if not current:
                reread()
            wanted = edit(current["taints"])
            if wanted == current["taints"]:
                return False
            meta: dict[str, Any] = {"resourceVersion": current["rv"]}
            if annotate:
                meta["annotations"] = {s.changed_at_annotation: _now_rfc3339(self.clock())}
            # A merge patch replaces the list; other taints are kept because we send them back,
            # and the resourceVersion turns a concurrent change into a 409 instead of a lost write.
            obj = self.api.patch_node(node, {"metadata": meta, "spec": {"taints": wanted}})
            with self.lock:
                self.view.apply_node("MODIFIED", obj)
            return True

        try:
            self._retrying(patch, on_conflict=reread)
        except CallFailed as exc:
            if exc.kind == "not_found":
                return False
            raise
        return True

    def _set_deletion_cost(self, namespace: str, pod: str, cost: int) -> bool:
        body = {"metadata": {"annotations": {POD_DELETION_COST_ANNOTATION: str(cost)}}}
        return self._patch_pod(namespace, pod, body, MERGE_PATCH)

    def _patch_pod(self, namespace: str, pod: str, body: dict[str, Any], content_type: str) -> bool:
        """Patch one pod with retries and feed the answer to the view; False when the pod is already gone."""

        def patch() -> None:
            obj = self.api.patch_pod(namespace, pod, body, content_type)
            with self.lock:
                self.view.apply_pod("MODIFIED", obj)

        try:
            self._retrying(patch)
        except CallFailed as exc:
            if exc.kind == "not_found":  # the pod went away first: nothing left to change
                return False
            raise
        return True

    def _set_standby(self, service: str, replicas: int) -> bool:
        """Scale the service's standby Deployment; a count already written since the last resync is skipped."""
        if self._standby_written.get(service) == replicas:
            return False
        s = self.settings
        name = standby_deployment(service)
        try:
            self._retrying(lambda: self.api.scale(s.inference_namespace, name, replicas))
        except CallFailed as exc:
            if exc.kind == "not_found":
                log.warning("standby Deployment %s/%s not found: no standby for %s", s.inference_namespace, name,
                            service)
                return False
            raise
        self._standby_written[service] = replicas
        log.info("standby %s: %d replicas", service, replicas)
        return True

    def _ungate(self, namespace: str, pod: str) -> bool:
        """Remove only our scheduling gate (a strategic-merge delete keyed by the gate's name)."""
        body = {"spec": {"schedulingGates": [{"$patch": "delete", "name": self.settings.handover_gate}]}}
        return self._patch_pod(namespace, pod, body, STRATEGIC_MERGE_PATCH)

    def _event_body(self, name_prefix: str, involved: dict[str, Any], reason: str, message: str,
                    kind: str = "Normal") -> dict[str, Any]:
        now = _now_rfc3339(self.clock())
        return {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{name_prefix}.burst-", "namespace": self.settings.event_namespace},
            "involvedObject": involved,
            "reason": reason,
            "message": message[:1024],
            "type": kind,
            "source": {"component": COMPONENT},
            "reportingComponent": COMPONENT,
            "reportingInstance": self.identity,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }

    def _create_event(self, body: dict[str, Any]) -> None:
        if not self.elector.can_write():
            return
        try:
            self.api.create_event(self.settings.event_namespace, body)
        except Exception as exc:
            self._error(f"event_{classify(exc)}")

    def _event(self, action: Action, decision: Decision) -> None:
        s = self.settings
        node_ref = {"apiVersion": "v1", "kind": "Node", "name": action.node}
        if action.kind is ActionKind.TAINT_PROVIDER:
            self._create_event(self._event_body(
                action.node, node_ref, "ProviderTaintRestored",
                "the node lacked its provider's own taint (created before its virtual kubelet registered it); "
                "added it as NoSchedule so only workloads that tolerate the provider land there",
                "Warning",
            ))
            return
        opened = action.kind is ActionKind.OPEN_NODE
        message = "; ".join(decision.reasons) or ("reconciled to " + decision.state.mode.value)
        self._create_event(self._event_body(
            action.node,
            node_ref,
            "BurstOpened" if opened else "BurstClosed",
            f"{s.taint_key} {'removed' if opened else 'set NoSchedule'}: {message}",
        ))

    def _report_infeasible(self, gangs: tuple[InfeasibleGang, ...]) -> None:
        """Training that can never fit: a gauge, and one Warning Event per gang (on our Lease, in our namespace,
        where our RBAC lets us write Events)."""
        self.metrics.infeasible.set(len(gangs))
        current = {(g.namespace, g.name, g.pool) for g in gangs}
        self._reported &= current
        s = self.settings
        for gang in gangs:
            key = (gang.namespace, gang.name, gang.pool)
            if key in self._reported:
                continue
            self._reported.add(key)
            log.warning("training %s/%s can never fit: %s", gang.namespace, gang.name, gang.reason)
            self._create_event(self._event_body(
                s.lease_name,
                {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "name": s.lease_name,
                 "namespace": s.namespace},
                "TrainingCannotFit",
                f"training {gang.namespace}/{gang.name} ({len(gang.pods)} pods, {gang.gpus} GPUs) can never fit: "
                f"{gang.reason}; it holds no burst open and keeps no standby",
                "Warning",
            ))

    # -- running ---------------------------------------------------------------------------------

    def run(self, stop: threading.Event) -> None:
        """Run until `stop` is set: two watch threads, a lease loop, and decisions on events and ticks."""
        s = self.settings
        threads = [
            threading.Thread(target=self._watch_loop, args=(kind, stop), name=f"watch-{kind}", daemon=True)
            for kind in (NODES, PODS)
        ]
        threads.append(threading.Thread(target=self._lease_loop, args=(stop,), name="lease", daemon=True))
        for t in threads:
            t.start()
        last_resync = self.monotonic()
        try:
            while not stop.is_set():
                self._wait_for_turn(stop)
                if stop.is_set():
                    break
                if self.monotonic() - last_resync >= s.resync_seconds:
                    # A periodic full list repairs anything a missed event could have left wrong.
                    for cursor in self.cursors.values():
                        cursor.needs_list = True
                    self._standby_written.clear()
                    last_resync = self.monotonic()
                try:
                    self.reconcile()
                except Exception:
                    self._error("reconcile")
                    log.exception("reconcile failed")
        finally:
            stop.set()
            self.elector.release()
            for t in threads:
                t.join(timeout=s.request_timeout_seconds)

    def _wait_for_turn(self, stop: threading.Event) -> None:
        """Sleep until `reconcile_due`: the next tick, or (without coalescing) the next event."""
        while not stop.is_set():
            dirty = self.dirty.is_set()
            if self.reconcile_due(self.monotonic(), dirty):
                self.dirty.clear()
                return
            left = self.settings.tick_seconds - (self.monotonic() - (self.last_reconcile or 0.0))
            if self.coalesce:
                stop.wait(max(0.0, left))
            else:
                self.dirty.wait(max(0.0, left))

    def _watch_loop(self, kind: str, stop: threading.Event) -> None:
        failures = 0
        while not stop.is_set():
            if self.watch_once(kind) == WatchEnd.FAILED:
                failures += 1
                delay = min(
                    self.settings.backoff_max_seconds, self.settings.backoff_base_seconds * 2**failures
                )
                stop.wait(delay)
            else:
                failures = 0

    def _lease_loop(self, stop: threading.Event) -> None:
        while not stop.is_set():
            leading = self.elector.step()
            self.metrics.leader.set(1 if leading else 0)
            stop.wait(self.settings.retry_period_seconds)
