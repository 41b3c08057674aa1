"""The cluster's settings published in the cluster, as a Pulumi component: the ConfigMap the researcher CLI
reads, the Role its users need and one RoleBinding per team.

The settings model and its JSON live in ``components.published_settings`` (no Pulumi), shared with the CLI;
they are re-exported here.
"""

from __future__ import annotations

from typing import Any, cast

import pulumi
import pulumi_kubernetes as k8s

from components.config import ClusterConfig, Team
from components.naming import common_labels
from components.published_settings import (
    SETTINGS_CONFIGMAP,
    SETTINGS_KEY,
    SETTINGS_VERSION,
    CheckpointClaim,
    ClusterSettings,
    PoolSettings,
    cluster_settings,
    parse_settings,
    settings_json,
)

__all__ = [
    "RESEARCHER_ROLE",
    "SETTINGS_CONFIGMAP",
    "SETTINGS_KEY",
    "SETTINGS_VERSION",
    "CheckpointClaim",
    "ClusterSettings",
    "ClusterSettingsMap",
    "PoolSettings",
    "cluster_settings",
    "parse_settings",
    "researcher_rules",
    "settings_json",
    "team_binding_name",
]


#: The Role researchers are bound to (one RoleBinding per team's Group): exactly what ``gpucluster`` calls.
RESEARCHER_ROLE = "gpucluster-researcher"


def researcher_rules() -> list[dict[str, list[str]]]:
    """Submit, watch and cancel training in the namespace; nothing cluster-wide, no Secrets.

    Server-side apply of a new object needs ``create`` besides ``patch``. ``pods/proxy`` reads the rank-0
    worker's metrics for the last checkpoint step (it reaches any port of the namespace's pods: training
    pods only, whose metrics the team can see in Grafana anyway).
    """
    return [
        {"apiGroups": [""], "resources": ["configmaps"], "resourceNames": [SETTINGS_CONFIGMAP], "verbs": ["get"]},
        {"apiGroups": ["batch.volcano.sh"], "resources": ["jobs"],
         "verbs": ["get", "list", "watch", "create", "patch", "delete"]},
        {"apiGroups": ["monitoring.coreos.com"], "resources": ["podmonitors"],
         "verbs": ["get", "create", "patch", "delete"]},
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]},
        {"apiGroups": [""], "resources": ["pods/log", "pods/proxy"], "verbs": ["get"]},
    ]


def team_binding_name(team: Team) -> str:
    return f"{RESEARCHER_ROLE}-{team.name}"


class ClusterSettingsMap(pulumi.ComponentResource):
    """The CLI's footing in the cluster: the settings ConfigMap it reads, the Role its users need, and one
    RoleBinding per team (``scheduling.teams``) giving the team's Group that Role in the training namespace.
    """

    config_map: k8s.core.v1.ConfigMap
    role: k8s.rbac.v1.Role
    bindings: list[k8s.rbac.v1.RoleBinding]

    def __init__(self, name: str, cfg: ClusterConfig, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("gpu-cluster:training:ClusterSettings", name, None, opts)
        self.config_map = k8s.core.v1.ConfigMap(
            f"{name}-configmap",
            metadata=k8s.meta.v1.ObjectMetaArgs(
                name=SETTINGS_CONFIGMAP, namespace=cfg.training_namespace,
                labels=common_labels(SETTINGS_CONFIGMAP, "cluster-settings"),
            ),
            data={SETTINGS_KEY: settings_json(cluster_settings(cfg))},
            opts=pulumi.ResourceOptions(parent=self),
        )
        self.role = k8s.rbac.v1.Role(
            f"{name}-researcher-role",
            metadata=k8s.meta.v1.ObjectMetaArgs(
                name=RESEARCHER_ROLE, namespace=cfg.training_namespace,
                labels=common_labels(RESEARCHER_ROLE, "researcher-access"),
            ),
            rules=cast(Any, researcher_rules()),
            opts=pulumi.ResourceOptions(parent=self),
        )
        self.bindings = [
            k8s.rbac.v1.RoleBinding(
                f"{name}-team-{team.name}",
                metadata=k8s.meta.v1.ObjectMetaArgs(
                    name=team_binding_name(team), namespace=cfg.training_namespace,
                    labels=common_labels(team_binding_name(team), "researcher-access"),
                ),
                role_ref=k8s.rbac.v1.RoleRefArgs(api_group="rbac.authorization.k8s.io", kind="Role",
                                                 name=RESEARCHER_ROLE),
                subjects=[k8s.rbac.v1.SubjectArgs(api_group="rbac.authorization.k8s.io", kind="Group",
                                                  name=team.subject_group)],
                opts=pulumi.ResourceOptions(parent=self, depends_on=[self.role]),
            )
            for team in cfg.scheduling.teams
        ]
        self.register_outputs({"name": SETTINGS_CONFIGMAP})
