"""Agent contracts: what a component renders from the stack is what the agent's own parser reads back."""

from __future__ import annotations

import importlib
import json
import shlex
from pathlib import Path

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from agents.checkpoint_check import cli as reduce_cli
from agents.checkpoint_check.contract import DEFAULT_MIN_OVERLAP, REDUCE_COMMAND, ReduceSettings
from agents.ib_exporter import cli as ib_cli
from agents.ib_exporter.contract import DEFAULT_PORT, HOST_SYSFS_ROOT, IbExporterSettings
from components.checkpoint import reduce_settings
from components.config import parse_config
from components.mockrt import RunResult
from components.observability import ib_exporter_settings as ib_settings

STACK = {"pools": [{"name": "gpu", "nodes": ["gpu-[01-04]"]}], "systemPool": {"nodes": ["cpu-01"]}}


@given(port=st.integers(1024, 65535), root=st.sampled_from(["/sys", "/host/sys", "/tmp/fake sys"]))
def test_ib_exporter_reads_back_its_settings(port: int, root: str) -> None:
    settings = IbExporterSettings(sysfs_root=root, port=port)
    parsed = ib_cli.build_parser().parse_args(settings.args())
    assert (parsed.sysfs_root, parsed.listen_address) == (root, ("0.0.0.0", port))


def test_ib_exporter_defaults_are_the_contract() -> None:
    parsed = ib_cli.build_parser().parse_args([])
    assert parsed.listen_address == ("0.0.0.0", DEFAULT_PORT)
    assert parse_config(STACK, "Pulumi.test.yaml").observability.ib_exporter_port == DEFAULT_PORT


def test_ib_exporter_settings_follow_the_stack() -> None:
    cfg = parse_config({**STACK, "observability": {"ibExporterPort": 9444}}, "Pulumi.test.yaml")
    assert ib_settings(cfg) == IbExporterSettings(sysfs_root=HOST_SYSFS_ROOT, port=9444)


@given(expect=st.integers(0, 4096), budget=st.floats(0.001, 1e5), wait=st.integers(0, 86_400),
       overlap=st.sampled_from([DEFAULT_MIN_OVERLAP, 0.5, 1.0]))
def test_reducer_reads_back_its_settings(expect: int, budget: float, wait: int, overlap: float) -> None:
    line = ReduceSettings(expect=expect, budget_gbps=budget, wait_seconds=wait, min_overlap=overlap).command("/r")
    program, *argv = shlex.split(line)
    parsed = reduce_cli.build_parser().parse_args(argv)
    assert program == REDUCE_COMMAND
    assert (parsed.results, parsed.expect, parsed.wait_seconds, parsed.min_overlap) == (Path("/r"), expect, wait,
                                                                                       overlap)
    assert abs(parsed.budget_gbps - budget) <= 0.0005


def test_reducer_settings_follow_the_stack() -> None:
    cfg = parse_config({**STACK, "checkpoint": {
        "filesystems": [{"name": "nfs", "backend": "nfs", "server": "nfs.example", "share": "/c", "writeGbps": 2}],
        "budget": {"sizeTb": 2, "seconds": 40},
        "throughputCheck": {"enabled": True, "filesystem": "nfs", "nodes": 3, "deadlineSeconds": 900},
    }}, "Pulumi.test.yaml")
    assert reduce_settings(cfg) == ReduceSettings(expect=3, budget_gbps=50.0, wait_seconds=900)


def test_health_guard_stack_defaults_are_the_contract() -> None:
    """A stack that says nothing about the guard runs it with the guard's own defaults (no second copy)."""
    from agents.health_guard.contract import HealthSettings
    from components.health_guard import settings_from_config as health_settings

    agent, deployed = HealthSettings(), health_settings(parse_config(STACK, "Pulumi.test.yaml"))
    shared = (
        "stale_after_seconds", "probation_seconds", "max_nodes_per_hour", "max_nodes_quarantined",
        "max_pool_percent_per_hour", "max_pool_percent_quarantined", "flap_limit", "flap_window_seconds",
        "evict_inference_on_fatal",
    )
    assert {k: getattr(deployed, k) for k in shared} == {k: getattr(agent, k) for k in shared}
    assert deployed.signals == agent.signals


@pytest.mark.parametrize(("configmap", "cli", "model"), [
    ("burst-controller-settings", "agents.burst_controller.cli", "agents.burst_controller.contract:BurstSettings"),
    ("health-guard-settings", "agents.health_guard.cli", "agents.health_guard.contract:HealthSettings"),
    ("node-pools-settings", "agents.node_pools.cli", "agents.node_pools.contract:NodePoolSettings"),
])
def test_every_agent_checks_the_stacks_settings_and_prints_them_back(
        configmap: str, cli: str, model: str, prod: RunResult, tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    """`--check-config` on what the stack renders: accepted, and printed as settings the agent reads back equal."""
    (data,) = prod.one("ConfigMap", configmap).inputs["data"].values()
    path = tmp_path / "settings"
    path.write_text(data)
    module = importlib.import_module(cli)
    assert module.main(["--config", str(path), "--check-config"]) == 0
    printed = capsys.readouterr().out
    module_name, cls_name = model.split(":")
    settings_type = getattr(importlib.import_module(module_name), cls_name)
    spec = module.SPEC
    original = spec.parse_settings(yaml.safe_load(data), str(path))
    assert spec.parse_settings(json.loads(printed), "printed") == original
    assert isinstance(original, settings_type)
