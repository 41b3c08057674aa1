"""The I/O shell: list/watch into the view, run the core, apply its actions while this replica leads.

It stands on the agent kit (:mod:`agents.kit`): every call goes through the kit's port, so the same shell runs
on the real API (``HttpPort``) and on the in-memory one (``MemoryApi``) the tests and the benchmark use.

Failure behaviour (each is counted in ``gpucluster_burst_errors_total{kind}``, kinds from ``agents.kit.errors``):
- cannot list or watch: ``cluster_visible`` = 0, that kind goes unsynced and the core changes nothing;
- watch expired (410 Gone) or broken: re-list that kind, then watch from the new resourceVersion; only a
  failure grows the watch backoff, a watch that ends at its timeout or a periodic resync does not;
- freshness is kept per kind and only what the server confirmed counts: a list, an event or a bookmark;
- patch conflict (409): re-read the node and patch again on its fresh resourceVersion;
- 5xx, 429, timeouts, connection errors: exponential backoff, bounded attempts; an action that still fails
  (or fails for good: 403, 422) waits its own exponential backoff with jitter before it is tried again;
- watch events are coalesced: at most one reconcile per tick, however many events arrive;
- writes are fenced by the port: each one, retries and conflict re-reads' patches included, starts only if it
  can finish (its request timeout) before the lease could pass to another replica.

Handover actions are idempotent: scaling a standby (or warm-pool) Deployment writes the wanted count through
the scale subresource (a repeat is skipped until the next resync), and lifting the gate is a strategic-merge delete
of our gate alone, so other gates on the pod stay and a pod already released is a no-op. The return's evictions
go through the Eviction API (the PDB decides; a refusal fails the action at once and is retried after its
backoff, never inside the cycle) and the evicted pod is
marked leaving in the view at once, so the next decision counts the move even before the watch reports it.
"""

from __future__ import annotations

import gc
import logging
import random
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from agents.burst_controller.contract import (
    POD_DELETION_COST_ANNOTATION,
    BurstSettings,
    return_deployment,
    standby_deployment,
    warm_deployment,
)
from agents.burst_controller.decide import (
    Action,
    ActionKind,
    BurstState,
    Decision,
    InfeasibleGang,
    Snapshot,
    decide,
    state_from_snapshot,
)
from agents.burst_controller.metrics import Metrics
from agents.burst_controller.view import ClusterView
from agents.kit.calls import Retry, event, eviction_body, unless_gone
from agents.kit.errors import ApiError, as_api_error, classify
from agents.kit.informer import Informer, WatchEnd
from agents.kit.lease import LeaseElector, rfc3339_micro
from agents.kit.loop import lease_loop
from agents.kit.port import (
    BASE_CONNECTIONS,
    DEPLOYMENTS,
    EVENTS,
    MERGE_PATCH,
    NODES,
    PODS,
    STRATEGIC_MERGE_PATCH,
    Fenced,
    KubePort,
    Resource,
)

log = logging.getLogger("burst_controller")

#: Gate lifts of one decision in flight at once. One after another, each a round trip of ~25 ms, released a
#: 2,048-pod gang in about 50 s on the scale control plane (docs/scale.md); the API server's priority and fairness
#: bounds what it serves, and every lift is still fenced by the port.
UNGATE_CONCURRENCY = 16
#: Node changes people hear of as Events on the node.
NODE_EVENTS = frozenset({ActionKind.OPEN_NODE, ActionKind.CLOSE_NODE, ActionKind.TAINT_PROVIDER,
                         ActionKind.RESERVE_NODE, ActionKind.RELEASE_NODE})
#: What the controller watches (each watch holds a connection while it runs).
WATCHED = (NODES, PODS)


def connections(settings: BurstSettings) -> int:
    """Calls in flight at once: each watch, the Lease's watch and its renewal, the loop, and a gang's gate lifts."""
    return len(WATCHED) + BASE_CONNECTIONS + UNGATE_CONCURRENCY


def _batches(actions: tuple[Action, ...] | list[Action]) -> list[list[Action]]:
    """The decision's actions in order, each a batch of its own, except that a run of gate lifts is one batch."""
    out: list[list[Action]] = []
    for action in actions:
        if action.kind is ActionKind.UNGATE and out and out[-1][0].kind is ActionKind.UNGATE:
            out[-1].append(action)
        else:
            out.append([action])
    return out

COMPONENT = "burst-controller"

__all__ = ["COMPONENT", "NODES", "PODS", "BurstShell", "Metrics", "Snapshot", "WatchEnd"]


@dataclass
class _Backoff:
    failures: int
    next_at: float


class _ViewSink:
    """An informer's sink on one kind of the view, under the shell's lock."""

    def __init__(self, shell: BurstShell, kind: str) -> None:
        self.shell, self.kind = shell, kind

    def replace(self, items: list[dict[str, Any]]) -> None:
        sh = self.shell
        with sh.lock:
            if self.kind == "nodes":
                sh.view.replace_nodes(items, sh.clock())
            else:
                sh.view.replace_pods(items, sh.clock())
        # The view is long-lived and acyclic: freezing it keeps full GC passes from rescanning tens of
        # thousands of pod records, which otherwise shows up as millisecond stalls on single events.
        gc.freeze()
        sh.metrics.visible.set(1)
        sh.dirty.set()

    def apply(self, event_type: str, obj: dict[str, Any]) -> None:
        sh = self.shell
        with sh.lock:
            if self.kind == "nodes":
                sh.view.apply_node(event_type, obj)
            else:
                sh.view.apply_pod(event_type, obj)
        sh.dirty.set()

    def fresh(self) -> None:
        sh = self.shell
        with sh.lock:
            sh.view.mark_fresh(sh.clock(), self.kind)
        sh.metrics.visible.set(1)

    def unsynced(self) -> None:
        sh = self.shell
        with sh.lock:
            sh.view.mark_unsynced(nodes=self.kind == "nodes", pods=self.kind == "pods")
        sh.metrics.visible.set(0)


class BurstShell:
    """Glue between the API and the core; every method is one step so tests can drive it.

    ``coalesce=False`` and ``action_backoff_base_seconds=0`` give the shell's earlier behaviour (a reconcile per
    watch event, failed actions retried at every reconcile); the benchmark keeps it as its baseline row.
    """

    def __init__(
        self,
        settings: BurstSettings,
        api: KubePort,
        identity: str | None = None,
        metrics: Metrics | None = None,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        rng: random.Random | None = None,
        coalesce: bool = True,
    ) -> None:
        s = self.settings = settings
        # Counts written per standby or warm Deployment since the last resync: a decision repeats its wish
        # until pods show up.
        self._scaled: dict[str, int] = {}
        self.identity = identity or f"{COMPONENT}-{uuid.uuid4().hex[:8]}"
        self.metrics = metrics or Metrics()
        self.registry = self.metrics.registry
        self.clock = clock
        self.monotonic = monotonic
        self.sleep = sleep
        self.rng = rng or random.Random()
        self.coalesce = coalesce
        self.elector = LeaseElector(
            api, s.namespace, s.lease_name, self.identity, lease_duration_seconds=s.lease_duration_seconds,
            renew_deadline_seconds=s.renew_deadline_seconds, request_timeout_seconds=s.request_timeout_seconds,
            monotonic=monotonic, wall=clock)
        #: Every call but the elector's own goes through the fence.
        self.api = Fenced(api, self.elector.can_write, s.request_timeout_seconds)
        self.retry = Retry(s.api_retry_attempts, s.backoff_base_seconds, s.backoff_max_seconds, sleep, self._error)
        self.view = ClusterView(settings)
        self.state: BurstState | None = None
        self.lock = threading.Lock()
        self.dirty = threading.Event()
        self.informers = {resource: Informer(self.api, resource, _ViewSink(self, resource.plural),
                                             watch_timeout_seconds=s.watch_timeout_seconds, on_error=self._error)
                          for resource in WATCHED}
        self.last_decision: Decision | None = None
        self.last_reconcile: float | None = None  # monotonic
        self._backoff: dict[Action, _Backoff] = {}
        self._failed: set[Action] = set()  # actions whose last apply raised (not: nothing to do)
        self._reported: set[tuple[str, str, str]] = set()  # infeasible gangs already announced
        self._pool: ThreadPoolExecutor | None = None  # gate lifts side by side, made on the first gang

    # -- reading the cluster -----------------------------------------------------------------------

    def _error(self, kind: str) -> None:
        self.metrics.errors.labels(kind).inc()

    def relist(self, resource: Resource) -> bool:
        """Full, paged list of nodes or pods into the view; False (and cluster_visible 0) when it fails."""
        return self.informers[resource].relist()

    def watch_once(self, resource: Resource) -> str:
        """One watch of nodes or pods from its saved resourceVersion (:class:`agents.kit.informer.Informer`)."""
        return self.informers[resource].watch_once()

    def last_pass(self) -> float | None:
        return self.last_reconcile

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
        for batch in _batches(decision.actions):
            if not self.elector.can_write():  # the port would refuse each; stop the batch instead
                break
            due = [a for a in batch if (w := self._backoff.get(a)) is None or self.monotonic() >= w.next_at]
            for action, applied in zip(due, self._apply_batch(due), strict=True):
                if applied:
                    self._backoff.pop(action, None)
                    self.metrics.actions.labels(action.kind.value).inc()
                    if action.kind in NODE_EVENTS:
                        self._event(action, decision)
                elif action in self._failed:
                    self._back_off(action)
        self._report_infeasible(snapshot.infeasible)
        with self.lock:
            after = self.view.snapshot()
        self.metrics.observe(after, decision, decision.state)
        return decision

    def _apply_batch(self, batch: list[Action]) -> list[bool]:
        """Apply a batch: one action in this thread; a gang's gate lifts side by side (``UNGATE_CONCURRENCY``), each
        through the fenced port, so a 2,048-pod gang is released in seconds, not one round trip after another.
        Results come back in the batch's order, so the bookkeeping stays in this thread."""
        if len(batch) <= 1:
            return [self.apply(a) for a in batch]
        if self._pool is None:
            self._pool = ThreadPoolExecutor(UNGATE_CONCURRENCY, thread_name_prefix="ungate")
        return list(self._pool.map(self.apply, batch))

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
                return self._scale(standby_deployment(action.service), "standby", action.service, action.replicas)
            if action.kind is ActionKind.SET_WARM:
                return self._scale(warm_deployment(action.service), "warm pool", action.service, action.replicas)
            if action.kind is ActionKind.SET_RETURN:
                return self._scale(return_deployment(action.service), "return", action.service, action.replicas)
            if action.kind is ActionKind.EVICT:
                return self._evict(action.namespace, action.pod)
            if action.kind is ActionKind.UNGATE:
                return self._ungate(action.namespace, action.pod)
            if action.kind is ActionKind.TAINT_PROVIDER:
                return self._taint_provider(action.node)
            if action.kind in (ActionKind.RESERVE_NODE, ActionKind.RELEASE_NODE):
                return self._reserve(action.node, action.pool if action.kind is ActionKind.RESERVE_NODE else None)
            return self._set_taint(action.node, close=action.kind is ActionKind.CLOSE_NODE)
        except ApiError as exc:
            self._error(exc.kind)
            self._failed.add(action)
            log.warning("%s %s%s failed: %s", action.kind.value, action.node, action.pod, exc)
            return False

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

    def _reserve(self, node: str, pool: str | None) -> bool:
        """Put the handover's reservation on an on-prem node (``<prefix>/reserved=<pool>:NoSchedule``, every other
        copy of the key replaced) or, with no pool, take it off; nothing else of the node changes."""
        key = self.settings.reserved_taint_key

        def edit(taints: list[dict[str, Any]]) -> list[dict[str, Any]]:
            keep = [t for t in taints if t.get("key") != key]
            return keep if pool is None else [*keep, {"key": key, "value": pool, "effect": "NoSchedule"}]

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
            obj = self.api.get(NODES, node)
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
                meta["annotations"] = {s.changed_at_annotation: rfc3339_micro(self.clock())}
            # A merge patch replaces the list; other taints are kept because we send them back,
            # and the resourceVersion turns a concurrent change into a 409 instead of a lost write.
            obj = self.api.patch(NODES, node, {"metadata": meta, "spec": {"taints": wanted}})
            with self.lock:
                self.view.apply_node("MODIFIED", obj)
            return True

        return unless_gone(self.retry, patch, on_conflict=reread)

    def _set_deletion_cost(self, namespace: str, pod: str, cost: int) -> bool:
        body = {"metadata": {"annotations": {POD_DELETION_COST_ANNOTATION: str(cost)}}}
        return self._patch_pod(namespace, pod, body, MERGE_PATCH)

    def _patch_pod(self, namespace: str, pod: str, body: dict[str, Any], content_type: str) -> bool:
        """Patch one pod with retries and feed the answer to the view; False when the pod is already gone."""

        def patch() -> None:
            obj = self.api.patch(PODS, pod, body, namespace, content_type)
            with self.lock:
                self.view.apply_pod("MODIFIED", obj)

        return unless_gone(self.retry, patch)  # False: the pod went away first, nothing left to change

    def _scale(self, name: str, what: str, service: str, replicas: int) -> bool:
        """Scale a service's standby or warm Deployment `name`; a count already written since the last resync
        is skipped."""
        if self._scaled.get(name) == replicas:
            return False
        s = self.settings
        try:
            self.retry(lambda: self.api.patch(DEPLOYMENTS, name, {"spec": {"replicas": replicas}},
                                              s.inference_namespace, MERGE_PATCH, "scale"))
        except ApiError as exc:
            if exc.kind == "not_found":
                log.warning("%s Deployment %s/%s not found: no %s for %s", what, s.inference_namespace, name,
                            what, service)
                return False
            raise
        self._scaled[name] = replicas
        log.info("%s %s: %d replicas", what, service, replicas)
        return True

    def _evict(self, namespace: str, pod: str) -> bool:
        """Evict a replica through the Eviction API (the return's, or the clearing's); False when it is already gone.

        A PodDisruptionBudget's "not now" (429) fails the action at once, to be tried again after its action backoff
        (the next decision may not even want it): retried inside the call (5 attempts with backoff, about 7.5 s) it
        held the whole cycle for each refusal, in turn — minutes for the dozens of replicas a clearing at the prod
        stack's size asks at once, with no taint, gate or standby acted on meanwhile (found by the burst run at
        scale). Other retryable failures are retried as every call is."""
        def call() -> object:
            return self.api.create(PODS, eviction_body(namespace, pod), namespace, pod, "eviction")

        try:
            call()
        except Exception as exc:
            error = as_api_error(exc)
            if error.kind == "not_found":
                return False
            if error.kind == "throttled" or not error.retryable:
                raise error from None
            self._error(error.kind)
            if not unless_gone(self.retry, call):
                return False
        with self.lock:
            self.view.mark_leaving(namespace, pod)
        return True

    def _ungate(self, namespace: str, pod: str) -> bool:
        """Remove only our scheduling gate (a strategic-merge delete keyed by the gate's name)."""
        body = {"spec": {"schedulingGates": [{"$patch": "delete", "name": self.settings.handover_gate}]}}
        return self._patch_pod(namespace, pod, body, STRATEGIC_MERGE_PATCH)

    def _create_event(self, involved: dict[str, Any], reason: str, message: str, warning: bool = False) -> None:
        """An Event for people; refused like any write when this replica may not write, and never retried."""
        body = event(name_prefix=str(involved["name"]), involved=involved, reason=reason, message=message,
                     component=COMPONENT, instance=self.identity, warning=warning, now=self.clock())
        try:
            self.api.create(EVENTS, body, body["metadata"]["namespace"])
        except Exception as exc:
            self._error(f"event_{classify(exc)}")

    def _event(self, action: Action, decision: Decision) -> None:
        s = self.settings
        node_ref = {"apiVersion": "v1", "kind": "Node", "name": action.node}
        if action.kind is ActionKind.TAINT_PROVIDER:
            self._create_event(
                node_ref, "ProviderTaintRestored",
                "the node lacked its provider's own taint (created before its virtual kubelet registered it); "
                "added it as NoSchedule so only workloads that tolerate the provider land there",
                warning=True,
            )
            return
        if action.kind in (ActionKind.RESERVE_NODE, ActionKind.RELEASE_NODE):
            reserved = action.kind is ActionKind.RESERVE_NODE
            why = "; ".join(r for r in decision.reasons if r.startswith("handover")) or "no training waits for it"
            self._create_event(
                node_ref, "NodeReserved" if reserved else "NodeReservationReleased",
                f"{s.reserved_taint_key}{'=' + action.pool + ' set NoSchedule' if reserved else ' removed'}: {why}")
            return
        opened = action.kind is ActionKind.OPEN_NODE
        message = "; ".join(decision.reasons) or ("reconciled to " + decision.state.mode.value)
        self._create_event(
            node_ref,
            "BurstOpened" if opened else "BurstClosed",
            f"{s.taint_key} {'removed' if opened else 'set NoSchedule'}: {message}",
        )

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
            self._create_event(
                {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "name": s.lease_name,
                 "namespace": s.namespace},
                "TrainingCannotFit",
                f"training {gang.namespace}/{gang.name} ({len(gang.pods)} pods, {gang.gpus} GPUs) can never fit: "
                f"{gang.reason}; it holds no burst open and keeps no standby",
                warning=True,
            )

    # -- running ---------------------------------------------------------------------------------

    def run(self, stop: threading.Event) -> None:
        """Run until ``stop`` is set: two watch threads, a lease loop, and decisions on events and ticks; the
        lease is released on the way out."""
        s = self.settings
        threads = [
            threading.Thread(target=informer.run, args=(stop, s.backoff_base_seconds, s.backoff_max_seconds),
                             name=f"watch-{resource.plural}", daemon=True)
            for resource, informer in self.informers.items()
        ]
        threads.append(threading.Thread(
            target=self.elector.follower(s.watch_timeout_seconds, self._error).run,
            args=(stop, s.backoff_base_seconds, s.backoff_max_seconds), name="watch-lease", daemon=True))
        renewer = threading.Thread(
            target=lease_loop, args=(self.elector.step, lambda lead: self.metrics.leader.set(1 if lead else 0),
                                     s.retry_period_seconds, stop), name="lease", daemon=True)
        for t in (*threads, renewer):
            t.start()
        last_resync = self.monotonic()
        try:
            while not stop.is_set():
                self._wait_for_turn(stop)
                if stop.is_set():
                    break
                if self.monotonic() - last_resync >= s.resync_seconds:
                    # A periodic full list repairs anything a missed event could have left wrong.
                    for informer in self.informers.values():
                        informer.needs_list = True
                    self._scaled.clear()
                    last_resync = self.monotonic()
                try:
                    self.reconcile()
                except Exception:
                    self._error("reconcile")
                    log.exception("reconcile failed")
        finally:
            stop.set()
            renewer.join(timeout=s.request_timeout_seconds)  # a renewal in flight ends before the release
            self.elector.release()
            self.metrics.leader.set(0)
            for t in threads:
                t.join(timeout=s.request_timeout_seconds)

    def _wait_for_turn(self, stop: threading.Event) -> None:
        """Sleep until ``reconcile_due``: the next tick, or (without coalescing) the next event."""
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
