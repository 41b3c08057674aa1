"""What a pool's topology renders: one Volcano HyperNode per switch, the scheduler's network-topology-aware plugin
(only then), each gang's networkTopology from its size, the node-pool agent's leaf and spine labels, the published
settings the CLI rebuilds the same Job from, and what the CLI shows of a gang's placement."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import yaml
from click.testing import Result
from kubernetes import client

from agents.node_pools.contract import parse_settings, settings_document
from agents.node_pools.decide import node_patch
from agents.node_taints import leaf_label_key, spine_label_key
from components.cluster_settings import SETTINGS_CONFIGMAP, SETTINGS_KEY, cluster_settings, settings_json
from components.cluster_settings import parse_settings as parse_published
from components.config import ClusterConfig, parse_config
from components.fabric import TOPOLOGY_PLUGIN, hypernodes
from components.gang_scheduler import volcano_scheduler_conf
from components.mockrt import RunResult, raw_from_stack
from components.node_pools import settings_from_config
from components.published_settings import FLAT_SETTINGS_VERSION, IN_PLACE_SETTINGS_VERSION
from components.training_job import TrainingJobArgs
from gpucluster_cli import cli
from gpucluster_cli.kube import Cluster
from gpucluster_cli.render import volcano_job
from gpucluster_cli.views import UNSCHEDULED, leaves_line, placement_line
from tests.conftest import StackRunner
from tests.test_cli_commands import NS, SPEC, Fake, run, serve

P = "gpu-cluster:"
PREFIX = "gpucluster.io"
LEAF, SPINE = leaf_label_key(PREFIX), spine_label_key(PREFIX)
#: The prod pool h100-a (128 nodes) as four leaves of 32 under two spines (as Pulumi.prod.yaml declares it; the
#: tests start from a flat prod and put it on one pool).
PROD_FABRIC = {
    "leaves": [{"name": f"leaf-a{i}", "nodes": [f"gpu-a-[{i * 32 - 31:03d}-{i * 32:03d}]"]} for i in range(1, 5)],
    "spines": [{"name": "spine-a1", "leaves": ["leaf-a1", "leaf-a2"]},
               {"name": "spine-a2", "leaves": ["leaf-a3", "leaf-a4"]}],
}
#: The local pool (4 nodes) as two leaves of two under one spine.
LOCAL_FABRIC = {
    "leaves": [{"name": "leaf-l1", "nodes": ["gpu-local-[01-02]"]},
               {"name": "leaf-l2", "nodes": ["gpu-local-[03-04]"]}],
    "spines": [{"name": "spine-l1", "leaves": ["leaf-l1", "leaf-l2"]}],
}
LABEL_FABRIC = {
    "leafLabel": "example.com/ib-leaf",
    "leaves": [{"name": "leaf-l1", "labelValue": "SW_17", "nodeCount": 2}, {"name": "leaf-l2", "nodeCount": 2}],
    "spines": [{"name": "spine-l1", "leaves": ["leaf-l1", "leaf-l2"]}],
}


def flat(cfg: dict[str, Any]) -> None:
    """The stack with every pool flat (prod declares its fabric): the baseline each test puts one fabric on."""
    for p in cfg[f"{P}pools"]:
        p.pop("topology", None)


def with_fabric(fabric: dict[str, Any], pool: int = 0, mode: str | None = None) -> Callable[[dict[str, Any]], None]:
    def edit(cfg: dict[str, Any]) -> None:
        flat(cfg)
        cfg[f"{P}pools"][pool]["topology"] = copy.deepcopy(fabric)
        if mode is not None:
            cfg.setdefault(f"{P}scheduling", {})["topologyMode"] = mode
    return edit


def config(stack: str, fabric: dict[str, Any] | None, mode: str | None = None) -> ClusterConfig:
    raw = raw_from_stack(stack)
    for p in raw["pools"]:
        p.pop("topology", None)
    if fabric is not None:
        raw["pools"][0]["topology"] = copy.deepcopy(fabric)
    if mode is not None:
        raw["scheduling"] = {**raw.get("scheduling", {}), "topologyMode": mode}
    return parse_config(raw, f"Pulumi.{stack}.yaml")


def scheduler_conf(run: RunResult) -> dict[str, Any]:
    (chart,) = run.by_type("kubernetes:helm.sh/v4:Chart")
    conf: dict[str, Any] = yaml.safe_load(chart.inputs["values"]["custom"]["scheduler_config_override"])
    return conf


@pytest.fixture
def prod_flat(run_stack: StackRunner) -> RunResult:
    """Prod with every pool flat."""
    return run_stack("prod", flat)


@pytest.fixture
def prod_fabric(run_stack: StackRunner) -> RunResult:
    """Prod with pool h100-a cut into leaves and spines, gangs held to them hard."""
    return run_stack("prod", with_fabric(PROD_FABRIC, mode="hard"))


# ------------------------------------------------------------------ HyperNodes and the scheduler's plugin


def test_each_leaf_and_spine_is_a_hypernode(prod_fabric: RunResult) -> None:
    found = {r.metadata["name"]: r for r in prod_fabric.by_kind("HyperNode")}
    assert sorted(found) == ["leaf-a1", "leaf-a2", "leaf-a3", "leaf-a4", "spine-a1", "spine-a2"]
    leaf = found["leaf-a2"]
    assert leaf.inputs["apiVersion"] == "topology.volcano.sh/v1alpha1"
    assert leaf.metadata["labels"]["gpucluster.io/pool"] == "h100-a"
    spec = leaf.inputs["spec"]
    assert (spec["tier"], spec["tierName"]) == (1, "leaf")
    assert spec["members"][0] == {"type": "Node", "selector": {"exactMatch": {"name": "gpu-a-033"}}}
    assert [m["selector"]["exactMatch"]["name"] for m in spec["members"]] == [f"gpu-a-{n:03d}" for n in range(33, 65)]
    spine = found["spine-a2"].inputs["spec"]
    assert (spine["tier"], spine["tierName"]) == (2, "spine")
    assert spine["members"] == [{"type": "HyperNode", "selector": {"exactMatch": {"name": n}}}
                                for n in ("leaf-a3", "leaf-a4")]
    # After the chart (its CRD) and, for a spine, after its leaves.
    urns = {r.metadata.get("name"): r.urn for r in prod_fabric.resources if r.kind == "HyperNode"}
    assert {urns["leaf-a3"], urns["leaf-a4"]} <= set(found["spine-a2"].depends_on)
    (chart,) = prod_fabric.by_type("kubernetes:helm.sh/v4:Chart")
    assert chart.urn in leaf.depends_on


def test_a_labelled_leaf_takes_its_nodes_by_the_sites_label() -> None:
    cfg = config("local", LABEL_FABRIC)
    leaves = {h["metadata"]["name"]: h for h in hypernodes(cfg.pools, cfg.label_prefix) if h["spec"]["tier"] == 1}
    assert leaves["leaf-l1"]["spec"]["members"] == [
        {"type": "Node", "selector": {"labelMatch": {"matchLabels": {"example.com/ib-leaf": "SW_17"}}}}]
    assert leaves["leaf-l2"]["spec"]["members"][0]["selector"]["labelMatch"]["matchLabels"] == {
        "example.com/ib-leaf": "leaf-l2"}


def test_the_plugin_joins_the_scheduler_only_with_a_topology(prod_flat: RunResult, prod_fabric: RunResult) -> None:
    prod = prod_flat
    assert scheduler_conf(prod) == volcano_scheduler_conf()
    assert TOPOLOGY_PLUGIN not in json.dumps(scheduler_conf(prod))
    assert prod.by_kind("HyperNode") == []
    conf = scheduler_conf(prod_fabric)
    names = [p["name"] for p in conf["tiers"][1]["plugins"]]
    assert names == ["drf", "predicates", "capacity", "nodeorder", "binpack", TOPOLOGY_PLUGIN]
    plugin = conf["tiers"][1]["plugins"][-1]
    assert plugin["arguments"] == {"hypernode.binpack.resources": "nvidia.com/gpu",
                                   "hypernode.binpack.resources.nvidia.com/gpu": 10}
    # Everything else as without a topology: the preemption path the policy pack checks.
    assert conf["actions"] == scheduler_conf(prod)["actions"] and conf["tiers"][0] == scheduler_conf(prod)["tiers"][0]


def test_the_policy_pack_passes_a_stack_with_a_topology(prod_fabric: RunResult) -> None:
    from policies.rules import evaluate
    from tools import policy

    found = evaluate(policy.resources_of(prod_fabric), policy.context_for("prod"))
    assert [(v.rule, v.resource, v.message) for v in found if v.level.value == "mandatory"] == []


def test_the_local_scheduler_runs_the_stacks_conf_with_its_topology() -> None:
    from tools.localcluster.plan import volcano_conf

    assert volcano_conf(config("local", None)) == volcano_scheduler_conf()
    assert volcano_conf(config("local", LOCAL_FABRIC)) == volcano_scheduler_conf("nvidia.com/gpu", topology=True)


# ------------------------------------------------------------------ a gang's networkTopology


@pytest.mark.parametrize(("fabric", "mode", "expect"), [
    (LOCAL_FABRIC, None, {"mode": "soft", "highestTierAllowed": 2}),   # 4 nodes: two leaves under the spine
    (LOCAL_FABRIC, "hard", {"mode": "hard", "highestTierAllowed": 2}),
    ({"leaves": [{"name": "leaf-l1", "nodes": ["gpu-local-[01-04]"]}],
      "spines": [{"name": "spine-l1", "leaves": ["leaf-l1"]}]}, "hard", {"mode": "hard", "highestTierAllowed": 1}),
    (None, "hard", None),                                              # a flat pool: no constraint
])
def test_the_stack_job_gets_the_tier_of_its_size(run_stack: StackRunner, fabric: dict[str, Any] | None,
                                                  mode: str | None, expect: dict[str, Any] | None) -> None:
    def edit(cfg: dict[str, Any]) -> None:
        if fabric is not None:
            with_fabric(fabric)(cfg)
        if mode is not None:
            cfg.setdefault(f"{P}scheduling", {})["topologyMode"] = mode

    spec = run_stack("local", edit).one("Job", "smoke-gang").inputs["spec"]
    assert spec.get("networkTopology") == expect


@pytest.mark.parametrize(("workers", "gpus_per_worker", "expect"), [
    (32, 8, {"mode": "hard", "highestTierAllowed": 1}),   # one leaf's 32 nodes
    (64, 4, {"mode": "hard", "highestTierAllowed": 1}),   # two workers a node: 32 nodes, still one leaf
    (33, 8, {"mode": "hard", "highestTierAllowed": 2}),   # two leaves under one spine
    (64, 8, {"mode": "hard", "highestTierAllowed": 2}),   # a whole spine
    (65, 8, None),                                        # more than any spine: no constraint it could never meet
])
def test_a_gang_larger_than_a_leaf_gets_the_spine_tier(workers: int, gpus_per_worker: int,
                                                       expect: dict[str, Any] | None) -> None:
    cfg = config("prod", PROD_FABRIC, "hard")
    job = cfg.training.jobs[0].model_copy(update={"pool": "h100-a", "workers": workers,
                                                  "gpus_per_worker": gpus_per_worker})
    spec = volcano_job(cluster_settings(cfg), job, job.team)["spec"]
    assert spec.get("networkTopology") == expect
    assert TrainingJobArgs.from_config(cfg, job).topology_mode == "hard"
    # The job of the other, flat pool gets none.
    flat = job.model_copy(update={"pool": "h200-b"})
    assert "networkTopology" not in volcano_job(cluster_settings(cfg), flat, job.team)["spec"]


# ------------------------------------------------------------------ the node-pool agent's labels


def test_the_agent_labels_each_node_with_its_leaf_and_spine() -> None:
    settings = settings_from_config(config("prod", PROD_FABRIC))
    pool = settings.membership()["gpu-a-040"]
    node = {"metadata": {"name": "gpu-a-040", "resourceVersion": "1", "labels": {}}, "spec": {}}
    patch = node_patch(node, pool, settings.applied_annotation)
    assert patch is not None
    assert patch["metadata"]["labels"][LEAF] == "leaf-a2" and patch["metadata"]["labels"][SPINE] == "spine-a1"
    assert json.loads(patch["metadata"]["annotations"][settings.applied_annotation])["labels"] == sorted(
        [*pool.labels, LEAF, SPINE])
    # The second pool is flat: its nodes carry no switch labels.
    flat = settings.membership()["gpu-b-001"]
    flat_patch = node_patch({"metadata": {"name": "gpu-b-001", "labels": {}}, "spec": {}}, flat,
                            settings.applied_annotation)
    assert flat_patch is not None and LEAF not in flat_patch["metadata"]["labels"]


def test_a_labelled_leaf_follows_the_sites_label_and_a_dropped_topology_removes_the_labels() -> None:
    settings = settings_from_config(config("local", LABEL_FABRIC))
    pool = settings.membership()["gpu-local-01"]
    node: dict[str, Any] = {"metadata": {"name": "gpu-local-01", "resourceVersion": "1",
                                         "labels": {"example.com/ib-leaf": "SW_17"}}, "spec": {}}
    patch = node_patch(node, pool, settings.applied_annotation)
    assert patch is not None and patch["metadata"]["labels"][LEAF] == "leaf-l1"
    node["metadata"]["labels"].update(patch["metadata"]["labels"])
    node["metadata"]["annotations"] = patch["metadata"]["annotations"]
    # Unlabelled by the site (or a value no leaf has): no switch labels; a stack without topology drops them.
    unknown = node_patch({"metadata": {"name": "gpu-local-02", "labels": {"example.com/ib-leaf": "nope"}},
                          "spec": {}}, pool, settings.applied_annotation)
    assert unknown is not None and LEAF not in unknown["metadata"]["labels"]
    flat = settings_from_config(config("local", None)).membership()["gpu-local-01"]
    removal = node_patch(node, flat, settings.applied_annotation)
    assert removal is not None and removal["metadata"]["labels"] == {LEAF: None, SPINE: None}


def test_the_agents_settings_refuse_a_fabric_with_other_keys() -> None:
    raw = json.loads(settings_from_config(config("local", LOCAL_FABRIC)).model_dump_json())
    raw["pools"][0]["fabric"]["leaf_key"] = "example.com/leaf"
    with pytest.raises(ValueError, match=r"fabric must write gpucluster\.io/leaf and gpucluster\.io/spine"):
        parse_settings(raw)
    raw["pools"][0]["fabric"]["leaf_key"] = LEAF
    raw["pools"][0]["fabric"]["leaves"][0]["nodes"] = ["gpu-x-1"]
    with pytest.raises(ValueError, match=r"names nodes outside the pool: gpu-x-1"):
        parse_settings(raw)


def test_a_flat_stack_renders_the_agents_settings_as_before() -> None:
    document = settings_document(settings_from_config(config("local", None)))
    assert "fabric" not in document and "null" not in document
    assert "fabric" in settings_document(settings_from_config(config("local", LOCAL_FABRIC)))


# ------------------------------------------------------------------ published settings and the CLI


def test_published_settings_carry_the_topology_only_where_there_is_one() -> None:
    plain = config("local", None)
    without_supervisor = plain.model_copy(update={"training": plain.training.model_copy(update={
        "restart_in_place": plain.training.restart_in_place.model_copy(update={"enabled": False})})})
    flat = json.loads(settings_json(cluster_settings(without_supervisor)))
    assert flat["version"] == FLAT_SETTINGS_VERSION and "topologyMode" not in flat and "restartInPlace" not in flat
    # With restart in place (the default) the settings carry it, at the version that introduced it.
    supervised = json.loads(settings_json(cluster_settings(plain)))
    assert supervised["version"] == IN_PLACE_SETTINGS_VERSION and supervised["restartInPlace"]["enabled"] is True
    assert all("topology" not in p["pool"] for p in flat["pools"])
    cfg = config("prod", PROD_FABRIC, "hard")
    published = parse_published(settings_json(cluster_settings(cfg)))
    assert published.version == IN_PLACE_SETTINGS_VERSION and published.topology_mode == "hard"
    for job in cfg.training.jobs:
        assert published.training_args(job) == TrainingJobArgs.from_config(cfg, job)


@pytest.mark.parametrize(("spec", "line"), [
    ({}, None),
    ({"networkTopology": {"mode": "hard", "highestTierAllowed": 1}},
     "placement: inside one leaf switch (hard: it waits until it fits there)"),
    ({"networkTopology": {"mode": "soft", "highestTierAllowed": 2}},
     "placement: under one spine switch, in as few leaves as fit (soft: preferred: it is placed wherever it fits "
     "rather than wait)"),
])
def test_placement_in_words(spec: dict[str, Any], line: str | None) -> None:
    assert placement_line(spec) == line


def test_the_leaves_a_gang_spans() -> None:
    pool = config("local", LOCAL_FABRIC).pools[0]
    per_node = {"gpu-local-01": ["w-0", "w-1"], "gpu-local-03": ["w-2"], UNSCHEDULED: ["w-3"]}
    assert leaves_line(per_node, pool, lambda _: None) == (
        "leaves spanned: 2 (leaf-l1 (2 pods), leaf-l2 (1 pod)); fewest possible for its 2 node(s): 1")
    assert leaves_line({UNSCHEDULED: ["w-0"]}, pool, lambda _: None) is None
    labelled = config("local", LABEL_FABRIC).pools[0]
    line = leaves_line({"gpu-local-01": ["w-0"], "gpu-local-02": ["w-1"]}, labelled,
                       {"gpu-local-01": "leaf-l1"}.get)
    assert line == ("leaves spanned: 1 (leaf-l1 (1 pod)); fewest possible for its 2 node(s): 1; 1 pod(s) on nodes "
                    "whose leaf is unknown (their leaf label cannot be read)")


@pytest.fixture
def fabric_fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[Fake]:
    """The CLI's fake API with the settings of the local stack with a topology, in hard mode."""
    state = Fake()
    state.configmaps[SETTINGS_CONFIGMAP] = {"metadata": {"name": SETTINGS_CONFIGMAP, "namespace": NS},
                                            "data": {SETTINGS_KEY: settings_json(cluster_settings(
                                                config("local", LOCAL_FABRIC, "hard")))}}
    with serve(state) as url:
        monkeypatch.setattr(cli, "cluster_factory", lambda context, namespace, kubeconfig=None: Cluster(
            client.ApiClient(client.Configuration(host=url)), namespace))
        yield state


def submit(tmp_path: Any) -> Result:
    path = tmp_path / "job.yaml"
    path.write_text(SPEC.replace("team: nlp\n", ""))
    return run("train", "submit", str(path))


def test_submit_says_where_the_gang_may_go_and_status_shows_the_leaves_it_spans(fabric_fake: Fake,
                                                                                 tmp_path: Any) -> None:
    result = submit(tmp_path)
    assert result.exit_code == 0, result.output
    # Two nodes: one leaf holds them.
    assert fabric_fake.jobs["ft-llama"]["spec"]["networkTopology"] == {"mode": "hard", "highestTierAllowed": 1}
    assert "placement: inside one leaf switch (hard: it waits until it fits there)" in result.output
    assert "(and, once placed, the leaf switches it spans)" in result.output
    fabric_fake.jobs["ft-llama"]["status"] = {"state": {"phase": "Running"}, "running": 2}
    fabric_fake.pod("ft-llama-worker-0", "gpu-local-03", "Running")
    fabric_fake.pod("ft-llama-worker-1", "gpu-local-04", "Running")
    out = run("train", "status", "ft-llama").output
    assert "leaves spanned: 1 (leaf-l2 (2 pods)); fewest possible for its 2 node(s): 1" in out
