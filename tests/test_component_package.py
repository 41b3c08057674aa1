"""The cluster as a component package (package/): the schema inferred from the typed args, the args validated by
the stack's rules, and, on the real engine, a YAML program that uses the package.

In-process tests use the SDK's own analyzer and provider (what ``component_provider_host`` runs), so they check
the schema other languages get and the mapping the provider applies to their inputs. The engine tests skip,
saying why, only when the engine is not built.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from pulumi.provider.experimental.analyzer import Analyzer
from pulumi.provider.experimental.component import ComponentProvider
from pulumi.provider.experimental.schema import generate_schema
from pydantic import BaseModel

from components import package as pkg
from components.config import ClusterConfig, ConfigError, parse_config
from components.mockrt import raw_from_stack, run_program
from tools import engine_runner as er

ROOT = er.ROOT
PACKAGE_DIR = ROOT / "package"
TOKEN = f"{pkg.PACKAGE}:index:{pkg.COMPONENT}"


def _schema() -> dict[str, Any]:
    result = Analyzer(pkg.PACKAGE).analyze([pkg.UnifiedGpuCluster])
    spec = generate_schema(pkg.PACKAGE, "0.0.0", None, result["component_definitions"],
                           result["type_definitions"], list(result["dependencies"]))
    return spec.to_json()


@pytest.fixture(scope="module")
def schema() -> dict[str, Any]:
    return _schema()


def _model_paths(model: type[BaseModel], prefix: str = "") -> set[str]:
    """Every key path the config model accepts, list items as ``[]``, tagged-union members merged."""
    from typing import get_args

    paths: set[str] = set()
    for name, field in model.model_fields.items():
        key = f"{prefix}{field.alias or name}"
        paths.add(key)
        inner, suffix = pkg._strip(field.annotation), ""
        while getattr(inner, "__origin__", None) in (list, dict):
            inner, suffix = pkg._strip(get_args(inner)[-1]), suffix + "[]"
        members = [pkg._strip(m) for m in get_args(inner)] or [inner]
        for member in members:
            if isinstance(member, type) and issubclass(member, BaseModel):
                paths |= _model_paths(member, f"{key}{suffix}.")
    return paths


def _schema_paths(spec: dict[str, Any], props: dict[str, Any], prefix: str = "") -> set[str]:
    paths: set[str] = set()
    for key, prop in props.items():
        paths.add(f"{prefix}{key}")
        suffix = ""
        while prop.get("type") in ("array", "object") and ("items" in prop or "additionalProperties" in prop):
            prop, suffix = prop.get("items") or prop["additionalProperties"], suffix + "[]"
        ref = prop.get("$ref", "")
        if ref.startswith("#/types/"):
            target = spec["types"][ref.removeprefix("#/types/")]
            paths |= _schema_paths(spec, target.get("properties", {}), f"{prefix}{key}{suffix}.")
    return paths


def test_schema_offers_every_stack_key_and_nothing_else(schema: dict[str, Any]) -> None:
    resource = schema["resources"][TOKEN]
    assert resource["isComponent"] is True
    assert _schema_paths(schema, resource["inputProperties"]) == _model_paths(ClusterConfig)


def test_schema_requires_what_the_config_requires(schema: dict[str, Any]) -> None:
    resource = schema["resources"][TOKEN]
    required = {f.alias or n for n, f in ClusterConfig.model_fields.items() if f.is_required()}
    assert set(resource["requiredInputs"]) == required == {"pools", "systemPool"}
    pool = schema["types"][f"{pkg.PACKAGE}:index:GpuPool"]
    assert set(pool["required"]) == {"name", "nodes"}


def test_schema_types_follow_the_config_model(schema: dict[str, Any]) -> None:
    types = schema["types"]
    tier = types[f"{pkg.PACKAGE}:index:TierName"]
    assert [e["value"] for e in tier["enum"]] == ["system", "training", "inference", "default"]
    # A tagged union is one object type: the choosing key and every member's keys, required only where all require.
    fs = types[f"{pkg.PACKAGE}:index:Filesystem"]
    assert {"backend", "server", "subnetId", "vipPool", "volumeHandle"} <= set(fs["properties"])
    assert set(fs["required"]) == {"name", "writeGbps", "backend"}
    assert "'nfs'" in fs["description"] and "'backend'" in fs["description"]
    provider = types[f"{pkg.PACKAGE}:index:ExternalProvider"]
    assert {"kind", "vkProvider", "foreignClusterId"} <= set(provider["properties"])
    # Integers travel as numbers so that the config model, not the SDK's truncation, judges 8.5.
    assert types[f"{pkg.PACKAGE}:index:GpuPool"]["properties"]["gpusPerNode"]["type"] == "number"
    outputs = schema["resources"][TOKEN]["properties"]
    assert outputs["onpremGpus"]["type"] == "integer"
    assert outputs["priorityClasses"]["additionalProperties"]["type"] == "string"


def test_plugin_directory_serves_the_schema(schema: dict[str, Any]) -> None:
    """package/ as the engine runs it: ``python -u package <engine>`` prints a port and answers GetSchema."""
    import grpc
    from pulumi.runtime.proto import provider_pb2, provider_pb2_grpc

    plugin = yaml.safe_load((PACKAGE_DIR / "PulumiPlugin.yaml").read_text())
    assert plugin["runtime"]["name"] == "python"
    assert (PACKAGE_DIR / plugin["runtime"]["options"]["virtualenv"]).resolve() == (ROOT / ".venv").resolve()
    proc = subprocess.Popen([sys.executable, "-u", str(PACKAGE_DIR), "127.0.0.1:1"], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        port = proc.stdout.readline().strip()
        assert port.isdigit(), proc.stderr.read() if proc.stderr else ""
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            reply = provider_pb2_grpc.ResourceProviderStub(channel).GetSchema(provider_pb2.GetSchemaRequest(),
                                                                             timeout=60)
        served = json.loads(reply.schema)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    assert served["name"] == pkg.PACKAGE
    assert served["resources"] == schema["resources"]
    assert served["types"] == schema["types"]


def _wire(value: Any) -> Any:
    """A value as another language's SDK sends it: numbers are doubles on the wire."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        return float(value)
    if isinstance(value, list):
        return [_wire(v) for v in value]
    if isinstance(value, dict):
        return {k: _wire(v) for k, v in value.items()}
    return value


def _mapped(args: dict[str, Any]) -> Any:
    """What the provider hands the component for ``args`` sent over the wire."""
    provider = ComponentProvider([pkg.UnifiedGpuCluster], pkg.PACKAGE)
    return provider.map_inputs(_wire(args), provider._component_defs[pkg.COMPONENT])


PROGRAM = """\
import json, pathlib
import pulumi
from components.package import UnifiedGpuCluster

args = json.loads(pathlib.Path(__file__).with_name("args.json").read_text())
cluster = UnifiedGpuCluster("cluster", args)
pulumi.export("onpremGpus", cluster.onprem_gpus)
pulumi.export("scheduler", cluster.scheduler_name)
pulumi.export("priorityClasses", cluster.priority_classes)
"""


def test_component_from_args_builds_the_same_cluster_as_the_stack(tmp_path: Path) -> None:
    """The local stack's config sent as args registers exactly the resources the stack program registers."""
    args = _mapped(raw_from_stack("local"))
    (tmp_path / "args.json").write_text(json.dumps(args))
    program = tmp_path / "program.py"
    program.write_text(PROGRAM)
    tokens = {"localCloudToken": "token", "backupCloudToken": "token"}
    via_package = run_program("local", config=tokens, secret_keys=set(tokens), program=program)
    via_stack = run_program("local")

    def objects(result: Any) -> dict[str, Any]:
        return {r.urn: (r.type, r.inputs, r.depends_on) for r in result.resources}

    assert objects(via_package) == objects(via_stack)
    assert via_package.outputs == via_stack.outputs
    assert via_package.outputs["onpremGpus"] == 32


def _problems(call: Any) -> list[str]:
    with pytest.raises(ConfigError) as err:
        call()
    return [p.render() for p in err.value.problems]


@pytest.fixture
def no_engine_config() -> Any:
    import pulumi.runtime

    pulumi.runtime.set_all_config({}, [])
    yield
    pulumi.runtime.set_all_config({}, [])


def _minimal() -> dict[str, Any]:
    return {
        "pools": [{"name": "a100", "nodes": ["gpu-[01-08]"], "gpusPerNode": 8}],
        "systemPool": {"nodes": ["cpu-01"]},
        "scheduling": {"install": False},
    }


@pytest.mark.usefixtures("no_engine_config")
def test_bad_args_get_the_stack_files_messages() -> None:
    args = _minimal()
    args["pools"][0]["gpusPerNode"] = 8.5
    args["trainingNamespace"] = "Team_A"
    via_package = _problems(lambda: pkg.config_from_args(_mapped(args), "c"))
    via_stack = _problems(lambda: parse_config(args, "Pulumi.x.yaml"))
    assert via_package == via_stack
    assert any(p.startswith("pools[0].gpusPerNode:") and "8.5" in p for p in via_package)
    assert any(p.startswith("trainingNamespace:") for p in via_package)


@pytest.mark.usefixtures("no_engine_config")
def test_args_error_names_the_component() -> None:
    args = _minimal()
    args["pools"][0]["nodes"] = []
    with pytest.raises(ConfigError) as err:
        pkg.config_from_args(_mapped(args), "team-a")
    assert "the args of UnifiedGpuCluster 'team-a'" in str(err.value)
    assert "pools[0].nodes" in str(err.value)


@pytest.mark.usefixtures("no_engine_config")
def test_provider_credentials_must_be_secrets_of_the_calling_stack() -> None:
    import pulumi.runtime

    args = _minimal()
    args["providers"] = [{"name": "cloud", "kind": "virtual-kubelet", "nodeName": "vk-cloud", "gpus": 8,
                          "image": "registry.example/vk:1.0.0", "vkProvider": "mock",
                          "credentialsSecret": "cloudToken"}]
    missing = _problems(lambda: pkg.config_from_args(_mapped(args), "c"))
    assert any("cloudToken" in p and "not set" in p for p in missing)
    pulumi.runtime.set_all_config({"gpu-cluster:cloudToken": "plain"}, [])
    plain = _problems(lambda: pkg.config_from_args(_mapped(args), "c"))
    assert any("plain text" in p for p in plain)
    pulumi.runtime.set_all_config({"gpu-cluster:cloudToken": "s3cret"}, ["gpu-cluster:cloudToken"])
    assert pkg.config_from_args(_mapped(args), "c").providers[0].credentials_secret == "cloudToken"


def test_a_type_the_schema_cannot_express_is_named() -> None:
    class Odd(BaseModel):
        size: int | str = 1

    with pytest.raises(pkg.SchemaTypeError, match=r"Odd\.size"):
        pkg.build_args_types(Odd, "OddArgs")


def test_two_config_types_with_one_name_are_refused() -> None:
    def make() -> type[BaseModel]:
        class Pool(BaseModel):
            name: str

        return Pool

    class Twice(BaseModel):
        first: make()  # type: ignore[valid-type]
        second: make()  # type: ignore[valid-type]

    with pytest.raises(pkg.SchemaTypeError, match="'Pool'"):
        pkg.build_args_types(Twice, "TwiceArgs")


# --- The real engine: a YAML program that uses the package --------------------------------------------------------

needs_engine = pytest.mark.skipif(
    not er.engine_available(), reason=f"real engine unavailable: {er.build_failure_reason()}"
)


def _tail(proc: Any, lines: int = 40) -> str:
    text = (proc.stdout or "") + "\n" + (proc.stderr or "")
    return "\n".join(text.splitlines()[-lines:])


@needs_engine
def test_engine_reads_the_package_schema(schema: dict[str, Any], tmp_path: Path) -> None:
    proc = er.pulumi(["package", "get-schema", str(PACKAGE_DIR)], cwd=tmp_path)
    assert proc.returncode == 0, _tail(proc)
    served = json.loads(proc.stdout)
    assert served["name"] == pkg.PACKAGE
    assert served["resources"][TOKEN]["inputProperties"] == schema["resources"][TOKEN]["inputProperties"]


YAML_PROGRAM = """\
name: tiny-yaml
runtime: yaml
packages:
  gpu-cluster: {package}
resources:
  cluster:
    type: gpu-cluster:UnifiedGpuCluster
    properties:
      trainingNamespace: team-a-training
      pools:
        - name: a100
          nodes: ["gpu-[01-08]"]
          gpusPerNode: {gpus}
      systemPool:
        nodes: ["cpu-01"]
      scheduling:
        install: false
outputs:
  onpremGpus: ${{cluster.onpremGpus}}
  scheduler: ${{cluster.schedulerName}}
"""


def _yaml_preview(where: Path, gpus: str) -> Any:
    """``pulumi preview --diff`` of a YAML program using the package, in a file backend of its own.

    The ``packages:`` entry is what ``pulumi package add <dir>`` records; the YAML host the proxy serves
    (1.25.0) predates the CLI's package linking, so the program names the package itself.
    """
    prog = where / "prog"
    prog.mkdir()
    (prog / "Pulumi.yaml").write_text(YAML_PROGRAM.format(package=PACKAGE_DIR, gpus=gpus))
    backend = where / "backend"
    backend.mkdir()
    url = f"file://{backend}"
    init = er.pulumi(["stack", "init", "dev", "--secrets-provider", "passphrase"], cwd=prog, backend_url=url)
    assert init.returncode == 0, _tail(init)
    return er.pulumi(["preview", "--diff", "--stack", "dev", "--non-interactive"], cwd=prog, backend_url=url)


@needs_engine
def test_yaml_program_previews_the_component(tmp_path: Path) -> None:
    preview = _yaml_preview(tmp_path, "8")
    assert preview.returncode == 0, _tail(preview)
    out = preview.stdout
    assert f"+ {TOKEN}: (create)" in out
    assert "+ kubernetes:core/v1:Namespace: (create)" in out
    assert "$kubernetes:core/v1:Namespace::ns-team-a-training]" in out, "the args did not reach the namespaces"
    assert "onpremGpus: 64" in out, _tail(preview)
    created = re.search(r"\+ (\d+) to create", out)
    assert created and int(created.group(1)) > 50, _tail(preview)


@needs_engine
def test_yaml_program_with_bad_args_gets_the_config_message(tmp_path: Path) -> None:
    preview = _yaml_preview(tmp_path, "8.5")
    assert preview.returncode != 0
    text = preview.stdout + preview.stderr
    assert "invalid stack configuration in the args of UnifiedGpuCluster 'cluster'" in text, _tail(preview)
    assert "pools[0].gpusPerNode: Input should be a valid integer" in text and "(got 8.5)" in text, _tail(preview)
