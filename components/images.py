"""Every image the platform runs, pinned by tag; upstream releases come from the pin table (components/pins.py).

Stack keys that choose an image (``descheduler.image``, ``inference.adapter.image``) default to the pins here;
images a stack must name itself (a virtual-kubelet provider's, a service's, a training job's) have none.
"""

from __future__ import annotations

import functools
import json
import re
from pathlib import Path

from components import pins

#: Volcano release (image tag; the chart comes from the same module, see components/charts.py).
VOLCANO_VERSION = pins.VOLCANO.version

KUBE_BATCH = "docker.io/kubesigs/kube-batch:v0.5"
#: Defaults of the stack's ``descheduler.image`` and ``inference.adapter.image`` (a stack may pin another).
DESCHEDULER = f"registry.k8s.io/descheduler/descheduler:{pins.DESCHEDULER.version}"
PROMETHEUS_ADAPTER = f"registry.k8s.io/prometheus-adapter/prometheus-adapter:{pins.PROMETHEUS_ADAPTER.version}"
#: Liqo's virtual kubelet for ``kind: liqo`` providers (a provider's ``image`` overrides it).
LIQO_VIRTUAL_KUBELET = f"ghcr.io/liqotech/virtual-kubelet:{pins.LIQO_VIRTUAL_KUBELET.version}"
#: The local stack's external provider: upstream virtual-kubelet with its built-in mock provider, at the pinned
#: release. No registry serves it; ``make images`` builds it under this name from the local cluster's binary.
VIRTUAL_KUBELET_MOCK = f"registry.gpucluster.io/providers/virtual-kubelet-mock:{pins.VIRTUAL_KUBELET.version}"
DCGM_EXPORTER = f"nvcr.io/nvidia/k8s/dcgm-exporter:{pins.DCGM_EXPORTER.version}-ubuntu22.04"

#: Our own agents, built from agents/*/Dockerfile and published under the platform registry: the default of the
#: stack key ``agentRegistry`` (each site pushes to and pulls from its own; the local stack's real nodes import
#: ``make images`` output under ``docker.io/local``).
AGENT_REGISTRY = "registry.gpucluster.io/platform"
#: ``host[:port]/path`` with no tag or digest: where agent images are pulled from.
REGISTRY = re.compile(r"[a-z0-9]([a-z0-9.-]*[a-z0-9])?(:[0-9]{1,5})?(/[a-z0-9]+([._-][a-z0-9]+)*)*")
AGENT_VERSION = "0.1.0"
#: The digest each agent image was pushed with, per agent (null before its first push): written by
#: .github/workflows/agent-images.yml through ``python3 -m tools.images record`` and reviewed as a pull request.
AGENT_DIGESTS_FILE = Path(__file__).with_name("agent_digests.json")


def agent_digests(path: Path | None = None) -> dict[str, str | None]:
    """Agent name → pushed digest (``sha256:…``) or None; a clear error naming the file when it is malformed."""
    path = path or AGENT_DIGESTS_FILE
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as err:
        raise ValueError(f"{path.name}: cannot read the agents' image digests: {err}") from None
    if not isinstance(data, dict) or not all(
        isinstance(k, str) and (v is None or (isinstance(v, str) and DIGEST.fullmatch(v))) for k, v in data.items()
    ):
        raise ValueError(f"{path.name}: expected {{agent name: \"sha256:<64 hex>\" or null}}")
    return data


#: An image digest as registries report it.
DIGEST = re.compile(r"sha256:[0-9a-f]{64}")


@functools.cache
def _recorded_digests(path: Path) -> dict[str, str | None]:
    """The digest table at ``path``, read once per process (every agent component asks for its image)."""
    return agent_digests(path)


def agent_tag(name: str, registry: str = AGENT_REGISTRY) -> str:
    """The tag an agent image is built and pushed with (burst-controller, ib-exporter, health-guard…)."""
    return f"{registry}/{name}:{AGENT_VERSION}"


def agent_image(name: str, registry: str = AGENT_REGISTRY) -> str:
    """The pinned image of one of our agents in ``registry``: its tag, and the digest it was pushed with once the
    images workflow has recorded one. Another registry holds the site's own builds, whose digests the table does
    not know, so it gets the tag alone."""
    digest = _recorded_digests(AGENT_DIGESTS_FILE).get(name) if registry == AGENT_REGISTRY else None
    return agent_tag(name, registry) + (f"@{digest}" if digest else "")


def image_version(image: str) -> str:
    """The ``app.kubernetes.io/version`` label of an image reference: its tag, or "" when pinned by digest only.

    ``registry:5000/name:1.2.3`` → ``1.2.3``; ``name:1.2@sha256:…`` → ``1.2``; ``name@sha256:…`` → "".
    """
    last = image.rsplit("/", 1)[-1].split("@", 1)[0]
    tag = last.rsplit(":", 1)[1] if ":" in last else ""
    return label_value(tag)


def label_value(text: str) -> str:
    """``text`` as a valid label value: at most 63 characters of ``[A-Za-z0-9_.-]``, starting and ending with an
    alphanumeric (a tag may be 128 characters and start with ``_``); "" when nothing valid remains."""
    kept = re.sub(r"[^A-Za-z0-9_.-]", "", text)[:63]
    return re.sub(r"^[^A-Za-z0-9]+|[^A-Za-z0-9]+$", "", kept)
