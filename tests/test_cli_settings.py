"""One source: the published settings rebuild the stack's template arguments, and a CLI job renders the same
pod template as a stack job from the same spec."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from components.cluster_settings import SETTINGS_CONFIGMAP, SETTINGS_KEY, ClusterSettings, parse_settings
from components.config import ClusterConfig
from components.mockrt import RunResult
from components.training_job import TrainingJobArgs
from gpucluster_cli.render import pod_monitor, volcano_job
from gpucluster_cli.spec import parse_spec, resolve
from tests.conftest import StackRunner
from tools.localcluster.plan import load_stack_config

ROOT = Path(__file__).resolve().parents[1]


def published(run: RunResult) -> ClusterSettings:
    cm = run.one("ConfigMap", SETTINGS_CONFIGMAP)
    assert cm.metadata["namespace"] == "training"
    return parse_settings(cm.inputs["data"][SETTINGS_KEY])


@pytest.mark.parametrize("stack", ["prod", "local"])
def test_published_settings_rebuild_the_stacks_template_args(stack: str, request: pytest.FixtureRequest) -> None:
    """For every job in the stack file (enabled or not), the CLI's args equal ``TrainingJobArgs.from_config``."""
    cfg = load_stack_config(ROOT, stack)
    assert isinstance(cfg, ClusterConfig) and cfg.training.jobs
    settings = published(request.getfixturevalue(stack))
    for job in cfg.training.jobs:
        assert settings.training_args(job) == TrainingJobArgs.from_config(cfg, job)


def test_settings_carry_pools_queues_prefix_claims(prod: RunResult) -> None:
    data = json.loads(prod.one("ConfigMap", SETTINGS_CONFIGMAP).inputs["data"][SETTINGS_KEY])
    assert data["labelPrefix"] == "gpucluster.io" and data["schedulerName"] == "volcano"
    assert data["priorityClass"] == "gpu-training" and data["handoverGateName"] == "gpucluster.io/handover"
    assert data["trainingNamespace"] == "training"
    assert {p["pool"]["name"]: p["queue"] for p in data["pools"]}
    assert all(c["claim"] for c in data["checkpointClaims"])


def test_newer_settings_are_refused_with_an_upgrade_hint(prod: RunResult) -> None:
    data = json.loads(prod.one("ConfigMap", SETTINGS_CONFIGMAP).inputs["data"][SETTINGS_KEY])
    data["version"] = 99
    with pytest.raises(ValueError, match="upgrade the CLI"):
        parse_settings(json.dumps(data))


def test_warm_spare_keys_are_published_only_where_a_stack_sets_them(prod: RunResult,
                                                                    run_stack: StackRunner) -> None:
    """Prod sizes its spares from the defaults, which every reader shares: nothing new is published and a CLI of
    the version before still reads it. A stack that sets a spare key publishes it, as version 6."""
    from components.published_settings import IN_PLACE_SETTINGS_VERSION, SETTINGS_VERSION

    data = json.loads(prod.one("ConfigMap", SETTINGS_CONFIGMAP).inputs["data"][SETTINGS_KEY])
    assert data["version"] == IN_PLACE_SETTINGS_VERSION
    assert not {"spareNodes", "repairHours", "spareCoverage"} & {k for p in data["pools"] for k in p["pool"]}
    assert [p.pool.spares for p in published(prod).pools] == [4, 4]  # the same sizing as the stack's
    edited = run_stack("prod", lambda cfg: cfg["gpu-cluster:pools"][1].update(spareNodes=2, repairHours=24))
    data = json.loads(edited.one("ConfigMap", SETTINGS_CONFIGMAP).inputs["data"][SETTINGS_KEY])
    assert data["version"] == SETTINGS_VERSION == 6
    assert [{k: p["pool"][k] for k in ("spareNodes", "repairHours") if k in p["pool"]} for p in data["pools"]] == [
        {}, {"spareNodes": 2, "repairHours": 24.0}]
    assert [p.pool.spares for p in published(edited).pools] == [4, 2]


SPEC = """
name: cli-twin
image: registry.local/training/trainer:1.0.0
command: ["python", "-m", "train", "--steps=1000"]
gpus: {nodes: 2, gpusPerNode: 8}
checkpointInterval: 250
team: vision
"""


TEAMS = [{"name": "vision", "group": "research-vision", "guaranteeGpus": 8, "capabilityGpus": 16},
         {"name": "nlp", "guaranteeGpus": 16, "reclaimable": False}]


def with_teams(cfg: dict[str, Any]) -> None:
    cfg.setdefault("gpu-cluster:scheduling", {})["teams"] = TEAMS


def test_cli_job_and_stack_job_from_the_same_spec_render_identically(run_stack: StackRunner) -> None:
    """The job resolved from a CLI spec, put in the stack file, renders the very Volcano Job spec the CLI applies."""
    spec = parse_spec(SPEC, "twin.yaml")
    first = run_stack("local", with_teams)
    job = resolve(spec, published(first), "twin.yaml")
    assert job.team == "vision"

    def add(cfg: dict[str, Any]) -> None:
        with_teams(cfg)
        cfg["gpu-cluster:training"]["jobs"].append(job.model_dump(mode="json", by_alias=True, exclude_none=True))

    run = run_stack("local", add)
    settings = published(run)
    stack_job = run.one("Job", "cli-twin").inputs
    cli_job = volcano_job(settings, job, spec.team)
    assert stack_job["apiVersion"] == cli_job["apiVersion"]
    assert cli_job["spec"]["tasks"][0]["template"] == stack_job["spec"]["tasks"][0]["template"]
    assert cli_job["spec"] == stack_job["spec"]
    # The team's queue; its pods are reclaim victims only above the team's guarantee (a reclaimable queue).
    assert cli_job["spec"]["queue"] == "team-vision"
    assert cli_job["spec"]["tasks"][0]["template"]["metadata"]["annotations"]["volcano.sh/preemptable"] == "true"
    stack_monitor = run.one("PodMonitor", "cli-twin").inputs
    assert pod_monitor(settings, job, spec.team)["spec"] == stack_monitor["spec"]
    # What differs is only who manages it and the team label.
    assert cli_job["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "gpucluster-cli"
    assert cli_job["metadata"]["labels"]["gpucluster.io/team"] == "vision"


json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=8),
                           lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner,
                                                                                       max_size=3), max_leaves=8)


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.sampled_from(["version", "labelPrefix", "pools", "engine", "nccl", "x"]), json_values,
                       max_size=5) | json_values)
def test_any_published_json_parses_or_raises_value_error(data: Any) -> None:
    """The ConfigMap is editable by admins: whatever it holds, the CLI gets a ValueError it can show, or settings."""
    with contextlib.suppress(ValueError):
        parse_settings(json.dumps(data))


def test_broken_json_is_a_value_error() -> None:
    with pytest.raises(ValueError):
        parse_settings("{not json")
