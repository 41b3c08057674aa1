"""The InfiniBand exporter's contract: its names, port, settings and the command line that carries them.

No I/O and nothing outside the standard library: the deploying component (``components/observability.py``),
the stack config's default port and the exporter's own argument parser read them from here.
``components.observability.ib_exporter_settings`` is the one way from the stack configuration to them.
"""

from __future__ import annotations

from dataclasses import dataclass

APP = "ib-exporter"
"""Image, DaemonSet and label name of the exporter."""
DEFAULT_PORT = 9315
"""The exporter's metrics port (its entry in the Prometheus default port allocations)."""
DEFAULT_SYSFS_ROOT = "/sys"
"""Where the exporter reads ``class/infiniband`` when run on a host."""
HOST_SYSFS_ROOT = "/host/sys"
"""Where the DaemonSet mounts the node's ``/sys`` (read-only) for the exporter to read."""
HEALTH_PATH = "/healthz"
"""Answers 200 while the exporter serves; the probes use it."""


@dataclass(frozen=True)
class IbExporterSettings:
    """Where the exporter reads sysfs and where it serves ``/metrics``."""

    sysfs_root: str = DEFAULT_SYSFS_ROOT
    host: str = "0.0.0.0"
    port: int = DEFAULT_PORT

    @property
    def listen_address(self) -> str:
        return f"{self.host}:{self.port}"

    def args(self) -> list[str]:
        """The exporter's command-line flags for these settings."""
        return [f"--sysfs-root={self.sysfs_root}", f"--listen-address={self.listen_address}"]
