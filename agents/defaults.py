"""The stack's two naming defaults, written once: every agent, the stack config, the policies and the local
cluster read them from here (a second literal would drift the day one of them changes)."""

DEFAULT_LABEL_PREFIX = "gpucluster.io"
"""Prefix of every label, taint, annotation and gate the platform owns (the stack's ``labelPrefix``)."""
DEFAULT_GPU_RESOURCE = "nvidia.com/gpu"
"""The extended resource the GPU device plugin advertises (the stack's ``gpuResource``)."""
