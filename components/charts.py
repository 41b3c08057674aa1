"""Helm charts from the Go module cache: the pinned upstream module carries the chart, so no chart repository is needed.

Volcano's module (``volcano.sh/volcano``, pinned in :mod:`components.pins`) ships its Helm chart under
``installer/helm/chart/volcano``. ``go mod download`` fetches that module (checksum-verified against
go.sum's database) into the module cache, the same cache the local control plane build fills, so a
preview renders the chart of exactly the release the end-to-end test runs, offline once it is cached.

Under the mock runtime nothing is downloaded: ``components.mockrt`` resolves a chart to its module
reference, so tests see the Chart resource and its values without Go.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import yaml

from components import pins

#: ``go mod download`` of a module already in the cache takes well under a second; a cold fetch of
#: Volcano's module (about 30 MB) takes seconds. This bounds a hung proxy, not a slow one.
DOWNLOAD_TIMEOUT_S = 300
ROOT = Path(__file__).resolve().parent.parent


class ChartError(RuntimeError):
    """A chart could not be found in the Go module cache (Go missing, download failed, chart moved)."""


@dataclass(frozen=True)
class ModuleChart:
    """A Helm chart inside a pinned Go module."""

    pin: pins.Pin
    #: The chart directory inside the module.
    subdir: str
    #: The ``version`` in the chart's Chart.yaml at that module version (upstream does not always bump it
    #: with a patch release: v1.14.1 carries chart 1.14.0); checked when the chart is resolved.
    chart_version: str

    @property
    def name(self) -> str:
        return self.subdir.rstrip("/").rsplit("/", 1)[-1]

    @property
    def reference(self) -> str:
        """``module@version/subdir``: where the chart comes from, independent of any machine's cache path."""
        return f"{self.pin.go_ref}/{self.subdir}"


VOLCANO = ModuleChart(pins.VOLCANO, "installer/helm/chart/volcano", chart_version="1.14.0")


def module_dir(download_json: str, ref: str) -> Path:
    """The module directory from ``go mod download -json`` output; a ChartError with Go's own message otherwise."""
    try:
        info = json.loads(download_json)
    except json.JSONDecodeError as err:
        raise ChartError(f"go mod download -json {ref}: output is not JSON ({err.msg} at {err.pos})") from err
    if not isinstance(info, dict):
        raise ChartError(f"go mod download -json {ref}: expected a JSON object, got {type(info).__name__}")
    if info.get("Error"):
        raise ChartError(f"go mod download {ref} failed: {info['Error']}")
    directory = info.get("Dir")
    if not isinstance(directory, str) or not directory:
        raise ChartError(f"go mod download -json {ref}: no Dir in its output")
    return Path(directory)


def check_chart(chart: ModuleChart, directory: Path) -> Path:
    """``directory/subdir`` when it holds the expected chart; a ChartError naming what differs otherwise."""
    path = directory / chart.subdir
    meta_file = path / "Chart.yaml"
    if not meta_file.is_file():
        raise ChartError(f"{chart.reference}: no Chart.yaml at {meta_file}; did the chart move in this release?")
    meta = yaml.safe_load(meta_file.read_text(encoding="utf-8")) or {}
    name = meta.get("name") if isinstance(meta, dict) else None
    version = str(meta.get("version")) if isinstance(meta, dict) else None
    if (name, version) != (chart.name, chart.chart_version):
        raise ChartError(
            f"{chart.reference}: Chart.yaml says chart {name!r} version {version!r}, components/charts.py expects "
            f"{chart.name!r} version {chart.chart_version!r}; update the expectation with the pin"
        )
    return path


def from_go_module_cache(chart: ModuleChart) -> str:
    """Download (or find in the cache) the chart's module and return the chart's directory."""
    go = shutil.which("go")
    if go is None:
        raise ChartError(
            f"the {chart.name} chart comes from the Go module {chart.pin.go_ref}, and `go` is not on PATH; "
            "install Go (>= 1.26, as tools/localcluster/go.mod) or set scheduling.install: false"
        )
    # Run inside the module that pins it, so its go.sum verifies the download without the checksum database.
    cwd = (ROOT / chart.pin.go_mod).parent if chart.pin.go_mod else ROOT
    try:
        proc = subprocess.run(
            [go, "mod", "download", "-json", chart.pin.go_ref],
            capture_output=True, text=True, timeout=DOWNLOAD_TIMEOUT_S, check=False, cwd=cwd,
        )
    except subprocess.TimeoutExpired as err:
        raise ChartError(f"go mod download {chart.pin.go_ref} took over {DOWNLOAD_TIMEOUT_S}s") from err
    if proc.returncode != 0 and not proc.stdout.strip():
        raise ChartError(f"go mod download {chart.pin.go_ref} failed: {proc.stderr.strip()}")
    return str(check_chart(chart, module_dir(proc.stdout, chart.pin.go_ref)))


def reference_only(chart: ModuleChart) -> str:
    """The chart's module reference in place of a path (for the mock runtime, which renders nothing)."""
    return chart.reference


_resolver: Callable[[ModuleChart], str] = from_go_module_cache


def chart_path(chart: ModuleChart) -> str:
    """Where the program's Chart resource finds ``chart`` (the module cache, unless a run says otherwise)."""
    return _resolver(chart)


@contextmanager
def resolving_with(resolver: Callable[[ModuleChart], str]) -> Iterator[None]:
    """Resolve charts with ``resolver`` for the duration (the mock runtime passes :func:`reference_only`)."""
    global _resolver
    previous, _resolver = _resolver, resolver
    try:
        yield
    finally:
        _resolver = previous
