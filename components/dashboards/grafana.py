"""What the GPU fleet and GPU health dashboards share: panel helpers, the pool/node/job variables, the links.

Both dashboards declare the same variables under the same names, so a dashboard link with ``includeVars``
lands on the same pool, node and job, and a data link can set one of them from the series clicked.

Where the variables come from. dcgm-exporter's and the ib-exporter's series carry ``node`` (the
ServiceMonitors' relabelling) but no pool: the node-pool label arrives only on kube-state-metrics'
``kube_node_labels`` (as ``label_<prefix>_pool``) and on the health guard's own series (as ``pool``). So
the pool and node variables read ``kube_node_labels``, and a panel over GPU or port series keeps to the
selected pools by a join on ``node`` (:meth:`Scope.in_pools`). A job is the training pods' job label
(``kube_pod_labels``), chained to the selected nodes through ``kube_pod_info``. kube-state-metrics must
therefore export those labels (``--metric-labels-allowlist``, see docs/observability.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

SCHEMA_VERSION = 39
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
FLEET_UID = "gpucluster-gpu-fleet"
HEALTH_UID = "gpucluster-gpu-health"

TOP = 20
"""Most series a per-GPU or per-port panel draws (``topk``/``bottomk``).

Prod has 2,048 GPUs, each with four NVLink error kinds, and as many HCA ports: Grafana slows down and a
legend of thousands is unreadable. Twenty rows fit the legend and still show every outlier worth a look;
a selected node (8 GPUs, its HCAs) is never cut. In a graph ``topk`` is evaluated per step, so a panel may
show a few more than 20 series over its range, never thousands.
"""

VARIABLES = ("datasource", "pool", "node", "job")


@dataclass(frozen=True)
class Scope:
    """kube-state-metrics' spelling (``label_<key>``) of the stack's node-pool, job, workload and location
    labels, and the stack's GPU pools: "All" pools means these (the system pool is no choice)."""

    pool_label: str = "label_gpucluster_io_pool"
    job_label: str = "label_gpucluster_io_job"
    workload_label: str = "label_gpucluster_io_workload"
    location_label: str = "label_gpucluster_io_location"
    gpu_pools: tuple[str, ...] = ()

    @property
    def all_pools(self) -> str:
        """The regex "All" pools stands for (dots escaped as Grafana escapes its own values); any pool if unknown."""
        return "|".join(p.replace(".", "\\\\.") for p in self.gpu_pools) or ".+"

    def in_pools(self, vector: str) -> str:
        """``vector`` (series with a ``node`` label) kept to the nodes of the selected pools."""
        return f'{vector} * on (node) group_left () group by (node) (kube_node_labels{{{self.pool_label}=~"$pool"}})'

    def training_pods(self) -> str:
        """One series per training pod of the selected jobs (value 1), with its job label."""
        return (f"max by (namespace, pod, {self.job_label}) "
                f'(kube_pod_labels{{{self.workload_label}="training", {self.job_label}=~"$job"}})')

    def variables(self) -> list[dict[str, Any]]:
        """The datasource, then pool, node and job, each narrowed by the ones before it."""
        p, j = self.pool_label, self.job_label
        on_nodes = self.in_pools('kube_pod_info{node=~"$node"}')
        jobs = (f'count by ({j}) (kube_pod_labels{{{self.workload_label}="training", {j}!=""}} '
                f"* on (namespace, pod) group_left () group by (namespace, pod) ({on_nodes}))")
        return [
            {"name": "datasource", "type": "datasource", "query": "prometheus", "label": "Prometheus",
             "current": {}, "hide": 0},
            _query_variable("pool", "Pool", f'label_values(kube_node_labels{{{p}=~"{self.all_pools}"}}, {p})',
                            self.all_pools),
            _query_variable("node", "Node", f'label_values(kube_node_labels{{{p}=~"$pool"}}, node)', ".*"),
            _query_variable("job", "Job", f"query_result({jobs})", ".*", regex=f'/{j}="([^"]+)"/'),
        ]


def _query_variable(name: str, label: str, query: str, all_value: str, regex: str = "") -> dict[str, Any]:
    """A multi-value Prometheus query variable with "All", refreshed with the time range (nodes and jobs
    come and go)."""
    return {
        "name": name, "label": label, "type": "query", "datasource": DATASOURCE,
        "definition": query, "query": query, "regex": regex,
        "refresh": 2, "sort": 1, "multi": True, "includeAll": True, "allValue": all_value,
        "current": {"selected": True, "text": ["All"], "value": ["$__all"]}, "options": [], "hide": 0,
    }


def dashboard_link(uid: str, title: str) -> dict[str, Any]:
    """A dashboard link by uid that carries the variables and the time range over."""
    return {"title": title, "type": "link", "url": f"/d/{uid}", "icon": "dashboard", "tooltip": "",
            "tags": [], "asDropdown": False, "targetBlank": False, "includeVars": True, "keepTime": True}


def data_link(title: str, uid: str, **from_series: str) -> dict[str, Any]:
    """A data link to dashboard ``uid``: the variables named in ``from_series`` set from the series clicked
    (``node="node"``: ``var-node`` = the series' ``node`` label), the others and the time range kept."""
    params = [f"var-{var}=${{__field.labels.{label}}}" for var, label in from_series.items()]
    params += [f"${{{var}:queryparam}}" for var in VARIABLES if var not in from_series]
    return {"title": title, "url": f"/d/{uid}?" + "&".join([*params, "${__url_time_range}"]), "targetBlank": False}


def target(expr: str, legend: str, ref: str, instant: bool = False) -> dict[str, Any]:
    return {"datasource": DATASOURCE, "expr": expr, "legendFormat": legend, "refId": ref,
            "instant": instant, "range": not instant}


def panel(
    pid: int,
    title: str,
    description: str,
    targets: list[dict[str, Any]],
    grid: tuple[int, int, int, int],
    unit: str,
    thresholds: list[dict[str, Any]] | None = None,
    threshold_line: bool = False,
    kind: str = "timeseries",
    links: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    x, y, w, h = grid
    defaults: dict[str, Any] = {"unit": unit}
    if thresholds is not None:
        defaults["thresholds"] = {"mode": "absolute", "steps": thresholds}
    if threshold_line:
        defaults["custom"] = {"thresholdsStyle": {"mode": "line+area"}}
    if links:
        defaults["links"] = links
    options: dict[str, Any] = {}
    if kind == "timeseries":
        options = {"legend": {"displayMode": "table", "placement": "right", "calcs": ["max", "lastNotNull"]}}
    elif kind == "bargauge":
        options = {"orientation": "horizontal", "displayMode": "gradient", "showUnfilled": True,
                   "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False}}
    return {
        "id": pid,
        "type": kind,
        "title": title,
        "description": description,
        "datasource": DATASOURCE,
        "gridPos": {"x": x, "y": y, "w": w, "h": h},
        "fieldConfig": {"defaults": defaults, "overrides": []},
        "options": options,
        "targets": targets,
    }
