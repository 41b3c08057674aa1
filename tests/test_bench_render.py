"""The synthetic stacks the render benchmark measures are valid and have the size they claim."""

from __future__ import annotations

import json

from agents.node_pools.contract import parse_settings
from bench.bench_render import synthetic
from components.mockrt import run_program


def test_synthetic_stack_has_the_requested_nodes() -> None:
    config, secrets = synthetic(64)
    result = run_program("prod", config, secrets)
    data = result.one("ConfigMap", "node-pools-settings").inputs["data"]["settings.json"]
    gpu_nodes = [n for n in parse_settings(json.loads(data)).membership() if n.startswith("gpu-")]
    assert len(gpu_nodes) == 64
    assert result.outputs["onpremGpus"] == 64 * 8
