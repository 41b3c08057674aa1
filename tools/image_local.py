"""Images without a registry: every agent image built here from its own Dockerfile, for the local nodes.

No registry is reachable on a build machine, so the Dockerfiles' pinned upstream base cannot be pulled. Their
base is a build argument (``ARG BASE=<pinned upstream>``); here it points at a Python base built locally:

1. ``debootstrap --variant=minbase`` of Debian bookworm with python3, pip and CA certificates (cached by its
   inputs under ``.state/images/base``). The build machine's CA bundle replaces the image's, so ``pip`` in a
   ``RUN`` step trusts what this machine trusts (a TLS-inspecting proxy included); the image is only for the
   local nodes and never pushed.
2. ``umoci`` packs the rootfs into an OCI layout, ``buildah pull oci-archive:`` stores it as :data:`BASE_REF`.
3. ``buildah bud --isolation chroot`` builds each Dockerfile with ``--build-arg BASE=`` that base, daemonless.
4. ``buildah push … oci-archive:`` writes ``.state/images/oci/<name>.tar``, which every real node's containerd
   imports (tools/localcluster/nodehost.py) under :data:`LOCAL_REGISTRY`.

The pause image (the pod sandbox) is a single static binary of ours (tools/localcluster/cmd/pause) packed the
same way. The upstream Go binaries the stack runs in pods (virtual-kubelet with its mock provider, the descheduler)
come from the local cluster's build, each copied onto the base under the exact reference the stack names
(:func:`binary_plan`), so a node finds it without a pull; so do prometheus-operator, its config reloader and
Prometheus, which a production cluster runs beside the stack, under local references. Plans are pure
(:func:`base_plan`, :func:`agent_plan`, :func:`binary_plan`, :func:`pause_plan`); :func:`run` executes them.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from components.pins import PROMETHEUS, PROMETHEUS_OPERATOR, prometheus_release

ROOT = Path(__file__).resolve().parent.parent
STATE = ROOT / ".state" / "images"
#: Where the real nodes find the images: the registry part of every local image reference.
LOCAL_REGISTRY = "docker.io/local"
#: The pod sandbox image every real node's containerd uses (tools/localcluster/cmd/pause).
PAUSE_IMAGE = f"{LOCAL_REGISTRY}/pause:3.10"
BASE_REF = "localhost/gpucluster-python-base:bookworm"
#: The real pods' Prometheus (tools/localcluster/prometheus_operator): the local cluster's build of the pinned module,
#: tagged with its release (the Prometheus resource's ``spec.version`` says the same to the operator).
PROMETHEUS_IMAGE = f"{LOCAL_REGISTRY}/prometheus:{prometheus_release(PROMETHEUS.version)}"
#: prometheus-operator and its config reloader, the local cluster's builds of the pinned release.
PROMETHEUS_OPERATOR_IMAGE = f"{LOCAL_REGISTRY}/prometheus-operator:{PROMETHEUS_OPERATOR.version}"
PROMETHEUS_CONFIG_RELOADER_IMAGE = f"{LOCAL_REGISTRY}/prometheus-config-reloader:{PROMETHEUS_OPERATOR.version}"
SUITE = "bookworm"
MIRROR = "http://deb.debian.org/debian"
BASE_PACKAGES = ("python3", "python3-pip", "python3-venv", "ca-certificates")
HOST_CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
#: buildah's storage: vfs works on every filesystem (overlay-on-overlay does not), chroot needs no daemon.
BUILDAH = ("buildah", "--storage-driver", "vfs")
#: Free space a build needs where buildah stores: vfs keeps every layer whole, so the base, one image's working copy
#: and its commit at once (each image is dropped once archived, :func:`drop_stored`).
BUILD_SPACE_BYTES = 3 * 1024**3
#: What a local build needs on PATH, and the Debian package that has it.
TOOLS = {"debootstrap": "debootstrap", "umoci": "umoci", "buildah": "buildah"}


@dataclass(frozen=True)
class Step:
    """One command of a plan, with what it does (for the progress line)."""

    what: str
    argv: tuple[str, ...]


@dataclass(frozen=True)
class DockerfileImage:
    """One image built from a Dockerfile of ours: an agent's, a workload's or a stand-in's."""

    name: str
    dockerfile: Path
    #: The reference it is stored under: the local registry's ``<name>:<version>`` when None; a stand-in takes the
    #: exact reference of the upstream image the stack names, so a node finds it without a pull.
    ref: str | None = None
    build_args: Mapping[str, str] = field(default_factory=dict)


def drop_stored(*refs: str, strict: bool = False) -> Step:
    """Remove images from buildah's storage. The nodes import the archive, not the store; an image kept there after its
    archive (or left by a rebuild, which only moves the tag) costs its whole rootfs again under vfs, on every build
    until the disk is full. ``strict``: after a push, where the image must be there; otherwise a leftover's sweep."""
    names = " ".join(refs)
    if strict:
        return Step(f"drop {names} from buildah's storage (the archive is what the nodes import)",
                    (*BUILDAH, "rmi", *refs))
    return Step(f"drop a stored {names} left by an earlier build",
                ("sh", "-c", f"{' '.join(BUILDAH)} rmi -f {names} >/dev/null 2>&1 || true"))


def space_problem(free_bytes: int, where: Path, needed: int = BUILD_SPACE_BYTES) -> str | None:
    """The line that says a build would fill the disk, or None when ``where`` has room."""
    if free_bytes >= needed:
        return None
    gib = 1024**3
    return (f"{free_bytes / gib:.1f} GiB free under {where}; a local build needs {needed / gib:.1f} GiB there "
            "(buildah's vfs storage keeps each layer whole): free space first, e.g. `buildah --storage-driver vfs rmi "
            "--prune` for images no tag names")


def storage_root() -> Path:
    """Where buildah stores images (its ``GraphRoot``); the default when ``buildah info`` cannot say."""
    proc = subprocess.run([*BUILDAH, "info", "--format", "{{.store.GraphRoot}}"], capture_output=True, text=True,
                          check=False)
    return Path(proc.stdout.strip() or "/var/lib/containers/storage")


def local_ref(name: str, version: str) -> str:
    return f"{LOCAL_REGISTRY}/{name}:{version}"


def base_key(packages: Sequence[str] = BASE_PACKAGES, suite: str = SUITE, mirror: str = MIRROR) -> str:
    """The base's cache key: what debootstrap is asked for (the host's CA bundle is copied on every pack)."""
    return hashlib.sha256(json.dumps([suite, mirror, sorted(packages)]).encode()).hexdigest()[:16]


def base_plan(state: Path, rootfs_ready: bool) -> list[Step]:
    """debootstrap (unless the cached rootfs is current), then the OCI layout and buildah's copy of it."""
    rootfs, layout, bundle, archive = state / "base" / "rootfs", state / "base" / "layout", state / "base" / "bundle", \
        state / "base" / "base.tar"
    steps: list[Step] = []
    if not rootfs_ready:
        steps += [
            Step("clean the old rootfs", ("rm", "-rf", str(rootfs))),
            Step(f"debootstrap {SUITE} minbase + {' '.join(BASE_PACKAGES)}",
                 ("debootstrap", "--variant=minbase", f"--include={','.join(BASE_PACKAGES)}", SUITE, str(rootfs),
                  MIRROR)),
            # Smaller, and pip may install: the Dockerfiles pip-install into the image as they do on python:slim.
            Step("trim apt caches, let pip install", ("sh", "-c",
                 f"rm -rf {rootfs}/var/cache/apt/archives/*.deb {rootfs}/var/lib/apt/lists/* "
                 f"{rootfs}/usr/lib/python3*/EXTERNALLY-MANAGED")),
        ]
    steps += [
        Step("trust this machine's CA bundle",
             ("cp", str(HOST_CA_BUNDLE), str(rootfs / "etc/ssl/certs/ca-certificates.crt"))),
        Step("fresh OCI layout", ("rm", "-rf", str(layout), str(bundle), str(archive))),
        Step("umoci init", ("umoci", "init", "--layout", str(layout))),
        Step("umoci new", ("umoci", "new", "--image", f"{layout}:{SUITE}")),
        Step("umoci unpack", ("umoci", "unpack", "--image", f"{layout}:{SUITE}", str(bundle))),
        Step("rootfs into the bundle", ("sh", "-c", f"rmdir {bundle}/rootfs && cp -a {rootfs} {bundle}/rootfs")),
        Step("umoci repack", ("umoci", "repack", "--image", f"{layout}:{SUITE}", str(bundle))),
        Step("umoci config", ("umoci", "config", "--image", f"{layout}:{SUITE}",
                              "--config.env", "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                              "--config.cmd", "python3")),
        Step("archive", ("tar", "-C", str(layout), "-cf", str(archive), ".")),
        # The pull names the image after the layout's tag too: both names go, or the old base stays stored.
        drop_stored(BASE_REF, f"localhost/{SUITE}:latest"),
        Step(f"buildah pull the base as {BASE_REF}", ("sh", "-c", f'id=$({" ".join(BUILDAH)} pull -q '
             f'oci-archive:{archive}) && {" ".join(BUILDAH)} tag "$id" {BASE_REF}')),
        Step("drop the bundle", ("rm", "-rf", str(bundle))),
    ]
    return steps


def agent_plan(state: Path, name: str, dockerfile: Path, version: str, root: Path = ROOT, ref: str | None = None,
               build_args: Mapping[str, str] | None = None) -> list[Step]:
    """buildah bud of one Dockerfile on the local base, pushed into ``<state>/oci/<name>.tar``; named ``ref``
    (a stand-in under the reference the stack names) or the local registry's ``<name>:<version>``."""
    ref = ref or local_ref(name, version)
    archive = state / "oci" / f"{name}.tar"
    rel = dockerfile.relative_to(root) if dockerfile.is_relative_to(root) else dockerfile
    extra = [w for k, v in sorted((build_args or {}).items()) for w in ("--build-arg", f"{k}={v}")]
    return [
        drop_stored(ref),
        Step(f"build {ref}", (*BUILDAH, "bud", "--isolation", "chroot", "--pull=false", "--layers=false",
                              "--build-arg", f"BASE={BASE_REF}", *extra, "-f", str(rel), "-t", ref, str(root))),
        Step(f"archive {ref}", ("rm", "-f", str(archive))),
        Step(f"push {ref} to {archive.name}", (*BUILDAH, "push", "-q", ref, f"oci-archive:{archive}:{ref}")),
        drop_stored(ref, strict=True),
    ]


def pause_plan(state: Path, pause_binary: Path, ref: str) -> list[Step]:
    """The pod sandbox image: our static pause binary alone, as its entrypoint."""
    layout, bundle, archive = state / "pause" / "layout", state / "pause" / "bundle", state / "oci" / "pause.tar"
    tag = ref.rsplit(":", 1)[1]
    return [
        Step("fresh OCI layout", ("rm", "-rf", str(layout), str(bundle), str(archive))),
        Step("umoci init", ("umoci", "init", "--layout", str(layout))),
        Step("umoci new", ("umoci", "new", "--image", f"{layout}:{tag}")),
        Step("umoci unpack", ("umoci", "unpack", "--image", f"{layout}:{tag}", str(bundle))),
        Step("the binary", ("install", "-m", "0755", str(pause_binary), str(bundle / "rootfs" / "pause"))),
        Step("umoci repack", ("umoci", "repack", "--image", f"{layout}:{tag}", str(bundle))),
        Step("umoci config", ("umoci", "config", "--image", f"{layout}:{tag}", "--config.entrypoint", "/pause",
                              "--config.user", "65535:65535")),
        # containerd names an imported image by the index's ref.name annotation: the full reference.
        Step("name it", (sys.executable, "-c", _RENAME, str(layout / "index.json"), tag, ref)),
        Step("archive", ("tar", "-C", str(layout), "-cf", str(archive), ".")),
        Step("drop the bundle", ("rm", "-rf", str(bundle))),
    ]


@dataclass(frozen=True)
class BinaryImage:
    """An upstream Go binary of the local cluster's build (tools/localcluster/build.sh) as the image the stack names.

    The image carries the binary at the path the upstream image has it (the stack's command or the image's
    entrypoint names it) on the local base: the binaries link the C library dynamically, which the base has.
    """

    #: The archive's name in ``.state/images/oci`` (and what the nodes import).
    name: str
    binary: Path
    #: The full reference the stack's pods name, so a node finds it without a pull.
    ref: str
    #: Where in the image the binary goes, and the entrypoint.
    path: str


def binary_plan(state: Path, image: BinaryImage) -> list[Step]:
    """``buildah from`` the local base, the binary copied in as the entrypoint, committed under the stack's name."""
    archive, work = state / "oci" / f"{image.name}.tar", f"gpucl-build-{image.name}"
    return [
        Step("drop a stale working container", ("sh", "-c", f"{' '.join(BUILDAH)} rm {work} >/dev/null 2>&1 || true")),
        drop_stored(image.ref),
        Step(f"working container from {BASE_REF}", (*BUILDAH, "from", "--pull=false", "--name", work, BASE_REF)),
        Step(f"copy {image.binary.name} to {image.path}",
             (*BUILDAH, "copy", "--chmod", "0755", work, str(image.binary), image.path)),
        Step("entrypoint and user", (*BUILDAH, "config", "--entrypoint", json.dumps([image.path]), "--cmd", "",
                                     "--user", "65532:65532", work)),
        Step(f"commit {image.ref}", (*BUILDAH, "commit", "-q", "--rm", work, image.ref)),
        Step(f"archive {image.ref}", ("rm", "-f", str(archive))),
        Step(f"push {image.ref} to {archive.name}", (*BUILDAH, "push", "-q", image.ref,
                                                     f"oci-archive:{archive}:{image.ref}")),
        drop_stored(image.ref, strict=True),
    ]


_RENAME = (
    "import json,sys;p,tag,ref=sys.argv[1:];d=json.load(open(p))\n"
    "for m in d['manifests']:\n"
    " a=m.setdefault('annotations',{})\n"
    " if a.get('org.opencontainers.image.ref.name')==tag: a['org.opencontainers.image.ref.name']=ref\n"
    "json.dump(d,open(p,'w'))"
)


def missing_tools(which: dict[str, str | None] | None = None) -> list[str]:
    """``tool (Debian package)`` for every tool a local build needs and this machine lacks."""
    found = which if which is not None else {t: shutil.which(t) for t in TOOLS}
    return [f"{t} (Debian package {p})" for t, p in TOOLS.items() if not found.get(t)]


def run(steps: Sequence[Step], log: Path) -> None:
    """Run each step, output to ``log``; the first failure raises with its command and the log's tail."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("a") as out:
        for step in steps:
            argv = list(step.argv)
            out.write(f"$ {' '.join(argv)}\n")
            out.flush()
            proc = subprocess.run(argv, stdout=subprocess.PIPE, stderr=out, text=True, check=False, cwd=ROOT)
            out.write(proc.stdout)
            if proc.returncode != 0:
                tail = "\n".join(log.read_text(errors="replace").splitlines()[-8:])
                raise RuntimeError(f"{step.what} failed (exit {proc.returncode}): {' '.join(argv)}\n{tail}")


def copied_files(dockerfile_text: str, root: Path = ROOT) -> list[Path]:
    """Every file of the build context the Dockerfile's ``COPY`` lines take (a directory with all it holds, bytecode
    caches left out); ``COPY --from`` copies from a stage, not the context. Pure but for reading the tree."""
    found: set[Path] = set()
    for line in dockerfile_text.splitlines():
        words = line.split()
        if not words or words[0].upper() not in ("COPY", "ADD"):
            continue
        args = [w for w in words[1:] if not w.startswith("--")]
        if any(w.startswith("--from") for w in words[1:]) or len(args) < 2:
            continue
        for source in args[:-1]:
            for path in root.glob(source.rstrip("/")) if source.strip("/") else [root]:
                candidates = path.rglob("*") if path.is_dir() else [path]
                found.update(p for p in candidates if p.is_file() and "__pycache__" not in p.parts)
    return sorted(found)


def context_key(dockerfile: Path, root: Path = ROOT, base: str = "") -> str:
    """The cache key of one image: its Dockerfile, every file it copies (:func:`copied_files`), and the base's key;
    a change anywhere else in the repository leaves the image as it is."""
    digest = hashlib.sha256(base.encode())
    for path in [dockerfile, *copied_files(dockerfile.read_text(encoding="utf-8"), root)]:
        digest.update(str(path.relative_to(root) if path.is_relative_to(root) else path).encode() + b"\0")
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def _rootfs_ready(state: Path) -> bool:
    stamp = state / "base" / "rootfs.key"
    return (state / "base" / "rootfs" / "usr" / "bin" / "python3").exists() and \
        stamp.exists() and stamp.read_text().strip() == base_key()


def build_all(agents: Sequence[DockerfileImage], version: str, pause_binary: Path, pause_ref: str,
              state: Path = STATE, binaries: Sequence[BinaryImage] = ()) -> dict[str, float]:
    """The base (cached), every agent image, the upstream binaries' images and the pause image; seconds per image,
    for the bench."""
    log = state / "build.log"
    log.unlink(missing_ok=True)
    (state / "oci").mkdir(parents=True, exist_ok=True)
    seconds: dict[str, float] = {}
    started = time.monotonic()
    ready = _rootfs_ready(state)
    image_key = base_key() + hashlib.sha256(HOST_CA_BUNDLE.read_bytes()).hexdigest()[:16]
    image_stamp = state / "base" / "image.key"
    stored = subprocess.run([*BUILDAH, "inspect", BASE_REF], capture_output=True, check=False).returncode == 0
    if not (ready and stored and image_stamp.exists() and image_stamp.read_text().strip() == image_key):
        run(base_plan(state, ready), log)
        (state / "base" / "rootfs.key").write_text(base_key())
        image_stamp.write_text(image_key)
        seconds["base" if not ready else "base (cached rootfs)"] = round(time.monotonic() - started, 1)
    for own in agents:
        started = time.monotonic()
        name, ref = own.name, own.ref or local_ref(own.name, version)
        salt = base_key() + version + ref + json.dumps(dict(own.build_args), sort_keys=True)
        key, stamp, archive = context_key(own.dockerfile, base=salt), state / "oci" / f"{name}.key", \
            state / "oci" / f"{name}.tar"
        if archive.exists() and stamp.exists() and stamp.read_text().strip() == key:
            print(f"images: {ref} up to date", flush=True)
            continue
        print(f"images: building {ref}", flush=True)
        run(agent_plan(state, name, own.dockerfile, version, ref=ref, build_args=own.build_args), log)
        stamp.write_text(key)
        seconds[name] = round(time.monotonic() - started, 1)
    for image in binaries:
        started = time.monotonic()
        digest = hashlib.sha256((base_key() + image.ref + image.path).encode())
        digest.update(image.binary.read_bytes())
        key, stamp, archive = digest.hexdigest()[:16], state / "oci" / f"{image.name}.key", \
            state / "oci" / f"{image.name}.tar"
        if archive.exists() and stamp.exists() and stamp.read_text().strip() == key:
            print(f"images: {image.ref} up to date", flush=True)
            continue
        print(f"images: building {image.ref} from {image.binary}", flush=True)
        run(binary_plan(state, image), log)
        stamp.write_text(key)
        seconds[image.name] = round(time.monotonic() - started, 1)
    started = time.monotonic()
    pause_key, pause_stamp = hashlib.sha256(pause_binary.read_bytes()).hexdigest()[:16], state / "oci" / "pause.key"
    if not ((state / "oci" / "pause.tar").exists() and pause_stamp.exists()
            and pause_stamp.read_text().strip() == pause_key):
        run(pause_plan(state, pause_binary, pause_ref), log)
        pause_stamp.write_text(pause_key)
        seconds["pause"] = round(time.monotonic() - started, 1)
    # Each image keeps the seconds of its last build: a warm run that rebuilt nothing leaves the figures as they were.
    figures = state / "oci" / "build-seconds.json"
    kept = json.loads(figures.read_text()) if figures.exists() else {}
    figures.write_text(json.dumps({**kept, **seconds}, indent=2, sort_keys=True))
    return seconds


def main(agents: Sequence[DockerfileImage], version: str, pause_binary: Path, pause_ref: str,
         binaries: Sequence[BinaryImage] = ()) -> int:
    missing = missing_tools()
    if missing:
        print(f"images: a local build needs {', '.join(missing)}; `make images` installs them with apt",
              file=sys.stderr)
        return 3
    if os.geteuid() != 0:
        print("images: a local build runs debootstrap and buildah's chroot isolation, which need root",
              file=sys.stderr)
        return 3
    unbuilt = [str(b) for b in (pause_binary, *(i.binary for i in binaries)) if not b.exists()]
    if unbuilt:
        print(f"images: {', '.join(unbuilt)} not there; run `make localcluster` (the Go builds)", file=sys.stderr)
        return 3
    root = storage_root()
    existing = next(p for p in (root, *root.parents) if p.exists())
    short = space_problem(shutil.disk_usage(existing).free, root)
    if short:
        print(f"images: {short}", file=sys.stderr)
        return 1
    try:
        seconds = build_all(agents, version, pause_binary, pause_ref, binaries=binaries)
    except RuntimeError as err:
        print(f"images: {err}", file=sys.stderr)
        return 1
    if seconds:
        print("images: built " + ", ".join(f"{k} {v}s" for k, v in seconds.items()) + f" into {STATE / 'oci'}")
    else:
        print(f"images: every image up to date in {STATE / 'oci'}")
    return 0
