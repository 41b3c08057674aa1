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
    # The benchmarks measure the program, the simulator and what the tools recorded, never by running the tools.
    ("bench", ("tools", "tests")),
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


PACKAGES = ("agents", "components", "tools", "bench", "policies", "gpucluster_cli", "training_runtime", "fakes")


def runtime_imports(path: Path) -> set[tuple[str, str | None]]:
    """``(module, name)`` of every import that runs (function bodies included, ``TYPE_CHECKING`` blocks not)."""
    found: set[tuple[str, str | None]] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.update((alias.name, None) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.update((node.module, alias.name) for alias in node.names)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text(encoding="utf-8"), filename=str(path)))
    return found


def import_graph() -> dict[str, set[str]]:
    modules: dict[str, Path] = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            if parts[:2] == ("tools", "engine"):
                continue
            modules[".".join(parts).removesuffix(".__init__")] = path
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        deps = {f"{m}.{a}" if a and f"{m}.{a}" in modules else m for m, a in runtime_imports(path)}
        graph[name] = {d for d in deps if d in modules and d != name}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_no_module_imports_back_into_a_module_that_imports_it() -> None:
    """No import circle anywhere in the house, lazy imports in function bodies included (only ``TYPE_CHECKING``
    imports, which never run, are left out)."""
    assert circles(import_graph()) == []


def test_the_circle_finder_finds_a_circle() -> None:
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []
