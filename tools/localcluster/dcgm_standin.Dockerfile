# The dcgm-exporter stand-in for the local cluster's real GPU nodes (tools/localcluster/dcgm_standin.py): `make images`
# builds it on the local Python base under the reference the stack names for dcgm-exporter. Never pushed.
ARG BASE=python:3.11.11-slim-bookworm@sha256:081075da77b2b55c23c088251026fb69a7b2bf92471e491ff5fd75c192fd38e5
FROM ${BASE}
# The fake GPUs of a real GPU node (tools/localcluster/realnodes.py REAL_GPUS_PER_NODE, passed by tools/images.py).
ARG GPUS=8
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PYTHONPATH=/opt/gpu-cluster \
    DCGM_STANDIN_GPUS=${GPUS}
WORKDIR /opt/gpu-cluster
COPY components/__init__.py components/dcgm_counters.py components/
COPY tools/__init__.py tools/
COPY tools/localcluster/__init__.py tools/localcluster/dcgm_standin.py tools/localcluster/
USER 65532:65532
ENTRYPOINT ["python3", "-m", "tools.localcluster.dcgm_standin"]
