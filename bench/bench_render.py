"""Mock-runtime evaluation time of the program: the prod stack and synthetic 64/256/1,024-node stacks.

Time per resource should stay flat as the stack grows (no quadratic work in components). The baseline
in the same run is the smallest synthetic stack: the ratio of per-resource times shows the growth.
"""

from __future__ import annotations

import copy
import statistics
import time
from typing import Any

from components.failure_rate import SIZED_SPARE_SHARE
from components.mockrt import run_program, stack_config

SIZES = (64, 256, 1024)
REPEATS = 3


def synthetic(nodes: int) -> tuple[dict[str, Any], set[str]]:
    """The prod stack with its GPU pools replaced by two pools totalling ``nodes`` nodes."""
    config, secrets = stack_config("prod")
    config = copy.deepcopy(config)
    half = nodes // 2
    config["gpu-cluster:pools"] = [
        {"name": "pool-a", "nodes": [f"gpu-a-[0001-{half:04d}]"], "gpuModel": "H100-SXM5-80GB"},
        {"name": "pool-b", "nodes": [f"gpu-b-[0001-{nodes - half:04d}]"], "gpuModel": "H200-SXM5-141GB"},
    ]
    check = config.get("gpu-cluster:checkpoint", {}).get("throughputCheck")
    if check and check.get("pool"):
        check["pool"] = "pool-a"
        check["nodes"] = min(check.get("nodes", 1), half)
    for service in config.get("gpu-cluster:inference", {}).get("services", []):
        if service.get("pool"):
            service["pool"] = "pool-a"
    for job in config.get("gpu-cluster:training", {}).get("jobs", []):
        job["pool"] = "pool-a"
        # Beside the pool's warm spares, sized at most one node in 16 (components.config.pools).
        job["workers"] = min(job["workers"], half - half // SIZED_SPARE_SHARE)
    # Team shares are sized for prod's GPUs: scale them to this cluster so they still fit (a share of 0 stays 0).
    teams = config.get("gpu-cluster:scheduling", {}).get("teams", [])
    total = sum(team.get("guaranteeGpus", 0) for team in teams)
    gpus = nodes * 8
    for team in teams:
        for key in ("guaranteeGpus", "capabilityGpus"):
            if team.get(key):
                team[key] = max(1, min(gpus, team[key] * gpus // max(total * 2, gpus)))
    return config, secrets


def measure(stack: str, config: dict[str, Any] | None, secrets: set[str] | None) -> dict[str, float]:
    times = []
    count = 0
    for _ in range(REPEATS):
        start = time.perf_counter()
        result = run_program(stack, config, secrets)
        times.append(time.perf_counter() - start)
        count = len(result.resources)
    best = min(times)
    return {
        "resources": count,
        "seconds_best": round(best, 3),
        "seconds_median": round(statistics.median(times), 3),
        "ms_per_resource": round(1000 * best / max(count, 1), 3),
    }


def run() -> dict[str, Any]:
    run_program("local")  # warm imports so the first measured stack is not charged for them
    rows: dict[str, dict[str, float]] = {"prod": measure("prod", None, None)}
    for nodes in SIZES:
        config, secrets = synthetic(nodes)
        rows[f"synthetic-{nodes}"] = measure("prod", config, secrets)
    base = rows[f"synthetic-{SIZES[0]}"]["ms_per_resource"]
    for row in rows.values():
        row["per_resource_vs_smallest"] = round(row["ms_per_resource"] / base, 2)
    return {
        "name": "mock-runtime evaluation",
        "target": "1,024-node stack under 15 s; ms/resource flat with size",
        "stacks": rows,
        "meets_target": rows[f"synthetic-{SIZES[-1]}"]["seconds_best"] < 15,
    }


if __name__ == "__main__":
    import json

    print(json.dumps(run(), indent=2))
