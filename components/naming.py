"""Common labels, derived selector labels and the label/taint keys every component agrees on."""

from __future__ import annotations

from dataclasses import dataclass

PART_OF = "unified-gpu-cluster"
MANAGED_BY = "pulumi"


def common_labels(name: str, component: str, version: str = "") -> dict[str, str]:
    """``app.kubernetes.io/*`` labels for every object a component creates."""
    labels = {
        "app.kubernetes.io/name": name,
        "app.kubernetes.io/component": component,
        "app.kubernetes.io/part-of": PART_OF,
        "app.kubernetes.io/managed-by": MANAGED_BY,
    }
    if version:
        labels["app.kubernetes.io/version"] = version
    return labels


def selector_labels(labels: dict[str, str]) -> dict[str, str]:
    """The stable subset used in selectors: a version bump must not orphan pods."""
    keep = ("app.kubernetes.io/name", "app.kubernetes.io/component", "app.kubernetes.io/part-of")
    return {k: v for k, v in labels.items() if k in keep}


@dataclass(frozen=True)
class Keys:
    """Label and taint keys under the stack's configurable prefix."""

    prefix: str

    @property
    def pool(self) -> str:
        return f"{self.prefix}/pool"

    @property
    def location(self) -> str:
        return f"{self.prefix}/location"

    @property
    def gpu_model(self) -> str:
        return f"{self.prefix}/gpu-model"

    @property
    def provider(self) -> str:
        return f"{self.prefix}/provider"

    @property
    def workload(self) -> str:
        return f"{self.prefix}/workload"

    @property
    def burst_taint(self) -> str:
        return f"{self.prefix}/burst"

    @property
    def thermal_taint(self) -> str:
        return f"{self.prefix}/thermal"

    @property
    def service(self) -> str:
        return f"{self.prefix}/service"

    @property
    def job(self) -> str:
        return f"{self.prefix}/job"

    @property
    def role(self) -> str:
        """Marks the standby replicas of an inference service (value ``standby``)."""
        return f"{self.prefix}/role"

    @property
    def handover_gate(self) -> str:
        """Scheduling gate on training pods; the burst controller lifts it once the handover is covered."""
        return f"{self.prefix}/handover"


ONPREM = "onprem"
EXTERNAL = "external"
TRAINING = "training"
INFERENCE = "inference"
#: Value of the role label on an inference service's standby replicas (see config.Handover).
STANDBY = "standby"
SYSTEM = "system"

#: The taint every virtual-kubelet provider puts on its node.
VK_PROVIDER_TAINT = "virtual-kubelet.io/provider"
#: The annotation Volcano/kube-batch read to find a pod's gang.
KUBE_BATCH_GROUP_ANNOTATION = "scheduling.k8s.io/group-name"
POD_DELETION_COST = "controller.kubernetes.io/pod-deletion-cost"


def checkpoint_claim_name(filesystem: str) -> str:
    """The PersistentVolumeClaim a training job mounts for a checkpoint filesystem."""
    return f"checkpoints-{filesystem}"


VOLCANO_QUEUE_ANNOTATION = "scheduling.volcano.sh/queue-name"
VOLCANO_PREEMPTABLE_ANNOTATION = "volcano.sh/preemptable"
