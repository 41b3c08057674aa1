"""System agents built by one builder: the same placement, identity, grants and selectors for every agent."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from components.images import image_version
from components.mockrt import Registered, RunResult

NS = "gpu-system"
SYSTEM_POOL = {"gpucluster.io/pool": "system"}

_name = st.from_regex(r"[a-z0-9]([a-z0-9-]{0,10}[a-z0-9])?", fullmatch=True)
_tag = st.from_regex(r"[A-Za-z0-9]([A-Za-z0-9_.-]{0,20}[A-Za-z0-9])?", fullmatch=True)
#: Any tag the OCI distribution spec allows: up to 128 characters, starting with a word character.
_any_tag = st.from_regex(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}", fullmatch=True)
_LABEL_VALUE = r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?"
_digest = st.from_regex(r"sha256:[0-9a-f]{64}", fullmatch=True)


@given(registry=st.sampled_from(["", "registry.k8s.io/", "localhost:5000/", "ghcr.io/org/"]), name=_name,
       tag=_tag, digest=st.none() | _digest)
def test_version_label_is_the_tag(registry: str, name: str, tag: str, digest: str | None) -> None:
    image = f"{registry}{name}:{tag}" + (f"@{digest}" if digest else "")
    assert image_version(image) == tag


@given(name=_name, tag=_any_tag, digest=st.none() | _digest)
def test_version_label_is_always_a_valid_label_value(name: str, tag: str, digest: str | None) -> None:
    """A 128-character tag, one starting with '_', a digest: the label stays a valid label value."""
    import re

    value = image_version(f"ghcr.io/org/{name}:{tag}" + (f"@{digest}" if digest else ""))
    assert len(value) <= 63 and re.fullmatch(_LABEL_VALUE, value), value
    assert value in tag


@given(registry=st.sampled_from(["", "localhost:5000/"]), name=_name, digest=_digest)
def test_digest_only_image_has_no_version(registry: str, name: str, digest: str) -> None:
    assert image_version(f"{registry}{name}@{digest}") == ""


def _pod_spec(workload: Registered) -> dict[str, Any]:
    spec = workload.inputs["spec"]
    if workload.kind == "CronJob":
        spec = spec["jobTemplate"]["spec"]
    template: dict[str, Any] = spec["template"]["spec"]
    return template


AGENTS = [("Deployment", "burst-controller"), ("CronJob", "descheduler"), ("Deployment", "vk-lambda-east")]


@pytest.mark.parametrize(("kind", "app"), AGENTS)
def test_agent_pods_run_as_their_account_on_the_system_pool(prod: RunResult, kind: str, app: str) -> None:
    workload = prod.one(kind, app)
    pod = _pod_spec(workload)
    assert pod["serviceAccountName"] == app
    assert pod["nodeSelector"] == SYSTEM_POOL
    assert pod["priorityClassName"] == "platform-critical"
    assert pod["securityContext"]["runAsNonRoot"] is True
    account = prod.one("ServiceAccount", app)
    assert account.metadata["namespace"] == workload.metadata["namespace"]


@pytest.mark.parametrize(("kind", "app"), AGENTS)
def test_agent_pods_wait_for_every_grant_of_their_account(prod: RunResult, kind: str, app: str) -> None:
    workload = prod.one(kind, app)
    bindings = [r for r in prod.by_kind("ClusterRoleBinding") + prod.by_kind("RoleBinding")
                if any(s["name"] == app for s in r.inputs["subjects"])]
    assert bindings
    assert {b.urn for b in bindings} <= set(workload.depends_on)


def test_ha_agent_selectors_agree(prod: RunResult) -> None:
    deployment = prod.one("Deployment", "burst-controller")
    selector = deployment.inputs["spec"]["selector"]["matchLabels"]
    assert deployment.inputs["spec"]["template"]["metadata"]["labels"].items() >= selector.items()
    assert prod.one("PodDisruptionBudget", "burst-controller").inputs["spec"]["selector"]["matchLabels"] == selector
    assert prod.one("Service", "burst-controller-metrics").inputs["spec"]["selector"] == selector
    assert prod.one("ServiceMonitor", "burst-controller").inputs["spec"]["selector"]["matchLabels"] == selector


def test_descheduler_version_label_comes_from_its_image(prod: RunResult) -> None:
    cron = prod.one("CronJob", "descheduler")
    image = _pod_spec(cron)["containers"][0]["image"]
    assert cron.metadata["labels"]["app.kubernetes.io/version"] == image_version(image) != ""
