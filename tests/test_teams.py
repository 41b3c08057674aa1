"""Team queues and access: a Volcano queue per team beside the training queues, its gangs in it, its group bound.

The queue's ``deserved`` is the team's guarantee and its ``capability`` the team's quota; the stack's
training queues and the inference queue are unchanged by teams (the sibling decision, see
``GangSchedulerArgs.team_queues``).
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from components.cluster_settings import RESEARCHER_ROLE, SETTINGS_CONFIGMAP, SETTINGS_KEY, parse_settings
from components.mockrt import RunResult, config_error
from tests.conftest import StackRunner

P = "gpu-cluster:"
GPU = "nvidia.com/gpu"


def test_prod_teams_get_sibling_queues_with_guarantee_and_quota(prod: RunResult) -> None:
    queues = {r.metadata["name"]: r.inputs["spec"] for r in prod.by_kind("Queue")}
    assert queues["team-llm"] == {"weight": 1, "reclaimable": True, "capability": {GPU: 1536},
                                  "deserved": {GPU: 512}}
    assert queues["team-vision"] == {"weight": 1, "reclaimable": True, "capability": {GPU: 768},
                                     "deserved": {GPU: 256}}
    # Siblings: no queue has a parent, and the training queues still deserve their whole pool.
    assert all("parent" not in spec for spec in queues.values())
    assert queues["training-h100-a"]["deserved"] == {GPU: 1024}


def test_prod_teams_are_bound_to_the_researcher_role_by_group(prod: RunResult) -> None:
    bindings = {b.metadata["name"]: b.inputs for b in prod.by_kind("RoleBinding")
                if b.inputs["roleRef"]["name"] == RESEARCHER_ROLE}
    assert set(bindings) == {f"{RESEARCHER_ROLE}-llm", f"{RESEARCHER_ROLE}-vision"}
    for team, binding in (("llm", bindings[f"{RESEARCHER_ROLE}-llm"]),
                          ("vision", bindings[f"{RESEARCHER_ROLE}-vision"])):
        assert binding["metadata"]["namespace"] == "training"
        assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                      "name": RESEARCHER_ROLE}
        assert binding["subjects"] == [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group",
                                        "name": f"research-{team}"}]


def test_the_settings_publish_the_teams(prod: RunResult) -> None:
    data = json.loads(prod.one("ConfigMap", SETTINGS_CONFIGMAP).inputs["data"][SETTINGS_KEY])
    assert [(t["name"], t["group"], t["guaranteeGpus"], t["capabilityGpus"]) for t in data["teams"]] == [
        ("llm", "research-llm", 512, 1536), ("vision", "research-vision", 256, 768)]
    settings = parse_settings(json.dumps(data))
    assert [t.queue for t in settings.teams] == ["team-llm", "team-vision"]


def test_a_stack_job_of_a_team_lands_in_its_queue_and_is_reclaimable(run_stack: StackRunner) -> None:
    def team_job(c: dict[str, Any]) -> None:
        c[P + "training"]["jobs"][0].update(enabled=True, team="vision")

    run = run_stack("prod", team_job)
    job = next(r for r in run.by_kind("Job") if r.inputs.get("apiVersion") == "batch.volcano.sh/v1alpha1")
    assert job.inputs["spec"]["queue"] == "team-vision"
    annotations = job.inputs["spec"]["tasks"][0]["template"]["metadata"]["annotations"]
    assert annotations["volcano.sh/preemptable"] == "true"


def test_a_team_job_in_a_team_that_is_not_reclaimable_is_not_preemptable(run_stack: StackRunner) -> None:
    def team_job(c: dict[str, Any]) -> None:
        c[P + "scheduling"]["teams"][1]["reclaimable"] = False
        c[P + "training"]["jobs"][0].update(enabled=True, team="vision")

    run = run_stack("prod", team_job)
    assert run.one("Queue", "team-vision").inputs["spec"]["reclaimable"] is False
    job = next(r for r in run.by_kind("Job") if r.inputs.get("apiVersion") == "batch.volcano.sh/v1alpha1")
    assert job.inputs["spec"]["tasks"][0]["template"]["metadata"]["annotations"]["volcano.sh/preemptable"] == "false"


def test_without_teams_no_team_queue_nor_binding(local: RunResult) -> None:
    assert sorted(r.metadata["name"] for r in local.by_kind("Queue")) == ["inference", "training"]
    assert not [b for b in local.by_kind("RoleBinding") if b.inputs["roleRef"]["name"] == RESEARCHER_ROLE]


def _team(index: int, **values: Any) -> Any:
    return lambda raw: raw["scheduling"]["teams"][index].update(values)


@pytest.mark.parametrize(("edit", "expected"), [
    (_team(0, guaranteeGpus=2000), "scheduling.teams[0]: guaranteeGpus (2000) exceeds capabilityGpus (1536)"),
    (_team(0, capabilityGpus=4096), "scheduling.teams[0].capabilityGpus: is more than the 2048 on-prem GPUs"),
    (_team(0, capabilityGpus=None, guaranteeGpus=3000),
     "scheduling.teams[0].guaranteeGpus: is more than the 2048 on-prem GPUs"),
    (lambda raw: raw["scheduling"]["teams"][0].update(capabilityGpus=2048, guaranteeGpus=1900),
     "scheduling.teams: the guarantees add up to 2156 GPUs, more than the 2048 on-prem GPUs"),
    (_team(1, name="llm"), "scheduling.teams[1].name: duplicate team name; first used at index 0"),
    (lambda raw: raw["scheduling"]["inferenceQueue"].update(name="team-llm"),
     "scheduling.teams[0].name: its queue 'team-llm' is also a training or inference queue"),
    (lambda raw: raw["training"]["jobs"][0].update(team="speech"),
     "training.jobs[0].team: unknown team; expected one of ['llm', 'vision']"),
    (_team(0, guaranteeGpus=-1), "scheduling.teams[0].guaranteeGpus"),
    (_team(0, name="LLM"), "scheduling.teams[0].name"),
], ids=["guarantee-over-quota", "quota-over-cluster", "guarantee-over-cluster", "guarantees-sum",
        "duplicate", "queue-collision", "unknown-team-of-a-job", "negative", "not-a-dns-label"])
def test_bad_teams_are_named(edit: Any, expected: str) -> None:
    message = config_error(edit)
    assert "Pulumi.prod.yaml" in message and expected in message, message


def test_teams_need_volcano() -> None:
    def kube_batch(raw: dict[str, Any]) -> None:
        raw["kubernetesVersion"] = "1.24"
        raw["scheduling"]["engine"] = "kube-batch"

    assert "scheduling.teams: team queues need engine 'volcano'" in config_error(kube_batch)
