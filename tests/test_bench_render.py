"""The synthetic stacks the render benchmark measures are valid and have the size they claim."""

from __future__ import annotations

from bench.bench_render import synthetic
from tools.mockrt import run_program


def test_synthetic_stack_has_the_requested_nodes() -> None:
    config, secrets = synthetic(64)
    result = run_program("prod", config, secrets)
    gpu_nodes = [
        r for r in result.by_type("kubernetes:core/v1:NodePatch") if r.metadata["name"].startswith("gpu-")
    ]
    assert len(gpu_nodes) == 64
    assert result.outputs["onpremGpus"] == 64 * 8
