"""A burst fills the cheapest provider first, as the real Volcano scheduler decides it.

The local control plane runs Volcano with the stack's own scheduler configuration (`nodeorder` and `binpack`,
as in production). Two fake virtual nodes stand for the prod stack's providers, labelled the way the stack
labels a provider's node; the pods carry the affinity the prod stack renders for an inference replica
(on-prem, then the providers by price rank: dr-cluster at 1.50 USD per GPU-hour before lambda-east at 2.99).
The dearer provider's node is created first and sorts first by name, so neither order nor name explains
where the pods land; pods rendered with the two prices swapped must land on the other node, so the
preferred terms decide.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from components.mockrt import RunResult
from tools.localcluster import control
from tools.localcluster.plan import Layout
from tools.localcluster.realcluster import BUILT, linked_state

NAMESPACE = "provider-rank"
ONLY = "e2e.gpucluster.io/provider-rank"  # the label and taint that keep every other pod off these nodes
#: Node name -> the provider it stands for. The dear one sorts first and is created first.
NODES = {"vk-a-lambda-east": "lambda-east", "vk-z-dr-cluster": "dr-cluster"}
PODS = 3


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    missing = control.binaries_missing(Layout(BUILT)) + control.binaries_missing(Layout(BUILT), control.VOLCANO)
    if missing:
        pytest.skip(f"local control plane or Volcano not built ({', '.join(missing)}); run `make localcluster`")
    from kubernetes import client

    lay = linked_state(tmp_path_factory.mktemp("rank-cluster"))
    try:
        control.up(lay, timeout=300)
        core: Any = client.CoreV1Api(control.api_client(lay))
        for name, provider in NODES.items():
            core.create_node(provider_node(name, provider))
        core.create_namespace({"metadata": {"name": NAMESPACE}})
        yield core
    finally:
        control.down(lay, quiet=True)


def provider_node(name: str, provider: str) -> dict[str, Any]:
    """A kwok node labelled as the stack labels a provider's virtual node (components/providers.node_labels)."""
    capacity = {"cpu": "64", "memory": "512Gi", "pods": "110", "nvidia.com/gpu": "8", "ephemeral-storage": "400Gi"}
    return {
        "metadata": {
            "name": name,
            # kubernetes.io/hostname as every kubelet and virtual kubelet registers it: the scheduler's default
            # spreading scores only nodes that carry the topology key.
            "labels": {"gpucluster.io/location": "external", "gpucluster.io/provider": provider,
                       "type": "virtual-kubelet", "kubernetes.io/hostname": name, ONLY: "true"},
            "annotations": {"kwok.x-k8s.io/node": "fake"},
        },
        "spec": {"taints": [{"key": ONLY, "value": "true", "effect": "NoSchedule"}]},
        "status": {"capacity": capacity, "allocatable": dict(capacity)},
    }


def replica_pod(name: str, affinity: dict[str, Any]) -> dict[str, Any]:
    """An inference replica's placement (scheduler, affinity, GPU request), kept to the two test nodes."""
    return {
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "schedulerName": "volcano",
            "affinity": affinity,
            "nodeSelector": {ONLY: "true"},
            "tolerations": [{"key": ONLY, "operator": "Exists", "effect": "NoSchedule"}],
            "containers": [{"name": "server", "image": "registry.k8s.io/pause:3.10",
                            "resources": {"requests": {"cpu": "1", "memory": "1Gi", "nvidia.com/gpu": "1"},
                                          "limits": {"memory": "1Gi", "nvidia.com/gpu": "1"}}}],
        },
    }


def rendered_affinity(result: RunResult) -> dict[str, Any]:
    affinity: dict[str, Any] = result.one("Deployment", "sdxl-turbo").inputs["spec"]["template"]["spec"]["affinity"]
    return affinity


def placed(core: Any, names: list[str], timeout: float = 120.0) -> dict[str, str]:
    deadline = time.monotonic() + timeout
    while True:
        nodes = {n: core.read_namespaced_pod(n, NAMESPACE).spec.node_name for n in names}
        if all(nodes.values()):
            return nodes
        if time.monotonic() > deadline:
            pytest.fail(f"pods not bound after {timeout:.0f}s: {nodes}")
        time.sleep(0.5)


def swap_prices(cfg: dict[str, Any]) -> None:
    providers = cfg["gpu-cluster:providers"]
    prices = [p["pricePerGpuHour"] for p in providers]
    for p, price in zip(providers, reversed(prices), strict=True):
        p["pricePerGpuHour"] = price


def test_volcano_fills_the_cheaper_provider_first(cluster: Any, prod: RunResult,
                                                  run_stack: Callable[..., RunResult]) -> None:
    cheap_first = [f"cheap-first-{i}" for i in range(PODS)]
    for name in cheap_first:
        cluster.create_namespaced_pod(NAMESPACE, replica_pod(name, rendered_affinity(prod)))
    assert set(placed(cluster, cheap_first).values()) == {"vk-z-dr-cluster"}
    # The same pods rendered with lambda-east the cheaper one go there instead, although dr-cluster's node now
    # holds fewer free GPUs (binpack would favour it) and is the one the first pods chose.
    swapped = rendered_affinity(run_stack("prod", swap_prices))
    assert swapped != rendered_affinity(prod)
    dear_first = [f"swapped-{i}" for i in range(PODS)]
    for name in dear_first:
        cluster.create_namespaced_pod(NAMESPACE, replica_pod(name, swapped))
    assert set(placed(cluster, dear_first).values()) == {"vk-a-lambda-east"}


def test_the_cheaper_provider_wins_over_spreading_a_services_replicas(cluster: Any, prod: RunResult) -> None:
    """A Deployment's replicas, not bare pods: the scheduler's default spreading (``podtopologyspread`` scores the
    hostname and zone spread of pods one ReplicaSet selects, at twice a term's weight) must not outweigh the price
    rank, or a burst's second replica onwards goes to the dearer provider while the cheaper one has room."""
    from kubernetes import client

    cluster.delete_collection_namespaced_pod(NAMESPACE, grace_period_seconds=0)
    deadline = time.monotonic() + 60
    while cluster.list_namespaced_pod(NAMESPACE).items:
        assert time.monotonic() < deadline, "the earlier test's pods are not gone"
        time.sleep(0.5)
    labels = {"app": "spread-replicas"}
    template = replica_pod("unused", rendered_affinity(prod))
    template["metadata"] = {"labels": labels}
    replicas = 6
    apps: Any = client.AppsV1Api(cluster.api_client)
    apps.create_namespaced_replica_set(NAMESPACE, {
        "metadata": {"name": "spread-replicas"},
        "spec": {"replicas": 1, "selector": {"matchLabels": labels}, "template": template}})
    # One replica more at a time, each placed before the next exists, as a burst's replicas arrive: every
    # session then scores a node that already holds the service's replicas against one that holds none.
    for want in range(1, replicas + 1):
        apps.patch_namespaced_replica_set_scale("spread-replicas", NAMESPACE, {"spec": {"replicas": want}})
        deadline = time.monotonic() + 120
        while True:
            pods = cluster.list_namespaced_pod(NAMESPACE, label_selector="app=spread-replicas").items
            nodes = [p.spec.node_name for p in pods]
            if len(nodes) == want and all(nodes):
                break
            assert time.monotonic() < deadline, f"{want} replicas not bound after 120s: {nodes}"
            time.sleep(0.5)
    assert set(nodes) == {"vk-z-dr-cluster"}, f"replicas spread over {sorted(nodes)}"
