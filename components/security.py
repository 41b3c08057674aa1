"""Pod and container security defaults: restricted Pod Security for our own pods.

Exceptions are named, never implied: :func:`policies.rules.allow_lists.privileged_agents` lists each agent
that needs more than the restricted profile and exactly what it gets; the policy pack enforces that list.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pulumi
import pulumi_kubernetes as k8s

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


#: Ephemeral storage of an agent's container: its logs (the kubelet rotates them at 5 × 10 MiB by default) and
#: its size-limited emptyDir scratch. A limit keeps one noisy container from filling the node's disk (the
#: kubelet evicts it instead); the request lets the scheduler count it.
EPHEMERAL_REQUEST = "64Mi"
EPHEMERAL_LIMIT = "256Mi"
#: The size limit of a scratch emptyDir (``/tmp``) in our agents.
SCRATCH_LIMIT = "64Mi"


def resources(cpu: str, memory: str, cpu_limit: str | None = None, *, ephemeral: str = EPHEMERAL_REQUEST,
              ephemeral_limit: str = EPHEMERAL_LIMIT) -> k8s.core.v1.ResourceRequirementsArgs:
    """Requests equal limits for memory (no OOM surprises); CPU limit optional; ephemeral storage bounded."""
    limits = {"memory": memory, "ephemeral-storage": ephemeral_limit}
    if cpu_limit:
        limits["cpu"] = cpu_limit
    return k8s.core.v1.ResourceRequirementsArgs(
        requests={"cpu": cpu, "memory": memory, "ephemeral-storage": ephemeral}, limits=limits)


def with_ephemeral_storage(res: k8s.core.v1.ResourceRequirementsArgs, request: str,
                           limit: str) -> k8s.core.v1.ResourceRequirementsArgs:
    """``res`` with an ephemeral-storage request and limit added (GPU workloads build theirs elsewhere)."""
    requests = dict(res.requests or {})  # type: ignore[arg-type]
    limits = dict(res.limits or {})  # type: ignore[arg-type]
    requests["ephemeral-storage"] = request
    limits["ephemeral-storage"] = limit
    return k8s.core.v1.ResourceRequirementsArgs(requests=requests, limits=limits)


def scratch_volume(name: str = "tmp", size_limit: str = SCRATCH_LIMIT) -> k8s.core.v1.VolumeArgs:
    """A size-limited emptyDir: past its limit the kubelet evicts the pod instead of filling the node's disk."""
    return k8s.core.v1.VolumeArgs(name=name, empty_dir=k8s.core.v1.EmptyDirVolumeSourceArgs(size_limit=size_limit))


#: kube-score reads per-object ignores from this annotation: a comma-separated list of its check names.
KUBE_SCORE_IGNORE = "kube-score/ignore"


def kube_score_ignores(reasons: Mapping[str, str]) -> dict[str, str]:
    """The annotation that makes kube-score skip the named checks on one object only.

    The annotation holds names only; each reason stays beside the call (and tests/test_kube_score.py lists
    every per-object ignore of the rendered stack with the check it silences).
    """
    for check, reason in reasons.items():
        if len(reason.strip()) < 20:
            raise ValueError(f"kube-score ignore {check}: give a reason of 20+ characters (got {reason!r})")
    return {KUBE_SCORE_IGNORE: ",".join(sorted(reasons))}


#: cert-manager's CA injector fills an APIService's (or webhook's) caBundle from the Certificate named here.
CERT_MANAGER_INJECT = "cert-manager.io/inject-ca-from"
CERT_MANAGER_API = "cert-manager.io/v1"


def serving_certificate(parent: pulumi.Resource, app: str, namespace: str, dns_names: list[str],
                        labels: Mapping[str, str]) -> tuple[str, k8s.apiextensions.CustomResource, dict[str, str]]:
    """A serving certificate from a CA the stack manages through cert-manager: ``(secret, certificate,
    annotations)``, where the annotations make cert-manager inject that CA into an APIService's caBundle.

    The chain is cert-manager's bootstrap pattern, all in ``namespace``: a self-signed Issuer signs the CA
    Certificate ``<app>-ca``, a CA Issuer ``<app>-ca`` holds it, and it signs ``<app>-serving`` (Secret
    ``<app>-serving-cert`` with ``tls.crt``/``tls.key``/``ca.crt``). cert-manager renews both before expiry and the
    injector follows. The stack assumes cert-manager (its CRDs and CA injector) is installed; the Pulumi TLS
    provider, which would keep the key in state instead, is not among this project's providers.
    """
    meta = k8s.meta.v1.ObjectMetaArgs
    child = pulumi.ResourceOptions(parent=parent)

    def resource(kind: str, name: str, spec: dict[str, Any],
                 depends_on: list[pulumi.Resource]) -> k8s.apiextensions.CustomResource:
        return k8s.apiextensions.CustomResource(
            f"{name}-{kind.lower()}", api_version=CERT_MANAGER_API, kind=kind,
            metadata=meta(name=name, namespace=namespace, labels=dict(labels)), spec=spec,
            opts=pulumi.ResourceOptions(parent=parent, depends_on=depends_on) if depends_on else child)

    bootstrap = resource("Issuer", f"{app}-selfsigned", {"selfSigned": {}}, [])
    ca = resource("Certificate", f"{app}-ca", {
        "isCA": True, "commonName": f"{app}-ca", "secretName": f"{app}-ca",
        "duration": "87600h", "renewBefore": "720h",
        "privateKey": {"algorithm": "ECDSA", "size": 256},
        "issuerRef": {"name": f"{app}-selfsigned", "kind": "Issuer", "group": "cert-manager.io"},
    }, [bootstrap])
    issuer = resource("Issuer", f"{app}-ca", {"ca": {"secretName": f"{app}-ca"}}, [ca])
    secret = f"{app}-serving-cert"
    serving = resource("Certificate", f"{app}-serving", {
        "secretName": secret, "dnsNames": dns_names, "duration": "2160h", "renewBefore": "360h",
        "privateKey": {"algorithm": "ECDSA", "size": 256, "rotationPolicy": "Always"},
        "usages": ["server auth", "digital signature", "key encipherment"],
        "issuerRef": {"name": f"{app}-ca", "kind": "Issuer", "group": "cert-manager.io"},
    }, [issuer])
    return secret, serving, {CERT_MANAGER_INJECT: f"{namespace}/{app}-serving"}
