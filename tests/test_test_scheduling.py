"""The test run's own scheduling (see `tests/conftest.py`): what shares a cluster or the host is one unit of work."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.conftest import CLUSTER_MODULES, REAL_HOST_TESTS, ClusterScheduling

ROOT = Path(__file__).resolve().parents[1]


def _scope(nodeid: str) -> str:
    return ClusterScheduling._split_scope(object.__new__(ClusterScheduling), nodeid)


def test_the_real_host_tests_share_one_unit_each_cluster_module_is_one_and_every_other_test_its_own() -> None:
    real = ["tests/test_e2e_realnodes.py::test_a", "tests/test_e2e_stack_in_pods.py::test_b[x]",
            REAL_HOST_TESTS[-1]]
    assert {_scope(n) for n in real} == {"real-host"}
    assert _scope("tests/test_e2e.py::test_virtual_kubelet_provider") == _scope("tests/test_e2e.py::test_x[1]")
    assert _scope("tests/test_e2e.py::test_y") != _scope("tests/test_localcluster.py::test_y")
    for other in ("tests/test_realnodes.py::test_rules_added_ignores_counters_and_names_new_chains_and_rules",
                  "tests/test_sim.py::test_x[real-host]", "tests/test_e2e_realnodes_extra.py::test_c",
                  "tests/test_e2e_extra.py::test_d"):
        assert _scope(other) == other


def test_each_prefix_names_a_module_or_test_that_exists() -> None:
    """A renamed test or module would silently leave its unit: each prefix must still name one."""
    for prefix in (*REAL_HOST_TESTS, *CLUSTER_MODULES):
        path, _, name = prefix.partition("::")
        source = ROOT / path
        assert source.is_file(), prefix
        if name:
            tree = ast.parse(source.read_text())
            assert name in {f.name for f in tree.body if isinstance(f, ast.FunctionDef)}, prefix


def test_every_module_that_starts_a_cluster_or_takes_the_host_lock_is_one_unit() -> None:
    units = {prefix.partition("::")[0] for prefix in (*REAL_HOST_TESTS, *CLUSTER_MODULES)}
    for marker in ("control.up(", "scalerun.up(", "scalerun.bench(", "host_lock()"):
        found = {p.relative_to(ROOT).as_posix() for p in (ROOT / "tests").glob("test_*.py")
                 if marker in p.read_text() and p.name != Path(__file__).name}
        assert found <= units, (marker, sorted(found - units))
