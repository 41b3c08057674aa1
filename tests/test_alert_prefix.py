"""Alert descriptions name labels, taints and gates under the stack's own label prefix."""

from __future__ import annotations

from typing import Any

from tests.conftest import StackRunner


def _alerts(spec: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {r["alert"]: r for g in spec["groups"] for r in g["rules"] if "alert" in r}


def test_handover_gate_alert_names_the_configured_prefix(run_stack: StackRunner) -> None:
    result = run_stack("local", lambda cfg: cfg.update({"gpu-cluster:labelPrefix": "example.org"}))
    (rule,) = [r for r in result.by_kind("PrometheusRule")]
    description = _alerts(rule.inputs["spec"])["TrainingHeldAtHandoverGate"]["annotations"]["description"]
    assert "example.org/handover gate" in description
    assert "gpucluster.io/handover" not in description
