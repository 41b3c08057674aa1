"""Every rendered object of every stack validates strictly against its schema.

Built-in kinds use the Kubernetes OpenAPI schema of the stack's declared version
(kubernetes-validate --strict); CRD-backed kinds use the structural schemas in tests/crd_schemas/,
written from the upstream CRD field lists. A CRD kind with no schema fails the test.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest

from components.config import parse_config
from components.mockrt import RunResult, raw_from_stack
from tools.render import manifests

SCHEMAS = Path(__file__).parent / "crd_schemas"
BUILTIN_GROUPS = {
    "v1", "apps/v1", "batch/v1", "policy/v1", "autoscaling/v2", "scheduling.k8s.io/v1",
    "rbac.authorization.k8s.io/v1", "storage.k8s.io/v1", "coordination.k8s.io/v1",
    "apiextensions.k8s.io/v1", "networking.k8s.io/v1", "apiregistration.k8s.io/v1",
    "admissionregistration.k8s.io/v1",
}


def crd_schema(manifest: dict[str, Any]) -> dict[str, Any]:
    group_version = manifest["apiVersion"].replace("/", "_")
    path = SCHEMAS / f"{group_version}_{manifest['kind']}.json"
    if not path.exists():
        pytest.fail(f"no schema for {manifest['apiVersion']} {manifest['kind']}: add {path.name}")
    schema: dict[str, Any] = json.loads(path.read_text())
    return schema


#: CRDs that embed core pod templates: those are validated strictly as core PodTemplates too.
EMBEDDED_TEMPLATES = {
    ("batch.volcano.sh/v1alpha1", "Job"): lambda m: [t["template"] for t in m["spec"]["tasks"]],
}


def validate_all(result: RunResult, version: str) -> list[str]:
    errors = []
    for name, manifest in manifests(result).items():
        embedded = EMBEDDED_TEMPLATES.get((manifest["apiVersion"], manifest["kind"]))
        for index, template in enumerate(embedded(manifest) if embedded else []):
            wrapper = {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "embedded"},
                       "template": template}
            try:
                kubernetes_validate.validate(wrapper, version, strict=True)
            except kubernetes_validate.ValidationError as error:
                errors.append(f"{name} template {index}: {error.message} at {'/'.join(map(str, error.path))}")
        if manifest["apiVersion"] in BUILTIN_GROUPS:
            patch = name.endswith(".patch.yaml")
            try:
                kubernetes_validate.validate(manifest, version, strict=not patch)
            except kubernetes_validate.ValidationError as error:
                errors.append(f"{name}: {error.message} at {'/'.join(map(str, error.path))}")
        else:
            validator = jsonschema.Draft7Validator(crd_schema(manifest))
            errors += [f"{name}: {e.message} at {'/'.join(map(str, e.path))}" for e in validator.iter_errors(manifest)]
    return errors


@pytest.mark.parametrize("stack", ["prod", "local"])
def test_every_object_validates_strictly(stack: str, request: pytest.FixtureRequest) -> None:
    result: RunResult = request.getfixturevalue(stack)
    version = parse_config(raw_from_stack(stack), f"Pulumi.{stack}.yaml").kubernetes_version
    assert manifests(result), "the stack rendered no objects"
    assert validate_all(result, version) == []


def test_strict_validation_catches_an_unknown_field(local: RunResult) -> None:
    ns = next(m for m in manifests(local).values() if m["kind"] == "Namespace")
    broken = {**ns, "spec": {"finalizers": ["kubernetes"], "notAField": True}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, "1.34", strict=True)


def test_crd_schema_catches_an_unknown_field(local: RunResult) -> None:
    queue = next(m for m in manifests(local).values() if m["kind"] == "Queue")
    broken = {**queue, "spec": {**queue["spec"], "wieght": 3}}
    assert list(jsonschema.Draft7Validator(crd_schema(broken)).iter_errors(broken))
