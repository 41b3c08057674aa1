"""What the scale runs share: a shape's own state folder, and a researcher's gang submitted, cancelled and waited
for through ``gpucluster`` (the orchestrator ``scalerun`` and the fault runs ``scalecrash``/``scalepulumi`` all use
these; none of them imports another's orchestration)."""

from __future__ import annotations

import contextlib
import json
import subprocess
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from tools.localcluster import control
from tools.localcluster.plan import Layout
from tools.localcluster.scale import Shape
from tools.localcluster.scalemeasure import GangTimes
from tools.localcluster.watching import following

SCALE_STATE = control.ROOT / ".state" / "scale"
GPUCLUSTER = control.ROOT / ".venv" / "bin" / "gpucluster"


def layout(sh: Shape, state: Path | None = None) -> Layout:
    """The shape's own state folder (``state``, by default under ``.state/scale``), sharing the local cluster's
    binaries and CRDs (built once)."""
    base = control.DEFAULT_STATE
    lay = Layout(state or SCALE_STATE / sh.name)
    lay.state.mkdir(parents=True, exist_ok=True)
    for link, target in ((lay.bin, base / "bin"), (lay.crd, base / "crd")):
        if link.is_symlink() or link.exists():
            continue
        link.symlink_to(target, target_is_directory=True)
    return lay


def published_settings(lay: Layout, namespace: str) -> Any:
    """The training settings the stack published in the cluster (what the CLI reads)."""
    from gpucluster_cli.kube import Cluster

    return Cluster(control.api_client(lay), namespace).settings()


def submit(lay: Layout, namespace: str, name: str, pods: int, pool: str, spec_dir: Path, team: str | None,
           max_retries: int = 0) -> None:
    spec: dict[str, Any] = {"name": name, "image": "registry.gpucluster.io/train/bench:1.0",
                            "command": ["python", "train.py"], "gpus": {"nodes": pods, "gpusPerNode": 8},
                            "pool": pool, "maxRetries": max_retries}
    if team:
        spec["team"] = team
    path = spec_dir / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec))
    proc = subprocess.run([str(GPUCLUSTER), "--kubeconfig", str(lay.kubeconfig), "-n", namespace, "train", "submit",
                           str(path)], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise control.ClusterError(f"gpucluster train submit {path} failed: {proc.stdout}{proc.stderr}")


def cancel(lay: Layout, namespace: str, name: str) -> None:
    subprocess.run([str(GPUCLUSTER), "--kubeconfig", str(lay.kubeconfig), "-n", namespace, "train", "cancel", name],
                   capture_output=True, text=True, check=False)


def wait(what: str, check: Any, timeout: float) -> float:
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if check():
            return time.monotonic() - started
        time.sleep(0.05)
    raise control.ClusterError(f"timed out after {timeout:.0f}s waiting for {what}")


def audit_events(lay: Layout) -> Iterator[dict[str, Any]]:
    """Every event of the API server's audit log, one at a time (the scale shapes log every request but the node
    leases': hundreds of megabytes on the ``llama3`` shape, never held whole)."""
    for path in sorted(lay.logs.glob("audit*.log")):
        with path.open(encoding="utf-8", errors="replace") as f:
            for line in f:
                with contextlib.suppress(ValueError):
                    yield json.loads(line)


@contextlib.contextmanager
def watching(lay: Layout, namespace: str, selector: str) -> Iterator[GangTimes]:
    """Record when each pod of ``selector`` appears, is bound and runs, from a watch (not polling)."""
    from kubernetes import client

    times = GangTimes(start=time.monotonic())
    api = client.CoreV1Api(control.api_client(lay))

    def seen(kind: str, pod: Any) -> None:
        times.see(pod.metadata.name, bool(pod.spec.node_name), pod.status.phase, time.monotonic(),
                  deleted=kind == "DELETED", gated=bool(pod.spec.scheduling_gates), node=pod.spec.node_name)

    with following(api.list_namespaced_pod, seen, namespace=namespace, label_selector=selector):
        yield times


def say(msg: str) -> None:
    print(f"scale: {msg}", flush=True)


#: The field manager the stack's provider applies with (server-side apply), so the objects are owned as after an up.
FIELD_MANAGER = "pulumi-kubernetes"
#: Applies in flight at once within one kind (2,048 node patches take seconds, not one round trip each).
APPLY_WORKERS = 16


def apply_objects(lay: Layout, objects: Sequence[Mapping[str, Any]]) -> int:
    """Server-side apply each object (as the stack's provider does), kind after kind in the given order and
    the objects of one kind side by side; fails naming the first object refused."""
    from concurrent.futures import ThreadPoolExecutor
    from itertools import groupby

    from kubernetes import dynamic
    from kubernetes.client import ApiException

    api = control.api_client(lay)
    api.rest_client.pool_manager.connection_pool_kw["maxsize"] = APPLY_WORKERS
    dyn: Any = dynamic.DynamicClient(api)  # type: ignore[no-untyped-call]

    def apply(obj: Mapping[str, Any]) -> None:
        meta = obj.get("metadata") or {}
        what = f"{obj['kind']} {meta.get('namespace', '')}/{meta.get('name')}"
        try:
            resource = dyn.resources.get(api_version=obj["apiVersion"], kind=obj["kind"])
            resource.server_side_apply(body=obj, name=meta.get("name"), namespace=meta.get("namespace"),
                                       field_manager=FIELD_MANAGER, force_conflicts=True)
        except ApiException as exc:
            raise control.ClusterError(f"applying {what}: {exc.status} {exc.reason}: {exc.body}") from None
        except dynamic.exceptions.ResourceNotFoundError:
            raise control.ClusterError(f"applying {what}: {obj['apiVersion']} is not served here") from None

    with ThreadPoolExecutor(APPLY_WORKERS) as pool:
        for _, group in groupby(objects, key=lambda o: o["kind"]):
            list(pool.map(apply, group))
    return len(objects)
