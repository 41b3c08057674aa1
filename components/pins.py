"""The version of every upstream component, once: what a stack deploys is what the local control plane builds.

The end-to-end test runs the components that ``tools/localcluster/build.sh`` builds from Go modules
pinned in go.mod files; a stack deploys images (and Volcano's chart) of the same release. Each pin
names the go.mod that builds it locally, so ``tests/test_pins.py`` and ``python3 -m components.pins``
(run before the local build) fail when the two drift apart. A component the local cluster cannot run
says why in ``unproven``.

Standard library only: the local build checks the table before any virtualenv exists.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Pin:
    """One upstream component at one release."""

    name: str
    #: The release, as upstream tags it (``v`` prefix included when upstream uses one).
    version: str
    #: The Go module the local control plane builds it from, and the go.mod (from the repository root)
    #: that requires it; both None when the local cluster does not run this component.
    go_module: str | None = None
    go_mod: str | None = None
    #: Why the end-to-end test does not run it (only for components without a go.mod).
    unproven: str = ""

    @property
    def go_ref(self) -> str:
        """``module@version`` for ``go mod download``."""
        if self.go_module is None:
            raise ValueError(f"pin {self.name!r} has no Go module")
        return f"{self.go_module}@{self.version}"


#: Volcano 1.15 needs a ``volcano.sh/apis`` newer than any release the Go module proxy serves, so it
#: cannot be built here; prod runs the newest release the local cluster builds and the e2e proves.
VOLCANO = Pin("volcano", "v1.14.1", "volcano.sh/volcano", "tools/localcluster/volcano/go.mod")
DESCHEDULER = Pin("descheduler", "v0.36.0", "sigs.k8s.io/descheduler", "tools/localcluster/addons/go.mod")
#: Fake nodes of the local cluster; never deployed, pinned here so every upstream version sits in one table.
KWOK = Pin("kwok", "v0.8.0", "sigs.k8s.io/kwok", "tools/localcluster/addons/go.mod")
#: What a production cluster runs to turn the stack's ServiceMonitors, PodMonitors and PrometheusRules into a
#: Prometheus; the stack deploys none of it. The local cluster installs its monitoring CRDs from this module, and with
#: real nodes runs the operator and its config reloader, built from it (cmd/operator, cmd/prometheus-config-reloader),
#: in pods: a Prometheus resource selects the stack's monitors and rules (tools/localcluster/prometheus_operator.py).
PROMETHEUS_OPERATOR = Pin("prometheus-operator", "v0.85.0", "github.com/prometheus-operator/prometheus-operator",
                          "tools/localcluster/promoperator/go.mod")
#: The local cluster's Prometheus for its real nodes, built from the module at the release prometheus-operator v0.85.0
#: is built on and runs by default: module v0.305.0 is Prometheus 3.5.0 (:func:`prometheus_release`). Debian's 2.42
#: cannot serve here: it is built without Kubernetes service discovery, which the operator's configuration needs. A
#: module of its own: it is built on the Kubernetes 1.32 client libraries, the operator on 1.33 (one module would build
#: Prometheus's discovery against 1.33's, which does not compile). The stack deploys no Prometheus (a site runs it).
PROMETHEUS = Pin("prometheus", "v0.305.0", "github.com/prometheus/prometheus", "tools/localcluster/prometheus/go.mod")
PROMETHEUS_ADAPTER = Pin(
    "prometheus-adapter", "v0.12.0",
    unproven="the local cluster runs no Prometheus to serve custom metrics; the HPA path is tested on rendered objects",
)
DCGM_EXPORTER = Pin(
    "dcgm-exporter", "4.2.3-4.1.3",
    unproven="needs NVIDIA GPUs and drivers; the local cluster's nodes are kwok fakes",
)
#: The upstream virtual-kubelet command with its built-in mock provider: the local stack's external provider.
#: A generic provider ships its own binary (its image in the stack config), built on this release's library.
VIRTUAL_KUBELET = Pin("virtual-kubelet", "v1.14.1", "github.com/virtual-kubelet/virtual-kubelet",
                      "tools/localcluster/virtualkubelet/go.mod")
#: The ``--provider`` (``vkProvider``) of that command's built-in test provider: its capacity file has a format of
#: its own (components/providers.py ``provider_config``), and it is the only provider the local binary carries.
MOCK_VK_PROVIDER = "mock"
LIQO_VIRTUAL_KUBELET = Pin(
    "liqo-virtual-kubelet", "v1.1.2",
    unproven="a Liqo peering needs a second cluster; the e2e's external provider is a virtual-kubelet node",
)

#: The local cluster's NetworkPolicy engine for its real nodes (its firewall alone, beside kube-proxy); never
#: deployed by a stack, which relies on the site's CNI to enforce its policies. The only release served here.
KUBE_ROUTER = Pin("kube-router", "v2.1.0", "github.com/cloudnativelabs/kube-router/v2",
                  "tools/localcluster/kuberouter/go.mod")

#: The local cluster's DNS for its real nodes' pods (the kubernetes plugin over the API server); a stack relies on
#: the site's cluster DNS and never deploys one.
COREDNS = Pin("coredns", "v1.15.0", "github.com/coredns/coredns", "tools/localcluster/coredns/go.mod")

PINS: tuple[Pin, ...] = (
    VOLCANO, DESCHEDULER, KWOK, PROMETHEUS_OPERATOR, PROMETHEUS, PROMETHEUS_ADAPTER, DCGM_EXPORTER, VIRTUAL_KUBELET,
    LIQO_VIRTUAL_KUBELET, KUBE_ROUTER, COREDNS,
)


def prometheus_release(module_version: str) -> str:
    """The Prometheus release a ``github.com/prometheus/prometheus`` module version is: upstream tags release
    3.MINOR.PATCH as module v0.3MINOR.PATCH (v0.305.0 is v3.5.0)."""
    found = re.fullmatch(r"v0\.(\d+)\.(\d+)", module_version)
    if found is None or int(found.group(1)) < 100:
        raise ValueError(f"not a Prometheus module version: {module_version!r}")
    minor = int(found.group(1))
    return f"v{minor // 100}.{minor % 100}.{found.group(2)}"


def by_name(name: str) -> Pin:
    """The pin called ``name``; a clear error listing the known names otherwise."""
    for pin in PINS:
        if pin.name == name:
            return pin
    raise KeyError(f"no pin named {name!r}; known: {', '.join(p.name for p in PINS)}")


def go_mod_requires(text: str) -> dict[str, str]:
    """Module → version of every ``require`` of a go.mod, single-line or block form (comments ignored)."""
    found: dict[str, str] = {}
    in_block = False
    for raw in text.splitlines():
        line = raw.split("//", 1)[0].strip()
        if re.fullmatch(r"require\s*\(", line):
            in_block = True
            continue
        if in_block and line == ")":
            in_block = False
            continue
        words = line.split()
        if not in_block:
            if not words or words[0] != "require":
                continue
            words = words[1:]
        if len(words) == 2:
            found[words[0]] = words[1]
    return found


def drift(pins: tuple[Pin, ...] = PINS, root: Path = ROOT) -> list[str]:
    """One line per pin whose go.mod requires another version of its module (or none); [] when all agree."""
    problems: list[str] = []
    for pin in pins:
        if pin.go_mod is None:
            continue
        path = root / pin.go_mod
        if not path.is_file():
            problems.append(f"{pin.name}: {pin.go_mod} does not exist")
            continue
        have = go_mod_requires(path.read_text(encoding="utf-8")).get(pin.go_module or "")
        if have != pin.version:
            problems.append(
                f"{pin.name}: components/pins.py pins {pin.version} but {pin.go_mod} requires "
                f"{pin.go_module} {have or '(nothing)'}; change both together"
            )
    return problems


def main(argv: list[str]) -> int:
    """``check``: exit 1 naming every drift; ``ref NAME``: print ``module@version`` for ``go mod download``."""
    if argv == ["check"]:
        problems = drift()
        for line in problems:
            print(f"pins: {line}", file=sys.stderr)
        return 1 if problems else 0
    if len(argv) == 2 and argv[0] == "ref":
        try:
            print(by_name(argv[1]).go_ref)
        except (KeyError, ValueError) as err:
            print(f"pins: {err.args[0]}", file=sys.stderr)
            return 2
        return 0
    print("usage: python3 -m components.pins check | ref NAME", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
