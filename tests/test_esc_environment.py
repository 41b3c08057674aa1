"""Pulumi ESC through the stack file's ``environment:`` block: the documented way to hand out provider
credentials. The loader accepts the block, refuses a malformed one with its key, and a stack that takes
its credentials from ESC renders like one that holds them as secrets."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from components.config import ConfigError
from components.config.loading import SECRET_PLACEHOLDER, read_stack_file
from components.mockrt import ROOT, run_program
from tools.engine_runner import config_copy_text

CREDENTIALS = ("gpu-cluster:lambdaEastKubeconfig", "gpu-cluster:drClusterKubeconfig",
               "gpu-cluster:imageQueueCredentials")


def esc_stack(tmp_path: Path, environment: object) -> Path:
    """Pulumi.prod.yaml with its credentials moved out to ESC: no ``secure:`` keys, an environment block."""
    data = yaml.safe_load((ROOT / "Pulumi.prod.yaml").read_text(encoding="utf-8"))
    for key in CREDENTIALS:
        data["config"].pop(key)
    data["environment"] = environment
    path = tmp_path / "Pulumi.prod.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return path


def test_credentials_named_by_the_stack_come_from_the_environment(tmp_path: Path) -> None:
    config, secrets = read_stack_file(esc_stack(tmp_path, ["gpu-cluster/prod-credentials"]))
    assert set(CREDENTIALS) <= secrets
    assert all(config[key] == SECRET_PLACEHOLDER for key in CREDENTIALS)


def test_an_esc_stack_renders_the_same_objects_as_one_with_secrets(tmp_path: Path) -> None:
    committed, committed_secrets = read_stack_file(ROOT / "Pulumi.prod.yaml")
    esc, esc_secrets = read_stack_file(esc_stack(tmp_path, ["gpu-cluster/common", "gpu-cluster/prod@3"]))
    assert (esc, esc_secrets) == (committed, committed_secrets)
    # Registration order varies between runs (outputs resolve concurrently): compare by URN.
    rendered = {r.urn: r.inputs for r in run_program("prod", esc, esc_secrets).resources}
    assert rendered == {r.urn: r.inputs for r in run_program("prod").resources}


def test_without_an_environment_a_missing_credential_is_still_named(tmp_path: Path) -> None:
    path = esc_stack(tmp_path, ["gpu-cluster/prod-credentials"])
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    del data["environment"]
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    config, secrets = read_stack_file(path)
    with pytest.raises(ConfigError, match=r"names config key 'lambdaEastKubeconfig', which is not set"):
        run_program("prod", config, secrets)


@pytest.mark.parametrize("environment", ["gpu-cluster/prod", [], [""], [3], ["a b"], {"imports": ["x"]},
                                         ["org/project/env/extra"]])
def test_a_malformed_environment_block_is_named(tmp_path: Path, environment: object) -> None:
    with pytest.raises(ConfigError, match=r"environment: must be a list of Pulumi ESC environment names"):
        read_stack_file(esc_stack(tmp_path, environment))


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(environment=st.lists(st.text(max_size=30), max_size=4) | st.text(max_size=30) | st.integers())
def test_any_environment_value_is_read_or_named(tmp_path: Path, environment: object) -> None:
    try:
        _config, secrets = read_stack_file(esc_stack(tmp_path, environment))
    except ConfigError as error:
        assert "environment: must be a list of Pulumi ESC environment names" in str(error)
        return
    assert isinstance(environment, list) and environment
    assert all(re.fullmatch(r"[\w.-]+(/[\w.-]+){0,2}(@[\w.-]+)?", e, re.ASCII) for e in environment)
    assert set(CREDENTIALS) <= secrets


def test_the_offline_engine_copy_leaves_esc_out_and_sets_the_credentials_as_placeholders(tmp_path: Path) -> None:
    path = esc_stack(tmp_path, ["gpu-cluster/prod-credentials"])
    text, pending = config_copy_text(path.read_text(encoding="utf-8"), path.name, None, {})
    assert "environment" not in yaml.safe_load(text)
    assert sorted(pending) == sorted(CREDENTIALS)


def test_your_own_engine_keeps_the_environment_block(tmp_path: Path) -> None:
    path = esc_stack(tmp_path, ["gpu-cluster/prod-credentials"])
    text, pending = config_copy_text(path.read_text(encoding="utf-8"), path.name, None, {}, offline=False)
    assert yaml.safe_load(text)["environment"] == ["gpu-cluster/prod-credentials"]
    assert pending == []
