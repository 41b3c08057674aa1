"""The training guardrails: the rendered ValidatingAdmissionPolicies, their CEL evaluated against objects.

The CEL is evaluated with cel-python (``celpy``), a conforming CEL implementation without the API server's
schema type checks: expressions here are taken from the rendered policies, as the API server gets them.
"""

from __future__ import annotations

import copy
from typing import Any

import celpy
import pytest

from components.admission import (
    BURST_TOLERATION_POLICY,
    GANG_SCHEDULER_POLICY,
    JOB_POLICY,
    NODE_TAINT_POLICY,
    POD_POLICY,
    RESTART_IN_PLACE_POLICY,
    TEAM_QUEUE_POLICY,
    GuardrailArgs,
    all_policies,
    policy_specs,
)
from components.mockrt import RunResult
from tests.conftest import StackRunner

GPU = "nvidia.com/gpu"
LOC = "gpucluster.io/location"
ONPREM_AFFINITY = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
    {"matchExpressions": [{"key": LOC, "operator": "In", "values": ["onprem"]},
                          {"key": "gpucluster.io/pool", "operator": "In", "values": ["h100-a"]}]}]}}}


def policy(run: RunResult, name: str) -> dict[str, Any]:
    return run.one("ValidatingAdmissionPolicy", name).inputs["spec"]  # type: ignore[no-any-return]


def refusals(spec: dict[str, Any], obj: dict[str, Any] | None, request: dict[str, Any] | None = None,
             detailed: bool = False, old: dict[str, Any] | None = None) -> list[str] | None:
    """None when the policy does not match the object (no GPUs); else the messages of failed validations.

    ``request`` is the admission request (``operation``, ``userInfo``…), ``old`` its ``oldObject`` (None: null,
    as for a CREATE; ``obj`` None is a DELETE's null object); ``variables`` are evaluated in order as the API
    server does; ``detailed`` returns a validation's ``messageExpression`` where it has one.
    """
    env = celpy.Environment()
    act: dict[str, Any] = {"object": celpy.json_to_cel(obj), "oldObject": celpy.json_to_cel(old),
                           "request": celpy.json_to_cel(request or {})}
    for cond in spec.get("matchConditions", ()):
        if not env.program(env.compile(cond["expression"])).evaluate(act):
            return None
    variables = celpy.celtypes.MapType()
    for var in spec.get("variables", ()):
        act["variables"] = variables
        variables[celpy.celtypes.StringType(var["name"])] = env.program(env.compile(var["expression"])).evaluate(act)
    act["variables"] = variables
    out = []
    for v in spec["validations"]:
        result = env.program(env.compile(v["expression"])).evaluate(act)
        assert isinstance(result, celpy.celtypes.BoolType), (v["expression"], result)  # an error is not a pass
        if not result:
            expression = v.get("messageExpression") if detailed else None
            out.append(str(env.program(env.compile(expression)).evaluate(act)) if expression else v["message"])
    return out


def good_pod_spec(gate: bool) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "schedulerName": "volcano",
        "priorityClassName": "gpu-training",
        "affinity": copy.deepcopy(ONPREM_AFFINITY),
        "tolerations": [{"key": "gpucluster.io/pool", "operator": "Equal", "value": "h100-a", "effect": "NoSchedule"}],
        "containers": [{"name": "trainer", "image": "x:1",
                        "resources": {"limits": {GPU: "8"}, "requests": {GPU: "8"}}}],
    }
    if gate:
        spec["schedulingGates"] = [{"name": "gpucluster.io/handover"}]
    return spec


def _without(key: str) -> Any:
    return lambda s: s.pop(key)


def _set(key: str, value: Any) -> Any:
    return lambda s: s.__setitem__(key, value)


# (case, edit of a good pod spec, the rule whose message must appear — or None for accepted)
CASES: list[tuple[str, Any, str | None]] = [
    ("good", lambda s: None, None),
    ("default scheduler", _set("schedulerName", "default-scheduler"), "schedulerName: volcano"),
    ("no scheduler set", _without("schedulerName"), "schedulerName: volcano"),
    ("no priority class", _without("priorityClassName"), "priorityClassName: gpu-training"),
    ("inference priority", _set("priorityClassName", "gpu-inference"), "priorityClassName: gpu-training"),
    ("no affinity", _without("affinity"), "held to on-prem nodes"),
    ("affinity allows external", lambda s: s["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0]["matchExpressions"][0].update(
        values=["onprem", "external"]), "held to on-prem nodes"),
    ("a second term without location", lambda s: s["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"].append(
        {"matchExpressions": [{"key": "gpucluster.io/pool", "operator": "In", "values": ["h100-a"]}]}),
     "held to on-prem nodes"),
    ("only preferred affinity", _set("affinity", {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 1, "preference": {"matchExpressions": [{"key": LOC, "operator": "In", "values": ["onprem"]}]}}]}}),
     "held to on-prem nodes"),
    ("node selector instead of affinity", lambda s: (s.pop("affinity"), s.__setitem__("nodeSelector", {LOC: "onprem"})),
     None),
    ("tolerates the provider taint", lambda s: s["tolerations"].append(
        {"key": "virtual-kubelet.io/provider", "operator": "Exists"}), "must not tolerate"),
    ("tolerates the burst taint", lambda s: s["tolerations"].append(
        {"key": "gpucluster.io/burst", "operator": "Equal", "value": "on", "effect": "NoSchedule"}),
     "must not tolerate"),
    ("tolerates everything", lambda s: s["tolerations"].append({"operator": "Exists"}), "must not tolerate"),
    ("no handover gate", _without("schedulingGates"), "add gpucluster.io/handover to schedulingGates"),
    ("another gate only", _set("schedulingGates", [{"name": "example.com/other"}]),
     "add gpucluster.io/handover to schedulingGates"),
]


@pytest.mark.parametrize(("case", "edit", "refused_for"), CASES, ids=[c[0] for c in CASES])
def test_pod_policy_table(prod: RunResult, case: str, edit: Any, refused_for: str | None) -> None:
    spec = good_pod_spec(gate=True)
    edit(spec)
    messages = refusals(policy(prod, POD_POLICY), {"apiVersion": "v1", "kind": "Pod", "spec": spec})
    assert messages is not None
    if refused_for is None:
        assert messages == []
    else:
        assert len(messages) == 1 and refused_for in messages[0], messages


@pytest.mark.parametrize(("case", "edit", "refused_for"), CASES, ids=[c[0] for c in CASES])
def test_job_policy_table(prod: RunResult, case: str, edit: Any, refused_for: str | None) -> None:
    """The same table through a Volcano Job's second task (the first one is good)."""
    bad = good_pod_spec(gate=True)
    edit(bad)
    job = {"apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job", "spec": {"tasks": [
        {"name": "a", "template": {"spec": good_pod_spec(gate=True)}},
        {"name": "b", "template": {"spec": bad}}]}}
    messages = refusals(policy(prod, JOB_POLICY), job)
    assert messages is not None
    assert messages == [] if refused_for is None else (len(messages) == 1 and refused_for in messages[0])


def test_job_level_scheduler_and_priority_apply_to_templates_without_them(prod: RunResult) -> None:
    """Volcano gives a pod the Job's schedulerName/priorityClassName when its template has none."""
    tmpl = good_pod_spec(gate=True)
    del tmpl["schedulerName"], tmpl["priorityClassName"]
    job = {"spec": {"tasks": [{"name": "w", "template": {"spec": tmpl}}]}}
    spec = policy(prod, JOB_POLICY)
    assert len(refusals(spec, job) or []) == 2
    job["spec"].update(schedulerName="volcano", priorityClassName="gpu-training")
    assert refusals(spec, job) == []


def test_cpu_only_pods_are_not_matched(prod: RunResult) -> None:
    spec = good_pod_spec(gate=False)
    spec["containers"][0]["resources"] = {"requests": {"cpu": "1"}}
    spec["schedulerName"] = "default-scheduler"
    assert refusals(policy(prod, POD_POLICY), {"spec": spec}) is None


def test_without_handover_no_gate_rule_and_without_volcano_no_job_policy() -> None:
    """The gate rule exists only where the stack runs the handover; the Job policy only where Volcano runs."""
    args = GuardrailArgs(namespace="training", scheduler_name="kube-batch", priority_class="gpu-training",
                         label_prefix="gpucluster.io", gpu_resource=GPU, handover_gate=None, volcano=False)
    specs = policy_specs(args)
    assert list(specs) == [POD_POLICY]
    spec = good_pod_spec(gate=False)
    assert refusals(specs[POD_POLICY], {"spec": spec}) == [
        "a GPU pod must go through the gang scheduler kube-batch (two schedulers double-book GPUs, and the gang "
        "scheduler cannot preempt pods it did not place); set schedulerName: kube-batch, or submit with "
        "`gpucluster train submit`"]


@pytest.mark.parametrize("stack", ["prod", "local"])
def test_every_training_job_the_stack_renders_passes(stack: str, request: pytest.FixtureRequest) -> None:
    run: RunResult = request.getfixturevalue(stack)
    jobs = [r for r in run.by_kind("Job") if r.inputs.get("apiVersion") == "batch.volcano.sh/v1alpha1"]
    spec = policy(run, JOB_POLICY)
    for job in jobs:
        assert refusals(spec, {"spec": job.inputs["spec"]}) == [], job.metadata["name"]


@pytest.mark.parametrize("stack", ["prod", "local"])
def test_bindings_deny_in_the_training_namespace_or_everywhere_but_kube_system(
        stack: str, request: pytest.FixtureRequest) -> None:
    run: RunResult = request.getfixturevalue(stack)
    bindings = {b.metadata["name"]: b.inputs["spec"] for b in run.by_kind("ValidatingAdmissionPolicyBinding")}
    policies = {p.metadata["name"]: p.inputs["spec"] for p in run.by_kind("ValidatingAdmissionPolicy")}
    # Team queues only where the stack has teams (prod; the local stack has none).
    teams = {TEAM_QUEUE_POLICY} if stack == "prod" else set()
    assert set(bindings) == set(policies) == {POD_POLICY, JOB_POLICY, BURST_TOLERATION_POLICY, NODE_TAINT_POLICY,
                                              GANG_SCHEDULER_POLICY, RESTART_IN_PLACE_POLICY, *teams}
    assert bindings[GANG_SCHEDULER_POLICY]["matchResources"]["namespaceSelector"] == {"matchExpressions": [
        {"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["inference"]}]}
    for name, b in bindings.items():
        assert b["policyName"] == name
        # Every guardrail denies, but restarting in place, which warns (a job that cannot still runs, whole).
        assert b["validationActions"] == (["Warn", "Audit"] if name == RESTART_IN_PLACE_POLICY else ["Deny"])
        assert policies[name]["failurePolicy"] == "Fail"
        assert run.one("ValidatingAdmissionPolicy", name).inputs["apiVersion"] == "admissionregistration.k8s.io/v1"
    for name in (POD_POLICY, JOB_POLICY, *teams):
        assert bindings[name]["matchResources"]["namespaceSelector"] == {
            "matchLabels": {"kubernetes.io/metadata.name": "training"}}
    for name in (BURST_TOLERATION_POLICY, NODE_TAINT_POLICY):
        assert bindings[name]["matchResources"]["namespaceSelector"] == {"matchExpressions": [
            {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": ["kube-system"]}]}


BURST = {"key": "gpucluster.io/burst", "operator": "Exists", "effect": "NoSchedule"}


@pytest.mark.parametrize(("labels", "tolerations", "verdict"), [
    ({"gpucluster.io/role": "standby"}, [BURST], []),
    ({"gpucluster.io/role": "serving"}, [BURST], ["only standby inference"]),
    (None, [BURST], ["only standby inference"]),
    ({}, [{"operator": "Exists"}], None),  # tolerate-everything DaemonSets: not this rule's business
    ({}, [{"key": "gpucluster.io/pool", "operator": "Equal", "value": "h100-a"}], None),
    ({}, None, None),
], ids=["standby", "serving", "no-labels", "tolerate-all", "pool-only", "no-tolerations"])
def test_only_standby_tolerates_the_burst_taint(prod: RunResult, labels: Any, tolerations: Any,
                                                verdict: list[str] | None) -> None:
    pod: dict[str, Any] = {"metadata": {"name": "p"}, "spec": {"containers": [{"name": "c"}]}}
    if labels is not None:
        pod["metadata"]["labels"] = labels
    if tolerations is not None:
        pod["spec"]["tolerations"] = tolerations
    messages = refusals(policy(prod, BURST_TOLERATION_POLICY), pod)
    if verdict is None or verdict == []:
        assert messages == verdict
    else:
        assert messages is not None and len(messages) == 1 and verdict[0] in messages[0]


def _node(*effects: str) -> dict[str, Any]:
    return {"metadata": {"name": "n"}, "spec": {"taints": [
        {"key": "gpucluster.io/burst", "value": "open", "effect": e} for e in effects]}}


@pytest.mark.parametrize(("old", "new", "refused"), [
    (None, _node("NoSchedule"), False),
    (None, _node("NoExecute"), True),
    (_node(), _node("NoExecute"), True),
    (_node("NoSchedule"), _node("NoSchedule", "NoExecute"), True),
    (_node("NoExecute"), _node("NoExecute"), False),   # a stale one does not block other updates
    (_node("NoExecute"), _node(), False),              # removing it is fine
    (None, {"metadata": {"name": "n"}, "spec": {}}, False),
], ids=["create-noschedule", "create-noexecute", "add-noexecute", "add-beside", "keep-stale", "remove",
        "no-taints"])
def test_no_node_gets_the_burst_taint_as_noexecute(prod: RunResult, old: Any, new: Any, refused: bool) -> None:
    spec = policy(prod, NODE_TAINT_POLICY)
    env = celpy.Environment()
    act = {"object": celpy.json_to_cel(new), "oldObject": celpy.json_to_cel(old),
           "request": celpy.json_to_cel({"operation": "CREATE" if old is None else "UPDATE"})}
    [v] = spec["validations"]
    assert bool(env.program(env.compile(v["expression"])).evaluate(act)) is not refused
    assert "use effect NoSchedule" in v["message"]


def test_stack_pods_meet_the_burst_toleration_rule(prod: RunResult) -> None:
    """Every pod template the stack renders (Deployments, DaemonSets, Jobs) passes the cluster-wide rule."""
    spec = policy(prod, BURST_TOLERATION_POLICY)
    checked = 0
    for kind in ("Deployment", "DaemonSet", "StatefulSet"):
        for r in prod.by_kind(kind):
            template = r.inputs["spec"]["template"]
            pod = {"metadata": template.get("metadata", {}), "spec": template["spec"]}
            assert refusals(spec, pod) in (None, []), r.metadata["name"]
            checked += refusals(spec, pod) == []
    assert checked >= 1  # the standby Deployments matched and passed


def test_no_guardrails_where_the_api_is_not_served() -> None:
    """Below Kubernetes 1.30 admissionregistration.k8s.io/v1 policies do not exist: the stack declares none."""
    args = GuardrailArgs(namespace="training", scheduler_name="volcano", priority_class="gpu-training",
                         label_prefix="gpucluster.io", gpu_resource=GPU, handover_gate=None, volcano=True,
                         served=False)
    assert policy_specs(args) == {} and all_policies(args) == {}


def test_a_task_without_a_template_is_no_error(prod: RunResult) -> None:
    """CEL errors refuse under failurePolicy Fail: a templateless task must evaluate, not error."""
    spec = policy(prod, JOB_POLICY)
    assert refusals(spec, {"spec": {"tasks": [{"name": "empty"}]}}) is None
    job = {"spec": {"tasks": [{"name": "empty"}, {"name": "w", "template": {"spec": good_pod_spec(gate=True)}}]}}
    assert refusals(spec, job) == []


def test_gpu_pods_of_inference_go_through_the_gang_scheduler(prod: RunResult) -> None:
    """Inference shares the on-prem GPUs with training: a GPU pod another scheduler places double-books them."""
    spec = policy(prod, GANG_SCHEDULER_POLICY)
    pod = {"spec": {"schedulerName": "default-scheduler", "containers": [
        {"name": "server", "image": "r/i:1", "resources": {"limits": {GPU: "1"}}}]}}
    assert refusals(spec, pod) == [
        "a GPU pod must go through the gang scheduler volcano (two schedulers double-book GPUs, and the gang "
        "scheduler cannot preempt pods it did not place); set schedulerName: volcano, or submit with "
        "`gpucluster train submit`"]
    del pod["spec"]["schedulerName"]  # the default scheduler too
    assert len(refusals(spec, pod) or []) == 1
    pod["spec"]["schedulerName"] = "volcano"
    assert refusals(spec, pod) == []
    pod["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "1"}}
    pod["spec"]["schedulerName"] = "default-scheduler"
    assert refusals(spec, pod) is None  # CPU pods are not its business


@pytest.mark.parametrize("stack", ["prod", "local"])
def test_every_inference_deployment_the_stack_renders_passes(stack: str, request: pytest.FixtureRequest) -> None:
    run: RunResult = request.getfixturevalue(stack)
    spec = policy(run, GANG_SCHEDULER_POLICY)
    deployments = [d for d in run.by_kind("Deployment") if d.metadata.get("namespace") == "inference"]
    assert deployments
    matched = 0
    for d in deployments:
        verdict = refusals(spec, {"spec": d.inputs["spec"]["template"]["spec"]})
        assert verdict in (None, []), (d.metadata["name"], verdict)
        matched += verdict == []
    assert matched, "no inference Deployment requests GPUs"


def test_more_namespaces_can_be_held_to_the_gang_scheduler(run_stack: StackRunner) -> None:
    result = run_stack("prod", lambda cfg: cfg.update({"gpu-cluster:admission": {
        "gangSchedulerNamespaces": ["notebooks", "inference"]}}))
    binding = result.one("ValidatingAdmissionPolicyBinding", GANG_SCHEDULER_POLICY).inputs["spec"]
    assert binding["matchResources"]["namespaceSelector"]["matchExpressions"][0]["values"] == [
        "inference", "notebooks"]
