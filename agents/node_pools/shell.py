"""I/O shell of the node-pool agent: a watch of nodes in, one patch per node that needs one out.

With warm spares (a pool's ``spares``), a watch of the training namespace's bound pods too: only an idle node is
taken as a spare (agents/node_pools/spares.py decides which; the patch carries the taint).

It stands on the agent kit: one informer (list, then watch) keeps every node in memory, one Lease elector
makes one replica the writer, and every patch goes through the fence. A node is looked at when an event
about it arrives (a node that joins is labelled within one round trip) and on the periodic resync; a patch
refused because the node changed (409) is recomputed from the newer node the watch brings.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge

from agents.kit.errors import classify
from agents.kit.informer import Informer, Store
from agents.kit.lease import LeaseElector
from agents.kit.loop import lease_loop
from agents.kit.port import BASE_CONNECTIONS, NODES, PODS, STRATEGIC_MERGE_PATCH, Fenced, KubePort
from agents.node_pools.contract import APP, NodePoolSettings, Pool
from agents.node_pools.decide import node_patch
from agents.node_pools.spares import SpareView, choose_spares
from agents.node_taints import (
    health_taint_key,
    leaf_label_key,
    reserved_taint_key,
    spare_taint_key,
    switch_fault_taint_key,
)

log = logging.getLogger(APP)

#: Nodes patched at once: the first pass over a fleet of 2,048 nodes, one after the other, took 80 s here.
PATCH_CONCURRENCY = 8


def connections(settings: NodePoolSettings) -> int:
    """Calls in flight at once: the node and pod watches, the Lease's watch and its renewal, the loop, and the
    side-by-side node patches."""
    return 2 + BASE_CONNECTIONS + PATCH_CONCURRENCY


class Metrics:
    """The agent's series, in a registry of its own."""

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry(auto_describe=True)
        p = "gpucluster_node_pools_"
        self.leader = Gauge(f"{p}leader", "1 while this replica holds the lease.", registry=r)
        self.patches = Counter(f"{p}patches", "Node patches by pool and result.", ["pool", "result"], registry=r)
        self.members = Gauge(f"{p}members_seen", "Nodes of the pool the API server holds.", ["pool"], registry=r)
        self.missing = Gauge(f"{p}members_missing", "Nodes the pool names that the API server does not hold.",
                             ["pool"], registry=r)
        self.errors = Counter(f"{p}errors", "Failed steps.", ["stage"], registry=r)
        self.synced = Gauge(f"{p}synced", "1 while the node watch is current.", registry=r)
        self.spares = Gauge(f"{p}spares", "Nodes of the pool kept as warm spares.", ["pool"], registry=r)
        self.spares_wanted = Gauge(f"{p}spares_wanted", "The pool's spareNodes.", ["pool"], registry=r)


class NodePools:
    """Keeps every node of every pool labelled and tainted as its pool says."""

    def __init__(self, settings: NodePoolSettings, port: KubePort, identity: str = APP,
                 metrics: Metrics | None = None, monotonic: Callable[[], float] = time.monotonic) -> None:
        s = self.settings = settings
        self.identity = identity
        self.metrics = metrics or Metrics()
        self.registry = self.metrics.registry
        self.monotonic = monotonic
        self.pools: dict[str, Pool] = settings.membership()
        self.elector = LeaseElector(
            port, s.namespace, s.lease_name, identity, lease_duration_seconds=s.lease_duration_seconds,
            renew_deadline_seconds=s.renew_deadline_seconds, request_timeout_seconds=s.request_timeout_seconds,
            monotonic=lambda: self.monotonic())
        #: Every call but the elector's own goes through the fence.
        self.api = Fenced(port, self.elector.can_write, s.request_timeout_seconds)
        self.lock = threading.Lock()
        self.dirty: set[str] = set()
        self.wake = threading.Event()
        self.nodes = Store(on_change=self._touched)
        self.informer = Informer(self.api, NODES, self.nodes, watch_timeout_seconds=s.watch_timeout_seconds,
                                 on_error=self._watch_error)
        #: Training pods bound to a node (only with spares): an idle node only becomes a spare.
        self.spare_pools = [pool for pool in settings.pools if pool.spares > 0]
        self.members = {pool.name: [n for n, p in self.pools.items() if p is pool] for pool in self.spare_pools}
        self.pods = Store(on_change=lambda key: self.wake.set())
        self.pod_informer = Informer(self.api, PODS, self.pods, watch_timeout_seconds=s.watch_timeout_seconds,
                                     on_error=self._watch_error, namespace=s.training_namespace,
                                     field_selector="spec.nodeName!=") if self.spare_pools else None
        self.spare_taint = {"key": spare_taint_key(s.label_prefix), "value": "true", "effect": "NoSchedule"}
        #: Each spare pool's spares as last chosen.
        self.spares: dict[str, frozenset[str]] = {}
        self._last_pass: float | None = None
        self._was_leading = False

    def _touched(self, name: str | None) -> None:
        """The store heard of a change: one node's (its name), or all of them (``None``: a full list)."""
        with self.lock:
            if name is None:
                snapshot = self.nodes.snapshot() or {}
                self.dirty = set(snapshot)
            else:
                self.dirty.add(name)
        self.metrics.synced.set(1 if self.nodes.synced else 0)
        self.wake.set()

    def _watch_error(self, kind: str) -> None:
        self.metrics.errors.labels(kind).inc()
        self.metrics.synced.set(0)

    # ---------------------------------------------------------------- one pass

    def last_pass(self) -> float | None:
        return self._last_pass

    def reconcile(self) -> int:
        """Patch every dirty node that needs it; the number of patches sent. Nothing while the watch is not
        current (a stale node would only earn a 409) or this replica does not lead."""
        snapshot = self.nodes.snapshot()
        if snapshot is None:
            return 0
        with self.lock:
            todo = [(name, snapshot[name]) for name in sorted(self.dirty) if name in snapshot]
            self.dirty.clear()
        seen = set(snapshot)
        self._publish(seen)
        changed = self._choose_spares(snapshot)
        if not self.elector.is_leader:
            self._last_pass = self.monotonic()
            return 0
        queued = {name for name, _ in todo}
        todo += [(name, snapshot[name]) for name in sorted(changed - queued) if name in snapshot]
        spares = frozenset().union(*self.spares.values()) if self.spares else frozenset()
        patches = [(name, self.pools.get(name), patch) for name, node in todo
                   if (patch := node_patch(node, self.pools.get(name), self.settings.applied_annotation,
                                           self.spare_taint if name in spares else None)) is not None]
        if len(patches) > 1:
            with ThreadPoolExecutor(max_workers=PATCH_CONCURRENCY, thread_name_prefix="patch") as workers:
                sent = sum(workers.map(lambda p: self._send(*p), patches))
        else:
            sent = sum(self._send(*p) for p in patches)
        self._last_pass = self.monotonic()
        return sent

    def _choose_spares(self, snapshot: dict[str, dict[str, Any]]) -> set[str]:
        """Each spare pool's spares from the nodes and the training pods; the nodes whose part changed. While the
        pod watch is not current the spares stay what the nodes carry (a busy node could pass for idle, and a spare
        dropped for a moment is a node a gang may take)."""
        if not self.spare_pools:
            return set()
        pods = self.pods.snapshot()
        busy = {str((pod.get("spec") or {}).get("nodeName")) for pod in (pods or {}).values()
                if (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed")}
        prefix = self.settings.label_prefix
        quarantine, fence = health_taint_key(prefix), switch_fault_taint_key(prefix)
        leaf_key, spare_key, reserved = leaf_label_key(prefix), spare_taint_key(prefix), reserved_taint_key(prefix)
        changed: set[str] = set()
        for pool in self.spare_pools:
            views = []
            for name in self.members[pool.name]:
                node = snapshot.get(name)
                if node is None:
                    continue
                taints = {str(t.get("key")) for t in (node.get("spec") or {}).get("taints") or []}
                labels = (node.get("metadata") or {}).get("labels") or {}
                views.append(SpareView(name=name, leaf=labels.get(leaf_key), quarantined=quarantine in taints,
                                       fenced=fence in taints, spare=spare_key in taints, training=name in busy,
                                       reserved=reserved in taints))
            carried = frozenset(v.name for v in views if v.spare)
            chosen = choose_spares(views, pool.spares) if pods is not None else carried
            before = self.spares.get(pool.name, carried)
            changed |= chosen ^ before
            self.spares[pool.name] = chosen
            self.metrics.spares.labels(pool.name).set(len(chosen))
            self.metrics.spares_wanted.labels(pool.name).set(pool.spares)
        return changed

    def _send(self, name: str, pool: Pool | None, patch: dict[str, Any]) -> bool:
        """One node's patch; whether it was applied. A refused one is retried from the newer node (a conflict:
        the watch brings it) or on the next pass (anything else)."""
        label = pool.name if pool else ""
        try:
            self.api.patch(NODES, name, patch, content_type=STRATEGIC_MERGE_PATCH)
        except Exception as exc:
            kind = classify(exc)
            self.metrics.patches.labels(label, kind).inc()
            if kind not in ("conflict", "not_leader"):
                self.metrics.errors.labels("patch").inc()
                log.warning("patching node %s for pool %s failed: %s", name, label or "(none)", kind)
                with self.lock:
                    self.dirty.add(name)
            return False
        self.metrics.patches.labels(label, "applied").inc()
        log.info("node %s: %s", name, f"joined pool {label}" if pool else "left its pool")
        return True

    def _publish(self, seen: set[str]) -> None:
        for pool in self.settings.pools:
            members = [n for n, p in self.pools.items() if p is pool]
            present = sum(1 for n in members if n in seen)
            self.metrics.members.labels(pool.name).set(present)
            self.metrics.missing.labels(pool.name).set(len(members) - present)

    # ---------------------------------------------------------------- running

    def run(self, stop: threading.Event) -> None:
        """Run until ``stop``: a watch thread, a lease thread, and a pass on every wake-up; the lease is released
        on the way out."""
        s = self.settings
        watcher = threading.Thread(target=self.informer.run, args=(stop, s.backoff_base_seconds,
                                                                   s.backoff_max_seconds), name="watch-nodes",
                                   daemon=True)
        renewer = threading.Thread(
            target=lease_loop, args=(self.elector.step, self._leading, s.retry_period_seconds, stop),
            name="lease", daemon=True)
        follower = threading.Thread(
            target=self.elector.follower(s.watch_timeout_seconds, self._watch_error).run,
            args=(stop, s.backoff_base_seconds, s.backoff_max_seconds), name="watch-lease", daemon=True)
        watcher.start()
        if self.pod_informer is not None:
            threading.Thread(target=self.pod_informer.run, args=(stop, s.backoff_base_seconds,
                                                                  s.backoff_max_seconds),
                             name="watch-pods", daemon=True).start()
        renewer.start()
        follower.start()
        last_resync = self.monotonic()
        try:
            while not stop.is_set():
                self.wake.wait(s.retry_period_seconds)
                self.wake.clear()
                if self.monotonic() - last_resync >= s.resync_seconds:
                    self.informer.needs_list = True  # the next watch starts with a full list: every node again
                    last_resync = self.monotonic()
                try:
                    self.reconcile()
                except Exception:
                    self.metrics.errors.labels("reconcile").inc()
                    log.exception("reconcile failed")
        finally:
            stop.set()
            self.wake.set()
            renewer.join(timeout=s.request_timeout_seconds)
            self.elector.release()
            self.metrics.leader.set(0)
            watcher.join(timeout=s.request_timeout_seconds)
            follower.join(timeout=s.request_timeout_seconds)

    def _leading(self, leading: bool) -> None:
        was, self._was_leading = self._was_leading, leading
        self.metrics.leader.set(1 if leading else 0)
        if leading and not was:
            self._touched(None)  # a new leader looks at every node: the old one may have stopped mid-pass
