"""Serve the gpu-cluster component package: the engine runs this directory as the package's provider plugin."""

from pulumi.provider.experimental import component_provider_host

from components.package import PACKAGE, UnifiedGpuCluster

if __name__ == "__main__":
    component_provider_host(name=PACKAGE, components=[UnifiedGpuCluster])
