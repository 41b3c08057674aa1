"""The guardrails as one table: each row is a rule both the admission policies and the policy pack enforce.

The admission policies (:mod:`components.admission`) hold every pod and Volcano Job that enters the cluster to
these rules; the policy pack (:mod:`policies.rules`) holds what the stack itself declares to them, before it is
applied. Each row names the pack rule that enforces it and says, once, what the rule requires and what to
change: the admission message is built from the row, and the pack rule's message ends in the row's fix, so a
test can check that the two cannot drift apart (``tests/test_guardrail_table.py``). The CEL and the pack's
Python differ (each speaks its own language over the same objects); the rows and their words are shared.

Standard library only: both sides import it.
"""

from __future__ import annotations

from dataclasses import dataclass

#: Kubernetes version that serves admissionregistration.k8s.io/v1 ValidatingAdmissionPolicy (GA).
VAP_GA = (1, 30)

#: The admission policies a row belongs to (names in components.admission).
TRAINING = "training"
BURST_TOLERATION = "burst-toleration"
NODE_BURST_TAINT = "node-burst-taint"
TEAM_QUEUE = "team-queue"
#: Warns, not refuses: a job that cannot restart in place still runs, restarting as a whole gang.
RESTART_IN_PLACE = "restart-in-place"


@dataclass(frozen=True)
class Names:
    """The stack's names the rules speak of."""

    scheduler: str
    priority_class: str
    location_key: str
    onprem: str
    provider_taint: str
    burst_taint: str
    gate: str
    role_key: str
    standby: str
    #: What the training template runs a job's command under (``components.training_spec.SUPERVISOR_COMMAND``).
    supervisor: str
    #: The variable a checkpoint volume's mount path reaches the trainer by (``training_runtime.settings``).
    checkpoint_env: str


@dataclass(frozen=True)
class Guardrail:
    """One rule: what it requires, why, and what to change (templates over :class:`Names`)."""

    id: str
    #: The policy pack rule that enforces it on the stack's own objects; None for a rule about who sends an
    #: object, which only admission sees (the stack's own objects all come from its deploying identity).
    pack_rule: str | None
    #: Which admission policy carries it (TRAINING rows: the pod policy and the Volcano Job policy).
    policy: str
    requirement: str
    fix: str

    def fix_text(self, names: Names) -> str:
        return self.fix.format_map(vars(names))

    def message(self, names: Names) -> str:
        """The admission policy's message: the requirement, then what to change."""
        return f"{self.requirement.format_map(vars(names))}; {self.fix_text(names)}"


GUARDRAILS: tuple[Guardrail, ...] = (
    Guardrail(
        "gang-scheduler", "gpu-scheduler", TRAINING,
        "a GPU pod must go through the gang scheduler {scheduler} (two schedulers double-book GPUs, and the gang "
        "scheduler cannot preempt pods it did not place)",
        "set schedulerName: {scheduler}, or submit with `gpucluster train submit`",
    ),
    Guardrail(
        "training-priority", "training-outranks-inference", TRAINING,
        "a GPU training pod must carry the training priority (training outranks inference on on-prem GPUs)",
        "set priorityClassName: {priority_class}",
    ),
    Guardrail(
        "onprem-affinity", "training-onprem-only", TRAINING,
        "a GPU training pod must be held to on-prem nodes (a gang member on external capacity stalls the whole "
        "NCCL ring)",
        "add a required node affinity whose every term has {location_key} In [{onprem}]",
    ),
    Guardrail(
        "no-virtual-node-toleration", "training-onprem-only", TRAINING,
        "a GPU training pod must not tolerate the virtual nodes' taints (only standby inference may run there)",
        "remove tolerations of {provider_taint} and {burst_taint}, and of every taint (operator Exists without "
        "a key)",
    ),
    Guardrail(
        "handover-gate", "training-handover-gate", TRAINING,
        "a GPU training pod must start behind the handover gate (the burst controller lifts it once inference "
        "is covered)",
        "add {gate} to schedulingGates",
    ),
    Guardrail(
        "standby-only-burst-toleration", "inference-no-burst-toleration", BURST_TOLERATION,
        "only standby inference (label {role_key}: {standby}) may tolerate the burst taint {burst_taint}",
        "remove that toleration",
    ),
    Guardrail(
        "no-noexecute-burst-taint", "no-noexecute-taints", NODE_BURST_TAINT,
        "a node must not get the burst taint {burst_taint} as NoExecute (it would evict running inference when "
        "the burst opens)",
        "use effect NoSchedule",
    ),
    Guardrail(
        "restart-in-place", "training-restart-in-place", RESTART_IN_PLACE,
        "a GPU training job runs its command under the training runtime's supervisor and mounts a checkpoint volume, "
        "or a crash restarts the whole gang pod by pod, from its last checkpoint or from step 0 (the stack restarts "
        "gangs in place)",
        "submit it with `gpucluster train submit` (a command and a checkpoint filesystem in the spec), or run the "
        "trainer as '{supervisor} <command>' with {checkpoint_env} set to a checkpoint volume's mount path",
    ),
    Guardrail(
        "team-queue", None, TEAM_QUEUE,
        "a researcher may create, change or cancel Volcano Jobs only in the queues of their own teams "
        "(team-<team>: a team's guarantee, quota and jobs are its members' alone)",
        "set queue to your team's queue (`gpucluster train submit` sets it from the spec's team), or ask the "
        "cluster admins to add you to that team's group",
    ),
)


def guardrail(rule_id: str) -> Guardrail:
    """The row ``rule_id``; KeyError naming the known ids otherwise."""
    for row in GUARDRAILS:
        if row.id == rule_id:
            return row
    raise KeyError(f"no guardrail {rule_id!r}; known: {', '.join(r.id for r in GUARDRAILS)}")
