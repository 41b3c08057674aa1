"""Drive the real Pulumi engine (built from Go modules by ``make engine``) offline.

The mock runtime shows what the program declares; only the real engine shows that
``pulumi preview`` and ``pulumi up`` accept it. Everything here goes through
``tools/pulumi``, which points the CLI at a file backend under ``.state/pulumi``,
uses a passphrase for local stacks and never downloads plugins.

Stack configuration is read from ``Pulumi.<stack>.yaml`` but never written back:
the engine gets a copy under ``.state/pulumi/config`` (via ``--config-file``), so
the passphrase salt and render settings it adds stay out of the committed file.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from components.config.base import PROJECT
from components.config.loading import credential_refs

ROOT = Path(__file__).resolve().parent.parent
WRAPPER = ROOT / "tools" / "pulumi"
BUILD_SCRIPT = ROOT / "tools" / "engine" / "build.sh"
BUILD_LOG = ROOT / ".state" / "engine-build.log"
PROGRESS = ROOT / "tools" / "progress.sh"
ENGINE_DIR = ROOT / ".state" / "engine"
PULUMI_STATE = ROOT / ".state" / "pulumi"
CONFIG_COPIES = PULUMI_STATE / "config"
# The same for runs of the user's own CLI (their backend and secrets provider).
OWN_CONFIG_COPIES = PULUMI_STATE / "own-config"

ENGINE_FILES = (
    "bin/pulumi",
    "bin/pulumi-language-python",
    "bin/pulumi-language-python-exec",
    "bin/pulumi-language-yaml",
    "providers/pulumi-resource-kubernetes",
)

# Where the provider's render mode points during offline previews of a stack that installs a chart; whatever a
# preview leaves there is removed after it (discard_render).
OFFLINE_RENDER_DIR = PULUMI_STATE / "offline-render"
RENDER_KEY = "kubernetes:renderYamlToDirectory"


def installs_chart(config_text: str) -> bool:
    """Whether a stack file's config installs Volcano from its chart (``scheduling``: engine volcano, install)."""
    data = yaml.safe_load(config_text) or {}
    config = data.get("config") if isinstance(data, dict) else None
    sched = (config or {}).get("gpu-cluster:scheduling") if isinstance(config, dict) else None
    sched = sched if isinstance(sched, dict) else {}
    return sched.get("engine", "volcano") == "volcano" and sched.get("install", True) is not False


def offline_overrides(stack: str, project_dir: Path = ROOT) -> dict[str, Any]:
    """Config an offline run of the project's engine changes: nothing, unless the stack installs Volcano's chart.

    The Kubernetes provider expands a ``helm.v4.Chart`` only with a reachable cluster or in render mode
    (``kubernetes:renderYamlToDirectory``), so the preview of such a stack runs the provider in render mode:
    every object of the chart is previewed and policed, nothing is contacted. A stack without the chart
    (the local one, possibly deployed by ``make up``) keeps its provider settings, so its preview diffs
    against its state as it is.
    """
    source = stack_config_path(stack, project_dir).read_text(encoding="utf-8")
    if not installs_chart(source):
        return {}
    return {RENDER_KEY: str(OFFLINE_RENDER_DIR / stack)}

# A preview of the whole stack takes tens of seconds; these bound a hung engine, not a slow one.
PREVIEW_TIMEOUT_S = 900
BUILD_TIMEOUT_S = 3600

class EngineError(RuntimeError):
    """The engine could not be run for a reason outside the program (missing build, bad stack)."""


def engine_available(engine_dir: Path = ENGINE_DIR) -> bool:
    """Whether every binary the engine needs has been built."""
    return all(os.access(engine_dir / f, os.X_OK) for f in ENGINE_FILES)


def ensure_engine(timeout_s: int = BUILD_TIMEOUT_S) -> bool:
    """Build the engine if needed (a no-op when the build stamp is current); True when usable.

    The build's output goes to ``.state/engine-build.log``; a cold build (about 30 minutes on 2 cores)
    says every 30 seconds on stderr that it is still running, with the log's last line.
    """
    if shutil.which("go") is None:
        return False
    BUILD_LOG.parent.mkdir(parents=True, exist_ok=True)
    BUILD_LOG.write_text("", encoding="utf-8")
    label = f"engine: building from Go modules (log {BUILD_LOG.relative_to(ROOT)})"
    try:
        proc = subprocess.run(
            ["bash", str(PROGRESS), "--log", str(BUILD_LOG), label, "--", "bash", str(BUILD_SCRIPT)],
            cwd=ROOT,
            timeout=timeout_s,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return False
    return proc.returncode == 0 and engine_available()


def build_failure_reason() -> str:
    """One line saying why the engine is not there, for skip messages."""
    if shutil.which("go") is None:
        return "go is not installed, so the engine cannot be built"
    log = BUILD_LOG
    if log.is_file():
        lines = [ln for ln in log.read_text(encoding="utf-8", errors="replace").splitlines() if ln]
        if lines:
            return f"engine build failed: {lines[-1]}"
    return "engine build failed (run `make engine` to see why)"


def stack_config_path(stack: str, project_dir: Path = ROOT) -> Path:
    """The committed stack configuration file; a clear error when it is missing."""
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", stack):
        raise EngineError(f"invalid stack name {stack!r}: use letters, digits, '-', '_' or '.'")
    path = project_dir / f"Pulumi.{stack}.yaml"
    if not path.is_file():
        raise EngineError(f"stack {stack!r} has no configuration file {path}")
    return path


# The value every ``secure:`` key of a committed stack file gets in the engine's copy: the
# committed ciphertexts are placeholders no passphrase decrypts, and nothing is deployed from here.
PREVIEW_SECRET = "preview-placeholder"


def set_config_path(config: dict[str, Any], path: str, value: Any) -> None:
    """Set ``project:key.sub.field`` inside a stack config mapping; a clear error for a bad path."""
    key, _, rest = path.partition(".")
    if not rest:
        config[key] = value
        return
    node = config.get(key)
    parts = rest.split(".")
    for i, part in enumerate(parts):
        if not isinstance(node, dict):
            raise EngineError(f"config override {path!r}: {'.'.join([key, *parts[:i]])} is not a mapping")
        if i == len(parts) - 1:
            node[part] = value
        else:
            node = node.setdefault(part, {})


#: The keys of a stack file that hold its secrets provider (passphrase salt, cloud KMS key, service).
PROVIDER_KEYS = ("encryptionsalt", "encryptedkey", "secretsprovider")


def config_copy_text(
    source_text: str,
    source_name: str,
    previous_copy: str | None,
    extra: Mapping[str, Any],
    offline: bool = True,
) -> tuple[str, list[str]]:
    """The engine's copy of a stack config and the keys it still has to set as secrets.

    The copy has the committed plain values, ``extra`` values (full keys such as
    ``kubernetes:renderYamlToDirectory``, or dotted paths into an object value such as
    ``gpu-cluster:scheduling.install``), the secrets provider the engine set up for the
    stack before (unless the committed file has its own), and the previously set secrets; any
    ``secure:`` key without an encrypted value there is returned so the caller sets it.
    ``offline`` (the project's file backend) leaves out the Pulumi ESC ``environment:`` block,
    which only a Pulumi Cloud backend resolves, and returns the credentials the stack expects
    from it as keys to set; a user's own CLI keeps the block.
    """
    try:
        data = yaml.safe_load(source_text) or {}
    except yaml.YAMLError as err:
        raise EngineError(f"{source_name} is not valid YAML: {err}") from err
    if not isinstance(data, dict) or not isinstance(data.get("config") or {}, dict):
        raise EngineError(f"{source_name}: expected a mapping with a 'config' mapping")
    previous = (yaml.safe_load(previous_copy) or {}) if previous_copy else {}
    prev_config = previous.get("config") or {} if isinstance(previous, dict) else {}
    own_provider = any(k in data for k in PROVIDER_KEYS)
    config: dict[str, Any] = {}
    pending: list[str] = []
    committed = data.get("config") or {}
    if offline and "environment" in data:
        project = _project_of(committed)
        committed = {**committed, **{
            full: {"secure": ""}
            for full in (k if ":" in k else f"{project}:{k}" for k in credential_refs(committed))
            if full not in committed}}
    for key, value in committed.items():
        if isinstance(value, dict) and set(value) == {"secure"}:
            earlier = prev_config.get(key)
            if not own_provider and isinstance(earlier, dict) and set(earlier) == {"secure"}:
                config[key] = earlier
            else:
                pending.append(key)
        else:
            config[key] = value
    for path, value in extra.items():
        set_config_path(config, path, value)
    dropped = {"config", "environment"} if offline else {"config"}
    out: dict[str, Any] = {k: v for k, v in data.items() if k not in dropped}
    if not own_provider and isinstance(previous, dict):
        out.update({k: previous[k] for k in PROVIDER_KEYS if k in previous})
    out["config"] = config
    return yaml.safe_dump(out, sort_keys=False), pending


def _project_of(config: Mapping[str, Any]) -> str:
    """The project prefix of a stack file's keys (``gpu-cluster``), for keys written without one."""
    for key in config:
        if isinstance(key, str) and ":" in key and not key.startswith(("kubernetes:", "pulumi:")):
            return key.split(":", 1)[0]
    return PROJECT


def _prepare_config(
    stack: str,
    project_dir: Path,
    copies: Path,
    extra: Mapping[str, Any],
    backend_url: str | None,
    cli: Path | None = None,
) -> Path:
    """Write the engine's copy of the stack config, create the stack, and set its secrets.

    ``cli`` is the user's own Pulumi CLI (their backend and secrets provider); None is the project's build.
    """
    source = stack_config_path(stack, project_dir)
    copies.mkdir(parents=True, exist_ok=True)
    copy = copies / f"Pulumi.{stack}.yaml"
    previous = copy.read_text(encoding="utf-8") if copy.is_file() else None
    text, pending = config_copy_text(
        source.read_text(encoding="utf-8"), source.name, previous, extra, offline=cli is None
    )
    copy.write_text(text, encoding="utf-8")
    ensure_stack(stack, copy, cwd=project_dir, backend_url=backend_url, cli=cli)
    for key in pending:
        done = pulumi(
            ["config", "set", "--secret", key, PREVIEW_SECRET, "--stack", stack, "--config-file", str(copy)],
            cwd=project_dir,
            backend_url=backend_url,
            cli=cli,
        )
        if done.returncode != 0:
            raise EngineError(f"could not set secret {key} of stack {stack!r}: {done.stderr.strip()}")
    return copy


def _env(backend_url: str | None, own: bool = False) -> dict[str, str]:
    env = dict(os.environ)
    if own:
        # The user's own CLI: their backend, login, plugins and kubeconfig, as they use Pulumi elsewhere.
        env["NO_COLOR"] = "1"
        if backend_url is not None:
            env["PULUMI_BACKEND_URL"] = backend_url
        return env
    # No cluster is reachable: keep the provider away from any kubeconfig on the machine, so a
    # preview runs in the provider's "cluster unreachable" mode.
    env["KUBECONFIG"] = str(PULUMI_STATE / "no-cluster.kubeconfig")
    env.pop("KUBERNETES_SERVICE_HOST", None)
    env["NO_COLOR"] = "1"
    if backend_url is not None:
        env["PULUMI_BACKEND_URL"] = backend_url
    return env


def pulumi(
    args: Sequence[str],
    *,
    cwd: Path = ROOT,
    backend_url: str | None = None,
    timeout_s: int = PREVIEW_TIMEOUT_S,
    cli: Path | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run ``tools/pulumi`` (or the user's own ``cli``) with ``args``; output captured, never raises on exit code."""
    return subprocess.run(
        [str(cli or WRAPPER), *args],
        cwd=cwd,
        env=_env(backend_url, own=cli is not None),
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )


def _project_name(project_dir: Path) -> str:
    data = yaml.safe_load((project_dir / "Pulumi.yaml").read_text(encoding="utf-8")) or {}
    name = data.get("name") if isinstance(data, dict) else None
    if not isinstance(name, str) or not name:
        raise EngineError(f"{project_dir / 'Pulumi.yaml'} has no project name")
    return name


def _stack_entry(listing: str, stack: str) -> dict[str, Any] | None:
    """The ``pulumi stack ls --json`` entry of ``stack`` (names may carry an org/project prefix)."""
    try:
        entries = json.loads(listing or "[]")
    except json.JSONDecodeError:
        return None
    for entry in entries if isinstance(entries, list) else []:
        if isinstance(entry, dict) and str(entry.get("name", "")).split("/")[-1] == stack:
            return entry
    return None


def ensure_stack(
    stack: str, config_file: Path, *, cwd: Path = ROOT, backend_url: str | None = None, cli: Path | None = None
) -> None:
    """Create the stack in the backend the first time it is used.

    ``pulumi stack init`` writes the secrets provider's keys (the passphrase salt, a KMS key) into
    ``Pulumi.<stack>.yaml`` beside the project and has no ``--config-file``; so it runs in a
    scratch project of the same name and those keys go into the engine's config copy instead of
    the committed file. The project's build uses a passphrase; the user's own ``cli`` uses their
    backend's default provider, and a stack that already exists there is theirs to keep.
    """
    copy = yaml.safe_load(config_file.read_text(encoding="utf-8")) or {}
    listed = pulumi(["stack", "ls", "--json"], cwd=cwd, backend_url=backend_url, cli=cli)
    entry = _stack_entry(listed.stdout, stack) if listed.returncode == 0 else None
    if entry is not None and (cli is not None or "encryptionsalt" in copy):
        return
    if entry is not None:
        # The engine's config copy (with the stack's salt) is gone. A stack with no resources is
        # started afresh; one with resources is left alone: its state must not be dropped.
        if int(entry.get("resourceCount") or 0) > 0:
            raise EngineError(
                f"stack {stack!r} has {entry['resourceCount']} resources but its config copy {config_file} "
                "lost the passphrase salt; restore the copy or remove the stack with `tools/pulumi stack rm`"
            )
        pulumi(["stack", "rm", stack, "--yes", "--force"], cwd=cwd, backend_url=backend_url)
    scratch = config_file.parent / f"init-{stack}"
    if scratch.exists():
        shutil.rmtree(scratch)
    scratch.mkdir(parents=True)
    (scratch / "Pulumi.yaml").write_text(f"name: {_project_name(cwd)}\nruntime: python\n", encoding="utf-8")
    provider = [] if cli is not None else ["--secrets-provider", "passphrase"]
    made = pulumi(["stack", "init", stack, *provider], cwd=scratch, backend_url=backend_url, cli=cli)
    if made.returncode != 0:
        raise EngineError(f"could not create stack {stack!r}: {made.stderr.strip() or made.stdout.strip()}")
    written = scratch / f"Pulumi.{stack}.yaml"
    init_cfg = (yaml.safe_load(written.read_text(encoding="utf-8")) if written.is_file() else None) or {}
    keys = {k: init_cfg[k] for k in PROVIDER_KEYS if k in init_cfg}
    if cli is None and "encryptionsalt" not in keys:
        raise EngineError(f"stack {stack!r} was created without a passphrase salt")
    shutil.rmtree(scratch)
    copy = {**keys, **{k: v for k, v in copy.items() if k not in PROVIDER_KEYS}}
    config_file.write_text(yaml.safe_dump(copy, sort_keys=False), encoding="utf-8")


def has_placeholder_secrets(source_text: str) -> bool:
    """Whether a stack file still holds the shipped ``secure:`` placeholders, which no provider decrypts."""
    data = yaml.safe_load(source_text) or {}
    config = data.get("config") if isinstance(data, dict) else None
    return any(
        isinstance(v, dict) and str(v.get("secure", "")).endswith(PLACEHOLDER_SUFFIX)
        for v in (config.values() if isinstance(config, dict) else [])
    )


#: How the committed stack files mark a ``secure:`` value that stands for a credential nobody committed.
PLACEHOLDER_SUFFIX = ":placeholder"


def config_for(
    stack: str, changed: Mapping[str, Any], backend_url: str | None, cli: Path | None
) -> Path | None:
    """The ``--config-file`` an engine run uses, or None for the committed stack file itself.

    The user's own CLI reads the committed file as is once it holds their secrets (no placeholders
    left) and nothing is overridden; otherwise the run gets a prepared copy (``_prepare_config``),
    kept apart per engine so the project's passphrase and the user's provider never mix.
    """
    source = stack_config_path(stack)
    if cli is not None and not changed and not has_placeholder_secrets(source.read_text(encoding="utf-8")):
        return None
    if backend_url is not None:
        copies = Path(backend_url.removeprefix("file://")) / ("config" if cli is None else "own-config")
    else:
        copies = CONFIG_COPIES if cli is None else OWN_CONFIG_COPIES
    return _prepare_config(stack, ROOT, copies, changed, backend_url, cli)


def _preview_args(
    stack: str,
    policy_pack: bool,
    overrides: Mapping[str, Any] | None,
    backend_url: str | None,
    cli: Path | None,
) -> tuple[list[str], dict[str, Any]]:
    """The ``pulumi preview --diff`` arguments for ``stack`` and the config values this run changes."""
    if cli is None and not engine_available():
        raise EngineError("the engine is not built; run `make engine`")
    default = offline_overrides(stack) if cli is None else {}
    changed = dict(default if overrides is None else overrides)
    config = config_for(stack, changed, backend_url, cli)
    args = ["preview", "--diff", "--stack", stack, "--non-interactive"]
    if config is not None:
        args += ["--config-file", str(config)]
    if policy_pack:
        args += ["--policy-pack", str(ROOT / "policies")]
    return args, changed


def real_preview(
    stack: str,
    policy_pack: bool = True,
    overrides: Mapping[str, Any] | None = None,
    backend_url: str | None = None,
    cli: Path | None = None,
) -> subprocess.CompletedProcess[str]:
    """``pulumi preview --diff`` of ``stack`` on the real engine, with the policy pack if asked.

    ``overrides`` change config values for this preview only (see ``config_copy_text``); the
    default is ``offline_overrides(stack)`` on the project's build and nothing on the user's own ``cli``
    (it reaches chart repositories), and the output's first line names what was changed.
    ``backend_url`` (``file://<dir>``) previews against another file backend than the project's;
    its config copies live beside it.
    Raises ``EngineError`` when the engine is not built or the stack has no config file.
    """
    args, changed = _preview_args(stack, policy_pack, overrides, backend_url, cli)
    try:
        return _noted(pulumi(args, backend_url=backend_url, cli=cli), changed)
    finally:
        discard_render(changed)


def discard_render(changed: Mapping[str, Any]) -> None:
    """Remove what the provider's render mode may have written for a preview: rendered Secrets hold their values in
    clear, and a preview must leave no credential on disk (``make render`` is where rendered YAML is asked for)."""
    folder = changed.get(RENDER_KEY)
    if isinstance(folder, str) and Path(folder).resolve().is_relative_to(OFFLINE_RENDER_DIR.resolve()):
        shutil.rmtree(folder, ignore_errors=True)


def streamed_preview(
    stack: str,
    sink: Callable[[str], None],
    policy_pack: bool = True,
    backend_url: str | None = None,
    cli: Path | None = None,
    timeout_s: int = PREVIEW_TIMEOUT_S,
) -> int:
    """``real_preview``, with each output line (stdout and stderr merged) handed to ``sink`` as it comes.

    A prod preview prints tens of thousands of lines over a minute or more; a caller that holds them all
    until the end looks hung, and one that prints them all buries the summary. ``sink`` decides. The
    first line names the config values the run changed, as ``real_preview``'s does. Returns the exit
    status; past ``timeout_s`` the engine is killed, the sink hears why, and the status is 124.
    """
    args, changed = _preview_args(stack, policy_pack, None, backend_url, cli)
    if changed:
        sink(_changed_note(changed))
    try:
        return _streamed(args, sink, backend_url, cli, timeout_s)
    finally:
        discard_render(changed)


def _streamed(args: list[str], sink: Callable[[str], None], backend_url: str | None, cli: Path | None,
              timeout_s: int) -> int:
    proc = subprocess.Popen(
        [str(cli or WRAPPER), *args], cwd=ROOT, env=_env(backend_url, own=cli is not None),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1, start_new_session=True,
    )
    expired = threading.Event()

    def stop() -> None:
        # The whole group: the engine's plugins hold the pipe too, and the loop below ends only when it closes.
        expired.set()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)

    timer = threading.Timer(timeout_s, stop)
    timer.start()
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            sink(line.rstrip("\n"))
        rc = proc.wait()
    finally:
        timer.cancel()
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    if expired.is_set():
        sink(f"preview: the engine ran past {timeout_s} s and was stopped")
        return 124
    return rc


def _changed_note(changed: Mapping[str, Any]) -> str:
    listed = ", ".join(f"{k}={v!r}" for k, v in sorted(changed.items()))
    return f"note: offline engine run with config changed: {listed}"


def _noted(proc: subprocess.CompletedProcess[str], changed: Mapping[str, Any]) -> subprocess.CompletedProcess[str]:
    """Say in the output which config values this run changed, so no reader takes it for the stack as-is."""
    if changed:
        proc.stdout = _changed_note(changed) + "\n" + (proc.stdout or "")
    return proc


def render_via_engine(
    stack: str, out_dir: Path, overrides: Mapping[str, Any] | None = None
) -> subprocess.CompletedProcess[str]:
    """``pulumi up`` of ``stack`` through the Kubernetes provider in render mode.

    The provider writes every object as YAML under ``out_dir`` (``0-crd/`` and ``1-manifest/``)
    instead of applying it. The update runs against a throw-away backend so the project's
    stacks keep no record of it. ``overrides`` change config values as for ``real_preview`` (none by default).
    """
    changed = dict(overrides or {})  # render mode already: the chart expands without a cluster
    if not engine_available():
        raise EngineError("the engine is not built; run `make engine`")
    out_dir = out_dir.resolve()
    if out_dir.exists():
        shutil.rmtree(out_dir)
    with tempfile.TemporaryDirectory(prefix="engine-render-") as tmp:
        backend = Path(tmp) / "backend"
        backend.mkdir()
        url = f"file://{backend}"
        config = _prepare_config(
            stack,
            ROOT,
            Path(tmp) / "config",
            {**changed, "kubernetes:renderYamlToDirectory": str(out_dir)},
            url,
        )
        return _noted(pulumi(
            ["up", "--yes", "--skip-preview", "--stack", stack, "--config-file", str(config), "--non-interactive"],
            backend_url=url,
        ), changed)
