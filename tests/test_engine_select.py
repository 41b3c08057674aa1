"""Which engine `make preview` / `make up` run: the user's own `pulumi` at or above the SDK's version, else the
project's build; ENGINE=built|path chooses. The decision as a table, then a fake `pulumi` on PATH end to end."""

from __future__ import annotations

import contextlib
import importlib.metadata
import json
import os
import re
import stat
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from packaging.version import Version

from components.mockrt import ROOT
from tools import engine_runner as er
from tools import preview
from tools.engine_select import (
    EngineSelectionError,
    choose_engine,
    find_cli,
    parse_cli_version,
    sdk_version,
    select_engine,
)

SDK = Version("3.272.0")
CLI = Path("/opt/pulumi/bin/pulumi")


@pytest.mark.parametrize(
    ("requested", "found", "version", "kind", "reason"),
    [
        (None, None, None, "built", "no `pulumi` on PATH"),
        ("", None, None, "built", "no `pulumi` on PATH"),
        ("auto", CLI, Version("3.190.0"), "built", "older than the Python SDK's 3.272.0"),
        (None, CLI, None, "built", "printed no version"),
        (None, CLI, Version("3.272.0"), "path", ">= the SDK's 3.272.0"),
        (None, CLI, Version("3.300.1"), "path", ">= the SDK's 3.272.0"),
        (None, CLI, Version("3.272.0.dev0"), "path", ">= the SDK's 3.272.0"),
        (None, CLI, Version("3.271.9"), "built", "older"),
        ("built", CLI, Version("3.300.0"), "built", "ENGINE=built"),
        ("BUILT", None, None, "built", "ENGINE=built"),
        ("path", CLI, Version("3.300.0"), "path", "ENGINE=path"),
    ],
)
def test_the_engine_chosen(requested: str | None, found: Path | None, version: Version | None, kind: str,
                           reason: str) -> None:
    choice = choose_engine(requested, found, version, SDK)
    assert choice.kind == kind
    assert reason in choice.reason
    assert choice.cli == (found if kind == "path" else None)
    expected = "engine: your pulumi" if kind == "path" else "engine: the project's offline build"
    assert choice.describe().startswith(expected)


@pytest.mark.parametrize(
    ("requested", "found", "version", "message"),
    [
        ("path", None, None, "ENGINE=path, but there is no `pulumi` on PATH"),
        ("path", CLI, Version("3.100.0"), "ENGINE=path, but your pulumi 3.100.0 .* is older than the Python SDK's"),
        ("path", CLI, None, "ENGINE=path, but .* printed no version"),
        ("cloud", None, None, "ENGINE='cloud': expected one of auto, path, built"),
    ],
)
def test_what_cannot_be_given_is_refused(requested: str, found: Path | None, version: Version | None,
                                         message: str) -> None:
    with pytest.raises(EngineSelectionError, match=message):
        choose_engine(requested, found, version, SDK)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("v3.190.0\n", "3.190.0"),
        ("v3.191.0-alpha.x1234abc\n", "3.191.0"),
        ("3.272.0", "3.272.0"),
        ("warning: a newer version is available\nv3.272.1\n", "3.272.1"),
        ("", None),
        ("pulumi: command failed", None),
    ],
)
def test_cli_version_parsed(text: str, expected: str | None) -> None:
    parsed = parse_cli_version(text)
    assert (parsed.base_version if parsed else None) == expected


@given(st.text(max_size=80))
def test_any_version_output_parses_or_is_none(text: str) -> None:
    parsed = parse_cli_version(text)
    assert parsed is None or isinstance(parsed, Version)


def test_the_sdk_version_is_the_installed_pin() -> None:
    pinned = sdk_version((ROOT / "requirements.txt").read_text(encoding="utf-8"))
    assert pinned == Version(importlib.metadata.version("pulumi"))
    with pytest.raises(EngineSelectionError, match=r"no exact `pulumi==<version>` pin"):
        sdk_version("pulumi>=3\npulumi_kubernetes==4.34.2\n")


def fake_pulumi(folder: Path, version: str) -> Path:
    """A `pulumi` that reports ``version`` and logs every other call (argv and the env it saw) as JSON lines."""
    folder.mkdir(parents=True, exist_ok=True)
    script = folder / "pulumi"
    log = folder / "calls.jsonl"
    script.write_text(f"""#!/usr/bin/env bash
if [ "$1" = version ]; then echo "v{version}"; exit 0; fi
python3 -c 'import json, os, sys; print(json.dumps({{"argv": sys.argv[1:], "cwd": os.getcwd(),
  "home": os.environ.get("PULUMI_HOME"), "backend": os.environ.get("PULUMI_BACKEND_URL"),
  "kubeconfig": os.environ.get("KUBECONFIG")}}))' "$@" >> {log}
if [ "$1" = stack ] && [ "$2" = ls ]; then echo '[]'; fi
if [ "$1" = preview ]; then echo "Previewing update (fake)"; fi
exit 0
""")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script


def calls(folder: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (folder / "calls.jsonl").read_text().splitlines()]


def test_a_newer_pulumi_on_path_is_chosen_an_older_one_is_not(tmp_path: Path) -> None:
    newer = fake_pulumi(tmp_path / "newer", "3.400.0")
    older = fake_pulumi(tmp_path / "older", "3.100.0")
    path = os.pathsep.join([str(newer.parent), os.environ["PATH"]])
    choice = select_engine({"PATH": path})
    assert (choice.kind, choice.cli, choice.version) == ("path", newer, Version("3.400.0"))
    assert select_engine({"PATH": str(older.parent)}).kind == "built"
    assert select_engine({"PATH": path, "ENGINE": "built"}).kind == "built"
    with pytest.raises(EngineSelectionError, match="is older"):
        select_engine({"PATH": str(older.parent), "ENGINE": "path"})


def test_the_projects_own_clis_never_count_as_yours(tmp_path: Path) -> None:
    assert find_cli(os.pathsep.join([str(ROOT / "tools"), str(ROOT / ".state" / "engine" / "bin")])) is None
    mine = fake_pulumi(tmp_path / "mine", "3.400.0")
    assert find_cli(os.pathsep.join([str(ROOT / "tools"), str(mine.parent)])) == mine


def test_preview_runs_your_pulumi_with_your_backend_and_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    cli = fake_pulumi(tmp_path / "bin", "3.400.0")
    monkeypatch.setenv("PATH", os.pathsep.join([str(cli.parent), os.environ["PATH"]]))
    monkeypatch.delenv("ENGINE", raising=False)
    monkeypatch.delenv("PULUMI_HOME", raising=False)
    monkeypatch.delenv("PULUMI_BACKEND_URL", raising=False)
    monkeypatch.setattr(er, "OWN_CONFIG_COPIES", tmp_path / "copies")
    assert preview.main(["--stack", "local", "--diff-file", str(tmp_path / "local.diff")]) == 0
    out = capsys.readouterr().out
    assert "Previewing update (fake)" in out
    assert "Previewing update (fake)" in (tmp_path / "local.diff").read_text()
    assert out.rstrip().splitlines()[-1].startswith(f"engine: your pulumi 3.400.0 ({cli})")
    made = calls(cli.parent)
    run = next(c for c in made if c["argv"][0] == "preview")
    argv = run["argv"]
    assert isinstance(argv, list)
    assert argv[:5] == ["preview", "--diff", "--stack", "local", "--non-interactive"]
    assert argv[argv.index("--policy-pack") + 1] == str(ROOT / "policies")
    # The shipped placeholders are replaced in a copy; the stack is created with your backend's provider.
    assert argv[argv.index("--config-file") + 1] == str(tmp_path / "copies" / "Pulumi.local.yaml")
    init = next(c for c in made if c["argv"][:2] == ["stack", "init"])
    assert "--secrets-provider" not in init["argv"]
    assert any(c["argv"][:3] == ["config", "set", "--secret"] for c in made)
    # Your backend, login and kubeconfig: nothing points the CLI at the project's offline state.
    for call in made:
        assert call["home"] is None and call["backend"] is None
        assert "no-cluster" not in str(call["kubeconfig"])


def test_preview_with_engine_path_and_no_pulumi_fails_before_anything_runs(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    monkeypatch.setenv("ENGINE", "path")
    assert preview.main(["--stack", "local"]) == 2
    assert "ENGINE=path, but there is no `pulumi` on PATH" in capsys.readouterr().out


def test_your_own_stack_file_is_used_as_is_once_it_holds_your_secrets() -> None:
    shipped = (ROOT / "Pulumi.local.yaml").read_text(encoding="utf-8")
    assert er.has_placeholder_secrets(shipped)
    half = shipped.replace("v1:bG9jYWw=:placeholder", "v1:c2FsdA==:AAAAsomeRealCiphertext")
    assert er.has_placeholder_secrets(half)  # one provider's token still the shipped placeholder
    yours = half.replace("v1:YmFja3Vw:placeholder", "v1:c2FsdA==:AAAAanotherCiphertext")
    assert not er.has_placeholder_secrets(yours)


def test_make_up_deploys_with_your_pulumi_against_the_local_cluster(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tools.localcluster import stackup
    from tools.localcluster.plan import Layout

    cli = fake_pulumi(tmp_path / "bin", "3.400.0")
    monkeypatch.delenv("PULUMI_BACKEND_URL", raising=False)
    monkeypatch.setattr(er, "OWN_CONFIG_COPIES", tmp_path / "copies")
    lay = Layout(tmp_path / "state")
    # Whatever pulumi_up runs beside the CLI against a live cluster is out of this test's scope: no cluster here.
    beside = getattr(stackup, "virtual_kubelet", None)
    if beside is not None:
        monkeypatch.setattr(beside, "running_during", lambda *_a, **_k: contextlib.nullcontext())
    stackup.pulumi_up(lay, "local", cli=cli)
    up = next(c for c in calls(cli.parent) if c["argv"][0] == "up")
    assert up["argv"] == ["up", "--yes", "--skip-preview", "--refresh", "--stack", "local", "--config-file",
                          str(tmp_path / "copies" / "Pulumi.local.yaml"), "--non-interactive"]
    assert up["kubeconfig"] == str(lay.kubeconfig)
    assert up["home"] is None and up["backend"] is None


@pytest.mark.skipif(not er.engine_available(), reason=f"real engine unavailable: {er.build_failure_reason()}")
def test_your_own_cli_previews_for_real_with_its_own_backend(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The project's built CLI stands in for a user's: its own PULUMI_HOME (with the providers installed) and
    a file backend of its own, no wrapper; the stack is created with the backend's default secrets provider."""
    built = er.ENGINE_DIR / "bin" / "pulumi"
    home = er.PULUMI_STATE / "home"
    assert er.pulumi(["version"]).returncode == 0  # the wrapper installs the providers into that home once
    backend = tmp_path / "backend"
    backend.mkdir()
    monkeypatch.setenv("PULUMI_HOME", str(home))
    monkeypatch.setenv("PULUMI_CONFIG_PASSPHRASE", "yours")
    monkeypatch.setenv("PULUMI_SKIP_UPDATE_CHECK", "true")
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "no-cluster.kubeconfig"))
    monkeypatch.setenv("PATH", os.pathsep.join([str(built.parent), str(er.ENGINE_DIR / "ambient"),
                                                str(ROOT / ".venv" / "bin"), os.environ["PATH"]]))
    proc = er.real_preview("local", policy_pack=True, backend_url=f"file://{backend}", cli=built)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    assert re.search(r"Resources:\n\s+\+ \d+ to create", proc.stdout), proc.stdout[-2000:]
    assert "Policy Packs run:" in proc.stdout and "gpu-cluster-policies" in proc.stdout
    copy = backend / "own-config" / "Pulumi.local.yaml"
    assert "encryptionsalt" in copy.read_text(), "the stack was created with the backend's passphrase provider"
    assert (backend / ".pulumi" / "stacks").is_dir()


def test_a_streamed_preview_hands_over_each_line_and_stops_a_hung_engine(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The engine's lines reach the sink as they come; one that hangs past the limit is killed with its
    children (they hold the pipe), and the sink hears why."""
    cli = fake_pulumi(tmp_path / "bin", "3.400.0")
    script = cli.read_text().replace('if [ "$1" = preview ]; then echo "Previewing update (fake)"; fi',
                                     'if [ "$1" = preview ]; then echo "Previewing update (fake)"; sleep 30 & wait; fi')
    cli.write_text(script)
    monkeypatch.setattr(er, "OWN_CONFIG_COPIES", tmp_path / "copies")
    heard: list[str] = []
    started = time.monotonic()
    assert er.streamed_preview("local", heard.append, cli=cli, timeout_s=2) == 124
    assert time.monotonic() - started < 20
    assert heard == ["Previewing update (fake)", "preview: the engine ran past 2 s and was stopped"]
