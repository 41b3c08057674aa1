"""Which fault, on what, when: a seeded draw, so a run that found a defect is replayed by its seed (pure)."""

from __future__ import annotations

import enum
import random
from collections.abc import Sequence
from dataclasses import dataclass


class Fault(enum.StrEnum):
    """The faults the soak injects, one every period."""

    LEADER_DELETED = "leader-deleted"  # the pod holding an HA agent's Lease is deleted
    LEADER_KILLED = "leader-killed"  # its process is SIGKILLed in its container
    LEADER_FROZEN = "leader-frozen"  # SIGSTOP past its Lease, then SIGCONT
    PROVIDER_KILLED = "virtual-kubelet-killed"  # a provider's virtual kubelet SIGKILLed in its container
    APISERVER_RESTARTED = "apiserver-restarted"
    ETCD_KILLED = "etcd-killed"  # SIGKILL, then started again on its data
    CONTROLLER_MANAGER_RESTARTED = "controller-manager-restarted"
    VOLCANO_SCHEDULER_RESTARTED = "volcano-scheduler-restarted"
    VOLCANO_CONTROLLERS_RESTARTED = "volcano-controllers-restarted"
    KUBELET_RESTARTED = "kubelet-restarted"
    PROMETHEUS_KILLED = "prometheus-killed"  # Prometheus or its operator SIGKILLed in its container
    KUBE_ROUTER_KILLED = "kube-router-killed"  # SIGKILL, then started again: its NetworkPolicy chains rebuilt
    # On our agents' path to the API server (tools/localcluster/apiproxy.py), for a window:
    API_LATENCY = "api-latency"  # every call answered late
    API_THROTTLED = "api-429"  # a share of calls answered 429 Too Many Requests
    API_ERRORS = "api-5xx"  # a share answered 503
    API_RESET = "api-reset"  # a share of connections reset, no answer
    API_HANG = "api-hang"  # a share of calls never answered
    # On the soak's training gang (the target is a rank):
    TRAINER_KILLED = "trainer-killed"  # the rank's worker SIGKILLed under its supervisor: a restart in place
    TRAINER_POD_KILLED = "trainer-pod-killed"  # the rank's container SIGKILLed: Volcano restarts the gang
    TRAINER_EVICTED = "trainer-evicted"  # the rank's pod evicted: an emergency checkpoint, the pod replaced alone
    # On a real GPU node (the target), through its dcgm-exporter stand-in, for a window:
    GPU_DEGRADED = "gpu-xid-degraded"  # XID 94 (contained ECC error): the guard quarantines the node, then releases it
    # XID 79 (the GPU fell off the bus): its rank's worker dies with it, the guard quarantines the node as fatal and
    # evicts what runs there, the gang's pod is replaced on the spare; released after the repair mark. Not drawn on
    # its own: every other GPU fault drawn is this one (:func:`schedule`).
    GPU_FATAL = "gpu-xid-fatal"


#: Faults aimed at one HA agent (the target is its app name).
AGENT_FAULTS = (Fault.LEADER_DELETED, Fault.LEADER_KILLED, Fault.LEADER_FROZEN)
#: Faults on one control-plane process (the target is the process's name in the local cluster).
PROCESS_OF = {
    Fault.APISERVER_RESTARTED: "kube-apiserver",
    Fault.ETCD_KILLED: "etcd",
    Fault.CONTROLLER_MANAGER_RESTARTED: "kube-controller-manager",
    Fault.VOLCANO_SCHEDULER_RESTARTED: "vc-scheduler",
    Fault.VOLCANO_CONTROLLERS_RESTARTED: "vc-controller-manager",
    Fault.KUBE_ROUTER_KILLED: "kube-router",
}
#: Process faults that SIGKILL before the restart (the others stop it as an operator would).
KILLED = frozenset({Fault.ETCD_KILLED, Fault.KUBE_ROUTER_KILLED})
#: Faults on the agents' path to the API server (the target is the proxy).
NETWORK_FAULTS = (Fault.API_LATENCY, Fault.API_THROTTLED, Fault.API_ERRORS, Fault.API_RESET, Fault.API_HANG)
#: Faults on the training gang (the target is a rank).
TRAINING_FAULTS = (Fault.TRAINER_KILLED, Fault.TRAINER_POD_KILLED, Fault.TRAINER_EVICTED)
#: Faults a GPU node's dcgm-exporter serves (the target is the node).
GPU_FAULTS = (Fault.GPU_DEGRADED, Fault.GPU_FATAL)


@dataclass(frozen=True)
class Injection:
    #: Seconds from the start of the soak.
    at: float
    fault: Fault
    #: The agent, provider app, process or node it hits.
    target: str


def schedule(seed: int, duration_s: float, every_s: float, agents: Sequence[str], providers: Sequence[str],
             kubelets: Sequence[str], kinds: Sequence[Fault] = tuple(Fault),
             monitoring: Sequence[str] = (), network: Sequence[str] = (), ranks: Sequence[str] = (),
             gpus: Sequence[str] = ()) -> list[Injection]:
    """One fault every ``every_s`` from ``every_s`` on, while the soak lasts; kind and target drawn with ``seed``
    among those that have a target here (no agent: no agent faults; ``monitoring``: the apps of the Prometheus
    install the guard reads; ``network``: the proxy in front of the API server, where the cluster has one;
    ``ranks``: the training gang's, where one trains; ``gpus``: the GPU nodes whose dcgm-exporter can be told to
    serve a fault)."""
    if every_s <= 0:
        raise ValueError(f"every_s must be positive, got {every_s}")
    targets: dict[Fault, Sequence[str]] = {f: agents for f in AGENT_FAULTS}
    targets[Fault.PROVIDER_KILLED] = providers
    targets[Fault.KUBELET_RESTARTED] = kubelets
    targets[Fault.PROMETHEUS_KILLED] = monitoring
    targets.update({f: network for f in NETWORK_FAULTS})
    targets.update({f: ranks for f in TRAINING_FAULTS})
    targets[Fault.GPU_DEGRADED] = targets[Fault.GPU_FATAL] = gpus
    targets.update({f: (process,) for f, process in PROCESS_OF.items()})
    # The fatal GPU fault is the degraded one's alternate, not a kind of its own in the draw: a seed's plan stays
    # the plan it was before the fatal fault existed (the same kinds, targets and times), except that every second
    # GPU fault is fatal; drawn on its own only where the degraded one is not asked for.
    alternate = Fault.GPU_FATAL in kinds and Fault.GPU_DEGRADED in kinds
    usable = [k for k in kinds if targets.get(k) and not (alternate and k is Fault.GPU_FATAL)]
    if not usable:
        raise ValueError("no fault kind has a target in this cluster")
    rng = random.Random(seed)
    out: list[Injection] = []
    n = gpu_faults = 1
    while (at := every_s * n) < duration_s:  # a product, not a sum: no drift over a long soak
        fault = rng.choice(usable)
        target = rng.choice(list(targets[fault]))
        if alternate and fault is Fault.GPU_DEGRADED:
            fault = Fault.GPU_FATAL if gpu_faults % 2 == 0 else fault
            gpu_faults += 1
        out.append(Injection(at, fault, target))
        n += 1
    return out
