"""The agents' images: bases pinned by digest, `make images` with whatever container builder this machine has
(and a clear message when it has none), and the digests CI pushes recorded in the table the stack deploys from."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from components import images
from components.mockrt import ROOT
from tools import images as tool

DIGEST = "sha256:" + "ab" * 32


def test_the_repository_pins_every_base_and_lists_every_agent() -> None:
    found = tool.agents()
    assert [a.name for a in found] == ["burst-controller", "checkpoint-check", "health-guard", "ib-exporter",
                                       "node-pools"]
    assert tool.check(found, images.agent_digests(), tool.workloads()) == []


def test_a_workload_image_needs_a_pinned_base_but_no_digest_entry(tmp_path: Path) -> None:
    (tmp_path / "training_runtime").mkdir()
    (tmp_path / "training_runtime" / "Dockerfile").write_text("ARG BASE=python:3.11-slim\nFROM ${BASE}\n")
    (trainer,) = tool.workloads(tmp_path)
    assert trainer.name == "training-runtime"
    problems = tool.check([], {}, [trainer])
    assert problems == [f"{trainer.dockerfile}: base image python:3.11-slim is not pinned by digest "
                        "(name:tag@sha256:<64 hex>)"]


def write_agent(root: Path, name: str, dockerfile: str) -> None:
    (root / name).mkdir(parents=True)
    (root / name / "Dockerfile").write_text(dockerfile)


def test_an_unpinned_base_and_a_missing_or_stray_table_entry_are_named(tmp_path: Path) -> None:
    write_agent(tmp_path, "fast_agent", "ARG BASE=python:3.11-slim\nFROM ${BASE}\nRUN true\n")
    write_agent(tmp_path, "staged", f"FROM --platform=$BUILDPLATFORM golang:1.26@{DIGEST} AS build\n"
                                    "FROM build\nFROM gcr.io/distroless/static:nonroot\n")
    problems = tool.check(tool.agents(tmp_path), {"fast-agent": None, "retired": None})
    assert any("fast_agent/Dockerfile: base image python:3.11-slim is not pinned by digest" in p for p in problems)
    assert any("base image gcr.io/distroless/static:nonroot is not pinned" in p for p in problems)
    assert not any("golang" in p or "base image build " in p for p in problems)
    assert any("no entry for agent staged" in p for p in problems)
    assert any("retired has no agents/*/Dockerfile" in p for p in problems)


@pytest.mark.parametrize(
    ("text", "bases"),
    [
        ("FROM a:1@sha256:x\n", ["a:1@sha256:x"]),
        ("from --platform=linux/amd64 a:1 as builder\nFROM builder\nFROM b:2\n", ["a:1", "b:2"]),
        ("# FROM commented:1\nRUN echo FROM x\n", []),
        # A base given as a build argument is judged by its default (what a build without arguments pulls).
        ("ARG BASE=a:1@sha256:x\nFROM ${BASE}\n", ["a:1@sha256:x"]),
        ("ARG BASE=a:1\nFROM $BASE AS b\nFROM b\n", ["a:1"]),
        ("FROM ${UNSET}\n", ["${UNSET}"]),
    ],
)
def test_base_images_read_from_the_from_lines(text: str, bases: list[str]) -> None:
    assert tool.base_images(text) == bases


def tool_bin(tmp_path: Path, fakes: dict[str, str]) -> dict[str, str]:
    """A PATH with make, bash and python3 and the given fake commands only (no real container builder)."""
    folder = tmp_path / "bin"
    folder.mkdir()
    for name in ("make", "bash", "env"):
        real = shutil.which(name)
        assert real, name
        (folder / name).symlink_to(real)
    (folder / "python3").symlink_to(sys.executable)
    for name, body in fakes.items():
        script = folder / name
        script.write_text("#!" + str(folder / "bash") + "\n" + body)
        script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return {**os.environ, "PATH": str(folder)}


def test_make_images_upstream_says_so_when_no_builder_can_run(tmp_path: Path) -> None:
    proc = subprocess.run(["make", "-s", "images-upstream"], cwd=ROOT, env=tool_bin(tmp_path, {}), capture_output=True,
                          text=True, timeout=120, check=False)
    assert proc.returncode != 0
    assert "images: no container builder can run here (looked for docker, podman and buildah)" in proc.stderr
    assert "the agents' images are not built" in proc.stderr


def test_a_docker_without_its_daemon_is_named(tmp_path: Path) -> None:
    refusal = 'echo "Cannot connect to the Docker daemon at unix:///var/run/docker.sock" >&2\nexit 1\n'
    env = tool_bin(tmp_path, {"docker": refusal})
    proc = subprocess.run([sys.executable, "-m", "tools.images", "build"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120, check=False)
    assert proc.returncode == 3
    assert "docker (" in proc.stderr and "cannot build here: Cannot connect to the Docker daemon" in proc.stderr


def test_make_images_upstream_builds_each_agent_with_the_builder_found(tmp_path: Path) -> None:
    log = tmp_path / "podman.log"
    env = tool_bin(tmp_path, {"podman": f'[ "$1" = info ] && exit 0\necho "$@" >> {log}\n'})
    proc = subprocess.run(["make", "-s", "images-upstream"], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    assert log.read_text().splitlines() == [
        f"build -f agents/{a.dockerfile.parent.name}/Dockerfile -t {images.AGENT_REGISTRY}/{a.name}:"
        f"{images.AGENT_VERSION} ." for a in tool.agents()]
    assert "images: building 5 agent images with" in proc.stdout


def test_pushed_digests_are_recorded_and_deployed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    table = tmp_path / "agent_digests.json"
    shutil.copy(images.AGENT_DIGESTS_FILE, table)
    monkeypatch.setattr(images, "AGENT_DIGESTS_FILE", table)
    metadata = tmp_path / "metadata"
    metadata.mkdir()
    (metadata / "health-guard.json").write_text(json.dumps({"containerimage.digest": DIGEST, "image.name": "x"}))
    written = tool.record(tool.digests_from_metadata(metadata, [a.name for a in tool.agents()]))
    assert written["health-guard"] == DIGEST and written["ib-exporter"] is None
    assert json.loads(table.read_text()) == written
    assert images.agent_image("health-guard") == f"{images.AGENT_REGISTRY}/health-guard:{images.AGENT_VERSION}@{DIGEST}"
    assert images.agent_image("ib-exporter") == f"{images.AGENT_REGISTRY}/ib-exporter:{images.AGENT_VERSION}"


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("health-guard.json", {"containerimage.digest": "sha256:short"}, "not sha256:<64 hex>"),
        ("health-guard.json", {}, "containerimage.digest is None"),
        ("web-ui.json", {"containerimage.digest": DIGEST}, "web-ui is no agent"),
    ],
)
def test_bad_metadata_is_refused_with_its_file(tmp_path: Path, name: str, content: dict[str, str],
                                               message: str) -> None:
    (tmp_path / name).write_text(json.dumps(content))
    with pytest.raises(ValueError, match=message):
        tool.digests_from_metadata(tmp_path, ["health-guard"])


def test_a_malformed_digest_table_is_named(tmp_path: Path) -> None:
    bad = tmp_path / "agent_digests.json"
    bad.write_text('{"health-guard": "latest"}')
    with pytest.raises(ValueError, match=r"agent_digests.json: expected \{agent name"):
        images.agent_digests(bad)


def test_the_images_workflow_checks_pushes_records_and_proposes() -> None:
    workflow = yaml.safe_load((ROOT / ".github" / "workflows" / "agent-images.yml").read_text())
    runs = [str(step.get("run", "")) for step in workflow["jobs"]["images"]["steps"]]
    order = ["tools.images check", "docker login", "tools.images push", "tools.images record", "gh pr create"]
    positions = [next(i for i, run in enumerate(runs) if needle in run) for needle in order]
    assert positions == sorted(positions)
    login = next(s for s in workflow["jobs"]["images"]["steps"] if "docker login" in str(s.get("run", "")))
    assert login["env"] == {"REGISTRY_USERNAME": "${{ secrets.AGENT_REGISTRY_USERNAME }}",
                            "REGISTRY_PASSWORD": "${{ secrets.AGENT_REGISTRY_PASSWORD }}"}


def test_a_stack_pulls_agent_images_from_its_own_registry() -> None:
    """The digest table names the images CI pushed to the default registry; another registry gets the tag."""
    local = images.agent_image("health-guard", "docker.io/local")
    assert local == f"docker.io/local/health-guard:{images.AGENT_VERSION}"
    assert images.agent_image("health-guard").startswith(f"{images.AGENT_REGISTRY}/health-guard:")


def _copied(dockerfile: Path) -> list[Path]:
    """The repository paths a Dockerfile's COPY lines bring into the image (sources only; --from copies skipped)."""
    out: list[Path] = []
    for line in dockerfile.read_text().splitlines():
        words = line.split()
        if not words or words[0].upper() != "COPY" or any(w.startswith("--from") for w in words):
            continue
        out += [ROOT / w for w in words[1:-1] if not w.startswith("--")]
    return out


def _closure(entries: list[str], packages: tuple[str, ...]) -> set[Path]:
    """The files of every first-party module the entry modules import at run time, transitively."""
    from tests.test_import_rules import runtime_imports

    def file_of(module: str) -> Path | None:
        base = ROOT.joinpath(*module.split("."))
        for candidate in (base.with_suffix(".py"), base / "__init__.py"):
            if candidate.is_file():
                return candidate
        return None

    seen: set[Path] = set()
    todo = list(entries)
    while todo:
        module = todo.pop()
        path = file_of(module)
        if path is None or path in seen:
            continue
        seen.add(path)
        parts = module.split(".")
        todo += [".".join(parts[:i]) for i in range(1, len(parts))]  # the packages' __init__ run too
        for imported, name in runtime_imports(path):
            if imported.split(".")[0] in packages:
                todo.append(imported)
                if name:
                    todo.append(f"{imported}.{name}")
    return seen


@pytest.mark.parametrize(("dockerfile", "entries"), [
    ("agents/burst_controller/Dockerfile", ["agents.burst_controller.cli", "agents.serving_cert"]),
    ("agents/health_guard/Dockerfile", ["agents.health_guard.cli"]),
    ("agents/node_pools/Dockerfile", ["agents.node_pools.cli"]),
    ("agents/ib_exporter/Dockerfile", ["agents.ib_exporter.cli"]),
    ("agents/checkpoint_check/Dockerfile", ["agents.checkpoint_check.cli"]),
    ("training_runtime/Dockerfile", ["training_runtime.supervisor", "training_runtime.examples.tiny_trainer",
                                     "training_runtime.gang"]),
])
def test_every_image_carries_what_its_entry_points_import(dockerfile: str, entries: list[str]) -> None:
    """An image that copies its modules one by one must copy every module its entry points import: a module left
    out crash-loops the agent's pods with ModuleNotFoundError, which no test outside a real node would see."""
    copied = _copied(ROOT / dockerfile)
    needed = _closure(entries, ("agents", "training_runtime"))
    missing = sorted(str(p.relative_to(ROOT)) for p in needed
                     if not any(p == c or c in p.parents for c in copied))
    assert missing == [], f"{dockerfile} does not copy {missing}"
