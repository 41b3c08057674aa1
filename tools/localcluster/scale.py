"""Production-sized shapes of the local control plane (pure): which stack, which pools, which tuning.

A shape is a stack file (``Pulumi.<stack>.yaml``) with its pools and system pool optionally resized, so
the kwok nodes carry exactly the names, labels, capacity and taints the stack's pools declare (the node-pool
agent adds only its record), and the objects applied onto it are the stack's own
(``tools.localcluster.scalerun``). Three shapes:

- ``small``: the prod stack's two pools cut to 32 nodes each (one leaf switch each); the same code path
  ``make test`` runs;
- ``prod``: ``Pulumi.prod.yaml`` as it is (256 GPU nodes, 12 system nodes);
- ``llama3``: 2,048 nodes x 8 GPUs in one pool (16,384 GPUs, Llama 3's training size).

Every pool has a fabric as the prod stack declares its own (:func:`fabric`): gangs are placed by it, and the
switch storm fails one leaf.

The tuning is what an operator of a cluster that size sets on the control plane; each entry says why.
The settings the production stack must carry too (Volcano's client rates) are stack keys
(``scheduling.volcano``); the ones here are the local control plane's stand-ins for a managed control plane.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tools.localcluster.plan import NodePlan, plan_from_config, stack_config_values


@dataclass(frozen=True)
class Shape:
    """A stack at a size: ``pools`` (``None`` keeps the stack's) and ``system_nodes`` replace its own."""

    name: str
    description: str
    stack: str = "prod"
    pools: tuple[Mapping[str, Any], ...] | None = None
    system_nodes: int | None = None
    #: Gang sizes (pods of 8 GPUs) the bench submits on this shape; each fits the largest pool.
    gang_sizes: tuple[int, ...] = ()
    #: Fault counts of the storms (NVSentinel's 150 and 375 where the shape has the nodes).
    storm_faults: tuple[int, ...] = ()
    #: Gang sizes crashed by a fatal fault on one of their nodes; each leaves its pool a node to restart without it.
    crash_sizes: tuple[int, ...] = ()
    #: The burst run with the local stack's holds and timeouts (:func:`quick_burst`) instead of the stack's own:
    #: the same path in seconds, not the prod stack's quarter-hour close hold.
    quick_burst: bool = False
    #: The handover's clearing for the burst run (``burst.handover.clearAfterSeconds``); None: the stack's.
    clear_after_s: float | None = None


#: The timing keys a short burst run takes from the local stack, per section.
QUICK_KEYS: dict[str, tuple[str, ...]] = {
    "burst": ("openHoldSeconds", "closeHoldSeconds", "pendingGraceSeconds", "handover"),
    "descheduler": ("minPodAgeSeconds",),
}


def quick_burst(root: Path) -> dict[str, dict[str, Any]]:
    """The local stack's burst and descheduler timings (``Pulumi.local.yaml``, read, not restated), for a burst
    run that must be short."""
    local = stack_config_values(root / "Pulumi.local.yaml")
    return {section: {k: local[section][k] for k in keys if k in (local.get(section) or {})}
            for section, keys in QUICK_KEYS.items()}


#: The shapes' fabric, as the prod stack declares its own: leaves of 32 nodes, two leaves under each spine.
LEAF_NODES = 32
LEAVES_PER_SPINE = 2


def fabric(prefix: str, count: int, width: int) -> dict[str, Any]:
    """A pool's ``topology``: its nodes in leaves of :data:`LEAF_NODES` (the last may be short), leaves paired under
    spines; switch names carry the pool's prefix (HyperNodes are cluster-wide)."""
    leaves = [{"name": f"{prefix}-leaf-{i + 1:02d}",
               "nodes": [f"{prefix}-[{first:0{width}d}-{min(first + LEAF_NODES - 1, count):0{width}d}]"]}
              for i, first in enumerate(range(1, count + 1, LEAF_NODES))]
    spines = [{"name": f"{prefix}-spine-{j // LEAVES_PER_SPINE + 1:02d}",
               "leaves": [leaf["name"] for leaf in leaves[j:j + LEAVES_PER_SPINE]]}
              for j in range(0, len(leaves), LEAVES_PER_SPINE)]
    return {"leaves": leaves, "spines": spines}


def _pool(name: str, prefix: str, count: int, model: str) -> dict[str, Any]:
    width = max(3, len(str(count)))
    return {"name": name, "nodes": [f"{prefix}-[{1:0{width}d}-{count:0{width}d}]"], "gpuModel": model,
            "gpusPerNode": 8, "topology": fabric(prefix, count, width)}


SHAPES: dict[str, Shape] = {
    "small": Shape(
        "small", "the prod stack cut to 2 pools x 32 nodes (512 GPUs): the path `make test` runs",
        pools=(_pool("h100-a", "gpu-a", 32, "H100-SXM5-80GB"), _pool("h200-b", "gpu-b", 32, "H200-SXM5-141GB")),
        system_nodes=2, gang_sizes=(16, 32), storm_faults=(8,), crash_sizes=(16,), quick_burst=True),
    "prod": Shape("prod", "Pulumi.prod.yaml as declared: 256 GPU nodes in 2 pools + 12 system nodes (2,048 GPUs)",
                  gang_sizes=(64, 128), storm_faults=(25,), crash_sizes=(64,)),
    "llama3": Shape(
        "llama3", "2,048 nodes x 8 GPUs in one pool (16,384 GPUs) + 12 system nodes",
        pools=(_pool("h100-a", "gpu-a", 2048, "H100-SXM5-80GB"),), system_nodes=12,
        gang_sizes=(256, 512, 1024, 2048), storm_faults=(150, 375),
        # 2,040, not 2,048: a gang as large as its pool cannot restart once a node is out (no spare in the pool).
        crash_sizes=(256, 1024, 2040)),
}


def shape(name: str) -> Shape:
    try:
        return SHAPES[name]
    except KeyError:
        raise ValueError(f"unknown scale shape {name!r}; known: {', '.join(SHAPES)}") from None


def shape_values(sh: Shape, root: Path) -> dict[str, Any]:
    """The stack file's values (without the project prefix) with the shape's pools and system pool.

    A resized stack keeps its proportions: each team's guaranteed and capability GPUs, each service's maxReplicas
    (not below its minReplicas) and each provider's GPUs scale with the on-prem GPUs, except that the first team
    may use every GPU (a gang of the whole cluster is Llama 3's run, and a team
    is required on a stack with teams); its example jobs are dropped (the bench submits its own gangs). Restart in
    place is off (kwok runs no processes) and the pools keep no warm spares (the gangs take whole pools).
    """
    values = copy.deepcopy(stack_config_values(root / f"Pulumi.{sh.stack}.yaml"))  # secrets stay with the engine
    if sh.pools is not None:
        before = _gpus(values.get("pools") or ())
        values["pools"] = [dict(p) for p in sh.pools]
        ratio = _gpus(values["pools"]) / before if before else 1.0
        scheduling = dict(values.get("scheduling") or {})
        teams = [dict(t) for t in scheduling.get("teams") or ()]
        for team in teams:
            for key in ("guaranteeGpus", "capabilityGpus"):
                if key in team:
                    team[key] = max(1, int(team[key] * ratio))
        if teams:
            teams[0].pop("capabilityGpus", None)
            scheduling["teams"] = teams
            values["scheduling"] = scheduling
        training = dict(values.get("training") or {})
        training["jobs"] = []
        values["training"] = training
        inference = dict(values.get("inference") or {})
        inference["services"] = [{**dict(svc), "maxReplicas": max(int(svc.get("minReplicas", 1)),
                                                                   int(svc.get("maxReplicas", 1) * ratio))}
                                 for svc in inference.get("services") or ()]
        values["inference"] = inference
        values["providers"] = [{**dict(prov), "gpus": max(8, int(prov.get("gpus", 8) * ratio))}
                               for prov in values.get("providers") or ()]
    # kwok nodes run no processes, so nothing could restart in place: the bench's gangs take Volcano's paths
    # (an evicted pod restarts the whole gang), which is what the crash runs time (the whole-gang restart terms).
    training = dict(values.get("training") or {})
    training["restartInPlace"] = {**dict(training.get("restartInPlace") or {}), "enabled": False}
    values["training"] = training
    # The gangs measured here take whole pools (bind time against gang size): no node is held back as a warm spare.
    values["pools"] = [{**dict(p), "spareNodes": 0} for p in values.get("pools") or ()]
    if sh.quick_burst:
        for key, quick in quick_burst(root).items():
            section = dict(values.get(key) or {})
            for k, v in quick.items():
                section[k] = {**dict(section.get(k) or {}), **v} if isinstance(v, dict) else v
            values[key] = section
    if sh.clear_after_s is not None:
        burst = dict(values.get("burst") or {})
        burst["handover"] = {**dict(burst.get("handover") or {}), "clearAfterSeconds": sh.clear_after_s}
        values["burst"] = burst
    if sh.system_nodes is not None:
        system = dict(values.get("systemPool") or {"name": "system"})
        system["nodes"] = [f"cpu-sys-[01-{sh.system_nodes:02d}]"]
        values["systemPool"] = system
    return values


def _gpus(pools: Sequence[Mapping[str, Any]]) -> int:
    from components.config import expand_node_names

    return sum(len(expand_node_names(p.get("nodes") or ())) * int(p.get("gpusPerNode", 8)) for p in pools)


def gang_team(sh: Shape, root: Path) -> str | None:
    """The team the bench's gangs are submitted for: the stack's first (None on a stack without teams)."""
    teams = (shape_values(sh, root).get("scheduling") or {}).get("teams") or []
    return str(teams[0]["name"]) if teams else None


def gang_pool(sh: Shape, root: Path) -> str:
    """The pool the bench's gangs, crashes and switch storm use: the shape's largest (the first of equals)."""
    pools = shape_values(sh, root)["pools"]
    from components.config import expand_node_names

    return str(max(pools, key=lambda p: len(expand_node_names(p.get("nodes") or ())))["name"])


def shape_config(sh: Shape, root: Path) -> Any:
    """The shape's validated ``ClusterConfig`` (cluster-shape keys only, as ``plan.load_stack_config`` reads)."""
    from components.config import ClusterConfig

    fields = {f.alias or n for n, f in ClusterConfig.model_fields.items()} | set(ClusterConfig.model_fields)
    return ClusterConfig.model_validate({k: v for k, v in shape_values(sh, root).items() if k in fields})


def shape_plan(sh: Shape, root: Path) -> NodePlan:
    return plan_from_config(shape_config(sh, root), source=f"scale shape {sh.name} (Pulumi.{sh.stack}.yaml)")


# --------------------------------------------------------------------------- control-plane tuning


@dataclass(frozen=True)
class Setting:
    """One flag of one component, and why a cluster of that size needs it."""

    component: str
    flag: str
    value: str
    why: str

    @property
    def arg(self) -> str:
        return f"{self.flag}={self.value}"


@dataclass(frozen=True)
class Tuning:
    settings: tuple[Setting, ...] = field(default_factory=tuple)
    #: Log every request's user agent (plan.audit_policy), so the bench counts each agent's requests.
    audit_everyone: bool = True
    #: kwok's ``options`` (a KwokConfiguration): its worker counts have no flags.
    kwok_options: Mapping[str, int] = field(default_factory=dict)

    def kwok_config(self) -> str:
        """The KwokConfiguration document for ``kwok_options`` (kwok's wrapper keeps its default stages)."""
        import yaml

        return yaml.safe_dump({"apiVersion": "config.kwok.x-k8s.io/v1alpha1", "kind": "KwokConfiguration",
                               "options": dict(self.kwok_options)}, sort_keys=False)

    def flags(self, component: str) -> list[str]:
        return [s.arg for s in self.settings if s.component == component]

    def apply(self, commands: Mapping[str, Sequence[str]]) -> dict[str, list[str]]:
        """``commands`` with each component's flags set: a flag already there is replaced, not repeated."""
        out: dict[str, list[str]] = {}
        for name, argv in commands.items():
            mine = {s.flag: s.arg for s in self.settings if s.component == name}
            kept = [a for a in argv if a.split("=", 1)[0] not in mine]
            out[name] = kept + list(mine.values())
        unknown = sorted({s.component for s in self.settings} - set(commands))
        if unknown:
            raise ValueError(f"tuning names components the control plane does not run: {', '.join(unknown)}")
        return out


def tuning_for(nodes: int) -> Tuning:
    """The control plane's settings for ``nodes`` kwok nodes (the stock settings below 100 nodes)."""
    if nodes < 100:
        return Tuning(())
    big = nodes > 1000
    return Tuning((
        Setting("kube-apiserver", "--max-requests-inflight", "1600" if big else "800",
                "API Priority and Fairness shares the sum of both limits among its levels; the stock 400+200 "
                "leaves the workload-low level a few seats while thousands of node leases renew"),
        Setting("kube-apiserver", "--max-mutating-requests-inflight", "800" if big else "400",
                "a gang's pod creates, binds and status writes are mutating: thousands in a few seconds"),
        Setting("kube-controller-manager", "--kube-api-qps", "200",
                "the stock 20/s paces DaemonSet pods (one per GPU node), garbage collection of a deleted "
                "gang's pods and taint-based evictions"),
        Setting("kube-controller-manager", "--kube-api-burst", "400", "see --kube-api-qps"),
        Setting("kwok", "--v", "WARN", "kwok logs every lease renewal and pod patch at INFO: ~200 lines/s at 2,048 "
                "nodes, CPU this machine's API server needs"),
    ), kwok_options={
        # kwok has no client-side rate limit; its 4 workers per kind are the pace: 2,048 lease renewals every
        # 10 s leave each lease worker 20 ms. Pods stay at kwok's 4 workers: with 32, two workers patched one pod
        # with two IPs ("may specify no more than one IP for each IP family", 1,460 refusals for a 2,048-pod
        # gang), each refusal retried after kwok's exponential backoff. A configuration file sets every option:
        # one left out is 0, not kwok's default (kwok refuses to start with no pod workers).
        "podPlayStageParallelism": 4, "nodePlayStageParallelism": 16, "nodeLeaseParallelism": 16,
        "podsOnNodeSyncParallelism": 8,
    })
