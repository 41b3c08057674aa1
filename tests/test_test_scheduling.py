"""The test run's own scheduling: the real-host tests stay one unit of work (see `tests/conftest.py`)."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.conftest import REAL_HOST_TESTS, RealHostScheduling

ROOT = Path(__file__).resolve().parents[1]


def _scope(nodeid: str) -> str:
    return RealHostScheduling._split_scope(object.__new__(RealHostScheduling), nodeid)


def test_every_real_host_test_shares_one_scope_and_every_other_test_is_its_own() -> None:
    real = ["tests/test_e2e_realnodes.py::test_a", "tests/test_e2e_stack_in_pods.py::test_b[x]",
            REAL_HOST_TESTS[-1]]
    assert {_scope(n) for n in real} == {"real-host"}
    for other in ("tests/test_realnodes.py::test_rules_added_ignores_counters_and_names_new_chains_and_rules",
                  "tests/test_sim.py::test_x[real-host]", "tests/test_e2e_realnodes_extra.py::test_c"):
        assert _scope(other) == other


def test_each_real_host_prefix_names_a_module_or_test_that_exists() -> None:
    """A renamed test or module would silently leave the group: each prefix must still name one."""
    for prefix in REAL_HOST_TESTS:
        path, _, name = prefix.partition("::")
        source = ROOT / path
        assert source.is_file(), prefix
        if name:
            tree = ast.parse(source.read_text())
            assert name in {f.name for f in tree.body if isinstance(f, ast.FunctionDef)}, prefix


def test_every_module_that_takes_the_host_lock_is_in_the_group() -> None:
    """Whatever takes `nodehost.host_lock` runs real nodes or changes the host: it belongs in the group."""
    takers = {p.relative_to(ROOT).as_posix() for p in (ROOT / "tests").glob("test_*.py")
              if "host_lock()" in p.read_text() and p.name != Path(__file__).name}
    grouped = {prefix.partition("::")[0] for prefix in REAL_HOST_TESTS}
    assert takers <= grouped, sorted(takers - grouped)
