"""The MutatingAdmissionPolicy that adds the training defaults to Volcano Jobs, where the stack declares one.

The JSON patch expression is evaluated with cel-python (``JSONPatch`` declared as a message type), the
patches applied to the Job, and the validating policy then judges the result: a Job that lacked only the
priority class and the gate passes after mutation, and one with a wrong class still fails.
"""

from __future__ import annotations

import copy
from typing import Any

import celpy
import pytest

from components.admission import JOB_POLICY, MAX_MUTATED_TASKS, MUTATING_POLICY, GuardrailArgs, mutating_policy_spec
from components.config import Admission, ConfigError, MutatingMode, parse_config
from components.mockrt import RunResult, raw_from_stack
from tests.conftest import StackRunner
from tests.test_admission import good_pod_spec, policy, refusals

P = "gpu-cluster:"
GATE = "gpucluster.io/handover"


def args(**changes: Any) -> GuardrailArgs:
    base = GuardrailArgs(namespace="training", scheduler_name="volcano", priority_class="gpu-training",
                         label_prefix="gpucluster.io", gpu_resource="nvidia.com/gpu", handover_gate=GATE,
                         volcano=True, mutating_api="admissionregistration.k8s.io/v1beta1")
    return GuardrailArgs(**{**base.__dict__, **changes})


def patches(spec: dict[str, Any], obj: dict[str, Any]) -> list[dict[str, Any]]:
    env = celpy.Environment(annotations={"JSONPatch": celpy.celtypes.MessageType})
    act = {"object": celpy.json_to_cel(obj)}
    for cond in spec["matchConditions"]:
        if not env.program(env.compile(cond["expression"])).evaluate(act):
            return []
    [mutation] = spec["mutations"]
    result = env.program(env.compile(mutation["jsonPatch"]["expression"])).evaluate(act)
    return [_plain(p) for p in result]


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return str(value) if isinstance(value, str) else value


def apply(obj: dict[str, Any], ops: list[dict[str, Any]]) -> dict[str, Any]:
    """RFC 6902 ``add`` (the only op the policy uses), on a copy."""
    out = copy.deepcopy(obj)
    for op in ops:
        assert op["op"] == "add"
        *parents, last = op["path"].lstrip("/").split("/")
        target: Any = out
        for key in parents:
            target = target[int(key)] if isinstance(target, list) else target[key]
        if last == "-":
            target.append(op["value"])
        else:
            target[last] = op["value"]
    return out


def job(*templates: dict[str, Any], **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job", "metadata": {"name": "j"},
            "spec": {"schedulerName": "volcano", **spec,
                     "tasks": [{"name": f"t{i}", "template": {"spec": t}} for i, t in enumerate(templates)]}}


def bare(gates: list[str] | None = None) -> dict[str, Any]:
    """A good training template without its priority class and (unless given) its gates."""
    spec = good_pod_spec(gate=False)
    del spec["priorityClassName"]
    if gates is not None:
        spec["schedulingGates"] = [{"name": g} for g in gates]
    return spec


def test_the_mutation_adds_what_is_missing_and_the_job_then_passes(prod: RunResult) -> None:
    spec = mutating_policy_spec(args())
    assert spec is not None
    before = job(bare(), bare(["example.com/other"]), bare([GATE]))
    assert refusals(policy(prod, JOB_POLICY), before)  # refused as submitted
    ops = patches(spec, before)
    assert ops == [
        {"op": "add", "path": "/spec/priorityClassName", "value": "gpu-training"},
        {"op": "add", "path": "/spec/tasks/0/template/spec/schedulingGates", "value": [{"name": GATE}]},
        {"op": "add", "path": "/spec/tasks/1/template/spec/schedulingGates/-", "value": {"name": GATE}},
    ]
    assert refusals(policy(prod, JOB_POLICY), apply(before, ops)) == []


def test_a_set_class_is_kept_and_still_refused_when_wrong(prod: RunResult) -> None:
    spec = mutating_policy_spec(args())
    assert spec is not None
    wrong = job(bare([GATE]), priorityClassName="gpu-inference")
    assert patches(spec, wrong) == []
    assert len(refusals(policy(prod, JOB_POLICY), wrong) or []) == 1


def test_cpu_only_jobs_are_not_touched() -> None:
    spec = mutating_policy_spec(args())
    assert spec is not None
    cpu = bare()
    cpu["containers"][0]["resources"] = {"requests": {"cpu": "1"}}
    assert patches(spec, job(cpu)) == []


def test_tasks_beyond_the_reach_keep_what_they_have() -> None:
    spec = mutating_policy_spec(args())
    assert spec is not None
    many = job(*[bare() for _ in range(MAX_MUTATED_TASKS + 2)], priorityClassName="gpu-training")
    paths = [op["path"] for op in patches(spec, many)]
    assert paths == [f"/spec/tasks/{i}/template/spec/schedulingGates" for i in range(MAX_MUTATED_TASKS)]


def test_without_the_handover_only_the_class_is_added() -> None:
    spec = mutating_policy_spec(args(handover_gate=None))
    assert spec is not None
    assert patches(spec, job(bare())) == [{"op": "add", "path": "/spec/priorityClassName", "value": "gpu-training"}]


@pytest.mark.parametrize(("changes", "declared"), [
    ({"mutating_api": None}, False), ({"volcano": False}, False), ({"served": False}, False), ({}, True)])
def test_declared_only_with_an_api_volcano_and_served_guardrails(changes: dict[str, Any], declared: bool) -> None:
    assert (mutating_policy_spec(args(**changes)) is not None) is declared


@pytest.mark.parametrize(("mode", "minor", "api"), [
    (MutatingMode.AUTO, (1, 35), None), (MutatingMode.AUTO, (1, 36), "admissionregistration.k8s.io/v1"),
    (MutatingMode.V1BETA1, (1, 34), "admissionregistration.k8s.io/v1beta1"), (MutatingMode.OFF, (1, 36), None)])
def test_which_api_by_mode_and_version(mode: MutatingMode, minor: tuple[int, int], api: str | None) -> None:
    assert Admission(mutating=mode).mutating_api(minor) == api


def test_the_stacks_validate_only_by_default(prod: RunResult, local: RunResult) -> None:
    for run in (prod, local):
        assert not run.by_kind("MutatingAdmissionPolicy") and not run.by_kind("MutatingAdmissionPolicyBinding")


def test_v1beta1_on_the_local_stack_declares_the_policy_and_its_binding(run_stack: StackRunner) -> None:
    run = run_stack("local", lambda c: c.__setitem__(P + "admission", {"mutating": "v1beta1"}))
    [mutating] = run.by_kind("MutatingAdmissionPolicy")
    assert mutating.inputs["apiVersion"] == "admissionregistration.k8s.io/v1beta1"
    assert mutating.metadata["name"] == MUTATING_POLICY
    assert mutating.inputs["spec"]["failurePolicy"] == "Ignore"
    [binding] = run.by_kind("MutatingAdmissionPolicyBinding")
    assert binding.inputs["spec"] == {"policyName": MUTATING_POLICY, "matchResources": {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "training"}}}}


def test_v1beta1_below_1_34_is_refused() -> None:
    raw = copy.deepcopy(raw_from_stack("local"))
    raw.update(kubernetesVersion="1.33", admission={"mutating": "v1beta1"})
    with pytest.raises(ConfigError, match=r"admission\.mutating: v1beta1 MutatingAdmissionPolicy is served from "
                                          r"Kubernetes 1\.34 .*kubernetesVersion is 1\.33"):
        parse_config(raw, "Pulumi.local.yaml")
