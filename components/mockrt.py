"""Run the real ``__main__.py`` on the Pulumi mock runtime and capture every registered resource.

The mock monitor sees each ``RegisterResource`` request, which carries what the program asked the engine
for: type, name, parent, inputs, and options (protect, retainOnDelete, dependencies, aliases). That is
exactly what the render tool, the policy runner and the tests need, without a CLI or a cluster.
"""

from __future__ import annotations

import asyncio
import copy
import hashlib
import json
import runpy
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pulumi
from pulumi.runtime import mocks as pulumi_mocks
from pulumi.runtime import rpc, settings
from pulumi.runtime import stack as runtime_stack

from components import charts
from components.config import PROJECT
from components.config.loading import SECRET_PLACEHOLDER, plain_values, read_stack_file, stack_path

ROOT = Path(__file__).resolve().parent.parent
PROGRAM = ROOT / "__main__.py"


@dataclass
class Registered:
    """One resource as the program registered it."""

    urn: str
    type: str
    name: str
    parent: str
    custom: bool
    inputs: dict[str, Any]
    protect: bool = False
    retain_on_delete: bool = False
    depends_on: list[str] = field(default_factory=list)
    aliases: list[str] = field(default_factory=list)
    ignore_changes: list[str] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        return {
            "urn": self.urn,
            "type": self.type,
            "name": self.name,
            "parent": self.parent,
            "custom": self.custom,
            "inputs": self.inputs,
            "options": {
                "protect": self.protect,
                "retainOnDelete": self.retain_on_delete,
                "dependsOn": self.depends_on,
                "aliases": self.aliases,
                "ignoreChanges": self.ignore_changes,
            },
        }

    @property
    def kind(self) -> str:
        return str(self.inputs.get("kind", ""))

    @property
    def metadata(self) -> dict[str, Any]:
        meta = self.inputs.get("metadata")
        return meta if isinstance(meta, dict) else {}


@dataclass
class RunResult:
    stack: str
    resources: list[Registered]
    outputs: dict[str, Any]

    def by_type(self, type_: str) -> list[Registered]:
        return [r for r in self.resources if r.type == type_]

    def by_kind(self, kind: str) -> list[Registered]:
        return [r for r in self.resources if r.custom and r.kind == kind]

    def one(self, kind: str, name: str) -> Registered:
        found = [r for r in self.by_kind(kind) if r.metadata.get("name") == name]
        if len(found) != 1:
            raise LookupError(f"expected one {kind} named {name!r}, found {len(found)}")
        return found[0]

    def by_urn(self) -> dict[str, Registered]:
        return {r.urn: r for r in self.resources}


def _plain(value: Any) -> Any:
    """Make deserialized inputs JSON-friendly: secrets shown as a placeholder, unknowns as None."""
    if isinstance(value, dict):
        if rpc._special_sig_key in value and value.get(rpc._special_sig_key) == rpc._special_secret_sig:
            inner = value.get("value")
            if isinstance(inner, dict):  # keep a secret map's shape (Secret.stringData), hide each value
                return {k: SECRET_PLACEHOLDER for k in inner}
            return SECRET_PLACEHOLDER
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, str) and value == rpc.UNKNOWN:
        return None
    # Protobuf structs carry every number as a double; Kubernetes fields are integers.
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


class RecordingMocks(pulumi.runtime.Mocks):
    """Mocks that give each resource its inputs back as state, with a stable id."""

    def new_resource(self, args: pulumi.runtime.MockResourceArgs) -> tuple[str | None, dict[Any, Any]]:
        state = dict(args.inputs)
        if args.typ == "random:index/randomInteger:RandomInteger":
            # Deterministic stand-in for the provider: same seed, same draw, within [min, max].
            low, high = int(state["min"]), int(state["max"])
            digest = hashlib.sha256(str(state.get("seed", args.name)).encode()).digest()
            state["result"] = low + int.from_bytes(digest[:8], "big") % (high - low + 1)
        return f"{args.name}-id", state

    def call(self, args: pulumi.runtime.MockCallArgs) -> tuple[dict[Any, Any], list[tuple[str, str]] | None]:
        return {}, None


class RecordingMonitor(pulumi_mocks.MockMonitor):
    """The mock monitor, keeping a record of every registration request."""

    def __init__(self, mocks: pulumi.runtime.Mocks) -> None:
        super().__init__(mocks)
        self.records: list[Registered] = []

    def RegisterResource(self, request: Any) -> Any:
        response = super().RegisterResource(request)  # type: ignore[no-untyped-call]
        if request.type == "pulumi:pulumi:Stack":
            return response
        inputs = rpc.deserialize_properties(request.object, keep_unknowns=True)
        self.records.append(
            Registered(
                urn=response.urn,
                type=request.type,
                name=request.name,
                parent=request.parent,
                custom=bool(request.custom),
                inputs=_plain(inputs),
                protect=bool(request.protect),
                retain_on_delete=bool(request.retainOnDelete),
                depends_on=sorted(set(request.dependencies)),
                aliases=sorted(
                    [a.urn for a in request.aliases if a.urn] + list(request.aliasURNs)
                    + [a.spec.name for a in request.aliases if a.HasField("spec") and a.spec.name]
                    # An alias that only moves the resource from another parent: "parent:<its URN>".
                    + [f"parent:{a.spec.parentUrn}" for a in request.aliases
                       if a.HasField("spec") and not a.spec.name and a.spec.parentUrn]
                ),
                ignore_changes=list(request.ignoreChanges),
            )
        )
        return response


def stack_config(stack: str, root: Path = ROOT) -> tuple[dict[str, Any], set[str]]:
    """Read ``Pulumi.<stack>.yaml``: plain values as-is, ``secure:`` values as a secret placeholder."""
    path = root / f"Pulumi.{stack}.yaml"
    if not path.exists():
        raise FileNotFoundError(f"no stack file {path.name} in {root}")
    # The loader's reading: duplicate keys, YAML errors and a non-mapping file are a ConfigError with the line.
    return read_stack_file(path, PROJECT)


def run_program(
    stack: str,
    config: Mapping[str, Any] | None = None,
    secret_keys: set[str] | None = None,
    program: Path = PROGRAM,
    monitor: RecordingMonitor | None = None,
) -> RunResult:
    """Run the program under mocks. ``config`` keys may omit the ``gpu-cluster:`` prefix."""
    if config is None:
        config, secret_keys = stack_config(stack)
    full = {(k if ":" in k else f"{PROJECT}:{k}"): v for k, v in config.items()}
    secrets = {(k if ":" in k else f"{PROJECT}:{k}") for k in (secret_keys or set())}
    encoded = {k: v if isinstance(v, str) else json.dumps(v) for k, v in full.items()}

    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    monitor = monitor or RecordingMonitor(RecordingMocks())
    settings.reset_options()
    pulumi.runtime.set_all_config(encoded, list(secrets))
    pulumi_mocks.set_mocks(RecordingMocks(), project=PROJECT, stack=stack, preview=False, monitor=monitor)
    outputs: dict[str, Any] = {}
    sys.path.insert(0, str(program.parent))
    try:
        # Charts resolve to their module reference: the mock runtime renders no chart, so it needs no Go.
        with charts.resolving_with(charts.reference_only):
            runpy.run_path(str(program), run_name="__main__")
        loop.run_until_complete(runtime_stack.wait_for_rpcs())
        root = settings.get_root_resource()
        if root is not None:
            outputs = _resolve_outputs(root, loop)
    finally:
        sys.path.remove(str(program.parent))
        # A program that stopped early (a rejected config) leaves registrations queued: cancel them.
        pending = asyncio.all_tasks(loop)
        for task in pending:
            task.cancel()
        loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        loop.close()
        asyncio.set_event_loop(None)
    return RunResult(stack=stack, resources=list(monitor.records), outputs=outputs)


def _resolve_outputs(root: Any, loop: asyncio.AbstractEventLoop) -> dict[str, Any]:
    exported = getattr(root, "outputs", {}) or {}
    resolved: dict[str, Any] = {}
    for key, value in exported.items():
        out = pulumi.Output.from_input(value)
        resolved[key] = loop.run_until_complete(out.future())
    return resolved


def raw_from_stack(stack: str, root: Path = ROOT) -> dict[str, Any]:
    """The stack file's plain config without the project prefix and without secret keys (the loader's
    :func:`components.config.plain_values`)."""
    return plain_values(stack_path(stack, root), PROJECT)


def config_error(edit: Callable[[dict[str, Any]], Any], stack: str = "prod") -> str:
    """The message parse_config gives for the stack file after `edit`; an AssertionError when it accepts it."""
    from components.config import ConfigError, parse_config

    raw = copy.deepcopy(raw_from_stack(stack))
    edit(raw)
    try:
        parse_config(raw, f"Pulumi.{stack}.yaml")
    except ConfigError as exc:
        return str(exc)
    raise AssertionError(f"Pulumi.{stack}.yaml was accepted after the edit")
