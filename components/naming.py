"""Common labels, derived selector labels and the label/taint keys every component agrees on."""

from __future__ import annotations

from dataclasses import dataclass

from agents.burst_controller import contract as burst_contract
from agents.burst_controller.contract import BurstKeys

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
class Keys(BurstKeys):
    """Label and taint keys under the stack's configurable prefix.

    The keys the burst controller reads or writes (pool, location, provider, workload, service, role, the burst
    taint, the handover gate…) come from its contract, so the components and the agent cannot spell them apart;
    the ones only components use are added here.
    """

    @property
    def gpu_model(self) -> str:
        return f"{self.prefix}/gpu-model"

    @property
    def job(self) -> str:
        return f"{self.prefix}/job"


ONPREM = "onprem"
EXTERNAL = "external"
TRAINING = "training"
INFERENCE = "inference"
#: Value of the role label on an inference service's standby replicas (see config.Handover).
STANDBY = "standby"
#: Value of the role label on an inference service's warm-pool placeholders (see config.Burst.warmPoolShare).
WARM = burst_contract.WARM_ROLE
#: Value of the role label on an inference service's return bridge (see config.Burst.returnSurgeShare).
RETURN = burst_contract.RETURN_ROLE
SYSTEM = "system"

#: The taint every virtual-kubelet provider puts on its node.
VK_PROVIDER_TAINT = burst_contract.VK_PROVIDER_TAINT
#: The annotation Volcano/kube-batch read to find a pod's gang.
KUBE_BATCH_GROUP_ANNOTATION = burst_contract.GANG_ANNOTATION
POD_DELETION_COST = burst_contract.POD_DELETION_COST_ANNOTATION


def checkpoint_claim_name(filesystem: str) -> str:
    """The PersistentVolumeClaim a training job mounts for a checkpoint filesystem."""
    return f"checkpoints-{filesystem}"


VOLCANO_QUEUE_ANNOTATION = "scheduling.volcano.sh/queue-name"
VOLCANO_PREEMPTABLE_ANNOTATION = "volcano.sh/preemptable"
