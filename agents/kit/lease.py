"""One leader election for every agent: a ``coordination.k8s.io/v1`` Lease, renewed with a deadline.

- Expiry is judged by how long the record has stayed unchanged on *our* monotonic clock (as client-go
  does): a record unchanged for ``lease_duration`` or longer is expired, so skewed wall clocks between
  replicas cannot steal a live lease.
- ``is_leader`` holds only while the last successful renewal is younger than the renew deadline, which is
  below the lease duration: a leader that cannot renew stands down before another replica may take over.
- ``can_write`` is stricter: a write may *start* only if it can finish (its whole request timeout) before
  the lease, counted from our last renewal, could pass to another replica. :class:`agents.kit.port.Fenced`
  asks it before every write, so a frozen or partitioned leader that wakes up writes nothing.
- The fence also checks the Lease this replica last *saw* (its holder): a renewal refused with 409 (another
  writer got there first), a read or a watch event showing another holder, or the Lease gone, ends leadership
  at once, before another write, rather than at the renew deadline. :class:`LeaseFollower` feeds the watch's
  view in, so a Lease taken from under a live leader (an operator deleting it, a replica whose clock ran
  fast) stops the old leader's next write within one watch event.
- A replica that saw the Lease and then finds it gone re-creates it but writes nothing for one lease
  duration: the leader it may have been taken from could still be inside its own term.
- ``release`` gives the lease up on a clean shutdown, so a rolling update hands over at once instead of
  after a full lease duration.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from agents.kit.errors import ApiError
from agents.kit.informer import Informer
from agents.kit.port import LEASES, KubePort

log = logging.getLogger("kit.lease")


def resource_version(obj: dict[str, Any] | None) -> int | None:
    """An object's resourceVersion as a number (the API server's are etcd revisions), else None."""
    value = ((obj or {}).get("metadata") or {}).get("resourceVersion")
    try:
        return int(str(value))
    except ValueError:
        return None


def rfc3339_micro(epoch: float) -> str:
    """The MicroTime spelling a Lease's renewTime and acquireTime take."""
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def rfc3339(epoch: float) -> str:
    """The Time spelling (whole seconds) of Events and of the timestamps agents keep in annotations."""
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class LeaseElector:
    """Acquire or renew with :meth:`step`; ask :meth:`can_write` before every write."""

    def __init__(self, port: KubePort, namespace: str, name: str, identity: str, *,
                 lease_duration_seconds: float, renew_deadline_seconds: float, request_timeout_seconds: float,
                 monotonic: Callable[[], float] = time.monotonic, wall: Callable[[], float] = time.time) -> None:
        if not 0 < renew_deadline_seconds < lease_duration_seconds:
            raise ValueError(f"renew deadline ({renew_deadline_seconds}s) must be positive and below the lease "
                             f"duration ({lease_duration_seconds}s)")
        self._port = port
        self.namespace = namespace
        self.name = name
        self.identity = identity
        self.lease_duration = lease_duration_seconds
        self.renew_deadline = renew_deadline_seconds
        self.request_timeout = request_timeout_seconds
        self._mono = monotonic
        self._wall = wall
        self._lock = threading.RLock()
        self._observed: tuple[str, str] | None = None
        self._observed_at = 0.0
        self._renewed_at: float | None = None
        self._released = False
        #: Holder of the Lease as this replica last saw it (a read, its own write, the watch); "" when gone.
        self._seen_holder: str | None = None
        #: No write before this (monotonic): set when we re-create a Lease we saw deleted.
        self._hold_until = 0.0
        #: Times leadership ended on seeing the Lease refused, taken or deleted (not on the clock).
        self.lost = 0
        #: No acquisition before this (monotonic): set by :meth:`step_down`.
        self._sitting_out_until = 0.0
        #: Newest resourceVersion of the Lease this replica has read, written or been told of: an older view
        #: (a list answered before our own create, an event delayed in flight) is stale and changes nothing.
        self._known_version = -1
        #: The Lease as last read or written (the guard keeps its breaker annotation on it).
        self.lease: dict[str, Any] | None = None

    @property
    def is_leader(self) -> bool:
        """True only while the last successful renewal is within the renew deadline, the Lease as last seen
        is ours, and no hold after a re-creation is running."""
        renewed = self._renewed_at
        now = self._mono()
        return (renewed is not None and now - renewed < self.renew_deadline
                and self._seen_holder == self.identity and now >= self._hold_until)

    def can_write(self) -> bool:
        """A write may start: we lead, and one taking its whole request timeout still lands before the lease,
        counted from our last renewal, could pass to another replica."""
        renewed = self._renewed_at
        if renewed is None or not self.is_leader:
            return False
        return self._mono() + self.request_timeout < renewed + self.lease_duration

    def _lose(self, why: str) -> None:
        """Leadership ends now (no lock: the watch thread calls this while a renewal may hold it)."""
        if self._renewed_at is not None:
            self._renewed_at = None
            self.lost += 1
            log.warning("lease %s/%s: no longer leading: %s", self.namespace, self.name, why)

    def follower(self, watch_timeout_seconds: int, on_error: Callable[[str], None] = lambda kind: None) -> Informer:
        """A list-watch of this Lease alone (``metadata.name``, which RBAC scopes by resource name) that feeds
        :meth:`saw`; run it in a thread beside the renewer."""
        return Informer(self._port, LEASES, LeaseFollower(self), watch_timeout_seconds=watch_timeout_seconds,
                        on_error=on_error, namespace=self.namespace, field_selector=f"metadata.name={self.name}")

    def _fresh(self, lease: dict[str, Any] | None) -> bool:
        """Whether ``lease`` is newer than anything this replica knew of the Lease (and remember it)."""
        version = resource_version(lease)
        if version is None:
            return True
        if version <= self._known_version:
            return False
        self._known_version = version
        return True

    def saw(self, lease: dict[str, Any] | None, deleted: bool = False) -> None:
        """The Lease as a read or the watch shows it (``deleted``: a DELETED event's last state, or ``None`` when
        the read found none). Another holder, or none, ends our leadership at once; our own record changes
        nothing (the renewal keeps the clock); a view older than one we know is ignored."""
        if lease is not None and not self._fresh(lease):
            return
        holder = "" if deleted or lease is None else str((lease.get("spec") or {}).get("holderIdentity") or "")
        self._seen_holder = holder
        if holder != self.identity:
            self._lose("the Lease was deleted" if deleted or lease is None
                       else f"the Lease is held by {holder or 'nobody'}")

    def step(self) -> bool:
        """Try once to acquire or renew; whether this replica leads now (never again after :meth:`release`)."""
        with self._lock:
            if self._released:  # a renewal racing the shutdown must not take back what release gave up
                return False
            now = self._mono()
            if now < self._sitting_out_until:  # stepped down: another replica leads meanwhile
                return False
            try:
                try:
                    lease: dict[str, Any] | None = self._port.get(LEASES, self.name, self.namespace)
                except ApiError as exc:
                    if exc.kind != "not_found":
                        raise
                    lease = None
                if lease is None:
                    deleted = self._seen_holder is not None
                    if deleted:
                        self.saw(None)
                    self.lease = self._port.create(LEASES, self._record(None), self.namespace)
                    self._took(now)
                    if deleted:  # its last holder may still be inside its term: write nothing for one
                        self._hold_until = now + self.lease_duration
                    return self.is_leader
                spec = lease.get("spec") or {}
                holder = str(spec.get("holderIdentity") or "")
                if holder != self.identity:
                    self.saw(lease)
                seen = (holder, str(spec.get("renewTime")))
                if seen != self._observed:
                    self._observed, self._observed_at = seen, now
                duration = float(spec.get("leaseDurationSeconds") or self.lease_duration)
                expired = now - self._observed_at >= duration
                if holder and holder != self.identity and not expired:
                    self.lease = lease
                    return False
                self.lease = self._port.replace(LEASES, self.name, self._record(lease), self.namespace)
                self._took(now)
                return self.is_leader
            except ApiError as exc:
                if exc.kind == "conflict":  # another writer got to the Lease first: it is not ours any more
                    self._seen_holder = ""  # a Lease exists (or existed), held by someone we have not read yet
                    self._lose("the renewal was refused (409)")
                    return False
                log.warning("lease %s/%s: %s", self.namespace, self.name, exc.kind)  # the network: clock decides
                return self.is_leader

    def _took(self, now: float) -> None:
        self._fresh(self.lease)
        spec = (self.lease or {}).get("spec") or {}
        self._observed = (self.identity, str(spec.get("renewTime")))
        self._observed_at = now
        self._seen_holder = self.identity
        self._renewed_at = now

    def _record(self, current: dict[str, Any] | None) -> dict[str, Any]:
        """The Lease we write: ours now, the rest of the object (annotations included) kept."""
        stamp = rfc3339_micro(self._wall())
        metadata = dict((current or {}).get("metadata") or {})
        spec = dict((current or {}).get("spec") or {})
        same = spec.get("holderIdentity") == self.identity
        transitions = int(spec.get("leaseTransitions") or 0)
        metadata.update(name=self.name, namespace=self.namespace)
        spec.update(
            holderIdentity=self.identity,
            leaseDurationSeconds=int(self.lease_duration),
            acquireTime=spec.get("acquireTime") if same and spec.get("acquireTime") else stamp,
            renewTime=stamp,
            leaseTransitions=transitions if same or current is None else transitions + 1,
        )
        return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": metadata, "spec": spec}

    def annotation(self, key: str) -> str | None:
        """An annotation of the Lease as last seen."""
        value = (((self.lease or {}).get("metadata") or {}).get("annotations") or {}).get(key)
        return str(value) if value is not None else None

    def annotate(self, key: str, value: str) -> None:
        """Write an annotation on our Lease while we may write (a conflict raises; the caller retries later)."""
        with self._lock:
            if not self.can_write():
                raise ApiError("not_leader", f"annotate lease {self.namespace}/{self.name}")
            current = self._port.get(LEASES, self.name, self.namespace)
            self.saw(current)
            if not self.can_write():
                raise ApiError("not_leader", f"annotate lease {self.namespace}/{self.name}: held by another")
            metadata = dict(current.get("metadata") or {})
            metadata["annotations"] = {**(metadata.get("annotations") or {}), key: value}
            self.lease = self._port.replace(LEASES, self.name, {**current, "metadata": metadata}, self.namespace)

    def step_down(self, sit_out_seconds: float) -> bool:
        """Give the lease up now and take none for ``sit_out_seconds``: for a leader that cannot do its job from
        where it runs (the guard, blind to Prometheus) while a standby may. Whether it was given up."""
        with self._lock:
            self._sitting_out_until = self._mono() + sit_out_seconds
            return self._give_up()

    def release(self) -> bool:
        """Give the lease up (holder cleared, duration 1 s) if we hold it; whether it was released. Final: this
        elector neither renews nor acquires afterwards."""
        with self._lock:
            self._released = True
            return self._give_up()

    def _give_up(self) -> bool:
        """Clear the holder (duration 1 s) if the Lease is ours; the caller holds the lock."""
        if not self.is_leader:
            return False
        self._renewed_at = None  # from here on nothing of ours may write, released or not
        try:
            lease = self._port.get(LEASES, self.name, self.namespace)
            spec = dict(lease.get("spec") or {})
            if spec.get("holderIdentity") != self.identity:
                return False
            spec.update(holderIdentity=None, leaseDurationSeconds=1)
            self.lease = self._port.replace(LEASES, self.name, {**lease, "spec": spec}, self.namespace)
            log.info("lease %s/%s released", self.namespace, self.name)
            return True
        except ApiError as exc:
            log.warning("lease release %s/%s: %s", self.namespace, self.name, exc.kind)
            return False


class LeaseFollower:
    """An :class:`agents.kit.informer.Sink` of one Lease (an informer with ``metadata.name=<lease>``) that tells
    the elector what the API server holds, so a takeover or a deletion fences this replica within one event."""

    def __init__(self, elector: LeaseElector) -> None:
        self.elector = elector

    def replace(self, items: list[dict[str, Any]]) -> None:
        """A (re-)list. An empty one says nothing: it may predate our own create, and a deletion while the
        watch was down is found by the next renewal's read."""
        for item in items:
            if (item.get("metadata") or {}).get("name") == self.elector.name:
                self.elector.saw(item)

    def apply(self, event_type: str, obj: dict[str, Any]) -> None:
        if (obj.get("metadata") or {}).get("name") == self.elector.name:
            self.elector.saw(obj, deleted=event_type == "DELETED")

    def fresh(self) -> None:
        """Nothing to do: the clock fence holds while the watch is down."""

    def unsynced(self) -> None:
        """Nothing to do: the clock fence holds while the watch is down."""
