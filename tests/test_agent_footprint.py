"""The agents' memory follows the cluster's size: a request left unset is sized from the stack's nodes, one set below
what the agent holds there is refused, and every resident set the scale runs measured lies under its line."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from components.config import ConfigError, parse_config
from components.config.base import ContainerRequests, quantity_value
from components.config.footprint import (
    BURST_CONTROLLER,
    FOOTPRINTS,
    HEADROOM,
    HEALTH_GUARD,
    MIB,
    NODE_POOL_AGENT,
    Footprint,
    agent_requests,
    cluster_nodes,
    cluster_pods,
    footprint_problems,
)
from components.mockrt import raw_from_stack, run_program, stack_config
from tools.localcluster import scale
from tools.render import manifests

ROOT = Path(__file__).resolve().parents[1]
#: The scale runs' process names (tools/localcluster/scalerun.py) of the agents with a footprint.
PROCESS = {BURST_CONTROLLER: "burst-controller", HEALTH_GUARD: "health-guard", NODE_POOL_AGENT: "node-pools"}


def _measured() -> list[tuple[Footprint, str, int, int, float]]:
    """Every agent's resident set on every shape: at rest (no pods) and after the runs (its largest gang alive)."""
    shapes = json.loads((ROOT / "bench" / "report.json").read_text())["benchmarks"]["bench_scale"]["result"]["shapes"]
    points = []
    for name, sh in shapes.items():
        largest = max((int(size) for size in sh.get("gangs") or {}), default=0)
        for phase, pods in (("process_usage_at_rest", 0), ("process_usage_after", largest)):
            for fp, process in PROCESS.items():
                usage = (sh.get(phase) or {}).get(process)
                if usage is not None:
                    points.append((fp, name, int(sh["nodes"]), pods, float(usage["rss_mib"])))
    return points


def test_every_resident_set_the_scale_runs_measured_lies_under_its_agents_line() -> None:
    points = _measured()
    assert {fp for fp, *_ in points} == set(FOOTPRINTS)  # each line rests on a measurement
    assert max(nodes for _, _, nodes, _, _ in points) >= 2_000
    for fp, shape, nodes, pods, rss in points:
        assert rss <= fp.need_mib(nodes, pods) + 0.5, (fp.agent, shape, nodes, pods, rss, fp.need_mib(nodes, pods))


def _container_memory(docs: dict[str, dict[str, Any]], name: str) -> str:
    deployment = next(d for d in docs.values() if d["kind"] == "Deployment" and d["metadata"]["name"] == name)
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["resources"]["limits"]["memory"] == container["resources"]["requests"]["memory"]
    return str(container["resources"]["requests"]["memory"])


DEPLOYMENTS = {BURST_CONTROLLER: "burst-controller", HEALTH_GUARD: "health-guard", NODE_POOL_AGENT: "node-pools"}


def test_the_declared_stacks_keep_their_floors_and_the_llama3_shape_sizes_every_agent_above_what_it_holds() -> None:
    config, secrets = stack_config("prod")
    prod = manifests(run_program("prod", config, secrets))
    for fp, name in DEPLOYMENTS.items():
        assert _container_memory(prod, name) == fp.floor.memory  # 268 nodes: the floor covers them
    values = scale.shape_values(scale.shape("llama3"), ROOT)
    cfg = parse_config(values, "scale shape llama3")
    nodes, pods = cluster_nodes(cfg), cluster_pods(cfg)
    # A training pod a node, the services twice over at their maxReplicas (scaled with the shape: 8x prod's GPUs).
    assert nodes == 2_060 and pods == 2_048 + 2 * 8 * (256 + 48 + 64)
    big = manifests(run_program("prod", {**config, **values}, secrets))
    for fp, name in DEPLOYMENTS.items():
        memory = quantity_value(_container_memory(big, name))
        assert memory >= fp.need_mib(nodes, pods) * HEADROOM * MIB > quantity_value(fp.floor.memory), fp.agent
        assert agent_requests(cfg, fp).cpu == fp.floor.cpu


@pytest.mark.parametrize(("section", "key", "fp"), [
    ("burst", "resources", BURST_CONTROLLER),
    ("observability", "health", HEALTH_GUARD),
    ("nodePoolAgent", "resources", NODE_POOL_AGENT),
])
def test_a_memory_below_what_the_agent_holds_at_the_stacks_size_is_refused_naming_the_key(
        section: str, key: str, fp: Footprint) -> None:
    values = scale.shape_values(scale.shape("llama3"), ROOT)
    requests = {"cpu": "100m", "memory": "96Mi"}
    block = dict(values.get(section) or {})
    block[key] = {**dict(block.get(key) or {}), "resources": requests} if section == "observability" else requests
    values[section] = block
    with pytest.raises(ConfigError) as refused:
        parse_config(values, "llama3")
    text = str(refused.value)
    assert f"{fp.key}.memory: is below what the {fp.agent} holds at this stack's 2,060 nodes" in text
    assert "leave `" + fp.key + "` unset to size it" in text and '(got "96Mi")' in text
    requests["memory"] = "2Gi"  # enough: taken as set, not sized
    assert agent_requests(parse_config(values, "llama3"), fp).memory == "2Gi"


def test_the_local_stack_keeps_its_agents_small() -> None:
    cfg = parse_config(raw_from_stack("local"), "local")
    assert [agent_requests(cfg, fp) for fp in FOOTPRINTS] == [fp.floor for fp in FOOTPRINTS]


@given(nodes=st.integers(0, 20_000), memory_mib=st.integers(1, 8_192))
def test_refused_exactly_when_the_memory_is_below_the_line_and_a_sized_request_never_is(
        nodes: int, memory_mib: int) -> None:
    for fp in FOOTPRINTS:
        sized = fp.sized(nodes, 2 * nodes)
        assert quantity_value(sized.memory) >= fp.need_mib(nodes, 2 * nodes) * MIB  # a sized request is never refused
        assert quantity_value(sized.memory) >= quantity_value(fp.floor.memory)
        assert quantity_value(fp.sized(nodes + 100, 2 * nodes).memory) >= quantity_value(sized.memory)  # monotone
        assert quantity_value(fp.sized(nodes, 2 * nodes + 1000).memory) >= quantity_value(sized.memory)
    set_ = ContainerRequests(cpu="100m", memory=f"{memory_mib}Mi")
    nodes_of = SimpleNamespace(node_names=[f"n{i}" for i in range(nodes)])
    services = [SimpleNamespace(max_replicas=nodes // 2)]
    cfg: Any = SimpleNamespace(pools=[nodes_of], system_pool=SimpleNamespace(node_names=[]),
                               inference=SimpleNamespace(services=services),
                               burst=SimpleNamespace(resources=set_),
                               observability=SimpleNamespace(health=SimpleNamespace(resources=set_)),
                               node_pool_agent=SimpleNamespace(resources=set_))
    refused = {p.path for p in footprint_problems(cfg)}
    pods = nodes + 2 * (nodes // 2)
    assert refused == {f"{fp.key}.memory" for fp in FOOTPRINTS if memory_mib < fp.need_mib(nodes, pods)}
    assert all(agent_requests(cfg, fp) == set_ for fp in FOOTPRINTS)  # a set request is taken as set


@pytest.mark.parametrize(("text", "value"), [
    ("128Mi", 128 * 2**20), ("1Gi", 2**30), ("500m", 0.5), ("2", 2.0), ("1.5G", 1.5e9), ("100k", 1e5),
    ("3e2", 300.0), (".5Ki", 512.0),
])
def test_a_quantity_reads_as_bytes_or_cores(text: str, value: float) -> None:
    assert quantity_value(text) == pytest.approx(value)


@pytest.mark.parametrize("text", ["128MB", "-1Mi", "", "1 Gi", "0", "Mi", "1.2.3"])
def test_a_bad_quantity_is_refused_as_the_config_refuses_it(text: str) -> None:
    with pytest.raises(ValueError, match="must be"):
        quantity_value(text)


@given(number=st.integers(1, 10**6), suffix=st.sampled_from(["", "k", "M", "G", "Ki", "Mi", "Gi", "m"]))
def test_larger_suffixes_read_larger(number: int, suffix: str) -> None:
    assert quantity_value(f"{number}{suffix}") == pytest.approx(number * quantity_value(f"1{suffix}"))
