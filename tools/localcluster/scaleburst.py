"""Burst at scale (issue 47, item 6): the stack's inference services at maxReplicas on a scale shape, a gang that
takes a whole pool while other training leaves on-prem short, the handover onto the providers' virtual nodes, the
gang's end and the descheduler bringing the replicas home; each phase timed as the local e2e times it
(``bench.bench_sim_vs_e2e.PhaseView``), beside the simulator's prediction for the same shape and settings.

What stands in: the providers' virtual nodes are kwok nodes with the labels, capacity and taint their virtual
kubelets register (no provider's cloud runs here; the real virtual kubelet's start is timed by ``make e2e``), and
every pod starts in about a second. The burst controller, the descheduler and Volcano are the real ones.

The plan (how large the other training is, which team submits what) is pure: :func:`burst_plan`.
"""

from __future__ import annotations

import copy
import json
import math
import re
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from agents.node_taints import reserved_taint_key
from bench.bench_sim_vs_e2e import AFTER_END, LOCAL_LATENCIES, PHASES, UNGATE, PhaseClock, PhaseView, Scenario
from tools.localcluster import control
from tools.localcluster.plan import Layout, NodePlan
from tools.localcluster.scalejobs import (
    apply_objects,
    audit_events,
    cancel,
    published_settings,
    say,
    submit,
    wait,
    watching,
)

#: How long the gang trains before the run ends it (the simulator's ``Scenario.run_s`` is the same).
RUN_S = 120.0
#: The sampler's period (seconds): every phase is at most this late.
SAMPLE_S = 1.0
#: How long a released gang may take to run, beyond the handover's wait before it clears the pool
#: (``handover.clearAfterSeconds``), before the run names what holds it (seconds): the clearing evicts through the
#: PDBs, one replica per service at a time.
STALL_S = 600.0
#: How much longer than the simulator's prediction (plus two minutes) the return may take before the run names what
#: holds it: the descheduler's return is PDB-bound, one replica per service per cycle, which the simulator models.
RETURN_SLACK = 1.2
#: The other training's job (a researcher's, through the CLI).
BACKGROUND = "scale-burst-other"
#: The image the scenario's jobs name (kwok runs no container).
BENCH_IMAGE = "registry.gpucluster.io/train/bench:1.0"


@dataclass(frozen=True)
class BurstPlan:
    """The scenario on a shape: the gang takes ``pool`` whole (``gang_pods`` pods), after ``background_pods`` pods
    of other training took part of ``background_pool``, so that on-prem lacks ``displaced_gpus`` for inference.

    The gang is the platform's own job (the stack's template, the training queue, which deserves every GPU of
    its pool and so reclaims inference): a team's gang reclaims only up to the team's guarantee (docs/scheduling.md),
    and above it runs on spare GPUs only. The other training is a researcher's, through the CLI, on spare GPUs."""

    pool: str
    gang_pods: int
    background_pool: str | None
    background_pods: int
    background_team: str | None
    inference_gpus: int
    external_gpus: int
    displaced_gpus: int


def _team(gpus: int, teams: Sequence[Any]) -> str | None:
    """The first team whose capability (the CLI's quota) holds ``gpus``; None on a stack without teams."""
    if not teams:
        return None
    for team in teams:
        if team.capability_gpus is None or gpus <= team.capability_gpus:
            return str(team.name)
    raise ValueError(f"no team's capabilityGpus leaves room for a gang of {gpus} GPUs")


def burst_plan(cfg: Any, pool: str) -> BurstPlan:
    """Size the other training so that, once the gang holds ``pool``, on-prem lacks room for half of what the
    providers hold (or all of inference, if less): the burst must open, and every displaced replica fits outside.
    A shape whose gang takes every on-prem GPU needs no other training."""
    services = cfg.inference.services
    inference = sum(s.max_replicas * s.gpus_per_replica for s in services)
    external = sum(p.gpus for p in cfg.providers)
    onprem = cfg.onprem_gpus
    gang = cfg.pool(pool)
    want = min(inference, external // 2)
    others = [p for p in cfg.pools if p.name != pool]
    background_pool = max(others, key=lambda p: p.gpu_count).name if others else None
    background = 0
    if background_pool is not None:
        other = cfg.pool(background_pool)
        gpus = max(0, min(other.gpu_count, onprem - gang.gpu_count - inference + want))
        background = math.ceil(gpus / other.gpus_per_node)
    free_after = onprem - gang.gpu_count - (background * cfg.pool(background_pool).gpus_per_node
                                            if background_pool else 0)
    teams = tuple(cfg.scheduling.teams)
    background_team = (_team(background * cfg.pool(background_pool).gpus_per_node, teams)
                       if background_pool and background else None)
    return BurstPlan(pool=pool, gang_pods=len(gang.node_names), background_pool=background_pool,
                     background_pods=background, background_team=background_team, inference_gpus=inference,
                     external_gpus=external, displaced_gpus=max(0, inference - free_after))


def scenario(plan: BurstPlan) -> Scenario:
    """The same scenario for the simulator: its other training arrives first and stays."""
    from bench.sim.workload import Gang

    background = (Gang(0.0, plan.background_pods, 10.0 ** 9, plan.background_pool),) \
        if plan.background_pool and plan.background_pods else ()
    return Scenario(pool=plan.pool, demand="max", background=background, run_s=RUN_S, after_s=7200.0,
                    chained=False)


# --------------------------------------------------------------------------- what the cluster shows


def view(pods: Sequence[Mapping[str, Any]], standby_asked: Mapping[str, int], taints: tuple[str | None, ...],
         services: Mapping[str, int], prefix: str, pool_nodes: set[str], virtual: set[str], gang_ungated: bool,
         gang_running: bool) -> PhaseView:
    """The phases' view of one sample: the inference pods (API JSON), each standby's asked replicas, the burst
    taint's effect on each virtual node, and the gang's state."""
    ready: dict[str, int] = dict.fromkeys(services, 0)
    in_pool, external = dict(ready), dict(ready)
    sb_ready, sb_live = dict(ready), dict(ready)
    for pod in pods:
        meta, spec, status = pod.get("metadata") or {}, pod.get("spec") or {}, pod.get("status") or {}
        labels = meta.get("labels") or {}
        svc = str(labels.get(f"{prefix}/service") or "")
        if svc not in services or meta.get("deletionTimestamp"):
            continue
        is_ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or ())
        node = spec.get("nodeName")
        if labels.get(f"{prefix}/role") == "standby":
            sb_live[svc] += 1
            sb_ready[svc] += is_ready
            continue
        if labels.get(f"{prefix}/role"):
            continue
        if is_ready:
            ready[svc] += 1
            in_pool[svc] += node in pool_nodes
            external[svc] += node in virtual
    return PhaseView(wanted=services, ready=ready, ready_in_pool=in_pool, ready_external=external,
                     standby_asked=standby_asked, standby_ready=sb_ready, standby_live=sb_live, taints=taints,
                     gang_ungated=gang_ungated, gang_running=gang_running)


def burst_effect(node: Mapping[str, Any], key: str) -> str | None:
    """The burst taint's effect on a node (API JSON); None without it."""
    return next((t.get("effect") for t in (node.get("spec") or {}).get("taints") or () if t.get("key") == key), None)


# --------------------------------------------------------------------------- the run


def register_virtual_nodes(lay: Layout, plan: NodePlan, patches: Sequence[Mapping[str, Any]]) -> list[str]:
    """The providers' virtual nodes as kwok nodes (what their virtual kubelets register), then the stack's node
    patches for them (as on the real nodes)."""
    from kubernetes import client

    api: Any = client.CoreV1Api(control.api_client(lay))
    names = [n.name for n in plan.by_kind("virtual")]
    existing = {n.metadata.name for n in api.list_node().items}
    for node in plan.by_kind("virtual"):
        if node.name not in existing:
            # Closed, as a cluster at rest keeps them: registered bare, the controller would read them as open and
            # close them only after its close hold (a quarter of an hour on the prod stack).
            manifest = node.manifest(plan.gpu_resource)
            manifest["spec"]["taints"].append({"key": f"{plan.label_prefix}/burst", "effect": "NoSchedule"})
            api.create_node(manifest)
    apply_objects(lay, [p for p in patches if p["kind"] == "Node" and p["metadata"]["name"] in names])
    return names


def inference_at_max(objects: Sequence[Mapping[str, Any]], cfg: Any) -> list[dict[str, Any]]:
    """The inference namespace's Deployments, each service's main one at its maxReplicas (its HPA's ceiling; the
    standbys stay as the stack renders them, at zero, for the burst controller to scale)."""
    maxima = {s.name: s.max_replicas for s in cfg.inference.services}
    out: list[dict[str, Any]] = []
    for obj in objects:
        meta = obj.get("metadata") or {}
        if obj["kind"] != "Deployment" or meta.get("namespace") != cfg.inference_namespace:
            continue
        dep = copy.deepcopy(dict(obj))
        if meta.get("name") in maxima:
            dep["spec"]["replicas"] = maxima[meta["name"]]
        out.append(dep)
    return out


class Sampler(threading.Thread):
    """Every :data:`SAMPLE_S`: the inference pods, the standbys, the virtual nodes' taints and the gang, as a
    :class:`PhaseView` into a :class:`PhaseClock`; also the fewest ready replicas of each service and every burst
    taint effect seen."""

    def __init__(self, lay: Layout, cfg: Any, plan: BurstPlan, virtual: list[str], times: Any, gang_pods: int
                 ) -> None:
        super().__init__(daemon=True)
        from kubernetes import client

        api = control.api_client(lay)
        self.core, self.apps = client.CoreV1Api(api), client.AppsV1Api(api)
        self.cfg, self.virtual, self.times, self.gang_pods = cfg, virtual, times, gang_pods
        self.services = {s.name: s.max_replicas for s in cfg.inference.services}
        self.pool_nodes = set(cfg.pool(plan.pool).node_names)
        self.clock = PhaseClock(chained=False)
        self.started = time.monotonic()
        self.ended: float | None = None
        self.stop = threading.Event()
        self.fewest: dict[str, int] = {}
        self.effects: set[str] = set()
        self.most_external = 0
        self.errors: list[str] = []
        self.samples = 0

    def _json(self, call: Any, *args: Any, **kwargs: Any) -> Any:
        return json.loads(call(*args, _preload_content=False, **kwargs).data)

    def sample(self) -> PhaseView:
        ns, prefix = self.cfg.inference_namespace, self.cfg.label_prefix
        pods = self._json(self.core.list_namespaced_pod, ns, resource_version="0")["items"]
        deps = self._json(self.apps.list_namespaced_deployment, ns, resource_version="0")["items"]
        asked = {d["metadata"]["name"].removesuffix("-standby"): int(d["spec"].get("replicas") or 0)
                 for d in deps if d["metadata"]["name"].endswith("-standby")}
        taints = tuple(burst_effect(self._json(self.core.read_node, n), f"{prefix}/burst") for n in self.virtual)
        return view(pods, asked, taints, self.services, prefix, self.pool_nodes, set(self.virtual),
                    gang_ungated=sum(p.ungated is not None for p in self.times.pods.values()) >= self.gang_pods,
                    gang_running=self.times.running() >= self.gang_pods)

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                v = self.sample()
                now = time.monotonic()
                self.clock.see(now - self.started, v, None if self.ended is None else now - self.ended)
                for svc, n in v.ready.items():
                    self.fewest[svc] = min(self.fewest.get(svc, n), n)
                self.effects |= {t for t in v.taints if t}
                self.most_external = max(self.most_external, sum(v.ready_external.values()))
                self.samples += 1
            except Exception as err:  # keep sampling through API hiccups; reported with the figures
                self.errors.append(repr(err))
            self.stop.wait(SAMPLE_S)


def occupancy(pods: Sequence[Mapping[str, Any]], pool_nodes: Sequence[str]) -> tuple[list[str], list[str]]:
    """(nodes of the pool no pod is bound to, nodes some live pod is bound to), each sorted."""
    used = {(p.get("spec") or {}).get("nodeName") for p in pods
            if not (p.get("metadata") or {}).get("deletionTimestamp")
            and (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")}
    return sorted(n for n in pool_nodes if n not in used), sorted(n for n in pool_nodes if n in used)


#: Why a released gang that needs both empty and occupied nodes of its pool never starts (Volcano 1.14.1).
RECLAIM_STALL = ("Volcano's reclaim places a task only on a node with pods it may reclaim and commits only a "
                 "job whose every task it placed, and allocate discards a gang it cannot place whole: a gang that "
                 "needs both empty nodes and nodes inference holds is placed by neither")


def stall(core: Any, cfg: Any, pool: str, pods: int, waited_s: float) -> dict[str, Any]:
    """What holds a gang that was released and has not run for ``waited_s``: its pool's empty and occupied
    nodes, how many of them the handover reserved for it, and the reason where it is the reclaim stall
    (:data:`RECLAIM_STALL`)."""
    items = json.loads(core.list_pod_for_all_namespaces(resource_version="0", _preload_content=False).data)["items"]
    names = cfg.pool(pool).node_names
    empty, occupied = occupancy(items, names)  # the waiting gang's pods are bound nowhere
    key = reserved_taint_key(cfg.label_prefix)
    reserved = sum(any(t.key == key for t in (n.spec.taints or ())) for n in core.list_node().items
                   if n.metadata.name in names)
    mixed = 0 < len(empty) < pods and bool(occupied)
    reason = (f"the gang of {pods} over {pool} did not run within {waited_s:.0f}s of its release: {len(empty)} "
              f"nodes of the pool empty, {len(occupied)} holding other pods, {reserved} reserved for it; "
              + (RECLAIM_STALL if mixed else "not the reclaim stall (see the scheduler's log)"))
    return {"after_s": waited_s, "empty_nodes": len(empty), "occupied_nodes": len(occupied),
            "reserved_nodes": reserved, "reclaim_stall": mixed, "reason": reason}


def blocked_return(core: Any, policy: Any, cfg: Any) -> dict[str, Any]:
    """What holds replicas outside after the burst closed: per service, the main replicas still on virtual nodes,
    the standby asked for, ready and waiting for room, and what its PDB allows now. A standby with unplaced pods is
    named apart: its PDB counts them as expected and allows no disruption, so the descheduler moves nothing home (the
    controller cuts such a standby to what was placed once the scheduler says "no room", docs/burst.md; this names
    it if that ever fails)."""
    ns, prefix = cfg.inference_namespace, cfg.label_prefix
    pods = json.loads(core.list_namespaced_pod(ns, _preload_content=False).data)["items"]
    virtual = {p.node_name for p in cfg.providers}
    allowed = {(b.metadata.labels or {}).get(f"{prefix}/service", b.metadata.name): b.status.disruptions_allowed
               for b in policy.list_namespaced_pod_disruption_budget(ns).items}
    services: dict[str, dict[str, int]] = {}
    for svc in cfg.inference.services:
        mine = [p for p in pods if ((p["metadata"].get("labels") or {}).get(f"{prefix}/service") == svc.name
                                    and not p["metadata"].get("deletionTimestamp"))]
        role = [(p["metadata"].get("labels") or {}).get(f"{prefix}/role") for p in mine]
        services[svc.name] = {
            "outside": sum(r is None and p["spec"].get("nodeName") in virtual for p, r in zip(mine, role, strict=True)),
            "standby": sum(r == "standby" for r in role),
            "standby_unplaced": sum(r == "standby" and not p["spec"].get("nodeName")
                                    for p, r in zip(mine, role, strict=True)),
            "pdb_disruptions_allowed": -1 if (room := allowed.get(svc.name)) is None else int(room),
        }
    held = [name for name, s in services.items() if s["outside"] and s["pdb_disruptions_allowed"] == 0]
    pdb_deadlock = any(services[n]["standby_unplaced"] for n in held)
    reason = ", ".join(f"{n}: {s['outside']} outside, standby {s['standby']} ({s['standby_unplaced']} with no room), "
                       f"PDB allows {s['pdb_disruptions_allowed']}" for n, s in services.items() if s["outside"])
    if pdb_deadlock:
        reason += ("; the standby the providers cannot hold whole keeps pods pending, its PDB counts them as "
                   "expected and allows no disruption, so the descheduler moves nothing home")
    return {"services": services, "pdb_deadlock": pdb_deadlock, "reason": reason or "nothing outside"}


def create_platform_job(lay: Layout, cfg: Any, name: str, pool: str, pods: int) -> None:
    """A Volcano Job of ``pods`` 8-GPU workers over ``pool`` from the stack's own template (its training queue,
    its handover gate), as the stack's own jobs are created."""
    from dataclasses import replace as replaced

    from kubernetes import client

    from components.config import TrainingJob
    from components.training_job import TrainingJobArgs, volcano_job_spec

    job = TrainingJob.model_validate({"name": name, "image": BENCH_IMAGE, "pool": pool, "workers": pods,
                                      "gpusPerWorker": cfg.pool(pool).gpus_per_node, "command": ["python", "train.py"]})
    # kwok runs no processes, so nothing restarts in place (as the shape's own setting says).
    spec = volcano_job_spec(replaced(TrainingJobArgs.from_config(cfg, job), restart_in_place=None))
    client.CustomObjectsApi(control.api_client(lay)).create_namespaced_custom_object(
        "batch.volcano.sh", "v1alpha1", cfg.training_namespace, "jobs",
        {"apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job",
         "metadata": {"name": name, "namespace": cfg.training_namespace}, "spec": spec})


def delete_platform_job(lay: Layout, cfg: Any, name: str) -> None:
    from kubernetes import client

    client.CustomObjectsApi(control.api_client(lay)).delete_namespaced_custom_object(
        "batch.volcano.sh", "v1alpha1", cfg.training_namespace, "jobs", name)


def evictions_by(events: Iterable[Mapping[str, Any]], agent: str) -> dict[str, int]:
    """An agent's evictions (the Eviction API) from audit events: answered by code (``"201"``: done; ``"429"``: a PDB
    refused it for now)."""
    from tools.localcluster.scalemeasure import agent_of

    out: dict[str, int] = {}
    for event in events:
        ref, user = event.get("objectRef"), event.get("user")
        ref, user = (ref if isinstance(ref, Mapping) else {}), (user if isinstance(user, Mapping) else {})
        if event.get("stage") != "ResponseComplete" or event.get("verb") != "create" \
                or ref.get("subresource") != "eviction":
            continue
        if agent_of(event.get("userAgent"), user.get("username")) != agent:
            continue
        code = str((event.get("responseStatus") or {}).get("code", "?"))
        out[code] = out.get(code, 0) + 1
    return out


def evictions_per_cycle(log: str) -> list[int]:
    """The descheduler's evictions in each of its cycles, from its log."""
    return [int(m) for m in re.findall(r'"Number of evictions[^"]*"[^\n]*?totalEvicted=(\d+)', log)]


def burst_run(lay: Layout, plan_nodes: NodePlan, cfg: Any, objects: Sequence[Mapping[str, Any]],
              pool: str, spec_dir: Path, timeout: float) -> dict[str, Any]:
    """The scenario on the running shape; the phases, the simulator's for the same shape beside them, and what held
    throughout (ready replicas never under minReplicas, the burst taint never NoExecute, the descheduler's
    per-cycle limit)."""
    from kubernetes import client

    from gpucluster_cli.render import worker_selector

    plan = burst_plan(cfg, pool)
    virtual = register_virtual_nodes(lay, plan_nodes, objects)
    apps: Any = client.AppsV1Api(control.api_client(lay))
    namespace = cfg.training_namespace
    settings = published_settings(lay, namespace)
    if plan.background_pods:
        # The other training first, running before inference comes: the replicas then settle around it, as in a
        # busy cluster (applied together, inference took its nodes and the gang, above its team's guarantee, could
        # not reclaim them).
        core: Any = client.CoreV1Api(control.api_client(lay))
        other = worker_selector(settings, BACKGROUND)
        submit(lay, namespace, BACKGROUND, plan.background_pods, str(plan.background_pool), spec_dir,
               plan.background_team)
        wait(f"the {plan.background_pods} pods of {BACKGROUND} Running", lambda: sum(
            p.status.phase == "Running" for p in core.list_namespaced_pod(settings.training_namespace,
                                                                          label_selector=other).items)
             >= plan.background_pods, timeout)
    deployments = inference_at_max(objects, cfg)
    apply_objects(lay, deployments)
    maxima = {s.name: s.max_replicas for s in cfg.inference.services}

    def settled() -> bool:
        deps = {d.metadata.name: d for d in apps.list_namespaced_deployment(cfg.inference_namespace).items}
        return all(n in deps and (deps[n].status.ready_replicas or 0) >= m for n, m in maxima.items())

    settle_s = wait(f"every inference service at maxReplicas, ready ({sum(maxima.values())} replicas)", settled,
                    timeout)
    say(f"burst: {sum(maxima.values())} inference replicas ready in {settle_s:.1f}s; the gang takes {pool} "
        f"({plan.gang_pods} pods), on-prem lacks {plan.displaced_gpus} GPUs for inference")
    name = "scale-burst"
    simulated = simulate(cfg, plan)
    core_api: Any = client.CoreV1Api(control.api_client(lay))
    stalled: dict[str, Any] | None = None
    return_blocked: dict[str, Any] | None = None
    log = lay.logs / "descheduler.log"
    log_from = log.stat().st_size if log.exists() else 0
    with watching(lay, settings.training_namespace, worker_selector(settings, name)) as times:
        sampler = Sampler(lay, cfg, plan, virtual, times, plan.gang_pods)
        sampler.start()
        try:
            create_platform_job(lay, cfg, name, pool, plan.gang_pods)
            wait(f"the {plan.gang_pods} pods of {name} released from the handover gate",
                 lambda: sum(p.ungated is not None for p in times.pods.values()) >= plan.gang_pods,
                 cfg.burst.handover.timeout_seconds + timeout)
            try:
                patience = cfg.burst.handover.clear_after_seconds + STALL_S
                running_s = wait(f"the {plan.gang_pods} pods of {name} Running",
                                 lambda: times.running() >= plan.gang_pods, patience)
                say(f"burst: the gang Running {running_s:.1f}s after its release")
            except control.ClusterError:
                stalled = stall(core_api, cfg, pool, plan.gang_pods, patience)
                say(f"burst: {stalled['reason']}")
            if stalled is None:
                time.sleep(RUN_S)
            delete_platform_job(lay, cfg, name)
            sampler.ended = time.monotonic()
            wait("the burst closed", lambda: "time_to_close_s" in sampler.clock.phases,
                 cfg.burst.close_hold_seconds + timeout)
            if stalled is None:
                done = ("time_to_return_s", "time_to_return_standby_gone_s")
                try:
                    expected = simulated.get("time_to_return_standby_gone_s") or timeout
                    wait("inference back on-prem and the standby gone",
                         lambda: all(k in sampler.clock.phases for k in done), RETURN_SLACK * expected + 120)
                except control.ClusterError:
                    return_blocked = blocked_return(core_api, client.PolicyV1Api(control.api_client(lay)), cfg)
                    say(f"burst: the return did not finish: {return_blocked['reason']}")
        finally:
            sampler.stop.set()
            sampler.join(10)
    if plan.background_pods:
        cancel(lay, namespace, BACKGROUND)
    # The shape's other runs (storms, crashes) measure on GPU nodes without inference, as before this one.
    for dep in deployments:
        apps.delete_namespaced_deployment(dep["metadata"]["name"], cfg.inference_namespace)
    core = client.CoreV1Api(control.api_client(lay))
    wait("the inference pods gone", lambda: not core.list_namespaced_pod(cfg.inference_namespace).items, timeout)
    text = log.read_bytes()[log_from:].decode(errors="replace") if log.exists() else ""
    # A stalled gang displaced nothing: the phases after its end would time nothing coming home.
    phases = {k: round(v, 1) for k, v in sampler.clock.phases.items()
              if not stalled or k in (UNGATE, "time_to_standby_ready_s", "time_to_close_s")}
    return {
        "plan": asdict(plan), "settle_s": round(settle_s, 1), "run_s": RUN_S, "stalled": stalled,
        "clear_after_s": cfg.burst.handover.clear_after_seconds,
        "return_blocked": return_blocked,
        "phases": phases, "simulated": simulated,
        "side_by_side": [{"phase": k, "real_s": phases.get(k), "simulated_s": simulated.get(k),
                          "from": "gang's end" if k in AFTER_END else "gang's creation"} for k in (UNGATE, *PHASES)],
        "fewest_ready": sampler.fewest, "min_replicas": {s.name: s.min_replicas for s in cfg.inference.services},
        "most_external_ready": sampler.most_external, "burst_taint_effects": sorted(sampler.effects),
        "descheduler_evictions_per_cycle": evictions_per_cycle(text),
        # The handover's own evictions, clearing the gang's room (plan_clear), by answer.
        "burst_controller_evictions": evictions_by(audit_events(lay), "burst-controller"),
        "descheduler_limit": min(cfg.descheduler.max_pods_total, cfg.descheduler.max_pods_per_node),
        "samples": sampler.samples, "sampler_errors": sampler.errors[:5],
    }


def simulate(cfg: Any, plan: BurstPlan, descheduler_interval_s: float | None = None) -> dict[str, float]:
    """The simulator's phases for the same stack, scenario and local start times (the local descheduler's
    interval)."""
    from bench.bench_sim_vs_e2e import local_descheduler_interval_s, simulate_scenario
    from bench.sim.model import ClusterModel
    from components.burst_controller import settings_from_config

    model = ClusterModel.from_config(cfg, LOCAL_LATENCIES)
    model = replace(model, descheduler=replace(model.descheduler,
                                               interval_s=descheduler_interval_s or local_descheduler_interval_s()))
    trace = simulate_scenario(model, settings_from_config(cfg), scenario(plan))
    return {k: round(v, 1) for k, v in trace.phases.items()}
