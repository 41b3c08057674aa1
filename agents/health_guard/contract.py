"""The health guard's contract: the names it writes on nodes, its settings type and their defaults.

Everything another program (the inference template, the burst controller, the alert rules, an operator with
``kubectl``) must agree on lives here, so a name is spelled once. ``components.health_guard.settings_from_config``
is the one way from the stack configuration to the guard's settings (no agent imports the components).

Signal → class defaults and their sources (NVIDIA's XID catalogue, docs.nvidia.com/deploy/xid-errors, and
the DCGM field reference):

* **fatal** — training *and* inference leave the node:
  XID 48 (double-bit ECC), 64 (row-remapping recording failure), 74 (NVLink error), 79 (GPU fallen off
  the bus), 95 (uncontained ECC), 119/120 (GSP firmware timeout/error: the GPU needs a reset); an increase of
  ``DCGM_FI_DEV_ECC_DBE_VOL_TOTAL``; ``DCGM_FI_DEV_ROW_REMAP_FAILURE`` set (no spare rows left); an
  InfiniBand port of a training rail not ACTIVE (``infiniband_state_id != 4``) for a minute.
* **degraded** — training leaves, inference may stay:
  hottest GPU at or above the thermal limit (78 °C) for the hold time, released below limit − band (73 °C);
  XID 92 (high single-bit ECC rate) and 94 (contained ECC); NVLink CRC/replay error bursts and any NVLink
  recovery; InfiniBand ``link_downed``/symbol-error bursts; correctable row remaps rising (a correctable-ECC
  storm in a field this fleet collects).

The InfiniBand signals (those read from the ``ib`` exporter) are also judged per leaf switch: many nodes under one
leaf going bad together is the switch's fault, not theirs (:mod:`agents.health_guard.switches`).
"""

from __future__ import annotations

import enum
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Self

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from agents.defaults import DEFAULT_LABEL_PREFIX

# The thermal defaults live with the thermal model (one place for the threshold, its hold and its band).
from agents.health_guard.thermal import THERMAL_BAND_CELSIUS as THERMAL_BAND_CELSIUS
from agents.health_guard.thermal import THERMAL_HOLD_SECONDS as THERMAL_HOLD_SECONDS
from agents.health_guard.thermal import THERMAL_LIMIT_CELSIUS as THERMAL_LIMIT_CELSIUS
from agents.kit.timing import lease_timing_problem
from agents.node_taints import health_taint_key, leaf_label_key, spine_label_key, switch_fault_taint_key


class HealthClass(enum.StrEnum):
    """How bad a node is; the taint value and the label value."""

    DEGRADED = "degraded"
    FATAL = "fatal"


SEVERITY: Mapping[HealthClass, int] = {HealthClass.DEGRADED: 1, HealthClass.FATAL: 2}

CONDITION_TYPE = "GpuHealthy"
"""Node condition the guard owns: ``False`` while quarantined, ``True`` once released."""
SWITCH_CONDITION_TYPE = "InfinibandSwitchHealthy"
"""Node condition the guard owns on every node of a leaf whose switch is at fault: ``False`` naming the leaf."""
TAINT_EFFECT = "NoSchedule"
"""Never NoExecute: the guard evicts through the Eviction API, so PodDisruptionBudgets are honoured."""
OPT_OUT_VALUE = "disabled"
APP = "health-guard"
METRICS_PORT = 9316
"""The guard's /metrics, /livez and /readyz port (the stack's ``observability.healthGuardPort`` default)."""

DCGM = "dcgm"
IB = "ib"


@dataclass(frozen=True)
class Names:
    """Label, annotation and taint keys under the stack's prefix."""

    prefix: str

    @property
    def taint(self) -> str:
        """``<prefix>/gpu-health=<class>:NoSchedule``; also the label carrying the class."""
        return health_taint_key(self.prefix)

    @property
    def since(self) -> str:
        return f"{self.prefix}/gpu-health-since"

    @property
    def reasons(self) -> str:
        """Comma-separated signal names that quarantined the node: release needs exactly these healthy."""
        return f"{self.prefix}/gpu-health-reasons"

    @property
    def detail(self) -> str:
        return f"{self.prefix}/gpu-health-detail"

    @property
    def history(self) -> str:
        """Epoch seconds of the node's recent quarantines: the rate limit and flap count survive restarts."""
        return f"{self.prefix}/gpu-health-history"

    @property
    def repaired(self) -> str:
        """Label or annotation an operator or repair system sets (any value) once a fatal node is fixed."""
        return f"{self.prefix}/gpu-repaired"

    @property
    def overridden(self) -> str:
        """Comma-separated signals an operator overrode by removing our taint by hand: ignored on the node until
        each reads clear once. On the node, so a restart or a new leader keeps the person's decision."""
        return f"{self.prefix}/gpu-health-overridden"

    @property
    def opt_out(self) -> str:
        """Label ``<prefix>/gpu-health-guard=disabled``: the guard leaves the node alone."""
        return f"{self.prefix}/gpu-health-guard"

    @property
    def breaker(self) -> str:
        """Annotation on the guard's Lease while its rate limit has tripped; a person removes it to reset."""
        return f"{self.prefix}/gpu-health-breaker"

    @property
    def leaf(self) -> str:
        """``<prefix>/leaf=<leaf switch>``, set by the node-pool agent on the nodes of a pool with a topology."""
        return leaf_label_key(self.prefix)

    @property
    def spine(self) -> str:
        return spine_label_key(self.prefix)

    @property
    def switch_fault(self) -> str:
        """``<prefix>/switch-fault=<leaf>:NoSchedule`` on every node of a leaf whose switch is at fault (never
        NoExecute: nothing is evicted); also the label, which tells a taint removed by hand from one never set."""
        return switch_fault_taint_key(self.prefix)

    @property
    def switch_reasons(self) -> str:
        """Comma-separated InfiniBand signals that made the switch fault: its class is the worst of theirs."""
        return f"{self.prefix}/switch-fault-reasons"

    @property
    def switch_since(self) -> str:
        return f"{self.prefix}/switch-fault-since"

    @property
    def switch_repaired(self) -> str:
        """Label or annotation (any value) on any one node of the leaf once its switch is fixed: a switch fault
        of the fatal class waits for it. Not :attr:`repaired`, so fixing a switch never releases a node's own
        fault, nor the reverse."""
        return f"{self.prefix}/switch-repaired"

    @property
    def workload(self) -> str:
        return f"{self.prefix}/workload"

    @property
    def pool(self) -> str:
        return f"{self.prefix}/pool"


_SIGNAL_NAME = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
_LABEL_NAME = r"^[a-zA-Z_][a-zA-Z0-9_]*$"
_DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Exporter(_Model):
    """Where a family of signals comes from, and how to tell whether it is still reporting."""

    node_label: Annotated[str, Field(pattern=_LABEL_NAME)]
    freshness_query: str = Field(min_length=1)
    """PromQL giving, per node, the epoch seconds of the newest sample (``timestamp(...)``)."""


class Signal(_Model):
    """One health signal: a PromQL value per node compared with a threshold, mapped to a class."""

    name: Annotated[str, Field(pattern=_SIGNAL_NAME)]
    health_class: HealthClass
    exporter: str
    query: str = Field(min_length=1)
    threshold: float
    """Unhealthy at or above this."""
    clear_below: float | None = None
    """Healthy only below this (hysteresis); ``None``: below ``threshold``."""
    hold_seconds: Annotated[int, Field(ge=0)] = 0
    """How long the value must stay at or above the threshold before the node is quarantined."""
    source: str = ""

    @property
    def clear(self) -> float:
        return self.threshold if self.clear_below is None else self.clear_below

    @model_validator(mode="after")
    def _hysteresis(self) -> Self:
        if self.clear_below is not None and self.clear_below > self.threshold:
            raise ValueError(f"signal {self.name}: clear_below ({self.clear_below}) above threshold ({self.threshold})")
        return self


@dataclass(frozen=True)
class Xid:
    """One row of the XID table: what NVIDIA's catalogue says it means and what the platform does."""

    number: int
    health_class: HealthClass
    meaning: str
    #: Pages when it repeats on one GPU within the alert's window (a GPU that keeps containing errors is due
    #: for replacement even while each one is survivable).
    pages_when_repeated: bool = False


#: The one XID table: the guard quarantines by it and the ``GpuCriticalXid`` alert pages on its fatal rows
#: (``components.alert_rules`` reads the stack's ``health.fatalXids``, whose default is this table). 13, 31
#: and 43 are usually the application and are in neither class.
XIDS: tuple[Xid, ...] = (
    Xid(48, HealthClass.FATAL, "double-bit ECC error"),
    Xid(64, HealthClass.FATAL, "row-remapping recording failure"),
    Xid(74, HealthClass.FATAL, "NVLink error"),
    Xid(79, HealthClass.FATAL, "GPU has fallen off the bus"),
    Xid(95, HealthClass.FATAL, "uncontained ECC error"),
    Xid(119, HealthClass.FATAL, "GSP firmware timeout"),
    Xid(120, HealthClass.FATAL, "GSP firmware error"),
    Xid(92, HealthClass.DEGRADED, "high single-bit ECC error rate"),
    Xid(94, HealthClass.DEGRADED, "contained ECC error", pages_when_repeated=True),
)
FATAL_XIDS: tuple[int, ...] = tuple(x.number for x in XIDS if x.health_class is HealthClass.FATAL)
DEGRADED_XIDS: tuple[int, ...] = tuple(x.number for x in XIDS if x.health_class is HealthClass.DEGRADED)
REPEATED_XIDS: tuple[int, ...] = tuple(x.number for x in XIDS if x.pages_when_repeated)
XID_SOURCE = "NVIDIA XID catalogue, docs.nvidia.com/deploy/xid-errors"


def xid_query(xids: tuple[int, ...] | list[int]) -> str:
    """GPUs per node whose last XID is one of ``xids`` (dcgm-exporter keeps the last XID as a gauge).

    One selection of the gauge, not one per XID: the GPUs with any XID (few) are counted per node and value
    (``count_values`` puts the value in an ``xid`` label), and the listed values are kept by joining on that label
    with a constant vector per XID. The same answer as ``count by (Hostname) (X == 48 or X == 79 …)``, which selected
    every GPU's series once per listed XID: at 16,384 GPUs 180 ms of Prometheus' time per cycle against 20 ms, and the
    slowest query of the guard's cycle (docs/scale.md). XIDs are positive (the stack's bounds), so ``> 0`` loses none.
    """
    if not xids or any(x < 1 for x in xids):
        raise ValueError(f"XIDs must be positive numbers, got {list(xids)}")
    wanted = " or ".join(f'label_replace(vector(1), "xid", "{x}", "", "")' for x in sorted(set(xids)))
    return (f'sum by (Hostname) (count_values by (Hostname) ("xid", DCGM_FI_DEV_XID_ERRORS > 0) '
            f"and on (xid) ({wanted}))")


def default_exporters() -> dict[str, Exporter]:
    return {
        DCGM: Exporter(node_label="Hostname", freshness_query="max by (Hostname) (timestamp(DCGM_FI_DEV_GPU_TEMP))"),
        IB: Exporter(node_label="node", freshness_query="max by (node) (timestamp(infiniband_state_id))"),
    }




def default_signals(
    threshold_celsius: float = THERMAL_LIMIT_CELSIUS,
    band_celsius: float = THERMAL_BAND_CELSIUS,
    hold_seconds: int = THERMAL_HOLD_SECONDS,
    fatal_xids: tuple[int, ...] | list[int] = FATAL_XIDS,
    degraded_xids: tuple[int, ...] | list[int] = DEGRADED_XIDS,
) -> tuple[Signal, ...]:
    """The documented defaults (module docstring), the thermal ones from the stack's thermal settings."""
    fatal, degraded = HealthClass.FATAL, HealthClass.DEGRADED
    ib_rails = 'and on (node, device, port) infiniband_port_info{link_layer="InfiniBand"}'
    signals = [
        Signal(name="xid-fatal", health_class=fatal, exporter=DCGM, query=xid_query(tuple(fatal_xids)),
               threshold=1, source=XID_SOURCE),
        Signal(name="ecc-uncorrectable", health_class=fatal, exporter=DCGM,
               query="max by (Hostname) (increase(DCGM_FI_DEV_ECC_DBE_VOL_TOTAL[10m]))", threshold=1,
               source="DCGM field DCGM_FI_DEV_ECC_DBE_VOL_TOTAL; XID 48/95"),
        Signal(name="row-remap-failure", health_class=fatal, exporter=DCGM,
               query="max by (Hostname) (DCGM_FI_DEV_ROW_REMAP_FAILURE)", threshold=1,
               source="DCGM field DCGM_FI_DEV_ROW_REMAP_FAILURE; NVIDIA A100/H100 row remapping guide"),
        Signal(name="ib-port-down", health_class=fatal, exporter=IB,
               query=f"count by (node) ((infiniband_state_id != 4) {ib_rails})", threshold=1, hold_seconds=60,
               source="InfiniBand port logical state (4 = ACTIVE), ib-exporter"),
        Signal(name="gpu-temperature", health_class=degraded, exporter=DCGM,
               query="max by (Hostname) (DCGM_FI_DEV_GPU_TEMP)", threshold=threshold_celsius,
               clear_below=threshold_celsius - band_celsius, hold_seconds=hold_seconds,
               source="fleet lesson: a GPU held at >= 78 C throttles and slows the whole gang"),
        Signal(name="xid-degraded", health_class=degraded, exporter=DCGM, query=xid_query(tuple(degraded_xids)),
               threshold=1, source=XID_SOURCE),
        Signal(name="nvlink-errors", health_class=degraded, exporter=DCGM,
               query="max by (Hostname) (rate(DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL[10m]) + "
                     "rate(DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL[10m]) + "
                     "rate(DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL[10m]))",
               threshold=0.1, source="DCGM NVLink CRC/replay counters; alert NvlinkErrorsRising"),
        Signal(name="nvlink-recovery", health_class=degraded, exporter=DCGM,
               query="max by (Hostname) (increase(DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL[10m]))",
               threshold=1, source="DCGM NVLink recovery counter; XID 74 precursor"),
        Signal(name="ib-link-errors", health_class=degraded, exporter=IB,
               query="max by (node) (increase(infiniband_link_downed_total[10m]) or "
                     "(rate(infiniband_symbol_error_total[10m]) > 0.01) * 100)",
               threshold=1, source="IBTA port counters link_downed, symbol_error (ib-exporter)"),
        Signal(name="ecc-correctable-storm", health_class=degraded, exporter=DCGM,
               query="max by (Hostname) (increase(DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS[1h]))", threshold=8,
               source="DCGM field DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS; XID 92"),
    ]
    return tuple(signals)


class GuardTunables(BaseModel):
    """The guard's judgement and rails, as the stack's `observability.health` sets them (that section is this model
    plus the XID lists and `signalClasses`, which become the guard's signals)."""

    # The docstrings below are the stack reference's descriptions too (docs/configuration.md).
    model_config = ConfigDict(use_attribute_docstrings=True)

    stale_after_seconds: Annotated[int, Field(ge=15)] = 120
    """A node whose exporter has been silent this long (seconds) is not judged: never unhealthy, never released.
    At least 15: a few of Prometheus' scrapes."""
    probation_seconds: Annotated[int, Field(ge=0)] = 1800
    """Healthy this long without a break (seconds; every quarantining signal reporting and clear) before a node is
    released; a fatal one also needs the repair mark."""
    max_nodes_per_hour: Annotated[int, Field(ge=0)] = 2
    """Guard rail: most nodes quarantined within an hour. One more trips the breaker, and the guard stops
    quarantining until a person resets it."""
    max_nodes_quarantined: Annotated[int, Field(ge=0)] = 4
    """Guard rail: most nodes quarantined at once, fleet-wide; one more trips the breaker."""
    max_pool_percent_per_hour: Annotated[float, Field(ge=0, le=100)] = 10.0
    """Guard rail: most of one pool quarantined within an hour (percent of its nodes, rounded down but at least
    one node unless 0); one more trips the breaker."""
    max_pool_percent_quarantined: Annotated[float, Field(ge=0, le=100)] = 20.0
    """Guard rail: most of one pool quarantined at once (percent of its nodes, rounded down but at least one
    node unless 0); one more trips the breaker."""
    flap_limit: Annotated[int, Field(ge=2)] = 3
    """Quarantined this often within `flapWindowSeconds`, even a degraded node waits for the repair mark."""
    flap_window_seconds: Annotated[int, Field(gt=0)] = 86400
    """Window over which quarantines count towards `flapLimit` (seconds)."""
    evict_inference_on_fatal: bool = True
    """Evict inference from fatal nodes too (through the Eviction API: PodDisruptionBudgets hold)."""
    switch_fault_min_nodes: Annotated[int, Field(ge=2)] = 3
    """Nodes under one leaf switch (`<labelPrefix>/leaf`) whose InfiniBand signals go bad together that make it the
    switch's fault: the leaf is kept out of new placement as one unit, nothing is drained, and the guard rails do not
    count it. Fewer are judged node by node. Three: two nodes losing a port in the same minute happen (a reseated
    cable bundle), three independent ones under one leaf do not, and three is the first count the default rails
    (two an hour) would refuse node by node."""
    switch_fault_leaf_percent: Annotated[float, Field(gt=0, le=100)] = 50.0
    """Or this share of the leaf's nodes (percent), when that is fewer nodes (a small leaf: half of a four-node leaf
    is two); never fewer than two: one node's bad port is that node's fault."""

    def tunables(self) -> dict[str, Any]:
        """These keys and their values, as the guard's settings take them."""
        return {name: getattr(self, name) for name in GuardTunables.model_fields}


class HealthSettings(_Model, GuardTunables):
    """Everything the guard needs; the defaults are the platform's (see the module docstring)."""

    label_prefix: Annotated[str, Field(pattern=_DNS_SUBDOMAIN)] = DEFAULT_LABEL_PREFIX
    prometheus_url: Annotated[str, Field(pattern=r"^https?://")] = "http://prometheus-operated.monitoring.svc:9090"
    node_selector: str = "gpucluster.io/location=onprem"
    poll_seconds: Annotated[int, Field(gt=0)] = 2
    """How often the signals are queried: a cycle starts every this many seconds (at once after one that took
    longer; one cycle at a time). A cycle costs Prometheus instant queries only (nodes come from a watch), and it
    bounds the time from a fault in Prometheus to its taint (docs/scale.md: the fault storms)."""
    query_concurrency: Annotated[int, Field(ge=1, le=16)] = 4
    """Prometheus queries a cycle sends at once (and the connections it keeps to Prometheus). At 2,048 nodes a
    dozen queries one after the other were a second of each cycle (docs/scale.md)."""
    eviction_namespaces: list[str] = Field(default_factory=lambda: ["training", "inference"])
    """Namespaces whose pods the guard evicts: where its RBAC has a Role. A pod labelled as training or
    inference anywhere else is not the guard's to move, and is left alone."""
    training_namespaces: list[str] = Field(default_factory=lambda: ["training"])
    """Where the gangs run: their Volcano Jobs' retry counts are the restarts application crashes cause."""
    namespace: str = "gpu-system"
    """Where the Lease lives."""
    lease_name: str = APP
    lease_duration_seconds: Annotated[int, Field(gt=0)] = 30
    renew_deadline_seconds: Annotated[float, Field(gt=0)] = 20.0
    """A leader that has not renewed for this long stands down (below the lease duration, so it stops before
    a standby may take over)."""
    retry_period_seconds: Annotated[float, Field(gt=0)] = 5.0
    """How often the lease is renewed, beside the cycle."""
    request_timeout_seconds: Annotated[float, Field(gt=0)] = 10.0
    """Every Kubernetes call gives up after this long; a write starts only if it can finish this long before
    the lease could pass to a standby."""
    watch_timeout_seconds: Annotated[int, Field(gt=0, le=3600)] = 300
    """Nodes and gang jobs come from a watch, restarted this often (a list only when the watch broke)."""
    backoff_base_seconds: Annotated[float, Field(gt=0)] = 1.0
    backoff_max_seconds: Annotated[float, Field(gt=0)] = 60.0
    exporters: dict[str, Exporter] = Field(default_factory=default_exporters)
    signals: tuple[Signal, ...] = Field(default_factory=default_signals)

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        problems: list[str] = []
        names = [s.name for s in self.signals]
        if not names:
            problems.append("signals must list at least one signal")
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            problems.append(f"signal names must be unique, repeated: {', '.join(dupes)}")
        for s in self.signals:
            if s.exporter not in self.exporters:
                problems.append(f"signal {s.name}: exporter {s.exporter!r} is not one of {sorted(self.exporters)}")
        if self.poll_seconds > self.stale_after_seconds:
            problems.append(
                f"poll_seconds ({self.poll_seconds}) must not exceed stale_after_seconds ({self.stale_after_seconds})"
            )
        lease = lease_timing_problem(self.request_timeout_seconds, self.renew_deadline_seconds,
                                     self.lease_duration_seconds)
        if lease:
            problems.append(lease)
        if problems:
            raise ValueError("; ".join(problems))
        return self

    @property
    def names(self) -> Names:
        return Names(self.label_prefix)

    def signal(self, name: str) -> Signal:
        return next(s for s in self.signals if s.name == name)

    @property
    def fabric_signals(self) -> frozenset[str]:
        """The InfiniBand signals (read from the ``ib`` exporter): the ones a leaf switch's fault makes fire."""
        return frozenset(s.name for s in self.signals if s.exporter == IB)


class SettingsError(ValueError):
    """Invalid settings; the message names every offending key and where it came from."""


def parse_settings(raw: Any, source: str = "settings") -> HealthSettings:
    """Settings from parsed JSON; every problem at once, each with its path and ``source``."""
    if not isinstance(raw, Mapping):
        raise SettingsError(f"{source}: settings must be a JSON object, got {type(raw).__name__}")
    try:
        return HealthSettings.model_validate(raw)
    except ValidationError as exc:
        problems = [
            f"{source}: {'.'.join(str(p) for p in err['loc']) or '(top)'}: {err['msg']}" for err in exc.errors()
        ]
        raise SettingsError("; ".join(problems)) from None


def settings_document(settings: HealthSettings) -> str:
    """The ConfigMap file: every key spelled out, sorted for stable diffs (moving a key between models, as the
    stack's section and this contract share ``GuardTunables``, changes nothing deployed)."""
    return json.dumps(settings.model_dump(mode="json"), indent=2, sort_keys=True) + "\n"
