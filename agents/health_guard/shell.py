"""I/O shell of the health guard: Prometheus in; taints, conditions, events and evictions out; metrics aside.

Everything that decides lives in :mod:`agents.health_guard.decide`; the JSON it reads and writes in
:mod:`agents.health_guard.nodes`. The shell stands on the agent kit (:mod:`agents.kit`): one port with a
timeout on every call, one Lease elector, and every write fenced by it, so a guard that was frozen or cut off
past its lease writes nothing when it wakes (the standby has taken over), and one that stops releases its
Lease so the standby takes over at once.

Failures never widen what the guard does: a failed Prometheus query makes that signal *unknown* (neither
unhealthy nor healthy); a node watch that is not current (its list failed, or it broke and is re-listing)
skips the cycle; a failed patch is retried on the next cycle because
the node still looks the same; an eviction refused by a PodDisruptionBudget is retried every cycle while the
node stays quarantined, and one whose pod was replaced under the same name (UID precondition) is not.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from agents.health_guard.contract import (
    APP,
    CONDITION_TYPE,
    SWITCH_CONDITION_TYPE,
    TAINT_EFFECT,
    HealthClass,
    HealthSettings,
)
from agents.health_guard.decide import (
    Action,
    Decision,
    Drain,
    GuardState,
    MarkCondition,
    NodeView,
    Quarantine,
    RecordOverride,
    Release,
    Suppress,
    TripBreaker,
    decide,
)
from agents.health_guard.metrics import GuardMetrics
from agents.health_guard.nodes import (
    GANG_LABEL,
    condition_patch,
    detail,
    evictable,
    eviction,
    node_view,
    quarantine_patch,
    release_patch,
    switch_detail,
    switch_fence_patch,
    switch_release,
    switch_release_patch,
)
from agents.health_guard.prometheus import Prometheus, observe
from agents.health_guard.restarts import GangJob, Ledger, account, gang_job, guard_caused
from agents.health_guard.switches import SwitchFault, SwitchFence, SwitchRelease, SwitchUnfence
from agents.kit.calls import event
from agents.kit.errors import classify
from agents.kit.informer import Informer, Store
from agents.kit.lease import LeaseElector, rfc3339
from agents.kit.loop import lease_loop
from agents.kit.port import (
    BASE_CONNECTIONS,
    EVENTS,
    NODES,
    PODS,
    STRATEGIC_MERGE_PATCH,
    VOLCANO_JOBS,
    Fenced,
    KubePort,
)

log = logging.getLogger(APP)

#: Nodes whose actions a cycle applies at once (each node's in order).
ACTION_CONCURRENCY = 8


def connections(settings: HealthSettings) -> int:
    """Calls in flight at once: the node watch, a gang-job watch per training namespace, the Lease's watch and its
    renewal, the loop, and one node's actions per worker."""
    return 1 + len(settings.training_namespaces) + BASE_CONNECTIONS + ACTION_CONCURRENCY

#: Eviction answers that are outcomes, not errors: a PodDisruptionBudget's "not now", a pod already gone,
#: a pod replaced under the same name (the UID precondition failed), and a write the fence refused.
EVICTION_RESULTS = {"throttled": "blocked", "not_found": "gone", "conflict": "replaced", "not_leader": "fenced"}


def next_cycle_in(period_seconds: float, took_seconds: float) -> float:
    """Seconds to wait before the next cycle so cycles start every ``period_seconds``; none after a cycle that took
    the whole period or more (a clock that went backwards counts as no time taken)."""
    return min(period_seconds, max(0.0, period_seconds - took_seconds))


class Guard:
    """Runs cycles: renew, observe, list, decide, apply (fenced), publish."""

    def __init__(self, settings: HealthSettings, prometheus: Prometheus, port: KubePort, identity: str = APP,
                 metrics: GuardMetrics | None = None, clock: Callable[[], float] = time.time,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        s = self.settings = settings
        self.prometheus = prometheus
        self.identity = identity
        self.metrics = metrics or GuardMetrics()
        self.registry = self.metrics.registry
        #: Wall and monotonic clocks, read at every use (tests set them).
        self.clock = clock
        self.monotonic = monotonic
        self.elector = LeaseElector(
            port, s.namespace, s.lease_name, identity, lease_duration_seconds=s.lease_duration_seconds,
            renew_deadline_seconds=s.renew_deadline_seconds, request_timeout_seconds=s.request_timeout_seconds,
            monotonic=lambda: self.monotonic(), wall=lambda: self.clock())
        #: Every call but the elector's own goes through the fence.
        self.api = Fenced(port, self.elector.can_write, s.request_timeout_seconds)
        self.state = GuardState()
        self._last_pass: float | None = None
        self._restarted: set[tuple[str, str, str, str]] = set()
        self._ledger = Ledger()
        self._ledger_lock = threading.Lock()
        self._announced: set[str] = set()
        self._firing: set[tuple[str, str]] = set()
        # Nodes and gang jobs are read from a watch, not listed every cycle: at 2,048 nodes a list per poll is the
        # largest request the guard could make. Step by step (tests, ``cycle`` without ``run``) each cycle lists.
        self.nodes = Store()
        self.jobs = {ns: Store() for ns in s.training_namespaces}
        on_error = self.metrics.errors.labels("list").inc
        self.informers = [
            Informer(self.api, NODES, self.nodes, watch_timeout_seconds=s.watch_timeout_seconds,
                     label_selector=s.node_selector, on_error=lambda kind: on_error()),
            *(Informer(self.api, VOLCANO_JOBS, store, watch_timeout_seconds=s.watch_timeout_seconds, namespace=ns,
                       on_error=lambda kind: on_error()) for ns, store in self.jobs.items()),
        ]
        self._watching = False
        #: Since when every query of the leader's cycles has failed (monotonic), or None.
        self._blind_since: float | None = None

    def last_pass(self) -> float | None:
        return self._last_pass

    def cycle(self, stop: threading.Event | None = None) -> Decision | None:
        """One pass; the decision, or ``None`` when not leading, the inputs were unavailable or ``stop`` came.

        ``stop`` is read between queries and between actions, so a guard told to stop (SIGTERM) releases its
        Lease within one call's timeout rather than after a whole cycle of them; the actions it leaves are
        the next leader's, as when the fence stops a batch. The cycle's deadline (the renew deadline) is read
        at the same places, and every call is bounded by the request timeout, so a call that never answers
        costs one timeout, not the cycle.
        """
        deadline = self.monotonic() + self.settings.renew_deadline_seconds

        def stopped() -> bool:
            """Told to stop, or past the cycle's deadline: a cycle longer than a leadership term acts on views
            too old to trust, so what it has not done yet is the next cycle's, decided afresh."""
            return (stop is not None and stop.is_set()) or self.monotonic() > deadline

        now = self.clock()
        leading = self.elector.step()
        self.metrics.leader.set(1 if leading else 0)
        if not leading:
            return None
        phase = self.metrics.cycle_phase
        started = time.perf_counter()
        obs, errors = observe(self.settings, self.prometheus, stopped,
                              lambda query, seconds: self.metrics.query_seconds.labels(query).observe(seconds))
        phase.labels("observe").observe(time.perf_counter() - started)
        for message in errors:
            self.metrics.errors.labels("query").inc()
            log.warning("%s", message)
        if self._blind(errors):
            return None
        if stopped():
            if self.monotonic() > deadline:
                self.metrics.errors.labels("deadline").inc()
                log.warning("cycle past its deadline (%gs): ended before deciding",
                            self.settings.renew_deadline_seconds)
            else:
                log.info("stopping: cycle ended before deciding")
            return None
        if not self._watching:
            for informer in self.informers:
                informer.relist()
        by_name = self.nodes.snapshot()
        if by_name is None:  # the list failed or the watch broke: decide nothing on a partial view
            log.warning("skipping cycle: the node watch is not current")
            return None
        started = time.perf_counter()
        views = {name: node_view(self.settings, n) for name, n in by_name.items()}
        breaker = self.elector.annotation(self.settings.names.breaker)
        decision = decide(self.settings, obs, views, self.state, now, breaker)
        self.state = decision.state
        phase.labels("decide").observe(time.perf_counter() - started)
        started = time.perf_counter()
        self._act(decision.actions, by_name, views, now, stopped)
        phase.labels("act").observe(time.perf_counter() - started)
        started = time.perf_counter()
        self._count_application_restarts()
        self._firing = self.metrics.publish(decision, views, self.settings.signals, self._firing)
        phase.labels("publish").observe(time.perf_counter() - started)
        self.metrics.last_cycle.set(now)
        return decision

    def _blind(self, errors: Sequence[str]) -> bool:
        """Whether this leader should step down: every query of its cycles has failed for its renew deadline.

        A leader that cannot reach Prometheus from where it runs judges nothing (unknown is never clear) while a
        standby may see fine: a pod whose network is not wired yet, a partition of one node. It gives the Lease up
        and takes none for two lease durations, so another replica leads meanwhile; if every replica is blind they
        take turns, and nothing is judged either way."""
        s = self.settings
        if len(errors) < len(s.exporters) + len(s.signals):
            self._blind_since = None
            return False
        now = self.monotonic()
        if self._blind_since is None:
            self._blind_since = now
        if now - self._blind_since < s.renew_deadline_seconds:
            return False
        self.metrics.errors.labels("blind").inc()
        log.warning("every Prometheus query failed for %.0fs: stepping down for %ds so a replica that can see leads",
                    now - self._blind_since, 2 * s.lease_duration_seconds)
        self._blind_since = None
        self.elector.step_down(2 * s.lease_duration_seconds)
        self.metrics.leader.set(0)
        return True

    def run(self, stop: threading.Event) -> None:
        """Start a cycle every ``poll_seconds`` (at once after one that took longer), with the lease renewed beside
        it; release the lease on the way out. The period, not a pause after each cycle: at 2,048 nodes a cycle
        takes a second or more, and a pause on top of it made the wait for the next look at a new fault half as
        long again (docs/scale.md)."""
        s = self.settings
        renewer = threading.Thread(
            target=lease_loop, args=(self.elector.step, lambda lead: self.metrics.leader.set(1 if lead else 0),
                                     s.retry_period_seconds, stop), name="lease", daemon=True)
        renewer.start()
        self._watching = True
        lease = self.elector.follower(s.watch_timeout_seconds, lambda kind: self.metrics.errors.labels("lease").inc())
        watchers = [threading.Thread(target=i.run, args=(stop, s.backoff_base_seconds, s.backoff_max_seconds),
                                     name=f"watch-{i.resource.plural}", daemon=True) for i in (*self.informers, lease)]
        for t in watchers:
            t.start()
        try:
            while not stop.is_set():
                started = self.monotonic()
                try:
                    self.cycle(stop)
                except Exception:
                    self.metrics.errors.labels("cycle").inc()
                    log.exception("cycle failed")
                self._last_pass = self.monotonic()
                stop.wait(next_cycle_in(s.poll_seconds, self._last_pass - started))
        finally:
            stop.set()
            renewer.join(timeout=s.request_timeout_seconds)
            self.elector.release()
            self.metrics.leader.set(0)

    # ---------------------------------------------------------------- actions

    def _act(self, actions: Sequence[Action], nodes: Mapping[str, dict[str, Any]], views: Mapping[str, NodeView],
             now: float, stopped: Callable[[], bool]) -> None:
        """Each node's actions in their order, nodes side by side (:data:`ACTION_CONCURRENCY`): a storm's
        quarantines each cost a patch, a condition, an Event and a drain, and one after the other they held the
        last faulted node for seconds (docs/scale.md). Every node's taint goes first, in a round of its own, before
        any node's condition, Event or drain: the taint is what keeps new pods off a bad node, and in a storm of
        hundreds the last nodes' taints otherwise waited behind the first nodes' drains. The breaker is recorded
        first, alone; a switch's Event after its nodes. Each node's later actions see its earlier patches (a
        quarantine and a switch fence in one cycle would otherwise send the second with a stale
        ``resourceVersion``)."""
        left = [len(actions)]
        lock = threading.Lock()
        nodes = dict(nodes)
        #: Taint action (by identity) -> whether the first round wrote it (absent: not tried there).
        tainted: dict[int, bool] = {}
        #: Whether the batch was already stopped: the reason is said (and a fenced write counted) once a cycle.
        refused = [False]

        def may_write() -> bool:
            if stopped():
                why, fenced = "stopping", False
            elif not self.elector.can_write():  # the port would refuse each write; stop the batch instead
                why, fenced = "lease too old to write", True
            else:
                return True
            with lock:
                first, refused[0] = not refused[0], True
                remaining = left[0]
            if first:
                if fenced:
                    self.metrics.errors.labels("fenced").inc()
                log.warning("%s: %d of %d actions left for the next leader", why, remaining, len(actions))
            return False

        def taint(batch: list[Action]) -> None:
            # Every taint of the node (a quarantine's, a switch fence's) up to the first action that takes a taint off
            # (a node re-cabled to another fenced leaf is unfenced from the old one, then fenced by the new: hoisted
            # past the unfence, the fence would be taken off again); a refused one leaves the node's others to the
            # next cycle.
            for action in batch:
                if isinstance(action, SwitchUnfence | Release):
                    return
                if isinstance(action, Quarantine | SwitchFence):
                    if not may_write():
                        return
                    written = tainted[id(action)] = self._taint(action, nodes, views, now)
                    if not written:
                        return

        def run(batch: list[Action]) -> None:
            for i, action in enumerate(batch):
                if not may_write():
                    return
                if self._apply(action, nodes, views, now, tainted.get(id(action))) is False:
                    # The taint was refused: an eviction from a node without it lets the pod come straight back.
                    # The rest is the next cycle's, decided again on the node as it is then.
                    with lock:
                        left[0] -= len(batch) - i
                    return
                with lock:
                    left[0] -= 1

        per_node: dict[str, list[Action]] = {}
        leaves: list[Action] = []
        for action in actions:
            if isinstance(action, TripBreaker):
                run([action])
            elif isinstance(action, SwitchFault | SwitchRelease):
                leaves.append(action)
            else:
                per_node.setdefault(action.node, []).append(action)
        if len(per_node) <= 1:
            for batch in per_node.values():
                run(batch)
        else:
            with ThreadPoolExecutor(max_workers=ACTION_CONCURRENCY, thread_name_prefix="act") as pool:
                list(pool.map(taint, per_node.values()))
                list(pool.map(run, per_node.values()))
        run(leaves)

    def _taint(self, action: Quarantine | SwitchFence, nodes: dict[str, dict[str, Any]],
               views: Mapping[str, NodeView], now: float) -> bool:
        """The node's taint (a quarantine's or a switch fence's), alone; whether it was written. A quarantine's own
        bookkeeping (its count, the time since the pool's last failure, the log line) goes with its taint: a cycle
        stopped before the condition and Event (a lost Lease, a SIGTERM) must not lose them, since the next cycle
        sees the node quarantined already."""
        s, node = self.settings, nodes[action.node]
        if isinstance(action, SwitchFence):
            return self._patch(action.node, switch_fence_patch(s, node, action, now), "switch fence", nodes)
        written = self._patch(action.node, quarantine_patch(s, node, action, now), "quarantine", nodes)
        if written:
            view = views[action.node]
            self.metrics.taints.labels(str(action.health_class), view.pool).inc()
            if not action.escalation:
                self._between_failures(view, views, now)
            log.info("quarantined node %s: %s (%s)", action.node, action.health_class, ", ".join(action.reasons))
        return written

    def _apply(self, action: Action, nodes: dict[str, dict[str, Any]], views: Mapping[str, NodeView],
               now: float, tainted: bool | None = None) -> bool | None:
        """One action; ``tainted`` says the taint of a quarantine or switch fence was already tried (and whether it
        was written), so only what follows it is left to do. Returns whether a quarantine's or fence's taint is on
        the node (None for other actions)."""
        s = self.settings
        if isinstance(action, TripBreaker):
            self._trip(action, now)
            return None
        if isinstance(action, SwitchFault | SwitchRelease):
            self._switch(action, nodes, now)
            return None
        node = nodes[action.node]
        view = views[action.node]
        if isinstance(action, SwitchFence):
            written = self._taint(action, nodes, views, now) if tainted is None else tainted
            if written:
                self._condition(action.node, False, "SwitchFault",
                                switch_detail(s, action.health_class, action.leaf, action.reasons), now,
                                SWITCH_CONDITION_TYPE, nodes)
            return written
        elif isinstance(action, SwitchUnfence):
            if self._patch(action.node, switch_release_patch(s, node), "switch release", nodes):
                self._condition(action.node, True, "SwitchReleased", f"leaf switch {action.leaf} released: "
                                f"{action.why}", now, SWITCH_CONDITION_TYPE, nodes)
        elif isinstance(action, Quarantine):
            written = self._taint(action, nodes, views, now) if tainted is None else tainted
            if written:
                cls = action.health_class
                message = (f"GPU health {cls} ({', '.join(action.reasons)}): tainted {s.names.taint}={cls}:"
                           f"{TAINT_EFFECT}; training is evicted" + (", inference too" if cls is HealthClass.FATAL
                                                                    else ", inference may stay")
                           + f". {detail(s, cls, action.reasons)}.")
                self._condition(action.node, False, f"Gpu{cls.capitalize()}", message, now, nodes=nodes)
                self._event(node, "GpuHealthQuarantine", message, True, now)
            return written
        elif isinstance(action, MarkCondition):
            self._condition(action.node, False, f"Gpu{action.health_class.capitalize()}",
                            detail(s, action.health_class, action.reasons), now, nodes=nodes)
        elif isinstance(action, Drain):
            self._drain(action, node, view)
        elif isinstance(action, Release):
            if self._patch(action.node, release_patch(s, node), "release", nodes):
                self.metrics.releases.labels(str(action.health_class or "manual")).inc()
                self._condition(action.node, True, "Released", f"released: {action.why}", now, nodes=nodes)
                self._event(node, "GpuHealthRelease", f"released: {action.why}", False, now)
                log.info("released node %s: %s", action.node, action.why)
        elif isinstance(action, RecordOverride):
            value = ",".join(sorted(action.signals)) or None
            # With ``nodes``: the node's later patches carry its resourceVersion as written here (a stale one is
            # refused with a conflict, and a refused taint leaves the node's drain to the next cycle).
            self._patch(action.node, {"metadata": {"annotations": {s.names.overridden: value}}}, "override", nodes)
        elif isinstance(action, Suppress):
            self.metrics.suppressed.labels(view.pool).inc()
            if action.node not in self._announced:
                self._announced.add(action.node)
                message = (f"GPU health {action.health_class} ({', '.join(action.reasons)}) but NOT quarantined: "
                           f"{action.limit}. A person decides: see the guard's breaker on Lease "
                           f"{s.namespace}/{s.lease_name}.")
                self._event(node, "GpuHealthSuppressed", message, True, now)
                log.warning("suppressed node %s: %s", action.node, action.limit)
        return None

    def _switch(self, action: SwitchFault | SwitchRelease, nodes: Mapping[str, dict[str, Any]], now: float) -> None:
        """The switch-level decision: one Event naming the leaf (on its first node) and one log line."""
        s = self.settings
        if isinstance(action, SwitchFault):
            under = f"leaf switch {action.leaf}" + (f" (spine {action.spine})" if action.spine else "")
            message = (f"{under} at fault: {len(action.bad)} of its {action.size} nodes' InfiniBand signals went "
                       f"bad together ({', '.join(action.reasons)}; {', '.join(action.bad)}). The leaf's nodes "
                       f"take no new pods ({s.names.switch_fault}={action.leaf}:{TAINT_EFFECT}) and nothing is "
                       f"evicted or quarantined for it. Release: {switch_release(s, action.health_class)}.")
            first, reason, warning = action.bad[0], "InfinibandSwitchFault", True
            log.warning("switch fault on leaf %s: %s", action.leaf, message)
        else:
            if not action.nodes:
                return
            message = f"leaf switch {action.leaf} released: {action.why}"
            first, reason, warning = action.nodes[0], "InfinibandSwitchReleased", False
            log.info("released leaf %s: %s", action.leaf, action.why)
        if first in nodes:
            self._event(nodes[first], reason, message, warning, now)

    def _trip(self, action: TripBreaker, now: float) -> None:
        note = f"{rfc3339(now)} {action.reason}"
        try:
            self.elector.annotate(self.settings.names.breaker, note)
            log.error("breaker tripped: %s; no node is quarantined until the annotation %s is removed from "
                      "Lease %s/%s", action.reason, self.settings.names.breaker, self.settings.namespace,
                      self.settings.lease_name)
        except Exception as exc:  # stays tripped in this cycle's decision; retried when it recurs
            self._failed("lease", exc, "recording the tripped breaker")

    def _failed(self, stage: str, exc: BaseException, what: str) -> None:
        kind = classify(exc)
        self.metrics.errors.labels("fenced" if kind == "not_leader" else stage).inc()
        log.warning("%s failed: %s", what, exc)

    def _patch(self, name: str, body: dict[str, Any], what: str,
               nodes: dict[str, dict[str, Any]] | None = None) -> bool:
        """A node patch; on success the node as written replaces ``nodes[name]`` for the node's later actions."""
        try:
            written = self.api.patch(NODES, name, body, content_type=STRATEGIC_MERGE_PATCH)
        except Exception as exc:  # conflict, forbidden, network, fenced: retried next cycle on fresh data
            self._failed("patch", exc, f"{what} of node {name}")
            return False
        if nodes is not None and isinstance(written, dict) and isinstance(written.get("metadata"), dict):
            nodes[name] = written
        return True

    def _condition(self, name: str, healthy: bool, reason: str, message: str, now: float,
                   condition_type: str = CONDITION_TYPE, nodes: dict[str, dict[str, Any]] | None = None) -> None:
        """The node's condition; on success the node as written replaces ``nodes[name]``: a status write moves the
        node's resourceVersion on too, and a later patch in the cycle (a fence after an unfence) must carry it."""
        body = condition_patch(healthy, reason, message, now, condition_type)
        try:
            written = self.api.patch(NODES, name, body, content_type=STRATEGIC_MERGE_PATCH, subresource="status")
        except Exception as exc:  # re-asserted next cycle (MarkCondition) while the node stays quarantined
            self._failed("status", exc, f"condition on node {name}")
            return
        if nodes is not None and isinstance(written, dict) and isinstance(written.get("metadata"), dict):
            nodes[name] = written

    def _event(self, node: Mapping[str, Any], reason: str, message: str, warning: bool, now: float) -> None:
        metadata = node.get("metadata") or {}
        name = str(metadata.get("name"))
        involved = {"kind": "Node", "name": name, "uid": metadata.get("uid", name), "apiVersion": "v1"}
        body = event(name_prefix=name, involved=involved, reason=reason, message=message, component=APP,
                     instance=self.identity, warning=warning, now=now)
        try:
            self.api.create(EVENTS, body, body["metadata"]["namespace"])
        except Exception as exc:  # an event is a courtesy; the patch is what matters
            self._failed("event", exc, f"event for node {name}")

    def _drain(self, action: Drain, node: Mapping[str, Any], view: NodeView) -> None:
        try:
            pods = self.api.list(PODS, field_selector=f"spec.nodeName={action.node}").get("items") or []
        except Exception as exc:
            self._failed("evict", exc, f"listing pods on {action.node}")
            return
        since = str(((node.get("metadata") or {}).get("annotations") or {}).get(self.settings.names.since, ""))
        for pod in pods:
            if not evictable(self.settings, pod, action.health_class):
                continue
            metadata = pod["metadata"]
            labels = metadata.get("labels") or {}
            workload = str(labels.get(self.settings.names.workload))
            try:
                self.api.create(PODS, eviction(pod), metadata["namespace"], metadata["name"], "eviction")
                result = "evicted"
            except Exception as exc:
                result = EVICTION_RESULTS.get(classify(exc), "error")
                if result == "error":
                    self._failed("evict", exc, f"evicting {metadata['namespace']}/{metadata['name']}")
                if classify(exc) == "not_leader":
                    return  # every later write would be refused too
            self.metrics.evictions.labels(workload, result).inc()
            if result != "evicted":
                continue
            log.info("evicted %s pod %s/%s from %s node %s", workload, metadata["namespace"], metadata["name"],
                     action.health_class, action.node)
            job = labels.get(GANG_LABEL)
            key = (action.node, since, str(metadata["namespace"]), str(job))
            with self._ledger_lock:  # nodes are drained side by side
                if not job or key in self._restarted:
                    continue
                self._restarted.add(key)
                self._ledger = guard_caused(self._ledger, (str(metadata["namespace"]), str(job)))
            self.metrics.gang_restarts.labels(metadata["namespace"], job, view.pool, action.node, "guard").inc()

    def _count_application_restarts(self) -> None:
        """Volcano's retries the guard did not cause: application crashes, counted without a node."""
        jobs: list[GangJob] = []
        for namespace, store in self.jobs.items():
            raw = store.snapshot()
            if raw is None:  # the next cycle counts what this one missed
                log.warning("gang jobs in %s: the watch is not current; restarts counted next cycle", namespace)
                return
            jobs += [j for j in (gang_job(r, self.settings.names.pool) for r in raw.values()) if j is not None]
        self._ledger, restarts = account(self._ledger, jobs)
        for job, count in restarts.items():
            self.metrics.gang_restarts.labels(job.namespace, job.name, job.pool, "", "application").inc(count)

    def _between_failures(self, view: NodeView, views: Mapping[str, NodeView], now: float) -> None:
        earlier = [t for v in views.values() if v.pool == view.pool for t in v.history if t < now - 1]
        if earlier:
            self.metrics.between_failures.labels(view.pool).observe(now - max(earlier))
