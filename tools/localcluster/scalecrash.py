"""Let it crash at scale: a fatal fault under a running gang, from the fault to the gang Running again.

A gang of ``pods`` x 8 GPUs is submitted through ``gpucluster train submit`` and runs. One of its nodes then gets a
fatal XID on the fleet stand-in that the scale Prometheus scrapes (``tools.localcluster.scalestorm``); the health
guard, with its real shell and queries, taints the node and evicts the gang's pod there; Volcano's job policy
(``PodEvicted → RestartJob``) deletes every pod of the gang and creates them again; the scheduler places the new
generation on the other nodes. Each term is taken from watches (pods by UID, the node's taint):

- ``detect_s``: from the first scrape that served the fault to the taint (``from_fault_s`` from the fault itself);
- ``evict_s``: from the taint until every pod of the first generation was marked for deletion (the guard's
  eviction and Volcano's restart of the whole gang carried out); ``evict_writes_by_volcano``: the job
  controller's pod writes meanwhile, from the audit log (how many, their p50 latency, the most in flight at once):
  Volcano 1.14.1 kills a gang one pod after another (an out-of-sync patch, then a delete, each), so the term is
  their count times the API server's write latency;
- ``gone_s``: from the taint until every one of them was gone (kwok, standing in for each kubelet, removes
  deleted pods a few at a time on this machine: a real kubelet ends its own pod within the grace period);
- ``reschedule_s``: from the old pods gone until the whole new generation was bound (Volcano's controller creates
  it only once the old one is gone, then its scheduler places it);
- ``running_again_s``: from the fault to the whole new generation Running (again through kwok's pace).

These are the terms ``bench_goodput`` scaled from a four-pod gang by Volcano's default client rate; here they are
measured at the gang's own size. A gang as large as its pool cannot restart once a node is out (no spare node):
the shapes choose sizes that leave the pool a spare.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from agents.node_taints import health_taint_key
from tools.localcluster import control, scalestorm
from tools.localcluster.plan import Layout
from tools.localcluster.scalejobs import audit_events, cancel, published_settings, submit, wait
from tools.localcluster.scalemeasure import Generations, writes_of
from tools.localcluster.watching import following

#: Volcano's controllers' user agent: its job controller kills a restarting gang's pods.
VOLCANO_CONTROLLER = "vc-controller-manager"


def say(msg: str) -> None:
    print(f"scale crash: {msg}", flush=True)


def crash_run(lay: Layout, stack: str, label_prefix: str, standin: str, prometheus_url: str, namespace: str,
              pods: int, pool: str, run: int, spec_dir: Path, timeout: float, team: str | None) -> dict[str, Any]:
    """One gang, one fatal fault on one of its nodes, every term of the restart (seconds)."""
    from kubernetes import client

    from gpucluster_cli.render import worker_selector

    settings = published_settings(lay, namespace)
    name = f"crash-{pods}-{run}"
    gens = Generations()
    core = client.CoreV1Api(control.api_client(lay))
    key = health_taint_key(label_prefix)
    tainted: dict[str, float] = {}

    def pod_event(kind: str, pod: Any) -> None:
        gens.see(pod.metadata.uid, pod.spec.node_name, pod.status.phase, deleted=kind == "DELETED",
                 leaving=pod.metadata.deletion_timestamp is not None)

    def node_event(_: str, node: Any) -> None:
        if any(t.key == key for t in node.spec.taints or []):
            tainted.setdefault(node.metadata.name, time.time())

    scalestorm.restart_guard(lay, stack, prometheus_url, "open", 1)
    with following(core.list_namespaced_pod, pod_event, namespace=settings.training_namespace,
                   label_selector=worker_selector(settings, name)), following(core.list_node, node_event):
        submit(lay, namespace, name, pods, pool, spec_dir, team, max_retries=3)
        wait(f"{pods} pods of {name} Running", lambda: len(gens.alive_running()) >= pods, timeout)
        first = gens.mark()
        node = gens.nodes[sorted(first)[0]]
        time.sleep(1)  # the node watch's list is in: a taint from before the fault would show
        if node in tainted:
            raise control.ClusterError(f"node {node} was tainted before its fault (left from an earlier run?)")
        fault_at = time.time()
        scalestorm.post_faults(standin, {node: {"xid": scalestorm.FATAL_XID}})
        wait(f"the health taint on {node}", lambda: node in tainted, timeout)
        wait(f"every first-generation pod of {name} marked for deletion", gens.first_leaving, timeout)
        leaving_at = time.time()
        wait(f"every first-generation pod of {name} deleted", gens.first_gone, timeout)
        gone_at = time.time()
        wait(f"{pods} new pods of {name} bound", lambda: gens.next_bound() >= pods, timeout)
        bound_at = time.time()
        wait(f"{pods} new pods of {name} Running", lambda: gens.next_running() >= pods, timeout)
        again_at = time.time()
        served = float(scalestorm.served(standin).get(node, fault_at))
        cancel(lay, namespace, name)
        wait(f"the pods of {name} deleted", lambda: not gens.alive_running(), timeout)
    scalestorm.post_faults(standin, {node: {}})
    scalestorm.clear(lay, label_prefix)
    out = {"node": node, "detect_s": round(tainted[node] - served, 2),
           "from_fault_s": round(tainted[node] - fault_at, 2), "evict_s": round(leaving_at - tainted[node], 2),
           "gone_s": round(gone_at - tainted[node], 2), "reschedule_s": round(bound_at - gone_at, 2),
           "running_again_s": round(again_at - fault_at, 2)}
    try:  # what bounds the eviction: Volcano's job controller writes to the pods one after another
        out["evict_writes_by_volcano"] = writes_of(audit_events(lay), VOLCANO_CONTROLLER, "pods", tainted[node],
                                                   leaving_at + 1.0)
    except ValueError as exc:
        say(f"no eviction writes by {VOLCANO_CONTROLLER} in the audit log: {exc}")
    say(f"gang of {pods}: {out}")
    return out
