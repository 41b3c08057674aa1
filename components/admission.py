"""Guardrails inside the cluster: ValidatingAdmissionPolicies (CEL, no webhook server) for training.

The policy pack only sees what Pulumi declares; these policies see every GPU pod and Volcano Job created in
the training namespace, whoever creates it (the researcher CLI, kubectl, a notebook). A GPU training pod
must use the gang scheduler and the training priority class, be held to on-prem nodes, carry the handover
gate where the stack runs the handover, and tolerate neither the virtual-node taints nor every taint. A GPU
pod of the inference namespace (and of ``admission.gangSchedulerNamespaces``) must use the gang scheduler too;
a researcher's Volcano Jobs stay in their own teams' queues.
``admissionregistration.k8s.io/v1`` policies need Kubernetes 1.30 or newer (GA there).

Each rule is a row of the guardrail table (:mod:`components.guardrail_rules`, shared with the policy pack,
which holds the stack's own objects to the same rows) with a CEL predicate here over one pod spec; its
message is the row's. The pod policy applies it to ``object.spec``; the Volcano Job policy to every task's
template, with the Job's own ``schedulerName``/``priorityClassName`` as the fallback Volcano applies to its pods.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

import pulumi
import pulumi_kubernetes as k8s

from components.config import ClusterConfig, SchedulingEngine
from components.guardrail_rules import GUARDRAILS, TRAINING, VAP_GA, Names, guardrail
from components.naming import ONPREM, STANDBY, VK_PROVIDER_TAINT, Keys, common_labels
from components.training_spec import SUPERVISOR_COMMAND
from training_runtime.settings import CHECKPOINT_DIR

POD_POLICY = "gpucluster-training-pods"
JOB_POLICY = "gpucluster-training-volcano-jobs"
#: Cluster-wide: only standby inference tolerates the burst taint; no node gets it as NoExecute.
BURST_TOLERATION_POLICY = "gpucluster-burst-toleration"
NODE_TAINT_POLICY = "gpucluster-node-burst-taint"
#: GPU pods of the inference namespace (and ``admission.gangSchedulerNamespaces``) use the gang scheduler too.
GANG_SCHEDULER_POLICY = "gpucluster-gpu-pods-gang-scheduler"
#: In the training namespace: a researcher's Volcano Job goes to one of their own teams' queues.
TEAM_QUEUE_POLICY = "gpucluster-team-queues"
#: In the training namespace, where the stack restarts gangs in place: a Volcano Job that cannot is warned, not
#: refused (it still runs, restarting as a whole gang; the policy pack refuses one the stack itself declares).
RESTART_IN_PLACE_POLICY = "gpucluster-training-restart-in-place"


@dataclass(frozen=True)
class Rule:
    """One guardrail: ``check(spec, fallback)`` is CEL that is true when the pod spec is acceptable.

    ``fallback`` is the CEL of an object whose ``schedulerName``/``priorityClassName`` apply when the pod
    spec leaves them unset (the Volcano Job), or None for a pod.
    """

    name: str
    check: Callable[[str, str | None], str]
    message: str


@dataclass(frozen=True)
class GuardrailArgs:
    namespace: str
    scheduler_name: str
    priority_class: str
    label_prefix: str
    gpu_resource: str
    #: The handover gate every training pod must start behind, or None where the stack runs no handover.
    handover_gate: str | None
    volcano: bool
    #: Whether the cluster serves the v1 API; below 1.30 the stack declares no guardrails (the policy pack
    #: still checks what the stack itself declares).
    served: bool = True
    #: The MutatingAdmissionPolicy apiVersion that adds the training defaults to Volcano Jobs, or None to
    #: validate only (config ``admission.mutating``; see components/config/admission.py for the versions).
    mutating_api: str | None = None
    #: Each team's (queue, group): whose members may send Volcano Jobs to that queue.
    team_queues: tuple[tuple[str, str], ...] = ()
    #: Namespaces outside training whose GPU pods must use the gang scheduler (inference, then the config's).
    gang_scheduler_namespaces: tuple[str, ...] = ()
    #: Whether the stack restarts crashed gangs in place (``training.restartInPlace.enabled``): a job that cannot
    #: is then warned at admission.
    restart_in_place: bool = False

    @classmethod
    def from_config(cls, cfg: ClusterConfig) -> GuardrailArgs:
        volcano = cfg.scheduling.engine is SchedulingEngine.VOLCANO
        return cls(
            namespace=cfg.training_namespace,
            scheduler_name=cfg.scheduling.scheduler_name,
            priority_class=cfg.priorities.training.name,
            label_prefix=cfg.label_prefix,
            gpu_resource=cfg.gpu_resource,
            # The same condition as TrainingJobArgs.from_config: only Volcano honours the gate.
            handover_gate=Keys(cfg.label_prefix).handover_gate if cfg.handover_active and volcano else None,
            volcano=volcano,
            served=cfg.k8s_minor >= VAP_GA,
            mutating_api=cfg.admission.mutating_api(cfg.k8s_minor) if volcano else None,
            team_queues=tuple((t.queue, t.subject_group) for t in cfg.scheduling.teams),
            gang_scheduler_namespaces=tuple(dict.fromkeys(
                [cfg.inference_namespace, *cfg.admission.gang_scheduler_namespaces])),
            restart_in_place=cfg.training.restart_in_place.enabled,
        )

    @property
    def names(self) -> Names:
        keys = Keys(self.label_prefix)
        return Names(scheduler=self.scheduler_name, priority_class=self.priority_class, location_key=keys.location,
                     onprem=ONPREM, provider_taint=VK_PROVIDER_TAINT, burst_taint=keys.burst_taint,
                     gate=self.handover_gate or keys.handover_gate, role_key=keys.role, standby=STANDBY,
                     supervisor=" ".join(SUPERVISOR_COMMAND), checkpoint_env=CHECKPOINT_DIR)


def _q(value: str) -> str:
    """A CEL string literal."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _effective(spec: str, fallback: str | None, field: str) -> str:
    """The field's value as the pod will get it: its own, else the fallback object's, else ''."""
    other = f"(has({fallback}.{field}) ? {fallback}.{field} : '')" if fallback else "''"
    return f"(has({spec}.{field}) ? {spec}.{field} : {other})"


def rules(args: GuardrailArgs) -> list[Rule]:
    """The table's training rows with their CEL; both training policies are generated from it."""
    keys = Keys(args.label_prefix)
    location = _q(keys.location)
    forbidden = "[" + ", ".join(_q(k) for k in (VK_PROVIDER_TAINT, keys.burst_taint)) + "]"

    def scheduler(s: str, f: str | None) -> str:
        return f"{_effective(s, f, 'schedulerName')} == {_q(args.scheduler_name)}"

    def priority(s: str, f: str | None) -> str:
        return f"{_effective(s, f, 'priorityClassName')} == {_q(args.priority_class)}"

    def onprem(s: str, f: str | None) -> str:
        required = f"{s}.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"
        by_selector = (f"(has({s}.nodeSelector) && {location} in {s}.nodeSelector && "
                       f"{s}.nodeSelector[{location}] == {_q(ONPREM)})")
        # Node selector terms are ORed: every term must hold the pod to on-prem nodes.
        by_affinity = (
            f"(has({s}.affinity) && has({s}.affinity.nodeAffinity) && has({required}) && "
            f"has({required}.nodeSelectorTerms) && {required}.nodeSelectorTerms.size() > 0 && "
            f"{required}.nodeSelectorTerms.all(t, has(t.matchExpressions) && t.matchExpressions.exists(e, "
            f"e.key == {location} && e.operator == 'In' && has(e.values) && e.values.size() > 0 && "
            f"e.values.all(v, v == {_q(ONPREM)}))))"
        )
        return f"{by_selector} || {by_affinity}"

    def no_virtual(s: str, f: str | None) -> str:
        return (
            f"!has({s}.tolerations) || {s}.tolerations.all(t, "
            f"!((has(t.key) ? t.key : '') == '' && has(t.operator) && t.operator == 'Exists') && "
            f"!((has(t.key) ? t.key : '') in {forbidden}))"
        )

    def gated(s: str, f: str | None) -> str:
        return (f"has({s}.schedulingGates) && {s}.schedulingGates.exists(g, g.name == "
                f"{_q(args.handover_gate or '')})")

    checks: dict[str, Callable[[str, str | None], str]] = {
        "gang-scheduler": scheduler,
        "training-priority": priority,
        "onprem-affinity": onprem,
        "no-virtual-node-toleration": no_virtual,
        "handover-gate": gated,
    }
    names = args.names
    # The gate rule only where the stack runs the handover (and so lifts the gate).
    return [Rule(row.id, checks[row.id], row.message(names)) for row in GUARDRAILS
            if row.policy == TRAINING and (row.id != "handover-gate" or args.handover_gate is not None)]


def _container_requests_gpu(container: str, gpu: str) -> str:
    res = f"{container}.resources"
    return (f"has({res}) && ((has({res}.limits) && {_q(gpu)} in {res}.limits) || "
            f"(has({res}.requests) && {_q(gpu)} in {res}.requests))")


def _requests_gpu(spec: str, gpu: str) -> str:
    return f"{spec}.containers.exists(c, {_container_requests_gpu('c', gpu)})"


def pod_validations(args: GuardrailArgs) -> list[dict[str, str]]:
    return [{"expression": r.check("object.spec", None), "message": r.message} for r in rules(args)]


def job_validations(args: GuardrailArgs) -> list[dict[str, str]]:
    return [
        {"expression": f"object.spec.tasks.all(task, !has(task.template) || !has(task.template.spec) || "
                       f"({r.check('task.template.spec', 'object.spec')}))",
         "message": r.message}
        for r in rules(args)
    ]


def pod_match_condition(args: GuardrailArgs) -> str:
    return _requests_gpu("object.spec", args.gpu_resource)


def job_match_condition(args: GuardrailArgs) -> str:
    inner = _requests_gpu("task.template.spec", args.gpu_resource)
    # A task without a template is left to Volcano's own validation (an error here would refuse it as Fail).
    return (f"has(object.spec.tasks) && object.spec.tasks.exists(task, has(task.template) && "
            f"has(task.template.spec) && {inner})")


def _policy_spec(resource: dict[str, Any], condition: str, validations: list[dict[str, str]]) -> dict[str, Any]:
    return {
        "failurePolicy": "Fail",
        "matchConstraints": {"resourceRules": [resource]},
        "matchConditions": [{"name": "requests-gpus", "expression": condition}],
        "validations": validations,
    }


def policy_specs(args: GuardrailArgs) -> dict[str, dict[str, Any]]:
    """Policy name → spec: pods always, Volcano Jobs where Volcano is the engine; none below 1.30."""
    if not args.served:
        return {}
    specs = {
        POD_POLICY: _policy_spec(
            {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"]},
            pod_match_condition(args), pod_validations(args),
        )
    }
    if args.volcano:
        specs[JOB_POLICY] = _policy_spec(
            {"apiGroups": ["batch.volcano.sh"], "apiVersions": ["v1alpha1"], "operations": ["CREATE", "UPDATE"],
             "resources": ["jobs"]},
            job_match_condition(args), job_validations(args),
        )
    return specs


def burst_policy_specs(args: GuardrailArgs) -> dict[str, dict[str, Any]]:
    """The burst taint's two rules, outside the training namespace too.

    Only standby inference may tolerate the burst taint by its key (a toleration of every taint, as system
    DaemonSets carry, is the training rule's business, not this one's). A NoExecute burst taint would evict
    running inference the moment the burst opens; the burst controller only ever sets NoSchedule. A node
    that already carries one may still be updated (and the taint removed): only adding it is refused, so a
    stale taint cannot block the health guard or the node pools' labels.
    """
    keys = Keys(args.label_prefix)
    burst, role = _q(keys.burst_taint), _q(keys.role)
    no_execute = f"t.key == {burst} && has(t.effect) && t.effect == 'NoExecute'"
    return {
        BURST_TOLERATION_POLICY: {
            "failurePolicy": "Fail",
            "matchConstraints": {"resourceRules": [
                {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"]}]},
            "matchConditions": [{"name": "tolerates-burst-taint", "expression":
                                 f"has(object.spec.tolerations) && object.spec.tolerations.exists(t, "
                                 f"has(t.key) && t.key == {burst})"}],
            "validations": [{
                "expression": f"has(object.metadata.labels) && {role} in object.metadata.labels && "
                              f"object.metadata.labels[{role}] == {_q(STANDBY)}",
                "message": guardrail("standby-only-burst-toleration").message(args.names),
            }],
        },
        NODE_TAINT_POLICY: {
            "failurePolicy": "Fail",
            "matchConstraints": {"resourceRules": [
                {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE", "UPDATE"],
                 "resources": ["nodes"]}]},
            "validations": [{
                "expression": f"!has(object.spec.taints) || !object.spec.taints.exists(t, {no_execute}) || "
                              f"(request.operation == 'UPDATE' && has(oldObject.spec.taints) && "
                              f"oldObject.spec.taints.exists(t, {no_execute}))",
                "message": guardrail("no-noexecute-burst-taint").message(args.names),
            }],
        },
    }


def gang_scheduler_policy_spec(args: GuardrailArgs) -> dict[str, Any] | None:
    """The gang-scheduler row for every GPU pod of the inference namespace (and the configured others).

    Inference shares the on-prem GPUs with training: a GPU pod placed by another scheduler takes GPUs the gang
    scheduler believes free (both bind, the kubelet refuses one), and the gang scheduler cannot reclaim it for
    training. The training namespace's pod policy already carries this row with the training rows.
    """
    if not args.gang_scheduler_namespaces:
        return None
    row = guardrail("gang-scheduler")
    check = next(r.check for r in rules(args) if r.name == row.id)
    return _policy_spec(
        {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"]},
        pod_match_condition(args), [{"expression": check("object.spec", None), "message": row.message(args.names)}],
    )


def team_queue_policy_spec(args: GuardrailArgs) -> dict[str, Any] | None:
    """A researcher (a member of any team's group) may create, change or delete Volcano Jobs only in the queues
    of their own teams.

    The researcher Role lets every team create and delete Jobs in the one training namespace, and a Job names
    its queue itself: without this, a member of one team could run on another team's guarantee or on the
    training queue that the stack's own jobs use, or cancel another team's job. Whoever is in no team's group
    (the stack's deploying identity, the platform's admins, Volcano's controllers) is not matched. None without
    teams, or without Volcano.
    """
    if not args.team_queues or not args.volcano or not args.served:
        return None
    groups = "[" + ", ".join(_q(g) for g in sorted({g for _, g in args.team_queues})) + "]"
    owners: dict[str, list[str]] = {}
    for queue, group in args.team_queues:
        owners.setdefault(queue, []).append(group)
    table = "{" + ", ".join(f"{_q(q)}: [{', '.join(_q(g) for g in gs)}]" for q, gs in sorted(owners.items())) + "}"
    message = guardrail("team-queue").message(args.names)
    return {
        "failurePolicy": "Fail",
        "matchConstraints": {"resourceRules": [
            {"apiGroups": ["batch.volcano.sh"], "apiVersions": ["v1alpha1"],
             "operations": ["CREATE", "UPDATE", "DELETE"], "resources": ["jobs"]}]},
        "matchConditions": [{"name": "from-a-researcher", "expression":
                             f"has(request.userInfo.groups) && request.userInfo.groups.exists(g, g in {groups})"}],
        "variables": [
            # A DELETE has no object: the Job being deleted is the old one (`train cancel` of another team's job).
            {"name": "job", "expression": "request.operation == 'DELETE' ? oldObject : object"},
            {"name": "queue", "expression": "has(variables.job.spec.queue) ? variables.job.spec.queue : 'default'"},
            # An UPDATE must not take another team's job into one's own queue either: its old queue counts too.
            {"name": "oldQueue", "expression": "request.operation != 'UPDATE' ? variables.queue : "
                                               "(has(oldObject.spec.queue) ? oldObject.spec.queue : 'default')"},
            {"name": "owners", "expression": table},
        ],
        "validations": [
            {"expression": _owned("variables.queue"), "message": message,
             "messageExpression": f"{_q(message)} + ' (queue: ' + variables.queue + ')'"},
            {"expression": f"variables.oldQueue == variables.queue || {_owned('variables.oldQueue')}",
             "message": message,
             "messageExpression": f"{_q(message)} + ' (queue: ' + variables.oldQueue + ')'"},
        ],
    }


def _owned(queue: str) -> str:
    """CEL: ``queue`` is a team queue one of whose groups the requester is in."""
    return f"{queue} in variables.owners && variables.owners[{queue}].exists(g, g in request.userInfo.groups)"


#: The MutatingAdmissionPolicy that adds the training priority class and the handover gate to Volcano Jobs.
MUTATING_POLICY = "gpucluster-training-defaults"
#: Tasks of one Volcano Job the mutation reaches (a JSON patch names each by index; CEL has no range). A
#: task beyond them keeps what it has, and the validating policy still refuses it with its message.
MAX_MUTATED_TASKS = 8


def mutating_policy_spec(args: GuardrailArgs) -> dict[str, Any] | None:
    """Add ``priorityClassName`` (the Job's, which Volcano gives pods without their own) and the handover gate.

    On the Volcano Job, not the pod: the built-in Priority admission plugin resolves a pod's class to its
    ``priority`` before admission policies run, so a class added to a pod there would never get its value;
    Volcano creates the pods from the mutated Job, with the class. Only what is missing is added (a wrong
    class stays and is refused by the validating policy). ``failurePolicy: Ignore``: should the patch fail, the
    Job is not refused for it; the validating policy, which runs after every mutation, still decides.
    """
    if args.mutating_api is None or not args.served or not args.volcano:
        return None
    patches = [f"(has(object.spec.priorityClassName) ? [] : [JSONPatch{{op: 'add', path: '/spec/priorityClassName', "
               f"value: {_q(args.priority_class)}}}])"]
    if args.handover_gate is not None:
        gate = _q(args.handover_gate)
        for i in range(MAX_MUTATED_TASKS):
            spec = f"object.spec.tasks[{i}].template.spec"
            path = f"/spec/tasks/{i}/template/spec/schedulingGates"
            missing = (f"object.spec.tasks.size() > {i} && has(object.spec.tasks[{i}].template) && has({spec}) && "
                       f"!(has({spec}.schedulingGates) && {spec}.schedulingGates.exists(g, g.name == {gate}))")
            append = f"[JSONPatch{{op: 'add', path: '{path}/-', value: {{'name': {gate}}}}}]"
            create = f"[JSONPatch{{op: 'add', path: '{path}', value: [{{'name': {gate}}}]}}]"
            patches.append(f"(({missing}) ? (has({spec}.schedulingGates) ? {append} : {create}) : [])")
    return {
        "failurePolicy": "Ignore",
        "reinvocationPolicy": "Never",
        "matchConstraints": {"resourceRules": [
            {"apiGroups": ["batch.volcano.sh"], "apiVersions": ["v1alpha1"], "operations": ["CREATE"],
             "resources": ["jobs"]}]},
        "matchConditions": [{"name": "requests-gpus", "expression": job_match_condition(args)}],
        "mutations": [{"patchType": "JSONPatch", "jsonPatch": {"expression": " + ".join(patches)}}],
    }


def restart_in_place_policy_spec(args: GuardrailArgs) -> dict[str, Any] | None:
    """Every GPU container of a Volcano Job's tasks runs under the supervisor and gets the checkpoint directory: what
    restarting in place needs (``training_runtime.supervisor``). Where the stack restarts gangs in place only."""
    if not (args.served and args.volcano and args.restart_in_place):
        return None
    wants_gpu = f"({_container_requests_gpu('c', args.gpu_resource)})"
    # The supervisor's words, then the job's command after them.
    supervised = (f"(has(c.command) && c.command.size() > {len(SUPERVISOR_COMMAND)} && "
                  + " && ".join(f"c.command[{i}] == {_q(w)}" for i, w in enumerate(SUPERVISOR_COMMAND)) + ")")
    checkpoint = f"(has(c.env) && c.env.exists(e, e.name == {_q(CHECKPOINT_DIR)}))"
    row = guardrail("restart-in-place")
    return {
        "failurePolicy": "Fail",  # with a Warn binding a failure warns too: nothing is refused
        "matchConstraints": {"resourceRules": [
            {"apiGroups": ["batch.volcano.sh"], "apiVersions": ["v1alpha1"], "operations": ["CREATE"],
             "resources": ["jobs"]}]},
        "matchConditions": [{"name": "requests-gpus", "expression": job_match_condition(args)}],
        "validations": [{
            "expression": (f"object.spec.tasks.all(task, !has(task.template) || !has(task.template.spec) || "
                           f"task.template.spec.containers.all(c, !{wants_gpu} || ({supervised} && {checkpoint})))"),
            "message": row.message(args.names)}],
    }


def binding_spec(policy: str, namespace: str | tuple[str, ...] | None,
                 actions: tuple[str, ...] = ("Deny",)) -> dict[str, Any]:
    """Deny (not just audit) what fails, unless ``actions`` say otherwise: in ``namespace`` (or each of several)
    only, or everywhere but kube-system when None."""
    match: dict[str, Any]
    if isinstance(namespace, tuple):
        match = {"namespaceSelector": {"matchExpressions": [
            {"key": "kubernetes.io/metadata.name", "operator": "In", "values": list(namespace)}]}}
    elif namespace is not None:
        match = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}}}
    else:
        # namespaceSelector does not restrict cluster-scoped objects (nodes): those all match.
        match = {"namespaceSelector": {"matchExpressions": [
            {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": ["kube-system"]}]}}
    return {"policyName": policy, "validationActions": list(actions), "matchResources": match}


def all_policies(args: GuardrailArgs) -> dict[str, tuple[dict[str, Any], dict[str, Any]]]:
    """Policy name → (policy spec, binding spec); none below Kubernetes 1.30."""
    if not args.served:
        return {}
    out = {name: (spec, binding_spec(name, args.namespace)) for name, spec in policy_specs(args).items()}
    out.update({name: (spec, binding_spec(name, None)) for name, spec in burst_policy_specs(args).items()})
    gang = gang_scheduler_policy_spec(args)
    if gang is not None:
        out[GANG_SCHEDULER_POLICY] = (gang, binding_spec(GANG_SCHEDULER_POLICY, args.gang_scheduler_namespaces))
    team = team_queue_policy_spec(args)
    if team is not None:
        out[TEAM_QUEUE_POLICY] = (team, binding_spec(TEAM_QUEUE_POLICY, args.namespace))
    restart = restart_in_place_policy_spec(args)
    if restart is not None:
        # The submitter sees the warning (kubectl prints it), and the audit log records it.
        out[RESTART_IN_PLACE_POLICY] = (restart, binding_spec(RESTART_IN_PLACE_POLICY, args.namespace,
                                                              ("Warn", "Audit")))
    return out


class TrainingGuardrails(pulumi.ComponentResource):
    """The admission policies and their bindings, first-class objects the policy pack and tests see."""

    def __init__(self, name: str, args: GuardrailArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("gpu-cluster:security:TrainingGuardrails", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        self.policies: list[k8s.admissionregistration.v1.ValidatingAdmissionPolicy] = []
        for policy, (spec, binding) in all_policies(args).items():
            meta = k8s.meta.v1.ObjectMetaArgs(name=policy, labels=common_labels(policy, "admission-policy"))
            vap = k8s.admissionregistration.v1.ValidatingAdmissionPolicy(
                policy, metadata=meta, spec=cast(Any, spec), opts=child
            )
            k8s.admissionregistration.v1.ValidatingAdmissionPolicyBinding(
                f"{policy}-binding",
                metadata=k8s.meta.v1.ObjectMetaArgs(name=policy, labels=common_labels(policy, "admission-policy")),
                spec=cast(Any, binding),
                opts=pulumi.ResourceOptions(parent=self, depends_on=[vap]),
            )
            self.policies.append(vap)
        self.mutating = self._mutating(args)
        self.register_outputs({"policies": list(all_policies(args)),
                               "mutating": MUTATING_POLICY if self.mutating is not None else None})

    def _mutating(self, args: GuardrailArgs) -> pulumi.Resource | None:
        spec = mutating_policy_spec(args)
        if spec is None or args.mutating_api is None:
            return None
        meta = k8s.meta.v1.ObjectMetaArgs(name=MUTATING_POLICY,
                                          labels=common_labels(MUTATING_POLICY, "admission-policy"))
        binding: Any = {"policyName": MUTATING_POLICY, "matchResources": {
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": args.namespace}}}}
        policy: pulumi.Resource
        if args.mutating_api.endswith("/v1beta1"):
            policy = k8s.admissionregistration.v1beta1.MutatingAdmissionPolicy(
                MUTATING_POLICY, metadata=meta, spec=cast(Any, spec), opts=pulumi.ResourceOptions(parent=self))
            k8s.admissionregistration.v1beta1.MutatingAdmissionPolicyBinding(
                f"{MUTATING_POLICY}-binding", metadata=meta, spec=binding,
                opts=pulumi.ResourceOptions(parent=self, depends_on=[policy]))
        else:
            policy = k8s.admissionregistration.v1.MutatingAdmissionPolicy(
                MUTATING_POLICY, metadata=meta, spec=cast(Any, spec), opts=pulumi.ResourceOptions(parent=self))
            k8s.admissionregistration.v1.MutatingAdmissionPolicyBinding(
                f"{MUTATING_POLICY}-binding", metadata=meta, spec=binding,
                opts=pulumi.ResourceOptions(parent=self, depends_on=[policy]))
        return policy
