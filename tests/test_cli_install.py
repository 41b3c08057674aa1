"""The researcher CLI installs on its own: no Pulumi in its import closure, a distribution (cli/) that ships exactly
that closure and declares exactly the third-party packages it imports, at the versions the tests ran, and a clean
venv in which ``gpucluster`` and ``kubectl gpucluster`` work against an API server.

The server here is the HTTP fake of tests/test_cli_commands.py; tests/test_e2e_researcher.py runs the installed
CLI against the local control plane too.
"""

from __future__ import annotations

import ast
import importlib.metadata as md
import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from gpucluster_cli import __version__
from tests.cli_venv import (
    ROOT,
    SOURCE_PACKAGES,
    CliVenv,
    declared_dependencies,
    install_cli,
    shipped_modules,
)
from tests.test_cli_commands import NS, SPEC, Fake, serve

BLOCK_PULUMI = ("import sys\n"
                "for name in ('pulumi', 'pulumi_kubernetes', 'pulumi_policy', 'pulumi_random'):\n"
                "    sys.modules[name] = None  # any import of them raises ImportError\n")


def _requirements_pins() -> dict[str, str]:
    pins = {}
    for path in ROOT.glob("requirements*.txt"):
        for line in path.read_text(encoding="utf-8").splitlines():
            if m := re.fullmatch(r"([A-Za-z0-9_.-]+)==(\S+)", line.strip()):
                pins[md.distribution(m.group(1)).metadata["Name"].lower().replace("_", "-")] = m.group(2)
    return pins


def _kubeconfig(path: Path, server: str) -> Path:
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "fake",
        "clusters": [{"name": "fake", "cluster": {"server": server}}],
        "users": [{"name": "alice", "user": {"token": "alice-token"}}],
        "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "alice", "namespace": NS}}],
    }))
    return path


@pytest.fixture
def api(tmp_path: Path) -> Iterator[tuple[Fake, Path]]:
    """The fake API server and a kubeconfig for it; yields the fake's state and the kubeconfig."""
    state = Fake()
    with serve(state) as url:
        yield state, _kubeconfig(tmp_path / "kubeconfig", url)


@pytest.fixture
def spec_file(tmp_path: Path) -> Path:
    path = tmp_path / "job.yaml"
    path.write_text(SPEC)
    return path


def _closure(extra: str = "") -> set[str]:
    """The repository modules a fresh interpreter loads for ``import gpucluster_cli.cli``."""
    code = (f"{extra}import sys, gpucluster_cli.cli\n"
            f"print('\\n'.join(sorted(m for m in sys.modules if m.split('.')[0] in {SOURCE_PACKAGES!r})))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-3000:]
    return set(out.stdout.split())


def test_importtime_shows_no_pulumi_module() -> None:
    """``python -X importtime -c 'import gpucluster_cli.cli'`` names every module imported: none is Pulumi's."""
    out = subprocess.run([sys.executable, "-X", "importtime", "-c", "import gpucluster_cli.cli"], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-3000:]
    imported = [line.rsplit("|", 1)[-1].strip() for line in out.stderr.splitlines() if "|" in line]
    assert "gpucluster_cli.cli" in imported
    pulumi = [m for m in imported if "pulumi" in m.lower()]
    assert pulumi == []


def test_help_and_a_dry_run_with_pulumi_unimportable(api: tuple[Fake, Path], spec_file: Path) -> None:
    """With every Pulumi package unimportable, ``--help`` and ``train submit --dry-run`` still work."""
    fake, kubeconfig = api
    run = (f"{BLOCK_PULUMI}from gpucluster_cli.cli import main\n"
           "main(sys.argv[1:], prog_name='gpucluster')\n")
    helped = subprocess.run([sys.executable, "-c", run, "--help"], cwd=ROOT, capture_output=True, text=True,
                            timeout=60)
    assert helped.returncode == 0, helped.stderr[-3000:]
    assert "Usage: gpucluster [OPTIONS] COMMAND" in helped.stdout
    dry = subprocess.run([sys.executable, "-c", run, "--kubeconfig", str(kubeconfig), "train", "submit",
                          str(spec_file), "--dry-run"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert dry.returncode == 0, dry.stderr[-3000:]
    assert "would submit ft-llama: 2 × 8 GPUs in pool local-gpu, queue team-nlp" in dry.stdout
    assert fake.jobs == {} and [r["query"]["dryRun"] for r in fake.requests if r["method"] == "PATCH"] == [
        ["All"], ["All"]]


def test_the_distribution_ships_exactly_the_import_closure() -> None:
    """cli/pyproject.toml lists what the CLI imports from the repository, no more and no less."""
    closure = _closure(BLOCK_PULUMI)
    shipped = shipped_modules()
    assert sorted(closure - shipped) == [], "imported by the CLI but missing from cli/pyproject.toml py-modules"
    assert sorted(shipped - closure) == [], "listed in cli/pyproject.toml but not imported by the CLI"


def _third_party_imports(modules: set[str]) -> set[str]:
    """Top-level third-party modules that the shipped modules import anywhere (function bodies included)."""
    found: set[str] = set()
    for module in modules:
        parts = module.split(".")
        path = ROOT.joinpath(*parts).with_suffix(".py")
        if not path.exists():
            path = ROOT.joinpath(*parts, "__init__.py")
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                found |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                found.add(node.module.split(".")[0])
    return {m for m in found if m not in sys.stdlib_module_names and m not in SOURCE_PACKAGES and m != "__future__"}


def test_dependencies_are_what_the_cli_imports_at_the_pinned_versions() -> None:
    declared = {r.name.lower().replace("_", "-"): r for r in declared_dependencies()}
    providers = md.packages_distributions()
    imported = {providers[m][0].lower().replace("_", "-") for m in _third_party_imports(shipped_modules())}
    assert imported == set(declared), "declare exactly the distributions the shipped modules import"
    pins = _requirements_pins()
    for name, req in declared.items():
        lower = next(s.version for s in req.specifier if s.operator == ">=")
        assert lower == pins[name], f"{req}: the lower bound is not requirements.txt's {name}=={pins[name]}"
        assert any(s.operator == "<" for s in req.specifier), f"{req}: no upper bound"
        assert req.specifier.contains(md.version(name)), f"{req}: this venv has {md.version(name)}"


def test_the_console_scripts_are_declared_in_both_distributions() -> None:
    """The CLI's own distribution and the repository's (the dev venv) give the same three commands."""
    import tomllib

    want = {"gpucluster": "gpucluster_cli.cli:main", "kubectl-gpucluster": "gpucluster_cli.cli:kubectl_plugin",
            "kubectl_complete-gpucluster": "gpucluster_cli.cli:kubectl_complete"}
    for path in (ROOT / "cli" / "pyproject.toml", ROOT / "pyproject.toml"):
        scripts = tomllib.loads(path.read_text(encoding="utf-8"))["project"]["scripts"]
        assert {k: v for k, v in scripts.items() if k in want} == want, path


@pytest.fixture(scope="module")
def cli_venv(tmp_path_factory: pytest.TempPathFactory) -> CliVenv:
    venv = install_cli(tmp_path_factory.mktemp("cli-venv"))
    print(f"\nclean-venv install of the CLI: {json.dumps(venv.timings)}")
    return venv


def test_the_clean_venv_has_the_cli_and_no_pulumi(cli_venv: CliVenv) -> None:
    listed = subprocess.run([sys.executable, "-m", "pip", "--python", str(cli_venv.bin("python")), "list",
                             "--format=json", "--disable-pip-version-check"], capture_output=True, text=True,
                            timeout=120, check=True)
    names = {d["name"].lower() for d in json.loads(listed.stdout)}
    assert "gpucluster-cli" in names
    assert not [n for n in names if "pulumi" in n], names
    assert "gpu-cluster-agents" not in names  # the repository's own distribution stays out
    probe = cli_venv.python("import importlib.util as u; print(u.find_spec('pulumi'), u.find_spec('components.stack'))")
    assert probe.stdout.split() == ["None", "None"], probe.stderr
    meta = cli_venv.python("import importlib.metadata as m, json; print(json.dumps(sorted("
                           "(e.name, e.value) for e in m.distribution('gpucluster-cli').entry_points)))")
    assert ["kubectl-gpucluster", "gpucluster_cli.cli:kubectl_plugin"] in json.loads(meta.stdout), meta.stderr
    assert cli_venv.bin("kubectl-gpucluster").exists() and cli_venv.bin("kubectl_complete-gpucluster").exists()


def test_the_installed_cli_runs_help_version_and_the_plugin(cli_venv: CliVenv) -> None:
    helped = cli_venv.run("gpucluster", "--help")
    assert helped.returncode == 0, helped.stderr[-3000:]
    assert helped.stdout.startswith("Usage: gpucluster [OPTIONS] COMMAND [ARGS]...")
    version = cli_venv.run("gpucluster", "--version")
    assert version.returncode == 0 and version.stdout.strip() == f"gpucluster, version {__version__}"
    # kubectl finds `kubectl-gpucluster` on PATH and runs it for `kubectl gpucluster ...`.
    plugin = cli_venv.run("kubectl-gpucluster", "train", "--help")
    assert plugin.returncode == 0, plugin.stderr[-3000:]
    assert plugin.stdout.startswith("Usage: kubectl gpucluster train [OPTIONS] COMMAND [ARGS]...")
    completed = cli_venv.run("kubectl_complete-gpucluster", "train", "")
    assert completed.returncode == 0 and completed.stdout.splitlines()[-1] == ":4", completed.stderr[-3000:]
    assert {line.split("\t")[0] for line in completed.stdout.splitlines()[:-1]} == {
        "submit", "list", "status", "logs", "cancel"}
    script = cli_venv.run("gpucluster", env={"_GPUCLUSTER_COMPLETE": "bash_source"})
    assert script.returncode == 0 and "complete -o nosort -F _gpucluster_completion gpucluster" in script.stdout


def test_the_installed_cli_dry_runs_a_submission(cli_venv: CliVenv, api: tuple[Fake, Path],
                                                 spec_file: Path) -> None:
    """Server-side (``--dry-run``) and client-side (``--dry-run=client``) against the fake API server."""
    fake, kubeconfig = api
    env = {"KUBECONFIG": str(kubeconfig)}
    server = cli_venv.run("gpucluster", "train", "submit", str(spec_file), "--dry-run", env=env)
    assert server.returncode == 0, server.stderr[-3000:]
    assert "would submit ft-llama: 2 × 8 GPUs in pool local-gpu, queue team-nlp" in server.stdout
    assert [r["query"].get("dryRun") for r in fake.requests if r["method"] == "PATCH"] == [["All"], ["All"]]
    fake.requests.clear()
    client = cli_venv.run("kubectl-gpucluster", "train", "submit", str(spec_file), "--dry-run=client", "-o", "name",
                          env=env)
    assert client.returncode == 0, client.stderr[-3000:]
    assert client.stdout == "job.batch.volcano.sh/ft-llama\npodmonitor.monitoring.coreos.com/ft-llama\n"
    assert [r["method"] for r in fake.requests] == ["GET"] and fake.jobs == {}
