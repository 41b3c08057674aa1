"""Pod and container security defaults: restricted Pod Security for our own pods.

Exceptions are named, never implied: :data:`PRIVILEGE_ALLOW_LIST` lists each component that needs
more than the restricted profile and exactly what it gets. The policy pack reads the same list.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pulumi_kubernetes as k8s

#: component name -> the one privilege it needs and why.
PRIVILEGE_ALLOW_LIST: dict[str, str] = {
    "dcgm-exporter": "capability SYS_ADMIN for DCGM profiling fields (tensor/SM activity); runs as root",
    "ib-exporter": "read-only hostPath /sys for InfiniBand counters",
}

RUN_AS_USER = 65532

#: checkov reads per-object skips from annotations with this prefix (``checkov.io/skip1`` …), each valued
#: ``<CHECK_ID>=<reason>``. A skip on one object leaves the check on for every other object.
CHECKOV_SKIP_PREFIX = "checkov.io/skip"

#: Why controllers keep their ServiceAccount token (checkov CKV_K8S_38); their RBAC lists exactly what they call.
API_CLIENT = "a controller that calls the Kubernetes API with its ServiceAccount token; its RBAC lists what it calls"


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


def checkov_skips(reasons: Mapping[str, str]) -> dict[str, str]:
    """Annotations that skip the named checkov checks on one object only, each with its reason.

    Narrower than a global skip in ``.checkov.yaml``: the same finding on any other object still fails.
    checkov splits the value at ``=``, so a reason must not contain one.
    """
    out: dict[str, str] = {}
    for index, (check, reason) in enumerate(sorted(reasons.items()), start=1):
        if "=" in reason or len(reason.strip()) < 20:
            raise ValueError(f"checkov skip {check}: give a reason of 20+ characters without '=' (got {reason!r})")
        out[f"{CHECKOV_SKIP_PREFIX}{index}"] = f"{check}={reason}"
    return out


def resources(cpu: str, memory: str, cpu_limit: str | None = None) -> k8s.core.v1.ResourceRequirementsArgs:
    """Requests equal limits for memory (no OOM surprises); CPU limit optional."""
    limits = {"memory": memory}
    if cpu_limit:
        limits["cpu"] = cpu_limit
    return k8s.core.v1.ResourceRequirementsArgs(requests={"cpu": cpu, "memory": memory}, limits=limits)
