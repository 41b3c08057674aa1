"""Pulumi at scale: ``pulumi up`` with the real engine of a stack at a scale shape's size, then a no-change
preview and a no-change up, against the reachable control plane (never the offline render mode).

The deploy is the local stack (``Pulumi.local.yaml``: its mock providers' virtual kubelets run here, the cluster
runs Volcano itself, no cert-manager) with the shape's pools and system pool: what a cluster of that size makes
Pulumi register (the GPU pools are one ConfigMap, the system pool a ``NodePatch`` per node), on an environment
this machine can deploy end to end.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from components.config.base import PROJECT
from tools.localcluster import control
from tools.localcluster.plan import Layout, stack_config_values
from tools.localcluster.scale import Shape, shape_plan, tuning_for
from tools.localcluster.scalejobs import SCALE_STATE, layout

ROOT = control.ROOT


def say(msg: str) -> None:
    print(f"scale pulumi: {msg}", flush=True)


def local_env_shape(sh: Shape, root: Path = ROOT) -> Shape:
    """The local stack at ``sh``'s size: its pools (the prod stack's when ``sh`` keeps its own) and system nodes."""
    prod = stack_config_values(root / f"Pulumi.{sh.stack}.yaml")
    pools = sh.pools if sh.pools is not None else tuple(prod["pools"])
    from components.config import expand_node_names

    system = sh.system_nodes or len(expand_node_names((prod.get("systemPool") or {}).get("nodes") or ()))
    return Shape(f"{sh.name}-pulumi", f"the local stack at the size of {sh.name}", stack="local", pools=pools,
                 system_nodes=system)


def overrides(env: Shape, root: Path = ROOT) -> dict[str, Any]:
    """The config keys ``pulumi up`` of the local stack changes for the shape (full keys, as engine_runner takes)."""
    from tools.localcluster.scale import shape_values

    values = shape_values(env, root)
    return {f"{PROJECT}:{key}": values[key] for key in ("pools", "systemPool", "training")}


@contextlib.contextmanager
def _kubeconfig(path: Path) -> Iterator[None]:
    old = os.environ.get("KUBECONFIG")
    os.environ["KUBECONFIG"] = str(path)
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("KUBECONFIG", None)
        else:
            os.environ["KUBECONFIG"] = old


def _state(backend: Path) -> tuple[int, int]:
    """(resources in the stack's state, the state file's bytes)."""
    files = sorted(backend.glob(".pulumi/stacks/**/*.json"))
    if not files:
        raise control.ClusterError(f"no stack state under {backend}")
    path = max(files, key=lambda p: p.stat().st_size)
    deployment = json.loads(path.read_text()).get("checkpoint", {}).get("latest", {})
    return len(deployment.get("resources") or ()), path.stat().st_size


def run(sh: Shape, state: Path | None = None, keep: bool = False) -> dict[str, Any]:
    """Up the control plane at the shape's size, then time the three engine runs."""
    from tools import engine_runner
    from tools.localcluster.stackup import pulumi_up

    env = local_env_shape(sh)
    lay: Layout = layout(env, state or SCALE_STATE / env.name)
    plan = shape_plan(env, ROOT)
    control.up(lay, stack="local", timeout=600, plan=plan, tuning=tuning_for(len(plan.kwok_nodes)))
    # A first `up` starts from an empty state: a backend left by an earlier run would make it a refresh and an
    # update of whatever that run declared (the control plane under it is new every time).
    backend = lay.state / "pulumi-backend"
    shutil.rmtree(backend, ignore_errors=True)
    backend.mkdir()
    url = f"file://{backend}"
    extra = overrides(env)
    out: dict[str, Any] = {"pulumi_nodes": len(plan.nodes), "parallel": "engine default (unbounded)"}
    try:
        started = time.monotonic()
        pulumi_up(lay, "local", backend_url=url, extra=extra)
        out["pulumi_up_s"] = round(time.monotonic() - started, 1)
        out["resources"], out["state_bytes"] = _state(backend)
        with _kubeconfig(lay.kubeconfig):
            started = time.monotonic()
            proc = engine_runner.real_preview("local", policy_pack=False, overrides=extra, backend_url=url)
            out["pulumi_preview_nochange_s"] = round(time.monotonic() - started, 1)
        if proc.returncode != 0:
            raise control.ClusterError(f"no-change preview failed ({proc.returncode}):\n{proc.stdout[-3000:]}"
                                       f"{proc.stderr[-3000:]}")
        out["preview_summary"] = [line.strip() for line in proc.stdout.splitlines()
                                  if "unchanged" in line or "to update" in line or "to create" in line][-4:]
        started = time.monotonic()
        pulumi_up(lay, "local", backend_url=url, extra=extra)
        out["pulumi_up_nochange_s"] = round(time.monotonic() - started, 1)
        say(f"{sh.name}: {out}")
        return out
    finally:
        if not keep:
            control.down(lay)
