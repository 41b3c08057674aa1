"""The soak's training gang, the I/O around its pure history (tools/chaos/training.py): a researcher submits it with
the CLI, the soak reads its ranks' events as they are appended, hits its ranks, and cancels it at the end."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tools.chaos.schedule import Fault
from tools.chaos.training import STEP_S, EventTail, GangHistory, gang_spec
from tools.localcluster.plan import Layout
from tools.localcluster.realcluster import child_pids, container_pid

#: The soak's training gang, submitted with the CLI as a researcher does.
GANG = "soak-gang"
#: The gang counts as training again once every rank of its newest round stepped and a step came this recently.
GANG_STALLED_S = 30.0
#: How long the gang may take to train after its submission.
GANG_START_S = 300.0


class SoakGang:
    """One gang on the real GPU nodes: every node but the pool's warm spare, which replaces one the guard takes."""

    def __init__(self, lay: Layout, core: Any, namespace: str, cli: Path) -> None:
        from tools.localcluster.realnodes import REAL_GPU_NODES, REAL_GPU_SPARES

        self.lay, self.core, self.namespace, self.cli = lay, core, namespace, cli
        self.workers = len(REAL_GPU_NODES) - REAL_GPU_SPARES
        self.history = GangHistory()
        self.tail = EventTail(lay.volumes, GANG)
        self.submitted = False

    @property
    def ranks(self) -> tuple[str, ...]:
        return tuple(str(r) for r in range(self.workers))

    def _cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(self.cli), "train", *args], capture_output=True, text=True, timeout=120,
                              check=False, env={**os.environ, "KUBECONFIG": str(self.lay.kubeconfig), "NO_COLOR": "1"})

    def submit(self, duration_s: float, say: Callable[[str], None]) -> None:
        """Submit the gang with the CLI, as a researcher does, and wait until every rank trains."""
        from components import images
        from tools.image_local import LOCAL_REGISTRY
        from tools.localcluster.realnodes import REAL_GPU_POOL, REAL_GPUS_PER_NODE

        # Never done within the soak: a step takes at least STEP_S, and restarts only add steps.
        steps = int(duration_s / STEP_S) + 1000
        spec = gang_spec(GANG, f"{LOCAL_REGISTRY}/training-runtime:{images.AGENT_VERSION}", steps, self.workers,
                         REAL_GPUS_PER_NODE, REAL_GPU_POOL)
        with tempfile.NamedTemporaryFile("w", suffix=".json", prefix="soak-gang-") as f:
            json.dump(spec, f)
            f.flush()
            out = self._cli("submit", f.name)
        if out.returncode != 0:
            raise RuntimeError(f"gpucluster train submit: {out.stderr.strip() or out.stdout.strip()}")
        deadline = time.monotonic() + GANG_START_S
        while not self.training():
            if time.monotonic() > deadline:
                raise RuntimeError(f"{GANG} did not train within {GANG_START_S:g}s of its submission")
            time.sleep(2.0)
        self.submitted = True
        say(f"{GANG}: {self.workers} ranks training, {steps} steps to go")

    def training(self) -> bool:
        """Every rank of the newest round steps (the events appended since the last read taken in first)."""
        self.history.add(self.tail.read())
        return self.history.training(self.workers, time.time(), GANG_STALLED_S)

    def cancel(self) -> None:
        self._cli("cancel", GANG)

    def _pods(self) -> list[Any]:
        return list(self.core.list_namespaced_pod(self.namespace, label_selector=f"volcano.sh/job-name={GANG}").items)

    def hit(self, fault: Fault, rank: str) -> Callable[[], bool]:
        """Kill the rank's worker under its supervisor or its whole container, or evict its pod; seen once the
        gang is no longer training (a new round, or no step for a while) or, for an eviction, the pod is gone."""
        from kubernetes import client

        pods = [p for p in self._pods() if p.metadata.deletion_timestamp is None
                and p.metadata.name.endswith(f"-{rank}") and p.status.phase == "Running"
                and p.status.container_statuses and p.status.container_statuses[0].container_id]
        if not pods:
            raise RuntimeError(f"rank {rank} of {GANG} has no running pod")
        pod = pods[0]
        if fault is Fault.TRAINER_EVICTED:
            self.core.create_namespaced_pod_eviction(pod.metadata.name, self.namespace, client.V1Eviction(
                metadata=client.V1ObjectMeta(name=pod.metadata.name, namespace=self.namespace)))
            uid = pod.metadata.uid
            return lambda: all(p.metadata.uid != uid for p in self._pods())
        supervisor = container_pid(self.lay, pod.spec.node_name, pod.status.container_statuses[0].container_id)
        if fault is Fault.TRAINER_POD_KILLED:
            os.kill(supervisor, signal.SIGKILL)
        else:
            self._kill_worker(pod, supervisor)
        return lambda: not self.training()

    def kill_worker_on(self, node: str) -> bool:
        """The worker of the gang's pod on ``node`` dies, as with its GPU (a fatal XID); False: no such worker."""
        pods = [p for p in self._pods() if p.metadata.deletion_timestamp is None and p.spec.node_name == node
                and p.status.phase == "Running" and p.status.container_statuses
                and p.status.container_statuses[0].container_id]
        if not pods:
            return False
        pod = pods[0]
        self._kill_worker(pod, container_pid(self.lay, node, pod.status.container_statuses[0].container_id))
        return True

    @staticmethod
    def _kill_worker(pod: Any, supervisor: int) -> None:
        workers = child_pids(supervisor)
        if not workers:
            raise RuntimeError(f"{pod.metadata.name}'s supervisor (pid {supervisor}) runs no worker")
        os.kill(workers[0], signal.SIGKILL)
