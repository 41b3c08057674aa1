"""One table, two enforcers: the admission policies and the policy pack cannot drift apart.

Every row of ``components.guardrail_rules.GUARDRAILS`` is checked on both sides with the same bad object: the
rendered admission policy (its CEL evaluated by cel-python) refuses it with exactly the row's message, and the
row's pack rule flags it with a message that ends in the row's fix. Every message the stack's admission
policies carry is a row's, and both sides read the stack's names the same way.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import celpy
import pytest

from components.admission import (
    BURST_TOLERATION_POLICY,
    JOB_POLICY,
    NODE_TAINT_POLICY,
    POD_POLICY,
    RESTART_IN_PLACE_POLICY,
    TEAM_QUEUE_POLICY,
    GuardrailArgs,
)
from components.config import ClusterConfig
from components.guardrail_rules import (
    BURST_TOLERATION,
    GUARDRAILS,
    NODE_BURST_TAINT,
    RESTART_IN_PLACE,
    TEAM_QUEUE,
    TRAINING,
    Guardrail,
    guardrail,
)
from components.mockrt import RunResult
from policies.rules import RULES, Resource, RuleContext, evaluate
from tests.test_admission import good_pod_spec, policy, refusals
from tests.test_policies import res
from tools.localcluster.plan import load_stack_config

ROOT = Path(__file__).resolve().parents[1]
PROD = load_stack_config(ROOT, "prod")
assert isinstance(PROD, ClusterConfig)
CTX = RuleContext.from_config(PROD)
NAMES = GuardrailArgs.from_config(PROD).names


def pack(rule: str | None, resource: Resource) -> list[str]:
    assert rule is not None, "an admission-only row has no pack rule"
    chosen = [r for r in RULES if r.name == rule]
    assert chosen, f"the table names pack rule {rule!r}, which the pack does not have"
    return [v.message for v in evaluate([resource], CTX, chosen)]


def volcano_job(spec: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job",
            "metadata": {"name": "t", "namespace": "training"},
            "spec": {"minAvailable": 2, "tasks": [
                {"name": "worker", "replicas": 2, "minAvailable": 2,
                 "template": {"metadata": {"labels": {"gpucluster.io/workload": "training"}}, "spec": spec}}]}}


#: A training pod spec that breaks exactly the row, from a good one.
BREAK: dict[str, Any] = {
    "gang-scheduler": lambda s: s.update(schedulerName="default-scheduler"),
    "training-priority": lambda s: s.update(priorityClassName="gpu-inference"),
    "onprem-affinity": lambda s: s.pop("affinity"),
    "no-virtual-node-toleration": lambda s: s["tolerations"].append(
        {"key": "gpucluster.io/burst", "operator": "Exists", "effect": "NoSchedule"}),
    "handover-gate": lambda s: s.pop("schedulingGates"),
}
TRAINING_ROWS = [r for r in GUARDRAILS if r.policy == TRAINING]


def test_both_sides_read_the_same_names() -> None:
    assert CTX.guardrail_names == NAMES
    assert NAMES.gate == "gpucluster.io/handover" and NAMES.scheduler == "volcano"


def test_rows_are_unique_and_render() -> None:
    assert len({r.id for r in GUARDRAILS}) == len(GUARDRAILS)
    for row in GUARDRAILS:
        assert "{" not in row.message(NAMES) and "}" not in row.message(NAMES), row.id
    assert set(BREAK) == {r.id for r in TRAINING_ROWS}
    with pytest.raises(KeyError, match="no guardrail 'nope'; known: gang-scheduler"):
        guardrail("nope")


def test_every_admission_message_is_a_row(prod: RunResult) -> None:
    rendered = {v["message"] for p in prod.by_kind("ValidatingAdmissionPolicy")
                for v in p.inputs["spec"]["validations"]}
    assert rendered == {r.message(NAMES) for r in GUARDRAILS}


def test_the_good_training_job_passes_both_sides(prod: RunResult) -> None:
    job = volcano_job(good_pod_spec(gate=True))
    assert refusals(policy(prod, JOB_POLICY), job) == []
    resource = res("Job", "batch.volcano.sh/v1alpha1", "t", "training", spec=job["spec"])
    for row in TRAINING_ROWS:
        assert pack(row.pack_rule, resource) == [], row.id


@pytest.mark.parametrize("row", TRAINING_ROWS, ids=[r.id for r in TRAINING_ROWS])
def test_a_training_row_is_enforced_by_both_sides_in_the_same_words(prod: RunResult, row: Guardrail) -> None:
    spec = good_pod_spec(gate=True)
    BREAK[row.id](spec)
    assert refusals(policy(prod, POD_POLICY), {"spec": copy.deepcopy(spec)}) == [row.message(NAMES)]
    job = volcano_job(spec)
    assert refusals(policy(prod, JOB_POLICY), job) == [row.message(NAMES)]
    found = pack(row.pack_rule, res("Job", "batch.volcano.sh/v1alpha1", "t", "training", spec=job["spec"]))
    assert len(found) == 1 and row.fix_text(NAMES) in found[0], found


def test_the_burst_toleration_row_on_both_sides(prod: RunResult) -> None:
    [row] = [r for r in GUARDRAILS if r.policy == BURST_TOLERATION]
    labels = {"gpucluster.io/workload": "inference", "app.kubernetes.io/name": "chat"}
    spec = {"schedulerName": "volcano", "priorityClassName": "gpu-inference",
            "tolerations": [{"key": "gpucluster.io/burst", "operator": "Exists", "effect": "NoSchedule"}],
            "containers": [{"name": "c", "image": "r/i:1", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}
    assert refusals(policy(prod, BURST_TOLERATION_POLICY), {"metadata": {"labels": labels}, "spec": spec}) == [
        row.message(NAMES)]
    deployment = res("Deployment", "apps/v1", "chat", "inference", labels, spec={
        "selector": {"matchLabels": labels}, "template": {"metadata": {"labels": labels}, "spec": spec}})
    found = pack(row.pack_rule, deployment)
    assert len(found) == 1 and row.fix_text(NAMES) in found[0], found


def test_the_node_taint_row_on_both_sides(prod: RunResult) -> None:
    [row] = [r for r in GUARDRAILS if r.policy == NODE_BURST_TAINT]
    node = {"metadata": {"name": "gpu-a-001"}, "spec": {"taints": [
        {"key": "gpucluster.io/burst", "value": "open", "effect": "NoExecute"}]}}
    [validation] = policy(prod, NODE_TAINT_POLICY)["validations"]
    env = celpy.Environment()
    verdict = env.program(env.compile(validation["expression"])).evaluate(
        {"object": celpy.json_to_cel(node), "request": celpy.json_to_cel({"operation": "CREATE"})})
    assert not verdict and validation["message"] == row.message(NAMES)
    found = pack(row.pack_rule, res("Node", "v1", "gpu-a-001", spec=node["spec"]))
    assert len(found) == 1 and row.fix_text(NAMES) in found[0], found


def test_only_rules_about_who_sends_an_object_are_admission_only() -> None:
    """The pack sees only what the stack declares, all of it sent by the deploying identity: a rule about the
    sender has no pack side. Every other row names a rule the pack has."""
    assert [r.id for r in GUARDRAILS if r.pack_rule is None] == [r.id for r in GUARDRAILS if r.policy == TEAM_QUEUE]
    assert {r.pack_rule for r in GUARDRAILS if r.pack_rule is not None} <= {r.name for r in RULES}


def test_the_team_queue_row_holds_each_researcher_to_their_teams(prod: RunResult) -> None:
    [row] = [r for r in GUARDRAILS if r.policy == TEAM_QUEUE]
    spec = policy(prod, TEAM_QUEUE_POLICY)
    llm = {"operation": "CREATE", "userInfo": {"username": "alice", "groups": ["research-llm", "system:authenticated"]}}

    def job(queue: str | None) -> dict[str, Any]:
        body = volcano_job(good_pod_spec(gate=True))
        if queue is not None:
            body["spec"]["queue"] = queue
        return body

    assert refusals(spec, job("team-llm"), llm) == []
    # Another team's queue, the stack's training queue, no queue at all (Volcano's default): refused, saying which.
    for queue, asked in (("team-vision", "team-vision"), ("training", "training"), (None, "default")):
        assert refusals(spec, job(queue), llm) == [row.message(NAMES)], queue
        assert refusals(spec, job(queue), llm, detailed=True) == [f"{row.message(NAMES)} (queue: {asked})"]
    # Changing or cancelling another team's job: the same refusal (a DELETE's job is the old object).
    update = {**llm, "operation": "UPDATE"}
    assert refusals(spec, job("team-vision"), update, old=job("team-vision")) == [row.message(NAMES)]
    # Nor take another team's job into one's own queue, nor one's own into another's.
    assert refusals(spec, job("team-llm"), update, detailed=True, old=job("team-vision")) == [
        f"{row.message(NAMES)} (queue: team-vision)"]
    assert refusals(spec, job("team-vision"), update, old=job("team-llm")) == [row.message(NAMES)]
    assert refusals(spec, job("team-llm"), update, old=job("team-llm")) == []
    delete = {**llm, "operation": "DELETE"}
    assert refusals(spec, None, delete, detailed=True, old=job("team-vision")) == [
        f"{row.message(NAMES)} (queue: team-vision)"]
    assert refusals(spec, None, delete, old=job("team-llm")) == []
    # A member of both teams may use either.
    both = {"operation": "CREATE", "userInfo": {"username": "bob", "groups": ["research-llm", "research-vision"]}}
    assert refusals(spec, job("team-vision"), both) == []
    # Whoever is in no team's group (the stack's identity, admins, Volcano's controllers), or in no group at
    # all, is not matched.
    for groups in (["system:masters"], ["system:serviceaccounts", "system:serviceaccounts:volcano-system"], []):
        assert refusals(spec, job("training"), {"operation": "CREATE", "userInfo": {"groups": groups}}) is None
    assert refusals(spec, job("training"), {"operation": "CREATE", "userInfo": {"username": "x"}}) is None
    # In the training namespace only, and it denies.
    binding = prod.one("ValidatingAdmissionPolicyBinding", TEAM_QUEUE_POLICY).inputs["spec"]
    assert binding["validationActions"] == ["Deny"]
    assert binding["matchResources"]["namespaceSelector"] == {
        "matchLabels": {"kubernetes.io/metadata.name": "training"}}


def test_the_restart_in_place_row_warns_a_researchers_job_and_the_pack_refuses_the_stacks(prod: RunResult) -> None:
    """A job the supervisor cannot restart in place still runs (as a whole gang): kubectl shows the warning and the
    audit log records it; the stack's own jobs are refused by the pack, in the same words."""
    [row] = [r for r in GUARDRAILS if r.policy == RESTART_IN_PLACE]
    spec = policy(prod, RESTART_IN_PLACE_POLICY)
    binding = prod.one("ValidatingAdmissionPolicyBinding", RESTART_IN_PLACE_POLICY).inputs["spec"]
    assert binding["validationActions"] == ["Warn", "Audit"]
    assert binding["matchResources"]["namespaceSelector"] == {
        "matchLabels": {"kubernetes.io/metadata.name": "training"}}
    supervised = ["python3", "-m", "training_runtime.supervisor", "--", "python3", "train.py"]
    checkpoint = [{"name": "CHECKPOINT_DIR", "value": "/checkpoints/j"}]

    def job(command: list[str] | None, env: list[dict[str, str]] | None) -> dict[str, Any]:
        pod = good_pod_spec(gate=True)
        trainer = pod["containers"][0]
        for key, value in (("command", command), ("env", env)):
            if value is None:
                trainer.pop(key, None)
            else:
                trainer[key] = value
        return volcano_job(pod)

    assert refusals(spec, job(supervised, checkpoint)) == []
    for command, env in ((None, checkpoint), (["python3", "train.py"], checkpoint), (supervised, None),
                         (supervised[:4], checkpoint), (supervised, [{"name": "OTHER", "value": "x"}])):
        body = job(command, env)
        assert refusals(spec, body) == [row.message(NAMES)], (command, env)
        found = pack(row.pack_rule, res("Job", "batch.volcano.sh/v1alpha1", "t", "training", spec=body["spec"]))
        if command != supervised[:4]:  # the pack reads the first words only (the template adds the command after)
            assert found and all(row.fix_text(NAMES) in f for f in found), found
    # A task without GPUs (a parameter server, a data loader) is not held to it.
    cpu = job(None, None)
    cpu["spec"]["tasks"][0]["template"]["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "1"}}
    cpu["spec"]["tasks"].append(volcano_job(good_pod_spec(gate=True))["spec"]["tasks"][0])
    cpu["spec"]["tasks"][1]["template"]["spec"]["containers"][0].update(command=supervised, env=checkpoint)
    assert refusals(spec, cpu) == []


def test_a_stack_that_does_not_restart_in_place_warns_nothing() -> None:
    from dataclasses import replace

    from components.admission import all_policies

    args = GuardrailArgs.from_config(PROD)
    assert args.restart_in_place and RESTART_IN_PLACE_POLICY in all_policies(args)
    assert RESTART_IN_PLACE_POLICY not in all_policies(replace(args, restart_in_place=False))
    assert RESTART_IN_PLACE_POLICY not in all_policies(replace(args, volcano=False))
