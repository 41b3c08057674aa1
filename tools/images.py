"""The agents' container images (agents/*/Dockerfile): build them here, push them from CI, record their digests.

``python3 -m tools.images local``   ``make images``: every agent image and the pause image built here without a
                                    registry (buildah on a Python base built locally, tools/image_local.py) into
                                    .state/images/oci, which the local cluster's real nodes import.
``python3 -m tools.images build``   ``make images-upstream``: builds every agent image on its pinned upstream base
                                    with docker, podman or buildah (the first that works), tagged as the stack
                                    deploys it; says so when none can.
``python3 -m tools.images check``   every Dockerfile's base image is pinned by digest and every agent has an
                                    entry in components/agent_digests.json (non-zero exit naming each problem).
``python3 -m tools.images push DIR``  CI: ``docker buildx build --push`` of each image, metadata files into DIR.
``python3 -m tools.images record DIR``  CI: the pushed digests from DIR's metadata into the digest table.
``python3 -m tools.images registry``  the registry host the images are pushed to (for ``docker login``).

Standard library only (plus components.images, which is too): the images workflow runs it without a venv.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from components import images
from tools import image_local

ROOT = Path(__file__).resolve().parent.parent
AGENTS = ROOT / "agents"
#: The local cluster's Go build (tools/localcluster/build.sh).
LOCAL_BIN = ROOT / ".state" / "localcluster" / "bin"

#: ``FROM <image>[ AS <stage>]`` with a digest-pinned image: ``name:tag@sha256:<64 hex>``.
PINNED_FROM = re.compile(r"[^\s@]+:[^\s@/]+@sha256:[0-9a-f]{64}")
BUILDERS = ("docker", "podman", "buildah")


@dataclass(frozen=True)
class Agent:
    """One agent image: its name (the Deployment's app name) and Dockerfile."""

    name: str
    dockerfile: Path

    @property
    def image(self) -> str:
        """The tag the stack deploys (without the digest, which only a push produces)."""
        return images.agent_tag(self.name)


def binary_images(bin_dir: Path | None = None) -> list[image_local.BinaryImage]:
    """The upstream binaries the local stack runs in pods, each as the image the stack names: virtual-kubelet
    (the provider's Deployment runs the image's entrypoint, as upstream's ``/usr/bin/virtual-kubelet``) and the
    descheduler (its CronJob's command names ``/bin/descheduler``); and what the real nodes' monitoring runs:
    Prometheus, prometheus-operator and its config reloader."""
    where = bin_dir or LOCAL_BIN
    return [
        image_local.BinaryImage("virtual-kubelet-mock", where / "virtual-kubelet", images.VIRTUAL_KUBELET_MOCK,
                                "/usr/bin/virtual-kubelet"),
        image_local.BinaryImage("descheduler", where / "descheduler", images.DESCHEDULER, "/bin/descheduler"),
        # The real pods' Prometheus, of the pinned module: the operator's StatefulSet runs the image's entrypoint. An
        # archive name of its own: `prometheus` was Debian's binary, which has no Kubernetes discovery.
        image_local.BinaryImage("prometheus-server", where / "prometheus", image_local.PROMETHEUS_IMAGE,
                                "/bin/prometheus"),
        # prometheus-operator (tools/localcluster/prometheus_operator.py) and the config reloader its StatefulSets
        # run (as the command /bin/prometheus-config-reloader), where upstream's images have them.
        image_local.BinaryImage("prometheus-operator", where / "prometheus-operator",
                                image_local.PROMETHEUS_OPERATOR_IMAGE, "/bin/operator"),
        image_local.BinaryImage("prometheus-config-reloader", where / "prometheus-config-reloader",
                                image_local.PROMETHEUS_CONFIG_RELOADER_IMAGE, "/bin/prometheus-config-reloader"),
    ]


def agents(root: Path = AGENTS) -> list[Agent]:
    """Every ``agents/<dir>/Dockerfile``; the image name is the directory with ``_`` as ``-``."""
    return [Agent(d.parent.name.replace("_", "-"), d) for d in sorted(root.glob("*/Dockerfile"))]


def workloads(root: Path = ROOT) -> list[Agent]:
    """The images of our own that run as users' workloads, not as platform agents: the training runtime with its
    reference trainers (what a job spec names on the local cluster's real GPU nodes). The stack deploys none of
    them, so they have no digest entry; their bases are pinned like the agents'."""
    return [Agent("training-runtime", root / "training_runtime" / "Dockerfile")]


_ARG_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}|\$([A-Za-z_][A-Za-z0-9_]*)")


def base_images(dockerfile_text: str) -> list[str]:
    """The images the ``FROM`` lines name, with ``ARG`` defaults substituted (a base given as a build argument is
    judged by its default: what a build without arguments pulls); build stages referred to by name are left out."""
    found: list[str] = []
    stages: set[str] = set()
    args: dict[str, str] = {}
    for line in dockerfile_text.splitlines():
        words = line.split()
        if len(words) >= 2 and words[0].upper() == "ARG":
            name, _, default = words[1].partition("=")
            args[name] = default
        if len(words) >= 2 and words[0].upper() == "FROM":
            image = next(w for w in words[1:] if not w.startswith("--"))
            image = _ARG_REF.sub(lambda m: args.get(m.group(1) or m.group(2), m.group(0)), image)
            if image not in stages:
                found.append(image)
            if len(words) >= 4 and words[-2].upper() == "AS":
                stages.add(words[-1])
    return found


def standins(root: Path = ROOT) -> list[image_local.DockerfileImage]:
    """Local images of ours under the reference of an upstream image the stack names, for the real nodes, where the
    upstream one cannot run: dcgm-exporter (no DCGM on fake GPUs; tools/localcluster/dcgm_standin.py), with the
    real GPU nodes' GPU count."""
    from tools.localcluster.realnodes import REAL_GPUS_PER_NODE

    dockerfile = root / "tools" / "localcluster" / "dcgm_standin.Dockerfile"
    return [image_local.DockerfileImage("dcgm-exporter-standin", dockerfile, ref=images.DCGM_EXPORTER,
                                        build_args={"GPUS": str(REAL_GPUS_PER_NODE)})]


def check(agent_list: Sequence[Agent], digests: dict[str, str | None],
          workload_list: Sequence[Agent] = ()) -> list[str]:
    """One line per problem: a base image not pinned by digest (agents' and workloads'), an agent missing from the
    digest table."""
    problems: list[str] = []
    for agent in [*agent_list, *workload_list]:
        where = agent.dockerfile.relative_to(ROOT) if agent.dockerfile.is_relative_to(ROOT) else agent.dockerfile
        bases = base_images(agent.dockerfile.read_text(encoding="utf-8"))
        if not bases:
            problems.append(f"{where}: no FROM line")
        for base in bases:
            if not PINNED_FROM.fullmatch(base):
                problems.append(f"{where}: base image {base} is not pinned by digest (name:tag@sha256:<64 hex>)")
        if agent in agent_list and agent.name not in digests:
            problems.append(f"{images.AGENT_DIGESTS_FILE.name}: no entry for agent {agent.name} ({where})")
    for name in sorted(set(digests) - {a.name for a in agent_list}):
        problems.append(f"{images.AGENT_DIGESTS_FILE.name}: {name} has no agents/*/Dockerfile")
    return problems


def find_builder(which: dict[str, str | None] | None = None) -> tuple[str | None, list[str]]:
    """The first container builder that works here, and why each one found does not (for the message)."""
    notes: list[str] = []
    for name in BUILDERS:
        path = which.get(name) if which is not None else shutil.which(name)
        if path is None:
            continue
        probe = [path, "version"] if name == "buildah" else [path, "info"]
        try:
            proc = subprocess.run(probe, capture_output=True, text=True, timeout=60, check=False)
        except (OSError, subprocess.TimeoutExpired) as err:
            notes.append(f"{name} ({path}) did not answer `{' '.join(probe[1:])}`: {err}")
            continue
        if proc.returncode == 0:
            return path, notes
        said = (proc.stderr or proc.stdout).strip().splitlines()
        notes.append(f"{name} ({path}) cannot build here: {said[-1] if said else f'exit {proc.returncode}'}")
    return None, notes


def build_command(builder: str, agent: Agent) -> list[str]:
    """The local build of one image, from the repository root (the Dockerfiles copy from there)."""
    verb = ["bud"] if Path(builder).name == "buildah" else ["build"]
    return [builder, *verb, "-f", str(agent.dockerfile.relative_to(ROOT)), "-t", agent.image, "."]


def build(agent_list: Sequence[Agent]) -> int:
    builder, notes = find_builder()
    if builder is None:
        print("images: no container builder can run here (looked for docker, podman and buildah); "
              "the agents' images are not built. Install one of them, or let the agent-images workflow "
              "build and push them.", file=sys.stderr)
        for note in notes:
            print(f"  {note}", file=sys.stderr)
        return 3
    print(f"images: building {len(agent_list)} agent images with {builder}")
    for agent in agent_list:
        argv = build_command(builder, agent)
        print(f"images: {agent.name} -> {agent.image}", flush=True)
        label = f"images: building {agent.name}"
        proc = subprocess.run(["bash", str(ROOT / "tools" / "progress.sh"), label, "--", *argv], cwd=ROOT,
                              check=False)
        if proc.returncode != 0:
            print(f"images: {agent.name} failed (exit {proc.returncode}): {' '.join(argv)}", file=sys.stderr)
            return proc.returncode
    print(f"images: built {', '.join(a.image for a in agent_list)}")
    return 0


def push(agent_list: Sequence[Agent], metadata_dir: Path) -> int:
    """CI: build and push each image with buildx, its metadata (with the pushed digest) into ``metadata_dir``."""
    metadata_dir.mkdir(parents=True, exist_ok=True)
    for agent in agent_list:
        argv = ["docker", "buildx", "build", "--push", "--provenance=false", "-f",
                str(agent.dockerfile.relative_to(ROOT)), "-t", agent.image,
                "--metadata-file", str(metadata_dir / f"{agent.name}.json"), "."]
        print(f"images: pushing {agent.image}", flush=True)
        proc = subprocess.run(argv, cwd=ROOT, check=False)
        if proc.returncode != 0:
            print(f"images: push of {agent.name} failed (exit {proc.returncode})", file=sys.stderr)
            return proc.returncode
    return 0


def digests_from_metadata(metadata_dir: Path, known: Sequence[str]) -> dict[str, str]:
    """Agent → digest from buildx metadata files (``<agent>.json`` with ``containerimage.digest``)."""
    found: dict[str, str] = {}
    for path in sorted(metadata_dir.glob("*.json")):
        name = path.stem
        if name not in known:
            raise ValueError(f"{path}: {name} is no agent (known: {', '.join(known)})")
        try:
            digest = json.loads(path.read_text(encoding="utf-8")).get("containerimage.digest")
        except (json.JSONDecodeError, AttributeError) as err:
            raise ValueError(f"{path}: not buildx metadata: {err}") from None
        if not isinstance(digest, str) or not images.DIGEST.fullmatch(digest):
            raise ValueError(f"{path}: containerimage.digest is {digest!r}, not sha256:<64 hex>")
        found[name] = digest
    if not found:
        raise ValueError(f"{metadata_dir}: no metadata files (<agent>.json) to record")
    return found


def record(found: dict[str, str], path: Path | None = None) -> dict[str, str | None]:
    """Write the pushed digests into the digest table (sorted, one agent a line, for a readable diff)."""
    path = path or images.AGENT_DIGESTS_FILE
    table = images.agent_digests(path)
    table.update(found)
    path.write_text(json.dumps(dict(sorted(table.items())), indent=2) + "\n", encoding="utf-8")
    return table


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m tools.images", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    sub.add_parser("build")
    sub.add_parser("local")
    sub.add_parser("check")
    sub.add_parser("registry")
    for name in ("push", "record"):
        sub.add_parser(name).add_argument("metadata_dir", type=Path)
    args = parser.parse_args(argv)
    found = agents()
    if args.cmd == "build":
        return build(found)
    if args.cmd == "local":
        return image_local.main([*(image_local.DockerfileImage(a.name, a.dockerfile) for a in [*found, *workloads()]),
                                 *standins()], images.AGENT_VERSION,
                                LOCAL_BIN / "pause", image_local.PAUSE_IMAGE, binary_images())
    if args.cmd == "registry":
        print(images.AGENT_REGISTRY.split("/", 1)[0])
        return 0
    if args.cmd == "push":
        return push(found, args.metadata_dir)
    if args.cmd == "record":
        try:
            table = record(digests_from_metadata(args.metadata_dir, [a.name for a in found]))
        except ValueError as err:
            print(f"images: {err}", file=sys.stderr)
            return 2
        print(f"images: recorded {json.dumps(table)} in {images.AGENT_DIGESTS_FILE.relative_to(ROOT)}")
        return 0
    try:
        problems = check(found, images.agent_digests(), workloads())
    except ValueError as err:
        problems = [str(err)]
    for line in problems:
        print(f"images: {line}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
