"""``make render``: the stack's Kubernetes objects as YAML files, and every registered resource as JSON.

Runs the real program on the mock runtime (no CLI, no cluster). ``manifests/`` holds one file per
Kubernetes object as it would be applied; ``resources.json`` holds every resource with its options
(protect, retainOnDelete, dependsOn, aliases), which the policy runner and the tests read.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path
from typing import Any

import yaml

from components.config import ConfigError
from components.mockrt import Registered, RunResult, run_program

#: Resource types that are not Kubernetes objects of their own (a chart expands on the cluster side).
NOT_MANIFESTS = ("kubernetes:helm.sh/", "kubernetes:yaml/", "kubernetes:kustomize/")


def manifest_of(resource: Registered) -> dict[str, Any] | None:
    """The object as it would be applied, or None for components and non-object resources."""
    if not resource.custom or resource.type.startswith(NOT_MANIFESTS) or not resource.type.startswith("kubernetes:"):
        return None
    body = dict(resource.inputs)
    if "apiVersion" not in body or "kind" not in body:
        return None
    ordered = {"apiVersion": body.pop("apiVersion"), "kind": body.pop("kind"), "metadata": body.pop("metadata", {})}
    ordered.update(body)
    return ordered


def manifest_filename(manifest: dict[str, Any], patch: bool) -> str:
    meta = manifest.get("metadata") or {}
    parts = [manifest["kind"].lower()]
    if meta.get("namespace"):
        parts.append(meta["namespace"])
    parts.append(meta.get("name", "unnamed"))
    stem = "-".join(parts)
    return f"{stem}.patch.yaml" if patch else f"{stem}.yaml"


def manifests(result: RunResult) -> dict[str, dict[str, Any]]:
    """File name -> object, refusing two objects that would land in the same file."""
    out: dict[str, dict[str, Any]] = {}
    for resource in result.resources:
        manifest = manifest_of(resource)
        if manifest is None:
            continue
        name = manifest_filename(manifest, patch=resource.type.endswith("Patch"))
        if name in out:
            raise ValueError(f"two resources render to {name}: check for a duplicate object ({resource.urn})")
        out[name] = manifest
    return out


def write(result: RunResult, out: Path) -> tuple[int, int]:
    target = out / "manifests"
    if target.exists():
        shutil.rmtree(target)
    target.mkdir(parents=True)
    objects = manifests(result)
    for name, manifest in sorted(objects.items()):
        (target / name).write_text(yaml.safe_dump(manifest, sort_keys=False))
    resources = [r.as_json() for r in result.resources]
    (out / "resources.json").write_text(
        json.dumps({"stack": result.stack, "outputs": result.outputs, "resources": resources}, indent=2, default=str)
    )
    return len(objects), len(resources)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--stack", default="prod")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--real-nodes", action="store_true",
                        help="as `make up REAL_NODES=1` deploys it (tools/localcluster/realnodes.py stack_overrides)")
    args = parser.parse_args(argv)
    try:
        if args.real_nodes:
            from components.mockrt import stack_config
            from tools.localcluster.stackup import real_node_config

            config, secrets = stack_config(args.stack)
            result = run_program(args.stack, {**config, **real_node_config(args.stack)}, secrets)
        else:
            result = run_program(args.stack)
    except (ConfigError, FileNotFoundError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    objects, resources = write(result, args.out)
    print(f"{args.stack}: {objects} manifests and {resources} resources written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
