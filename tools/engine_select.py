"""Which Pulumi CLI runs ``make preview`` and ``make up``: the user's own, or the one built from Go modules.

A Pulumi user who already has the CLI wants the project to run on it, with their own backend and login,
rather than wait for a Go build. Their CLI is used when it is at least as new as the Python SDK the
project pins (an older engine may not speak the SDK's protocol); otherwise, or when asked with
``ENGINE=built``, the project's own build (``make engine``) runs offline. ``ENGINE=path`` insists on
the user's CLI and fails with the reason when it cannot be used.

The decision (:func:`choose_engine`) is pure; :func:`select_engine` gathers its inputs from the machine.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from packaging.version import InvalidVersion, Version

ROOT = Path(__file__).resolve().parent.parent
REQUIREMENTS = ROOT / "requirements.txt"
#: Binaries of the project itself that must never count as "the user's own" CLI.
PROJECT_CLIS = (ROOT / "tools", ROOT / ".state" / "engine")

ENGINE_VALUES = ("auto", "path", "built")
#: What a cold build of the project's engine costs, as measured on the 2-core build machine (Go cache empty,
#: the local control plane building beside it: 29m23s); a warm run only checks its stamp.
ENGINE_BUILD_ESTIMATE = "cold: about 35 min on 2 cores from an empty Go cache; warm: seconds"
EngineKind = Literal["path", "built"]


class EngineSelectionError(ValueError):
    """``ENGINE`` asks for something this machine cannot give; the message says what and why."""


@dataclass(frozen=True)
class EngineChoice:
    """The engine to run and the one line the summary prints about it."""

    kind: EngineKind
    reason: str
    cli: Path | None = None
    version: Version | None = None

    def describe(self) -> str:
        """``engine: …`` as the preview and ``make up`` print it."""
        if self.kind == "path":
            return f"engine: your pulumi {self.version} ({self.cli}) with your backend and login; {self.reason}"
        return f"engine: the project's offline build (.state/engine); {self.reason}"


def sdk_version(requirements: str) -> Version:
    """The ``pulumi==X`` pin of a requirements file; a clear error when it is missing or not exact."""
    for line in requirements.splitlines():
        match = re.fullmatch(r"\s*pulumi\s*==\s*([^\s;#]+)\s*(#.*)?", line)
        if match:
            try:
                return Version(match.group(1))
            except InvalidVersion:
                break
    raise EngineSelectionError("requirements.txt has no exact `pulumi==<version>` pin to compare a CLI against")


def parse_cli_version(text: str) -> Version | None:
    """The version ``pulumi version`` printed (``v3.190.0``, ``v3.191.0-alpha.x1234``); None if there is none."""
    for token in text.split():
        match = re.fullmatch(r"v?(\d+\.\d+\.\d+)([-+.].*)?", token)
        if match:
            try:
                return Version(token.removeprefix("v"))
            except InvalidVersion:
                return Version(match.group(1))
    return None


def choose_engine(
    requested: str | None,
    found: Path | None,
    found_version: Version | None,
    sdk: Version,
) -> EngineChoice:
    """Decide the engine from ``ENGINE`` (None/"" means auto), the CLI on PATH and its version.

    A CLI counts when it is at or above the SDK's release: pre-releases of the same release count as
    that release, so a locally built ``3.272.0-dev`` CLI is not refused for a ``3.272.0`` SDK.
    """
    wanted = (requested or "auto").strip().lower()
    if wanted not in ENGINE_VALUES:
        raise EngineSelectionError(f"ENGINE={requested!r}: expected one of {', '.join(ENGINE_VALUES)}")
    if wanted == "built":
        return EngineChoice("built", "asked for with ENGINE=built")
    if found is None:
        if wanted == "path":
            raise EngineSelectionError("ENGINE=path, but there is no `pulumi` on PATH; install the Pulumi CLI "
                                       f">= {sdk} or use ENGINE=built")
        return EngineChoice("built", f"no `pulumi` on PATH (yours is used when it is >= {sdk}, the SDK's version)")
    if found_version is None:
        problem = f"`{found} version` printed no version"
        if wanted == "path":
            raise EngineSelectionError(f"ENGINE=path, but {problem}")
        return EngineChoice("built", problem)
    if Version(found_version.base_version) < sdk:
        problem = f"your pulumi {found_version} ({found}) is older than the Python SDK's {sdk} (requirements.txt)"
        if wanted == "path":
            raise EngineSelectionError(f"ENGINE=path, but {problem}; upgrade it or use ENGINE=built")
        return EngineChoice("built", problem)
    why = "asked for with ENGINE=path" if wanted == "path" else f"found on PATH, >= the SDK's {sdk}"
    return EngineChoice("path", why, found, found_version)


def find_cli(path: str | None) -> Path | None:
    """The first ``pulumi`` on ``path`` that is not one of the project's own (tools/pulumi, .state/engine)."""
    for entry in (path or "").split(os.pathsep):
        if not entry:
            continue
        hit = shutil.which("pulumi", path=entry)
        if hit is None:
            continue
        resolved = Path(hit).resolve()
        if any(resolved.is_relative_to(own.resolve()) for own in PROJECT_CLIS):
            continue
        return Path(hit)
    return None


def cli_version(cli: Path, timeout_s: float = 60.0) -> Version | None:
    """What ``<cli> version`` reports; None when it fails, hangs or prints no version."""
    env = {**os.environ, "PULUMI_SKIP_UPDATE_CHECK": "true"}
    try:
        proc = subprocess.run([str(cli), "version"], capture_output=True, text=True, timeout=timeout_s,
                              env=env, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return parse_cli_version(proc.stdout) if proc.returncode == 0 else None


def select_engine(env: dict[str, str] | None = None, requirements: Path = REQUIREMENTS) -> EngineChoice:
    """The engine for this run: ``ENGINE`` and ``PATH`` from ``env`` (default: the process environment)."""
    env = dict(os.environ) if env is None else env
    sdk = sdk_version(requirements.read_text(encoding="utf-8"))
    requested = env.get("ENGINE")
    if (requested or "").strip().lower() == "built":
        return choose_engine(requested, None, None, sdk)
    found = find_cli(env.get("PATH"))
    return choose_engine(requested, found, cli_version(found) if found else None, sdk)


def main(argv: list[str] | None = None) -> int:
    """``python -m tools.engine_select``: the chosen engine's line, or ``--kind`` (path|built) for make."""
    import argparse
    import sys

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kind", action="store_true", help="print only path or built")
    args = parser.parse_args(argv)
    try:
        choice = select_engine()
    except EngineSelectionError as error:
        print(f"engine: {error}", file=sys.stderr)
        return 2
    print(choice.kind if args.kind else choice.describe())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
