"""The researcher CLI installed the way a researcher installs it: its wheel (built from cli/) into a clean venv.

Offline and fast: the dependencies' wheels are repacked from the distributions this venv already has (the
versions requirements.txt pins), so ``pip install --no-index`` resolves the CLI's declared dependencies and
nothing else. A dependency the CLI imports but does not declare, or a module it imports but does not ship, fails
the install or the first command; Pulumi is never in the wheelhouse.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata as md
import os
import shutil
import subprocess
import sys
import time
import tomllib
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]
CLI_PROJECT = ROOT / "cli"
#: What cli/pyproject.toml's package-dir (the repository root) takes sources from.
SOURCE_PACKAGES = ("gpucluster_cli", "components", "agents", "training_runtime")
#: Installed-file entries a wheel does not carry (pip writes them on install).
_INSTALL_ONLY = ("INSTALLER", "REQUESTED", "RECORD", "direct_url.json")


def cli_project() -> dict[str, object]:
    return tomllib.loads((CLI_PROJECT / "pyproject.toml").read_text(encoding="utf-8"))


def declared_dependencies() -> list[Requirement]:
    project = cli_project()["project"]
    assert isinstance(project, dict)
    return [Requirement(r) for r in project["dependencies"]]


def shipped_modules() -> set[str]:
    """Every module the CLI's wheel carries, from cli/pyproject.toml (whole packages and listed modules)."""
    setuptools = cli_project()["tool"]["setuptools"]  # type: ignore[index]
    modules = {m.removesuffix(".__init__") for m in setuptools["py-modules"]}
    for package in setuptools["packages"]:
        base = ROOT.joinpath(*package.split("."))
        modules |= {package if p.stem == "__init__" else f"{package}.{p.stem}" for p in base.glob("*.py")}
    return modules


def _requirements_of(dist: md.Distribution, extras: set[str]) -> list[Requirement]:
    env = default_environment()
    out = []
    for text in dist.requires or []:
        req = Requirement(text)
        if req.marker is None or any(req.marker.evaluate({**env, "extra": e}) for e in (extras or {""})):
            out.append(req)
    return out


def dependency_closure(requirements: list[Requirement]) -> list[md.Distribution]:
    """The installed distributions that satisfy ``requirements`` and their own, transitively; an unmet one is an
    error naming it (the wheelhouse must hold what pip will ask for)."""
    seen: dict[str, md.Distribution] = {}
    todo = [(r, set(r.extras)) for r in requirements]
    while todo:
        req, extras = todo.pop()
        name = canonicalize_name(req.name)
        dist = md.distribution(req.name)
        if not req.specifier.contains(dist.version, prereleases=True):
            raise RuntimeError(f"{req} is declared, but this venv has {req.name} {dist.version}")
        if name in seen:
            continue
        seen[name] = dist
        todo += [(r, set(r.extras)) for r in _requirements_of(dist, extras)]
    return sorted(seen.values(), key=lambda d: canonicalize_name(d.metadata["Name"]))


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def repack(dist: md.Distribution, out: Path) -> Path:
    """A wheel of an installed distribution: its files from RECORD (no scripts, no caches), a fresh RECORD.

    Console scripts are left out: pip writes them again from ``entry_points.txt``.
    """
    files = [f for f in dist.files or [] if not str(f).startswith("..") and "__pycache__" not in str(f)]
    info = next(f.parts[0] for f in files if f.parts[0].endswith(".dist-info"))
    wheel_meta = dist.read_text("WHEEL") or ""
    tags = [line.split(":", 1)[1].strip().split("-") for line in wheel_meta.splitlines() if line.startswith("Tag:")]
    tag = "-".join(".".join(dict.fromkeys(t[i] for t in tags)) for i in range(3))
    path = out / f"{info.removesuffix('.dist-info')}-{tag}.whl"
    record = []
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as whl:
        for f in files:
            if f.parts[0] == info and f.name in _INSTALL_ONLY:
                continue
            data = Path(str(f.locate())).read_bytes()
            whl.writestr(str(f), data)
            record.append(f"{f},{_record_hash(data)},{len(data)}")
        record.append(f"{info}/RECORD,,")
        whl.writestr(f"{info}/RECORD", "\n".join(record) + "\n")
    return path


def build_cli_wheel(out: Path, stage: Path) -> Path:
    """The CLI's wheel, built from a copy of the sources so the working tree gets no build directory."""
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "build", "*.egg-info")
    for name in (*SOURCE_PACKAGES, "cli"):
        shutil.copytree(ROOT / name, stage / name, ignore=ignore)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--disable-pip-version-check", "--no-deps",
                    "--no-build-isolation", "--no-index", "-w", str(out), str(stage / "cli")],
                   check=True, capture_output=True, text=True, timeout=300)
    [wheel] = out.glob("gpucluster_cli-*.whl")
    return wheel


@dataclass
class CliVenv:
    """A venv holding only the CLI and its declared dependencies."""

    path: Path
    wheel: Path
    #: Seconds per step: wheelhouse (CLI wheel + repacked dependencies), venv, pip install.
    timings: dict[str, float] = field(default_factory=dict)

    def bin(self, name: str) -> Path:
        return self.path / "bin" / name

    def run(self, name: str, *args: str, env: dict[str, str] | None = None,
            timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """One of the venv's console scripts, with the venv's bin first on PATH (as an activated venv)."""
        base = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
        full = {**base, "PATH": f"{self.path / 'bin'}{os.pathsep}{base.get('PATH', '')}", "NO_COLOR": "1",
                "COLUMNS": "200", **(env or {})}
        return subprocess.run([str(self.bin(name)), *args], env=full, cwd=self.path, capture_output=True,
                              text=True, timeout=timeout)

    def python(self, code: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(self.bin("python")), "-I", "-c", code], capture_output=True, text=True,
                              timeout=60)


def install_cli(tmp: Path) -> CliVenv:
    """Build the wheelhouse, create a clean venv (no system site-packages) and ``pip install --no-index`` the CLI."""
    started = time.monotonic()
    wheelhouse = tmp / "wheelhouse"
    wheelhouse.mkdir()
    wheel = build_cli_wheel(wheelhouse, tmp / "src")
    for dist in dependency_closure(declared_dependencies()):
        repack(dist, wheelhouse)
    timings = {"wheelhouse_s": time.monotonic() - started}
    started = time.monotonic()
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    timings["venv_s"] = time.monotonic() - started
    started = time.monotonic()
    # This venv's pip installs into the new one (--python): the same pip a researcher's venv gets, minus the
    # seconds ensurepip takes to put a copy there.
    subprocess.run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "-q",
                    "--disable-pip-version-check", "--no-index", "--find-links", str(wheelhouse), str(wheel)],
                   check=True, capture_output=True, text=True, timeout=300)
    timings["install_s"] = time.monotonic() - started
    return CliVenv(venv, wheel, {k: round(v, 2) for k, v in timings.items()})

