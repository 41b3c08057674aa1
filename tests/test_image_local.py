"""Images without a registry: the plans `make images` runs (buildah on a Python base built here), pure."""

from __future__ import annotations

from pathlib import Path

from components.mockrt import RunResult
from tools import image_local
from tools import images as tool
from tools.localcluster.realnodes import IMAGES_BY_KIND

STATE = Path("/s")


def _argv(steps: list[image_local.Step]) -> list[str]:
    return [" ".join(s.argv) for s in steps]


def test_each_agent_builds_from_its_own_dockerfile_on_the_local_base_daemonless() -> None:
    for agent in [*tool.agents(), *tool.workloads()]:
        steps = image_local.agent_plan(STATE, agent.name, agent.dockerfile, "0.1.0")
        build = next(s.argv for s in steps if "bud" in s.argv)
        assert build[:5] == ("buildah", "--storage-driver", "vfs", "bud", "--isolation")
        assert "chroot" in build and "--pull=false" in build
        assert f"BASE={image_local.BASE_REF}" in build
        assert str(agent.dockerfile.relative_to(tool.ROOT)) in build
        ref = f"docker.io/local/{agent.name}:0.1.0"
        assert build[build.index("-t") + 1] == ref
        # The archive the real nodes import names the image by its full reference.
        assert any(s.argv[-1] == f"oci-archive:{STATE}/oci/{agent.name}.tar:{ref}" for s in steps)


def test_no_build_leaves_an_image_in_buildahs_storage() -> None:
    """Each image leaves the store once archived, and a leftover of an earlier build goes before the next: a rebuild
    only moves the tag, and vfs keeps every untagged copy whole (33 GiB of them filled a build machine's disk)."""
    agent = tool.agents()[0]
    ref = f"docker.io/local/{agent.name}:0.1.0"
    binary = tool.binary_images(Path("/b"))[0]
    for steps, name in ((image_local.agent_plan(STATE, agent.name, agent.dockerfile, "0.1.0"), ref),
                        (image_local.binary_plan(STATE, binary), binary.ref)):
        argv = _argv(steps)
        build = next(i for i, a in enumerate(argv) if " bud " in a or " commit " in a)
        push = next(i for i, a in enumerate(argv) if " push " in a)
        sweeps = [i for i, a in enumerate(argv) if f"rmi -f {name} " in a and a.endswith("|| true")]
        assert sweeps and sweeps[0] < build, argv
        # After the push, and strict: an image that is not there then is a failed build, not a leftover.
        assert argv[push + 1] == f"buildah --storage-driver vfs rmi {name}", argv
    base = _argv(image_local.base_plan(STATE, rootfs_ready=True))
    pull = next(i for i, a in enumerate(base) if " pull " in a)
    assert any(f"rmi -f {image_local.BASE_REF} localhost/bookworm:latest" in a for a in base[:pull])


def test_a_build_that_would_fill_the_disk_is_refused_with_where_and_how_much() -> None:
    gib = 1024**3
    where = Path("/var/lib/containers/storage")
    assert image_local.space_problem(4 * gib, where) is None
    assert image_local.space_problem(image_local.BUILD_SPACE_BYTES, where) is None
    line = image_local.space_problem(int(1.5 * gib), where)
    assert line is not None
    assert line.startswith("1.5 GiB free under /var/lib/containers/storage; a local build needs 3.0 GiB there")
    assert "rmi --prune" in line


def test_every_dockerfile_takes_its_base_as_a_build_argument() -> None:
    for agent in [*tool.agents(), *tool.workloads()]:
        text = agent.dockerfile.read_text()
        assert "ARG BASE=" in text and "FROM ${BASE}" in text, agent.dockerfile


def test_the_base_is_debootstrapped_once_and_trusts_this_machines_ca_bundle() -> None:
    cold = _argv(image_local.base_plan(STATE, rootfs_ready=False))
    warm = _argv(image_local.base_plan(STATE, rootfs_ready=True))
    assert any(a.startswith("debootstrap --variant=minbase --include=python3,python3-pip") for a in cold)
    assert not any(a.startswith("debootstrap") for a in warm)
    for plan in (cold, warm):
        assert f"cp {image_local.HOST_CA_BUNDLE} {STATE}/base/rootfs/etc/ssl/certs/ca-certificates.crt" in plan
        assert any(image_local.BASE_REF in a and "pull" in a for a in plan)
    # pip may install into the image, as it does on the upstream python:slim base.
    assert any("EXTERNALLY-MANAGED" in a for a in cold)


def test_the_pause_image_is_our_binary_alone_named_by_its_full_reference() -> None:
    steps = _argv(image_local.pause_plan(STATE, Path("/bin/pause"), image_local.PAUSE_IMAGE))
    assert f"install -m 0755 /bin/pause {STATE}/pause/bundle/rootfs/pause" in steps
    assert any("--config.entrypoint /pause" in a and "--config.user 65535:65535" in a for a in steps)
    assert any(a.endswith(f"3.10 {image_local.PAUSE_IMAGE}") for a in steps)


def test_the_upstream_binaries_become_the_images_the_local_stack_names(local: RunResult) -> None:
    """virtual-kubelet and the descheduler as the stack's pods run them: the exact reference (found on the node
    without a pull), the binary where the stack's command or the image's entrypoint expects it."""
    built = {i.name: i for i in tool.binary_images(Path("/b"))}
    assert set(built) == {"virtual-kubelet-mock", "descheduler", "prometheus-server", "prometheus-operator",
                          "prometheus-config-reloader"}
    assert set(built) <= set(IMAGES_BY_KIND["system"])  # all run on the system pool
    # The real pods' Prometheus is the local build of the pinned module, under the reference its Prometheus resource
    # names.
    assert built["prometheus-server"].binary == Path("/b/prometheus")
    assert built["prometheus-server"].ref == image_local.PROMETHEUS_IMAGE
    provider = local.one("Deployment", "vk-local-cloud").inputs["spec"]["template"]["spec"]["containers"][0]
    assert provider["image"] == built["virtual-kubelet-mock"].ref and "command" not in provider
    job = local.one("CronJob", "descheduler").inputs["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    (container,) = job["containers"]
    assert container["image"] == built["descheduler"].ref
    assert container["command"] == [built["descheduler"].path]
    steps = _argv(image_local.binary_plan(STATE, built["virtual-kubelet-mock"]))
    assert any(a.startswith("buildah --storage-driver vfs from --pull=false") and image_local.BASE_REF in a
               for a in steps)
    assert any(a.endswith("/b/virtual-kubelet /usr/bin/virtual-kubelet") and "copy --chmod 0755" in a for a in steps)
    assert any('--entrypoint ["/usr/bin/virtual-kubelet"]' in a and "--user 65532:65532" in a for a in steps)
    assert any(a.endswith(f"oci-archive:{STATE}/oci/virtual-kubelet-mock.tar:{built['virtual-kubelet-mock'].ref}")
               for a in steps)


def test_an_image_is_rebuilt_only_when_what_it_copies_changes(tmp_path: Path) -> None:
    (tmp_path / "agents" / "a").mkdir(parents=True)
    dockerfile = tmp_path / "agents" / "a" / "Dockerfile"
    dockerfile.write_text("ARG BASE=x\nFROM ${BASE}\nCOPY pyproject.toml ./\nCOPY agents/a agents/a\n"
                          "COPY --from=build /bin/x /x\nRUN true\n")
    (tmp_path / "agents" / "a" / "m.py").write_text("x = 1\n")
    (tmp_path / "agents" / "a" / "__pycache__").mkdir()
    (tmp_path / "agents" / "a" / "__pycache__" / "m.pyc").write_bytes(b"\0")
    (tmp_path / "agents" / "b.py").write_text("y = 1\n")
    (tmp_path / "pyproject.toml").write_text("[project]\n")
    assert image_local.copied_files(dockerfile.read_text(), tmp_path) == [
        tmp_path / "agents" / "a" / "Dockerfile", tmp_path / "agents" / "a" / "m.py", tmp_path / "pyproject.toml"]
    first = image_local.context_key(dockerfile, tmp_path, "base1")
    assert image_local.context_key(dockerfile, tmp_path, "base1") == first
    (tmp_path / "agents" / "b.py").write_text("y = 2\n")  # not copied: the image stays
    assert image_local.context_key(dockerfile, tmp_path, "base1") == first
    (tmp_path / "agents" / "a" / "m.py").write_text("x = 2\n")
    second = image_local.context_key(dockerfile, tmp_path, "base1")
    assert second != first
    assert image_local.context_key(dockerfile, tmp_path, "base2") != second  # a new base rebuilds everything


def test_every_file_an_image_of_ours_copies_is_in_its_key() -> None:
    """Each Dockerfile's COPY sources exist: a renamed module would otherwise drop out of the key silently."""
    for image in [*tool.agents(), *tool.workloads(), *tool.standins()]:
        text = image.dockerfile.read_text()
        for line in text.splitlines():
            if line.startswith("COPY") and "--from" not in line:
                for source in line.split()[1:-1]:
                    assert list(tool.ROOT.glob(source.rstrip("/"))), f"{image.dockerfile}: {source} matches nothing"
        copied = image_local.copied_files(text, tool.ROOT)
        assert tool.ROOT / "pyproject.toml" in copied or "standin" in image.dockerfile.name, image.dockerfile
        assert all(p.is_file() for p in copied) and len(copied) >= 3, image.dockerfile


def test_missing_tools_are_named_with_their_debian_package() -> None:
    assert image_local.missing_tools({"debootstrap": "/usr/sbin/debootstrap", "umoci": None, "buildah": None}) == [
        "umoci (Debian package umoci)", "buildah (Debian package buildah)"]
    assert image_local.missing_tools(dict.fromkeys(image_local.TOOLS, "/x")) == []
