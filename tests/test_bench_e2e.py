"""The e2e phase report reads what `make e2e` wrote, and says so when it has not run."""

from __future__ import annotations

import json
from pathlib import Path

from bench.bench_e2e import run


def test_reports_the_phases(tmp_path: Path) -> None:
    path = tmp_path / "e2e-phases.json"
    path.write_text(json.dumps({"time_to_open_s": 8.29683, "min_ready_return": 3}))
    result = run(path)
    assert result["time_to_open_s"] == 8.3
    assert result["min_ready_return"] == 3


def test_says_when_not_run(tmp_path: Path) -> None:
    assert run(tmp_path / "missing.json")["status"] == "not run here: run `make e2e` first"


def test_reports_the_fault_loop_headline(tmp_path: Path) -> None:
    path = tmp_path / "e2e-phases.json"
    path.write_text(json.dumps({"fault_time_to_quarantine_s": 2.345, "fault_time_to_gang_running_again_s": 41.0}))
    assert run(path)["fault_loop"] == {"time to quarantine": 2.35,
                                       "time to gang running again (incl. probation and repair)": 41.0}
    path.write_text(json.dumps({"time_to_open_s": 8.0}))
    assert run(path)["fault_loop"] == "fault scenario not in the last run"


def test_reports_the_real_pod_figures_and_image_build_seconds(tmp_path: Path) -> None:
    real, images = tmp_path / "real.json", tmp_path / "build-seconds.json"
    real.write_text(json.dumps({"real_nodes": ["real-system-01"], "liveness_restart_s": 82.5}))
    images.write_text(json.dumps({"health-guard": 139.3}))
    in_pods = tmp_path / "in-pods.json"
    in_pods.write_text(json.dumps({"pulumi_up_s": 33.0, "agent_pods_running": ["vk-local-cloud"]}))
    result = run(tmp_path / "missing.json", real, images, in_pods)["real_pods"]
    assert result == {"real_nodes": ["real-system-01"], "liveness_restart_s": 82.5,
                      "image_build_s": {"health-guard": 139.3},
                      "stack_in_pods": {"pulumi_up_s": 33.0, "agent_pods_running": ["vk-local-cloud"]}}
    none = run(tmp_path / "missing.json", tmp_path / "none.json", tmp_path / "none2.json", tmp_path / "none3.json")
    assert none["real_pods"] == {"status": "not run here: run `make e2e` first",
                                 "stack_in_pods": {"status": "not run here: run `make e2e` first"}}
