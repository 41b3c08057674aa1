"""One in-memory Kubernetes API behind the kit's port, for the tests (and the benchmark) of every agent.

Objects keep resourceVersions; a patch or replace that names a stale one is a conflict, as on the API
server. Merge patches follow RFC 7386; strategic merge patches are merge patches plus the list merge keys
the agents rely on (conditions by ``type``, scheduling gates by ``name`` with ``$patch: delete``). The
eviction subresource honours a UID precondition and refuses (429) pods listed in ``pdb_blocked``; the scale
subresource of a Deployment keeps its count in ``scales``.

Faults: :meth:`fail` queues errors for one call name (consumed in order), :meth:`fail_always` makes it fail
until cleared. Call names are ``verb:plural`` or ``verb:plural/subresource`` (``patch:nodes``,
``create:pods/eviction``, ``list:pods``). Every call is logged in ``calls`` as (name, target, ``clock()``),
so tests can say what was written, by whom and when.
"""

from __future__ import annotations

import copy
import threading
from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from agents.kit.calls import event_problem
from agents.kit.errors import ApiError
from agents.kit.port import MERGE_PATCH, STRATEGIC_MERGE_PATCH, Resource

#: List merge keys of the strategic merge patches the agents send.
MERGE_KEYS: dict[tuple[str, ...], str] = {("status", "conditions"): "type", ("spec", "schedulingGates"): "name"}


def merge(target: Any, patch: Any, keys: Mapping[tuple[str, ...], str], path: tuple[str, ...] = ()) -> Any:
    """RFC 7386 JSON merge patch, except that the lists at ``keys`` (path → merge key) merge item by item and
    ``$patch: delete`` removes one: with no keys a merge patch, with :data:`MERGE_KEYS` a strategic one."""
    if not isinstance(patch, dict):
        key = keys.get(path)
        if key is not None and isinstance(patch, list) and isinstance(target, list):
            items = [copy.deepcopy(t) for t in target]
            for item in patch:
                name = item.get(key)
                items = [t for t in items if t.get(key) != name]
                if item.get("$patch") != "delete":
                    items.append(copy.deepcopy(item))
            return items
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for k, value in patch.items():
        if value is None:
            result.pop(k, None)
        else:
            result[k] = merge(result.get(k), value, keys, (*path, k))
    return result


def strategic_merge(target: Any, patch: Any) -> Any:
    return merge(target, patch, MERGE_KEYS)


def matches(labels: dict[str, Any], selector: str | None) -> bool:
    """Equality-based label selectors: ``k=v``, ``k==v``, ``k!=v``, ``k``, ``!k``, comma-separated."""
    for term in (t.strip() for t in (selector or "").split(",") if t.strip()):
        if "!=" in term:
            k, v = term.split("!=", 1)
            if labels.get(k.strip()) == v.strip():
                return False
        elif "=" in term:
            k, v = term.replace("==", "=").split("=", 1)
            if labels.get(k.strip()) != v.strip():
                return False
        elif term.startswith("!"):
            if term[1:] in labels:
                return False
        elif term not in labels:
            return False
    return True


def field_matches(obj: dict[str, Any], selector: str | None) -> bool:
    """Whether `obj` matches a field selector of `path=value`, `path==value` and `path!=value` terms, as the API
    server reads one."""
    for term in (t.strip() for t in (selector or "").split(",") if t.strip()):
        negate = "!=" in term
        path, _, want = term.partition("!=") if negate else term.partition("=")
        want = want.removeprefix("=")
        value: Any = obj
        for part in path.split("."):
            value = value.get(part) if isinstance(value, dict) else None
        if (str(value or "") == want) == negate:
            return False
    return True


class MemoryApi:
    """The kit's :class:`~agents.kit.port.KubePort` on dicts in memory; thread-safe."""

    def __init__(self, clock: Callable[[], float] = lambda: 0.0) -> None:
        self.clock = clock
        self.lock = threading.RLock()
        self.rv = 100
        self.objects: dict[str, dict[str, dict[str, Any]]] = {}
        self.scales: dict[str, int] = {}
        self.events: list[dict[str, Any]] = []
        self.evicted: list[str] = []
        self.pdb_blocked: set[str] = set()
        #: (resourceVersion, plural, event type, object): what a watch from a resourceVersion would see.
        self.history: list[tuple[int, str, str, dict[str, Any]]] = []
        self.calls: list[tuple[str, str, float]] = []
        self.watch_answers: dict[str, list[list[dict[str, Any]] | BaseException]] = defaultdict(list)
        self._queued: dict[str, list[BaseException]] = {}
        self._always: dict[str, BaseException] = {}
        self._names = 0

    # -- setup and inspection ---------------------------------------------------------------------

    @staticmethod
    def key(kind: str, namespace: str | None, name: str) -> str:
        return name if kind == "nodes" or not namespace else f"{namespace}/{name}"

    def put(self, kind: str | Resource, obj: dict[str, Any], etype: str = "MODIFIED") -> dict[str, Any]:
        """Store ``obj`` (a new resourceVersion, recorded in the history); the stored copy."""
        plural = kind.plural if isinstance(kind, Resource) else kind
        with self.lock:
            self.rv += 1
            obj = copy.deepcopy(obj)
            meta = obj.setdefault("metadata", {})
            meta["resourceVersion"] = str(self.rv)
            store = self.objects.setdefault(plural, {})
            k = self.key(plural, meta.get("namespace"), meta["name"])
            if k not in store and etype == "MODIFIED":
                etype = "ADDED"
            store[k] = obj
            self.history.append((self.rv, plural, etype, copy.deepcopy(obj)))
            return obj

    def remove(self, kind: str | Resource, key: str) -> None:
        plural = kind.plural if isinstance(kind, Resource) else kind
        with self.lock:
            obj = self.objects.get(plural, {}).pop(key)
            self.rv += 1
            obj["metadata"]["resourceVersion"] = str(self.rv)  # as the API server's DELETED event carries it
            self.history.append((self.rv, plural, "DELETED", obj))

    def fail(self, call: str, *errors: BaseException) -> None:
        self._queued.setdefault(call, []).extend(errors)

    def fail_always(self, call: str, error: BaseException | None) -> None:
        if error is None:
            self._always.pop(call, None)
        else:
            self._always[call] = error

    def count(self, call: str) -> int:
        return sum(1 for name, _, _ in self.calls if name == call)

    def writes(self) -> list[tuple[str, str, float]]:
        return [c for c in self.calls if c[0].split(":")[0] in ("create", "patch", "replace")]

    def _enter(self, verb: str, resource: Resource, target: str, subresource: str | None = None) -> None:
        call = f"{verb}:{resource.plural}" + (f"/{subresource}" if subresource else "")
        self.calls.append((call, target, self.clock()))
        queued = self._queued.get(call)
        if queued:
            raise queued.pop(0)
        if call in self._always:
            raise self._always[call]

    def _get(self, plural: str, key: str) -> dict[str, Any]:
        obj = self.objects.get(plural, {}).get(key)
        if obj is None:
            raise ApiError("not_found", f"{plural} {key}", 404)
        return obj

    @staticmethod
    def _check_rv(current: dict[str, Any], body: dict[str, Any]) -> None:
        want = (body.get("metadata") or {}).get("resourceVersion")
        if want is not None and str(want) != current["metadata"]["resourceVersion"]:
            raise ApiError("conflict", "the object has been modified", 409)

    # -- the port ---------------------------------------------------------------------------------

    def get(self, resource: Resource, name: str, namespace: str | None = None) -> dict[str, Any]:
        key = self.key(resource.plural, namespace, name)
        with self.lock:
            self._enter("get", resource, key)
            return copy.deepcopy(self._get(resource.plural, key))

    def list(self, resource: Resource, namespace: str | None = None, *, label_selector: str | None = None,
             field_selector: str | None = None, limit: int | None = None,
             continue_token: str | None = None) -> dict[str, Any]:
        with self.lock:
            self._enter("list", resource, namespace or "")
            items = [o for o in self.objects.get(resource.plural, {}).values()
                     if (not namespace or o["metadata"].get("namespace") == namespace)
                     and matches(o["metadata"].get("labels") or {}, label_selector)
                     and field_matches(o, field_selector)]
            start = int(continue_token or 0)
            page = items[start:start + limit] if limit else items[start:]
            meta: dict[str, Any] = {"resourceVersion": str(self.rv)}
            if limit and start + limit < len(items):
                meta["continue"] = str(start + limit)
            return {"metadata": meta, "items": copy.deepcopy(page)}

    def watch(self, resource: Resource, resource_version: str, timeout_seconds: int, namespace: str | None = None, *,
              label_selector: str | None = None, field_selector: str | None = None) -> Iterator[dict[str, Any]]:
        """Scripted answers (``watch_answers[plural]``: events, or an error to raise), else a watch that ends.
        Events of objects outside ``namespace`` or ``label_selector`` are not delivered, as on the API server."""
        with self.lock:
            self._enter("watch", resource, resource_version)
            answers = self.watch_answers.get(resource.plural) or []
            answer = answers.pop(0) if answers else []
        if isinstance(answer, BaseException):
            raise answer
        for event in answer:
            meta = (event.get("object") or {}).get("metadata") or {}
            if event.get("type") in ("ADDED", "MODIFIED", "DELETED") and (
                    (namespace and meta.get("namespace") != namespace)
                    or not matches(meta.get("labels") or {}, label_selector)
                    or not field_matches(event.get("object") or {}, field_selector)):
                continue
            yield event

    def create(self, resource: Resource, body: dict[str, Any], namespace: str | None = None,
               name: str | None = None, subresource: str | None = None) -> dict[str, Any]:
        with self.lock:
            self._enter("create", resource, self.key(resource.plural, namespace, name or ""), subresource)
            if subresource == "eviction" and name is not None:
                return self._evict(namespace or "", name, body)
            obj = copy.deepcopy(body)
            meta = obj.setdefault("metadata", {})
            if namespace and resource.namespaced:
                meta["namespace"] = namespace
            if not meta.get("name"):
                self._names += 1
                meta["name"] = f"{meta.get('generateName', 'obj-')}{self._names:05d}"
            if resource.plural == "events":
                problem = event_problem(obj)
                if problem is not None:
                    raise ApiError("invalid", f"Event {meta['name']} is invalid: {problem}", 422)
                self.events.append(copy.deepcopy(obj))
            if self.key(resource.plural, namespace, meta["name"]) in self.objects.get(resource.plural, {}):
                raise ApiError("conflict", f"{resource.plural} {meta['name']} already exists", 409)
            meta.setdefault("uid", f"uid-{meta['name']}")
            return copy.deepcopy(self.put(resource, obj, "ADDED"))

    def _evict(self, namespace: str, name: str, body: dict[str, Any]) -> dict[str, Any]:
        key = f"{namespace}/{name}"
        pod = self._get("pods", key)
        uid = ((body.get("deleteOptions") or {}).get("preconditions") or {}).get("uid")
        if uid is not None and uid != pod["metadata"].get("uid"):
            raise ApiError("conflict", f"precondition failed: UID in precondition: {uid}, UID in object meta: "
                           f"{pod['metadata'].get('uid')}", 409)
        if key in self.pdb_blocked or name in self.pdb_blocked:
            raise ApiError("throttled", "Cannot evict pod as it would violate the pod's disruption budget.", 429)
        self.remove("pods", key)
        self.evicted.append(key)
        return {"kind": "Status", "apiVersion": "v1", "status": "Success"}

    def patch(self, resource: Resource, name: str, body: dict[str, Any], namespace: str | None = None,
              content_type: str = MERGE_PATCH, subresource: str | None = None) -> dict[str, Any]:
        key = self.key(resource.plural, namespace, name)
        with self.lock:
            self._enter("patch", resource, key, subresource)
            if subresource == "scale":
                owner = copy.deepcopy(self._get(resource.plural, key))
                replicas = int(((body.get("spec") or {}).get("replicas")) or 0)
                owner.setdefault("spec", {})["replicas"] = self.scales[key] = replicas
                self.put(resource, owner)
                return {"kind": "Scale", "metadata": {"name": name, "namespace": namespace},
                        "spec": {"replicas": replicas}}
            current = self._get(resource.plural, key)
            self._check_rv(current, body)
            body = {**body, "metadata": {k: v for k, v in (body.get("metadata") or {}).items()
                                         if k != "resourceVersion"}}
            merged = merge(current, body, MERGE_KEYS if content_type == STRATEGIC_MERGE_PATCH else {})
            return copy.deepcopy(self.put(resource, merged))

    def replace(self, resource: Resource, name: str, body: dict[str, Any],
                namespace: str | None = None) -> dict[str, Any]:
        key = self.key(resource.plural, namespace, name)
        with self.lock:
            self._enter("replace", resource, key)
            current = self._get(resource.plural, key)
            if (body.get("metadata") or {}).get("resourceVersion") is None:
                raise ApiError("invalid", "metadata.resourceVersion: must be specified for an update", 422)
            self._check_rv(current, body)
            return copy.deepcopy(self.put(resource, body))
