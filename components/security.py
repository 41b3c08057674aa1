"""Pod and container security defaults: restricted Pod Security for our own pods.

Exceptions are named, never implied: :data:`PRIVILEGE_ALLOW_LIST` lists each component that needs
more than the restricted profile and exactly what it gets. The policy pack reads the same list.
"""

from __future__ import annotations

from typing import Any

import pulumi_kubernetes as k8s

#: component name -> the one privilege it needs and why.
PRIVILEGE_ALLOW_LIST: dict[str, str] = {
    "dcgm-exporter": "capability SYS_ADMIN for DCGM profiling fields (tensor/SM activity); runs as root",
    "ib-exporter": "read-only hostPath /sys for InfiniBand counters",
}

RUN_AS_USER = 65532


def pod_security_context(**overrides: Any) -> k8s.core.v1.PodSecurityContextArgs:
    args: dict[str, Any] = {
        "run_as_non_root": True,
        "run_as_user": RUN_AS_USER,
        "run_as_group": RUN_AS_USER,
        "fs_group": RUN_AS_USER,
        "seccomp_profile": k8s.core.v1.SeccompProfileArgs(type="RuntimeDefault"),
    }
    args.update(overrides)
    return k8s.core.v1.PodSecurityContextArgs(**args)


def container_security_context(**overrides: Any) -> k8s.core.v1.SecurityContextArgs:
    args: dict[str, Any] = {
        "allow_privilege_escalation": False,
        "read_only_root_filesystem": True,
        "run_as_non_root": True,
        "privileged": False,
        "capabilities": k8s.core.v1.CapabilitiesArgs(drop=["ALL"]),
        "seccomp_profile": k8s.core.v1.SeccompProfileArgs(type="RuntimeDefault"),
    }
    args.update(overrides)
    return k8s.core.v1.SecurityContextArgs(**args)


def resources(cpu: str, memory: str, cpu_limit: str | None = None) -> k8s.core.v1.ResourceRequirementsArgs:
    """Requests equal limits for memory (no OOM surprises); CPU limit optional."""
    limits = {"memory": memory}
    if cpu_limit:
        limits["cpu"] = cpu_limit
    return k8s.core.v1.ResourceRequirementsArgs(requests={"cpu": cpu, "memory": memory}, limits=limits)
