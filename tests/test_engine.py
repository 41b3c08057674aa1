"""The real Pulumi engine built from Go modules (``make engine``).

The mock runtime shows what the program declares; these tests show that the real CLI, our Python
language host and the Kubernetes provider accept it: ``pulumi version``, a tiny program through
preview/up with a policy pack, ``pulumi preview --diff`` of the project's stacks with the project's
policy pack and no reachable cluster, and ``pulumi up`` through the provider's render mode agreeing
with ``make render``. They skip, saying why, only when the engine could not be built here.
"""

from __future__ import annotations

import re
import textwrap
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
import yaml

from tools import engine_runner as er

needs_engine = pytest.mark.skipif(
    not er.engine_available(), reason=f"real engine unavailable: {er.build_failure_reason()}"
)

CLI_GO_MOD = er.ROOT / "tools" / "engine" / "cli" / "go.mod"


def _pinned_cli_version() -> str:
    found = re.search(r"github\.com/pulumi/pulumi/pkg/v3 (v\S+)", CLI_GO_MOD.read_text())
    assert found, f"{CLI_GO_MOD} does not pin github.com/pulumi/pulumi/pkg/v3"
    return found.group(1)


def _tail(proc: Any, lines: int = 40) -> str:
    text = (proc.stdout or "") + "\n" + (proc.stderr or "")
    return "\n".join(text.splitlines()[-lines:])


@needs_engine
def test_version_is_the_pinned_cli() -> None:
    proc = er.pulumi(["version"])
    assert proc.returncode == 0, _tail(proc)
    assert proc.stdout.strip() == _pinned_cli_version()


@needs_engine
def test_tiny_program_runs_with_config_and_policy_pack(tmp_path: Path) -> None:
    """Language host end to end: config in, outputs out, a Python policy pack's verdict reported."""
    prog = tmp_path / "prog"
    pack = tmp_path / "pack"
    prog.mkdir()
    pack.mkdir()
    venv = er.ROOT / ".venv"
    (prog / "Pulumi.yaml").write_text(
        f"name: tiny\nruntime:\n  name: python\n  options:\n    virtualenv: {venv}\n"
    )
    (prog / "Pulumi.dev.yaml").write_text("config:\n  tiny:who: engine\n")
    (prog / "__main__.py").write_text(
        "import pulumi\n"
        "pulumi.export('greeting', 'hello ' + pulumi.Config().require('who'))\n"
    )
    (pack / "PulumiPolicy.yaml").write_text(f"runtime:\n  name: python\n  options:\n    virtualenv: {venv}\n")
    (pack / "__main__.py").write_text(
        textwrap.dedent(
            """
            from pulumi_policy import EnforcementLevel, PolicyPack, StackValidationPolicy

            def check(args, report_violation):
                report_violation("stack has %d resources" % len(args.resources))

            PolicyPack(name="tiny-pack", enforcement_level=EnforcementLevel.ADVISORY,
                       policies=[StackValidationPolicy(name="count", description="counts", validate=check)])
            """
        )
    )
    backend = tmp_path / "backend"
    backend.mkdir()
    url = f"file://{backend}"
    init = er.pulumi(["stack", "init", "dev"], cwd=prog, backend_url=url)
    assert init.returncode == 0, _tail(init)

    preview = er.pulumi(
        ["preview", "--stack", "dev", "--non-interactive", "--policy-pack", str(pack)], cwd=prog, backend_url=url
    )
    assert preview.returncode == 0, _tail(preview)
    assert "tiny-pack" in preview.stdout
    assert "stack has 1 resources" in preview.stdout
    assert _engine_verdicts(preview.stdout) == {("advisory", "count")}

    up = er.pulumi(["up", "--yes", "--stack", "dev", "--non-interactive"], cwd=prog, backend_url=url)
    assert up.returncode == 0, _tail(up)
    out = er.pulumi(["stack", "output", "greeting", "--stack", "dev"], cwd=prog, backend_url=url)
    assert out.stdout.strip() == "hello engine"


#: What Volcano's chart (the module's, as prod installs it) renders: the objects the mock runtime cannot see.
VOLCANO_CHART_OBJECTS = {
    ("apps/v1", "Deployment"): 2, ("v1", "ConfigMap"): 2, ("v1", "Service"): 2, ("v1", "ServiceAccount"): 2,
    ("rbac.authorization.k8s.io/v1", "ClusterRole"): 4, ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding"): 2,
    ("apiextensions.k8s.io/v1", "CustomResourceDefinition"): 11,
}


@needs_engine
@pytest.mark.parametrize("stack", ["prod", "local"])
def test_real_preview_with_policy_pack(stack: str, tmp_path: Path) -> None:
    # A backend of its own: the project's backend may hold a deployed local stack.
    backend = tmp_path / "backend"
    backend.mkdir()
    proc = er.real_preview(stack, policy_pack=True, backend_url=f"file://{backend}")
    assert proc.returncode == 0, _tail(proc)
    if stack == "prod":
        # The stack as committed (Volcano installed); only the provider's render mode is set, so the chart expands.
        assert proc.stdout.startswith("note: offline engine run with config changed: kubernetes:renderYamlToDirectory=")
        chart_children = re.findall(r"helm\.sh/v4:Chart\$kubernetes:([^:]+:[^:]+)::volcano:", proc.stdout)
        assert len(set(chart_children)) == len(VOLCANO_CHART_OBJECTS), _tail(proc)
        # The scheduler configuration we pass in reaches the object Volcano reads, where the pack judges it.
        assert re.search(r'volcano-scheduler\.conf: \(yaml\) \{\s+actions: "enqueue, allocate, preempt, reclaim, '
                         r'backfill"', proc.stdout), _tail(proc)
    else:
        assert proc.stdout.startswith("Previewing"), proc.stdout[:200]
    assert re.search(r"\+ \d+ to create", proc.stdout), _tail(proc)
    assert "gpu-cluster-policies" in proc.stdout, "the project's policy pack did not run"
    assert _engine_verdicts(proc.stdout) == _mock_verdicts(stack), "the engine and `make policy` disagree"
    # No credential in clear on disk: not in the render folder (gone), not anywhere the engine keeps its state.
    assert not (er.OFFLINE_RENDER_DIR / stack).exists()
    for folder in (er.PULUMI_STATE, backend):
        leaked = [p for p in folder.rglob("*") if p.is_file() and p.suffix in (".yaml", ".json", ".log", "")
                  and p.stat().st_size < 50_000_000 and er.PREVIEW_SECRET.encode() in p.read_bytes()]
        assert leaked == [], f"the preview left the placeholder secret in clear in {leaked}"


def test_a_preview_leaves_nothing_in_the_render_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Whatever the provider's render mode wrote for a preview (rendered Secrets hold their values in clear) is
    removed after it; a folder outside the render folder is never touched."""
    monkeypatch.setattr(er, "OFFLINE_RENDER_DIR", tmp_path / "offline-render")
    written = tmp_path / "offline-render" / "prod" / "1-manifest"
    written.mkdir(parents=True)
    (written / "v1-secret-vk-credentials.yaml").write_text("stringData: {kubeconfig: preview-placeholder}\n")
    elsewhere = tmp_path / "out"
    elsewhere.mkdir()
    er.discard_render({er.RENDER_KEY: str(elsewhere)})
    assert elsewhere.exists()
    er.discard_render({er.RENDER_KEY: str(tmp_path / "offline-render" / "prod")})
    assert not (tmp_path / "offline-render" / "prod").exists()


def _stack_config(stack: str) -> tuple[dict[str, Any], set[str]]:
    from components.mockrt import stack_config

    return stack_config(stack)


def _engine_verdicts(output: str) -> set[tuple[str, str]]:
    """(level, rule) of every violation the engine printed, from lines like ``- [mandatory]  rule  (...)``."""
    return set(re.findall(r"^\s*- \[(advisory|mandatory|remediate)\]\s+(\S+)", output, re.MULTILINE))


def _mock_verdicts(stack: str) -> set[tuple[str, str]]:
    from components.mockrt import run_program
    from policies.rules import evaluate
    from tools.policy import context_for, resources_of

    config, secrets = _stack_config(stack)
    violations = evaluate(resources_of(run_program(stack, config=config, secret_keys=secrets)), context_for(stack))
    return {(v.level.value, v.rule) for v in violations}


def _objects(docs: list[dict[str, Any]]) -> dict[tuple[str, str, str, str], dict[str, Any]]:
    out: dict[tuple[str, str, str, str], dict[str, Any]] = {}
    for doc in docs:
        meta = doc.get("metadata") or {}
        key = (doc["apiVersion"], doc["kind"], meta.get("namespace", ""), meta.get("name", ""))
        assert key not in out, f"two objects render as {key}"
        out[key] = doc
    return out


_QUANTITY = re.compile(r"^([0-9.]+)(Ki|Mi|Gi|Ti|Pi|Ei|m|k|M|G|T|P|E)?$")
_FACTORS = {
    None: Fraction(1), "m": Fraction(1, 1000),
    "k": Fraction(10**3), "M": Fraction(10**6), "G": Fraction(10**9), "T": Fraction(10**12),
    "P": Fraction(10**15), "E": Fraction(10**18),
    "Ki": Fraction(2**10), "Mi": Fraction(2**20), "Gi": Fraction(2**30), "Ti": Fraction(2**40),
    "Pi": Fraction(2**50), "Ei": Fraction(2**60),
}


def _quantity(value: Any) -> Any:
    """A resource quantity as an exact number: the provider writes 1024Gi as 1Ti."""
    found = _QUANTITY.match(str(value))
    if not found:
        return value
    return Fraction(found.group(1)) * _FACTORS[found.group(2)]


def _normalize(obj: Any, parent: str = "") -> Any:
    """The object with only what the engine legitimately changes made equal.

    The engine adds its managed-by label, writes quantities in canonical form, turns a Secret's
    stringData into base64 data, and omits values Kubernetes defaults to the same thing (an env
    var's empty value, a PriorityClass's globalDefault: false). Secret values are placeholders on
    both sides and differ, so only their keys compare.
    """
    if isinstance(obj, list):
        return [_normalize(v, parent) for v in obj]
    if not isinstance(obj, dict):
        return _quantity(obj) if parent in ("requests", "limits", "capacity", "storage") else obj
    out = {k: _normalize(v, k) for k, v in obj.items()}
    if parent == "labels" and out.get("app.kubernetes.io/managed-by") == "pulumi":
        del out["app.kubernetes.io/managed-by"]
    if parent == "env" and out.get("value") == "":
        del out["value"]
    if out.get("kind") == "PriorityClass" and out.get("globalDefault") is False:
        del out["globalDefault"]
    if out.get("kind") == "Secret":
        keys = sorted(set(out.pop("data", None) or {}) | set(out.pop("stringData", None) or {}))
        out["secretKeys"] = keys
    return out


@needs_engine
@pytest.mark.parametrize("stack", ["prod", "local"])
def test_engine_render_agrees_with_make_render(stack: str, tmp_path: Path) -> None:
    from components.mockrt import run_program
    from tools.render import manifests

    out = tmp_path / "engine"
    proc = er.render_via_engine(stack, out)
    assert proc.returncode == 0, _tail(proc)
    engine_docs = [
        d for f in sorted(out.rglob("*.yaml")) for d in yaml.safe_load_all(f.read_text()) if isinstance(d, dict)
    ]
    engine = _objects(engine_docs)
    config, secrets = _stack_config(stack)
    mock = _objects(list(manifests(run_program(stack, config=config, secret_keys=secrets)).values()))
    # The engine also writes what Volcano's chart renders (prod installs it); the mock runtime sees the Chart only.
    from_chart = set(engine) - set(mock)
    counted: dict[tuple[str, str], int] = {}
    for api_version, kind, _, _ in from_chart:
        counted[(api_version, kind)] = counted.get((api_version, kind), 0) + 1
    assert counted == (VOLCANO_CHART_OBJECTS if er.installs_chart(er.stack_config_path(stack).read_text()) else {})
    assert all(ns in ("", "volcano-system") for _, _, ns, _ in from_chart), sorted(from_chart)
    assert set(mock) <= set(engine)
    for key, want in mock.items():
        assert _normalize(engine[key]) == _normalize(want), f"{key} differs between the engine and make render"


SOURCE = """\
config:
  gpu-cluster:scheduling: {engine: volcano, install: true}
  gpu-cluster:token:
    secure: v1:cGxhY2Vob2xkZXI=:placeholder
"""


def test_config_copy_sets_placeholder_secrets_once_and_keeps_the_salt() -> None:
    first, pending = er.config_copy_text(SOURCE, "Pulumi.s.yaml", None, {})
    assert pending == ["gpu-cluster:token"]
    assert "gpu-cluster:token" not in yaml.safe_load(first)["config"]
    engine_wrote = "encryptionsalt: v1:abc\nconfig:\n  gpu-cluster:token:\n    secure: v1:real\n"
    second, pending = er.config_copy_text(SOURCE, "Pulumi.s.yaml", engine_wrote, {})
    assert pending == []
    copy = yaml.safe_load(second)
    assert copy["encryptionsalt"] == "v1:abc"
    assert copy["config"]["gpu-cluster:token"] == {"secure": "v1:real"}


def test_config_copy_applies_overrides_into_object_values() -> None:
    text, _ = er.config_copy_text(
        SOURCE, "Pulumi.s.yaml", None,
        {"gpu-cluster:scheduling.install": False, "kubernetes:renderYamlToDirectory": "/tmp/r"},
    )
    config = yaml.safe_load(text)["config"]
    assert config["gpu-cluster:scheduling"] == {"engine": "volcano", "install": False}
    assert config["kubernetes:renderYamlToDirectory"] == "/tmp/r"


def test_config_override_through_a_plain_value_names_the_path() -> None:
    bad = "gpu-cluster:scheduling.engine.x"
    with pytest.raises(er.EngineError, match=re.escape(f"'{bad}': gpu-cluster:scheduling.engine is not a mapping")):
        er.set_config_path({"gpu-cluster:scheduling": {"engine": "volcano"}}, bad, 1)


def test_bad_stack_config_is_refused_with_the_file(tmp_path: Path) -> None:
    (tmp_path / "Pulumi.broken.yaml").write_text("config: [1, 2]\n")
    with pytest.raises(er.EngineError, match=re.escape("Pulumi.broken.yaml: expected a mapping")):
        er.config_copy_text((tmp_path / "Pulumi.broken.yaml").read_text(), "Pulumi.broken.yaml", None, {})
    with pytest.raises(er.EngineError, match="stack 'missing' has no configuration file"):
        er.stack_config_path("missing", tmp_path)


@pytest.mark.parametrize(("text", "installs"), [
    ("config:\n  gpu-cluster:scheduling: {engine: volcano, install: true}\n", True),
    ("config:\n  gpu-cluster:pools: []\n", True),  # Volcano and install are the defaults
    ("config:\n  gpu-cluster:scheduling: {install: false}\n", False),
    ("config:\n  gpu-cluster:scheduling: {engine: kube-batch}\n", False),
    ("", True),
])
def test_installs_chart_reads_the_stack_file(text: str, installs: bool) -> None:
    assert er.installs_chart(text) is installs


def test_offline_overrides_only_for_a_stack_with_the_chart(tmp_path: Path) -> None:
    # prod installs Volcano's chart: render mode, so the provider expands it without a cluster; local does not,
    # so a preview of a deployed local stack diffs against its state with the provider settings it has.
    assert er.offline_overrides("prod") == {
        "kubernetes:renderYamlToDirectory": str(er.OFFLINE_RENDER_DIR / "prod")}
    assert er.offline_overrides("local") == {}
    with pytest.raises(er.EngineError, match="stack 'nope' has no configuration file"):
        er.offline_overrides("nope", tmp_path)
