"""In-cluster admission: whether the stack adds the training defaults by MutatingAdmissionPolicy or only refuses.

ValidatingAdmissionPolicy (admissionregistration.k8s.io/v1) is GA from Kubernetes 1.30 and always declared
there. MutatingAdmissionPolicy is alpha in 1.32–1.33 (v1alpha1), beta in 1.34–1.35 (v1beta1, off by default:
the API server needs the ``MutatingAdmissionPolicy`` feature gate and
``--runtime-config=admissionregistration.k8s.io/v1beta1=true``) and GA, on by default, from 1.36 (v1).
"""

from __future__ import annotations

from enum import StrEnum
from typing import TYPE_CHECKING

from pydantic import Field

from components.config.base import ConfigModel, DnsLabel, Problem

if TYPE_CHECKING:
    from components.config.cluster import ClusterConfig

#: First Kubernetes version that serves each MutatingAdmissionPolicy API version the stack can declare.
MUTATING_V1BETA1 = (1, 34)
MUTATING_V1 = (1, 36)


class MutatingMode(StrEnum):
    #: v1 where ``kubernetesVersion`` serves it by default (1.36+); below, refuse only.
    AUTO = "auto"
    #: v1beta1, for a 1.34/1.35 API server that enables the beta (feature gate and runtime-config).
    V1BETA1 = "v1beta1"
    #: Refuse only: never add the priority class or gate.
    OFF = "off"


class Admission(ConfigModel):
    mutating: MutatingMode = MutatingMode.AUTO
    """Whether a MutatingAdmissionPolicy adds the training priority class and the handover gate to Volcano Jobs
    that lack them: `auto` declares v1 where `kubernetesVersion` serves it (1.36+) and only refuses below;
    `v1beta1` for a 1.34/1.35 API server with the beta enabled; `off` only refuses."""
    gang_scheduler_namespaces: list[DnsLabel] = Field(default_factory=list)
    """Namespaces beyond training and inference whose GPU pods must also use the gang scheduler (a second
    scheduler double-books the GPUs they share). Not cluster-wide by default: other software's GPU pods (the GPU
    operator's validators) use the default scheduler in their own namespaces."""

    def mutating_api(self, k8s_minor: tuple[int, int]) -> str | None:
        """The MutatingAdmissionPolicy apiVersion to declare, or None to validate only."""
        if self.mutating is MutatingMode.V1BETA1:
            return "admissionregistration.k8s.io/v1beta1"
        if self.mutating is MutatingMode.AUTO and k8s_minor >= MUTATING_V1:
            return "admissionregistration.k8s.io/v1"
        return None


def admission_problems(cfg: ClusterConfig) -> list[Problem]:
    """v1beta1 policies exist from Kubernetes 1.34 on."""
    if cfg.admission.mutating is MutatingMode.V1BETA1 and cfg.k8s_minor < MUTATING_V1BETA1:
        return [Problem("admission.mutating", "v1beta1 MutatingAdmissionPolicy is served from Kubernetes 1.34 "
                        f"(behind a feature gate), but kubernetesVersion is {cfg.kubernetes_version}; use 'auto' or "
                        "'off' (validate only)", cfg.admission.mutating.value)]
    return []
