"""Which RBAC grants a service account used, which it never used, and what it was refused (pure).

The local API server logs every request a service account makes, with the authorizer's decision
(``plan.audit_policy``). Matched against the rules of the roles bound to that account, the log says
which grants the real binary needed (used), which it never exercised (candidates for removal) and what
it asked for that nothing grants (denied: a grant the stack lacks). A grant is one verb on one resource
of one role, with the namespace it applies in (``None``: a ClusterRole bound cluster-wide) and its
``resourceNames``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

DECISION = "authorization.k8s.io/decision"


@dataclass(frozen=True, order=True)
class Grant:
    """One verb on one resource, granted by ``role`` where ``namespace`` says (None: everywhere)."""

    role: str
    namespace: str | None
    group: str
    resource: str
    verb: str
    names: tuple[str, ...] = ()

    def describe(self) -> str:
        where = "cluster-wide" if self.namespace is None else f"in {self.namespace}"
        names = f" {list(self.names)}" if self.names else ""
        group = f"{self.group}/" if self.group else ""
        return f"{self.verb} {group}{self.resource}{names} {where} ({self.role})"


@dataclass(frozen=True)
class Request:
    """One request of the audit log: who, what, where, and whether the authorizer allowed it."""

    user: str
    verb: str
    group: str
    #: ``resource`` or ``resource/subresource``; ``nonresource:<path>`` for non-resource URLs.
    resource: str
    namespace: str
    name: str
    allowed: bool
    code: int = 0
    #: The client's User-Agent (agents send ``<agent>/<identity>``, so replicas of one account differ).
    user_agent: str = ""
    #: When the API server received it (epoch seconds; 0 when the event has no timestamp).
    received: float = 0.0

    def describe(self) -> str:
        where = f" in {self.namespace}" if self.namespace else ""
        name = f" {self.name}" if self.name else ""
        group = f"{self.group}/" if self.group else ""
        return f"{self.verb} {group}{self.resource}{name}{where} (HTTP {self.code})"


def grants_from_rules(role: str, namespace: str | None, rules: Iterable[Mapping[str, Any]]) -> list[Grant]:
    """Every (group, resource, verb, names) a role's rules grant, one :class:`Grant` each."""
    out: list[Grant] = []
    for rule in rules:
        names = tuple(sorted(rule.get("resourceNames") or ()))
        for group in rule.get("apiGroups") or ():
            for resource in rule.get("resources") or ():
                for verb in rule.get("verbs") or ():
                    out.append(Grant(role, namespace, str(group), str(resource), str(verb), names))
    return out


def matches(grant: Grant, request: Request) -> bool:
    """Whether RBAC would allow ``request`` by ``grant`` (names never allow a create: the object has none yet)."""
    if (grant.group, grant.resource, grant.verb) != (request.group, request.resource, request.verb):
        return False
    if grant.namespace is not None and grant.namespace != request.namespace:
        return False
    if grant.names:
        return request.verb != "create" and request.name in grant.names
    return True


@dataclass
class Usage:
    used: dict[Grant, int] = field(default_factory=dict)
    unused: list[Grant] = field(default_factory=list)
    #: Refused requests: something the binary needs that the grants lack.
    denied: list[Request] = field(default_factory=list)
    #: Allowed requests no grant of the account matches (allowed by the cluster's default roles).
    outside: list[Request] = field(default_factory=list)

    def report(self) -> dict[str, Any]:
        return {
            "used": [{"grant": g.describe(), "requests": n} for g, n in sorted(self.used.items())],
            "unused": [g.describe() for g in sorted(self.unused)],
            "denied": sorted({r.describe() for r in self.denied}),
            "outside": sorted({r.describe() for r in self.outside}),
        }


def usage(grants: Sequence[Grant], requests: Iterable[Request]) -> Usage:
    """Count, for each grant, the allowed requests it matches; list the rest."""
    counts = dict.fromkeys(grants, 0)
    result = Usage()
    for req in requests:
        if not req.allowed:
            result.denied.append(req)
            continue
        hit = [g for g in grants if matches(g, req)]
        for g in hit:
            counts[g] += 1
        if not hit:
            result.outside.append(req)
    result.used = {g: n for g, n in counts.items() if n}
    result.unused = [g for g, n in counts.items() if not n]
    return result


def _request(event: Any, where: str) -> Request:
    if not isinstance(event, dict) or event.get("kind") != "Event":
        raise ValueError(f"{where}: not an audit Event")
    user = (event.get("user") or {}).get("username")
    verb = event.get("verb")
    if not isinstance(user, str) or not isinstance(verb, str):
        raise ValueError(f"{where}: an audit Event without user.username or verb")
    ref = event.get("objectRef")
    if ref is None:
        uri = str(event.get("requestURI") or "")
        group, resource, namespace, name = "", f"nonresource:{uri.split('?', 1)[0]}", "", ""
    elif isinstance(ref, dict):
        sub = ref.get("subresource")
        group = str(ref.get("apiGroup") or "")
        resource = f"{ref.get('resource') or ''}{'/' + str(sub) if sub else ''}"
        namespace, name = str(ref.get("namespace") or ""), str(ref.get("name") or "")
    else:
        raise ValueError(f"{where}: objectRef is not an object")
    annotations = event.get("annotations") or {}
    status = event.get("responseStatus") or {}
    if not isinstance(annotations, dict) or not isinstance(status, dict):
        raise ValueError(f"{where}: annotations or responseStatus is not an object")
    code = status.get("code", 0)
    return Request(user, verb, group, resource, namespace, name, annotations.get(DECISION) == "allow",
                   code if isinstance(code, int) else 0, str(event.get("userAgent") or ""),
                   _epoch(event.get("requestReceivedTimestamp"), where))


def _epoch(stamp: Any, where: str) -> float:
    """An audit timestamp (RFC 3339, microseconds) as epoch seconds; 0 when absent."""
    if stamp is None:
        return 0.0
    try:
        return datetime.fromisoformat(str(stamp).replace("Z", "+00:00")).timestamp()
    except ValueError:
        raise ValueError(f"{where}: requestReceivedTimestamp {stamp!r} is not an RFC 3339 time") from None


def parse_audit(text: str, source: str, user: str | None = None, skipped: list[str] | None = None) -> list[Request]:
    """The requests of a JSON-lines audit log (of ``user`` only when given), one per audit ID.

    A last line without its newline is one the API server is still writing and is skipped; any other line
    that is not an audit Event is an error naming ``source`` and the line — or, given ``skipped``, that error is
    added there and the line left out (a soak that kills the API server may leave one torn line mid-file).
    """
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    elif lines:
        lines.pop()  # partly written
    seen: set[str] = set()
    out: list[Request] = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        where = f"{source}:{number}"
        try:
            try:
                event = json.loads(line)
            except json.JSONDecodeError as err:
                raise ValueError(f"{where}: not JSON ({err.msg})") from None
            req = _request(event, where)
        except ValueError as err:
            if skipped is None:
                raise
            skipped.append(str(err))
            continue
        audit_id = str(event.get("auditID") or f"line-{number}")
        if audit_id in seen or (user is not None and req.user != user):
            continue
        seen.add(audit_id)
        out.append(req)
    return out
