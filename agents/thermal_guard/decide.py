"""Pure decision core of the thermal guard: observations and the previous state in, actions and the new
state out. No clock, no I/O; the shell and the tests feed it.

The policy, and why:

* A node is tainted when its hottest GPU has been at or above the threshold in every poll for at least
  the hold time. One sample below restarts the clock, as Prometheus' ``for`` does, so the guard and the
  ``GpuTemperatureCritical`` alert agree.
* A node without a temperature sample is not judged: its clock restarts. Missing telemetry is the
  exporter alerts' business; tainting blind would empty the fleet on a Prometheus outage.
* The taint is sticky. Cooling down does not release it: a GPU that reached the limit once is pulled
  from service and looked at by a human, instead of flapping between hot and schedulable.
* The only way out is explicit: the operator sets ``<prefix>/thermal-release`` (label or annotation)
  and the guard removes the taint, its labels and the release marker together. If the operator removed
  the taint by hand, the guard cleans up its leftover labels the same way. After a release the clock
  starts from zero, so a node still hot is tainted again only after a full hold.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field

from agents.thermal_guard.settings import ThermalSettings


@dataclass(frozen=True)
class NodeView:
    """What the guard sees of a Kubernetes node."""

    name: str
    tainted: bool = False
    """Our taint key is in ``spec.taints``."""
    marked: bool = False
    """Our reason label is on the node (we tainted it, or left marks behind)."""
    release_requested: bool = False
    """The operator set the release label or annotation."""


@dataclass(frozen=True)
class GuardState:
    """Carried between cycles: since when each untainted node has been continuously hot."""

    hot_since: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Taint:
    node: str
    since: float
    """Start of the hot period (epoch seconds), recorded on the node."""
    celsius: float


@dataclass(frozen=True)
class Release:
    node: str


Action = Taint | Release


class NodeStatus(enum.StrEnum):
    OK = "ok"
    UNKNOWN = "unknown"
    WARNING = "warning"
    PENDING = "pending"
    TAINTED = "tainted"


@dataclass(frozen=True)
class Decision:
    actions: tuple[Action, ...]
    state: GuardState
    status: Mapping[str, NodeStatus]


def decide(
    settings: ThermalSettings,
    temperatures: Mapping[str, float],
    nodes: Mapping[str, NodeView],
    state: GuardState,
    now: float,
) -> Decision:
    """One guard cycle. ``temperatures`` maps node name to its hottest GPU in °C at ``now``.

    Temperatures of hosts that are not watched nodes are ignored; the shell counts them.
    """
    actions: list[Action] = []
    hot_since: dict[str, float] = {}
    status: dict[str, NodeStatus] = {}
    for name in sorted(nodes):
        node = nodes[name]
        temp = temperatures.get(name)
        if node.release_requested or (node.marked and not node.tainted):
            actions.append(Release(name))
            status[name] = NodeStatus.UNKNOWN if temp is None else _band(settings, temp)
            continue  # the clock restarts: a node still hot must stay hot a full hold again
        if node.tainted:
            status[name] = NodeStatus.TAINTED
            continue
        if temp is None:
            status[name] = NodeStatus.UNKNOWN
            continue
        if temp < settings.threshold_celsius:
            status[name] = _band(settings, temp)
            continue
        since = state.hot_since.get(name, now)
        if now - since >= settings.hold_seconds:
            actions.append(Taint(name, since, temp))
            status[name] = NodeStatus.TAINTED
        else:
            hot_since[name] = since
            status[name] = NodeStatus.PENDING
    return Decision(tuple(actions), GuardState(hot_since), status)


def _band(settings: ThermalSettings, temp: float) -> NodeStatus:
    return NodeStatus.WARNING if temp >= settings.warning_celsius else NodeStatus.OK


def reason_label_value(settings: ThermalSettings, celsius: float) -> str:
    """Value of the reason label: short, label-safe, and says what happened (``gpu-temp-79c-ge-78c``)."""
    return f"gpu-temp-{celsius:g}c-ge-{settings.threshold_celsius:g}c"
