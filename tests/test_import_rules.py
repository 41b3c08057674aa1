"""The house's import rules, enforced: agents never import the components (their images carry no components
package, and the circle agents ↔ components/config made every agent's contract drag the whole stack config);
the kit imports no agent."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def imported_modules(path: Path) -> set[str]:
    """Every module a file imports, at any depth (``TYPE_CHECKING`` blocks and function bodies included)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return found


def offenders(package: str, forbidden: tuple[str, ...]) -> list[str]:
    out = []
    for path in sorted((ROOT / package).rglob("*.py")):
        for module in sorted(imported_modules(path)):
            if module.split(".")[0] in forbidden or any(module.startswith(f"{f}.") for f in forbidden if "." in f):
                out.append(f"{path.relative_to(ROOT)} imports {module}")
    return out


@pytest.mark.parametrize(("package", "forbidden"), [
    # An agent's image carries the agents package only: no deploy side, no tools, no test doubles.
    ("agents", ("components", "tools", "bench", "policies", "gpucluster_cli", "pulumi", "pulumi_kubernetes", "fakes",
                "tests")),
    # The deploy side never climbs to the tools that run it, nor to the test doubles.
    ("components", ("tools", "bench", "tests", "fakes")),
    # The simulator is a library the tools drive (tools/simulate.py), never the other way round.
    ("bench/sim", ("tools", "tests")),
    ("fakes", ("components", "tools", "bench", "tests", "pulumi", "pulumi_kubernetes")),
    ("agents/kit", ("agents.burst_controller", "agents.health_guard", "agents.ib_exporter",
                    "agents.checkpoint_check")),
])
def test_no_forbidden_imports(package: str, forbidden: tuple[str, ...]) -> None:
    assert offenders(package, forbidden) == []


def test_the_simulate_tool_uses_only_the_simulators_entry_point() -> None:
    """``tools/simulate.py`` depends on ``bench.sim.entry``, not on the simulator's inner layout."""
    inner = sorted(m for m in imported_modules(ROOT / "tools" / "simulate.py")
                   if m.startswith("bench.") and m != "bench.sim.entry")
    assert inner == []


def test_the_rule_sees_imports_hidden_under_type_checking(tmp_path: Path) -> None:
    source = tmp_path / "x.py"
    source.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from components.config import C\n"
                      "def f():\n    import tools.render\n")
    assert imported_modules(source) >= {"components.config", "tools.render"}
