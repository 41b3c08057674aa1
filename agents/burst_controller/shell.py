"""The I/O shell: list/watch into the view, run the core, apply its actions if this replica leads.

Failure behaviour (each is counted in `gpucluster_burst_errors_total{kind}`):
- cannot list or watch: `cluster_visible` = 0, the view goes unsynced/stale and the core changes nothing;
- watch expired (410 Gone) or broken: re-list that kind, then watch from the new resourceVersion;
- patch conflict (409): re-read the node and patch again on its fresh resourceVersion;
- 5xx, 429, timeouts, connection errors: exponential backoff, bounded attempts; an action that still
  fails is simply re-emitted by the next decision because the view still shows the mismatch;
- lease lost or not renewed within the renew deadline: stop acting at once; another replica takes over
  once the lease has not changed for its duration.

Handover actions are idempotent: scaling a standby Deployment writes the wanted count through the scale
subresource (a repeat is skipped until the next resync), and lifting the gate is a strategic-merge delete
of our gate alone, so other gates on the pod stay and a pod already released is a no-op.
"""

from __future__ import annotations

import gc
import json
import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import urllib3
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from prometheus_client import CollectorRegistry, Counter, Gauge

from agents.burst_controller.decide import (
    Action,
    ActionKind,
    BurstState,
    Decision,
    Mode,
    Snapshot,
    decide,
    state_from_snapshot,
)
from agents.burst_controller.settings import POD_DELETION_COST_ANNOTATION, BurstSettings, standby_deployment
from agents.burst_controller.view import ClusterView

log = logging.getLogger("burst_controller")

NODES = "nodes"
PODS = "pods"
LIST_PAGE = 500  # keeps each list response small on clusters with tens of thousands of pods
MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"
COMPONENT = "burst-controller"


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
        api: client.CoordinationV1Api,
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

    def _timeout(self) -> float:
        return self._s.request_timeout_seconds

    def step(self) -> bool:
        """Try once to acquire or renew; returns whether this replica leads now."""
        s = self._s
        now_mono = self._mono()
        try:
            try:
                lease = self._api.read_namespaced_lease(
                    s.lease_name, s.namespace, _request_timeout=self._timeout()
                )
            except ApiException as exc:
                if exc.status != 404:
                    raise
                self._api.create_namespaced_lease(
                    s.namespace, self._record(None), _request_timeout=self._timeout()
                )
                self._renewed_at = now_mono
                return True
            spec = lease.spec or client.V1LeaseSpec()
            holder = spec.holder_identity or ""
            seen = (holder, str(spec.renew_time))
            if seen != self._observed:
                self._observed, self._observed_at = seen, now_mono
            duration = float(spec.lease_duration_seconds or s.lease_duration_seconds)
            expired = now_mono - self._observed_at >= duration
            if holder and holder != self.identity and not expired:
                self._renewed_at = None
                return False
            body = self._record(lease)
            self._api.replace_namespaced_lease(
                s.lease_name, s.namespace, body, _request_timeout=self._timeout()
            )
            self._observed = (self.identity, str(body.spec.renew_time if body.spec else ""))
            self._observed_at = now_mono
            self._renewed_at = now_mono
            return True
        except (ApiException, urllib3.exceptions.HTTPError, OSError) as exc:
            log.warning("lease %s/%s: %s", s.namespace, s.lease_name, classify(exc))
            return self.is_leader

    def _record(self, current: client.V1Lease | None) -> client.V1Lease:
        now = datetime.fromtimestamp(self._wall(), UTC)
        spec = current.spec if current is not None and current.spec is not None else client.V1LeaseSpec()
        same = spec.holder_identity == self.identity
        transitions = spec.lease_transitions or 0
        return client.V1Lease(
            metadata=client.V1ObjectMeta(
                name=self._s.lease_name,
                namespace=self._s.namespace,
                resource_version=current.metadata.resource_version if current and current.metadata else None,
            ),
            spec=client.V1LeaseSpec(
                holder_identity=self.identity,
                lease_duration_seconds=int(self._s.lease_duration_seconds),
                acquire_time=spec.acquire_time if same and spec.acquire_time else now,
                renew_time=now,
                lease_transitions=transitions if same or current is None else transitions + 1,
            ),
        )

    def release(self) -> None:
        """Give the lease up on a clean shutdown so the next replica need not wait for expiry."""
        if not self.is_leader:
            return
        s = self._s
        try:
            lease = self._api.read_namespaced_lease(
                s.lease_name, s.namespace, _request_timeout=self._timeout()
            )
            if lease.spec is not None and lease.spec.holder_identity == self.identity:
                lease.spec.holder_identity = None
                lease.spec.lease_duration_seconds = 1
                self._api.replace_namespaced_lease(
                    s.lease_name, s.namespace, lease, _request_timeout=self._timeout()
                )
        except (ApiException, urllib3.exceptions.HTTPError, OSError) as exc:
            log.warning("lease release: %s", classify(exc))
        self._renewed_at = None


@dataclass
class _Cursor:
    resource_version: str = ""
    needs_list: bool = True


class BurstShell:
    """Glue between the API and the core; every method is one step so tests can drive it."""

    def __init__(
        self,
        settings: BurstSettings,
        api_client: client.ApiClient,
        identity: str | None = None,
        metrics: Metrics | None = None,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.settings = settings
        self.core = client.CoreV1Api(api_client)
        self.apps = client.AppsV1Api(api_client)
        # Standby counts written since the last resync: a decision repeats its wish until pods show up.
        self._standby_written: dict[str, int] = {}
        self.identity = identity or f"{COMPONENT}-{uuid.uuid4().hex[:8]}"
        self.metrics = metrics or Metrics()
        self.clock = clock
        self.sleep = sleep
        self.elector = LeaseElector(
            client.CoordinationV1Api(api_client), settings, self.identity, monotonic, clock
        )
        self.view = ClusterView(settings)
        self.state: BurstState | None = None
        self.lock = threading.Lock()
        self.dirty = threading.Event()
        self.cursors = {NODES: _Cursor(), PODS: _Cursor()}
        self.last_decision: Decision | None = None

    # -- reading the cluster -----------------------------------------------------------------------

    def _list_fn(self, kind: str) -> Callable[..., Any]:
        return self.core.list_node if kind == NODES else self.core.list_pod_for_all_namespaces

    def _error(self, kind: str) -> None:
        self.metrics.errors.labels(kind).inc()

    def relist(self, kind: str) -> bool:
        """Full, paged list of one kind into the view; False (and cluster_visible 0) when it fails."""
        items: list[dict[str, Any]] = []
        token: str | None = None
        try:
            while True:
                page = self._json(
                    self._list_fn(kind)(
                        limit=LIST_PAGE,
                        _continue=token,
                        _preload_content=False,
                        _request_timeout=self.settings.request_timeout_seconds,
                    )
                )
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

    def watch_once(self, kind: str) -> None:
        """One watch request from the saved resourceVersion; on 410 or any error the kind is re-listed."""
        cursor = self.cursors[kind]
        if cursor.needs_list and not self.relist(kind):
            return
        s = self.settings
        try:
            resp = self._list_fn(kind)(
                watch=True,
                resource_version=cursor.resource_version,
                allow_watch_bookmarks=True,
                timeout_seconds=s.watch_timeout_seconds,
                _preload_content=False,
                _request_timeout=(
                    s.request_timeout_seconds,
                    s.watch_timeout_seconds + s.request_timeout_seconds,
                ),
            )
            try:
                for event in self._events(resp):
                    self._apply_event(kind, cursor, event)
            finally:
                resp.release_conn()
        except Exception as exc:
            error = classify(exc)
            self._error(f"watch_{error}")
            cursor.needs_list = True
            with self.lock:  # events may have been missed: blind for this kind until the re-list
                self.view.mark_unsynced(nodes=kind == NODES, pods=kind == PODS)
            log.info("watch %s ended (%s): re-listing", kind, error)
            if error != "gone":
                self.metrics.visible.set(0)
            return
        with self.lock:
            self.view.mark_fresh(self.clock())

    @staticmethod
    def _events(resp: Any) -> Iterator[dict[str, Any]]:
        """Watch events, one JSON object per line, as chunks arrive."""
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
            self.view.mark_fresh(self.clock())
        if rv:
            cursor.resource_version = rv
        self.metrics.visible.set(1)

    # -- deciding and acting ---------------------------------------------------------------------

    def reconcile(self) -> Decision | None:
        """Run the core on the current view; apply its actions only while leading."""
        now = self.clock()
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
        for action in decision.actions:
            if not self.elector.is_leader:  # the lease may lapse while we work through a batch
                break
            if self.apply(action):
                self.metrics.actions.labels(action.kind.value).inc()
                if action.kind in (ActionKind.OPEN_NODE, ActionKind.CLOSE_NODE):
                    self._event(action, decision)
        with self.lock:
            after = self.view.snapshot()
        self.metrics.observe(after, decision, decision.state)
        return decision

    def apply(self, action: Action) -> bool:
        """Apply one action; False when it could not be applied (it will be re-emitted next time)."""
        try:
            if action.kind is ActionKind.SET_DELETION_COST:
                return self._set_deletion_cost(action.namespace, action.pod, action.deletion_cost)
            if action.kind is ActionKind.SET_STANDBY:
                return self._set_standby(action.service, action.replicas)
            if action.kind is ActionKind.UNGATE:
                return self._ungate(action.namespace, action.pod)
            return self._set_taint(action.node, close=action.kind is ActionKind.CLOSE_NODE)
        except CallFailed as exc:
            self._error(exc.kind)
            log.warning("%s %s%s failed: %s", action.kind.value, action.node, action.pod, exc)
            return False

    def _retrying(self, call: Callable[[], Any], on_conflict: Callable[[], None] | None = None) -> Any:
        """Run `call` with backoff on server errors/timeouts; on 409 run `on_conflict` and try again."""
        s = self.settings
        last = "other"
        for attempt in range(s.api_retry_attempts):
            try:
                return call()
            except Exception as exc:
                last = classify(exc)
                if last == "conflict" and on_conflict is not None:
                    self._error("conflict")
                    on_conflict()
                    continue
                if last not in RETRYABLE:
                    raise CallFailed(last, str(exc)) from None
                self._error(last)
                self.sleep(min(s.backoff_max_seconds, s.backoff_base_seconds * 2**attempt))
        raise CallFailed(last, f"gave up after {s.api_retry_attempts} attempts")

    def _set_taint(self, node: str, close: bool) -> bool:
        s = self.settings
        with self.lock:
            record = self.view.node_record(node)
        current: dict[str, Any] = {}
        if record is not None:
            current = {"taints": list(record.taints), "rv": record.resource_version}

        def reread() -> None:
            obj = self._json(
                self.core.read_node(node, _preload_content=False, _request_timeout=s.request_timeout_seconds)
            )
            current["taints"] = list((obj.get("spec") or {}).get("taints") or [])
            current["rv"] = str((obj.get("metadata") or {}).get("resourceVersion", ""))

        def patch() -> bool:
            if not current:
                reread()
            keep = [t for t in current["taints"] if t.get("key") != s.taint_key]
            ours = {"key": s.taint_key, "value": s.taint_value, "effect": "NoSchedule"}
            wanted = [*keep, ours] if close else keep
            if wanted == current["taints"]:
                return False
            body = {
                "metadata": {
                    "resourceVersion": current["rv"],
                    "annotations": {s.changed_at_annotation: _now_rfc3339(self.clock())},
                },
                # A merge patch replaces the list; other taints are kept because we send them back,
                # and the resourceVersion turns a concurrent change into a 409 instead of a lost write.
                "spec": {"taints": wanted},
            }
            obj = self._json(
                self.core.patch_node(
                    node,
                    body,
                    _content_type=MERGE_PATCH,
                    _preload_content=False,
                    _request_timeout=s.request_timeout_seconds,
                )
            )
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
        s = self.settings

        def patch() -> None:
            obj = self._json(
                self.core.patch_namespaced_pod(
                    pod,
                    namespace,
                    body,
                    _content_type=content_type,
                    _preload_content=False,
                    _request_timeout=s.request_timeout_seconds,
                )
            )
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

        def patch() -> None:
            self.apps.patch_namespaced_deployment_scale(
                name,
                s.inference_namespace,
                {"spec": {"replicas": replicas}},
                _content_type=MERGE_PATCH,
                _request_timeout=s.request_timeout_seconds,
            )

        try:
            self._retrying(patch)
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

    def _event(self, action: Action, decision: Decision) -> None:
        s = self.settings
        opened = action.kind is ActionKind.OPEN_NODE
        now = datetime.fromtimestamp(self.clock(), UTC)
        message = "; ".join(decision.reasons) or ("reconciled to " + decision.state.mode.value)
        event = client.CoreV1Event(
            metadata=client.V1ObjectMeta(generate_name=f"{action.node}.burst-", namespace=s.event_namespace),
            involved_object=client.V1ObjectReference(api_version="v1", kind="Node", name=action.node),
            reason="BurstOpened" if opened else "BurstClosed",
            message=f"{s.taint_key} {'removed' if opened else 'set NoSchedule'}: {message}"[:1024],
            type="Normal",
            source=client.V1EventSource(component=COMPONENT),
            reporting_component=COMPONENT,
            reporting_instance=self.identity,
            first_timestamp=now,
            last_timestamp=now,
            count=1,
        )
        try:
            self.core.create_namespaced_event(
                s.event_namespace, event, _request_timeout=s.request_timeout_seconds
            )
        except Exception as exc:
            self._error(f"event_{classify(exc)}")

    @staticmethod
    def _json(resp: Any) -> dict[str, Any]:
        try:
            data = json.loads(resp.data)
        finally:
            resp.release_conn()
        if not isinstance(data, dict):
            raise ValueError("API answer is not an object")
        return data

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
        last_resync = time.monotonic()
        try:
            while not stop.is_set():
                self.dirty.wait(s.tick_seconds)
                self.dirty.clear()
                if time.monotonic() - last_resync >= s.resync_seconds:
                    # A periodic full list repairs anything a missed event could have left wrong.
                    for cursor in self.cursors.values():
                        cursor.needs_list = True
                    self._standby_written.clear()
                    last_resync = time.monotonic()
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

    def _watch_loop(self, kind: str, stop: threading.Event) -> None:
        failures = 0
        while not stop.is_set():
            self.watch_once(kind)
            if self.cursors[kind].needs_list:
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
