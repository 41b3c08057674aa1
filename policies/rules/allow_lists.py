"""The pack's exceptions, each with its reason: privileged agents and RBAC grants beyond least privilege.

Exceptions are keyed on what a workload cannot simply relabel. A label costs nothing to copy, so a
privileged agent is recognised by its namespace and service account (creating pods there, or binding that
account, is itself a privilege), and it gets exactly the capabilities and read-only host paths it needs;
anything beyond is refused. RBAC exceptions are keyed on the role or binding and list each grant.

The namespace of an agent and the names of per-provider roles come from the stack config
(:meth:`policies.rules.core.RuleContext.from_config`), so the lists hold roles, not one stack's names.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from components.config import PROJECT


@dataclass(frozen=True)
class PrivilegedAgent:
    """One pod identity allowed more than the restricted profile, and exactly what it gets."""

    name: str
    namespace: str
    service_account: str
    reason: str
    #: Capabilities it may add (without the ``CAP_`` prefix).
    capabilities: frozenset[str] = frozenset()
    #: hostPath volumes it may mount, read-only, by exact path.
    host_paths: frozenset[str] = frozenset()
    #: Whether it may run as root (uid 0).
    run_as_root: bool = False


def privileged_agents(telemetry_namespace: str,
                      pod_resources_dir: str = "/var/lib/kubelet/pod-resources") -> tuple[PrivilegedAgent, ...]:
    """The platform's privileged agents, in the telemetry namespace (``telemetryNamespace``): the one namespace
    whose Pod Security level admits them, apart from the controllers (the same identity elsewhere is refused).
    dcgm-exporter may mount the kubelet's pod-resources directory where the stack says it is (``kubeletRootDir``),
    and nothing else of the host."""
    return (
        PrivilegedAgent(
            name="dcgm-exporter", namespace=telemetry_namespace, service_account="dcgm-exporter",
            capabilities=frozenset({"SYS_ADMIN"}), host_paths=frozenset({pod_resources_dir}),
            run_as_root=True,
            reason="DCGM's profiling fields (tensor and SM activity) need CAP_SYS_ADMIN and its host engine runs as "
                   "root; the kubelet's pod-resources socket maps GPUs to pods",
        ),
        PrivilegedAgent(
            name="ib-exporter", namespace=telemetry_namespace, service_account="ib-exporter",
            host_paths=frozenset({"/sys"}),
            reason="InfiniBand port and hardware counters are read from the host's /sys/class/infiniband",
        ),
    )


@dataclass(frozen=True)
class RbacException:
    """Grants one role (``kind``, ``name``, namespace or '' for cluster scope) may hold despite the RBAC rules.

    ``grants`` are ``(resource, verb)`` pairs (``secrets``/``get``); ``role_refs`` are roles a binding may
    reference (``admin``). Only what is listed is excepted.
    """

    kind: str
    name: str
    reason: str
    namespace: str = ""
    grants: frozenset[tuple[str, str]] = frozenset()
    role_refs: frozenset[str] = frozenset()


#: Secret reads a virtual-kubelet provider needs at cluster scope: its informer's (it reads through the cache).
PROVIDER_SECRET_READS = frozenset({("secrets", "list"), ("secrets", "watch")})


#: The ClusterRoles Volcano's chart renders for release ``volcano`` (components/gang_scheduler.py): the gang
#: scheduler and the job controller act on pods wherever training and inference run.
VOLCANO_RBAC_EXCEPTIONS = (
    RbacException(
        kind="ClusterRole", name="volcano-scheduler",
        grants=frozenset({("pods/binding", "create"), ("pods/status", "update"), ("pods", "patch"),
                          ("pods", "delete")}),
        reason="the gang scheduler binds every pod it places, records why a gang waits, and evicts the victims of "
               "preempt and reclaim, in whichever namespace training and inference pods run",
    ),
    RbacException(
        kind="ClusterRole", name="volcano-controllers",
        grants=frozenset({("pods", "create"), ("pods", "update"), ("pods", "patch"), ("pods", "delete"),
                          ("pods/finalizers", "update"), ("pods/finalizers", "patch"), ("secrets", "get"),
                          ("secrets", "create"), ("secrets", "update"), ("secrets", "delete")}),
        reason="the job controller creates, restarts and deletes the pods of Volcano Jobs in the namespaces they are "
               "submitted to, and its ssh plugin keeps each job's key pair in a Secret there",
    ),
)


def rbac_exceptions(provider_names: Iterable[str]) -> tuple[RbacException, ...]:
    """The RBAC exceptions of a stack: each external provider's virtual kubelet reads Secrets cluster-wide, and
    Volcano's scheduler and job controller write pods (and the controller its jobs' Secrets) cluster-wide."""
    return tuple(
        RbacException(
            kind="ClusterRole", name=f"{PROJECT}:vk-{name}", grants=PROVIDER_SECRET_READS,
            reason="a virtual kubelet resolves the Secrets its pods reference (env, volumes, image pull secrets) "
                   "in whichever namespace those pods run, and watches them to keep the remote copies current",
        )
        for name in provider_names
    ) + VOLCANO_RBAC_EXCEPTIONS


def capability(name: str) -> str:
    """A capability as the allow-list spells it: upper case, without ``CAP_`` (the kernel accepts both)."""
    upper = name.strip().upper()
    return upper.removeprefix("CAP_")
