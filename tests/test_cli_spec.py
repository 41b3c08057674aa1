"""The researcher's job spec is outside input: every broken spec gets a message naming the file and the key."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from components.cluster_settings import ClusterSettings, PoolSettings, cluster_settings
from components.config import ClusterConfig, Team, TrainingJob
from gpucluster_cli.spec import JobSpec, SpecError, load_spec, parse_spec, resolve
from tools.localcluster.plan import load_stack_config

ROOT = Path(__file__).resolve().parents[1]
CORPUS = sorted((ROOT / "tests" / "corpus" / "cli_specs").glob("*.yaml"))


def local_settings() -> ClusterSettings:
    cfg = load_stack_config(ROOT, "local")
    assert isinstance(cfg, ClusterConfig)
    return cluster_settings(cfg)


LOCAL = local_settings()


def expected(path: Path) -> str:
    first = path.read_text().splitlines()[0]
    assert first.startswith("# expect: ")
    return first.removeprefix("# expect: ")


@pytest.mark.parametrize("path", CORPUS, ids=[p.stem for p in CORPUS])
def test_broken_spec_corpus(path: Path) -> None:
    with pytest.raises(SpecError) as err:
        resolve(load_spec(path), LOCAL, str(path))
    assert f"{path}: {expected(path)}" in str(err.value) or (
        str(err.value).startswith(str(path)) and expected(path) in str(err.value)), str(err.value)


def test_corpus_is_not_empty() -> None:
    assert len(CORPUS) >= 10


def test_unreadable_file_names_the_file(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match=r"nope\.yaml: cannot read the job spec"):
        load_spec(tmp_path / "nope.yaml")


def test_every_problem_is_listed_at_once() -> None:
    with pytest.raises(SpecError) as err:
        parse_spec("name: BAD\ngpus: -1\n", "j.yaml")
    lines = str(err.value).splitlines()
    assert {line.split(":")[1].strip() for line in lines} == {"name", "image", "command", "gpus"}
    assert all(line.startswith("j.yaml: ") for line in lines)


def test_pool_is_required_where_the_cluster_has_several() -> None:
    two = LOCAL.model_copy(update={"pools": [*LOCAL.pools, PoolSettings(
        pool=LOCAL.pools[0].pool.model_copy(update={"name": "other"}), queue="training")]})
    spec = parse_spec("name: a\nimage: r/t:1\ncommand: [x]\ngpus: 8\n", "j.yaml")
    with pytest.raises(SpecError, match=r"j\.yaml: pool: required on this cluster; choose one of "
                                        r"\['local-gpu', 'other'\]"):
        resolve(spec, two, "j.yaml")


def test_a_good_spec_resolves_to_the_stacks_job_shape() -> None:
    spec = parse_spec("name: ft\nimage: r/t:1\ncommand: [python, t.py]\ngpus: 16\ncheckpointInterval: 100\n", "j")
    job = resolve(spec, LOCAL, "j")
    assert (job.pool, job.workers, job.gpus_per_worker, job.enabled) == ("local-gpu", 2, 8, True)
    assert job.checkpoint is not None and job.checkpoint.filesystem == "nfs-ckpt"
    assert job.checkpoint.interval_steps == 100
    # Worker size: the stack's training defaults unless the spec says; then exactly what it says.
    fields = TrainingJob.model_fields
    assert (job.cpu_per_worker, job.memory_per_worker) == (fields["cpu_per_worker"].default,
                                                           fields["memory_per_worker"].default)
    small = resolve(parse_spec("name: ft\nimage: r/t:1\ncommand: [python, t.py]\ngpus: 8\ncpuPerWorker: 500m\n"
                               "memoryPerWorker: 2Gi\n", "j"), LOCAL, "j")
    assert (small.cpu_per_worker, small.memory_per_worker) == ("500m", "2Gi")


# -- properties ---------------------------------------------------------------------------------------

KEYS = ["name", "image", "command", "gpus", "pool", "checkpointInterval", "checkpointFilesystem", "team",
        "maxRetries", "cpuPerWorker", "memoryPerWorker", "gpuCount", "nodes"]
scalars = st.one_of(st.none(), st.booleans(), st.integers(-5, 100), st.text(max_size=12),
                    st.sampled_from(["a", "r/t:1", "local-gpu", "r/t:latest"]))
values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                        st.dictionaries(st.sampled_from(["nodes", "gpusPerNode", "x"]),
                                                                        inner, max_size=3)), max_leaves=6)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.sampled_from(KEYS), values, max_size=8))
def test_any_mapping_parses_or_fails_naming_file_and_key(data: dict[str, Any]) -> None:
    text = yaml.safe_dump(data)
    try:
        spec = parse_spec(text, "any.yaml")
    except SpecError as exc:
        for line in str(exc).splitlines():
            assert line.startswith("any.yaml: ")
            key = line.removeprefix("any.yaml: ").split(":")[0]
            assert key.split(".")[0].split("[")[0] in [*KEYS, "(top level)"], line
        return
    try:
        job = resolve(spec, LOCAL, "any.yaml")
    except SpecError as exc:
        assert str(exc).startswith("any.yaml: ")
        return
    assert job.workers * job.gpus_per_worker <= LOCAL.pools[0].pool.gpu_count


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 64))
def test_gpu_totals_fill_whole_nodes_or_say_what_fits(gpus: int) -> None:
    spec = JobSpec(name="a", image="r/t:1", command=["x"], gpus=gpus)
    pool = LOCAL.pools[0].pool
    try:
        job = resolve(spec, LOCAL, "j")
    except SpecError as exc:
        assert str(exc).startswith("j: gpus: ")
        assert gpus > pool.gpu_count or gpus % pool.gpus_per_node
        return
    assert job.workers * job.gpus_per_worker == gpus
    assert job.workers == 1 or job.gpus_per_worker == pool.gpus_per_node


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 8), st.integers(1, 8), st.text("abcdefghij-", min_size=1, max_size=20).filter(
    lambda s: s[0] != "-" and s[-1] != "-"))
def test_node_shape_round_trip(nodes: int, per_node: int, name: str) -> None:
    text = yaml.safe_dump({"name": name, "image": "r/t:1", "command": ["x"],
                           "gpus": {"nodes": nodes, "gpusPerNode": per_node}})
    spec = parse_spec(text, "s")
    try:
        job = resolve(spec, LOCAL, "s")
    except SpecError as exc:
        assert nodes > 4 or per_node > 8, str(exc)
        return
    assert (job.name, job.workers, job.gpus_per_worker) == (name, nodes, per_node)


# -- teams --------------------------------------------------------------------------------------------

TEAMS = LOCAL.model_copy(update={"teams": [Team(name="nlp", guarantee_gpus=8, capability_gpus=16),
                                           Team(name="vision", guarantee_gpus=8)]})


def _spec(extra: str) -> JobSpec:
    return parse_spec(f"name: a\nimage: r/t:1\ncommand: [x]\n{extra}", "j.yaml")


def test_a_team_is_required_where_the_cluster_has_teams() -> None:
    with pytest.raises(SpecError, match=r"j\.yaml: team: required on this cluster .*choose one of "
                                        r"\['nlp', 'vision'\]"):
        resolve(_spec("gpus: 8\n"), TEAMS, "j.yaml")


def test_an_unknown_team_names_the_known_ones() -> None:
    with pytest.raises(SpecError, match=r"j\.yaml: team: unknown team 'speech'; choose one of \['nlp', 'vision'\]"):
        resolve(_spec("gpus: 8\nteam: speech\n"), TEAMS, "j.yaml")


def test_a_team_on_a_cluster_without_teams_is_refused() -> None:
    with pytest.raises(SpecError, match=r"j\.yaml: team: this cluster has no team queues; leave team out"):
        resolve(_spec("gpus: 8\nteam: nlp\n"), LOCAL, "j.yaml")


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 4), st.integers(1, 8), st.sampled_from(["nlp", "vision"]))
def test_a_job_over_its_teams_quota_is_refused_naming_the_quota(nodes: int, per_node: int, team: str) -> None:
    """nlp may hold 16 GPUs at once; vision has no cap beyond the cluster's 32."""
    spec = _spec(f"gpus: {{nodes: {nodes}, gpusPerNode: {per_node}}}\nteam: {team}\n")
    quota = 16 if team == "nlp" else 32
    try:
        job = resolve(spec, TEAMS, "j.yaml")
    except SpecError as exc:
        assert nodes * per_node > quota
        assert str(exc) == (f"j.yaml: gpus: {nodes * per_node} GPUs exceeds team '{team}' quota of {quota} GPUs "
                            f"at once; ask for at most {quota}, or ask the cluster admins to raise "
                            f"scheduling.teams '{team}' capabilityGpus")
        return
    assert nodes * per_node <= quota and job.team == team
    assert TEAMS.training_args(job).queue == f"team-{team}"


def test_a_gang_that_needs_a_pools_warm_spares_is_refused_before_it_waits_for_ever() -> None:
    """Training never tolerates the spare taint: a gang of the whole pool would never bind."""
    cfg = load_stack_config(ROOT, "local")
    assert isinstance(cfg, ClusterConfig)
    pool = cfg.pools[0].model_copy(update={"spare_nodes": 1})
    settings = LOCAL.model_copy(update={"pools": [PoolSettings(pool=pool, queue=LOCAL.pools[0].queue)]})
    with pytest.raises(SpecError, match=r"j\.yaml: gpus: 4 nodes would never start: pool 'local-gpu' keeps 1 of its 4 "
                                        r"nodes as warm spares training does not use; ask for at most 24 GPUs"):
        resolve(_spec("gpus: 32\n"), settings, "j.yaml")
    assert resolve(_spec("gpus: 24\n"), settings, "j.yaml").workers == 3
