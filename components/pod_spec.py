"""Pod-spec building blocks in manifest form (plain dicts, no Pulumi), so training and inference agree on
placement and the researcher CLI renders the same pods without the Pulumi SDK.

``components.workloads`` wraps the ones the components need as Pulumi input types.
"""

from __future__ import annotations

from typing import Any

from components.naming import ONPREM, Keys


def onprem_required_expressions(keys: Keys, pool: str | None) -> list[dict[str, Any]]:
    """Required: on-prem only (never a virtual node), optionally one pool. Training uses this."""
    expressions: list[dict[str, Any]] = [
        {"key": keys.location, "operator": "In", "values": [ONPREM]},
        {"key": "type", "operator": "NotIn", "values": ["virtual-kubelet"]},
    ]
    if pool is not None:
        expressions.append({"key": keys.pool, "operator": "In", "values": [pool]})
    return expressions


def onprem_required_affinity(keys: Keys, pool: str | None) -> dict[str, Any]:
    """The affinity (in manifest form) that keeps a pod on on-prem GPU nodes."""
    return {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": onprem_required_expressions(keys, pool)}]
            }
        }
    }


def pool_tolerations_manifest(keys: Keys, pools: list[str]) -> list[dict[str, str]]:
    """Tolerate each pool's NoSchedule taint (``<prefix>/pool=<pool>``)."""
    return [{"key": keys.pool, "operator": "Equal", "value": p, "effect": "NoSchedule"} for p in pools]


def gpu_resources_manifest(gpu_resource: str, gpus: int, cpu: str, memory: str) -> dict[str, dict[str, str]]:
    """GPU limits equal requests (extended resources cannot overcommit); memory too."""
    return {
        "requests": {gpu_resource: str(gpus), "cpu": cpu, "memory": memory},
        "limits": {gpu_resource: str(gpus), "memory": memory},
    }
