"""The node-pool agent: the patch it computes per node (table and properties), its settings' rules, its shell on
the kit's in-memory API, and what the stack renders for it (one ConfigMap instead of a NodePatch per GPU node)."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agents.kit.errors import ApiError
from agents.kit.port import NODES
from agents.node_pools import cli
from agents.node_pools.contract import NodePoolSettings, Pool, SettingsError, Taint, parse_settings
from agents.node_pools.decide import Applied, node_patch, read_applied
from agents.node_pools.shell import NodePools
from components.mockrt import RunResult
from components.node_pools import settings_from_config
from fakes.kube_api import MemoryApi, strategic_merge

PREFIX = "gpucluster.io"
ANNOTATION = f"{PREFIX}/node-pool-applied"
HEALTH = {"key": f"{PREFIX}/gpu-health", "value": "fatal", "effect": "NoSchedule"}
CORDON = {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}
POOL_TAINT = {"key": f"{PREFIX}/pool", "value": "h100-a", "effect": "NoSchedule"}
POOL = Pool(name="h100-a", nodes=["gpu-a-[001-004]"],
            labels={f"{PREFIX}/pool": "h100-a", f"{PREFIX}/gpu-model": "H100"},
            taints=[Taint(key=f"{PREFIX}/pool", value="h100-a", effect="NoSchedule")])


def node(name: str = "gpu-a-001", labels: dict[str, str] | None = None, taints: list[dict[str, Any]] | None = None,
         annotations: dict[str, str] | None = None, rv: str = "7") -> dict[str, Any]:
    return {"metadata": {"name": name, "resourceVersion": rv, "labels": labels or {},
                         "annotations": annotations or {}}, "spec": {"taints": taints or []}}


def applied(n: dict[str, Any], patch: dict[str, Any] | None) -> dict[str, Any]:
    """The node after the API server applied the strategic-merge patch (taints replace the whole list)."""
    if patch is None:
        return n
    body = copy.deepcopy(patch)
    body["metadata"].pop("resourceVersion", None)
    after: dict[str, Any] = strategic_merge(n, body)
    return after


# ------------------------------------------------------------------ the decision, by table


def test_a_new_node_gets_its_pools_labels_taint_and_the_record_of_what_was_set() -> None:
    patch = node_patch(node(labels={"kubernetes.io/hostname": "gpu-a-001"}), POOL, ANNOTATION)
    assert patch == {
        "metadata": {"resourceVersion": "7", "labels": POOL.labels,
                     "annotations": {ANNOTATION: json.dumps({"labels": sorted(POOL.labels),
                                                             "taints": [f"{PREFIX}/pool"]}, separators=(",", ":"))}},
        "spec": {"taints": [POOL_TAINT]},
    }


def test_a_node_already_as_its_pool_says_is_left_alone() -> None:
    n = applied(node(), node_patch(node(), POOL, ANNOTATION))
    assert node_patch(n, POOL, ANNOTATION) is None


def test_the_guards_quarantine_and_a_cordon_survive_every_patch() -> None:
    patch = node_patch(node(taints=[HEALTH, CORDON]), POOL, ANNOTATION)
    assert patch is not None
    assert patch["spec"]["taints"] == [HEALTH, CORDON, POOL_TAINT]
    assert patch["metadata"]["resourceVersion"] == "7"  # a guard write in between makes the API server refuse it


def test_a_node_that_leaves_its_pool_loses_only_what_the_agent_set() -> None:
    n = applied(node(labels={"team": "x"}, taints=[HEALTH]), node_patch(node(labels={"team": "x"}, taints=[HEALTH]),
                                                                        POOL, ANNOTATION))
    patch = node_patch(n, None, ANNOTATION)
    assert patch is not None
    assert patch["metadata"]["labels"] == dict.fromkeys(POOL.labels)
    assert patch["metadata"]["annotations"] == {ANNOTATION: None}
    assert patch["spec"]["taints"] == [HEALTH]
    after = applied(n, patch)
    assert after["metadata"]["labels"] == {"team": "x"} and node_patch(after, None, ANNOTATION) is None


def test_a_node_in_no_pool_that_the_agent_never_touched_is_never_touched() -> None:
    assert node_patch(node(labels={f"{PREFIX}/pool": "hand-made"}, taints=[POOL_TAINT]), None, ANNOTATION) is None


def test_a_pool_that_stops_setting_a_label_removes_it_and_one_it_never_set_stays() -> None:
    n = applied(node(), node_patch(node(), POOL, ANNOTATION))
    n["metadata"]["labels"]["owner"] = "ops"
    fewer = POOL.model_copy(update={"labels": {f"{PREFIX}/pool": "h100-a"}})
    patch = node_patch(n, fewer, ANNOTATION)
    assert patch is not None and patch["metadata"]["labels"] == {f"{PREFIX}/gpu-model": None}
    assert "spec" not in patch  # the taint did not change


def test_an_unreadable_record_removes_nothing() -> None:
    n = node(labels=dict(POOL.labels), taints=[POOL_TAINT], annotations={ANNOTATION: "{not json"})
    patch = node_patch(n, None, ANNOTATION)
    assert patch == {"metadata": {"resourceVersion": "7", "annotations": {ANNOTATION: None}}}
    for text in ("[1]", '{"labels": "x"}', '{"labels": [1, "a"]}', None, 3):
        assert read_applied(text) in (Applied(), Applied(frozenset({"a"})))


# ------------------------------------------------------------------ the decision, by property

_keys = st.sampled_from([f"{PREFIX}/pool", f"{PREFIX}/gpu-health", "node.kubernetes.io/unschedulable", "x/y",
                         f"{PREFIX}/old"])
_taints = st.lists(st.fixed_dictionaries({"key": _keys, "value": st.sampled_from(["", "a", "h100-a"]),
                                          "effect": st.sampled_from(["NoSchedule", "PreferNoSchedule",
                                                                     "NoExecute"])}), max_size=5)
_labels = st.dictionaries(st.sampled_from([f"{PREFIX}/pool", f"{PREFIX}/gpu-model", "team", f"{PREFIX}/old"]),
                          st.sampled_from(["a", "h100-a", "H100"]), max_size=4)
_annotation = st.one_of(st.none(), st.text(max_size=12),
                        st.builds(lambda ls, ts: Applied(frozenset(ls), frozenset(ts)).document(),
                                  st.lists(st.sampled_from([f"{PREFIX}/pool", f"{PREFIX}/old", "team"])),
                                  st.lists(st.sampled_from([f"{PREFIX}/pool", f"{PREFIX}/old"]))))
_pools = st.one_of(st.none(), st.just(POOL), st.just(POOL.model_copy(update={"taints": []})))


@settings(max_examples=300, deadline=None)
@given(taints=_taints, labels=_labels, record=_annotation, pool=_pools)
def test_every_foreign_taint_is_kept_and_one_patch_converges(taints: list[dict[str, str]], labels: dict[str, str],
                                                             record: str | None, pool: Pool | None) -> None:
    n = node(labels=labels, taints=taints, annotations={} if record is None else {ANNOTATION: record})
    patch = node_patch(n, pool, ANNOTATION)
    after = applied(n, patch)
    ours = read_applied(record).taints | {t.key for t in (pool.taints if pool else [])}
    # Whatever the agent writes, a taint it does not own (the guard's above all) is still there, unchanged.
    assert [t for t in after["spec"]["taints"] if t["key"] not in ours] == [t for t in taints if t["key"] not in ours]
    if patch is not None:
        assert patch["metadata"]["resourceVersion"] == "7"
    if pool is not None:
        assert {k: after["metadata"]["labels"].get(k) for k in pool.labels} == pool.labels
        assert [t for t in after["spec"]["taints"] if t["key"] in {x.key for x in pool.taints}] == [
            t.model_dump() for t in pool.taints]
    # One patch is enough: the node it leaves needs nothing more.
    assert node_patch(after, pool, ANNOTATION) is None


# ------------------------------------------------------------------ settings


def test_settings_refuse_a_node_in_two_pools_and_the_guards_taint() -> None:
    other = {"name": "h100-b", "nodes": ["gpu-a-004", "gpu-b-01"],
             "taints": [{"key": f"{PREFIX}/gpu-health", "effect": "NoSchedule"}]}
    with pytest.raises(SettingsError) as err:
        parse_settings({"label_prefix": PREFIX, "pools": [POOL.model_dump(), other]}, source="cm.json")
    message = str(err.value)
    assert message.startswith("cm.json: (top): Value error")
    assert "node gpu-a-004 is in pools h100-a and h100-b" in message
    assert f"pool h100-b: {PREFIX}/gpu-health belongs to the health guard; a pool may not set it" in message


def test_settings_refuse_the_guards_switch_fault_fence_as_a_pool_taint() -> None:
    """The node-pool agent must never own (and so never drop) the fence the guard puts on a faulty leaf."""
    other = {"name": "h100-b", "nodes": ["gpu-b-01"],
             "taints": [{"key": f"{PREFIX}/switch-fault", "effect": "NoSchedule"}]}
    with pytest.raises(SettingsError) as err:
        parse_settings({"label_prefix": PREFIX, "pools": [POOL.model_dump(), other]}, source="cm.json")
    assert f"pool h100-b: {PREFIX}/switch-fault belongs to the health guard; a pool may not set it" in str(err.value)


@pytest.mark.parametrize(("raw", "expected"), [
    ([], "cm.json: settings must be a JSON object, got list"),
    ({"label_prefix": PREFIX, "pools": [{"name": "p", "nodes": ["gpu-[9-1]"]}]},
     "pool p: range 'gpu-[9-1]' runs backwards (9 > 1)"),
    ({"label_prefix": PREFIX,
      "pools": [{"name": "p", "nodes": ["n"], "taints": [{"key": "k", "effect": "NoExecute"}]}]},
     "cm.json: pools.0.taints.0.effect: Input should be 'NoSchedule' or 'PreferNoSchedule'"),
    ({"label_prefix": PREFIX, "request_timeout_seconds": 25},
     "request_timeout_seconds (25.0) < renew_deadline_seconds"),
    ({"label_prefix": PREFIX, "surprise": 1}, "cm.json: surprise: Extra inputs are not permitted"),
])
def test_broken_settings_say_what_and_where(raw: Any, expected: str) -> None:
    with pytest.raises(SettingsError) as err:
        parse_settings(raw, source="cm.json")
    assert expected in str(err.value)


def test_the_cli_checks_the_stacks_settings(tmp_path: Any, capsys: pytest.CaptureFixture[str], prod: RunResult
                                            ) -> None:
    cm = prod.one("ConfigMap", "node-pools-settings")
    path = tmp_path / "settings.json"
    path.write_text(cm.inputs["data"]["settings.json"])
    assert cli.main(["--config", str(path), "--check-config"]) == 0
    assert json.loads(capsys.readouterr().out)["pools"][0]["name"] == "h100-a"
    path.write_text('{"pools": 3}')
    assert cli.main(["--config", str(path), "--check-config"]) == 2
    assert f"{path}: label_prefix: Field required" in capsys.readouterr().err


# ------------------------------------------------------------------ the shell on the in-memory API


def shell(api: MemoryApi, pools: list[Pool]) -> NodePools:
    agent = NodePools(NodePoolSettings(label_prefix=PREFIX, pools=pools, namespace="gpu-system"), api, identity="a")
    assert agent.elector.step()
    assert agent.informer.relist()
    return agent


def test_the_shell_labels_every_member_keeps_quarantines_and_retries_on_conflict() -> None:
    api = MemoryApi()
    for i in range(1, 5):
        api.put(NODES, node(f"gpu-a-00{i}", taints=[HEALTH] if i == 2 else []))
    api.put(NODES, node("cpu-sys-01", labels={"x": "y"}))
    agent = shell(api, [POOL])
    api.fail("patch:nodes", ApiError("conflict", "node changed", 409))
    assert agent.reconcile() == 3  # one patch lost a race (409): the watch brings that node back
    for event in api.history[-3:]:
        agent.nodes.apply(event[2], copy.deepcopy(event[3]))
    # Patches go side by side: which node met the 409 is whichever reached the API first.
    (lost,) = [n for n in (f"gpu-a-00{i}" for i in range(1, 5))
               if f"{PREFIX}/pool" not in (api.get(NODES, n)["metadata"].get("labels") or {})]
    agent.dirty.add(lost)
    agent.nodes.apply("MODIFIED", api.get(NODES, lost))
    assert agent.reconcile() == 1
    stored = {n: api.get(NODES, n) for n in ("gpu-a-001", "gpu-a-002", "gpu-a-004", "cpu-sys-01")}
    assert all(stored[n]["metadata"]["labels"][f"{PREFIX}/pool"] == "h100-a" for n in ("gpu-a-001", "gpu-a-004"))
    assert stored["gpu-a-002"]["spec"]["taints"] == [HEALTH, POOL_TAINT]
    assert stored["cpu-sys-01"]["metadata"]["labels"] == {"x": "y"}  # in no pool: never touched
    # Everything converged: a full pass sends nothing.
    agent.informer.relist()
    assert agent.reconcile() == 0
    assert agent.registry.get_sample_value("gpucluster_node_pools_members_missing", {"pool": "h100-a"}) == 0


def test_a_standby_writes_nothing_and_a_watch_that_is_not_current_defers_the_pass() -> None:
    api = MemoryApi()
    api.put(NODES, node("gpu-a-001"))
    leader = shell(api, [POOL])
    standby = NodePools(NodePoolSettings(label_prefix=PREFIX, pools=[POOL], namespace="gpu-system"), api,
                        identity="b")
    assert not standby.elector.step()
    standby.informer.relist()
    assert standby.reconcile() == 0 and api.count("patch:nodes") == 0
    leader.nodes.unsynced()
    assert leader.reconcile() == 0 and api.count("patch:nodes") == 0


# ------------------------------------------------------------------ what the stack renders


def test_the_stack_declares_gpu_pools_in_one_configmap_not_a_patch_per_node(prod: RunResult) -> None:
    patched = {r.metadata["name"] for r in prod.by_type("kubernetes:core/v1:NodePatch")}
    assert not any(n.startswith("gpu-") for n in patched)
    assert {n for n in patched if n.startswith("cpu-sys-")} == {f"cpu-sys-{i:02d}" for i in range(1, 13)}
    s = parse_settings(json.loads(prod.one("ConfigMap", "node-pools-settings").inputs["data"]["settings.json"]))
    members = s.membership()
    assert len(members) == 256
    assert members["gpu-b-128"].labels[f"{PREFIX}/gpu-model"] == "H200-SXM5-141GB"
    assert members["gpu-b-128"].taints[0].model_dump() == {"key": f"{PREFIX}/pool", "value": "h200-b",
                                                           "effect": "NoSchedule"}
    role = prod.one("ClusterRole", "gpu-cluster:node-pools")
    assert role.inputs["rules"] == [{"apiGroups": [""], "resources": ["nodes"],
                                     "verbs": ["get", "list", "watch", "patch"]}]
    deployment = prod.one("Deployment", "node-pools")
    assert deployment.inputs["spec"]["replicas"] == 2


def test_settings_follow_the_stack_prefix(run_stack: Any) -> None:
    result = run_stack("local", lambda c: c.update({"gpu-cluster:labelPrefix": "ml.example.org"}))
    s = parse_settings(json.loads(result.one("ConfigMap", "node-pools-settings").inputs["data"]["settings.json"]))
    assert s.pools[0].taints[0].key == "ml.example.org/pool"
    assert s.pools[0].labels["ml.example.org/pool"] == "local-gpu"


def test_settings_overrides_are_validated_like_the_configmap() -> None:
    from components.config import parse_config
    from components.mockrt import raw_from_stack

    cfg = parse_config(raw_from_stack("local"), "Pulumi.local.yaml")
    assert settings_from_config(cfg, resync_seconds=30).resync_seconds == 30
    with pytest.raises(SettingsError, match="pools: resync_seconds: Input should be greater than 0"):
        settings_from_config(cfg, resync_seconds=0)
