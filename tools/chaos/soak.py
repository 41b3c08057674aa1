"""The soak: the local stack with every agent in its pods on real nodes, one fault every period, and afterwards the
history check (tools/localcluster/history.py) over what the API server recorded.

After each fault (timed once the cluster shows it) the soak waits until the cluster is whole again — the API server
ready, every control-plane process alive (and the nodes' kube-router and kube-proxy, and the proxy the pods reach the
API server through), every node Ready and none quarantined, every Deployment and StatefulSet of the stack's system
and monitoring namespaces fully Ready, every HA agent led by a Ready replica, the researcher's gang (tools/chaos/
gang.py) training — and records how long that took, per kind; a fault not recovered within the bound is a violation.
Beside the faults a sampler reads, every second, each inference PodDisruptionBudget's Ready pods against its floor,
the virtual nodes' burst taint (never NoExecute) and every node's quarantine taint.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from agents.health_guard.contract import Names
from tools.chaos.gang import GANG, GANG_STALLED_S, SoakGang
from tools.chaos.schedule import (
    AGENT_FAULTS,
    GPU_FAULTS,
    KILLED,
    NETWORK_FAULTS,
    PROCESS_OF,
    TRAINING_FAULTS,
    Fault,
    Injection,
    schedule,
)
from tools.chaos.training import judge
from tools.chaos.verdict import AUDIT_INVARIANTS, NODE_INVARIANTS, audit_violations, node_violations
from tools.localcluster import apiproxy, control, processes, prometheus_operator, virtual_kubelet
from tools.localcluster.apiproxy import NetFault
from tools.localcluster.history import GpuFault, taint_flips
from tools.localcluster.plan import Layout
from tools.localcluster.processes import ClusterError
from tools.localcluster.rbac_usage import parse_audit
from tools.localcluster.realcluster import (
    container_pid,
    lease_holder,
    prometheus_get,
    ready_pods,
    serve_gpu_readings,
)

#: How long the cluster may take to be whole again after one fault, before the soak calls it a violation.
RECOVERY_BOUND_S = 240.0
#: This many faults in a row not recovered within the bound end the soak: the cluster is not coming back, and every
#: later fault would only wait out the bound.
STOP_AFTER_NOT_WHOLE = 3
#: How long a fault the cluster notices later (a container killed) may take to show, before its recovery is timed.
OBSERVE_S = 30.0
#: How long a restarted (SIGTERMed) control-plane component may take to exit before it is SIGKILLed.
RESTART_GRACE_S = 10.0
#: The nodes' own network processes: the NetworkPolicy firewall and the Service proxy.
NODE_PROCESSES = ("kube-router", "kube-proxy")
#: The monitoring install's apps (their ``app.kubernetes.io/name``) and the container of each that is killed.
MONITORING = {"prometheus": "prometheus", prometheus_operator.OPERATOR: prometheus_operator.OPERATOR}
#: How long a network fault lasts: most of a 30 s period, and longer than the agents' Lease renewal deadline, so
#: a leader whose renewals fail or hang loses its Lease inside the window.
NETWORK_WINDOW_S = 20.0
#: How long a GPU fault is served (a few scrapes and guard polls: the guard sees it), and what it serves.
GPU_FAULT_S = 30.0
GPU_FAULT = {"0": {"DCGM_FI_DEV_XID_ERRORS": 94}}
#: The fatal one: the GPU fell off the bus.
GPU_FATAL_FAULT = {"0": {"DCGM_FI_DEV_XID_ERRORS": 79}}
#: How long the soak, as the operator, waits for Prometheus to show a cleared GPU before marking it repaired.
CLEAR_SCRAPED_S = 90.0
#: Each network fault on the HA agents' calls to the API server (tools/localcluster/apiproxy.py).
NETWORK = {
    Fault.API_LATENCY: NetFault("latency", latency_ms=1500),
    Fault.API_THROTTLED: NetFault("status", status=429, share=0.5),
    Fault.API_ERRORS: NetFault("status", status=503, share=0.5),
    Fault.API_RESET: NetFault("reset", share=0.3),
    Fault.API_HANG: NetFault("hang", share=0.2),
}


def not_coming_back(recoveries: Sequence[float | None], in_a_row: int = STOP_AFTER_NOT_WHOLE) -> bool:
    """The last ``in_a_row`` faults all left the cluster not whole (``None``): it is not coming back."""
    last = recoveries[-in_a_row:]
    return len(last) == in_a_row and all(r is None for r in last)


def say(msg: str) -> None:
    print(f"chaos: {msg}", flush=True)


@dataclass(frozen=True)
class Agent:
    """An HA agent of the stack: its app (Deployment) and Lease."""

    app: str
    #: Where its Lease lives (its settings' ``namespace``).
    namespace: str
    lease: str
    lease_duration_s: float


@dataclass
class Record:
    """What the soak saw: per fault its recovery, and the sampler's counts."""

    recoveries: list[tuple[Injection, float | None]] = field(default_factory=list)
    #: Faults that could not be put in place (no leader to hit at that moment, a process not recorded): not counted
    #: as faults, listed in the report with why.
    not_injected: list[tuple[Injection, str]] = field(default_factory=list)
    samples: int = 0
    below_floor: int = 0
    below_floor_seen: Counter[str] = field(default_factory=Counter)
    no_execute: int = 0
    sampler_errors: int = 0
    #: Why the soak ended before its duration, if it did.
    stopped_early: str | None = None
    #: Every node's burst taint at each sample: (epoch seconds, node, tainted).
    burst_taint: list[tuple[float, str, bool]] = field(default_factory=list)
    #: Every fault put in place: (epoch seconds it began, kind, target).
    injected: list[tuple[float, Fault, str]] = field(default_factory=list)
    #: Faults the cluster never showed within OBSERVE_S (a kill the kubelet never noticed): named in the report.
    unseen: list[Injection] = field(default_factory=list)
    #: Every node's quarantine taint (the health guard's) at each sample: (epoch seconds, node, tainted).
    quarantine: list[tuple[float, str, bool]] = field(default_factory=list)
    #: The GPU faults served, each from its start to its clear.
    gpu_faults: list[GpuFault] = field(default_factory=list)
    #: The health guard's breaker at each sample: (epoch seconds, tripped); a tripped one holds every quarantine.
    breaker: list[tuple[float, bool]] = field(default_factory=list)
    #: What the soak did as the operator after a GPU fault (a repair mark, a breaker reset).
    operator_actions: Counter[str] = field(default_factory=Counter)


def _settings(core: Any, namespace: str, app: str) -> dict[str, Any] | None:
    import yaml
    from kubernetes.client import ApiException

    try:
        cm = core.read_namespaced_config_map(f"{app}-settings", namespace)
    except ApiException:
        return None
    raw = next(iter((cm.data or {}).values()), "")
    loaded = yaml.safe_load(raw) if raw else None
    return loaded if isinstance(loaded, dict) else None


def ha_agents(lay: Layout, namespace: str) -> list[Agent]:
    """The Deployments of ``namespace`` with two replicas or more whose settings name a Lease."""
    from kubernetes import client

    api = control.api_client(lay)
    core: Any = client.CoreV1Api(api)
    apps: Any = client.AppsV1Api(api)
    out = []
    for dep in apps.list_namespaced_deployment(namespace).items:
        settings = _settings(core, namespace, dep.metadata.name)
        if (dep.spec.replicas or 0) >= 2 and settings and settings.get("lease_name"):
            out.append(Agent(dep.metadata.name, str(settings.get("namespace") or namespace),
                             str(settings["lease_name"]), float(settings.get("lease_duration_seconds") or 30)))
    return sorted(out, key=lambda a: a.app)


def _restarts(pod: Any) -> int:
    """How often the kubelet restarted the pod's containers."""
    return sum(c.restart_count or 0 for c in pod.status.container_statuses or [])


class Soak:
    def __init__(self, lay: Layout, cfg: Any, seed: int, duration_s: float, every_s: float,
                 kubelets: tuple[str, ...], recovery_bound_s: float = RECOVERY_BOUND_S,
                 training: Path | None = None) -> None:
        """``training``: the ``gpucluster`` CLI a researcher submits the soak's gang with (None: no gang)."""
        from kubernetes import client

        from tools.localcluster.realnodes import REAL_GPU_NODES

        self.lay, self.cfg, self.seed = lay, cfg, seed
        self.duration_s, self.every_s, self.bound = duration_s, every_s, recovery_bound_s
        self.namespace = cfg.system_namespace
        api = control.api_client(lay)
        self.core: Any = client.CoreV1Api(api)
        self.apps: Any = client.AppsV1Api(api)
        self.policy: Any = client.PolicyV1Api(api)
        self.coordination: Any = client.CoordinationV1Api(api)
        self.agents = {a.app: a for a in ha_agents(lay, self.namespace)}
        self.providers = {t.app: t for t in virtual_kubelet.targets(cfg)}
        self.kubelets = kubelets
        self.monitoring = cfg.monitoring_namespace
        self.proxied = control.load_proc(lay, apiproxy.NAME) is not None
        #: The researcher's gang that trains through the soak, if any.
        self.gang = SoakGang(lay, self.core, cfg.training_namespace, training) if training else None
        #: Nodes whose served GPU fault is cleared: the operator marks them repaired if the guard holds them.
        self.repaired: set[str] = set()
        ranks = self.gang.ranks if self.gang else ()
        self.guard_names = Names(cfg.label_prefix)
        self.plan = schedule(seed, duration_s, every_s, sorted(self.agents), sorted(self.providers), kubelets,
                             monitoring=sorted(MONITORING), network=(apiproxy.NAME,) if self.proxied else (),
                             ranks=ranks, gpus=REAL_GPU_NODES if "health-guard" in self.agents else ())
        self.record = Record()

    # ------------------------------------------------------------------ faults

    def _container(self, namespace: str, pod_name: str, container: str | None = None) -> tuple[str, str]:
        """The node and container id of the pod's first container, or of the one named."""
        pod = self.core.read_namespaced_pod(pod_name, namespace)
        statuses = [c for c in pod.status.container_statuses or [] if container is None or c.name == container]
        if not statuses or not statuses[0].container_id:
            raise RuntimeError(f"{namespace}/{pod_name} has no running container {container or ''}".rstrip())
        return pod.spec.node_name, statuses[0].container_id

    def _kill_ready(self, namespace: str, app: str, container: str | None = None) -> Callable[[], bool]:
        """SIGKILL the container of one Ready pod of ``app``: the kubelet restarts it in place. Returns whether the
        kill is seen yet (the pod not Ready, or its container restarted)."""
        pods = ready_pods(self.lay, namespace, app)
        if not pods:
            raise RuntimeError(f"{app}: no Ready pod to kill")
        return self._kill_container(namespace, pods[0].metadata.name, container)

    def _kill_container(self, namespace: str, pod: str, container: str | None = None) -> Callable[[], bool]:
        before = _restarts(self.core.read_namespaced_pod(pod, namespace))
        os.kill(container_pid(self.lay, *self._container(namespace, pod, container)), signal.SIGKILL)

        def seen() -> bool:
            p = self.core.read_namespaced_pod(pod, namespace)
            ready = any(c.type == "Ready" and c.status == "True" for c in p.status.conditions or [])
            return not ready or _restarts(p) > before

        return seen

    def _holder(self, agent: Agent) -> str:
        """The pod that holds ``agent``'s Lease."""
        holder = lease_holder(self.lay, agent.namespace, agent.lease)
        if not holder:
            raise RuntimeError(f"{agent.app}: nobody holds {agent.lease}")
        return holder

    def inject(self, injection: Injection) -> Callable[[], bool] | None:
        """Do ``injection``; returns once the fault is in place (a freeze: once the process is woken again), with,
        for a fault the cluster notices only later (a process killed in its container), whether it has yet: the
        recovery is not measured before the fault is seen, or a kill would count as whole before the kubelet
        noticed it."""
        fault, target = injection.fault, injection.target
        if fault in AGENT_FAULTS:
            agent = self.agents[target]
            if fault is Fault.LEADER_DELETED:
                self.core.delete_namespaced_pod(self._holder(agent), self.namespace)
            elif fault is Fault.LEADER_KILLED:
                return self._kill_container(self.namespace, self._holder(agent))
            else:
                pid = container_pid(self.lay, *self._container(self.namespace, self._holder(agent)))
                os.kill(pid, signal.SIGSTOP)
                try:
                    time.sleep(agent.lease_duration_s + 5)  # past its Lease: the standby takes over meanwhile
                finally:
                    os.kill(pid, signal.SIGCONT)
        elif fault is Fault.PROVIDER_KILLED:
            provider = self.providers[target]
            return self._kill_ready(provider.namespace, provider.app)
        elif fault is Fault.PROMETHEUS_KILLED:
            return self._kill_ready(self.monitoring, target, MONITORING[target])
        elif fault is Fault.KUBELET_RESTARTED:
            self._restart(f"kubelet-{target}", kill=False)
        elif fault in TRAINING_FAULTS:
            assert self.gang is not None  # drawn only with a gang's ranks
            return self.gang.hit(fault, target)
        elif fault in GPU_FAULTS:
            return self._gpu_fault(target, fatal=fault is Fault.GPU_FATAL)
        elif fault in NETWORK_FAULTS:
            apiproxy.set_fault(self.lay, replace(NETWORK[fault], seconds=NETWORK_WINDOW_S,
                                                 user_agents=tuple(f"{a}/" for a in sorted(self.agents))))
            time.sleep(NETWORK_WINDOW_S)  # it ends by itself; recovery counts from its end
        else:
            self._restart(PROCESS_OF[fault], kill=fault in KILLED)
        return None

    def _gpu_fault(self, node: str, fatal: bool = False) -> Callable[[], bool]:
        """Serve an XID from the node's dcgm-exporter for :data:`GPU_FAULT_S`, noting when Prometheus first answers
        with it (the guard cannot know of it before), clear it, and wait (at most :data:`CLEAR_SCRAPED_S`) until
        Prometheus shows it cleared: from then on the soak acts as the operator who fixed the GPU (:meth:`_operate`).
        A fatal one takes the gang's worker on the node with it, as a GPU off the bus does: it restarts in place while
        the guard quarantines the node and evicts the pod to the spare. Returns whether Prometheus ever showed it (a
        fault it never showed is named in the report, not charged to the guard)."""
        ns = self.cfg.telemetry_namespace
        served = GPU_FATAL_FAULT if fatal else GPU_FAULT
        xid = float(served["0"]["DCGM_FI_DEV_XID_ERRORS"])
        start = time.time()
        seen: float | None = None
        serve_gpu_readings(self.lay, ns, node, served)
        try:
            if fatal and self.gang is not None:
                try:
                    killed = self.gang.kill_worker_on(node)
                except Exception as exc:  # its container between starts: the XID is served all the same
                    killed = False
                    say(f"the fatal XID on {node} could not kill {GANG}'s worker there: {exc}")
                if not killed:
                    say(f"the fatal XID on {node} takes no rank of {GANG} with it")
            end = time.monotonic() + GPU_FAULT_S
            while time.monotonic() < end:
                if seen is None and self._xid_of(node) == xid:
                    seen = time.time()
                time.sleep(min(2.0, max(0.0, end - time.monotonic())))
        finally:
            serve_gpu_readings(self.lay, ns, node, {})
        self.record.gpu_faults.append(GpuFault(node, start, time.time(), seen))
        deadline = time.monotonic() + CLEAR_SCRAPED_S
        while self._xid_of(node) != 0.0:
            if time.monotonic() >= deadline:
                say(f"Prometheus still shows no cleared XID on {node} after {CLEAR_SCRAPED_S:g}s")
                break
            time.sleep(2.0)
        self.repaired.add(node)
        return lambda: seen is not None

    def _xid_of(self, node: str) -> float | None:
        """The node's last XID as Prometheus answers now (None: no series, or Prometheus not answering)."""
        query = f'max(DCGM_FI_DEV_XID_ERRORS{{Hostname="{node}"}})'
        try:
            result = prometheus_get(self.lay, self.monitoring, "/api/v1/query", query=query)["result"]
        except Exception:  # Prometheus restarting (a fault of its own): no answer this time
            return None
        return float(result[0]["value"][1]) if result else None

    def _operate(self) -> None:
        """What the operator does once a GPU fault is fixed (docs/observability.md), whenever the guard asks for it
        while the cluster is being made whole: mark a quarantined node repaired (a node quarantined often enough to
        count as flapping waits for that mark), and reset the guard's breaker if a quarantine past the hourly rails
        tripped it. Only for nodes the soak served a fault on, and only after the fault was cleared."""
        if not self.repaired:
            return
        names = self.guard_names
        for node in sorted(self.repaired):
            n = self.core.read_node(node)
            if (any(t.key == names.taint for t in n.spec.taints or [])
                    and names.repaired not in (n.metadata.labels or {})):
                self.core.patch_node(node, {"metadata": {"labels": {names.repaired: "chaos"}}})
                self.record.operator_actions["repair-mark"] += 1
        guard = self.agents["health-guard"]
        lease = self.coordination.read_namespaced_lease(guard.lease, guard.namespace)
        if (lease.metadata.annotations or {}).get(names.breaker):
            self.coordination.patch_namespaced_lease(guard.lease, guard.namespace,
                                                     {"metadata": {"annotations": {names.breaker: None}}})
            self.record.operator_actions["breaker-reset"] += 1

    def _restart(self, name: str, kill: bool) -> None:
        """SIGKILL (``kill``) or restart a process of the cluster. A supervised one (the control plane) is ended
        in place and its supervisor starts it again, as the kubelet restarts a static pod's container; the rest
        are stopped and started again by the soak."""
        proc = control.load_proc(self.lay, name)
        if proc is None:
            raise RuntimeError(f"{name} is not a process of this cluster")
        if proc.supervised:
            component = proc.component()
            if component is None:
                raise RuntimeError(f"{name} is between two starts of its supervisor: nothing to end")
            processes.end_process(*component, RESTART_GRACE_S, signal.SIGKILL if kill else signal.SIGTERM)
            control.wait_for(f"{name} started again by its supervisor",
                             lambda: proc.component() not in (None, component), 120)
            return
        if kill:
            os.kill(proc.pid, signal.SIGKILL)
            control.wait_for(f"{name} gone", proc.exited, 30)
        control.stop_process(self.lay, proc)
        control.start_process(self.lay, name, proc.argv)

    # ------------------------------------------------------------------ whole again

    def problems(self) -> list[str]:
        """What is not whole yet (empty: recovered)."""
        found: list[str] = []
        ports = control.load_ports(self.lay) or {}
        try:
            if control.api_get(self.lay, ports.get("apiserver", 0), "/readyz")[0] != 200:
                return ["the API server is not ready"]
        except OSError as exc:
            return [f"the API server does not answer: {exc}"]
        if self.gang is not None and self.gang.submitted and not self.gang.training():
            found.append(f"{GANG} is not training (no step from every rank of its newest round in the last "
                         f"{GANG_STALLED_S:g}s)")
        found += [f"{p.name} is not running" for p in control.recorded(self.lay)
                  if p.name in control.CONTROL_PLANE or p.name in NODE_PROCESSES or p.name == apiproxy.NAME
                  or p.name.startswith("kubelet-")
                  if p.component() is None]
        try:
            for node in self.core.list_node().items:
                ready = any(c.type == "Ready" and c.status == "True" for c in node.status.conditions or [])
                if not ready:
                    found.append(f"node {node.metadata.name} is not Ready")
                if any(t.key == self.guard_names.taint for t in node.spec.taints or []):
                    found.append(f"node {node.metadata.name} is quarantined")
            for namespace in (self.namespace, self.monitoring):
                workloads = [*self.apps.list_namespaced_deployment(namespace).items,
                             *self.apps.list_namespaced_stateful_set(namespace).items]
                for dep in workloads:
                    want, have = dep.spec.replicas or 0, dep.status.ready_replicas or 0
                    if have < want:
                        found.append(f"{namespace}/{dep.metadata.name}: {have}/{want} Ready")
            for agent in self.agents.values():
                holder = lease_holder(self.lay, agent.namespace, agent.lease)
                if holder not in {p.metadata.name for p in ready_pods(self.lay, self.namespace, agent.app)}:
                    found.append(f"{agent.app}: no Ready replica holds {agent.lease} (holder {holder or 'none'})")
        except Exception as exc:  # the API answered /readyz but not this: not whole yet
            found.append(f"the API refused a read: {type(exc).__name__}: {str(exc)[:200]}")
        return found

    def _seen(self, seen: Callable[[], bool]) -> bool:
        """Wait until the cluster shows the fault (``seen``), at most :data:`OBSERVE_S`."""
        deadline = time.monotonic() + OBSERVE_S
        while time.monotonic() < deadline:
            try:
                if seen():
                    return True
            except Exception:  # the API refusing a read while it restarts: look again
                pass
            time.sleep(0.2)
        return False

    def wait_whole(self, since: float) -> float | None:
        """Seconds from ``since`` until :meth:`problems` is empty; None past the bound."""
        last: list[str] = []
        while time.monotonic() - since < self.bound:
            try:
                self._operate()
            except Exception as exc:  # the API refusing a write while it restarts: the next pass tries again
                say(f"operator: {type(exc).__name__}: {str(exc)[:200]}")
            last = self.problems()
            if not last:
                return round(time.monotonic() - since, 1)
            time.sleep(1.0)
        say(f"not whole {self.bound:g}s after the fault: {'; '.join(last[:5])}")
        return None

    # ------------------------------------------------------------------ the sampler

    def sample(self) -> None:
        """Each inference PDB's Ready pods against its floor; the burst taint's effect and the guard's quarantine on
        every node."""
        ns = self.cfg.inference_namespace
        for pdb in self.policy.list_namespaced_pod_disruption_budget(ns).items:
            floor = pdb.spec.min_available
            if not isinstance(floor, int):
                continue  # a percentage: the stack's PDBs give counts
            selector = ",".join(f"{k}={v}" for k, v in (pdb.spec.selector.match_labels or {}).items())
            pods = self.core.list_namespaced_pod(ns, label_selector=selector).items
            ready = sum(1 for p in pods if p.metadata.deletion_timestamp is None and any(
                c.type == "Ready" and c.status == "True" for c in p.status.conditions or []))
            if ready < floor:
                self.record.below_floor += 1
                self.record.below_floor_seen[pdb.metadata.name] += 1
        burst = f"{self.cfg.label_prefix}/burst"
        at = time.time()
        for node in self.core.list_node().items:
            ours = [t for t in node.spec.taints or [] if t.key == burst]
            if any(t.effect == "NoExecute" for t in ours):
                self.record.no_execute += 1
            self.record.burst_taint.append((at, node.metadata.name, bool(ours)))
            quarantined = any(t.key == self.guard_names.taint for t in node.spec.taints or [])
            self.record.quarantine.append((at, node.metadata.name, quarantined))
        guard = self.agents.get("health-guard")
        if guard is not None:
            lease = self.coordination.read_namespaced_lease(guard.lease, guard.namespace)
            self.record.breaker.append((at, bool((lease.metadata.annotations or {}).get(self.guard_names.breaker))))
        self.record.samples += 1

    def _sampler(self, stop: threading.Event) -> None:
        while not stop.wait(1.0):
            try:
                self.sample()
            except Exception:  # the API server restarting: no sample this second
                self.record.sampler_errors += 1

    # ------------------------------------------------------------------ the run

    def run(self, on_fault: Callable[[Injection, float | None], None] | None = None) -> dict[str, Any]:
        """Whole first; then each fault at its time, waiting until whole after it; then the history check."""
        say(f"seed {self.seed}: {len(self.plan)} faults over {self.duration_s:g}s on agents {sorted(self.agents)}, "
            f"providers {sorted(self.providers)}, kubelets {list(self.kubelets)}")
        first = self.wait_whole(time.monotonic())
        if first is None:
            raise RuntimeError("the cluster is not whole before the first fault")
        began_wall = time.time()
        stop = threading.Event()
        sampler = threading.Thread(target=self._sampler, args=(stop,), name="sampler", daemon=True)
        sampler.start()
        try:
            if self.gang is not None:
                # The gang takes the real pool: inference hands over to the virtual nodes under the sampler's eye.
                self.gang.submit(self.duration_s, say)
                if self.wait_whole(time.monotonic()) is None:
                    raise RuntimeError(f"the cluster is not whole with {GANG} training")
            began = time.monotonic()
            for injection in self.plan:
                time.sleep(max(0.0, began + injection.at - time.monotonic()))
                say(f"t={injection.at:g}s {injection.fault} {injection.target}")
                at_wall = time.time()
                try:
                    seen = self.inject(injection)
                except Exception as exc:
                    say(f"could not inject {injection.fault} on {injection.target}: {exc}")
                    self.record.not_injected.append((injection, f"{type(exc).__name__}: {exc}"[:300]))
                    continue
                self.record.injected.append((at_wall, injection.fault, injection.target))
                injected = time.monotonic()
                if seen is not None and not self._seen(seen):
                    say(f"{injection.fault} on {injection.target} not seen within {OBSERVE_S:g}s")
                    self.record.unseen.append(injection)
                recovered = self.wait_whole(injected)
                self.record.recoveries.append((injection, recovered))
                if on_fault is not None:
                    on_fault(injection, recovered)
                if not_coming_back([r for _, r in self.record.recoveries]):
                    self.record.stopped_early = (f"stopped at t={injection.at:g}s: {STOP_AFTER_NOT_WHOLE} faults in a "
                                                 f"row left the cluster not whole; {'; '.join(self.problems()[:3])}")
                    say(self.record.stopped_early)
                    break
            else:
                time.sleep(max(0.0, began + self.duration_s - time.monotonic()))
        finally:
            stop.set()
            sampler.join(timeout=10)
        return self.report(began_wall, time.monotonic() - began)

    def _faulted(self) -> dict[str, int] | None:
        """The agents' calls each kind of network fault took (the proxy's count), or None without the proxy."""
        if not self.proxied:
            return None
        try:
            return {str(k): int(v) for k, v in apiproxy.state(self.lay).get("applied", {}).items()}
        except ClusterError as exc:  # the proxy stopped answering: the report says so
            say(f"network faults' counts not read: {exc}")
            return None

    def report(self, began_wall: float, elapsed_s: float) -> dict[str, Any]:
        torn: list[str] = []
        requests = parse_audit(self.lay.audit_log.read_text(), str(self.lay.audit_log), skipped=torn)
        # Every invariant the history check judges is listed, a zero included.
        violations: Counter[str] = Counter(dict.fromkeys((*AUDIT_INVARIANTS, *NODE_INVARIANTS), 0))
        record = self.record
        judged = [*audit_violations(requests, [(a.app, a.namespace, a.lease) for a in self.agents.values()],
                                    since=began_wall, gpu_faults=record.gpu_faults),
                  *node_violations(self.cfg, record.burst_taint, record.quarantine, record.gpu_faults, record.breaker)]
        violations.update(v.invariant for v in judged)
        details = [v.detail for v in judged]
        not_recovered = [i for i, r in self.record.recoveries if r is None]
        violations["not-whole-within-bound"] = len(not_recovered)
        violations["inference-below-pdb-floor"] = self.record.below_floor
        violations["burst-taint-no-execute"] = self.record.no_execute
        training: dict[str, Any] = {"training_steps_lost": None, "checkpoints_lost": None}
        if self.gang is not None and self.gang.submitted:
            self.gang.training()  # the events appended since the last read
            training = judge(self.gang.history, self.record.injected)
            violations.update(training.pop("violations"))
            details += training.pop("details")
        worst: dict[str, float] = {}
        for injection, recovered in self.record.recoveries:
            if recovered is not None:
                worst[injection.fault] = max(worst.get(injection.fault, 0.0), recovered)
        samples = self.record.samples
        return {
            "duration_s": round(elapsed_s, 1),
            "seed": self.seed,
            "every_s": self.every_s,
            "faults_by_kind": dict(sorted(Counter(i.fault.value for i, _ in self.record.recoveries).items())),
            "worst_recovery_s_by_kind": dict(sorted(worst.items())),
            "violations": dict(sorted(violations.items())),
            "violation_details": details[:50] + [f"{i.fault} on {i.target} at t={i.at:g}s: not whole"
                                                 for i in not_recovered],
            "inference_availability": round(1 - self.record.below_floor / samples, 5) if samples else None,
            "inference_samples": samples,
            "burst_taint_flips": len(taint_flips(self.record.burst_taint)),
            "stopped_early": self.record.stopped_early,
            "pdbs_below_floor": dict(self.record.below_floor_seen),
            "sampler_errors": self.record.sampler_errors,
            "audit_lines_unreadable": torn[:10],
            "api_calls_faulted": self._faulted(),
            "quarantines": sum(f.tainted for f in taint_flips(self.record.quarantine)),
            "operator_actions": dict(self.record.operator_actions),
            # Each GPU fault: served from start to clear, queryable from seen (None: Prometheus never showed it).
            "gpu_faults": [{"node": g.node, "start": round(g.start, 3), "seen": None if g.seen is None else
                            round(g.seen, 3), "clear": round(g.clear, 3)} for g in self.record.gpu_faults],
            **training,
            "faults_injected": [[round(t, 3), fault.value, target] for t, fault, target in self.record.injected],
            "faults_not_seen": [f"{i.fault} on {i.target} at t={i.at:g}s" for i in self.record.unseen],
            "faults_not_injected": [f"{i.fault} on {i.target} at t={i.at:g}s: {why}"
                                    for i, why in self.record.not_injected],
        }


def write_report(report: dict[str, Any], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")
