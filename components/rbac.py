"""RBAC building blocks: a pod's ServiceAccount, and rules granted to it through a role and its binding.

Every component that runs a pod against the API server declares the same objects: a ServiceAccount,
a ClusterRole with its ClusterRoleBinding, and often a Role with its RoleBinding in one namespace.
Spelling them once keeps each binding's ``roleRef`` equal to its role's name, its subject equal to the
ServiceAccount, and makes every binding wait for its role and the account it names.

The Pulumi logical names (``role_resource``/``binding_resource``, and ``<name>-sa`` for accounts) are
given by the callers and never derived from the Kubernetes names: they are part of each object's URN,
and a renamed one makes ``pulumi up`` delete and recreate a live RBAC object, leaving the agent
forbidden in between.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import NamedTuple

import pulumi
import pulumi_kubernetes as k8s

RBAC_API_GROUP = "rbac.authorization.k8s.io"
Rule = k8s.rbac.v1.PolicyRuleArgs


def lease_rules(lease_name: str) -> tuple[Rule, ...]:
    """An agent's Lease: create any (RBAC cannot scope create by name), read, watch and renew only its own (a list
    or watch with ``fieldSelector=metadata.name=<lease>`` is authorized by resource name)."""
    return (
        Rule(api_groups=["coordination.k8s.io"], resources=["leases"], verbs=["create"]),
        Rule(api_groups=["coordination.k8s.io"], resources=["leases"], resource_names=[lease_name],
             verbs=["get", "list", "watch", "update"]),
    )


class Account(NamedTuple):
    """A ServiceAccount and the subject that names it in bindings."""

    service_account: k8s.core.v1.ServiceAccount
    subject: k8s.rbac.v1.SubjectArgs


class ClusterGrant(NamedTuple):
    role: k8s.rbac.v1.ClusterRole
    binding: k8s.rbac.v1.ClusterRoleBinding


class NamespacedGrant(NamedTuple):
    role: k8s.rbac.v1.Role
    binding: k8s.rbac.v1.RoleBinding


def service_account(
    name: str,
    namespace: str,
    labels: Mapping[str, str],
    parent: pulumi.Resource,
    *,
    automount_token: bool | None = None,
) -> Account:
    """The ServiceAccount ``name`` (logical name ``<name>-sa``) and its binding subject.

    ``automount_token=False`` for pods that never call the API server (exporters): no token in the pod.
    """
    account = k8s.core.v1.ServiceAccount(
        f"{name}-sa",
        metadata=k8s.meta.v1.ObjectMetaArgs(name=name, namespace=namespace, labels=labels),
        automount_service_account_token=automount_token,
        opts=pulumi.ResourceOptions(parent=parent),
    )
    return Account(account, k8s.rbac.v1.SubjectArgs(kind="ServiceAccount", name=name, namespace=namespace))


def bind_cluster_role(
    resource_name: str,
    *,
    name: str,
    role: str,
    subject: k8s.rbac.v1.SubjectArgs,
    labels: Mapping[str, str],
    parent: pulumi.Resource,
    depends_on: Sequence[pulumi.Resource],
) -> k8s.rbac.v1.ClusterRoleBinding:
    """A ClusterRoleBinding ``name`` of ClusterRole ``role`` (ours or a built-in) to one subject."""
    return k8s.rbac.v1.ClusterRoleBinding(
        resource_name,
        metadata=k8s.meta.v1.ObjectMetaArgs(name=name, labels=labels),
        role_ref=k8s.rbac.v1.RoleRefArgs(api_group=RBAC_API_GROUP, kind="ClusterRole", name=role),
        subjects=[subject],
        opts=pulumi.ResourceOptions(parent=parent, depends_on=list(depends_on)),
    )


def bind_role(
    resource_name: str,
    *,
    name: str,
    namespace: str,
    role: str,
    subject: k8s.rbac.v1.SubjectArgs,
    labels: Mapping[str, str],
    parent: pulumi.Resource,
    depends_on: Sequence[pulumi.Resource],
    annotations: Mapping[str, str] | None = None,
) -> k8s.rbac.v1.RoleBinding:
    """A RoleBinding ``name`` in ``namespace`` of Role ``role`` (ours or a built-in) to one subject."""
    return k8s.rbac.v1.RoleBinding(
        resource_name,
        metadata=k8s.meta.v1.ObjectMetaArgs(name=name, namespace=namespace, labels=labels, annotations=annotations),
        role_ref=k8s.rbac.v1.RoleRefArgs(api_group=RBAC_API_GROUP, kind="Role", name=role),
        subjects=[subject],
        opts=pulumi.ResourceOptions(parent=parent, depends_on=list(depends_on)),
    )


def cluster_role_with_binding(
    role_resource: str,
    binding_resource: str,
    *,
    name: str,
    rules: Sequence[Rule],
    subject: k8s.rbac.v1.SubjectArgs,
    labels: Mapping[str, str],
    parent: pulumi.Resource,
    depends_on: Sequence[pulumi.Resource] = (),
) -> ClusterGrant:
    """ClusterRole ``name`` with ``rules`` and the same-named binding to ``subject``.

    The binding waits for the role and for ``depends_on`` (the subject's ServiceAccount).
    """
    role = k8s.rbac.v1.ClusterRole(
        role_resource,
        metadata=k8s.meta.v1.ObjectMetaArgs(name=name, labels=labels),
        rules=list(rules),
        opts=pulumi.ResourceOptions(parent=parent),
    )
    binding = bind_cluster_role(
        binding_resource, name=name, role=name, subject=subject, labels=labels, parent=parent,
        depends_on=[role, *depends_on],
    )
    return ClusterGrant(role, binding)


def namespaced_role_with_binding(
    role_resource: str,
    binding_resource: str,
    *,
    name: str,
    namespace: str,
    rules: Sequence[Rule],
    subject: k8s.rbac.v1.SubjectArgs,
    labels: Mapping[str, str],
    parent: pulumi.Resource,
    depends_on: Sequence[pulumi.Resource] = (),
    annotations: Mapping[str, str] | None = None,
) -> NamespacedGrant:
    """Role ``name`` in ``namespace`` with ``rules`` and the same-named binding to ``subject``.

    ``annotations`` (checkov skips, for instance) go on both objects. The binding waits for the role and
    for ``depends_on``.
    """
    role = k8s.rbac.v1.Role(
        role_resource,
        metadata=k8s.meta.v1.ObjectMetaArgs(name=name, namespace=namespace, labels=labels, annotations=annotations),
        rules=list(rules),
        opts=pulumi.ResourceOptions(parent=parent),
    )
    binding = bind_role(
        binding_resource, name=name, namespace=namespace, role=name, subject=subject, labels=labels,
        parent=parent, depends_on=[role, *depends_on], annotations=annotations,
    )
    return NamespacedGrant(role, binding)
