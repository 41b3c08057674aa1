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

from components.admission import BURST_TOLERATION_POLICY, JOB_POLICY, NODE_TAINT_POLICY, POD_POLICY, GuardrailArgs
from components.config import ClusterConfig
from components.guardrail_rules import BURST_TOLERATION, GUARDRAILS, NODE_BURST_TAINT, TRAINING, Guardrail, guardrail
from policies.rules import RULES, Resource, RuleContext, evaluate
from tests.test_admission import good_pod_spec, policy, refusals
from tests.test_policies import res
from tools.localcluster.plan import load_stack_config
from tools.mockrt import RunResult

ROOT = Path(__file__).resolve().parents[1]
PROD = load_stack_config(ROOT, "prod")
assert isinstance(PROD, ClusterConfig)
CTX = RuleContext.from_config(PROD)
NAMES = GuardrailArgs.from_config(PROD).names


def pack(rule: str, resource: Resource) -> list[str]:
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
