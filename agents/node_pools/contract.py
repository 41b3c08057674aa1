"""The node-pool agent's contract: which nodes belong to which pool, the labels and taints each pool's nodes
carry, and the agent's own timings.

The stack declares pools by node ranges (``gpu-b-[001-128]``); one Pulumi object (this settings ConfigMap)
replaces a ``NodePatch`` per node, whose number made ``pulumi up`` and every preview grow with the fleet.
``components.node_pools.settings_from_config`` is the one way from the stack to these settings.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import cached_property
from typing import Annotated, Any, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from agents.kit.timing import lease_timing_problem
from agents.node_names import expand_node_names
from agents.node_taints import (
    health_taint_key,
    leaf_label_key,
    reserved_taint_key,
    spare_taint_key,
    spine_label_key,
    switch_fault_taint_key,
)

APP = "node-pools"
METRICS_PORT = 9317
"""The agent's /metrics, /livez and /readyz port."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Taint(_Model):
    key: str = Field(min_length=1, max_length=316)
    value: str = Field(default="", max_length=63)
    effect: Literal["NoSchedule", "PreferNoSchedule"]
    """Never NoExecute: a pool taint keeps new pods off; it does not evict what runs."""


class LeafSwitch(_Model):
    """A leaf switch, the spine above it, and its nodes: named (``nodes``), or those whose site label has
    ``label_value`` (the pool's ``site_label``)."""

    name: str = Field(min_length=1, max_length=63)
    spine: str = Field(min_length=1, max_length=63)
    nodes: list[str] = Field(default_factory=list)
    label_value: str | None = None


class Fabric(_Model):
    """A pool's switches as node labels: the keys written (``<prefix>/leaf``, ``<prefix>/spine``) and each leaf's
    nodes. A node that hangs off no leaf (a site label not set yet, or a value no leaf has) carries neither."""

    leaf_key: str = Field(min_length=1)
    spine_key: str = Field(min_length=1)
    site_label: str | None = None
    """The site's own leaf label, for leaves that take their nodes by its value."""
    leaves: list[LeafSwitch] = Field(min_length=1)

    @cached_property
    def node_leaves(self) -> dict[str, LeafSwitch]:
        return {node: leaf for leaf in self.leaves for node in expand_node_names(leaf.nodes)}

    @cached_property
    def value_leaves(self) -> dict[str, LeafSwitch]:
        return {leaf.label_value or leaf.name: leaf for leaf in self.leaves if not leaf.nodes}

    def leaf_of(self, name: str, labels: Mapping[str, Any]) -> LeafSwitch | None:
        """The node's leaf: by its name, else by the value of the site's label."""
        found = self.node_leaves.get(name)
        if found is None and self.site_label is not None:
            value = labels.get(self.site_label)
            found = self.value_leaves.get(value) if isinstance(value, str) else None
        return found

    def labels(self, name: str, labels: Mapping[str, Any]) -> dict[str, str]:
        leaf = self.leaf_of(name, labels)
        return {} if leaf is None else {self.leaf_key: leaf.name, self.spine_key: leaf.spine}


class Pool(_Model):
    """One pool: its nodes (names or ranges) and what each of them carries."""

    name: str = Field(min_length=1, max_length=63)
    nodes: list[str] = Field(min_length=1)
    labels: dict[str, str] = Field(default_factory=dict)
    taints: list[Taint] = Field(default_factory=list)
    fabric: Fabric | None = None
    """The pool's leaf and spine switches; each node also carries the labels of its own."""
    spares: Annotated[int, Field(ge=0)] = 0
    """Warm spares the pool keeps out of training (agents/node_pools/spares.py); each quarantined node uses one."""

    def labels_for(self, node: Mapping[str, Any]) -> dict[str, str]:
        """What ``node`` (its JSON) carries: the pool's labels and, with a fabric, its leaf and spine."""
        if self.fabric is None:
            return dict(self.labels)
        metadata = node.get("metadata") or {}
        return {**self.labels, **self.fabric.labels(str(metadata.get("name") or ""), metadata.get("labels") or {})}


class NodePoolSettings(_Model):
    """Settings of the node-pool agent (the ConfigMap's ``settings.json``)."""

    label_prefix: str = Field(min_length=1)
    pools: list[Pool] = Field(default_factory=list)
    namespace: str = "gpu-system"
    """Where its Lease lives (the system namespace)."""
    training_namespace: str = "training"
    """Whose pods make a node busy: an idle node only is taken as a spare."""
    lease_name: str = APP
    lease_duration_seconds: Annotated[int, Field(gt=0)] = 30
    renew_deadline_seconds: Annotated[float, Field(gt=0)] = 20.0
    retry_period_seconds: Annotated[float, Field(gt=0)] = 5.0
    request_timeout_seconds: Annotated[float, Field(gt=0)] = 10.0
    watch_timeout_seconds: Annotated[int, Field(gt=0, le=3600)] = 300
    resync_seconds: Annotated[int, Field(gt=0, le=86400)] = 600
    """A full list and pass over every node this often: repairs anything a missed event left wrong."""
    backoff_base_seconds: Annotated[float, Field(gt=0)] = 1.0
    backoff_max_seconds: Annotated[float, Field(gt=0)] = 60.0

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        problems: list[str] = []
        names = [p.name for p in self.pools]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            problems.append(f"pool names must be unique, repeated: {', '.join(dupes)}")
        owner: dict[str, str] = {}
        guarded_keys = {health_taint_key(self.label_prefix): "the health guard",
                        switch_fault_taint_key(self.label_prefix): "the health guard",
                        spare_taint_key(self.label_prefix): "the pool's spares",
                        reserved_taint_key(self.label_prefix): "the burst handover"}
        for pool in self.pools:
            try:
                members = expand_node_names(pool.nodes)
            except ValueError as exc:
                problems.append(f"pool {pool.name}: {exc}")
                continue
            for node in members:
                if node in owner and owner[node] != pool.name:
                    problems.append(f"node {node} is in pools {owner[node]} and {pool.name}")
                owner.setdefault(node, pool.name)
            keys = [t.key for t in pool.taints]
            if len(set(keys)) != len(keys):
                problems.append(f"pool {pool.name}: taint keys must be unique, got {keys}")
            for guarded, owner_of in guarded_keys.items():
                if guarded in keys or guarded in pool.labels:
                    problems.append(f"pool {pool.name}: {guarded} belongs to {owner_of}; a pool may not set it")
            if pool.fabric is not None:
                problems += _fabric_problems(pool, self.label_prefix)
            if pool.spares >= len(members):
                problems.append(f"pool {pool.name}: spares ({pool.spares}) must be fewer than its nodes "
                                f"({len(members)})")
        problem = lease_timing_problem(self.request_timeout_seconds, self.renew_deadline_seconds,
                                       self.lease_duration_seconds)
        if problem:
            problems.append(problem)
        if problems:
            raise ValueError("; ".join(problems[:20]) + (f"; and {len(problems) - 20} more" if len(problems) > 20
                                                         else ""))
        return self

    @property
    def applied_annotation(self) -> str:
        """On each node the agent labelled: the label and taint keys it set (JSON), so it removes exactly those
        when the node leaves a pool or a pool stops setting one, and nothing it did not set."""
        return f"{self.label_prefix}/node-pool-applied"

    def membership(self) -> dict[str, Pool]:
        """Node name → its pool."""
        return {node: pool for pool in self.pools for node in expand_node_names(pool.nodes)}


def _fabric_problems(pool: Pool, prefix: str) -> list[str]:
    """The fabric writes the contract's keys, its leaves are distinct and name nodes of the pool (or a site
    label's value), and the pool's own labels leave those keys to it."""
    fabric = pool.fabric
    assert fabric is not None
    problems: list[str] = []
    where = f"pool {pool.name}: fabric"
    wanted = (leaf_label_key(prefix), spine_label_key(prefix))
    if (fabric.leaf_key, fabric.spine_key) != wanted:
        problems.append(f"{where} must write {wanted[0]} and {wanted[1]}, got {fabric.leaf_key} and {fabric.spine_key}")
    if set(wanted) & set(pool.labels):
        problems.append(f"{where}: {' and '.join(wanted)} come from the fabric; the pool's labels may not set them")
    names = [leaf.name for leaf in fabric.leaves]
    if len(set(names)) != len(names):
        problems.append(f"{where}: leaf names must be unique, got {names}")
    try:
        members = set(expand_node_names(pool.nodes))
        for leaf in fabric.leaves:
            stray = sorted(set(expand_node_names(leaf.nodes)) - members)
            if stray:
                problems.append(f"{where}: leaf {leaf.name} names nodes outside the pool: {', '.join(stray[:5])}")
            if not leaf.nodes and fabric.site_label is None:
                problems.append(f"{where}: leaf {leaf.name} names no nodes and the fabric has no site_label")
    except ValueError as exc:
        problems.append(f"{where}: {exc}")
    return problems


class SettingsError(ValueError):
    """Invalid settings; the message names every offending key and where it came from."""


def parse_settings(raw: Any, source: str = "settings") -> NodePoolSettings:
    """Settings from parsed JSON; every problem at once, each with its path and ``source``."""
    if not isinstance(raw, Mapping):
        raise SettingsError(f"{source}: settings must be a JSON object, got {type(raw).__name__}")
    try:
        return NodePoolSettings.model_validate(raw)
    except ValidationError as exc:
        problems = [
            f"{source}: {'.'.join(str(p) for p in err['loc']) or '(top)'}: {err['msg']}" for err in exc.errors()
        ]
        raise SettingsError("; ".join(problems)) from None


def settings_document(settings: NodePoolSettings) -> str:
    """The ConfigMap file: every key spelled out, for stable diffs (an absent fabric or site label is left out)."""
    return settings.model_dump_json(indent=2, exclude_none=True) + "\n"
