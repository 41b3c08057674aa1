"""The burst scenario on a live local cluster, shared by the process harness (tests/test_e2e.py) and the stack in its
own pods (tests/test_e2e_stack_in_pods.py): the reads it makes, the sampler that watches it and the scenario itself.

What differs between the two is passed in as :class:`Hooks`: how the provider is restarted (a harness process, or
the provider's pod), where the descheduler's log is, and what else happens mid-handover (deleting the burst
controller's leading pod, in pods)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from agents.kit.calls import CLUSTER_SCOPED_EVENT_NAMESPACE
from tests.polling import wait
from tools.localcluster.history import fencing_violations
from tools.localcluster.plan import VIRTUAL_KUBELET
from tools.localcluster.rbac_usage import parse_audit
from tools.localcluster.scaleburst import evictions_per_cycle

#: The longest a gang may look partly placed or running: one bind round plus kwok starting each pod.
GANG_SETTLE_S = 5.0
#: Audit verbs that change an object.
WRITE_VERBS = ("create", "update", "patch", "delete", "deletecollection")
GANG = "e2e-gang"


class Cluster:
    """Thin reads over the API for the assertions."""

    def __init__(self, api: Any, cfg: Any) -> None:
        from kubernetes import client

        self.core = client.CoreV1Api(api)
        self.custom = client.CustomObjectsApi(api)
        self.coordination = client.CoordinationV1Api(api)
        self.cfg = cfg
        self.prefix = cfg.label_prefix
        self.burst_key = f"{cfg.label_prefix}/burst"

    def location(self) -> dict[str, str]:
        return {n.metadata.name: (n.metadata.labels or {}).get(f"{self.prefix}/location", "")
                for n in self.core.list_node().items}

    @property
    def virtual_names(self) -> set[str]:
        return {p.node_name for p in self.cfg.providers}

    def virtual_nodes(self) -> list[Any]:
        names = self.virtual_names
        return [n for n in self.core.list_node().items if n.metadata.name in names]

    def inference_pods(self, service: str, role: str | None = None) -> list[Any]:
        """Live pods of the service: every replica, or only `main` (the HPA's) or `standby` ones."""
        sel = f"{self.prefix}/service={service}"
        if role == "standby":
            sel += f",{self.prefix}/role=standby"
        elif role == "main":
            sel += f",!{self.prefix}/role"
        pods = self.core.list_namespaced_pod(self.cfg.inference_namespace, label_selector=sel).items
        return [p for p in pods if p.metadata.deletion_timestamp is None]

    @staticmethod
    def ready(pod: Any) -> bool:
        return any(c.type == "Ready" and c.status == "True" for c in (pod.status.conditions or []))

    def ready_by_location(self, service: str, role: str | None = None) -> dict[str, int]:
        loc = self.location()
        out: dict[str, int] = {}
        for p in self.inference_pods(service, role):
            if self.ready(p):
                where = loc.get(p.spec.node_name or "", "?")
                out[where] = out.get(where, 0) + 1
        return out

    def burst_taints(self) -> list[Any]:
        return [t for n in self.virtual_nodes() for t in (n.spec.taints or []) if t.key == self.burst_key]

    def gang_pods(self, job: str) -> list[Any]:
        sel = f"volcano.sh/job-name={job}"
        return self.core.list_namespaced_pod(self.cfg.training_namespace, label_selector=sel).items

    def pods_on(self, node: str) -> dict[str, Any]:
        pods = self.core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={node}").items
        return {p.metadata.uid: p for p in pods if p.metadata.deletion_timestamp is None}

    def lease_holder(self, name: str) -> str | None:
        """Who holds the agent's Lease; None while nobody does, the Lease not yet created included (an agent just
        started has not written it: a test run on its own reached this before the guard's first cycle)."""
        from kubernetes.client.exceptions import ApiException

        try:
            holder: str | None = self.coordination.read_namespaced_lease(name, self.cfg.system_namespace).spec \
                .holder_identity
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return holder

    def burst_events(self) -> dict[str, dict[str, str]]:
        """The burst controller's BurstOpened/BurstClosed Events (in default, with every Event about a node), by
        reason: Event name to the virtual node it names (names are unique, so a baseline taken before tells the new
        ones apart; timestamps are whole seconds)."""
        items = self.core.list_namespaced_event(CLUSTER_SCOPED_EVENT_NAMESPACE).items
        out: dict[str, dict[str, str]] = {"BurstOpened": {}, "BurstClosed": {}}
        for e in items:
            if e.reason in out:
                out[e.reason][e.metadata.name] = e.involved_object.name
        return out


def reported_by_provider(pod: Any, since: float) -> bool:
    """Running and Ready as the virtual kubelet reports it: it wrote the status (the status subresource's field
    manager), and the provider started the pod at or after ``since`` (epoch seconds)."""
    managers = {(m.manager, m.subresource) for m in pod.metadata.managed_fields or []}
    started = pod.status.start_time.timestamp() if pod.status.start_time else 0.0
    return (pod.status.phase == "Running" and Cluster.ready(pod) and (VIRTUAL_KUBELET, "status") in managers
            and started >= since - 1)


def assert_kubelet_api_answers(c: Cluster, node: str) -> None:
    """``kubectl logs`` of a pod on the virtual node works: the API server reaches the provider's kubelet API
    over TLS with the key pair the stack's init container made, the provider verifies the API server's client
    certificate against the cluster CA the stack names and authorizes it by a SubjectAccessReview (its RBAC)."""
    from kubernetes.client import ApiException

    pod = next(iter(c.pods_on(node).values()))
    try:
        text = c.core.read_namespaced_pod_log(pod.metadata.name, pod.metadata.namespace,
                                              container=pod.spec.containers[0].name)
    except ApiException as err:
        raise AssertionError(f"logs of {pod.metadata.name} on {node}: HTTP {err.status} {err.body}") from None
    assert text == "", text  # the mock provider's logs are empty


def restart_providers(c: Cluster, restart: Callable[[Any], float], burst_taint: bool, pods_at_least: int) -> float:
    """Restart every provider's virtual kubelet (``restart(target)``: a process stopped and started with a new
    token, or its pod deleted; the seconds until it renewed its node lease). Its node is the same object with the
    same taints (the controller's burst taint among them when ``burst_taint``), and every pod on it stays: the
    same pod, Running and Ready again as the restarted provider reports it. ``pods_at_least`` pods run on the
    providers' nodes together (a burst fills the cheapest first). Returns the longest restart (s)."""
    from tools.localcluster import virtual_kubelet

    targets = virtual_kubelet.targets(c.cfg)
    running = {t.node: len(c.pods_on(t.node)) for t in targets}
    assert sum(running.values()) >= pods_at_least, f"pods on the virtual nodes {running}, expected {pods_at_least}+"
    longest = 0.0
    for t in targets:
        node = c.core.read_node(t.node)
        taints = sorted((x.key, x.value or "", x.effect) for x in node.spec.taints or [])
        assert any(k == c.burst_key for k, _, _ in taints) == burst_taint, taints
        before = c.pods_on(t.node)
        first = time.time()
        assert all(reported_by_provider(p, 0) for p in before.values()), [
            (p.metadata.name, p.status.phase) for p in before.values()]
        longest = max(longest, restart(t))

        def settled(t: Any = t, before: dict[str, Any] = before, first: float = first,
                    taints: list[Any] = taints) -> bool:
            # The node lifecycle controller may taint the node not-ready for the instant the restarted provider
            # reports Ready=False (before its controllers run); settled means those are gone again too.
            now = c.pods_on(t.node)
            same = sorted((x.key, x.value or "", x.effect) for x in c.core.read_node(t.node).spec.taints or [])
            return (set(now) == set(before) and all(reported_by_provider(p, first) for p in now.values())
                    and same == taints)

        wait(f"every pod on {t.node} kept and reported Running by the restarted provider, its taints as before",
             settled, 60)
        assert c.core.read_node(t.node).metadata.uid == node.metadata.uid, "the node was registered anew"
        if before:
            assert_kubelet_api_answers(c, t.node)
        failed = [p.metadata.name for p in c.core.list_pod_for_all_namespaces(
            field_selector=f"spec.nodeName={t.node},status.phase=Failed").items]
        assert not failed, f"pods lost on {t.node}: {failed}"
    return longest


def writes_by(audit_log: Path, agent: str, identity: str, since: float) -> list[str]:
    """Every write the API server completed for replicas of ``agent`` whose identity starts with ``identity`` (their
    User-Agent, ``<agent>/<identity>``, tells replicas of one ServiceAccount apart; ``""``: every replica) received
    at or after ``since`` (epoch seconds), from the audit log."""
    out = []
    for line in audit_log.read_text().splitlines():
        try:
            event = json.loads(line)
        except ValueError:  # the line the API server is still writing
            continue
        if (event.get("stage") != "ResponseComplete" or event.get("verb") not in WRITE_VERBS
                or not str(event.get("userAgent", "")).startswith(f"{agent}/{identity}")):
            continue
        received = datetime.fromisoformat(str(event["requestReceivedTimestamp"]).replace("Z", "+00:00"))
        if received.timestamp() < since:
            continue
        ref = event.get("objectRef") or {}
        sub = f"/{ref['subresource']}" if ref.get("subresource") else ""
        out.append(f"{event['verb']} {ref.get('resource')}{sub} {ref.get('name', '')}".strip())
    return out


def fencing_problems(audit_log: Path, agent: str, namespace: str, lease: str | None = None) -> list[str]:
    """The history checker's fencing violations of ``agent`` over the whole audit log (docs/agents.md): writes by
    a replica while another held the Lease (``lease``, default the agent's name), or after a refused renewal."""
    requests = parse_audit(audit_log.read_text(), str(audit_log))
    return [v.detail for v in fencing_violations(requests, agent=agent, namespace=namespace, lease=lease or agent)]


class Sampler(threading.Thread):
    """Samples ready inference replicas, burst taint effects and gang start state twice a second."""

    def __init__(self, cluster: Cluster, service: str, job: str, workers: int) -> None:
        super().__init__(daemon=True)
        self.c, self.service, self.job, self.workers = cluster, service, job, workers
        self.stop = threading.Event()
        self.began = time.monotonic()
        self.min_ready = 10**9
        #: The scenario's current phase (set by the test) and the fewest ready replicas sampled in each.
        self.phase = "preempt"
        self.min_by_phase: dict[str, int] = {}
        self.effects: set[str] = set()
        #: Samples with part of the gang placed or running: (seconds since it began, bound, running).
        self.partial_gang: list[tuple[float, int, int]] = []
        self.partial_since: float | None = None
        self.longest_partial = 0.0
        self.errors: list[str] = []
        #: When the standby first had minReplicas ready, and when a gang pod was first bound to a node.
        self.standby_ready_at: float | None = None
        self.gang_bound_at: float | None = None
        #: Every virtual node an inference replica (main or standby) was bound to.
        self.external_nodes: set[str] = set()
        #: Each virtual node's first inference replica: (phase, pod, seconds since the sampler began).
        self.first_on: dict[str, tuple[str, str, float]] = {}

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                now = time.monotonic()
                pods = self.c.inference_pods(self.service)
                ready = sum(1 for p in pods if self.c.ready(p))
                for p in pods:
                    if p.spec.node_name in self.c.virtual_names and p.spec.node_name not in self.first_on:
                        self.first_on[p.spec.node_name] = (self.phase, p.metadata.name, round(now - self.began, 1))
                self.external_nodes |= set(self.first_on)
                standby = sum(self.c.ready_by_location(self.service, "standby").values())
                if self.standby_ready_at is None and standby >= self.c.cfg.handover_services.get(self.service, 0) > 0:
                    self.standby_ready_at = now
                gang = self.c.gang_pods(self.job)
                if self.gang_bound_at is None and any(p.spec.node_name for p in gang):
                    self.gang_bound_at = now
                self.min_ready = min(self.min_ready, ready)
                self.min_by_phase[self.phase] = min(self.min_by_phase.get(self.phase, ready), ready)
                self.effects |= {t.effect for t in self.c.burst_taints()}
                # Gang: never part of it placed or running for longer than a bind round and kwok's start of
                # each pod (the scheduler binds the whole gang in one session; kwok starts pods one by one).
                # Only until the job is ended: its pods then go away one by one.
                live = [p for p in gang if p.metadata.deletion_timestamp is None]
                bound = sum(1 for p in live if p.spec.node_name)
                running = sum(1 for p in live if p.status.phase == "Running")
                partial = self.phase == "preempt" and (0 < bound < self.workers or 0 < running < self.workers)
                if partial:
                    self.partial_since = now if self.partial_since is None else self.partial_since
                    self.partial_gang.append((round(now - self.partial_since, 1), bound, running))
                    self.longest_partial = max(self.longest_partial, now - self.partial_since)
                else:
                    self.partial_since = None
            except Exception as err:  # keep sampling through API hiccups, report them at the end
                self.errors.append(repr(err))
            time.sleep(0.5)


@dataclass
class Hooks:
    """What the harness and the stack in pods do differently in the scenario."""

    #: Restart every provider (``burst_taint``: whether the controller's taint is on its node now; at least
    #: ``pods_at_least`` pods run there); the longest restart in seconds.
    restart_provider: Callable[[bool, int], float]
    #: The descheduler's log so far (every cycle it ran).
    descheduler_log: Callable[[], str]
    #: The API server's audit log.
    audit_log: Path
    #: Called once the standby is being started for the gang, before the gang may start; its figures are kept.
    mid_handover: Callable[[], dict[str, float]] | None = None


def clear_training(c: Cluster) -> None:
    """The scenario starts with inference only (a gang left from elsewhere would skew it)."""
    ns = c.cfg.training_namespace
    for vcjob in c.custom.list_namespaced_custom_object("batch.volcano.sh", "v1alpha1", ns, "jobs")["items"]:
        c.custom.delete_namespaced_custom_object("batch.volcano.sh", "v1alpha1", ns, "jobs", vcjob["metadata"]["name"])


def run_burst_scenario(c: Cluster, hooks: Hooks, phases: dict[str, float],
                       report: Callable[[dict[str, float]], None]) -> None:
    """A training gang that needs every GPU of its pool waits at the handover gate while the standby comes up on the
    virtual node, preempts inference, the burst taint leaves the virtual node, inference becomes ready there, the
    gang starts together and only on-prem, and the standby goes back to zero; after training ends the standby covers
    the return, the taint returns as NoSchedule and the descheduler brings inference back no faster than its
    per-cycle limit. Throughout: no taint is ever NoExecute, the gang never stays partly placed, ready inference
    replicas never drop below the service's minReplicas, and the burst opens once and closes once (no action twice).
    """
    from components.provider_rank import fill_order
    from components.training_job import TrainingJobArgs, volcano_job_spec

    cfg = c.cfg
    service = next(s for s in cfg.inference.services if s.name in cfg.handover_services)
    minimum = service.min_replicas
    job_cfg = cfg.training.jobs[0]
    assert cfg.handover_services.get(service.name) == minimum, "the local stack runs the make-before-break handover"
    clear_training(c)

    phases["inference_ready_onprem_s"] = wait(
        f"{minimum} ready replicas of {service.name} on-prem",
        lambda: c.ready_by_location(service.name, "main").get("onprem", 0) >= minimum, 300)
    wait("the burst taint on every virtual node", lambda: len(c.burst_taints()) == len(cfg.providers), 120)
    # What the controller did before the scenario (a burst for a gang the stack declared, say) is not counted.
    time.sleep(1)
    began, before = time.time(), c.burst_events()

    # A gang that needs every GPU of its pool; its pods start behind the handover gate (the stack's template).
    pool = cfg.pool(job_cfg.pool)
    nodes = len(pool.node_names)
    job = job_cfg.model_copy(update={"name": GANG, "workers": nodes, "gpus_per_worker": pool.gpus_per_node})
    spec = volcano_job_spec(TrainingJobArgs.from_config(cfg, job))
    assert spec["tasks"][0]["template"]["spec"]["schedulingGates"] == [{"name": f"{c.prefix}/handover"}]
    sampler = Sampler(c, service.name, GANG, nodes)
    sampler.start()
    started = time.monotonic()
    c.custom.create_namespaced_custom_object("batch.volcano.sh", "v1alpha1", cfg.training_namespace, "jobs", {
        "apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job",
        "metadata": {"name": GANG, "namespace": cfg.training_namespace}, "spec": spec})

    def standby_ready() -> int:
        return sum(c.ready_by_location(service.name, "standby").values())

    try:
        if hooks.mid_handover is not None:
            wait("the standby asked for", lambda: c.inference_pods(service.name, "standby"), 120)
            phases.update(hooks.mid_handover())
        wait(f"{minimum} standby replicas ready on the virtual node",
             lambda: c.ready_by_location(service.name, "standby").get("external", 0) >= minimum, 180)
        phases["time_to_standby_ready_s"] = time.monotonic() - started
        wait("inference preempted from on-prem",
             lambda: c.ready_by_location(service.name, "main").get("onprem", 0) == 0, 180)
        phases["time_to_preempt_s"] = time.monotonic() - started
        wait("the burst taint leaves the virtual node", lambda: not c.burst_taints(), 180)
        phases["time_to_open_s"] = time.monotonic() - started
        wait("inference ready on the virtual node",
             lambda: c.ready_by_location(service.name, "main").get("external", 0) >= minimum, 180)
        phases["time_to_ready_external_s"] = time.monotonic() - started

        def gang_running() -> Any:
            pods = c.gang_pods(GANG)
            return len(pods) == nodes and all(p.status.phase == "Running" for p in pods) and pods

        wait("the whole gang Running", gang_running, 180)
        phases["time_to_gang_running_s"] = time.monotonic() - started
        loc = c.location()
        gang = c.gang_pods(GANG)
        assert all(loc[p.spec.node_name] == "onprem" for p in gang), [p.spec.node_name for p in gang]
        # The standby only bridged the handover: it goes back to zero once the main replicas are ready.
        wait("the standby back to zero after the handover", lambda: not c.inference_pods(service.name, "standby"), 120)
        phases["time_to_standby_gone_s"] = time.monotonic() - started
        # Mid-burst: the provider restarts under the replicas it runs.
        phases["vk_restart_open_s"] = hooks.restart_provider(False, minimum)

        # Training ends: the standby covers the return, the taint comes back (NoSchedule), inference comes home.
        ended = time.monotonic()
        sampler.phase = "return"
        c.custom.delete_namespaced_custom_object("batch.volcano.sh", "v1alpha1", cfg.training_namespace, "jobs", GANG)
        wait("the burst taint back on the virtual node", lambda: len(c.burst_taints()) == len(cfg.providers), 300)
        phases["time_to_close_s"] = time.monotonic() - ended
        assert {t.effect for t in c.burst_taints()} == {"NoSchedule"}
        assert standby_ready() >= minimum, "the burst closed before the standby covered the replicas going home"
        wait("inference back on-prem",
             lambda: c.ready_by_location(service.name, "main").get("external", 0) == 0
             and c.ready_by_location(service.name, "main").get("onprem", 0) >= minimum, 600)
        phases["time_to_return_s"] = time.monotonic() - ended
        wait("the standby back to zero after the return", lambda: not c.inference_pods(service.name, "standby"), 120)
        phases["time_to_return_standby_gone_s"] = time.monotonic() - ended
        # Closed again: a restart keeps the controller's burst taint.
        phases["vk_restart_closed_s"] = hooks.restart_provider(True, 0)
    finally:
        sampler.stop.set()
        sampler.join(5)
        for phase, fewest in sampler.min_by_phase.items():
            phases[f"min_ready_{phase}"] = fewest
        report(phases)
        print("fewest ready inference replicas per phase:", sampler.min_by_phase)

    assert sampler.effects <= {"NoSchedule"}, f"burst taint effects seen: {sampler.effects}"
    phases["longest_partial_gang_s"] = sampler.longest_partial
    phases["virtual_nodes_used"] = len(sampler.external_nodes)
    report(phases)
    assert sampler.longest_partial <= GANG_SETTLE_S, (
        f"part of the gang placed or running for {sampler.longest_partial:.1f}s: {sampler.partial_gang[:10]}")
    # Make before break: no gang pod was bound before the standby had minReplicas ready.
    assert sampler.standby_ready_at is not None and sampler.gang_bound_at is not None
    assert sampler.gang_bound_at >= sampler.standby_ready_at, (
        f"a gang pod was bound {sampler.standby_ready_at - sampler.gang_bound_at:.1f}s before the standby was ready")
    # The burst fills the cheapest provider first (components/provider_rank.py, as Volcano's nodeorder scores the
    # replicas' preferred terms): with room there for every replica, no replica was ever bound to a dearer one.
    cheapest = cfg.providers[fill_order(cfg.providers)[0]].node_name
    assert sampler.external_nodes == {cheapest}, (
        f"external replicas bound to {sorted(sampler.external_nodes)}; the cheapest provider's node is {cheapest}; "
        f"first replica on each (phase, pod, s): {sampler.first_on}")
    cycles = evictions_per_cycle(hooks.descheduler_log())
    limit = min(cfg.descheduler.max_pods_total, cfg.descheduler.max_pods_per_node)
    assert cycles and max(cycles) <= limit, f"evictions per descheduler cycle {cycles}, limit {limit}"
    # Ready replicas never below the minimum, in either direction of the handover.
    assert sampler.min_ready >= minimum, (
        f"ready {service.name} replicas dropped to {sampler.min_ready} (minReplicas {minimum}); "
        f"fewest per phase: {sampler.min_by_phase}; sampler errors: {sampler.errors[:3]}")
    # No action twice, whichever replica led: each virtual node opened once and closed once, and each gang pod's
    # handover gate was lifted by exactly one write.
    nodes_once = sorted(p.node_name for p in cfg.providers)
    events = {reason: sorted(node for name, node in new.items() if name not in before[reason])
              for reason, new in c.burst_events().items()}
    assert events == {"BurstOpened": nodes_once, "BurstClosed": nodes_once}, events
    writes = writes_by(hooks.audit_log, "burst-controller", "", began)
    assert fencing_problems(hooks.audit_log, "burst-controller", cfg.system_namespace) == []
    for pod in gang:
        lifted = writes.count(f"patch pods {pod.metadata.name}")
        assert lifted == 1, f"{pod.metadata.name}'s gate: {lifted} patches by the burst controller ({writes})"
