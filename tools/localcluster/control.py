"""Start, stop and inspect the local control plane: local processes bound to 127.0.0.1.

Each process is recorded as ``run/<name>.json`` (pid, command line, log file). ``down`` stops exactly
those pids, after checking that the pid still runs the recorded executable, so it never touches
anyone else's processes. Extra processes (the burst controller, the health guard, the descheduler)
are registered the same way with :func:`start_process` and stopped by ``down`` too.
"""

from __future__ import annotations

import os
import socket
import sys
import time
from collections.abc import Sequence
from typing import Any

import yaml

from tools.localcluster import pki
from tools.localcluster.plan import (
    PORT_NAMES,
    Layout,
    NodePlan,
    audit_policy,
    component_commands,
    load_plan,
    load_stack_config,
    volcano_conf,
    volcano_controller_flags,
    volcano_scheduler_flags,
)
from tools.localcluster.processes import ROOT as ROOT
from tools.localcluster.processes import ClusterError as ClusterError
from tools.localcluster.processes import Proc as Proc
from tools.localcluster.processes import api_client as api_client
from tools.localcluster.processes import api_get as api_get
from tools.localcluster.processes import crds_established as crds_established
from tools.localcluster.processes import free_ports as free_ports
from tools.localcluster.processes import http_ok as http_ok
from tools.localcluster.processes import load_ports as load_ports
from tools.localcluster.processes import load_proc as load_proc
from tools.localcluster.processes import log_tail
from tools.localcluster.processes import recorded as recorded
from tools.localcluster.processes import say as say
from tools.localcluster.processes import start_process as start_process
from tools.localcluster.processes import stop_process as stop_process
from tools.localcluster.processes import wait_for as wait_for
from tools.localcluster.scale import Tuning

DEFAULT_STATE = ROOT / ".state" / "localcluster"

#: Components of the control plane proper, in start order (stopped in reverse). Each runs under
#: :mod:`tools.localcluster.supervise`, which starts it again when it exits, as a kubelet does a static pod.
CONTROL_PLANE = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok",
                 "vc-controller-manager", "vc-scheduler")
#: Without these there is no cluster; Volcano's two are started when built (a warning otherwise).
REQUIRED = CONTROL_PLANE[:5]
VOLCANO = CONTROL_PLANE[5:]


NODE_CREATE_WORKERS = 16


def apply_nodes(lay: Layout, plan: NodePlan, real: Sequence[str] = ()) -> None:
    """Create the plan's kwok nodes (kept as they are if they exist: the stack or the agents may own fields);
    the ``real`` ones are left to their kubelets, which register them.

    Virtual nodes are left to the stack's virtual kubelets, which register them (tools/localcluster/virtual_kubelet.py).
    """
    from concurrent.futures import ThreadPoolExecutor

    from kubernetes import client

    api: Any = client.CoreV1Api(api_client(lay))
    existing = {n.metadata.name for n in api.list_node().items}
    todo = [n for n in plan.kwok_nodes if n.name not in existing and n.name not in real]
    if len(todo) < 2 * NODE_CREATE_WORKERS:
        for node in todo:
            api.create_node(node.manifest(plan.gpu_resource))
        return
    api.api_client.rest_client.pool_manager.connection_pool_kw["maxsize"] = NODE_CREATE_WORKERS
    with ThreadPoolExecutor(NODE_CREATE_WORKERS) as pool:
        # list() re-raises the first failure here, naming the node in the API's message.
        list(pool.map(lambda node: api.create_node(node.manifest(plan.gpu_resource)), todo))


def apply_crds(lay: Layout) -> list[str]:
    from kubernetes import client

    ext = client.ApiextensionsV1Api(api_client(lay))
    names: list[str] = []
    for path in sorted(lay.crd.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if not doc:
                continue
            names.append(doc["metadata"]["name"])
            try:
                ext.create_custom_resource_definition(doc)
            except client.ApiException as err:
                if err.status != 409:
                    raise
    return names


#: RuntimeClasses a GPU node gets from the NVIDIA GPU operator; pods naming them are rejected otherwise.
RUNTIME_CLASSES = ("nvidia",)


def apply_runtime_classes(lay: Layout) -> None:
    from kubernetes import client

    node_api: Any = client.NodeV1Api(api_client(lay))
    have = {rc.metadata.name for rc in node_api.list_runtime_class().items}
    for name in RUNTIME_CLASSES:
        if name not in have:
            node_api.create_runtime_class(
                {"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "metadata": {"name": name}, "handler": name})


def apply_kubelet_api_binding(lay: Layout) -> None:
    """What kubeadm binds: the API server's kubelet client may use every kubelet API (logs, exec), which
    kubelets (and virtual kubelets) check by a SubjectAccessReview on each call."""
    from kubernetes import client

    rbac: Any = client.RbacAuthorizationV1Api(api_client(lay))
    try:
        rbac.create_cluster_role_binding({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": pki.KUBELET_CLIENT_USER},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                        "name": "system:kubelet-api-admin"},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": pki.KUBELET_CLIENT_USER}],
        })
    except client.ApiException as err:
        if err.status != 409:
            raise


def nodes_ready(lay: Layout, plan: NodePlan, real: Sequence[str] = ()) -> bool:
    from kubernetes import client

    api: Any = client.CoreV1Api(api_client(lay))
    ready = set()
    for node in api.list_node().items:
        conds = {c.type: c.status for c in (node.status.conditions or [])}
        if conds.get("Ready") == "True":
            ready.add(node.metadata.name)
    return all(n.name in ready for n in plan.kwok_nodes if n.name not in real)


def default_service_account(lay: Layout) -> bool:
    from kubernetes import client

    client.CoreV1Api(api_client(lay)).read_namespaced_service_account("default", "default")
    return True


# --------------------------------------------------------------------------- up / down / status


def binaries_missing(lay: Layout, names: Sequence[str] = REQUIRED) -> list[str]:
    return [name for name in names if not os.access(lay.bin / name, os.X_OK)]


def expected(lay: Layout) -> tuple[str, ...]:
    """The components this build can run: the required ones, and Volcano's when built."""
    volcano = not binaries_missing(lay, VOLCANO) and any(lay.crd.glob("*.yaml"))
    return CONTROL_PLANE if volcano else REQUIRED


def is_up(lay: Layout) -> bool:
    ports = load_ports(lay)
    if ports is None:
        return False
    procs = {p.name: p for p in recorded(lay)}
    if not all(name in procs and procs[name].alive() for name in expected(lay)):
        return False
    try:
        return api_get(lay, ports["apiserver"], "/readyz")[0] == 200
    except OSError:
        return False


def up(lay: Layout, stack: str = "local", timeout: float = 240.0, real_nodes: bool = False,
       plan: NodePlan | None = None, tuning: Tuning | None = None) -> NodePlan:
    """Start the control plane and the plan's kwok nodes; with ``real_nodes``, real kubelets beside them
    (tools/localcluster/nodehost.py: the host is checked first, and what they change is restored by ``down``).

    ``plan`` replaces the stack's own (a scale shape, tools/localcluster/scale.py) and ``tuning`` sets the
    control plane's flags for that size; neither goes with ``real_nodes``.
    """
    if real_nodes and (plan is not None or tuning is not None):
        raise ClusterError("a scale plan or tuning runs on kwok nodes only, not with real nodes")
    plan = plan or load_plan(ROOT, stack, real_nodes)
    real: tuple[str, ...] = ()
    if real_nodes:
        from tools.localcluster import nodehost
        from tools.localcluster.realnodes import real_nodes_for

        nodehost.check_host(lay)
        real = tuple(n.name for n in real_nodes_for(plan))
    missing = binaries_missing(lay)
    if missing:
        raise ClusterError(f"binaries missing in {lay.bin}: {', '.join(missing)}; run `make localcluster`")
    if is_up(lay):
        from tools.localcluster import nodehost

        say("already up; making sure the nodes exist")
        apply_nodes(lay, plan, tuple(n.name for n in nodehost.recorded_nodes(lay)))
        return plan
    down(lay, quiet=True)  # a half-started cluster from a crash: clean slate
    started = time.monotonic()
    pki.ensure_pki(lay.pki)
    ports = free_ports(PORT_NAMES)
    if real_nodes:
        from tools.localcluster.realnodes import APISERVER_PORT

        with socket.socket() as probe:
            # As the API server binds (Go sets SO_REUSEADDR): the connections of a cluster just stopped, in TIME_WAIT,
            # do not hold the port; a listener does.
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(("0.0.0.0", APISERVER_PORT))
            except OSError as err:
                raise ClusterError(f"real nodes need the API server on port {APISERVER_PORT} (the stack's "
                                   f"NetworkPolicies allow 443 and 6443), which is taken: {err}") from None
        ports["apiserver"] = APISERVER_PORT
    lay.run.mkdir(parents=True, exist_ok=True)
    (lay.run / "ports.yaml").write_text(yaml.safe_dump(ports))
    lay.kubeconfig.write_text(pki.kubeconfig_text(f"https://127.0.0.1:{ports['apiserver']}", lay.pki))
    lay.kubeconfig.chmod(0o600)
    stack_cfg = load_stack_config(ROOT, stack)
    lay.volcano_conf.write_text(yaml.safe_dump(volcano_conf(stack_cfg), sort_keys=False))
    lay.audit_policy.write_text(yaml.safe_dump(audit_policy(everyone=tuning is not None and tuning.audit_everyone),
                                                sort_keys=False))
    lay.logs.mkdir(parents=True, exist_ok=True)
    from tools.localcluster.realnodes import APISERVER_IP

    cmds = component_commands(lay, ports, APISERVER_IP if real_nodes else None)
    if stack_cfg is not None:
        cmds["vc-controller-manager"] += volcano_controller_flags(stack_cfg)
        cmds["vc-scheduler"] += volcano_scheduler_flags(stack_cfg)
    if tuning is not None:
        cmds = tuning.apply(cmds)
        if tuning.kwok_options:
            kwok_config = lay.state / "kwok-config.yaml"
            kwok_config.write_text(tuning.kwok_config())
            cmds["kwok"].append(f"--config={kwok_config}")

    etcd = start_process(lay, "etcd", cmds["etcd"], supervised=True)
    wait_for("etcd health", lambda: http_ok(f"http://127.0.0.1:{ports['etcd']}/health"), 60, etcd)
    apiserver = start_process(lay, "kube-apiserver", cmds["kube-apiserver"], supervised=True)
    wait_for("kube-apiserver /readyz", lambda: api_get(lay, ports["apiserver"], "/readyz")[0] == 200,
             timeout, apiserver)
    say(f"kube-apiserver ready on https://127.0.0.1:{ports['apiserver']} "
        f"({time.monotonic() - started:.1f}s)")
    for name in ("kube-controller-manager", "kube-scheduler", "kwok"):
        start_process(lay, name, cmds[name], supervised=True)

    apply_nodes(lay, plan, real)
    apply_runtime_classes(lay)
    apply_kubelet_api_binding(lay)
    volumes = [f"--hostpath-root={lay.volumes}"] if real_nodes else []
    start_process(lay, "provisioner", [sys.executable, "-m", "tools.localcluster.provisioner",
                                       f"--kubeconfig={lay.kubeconfig}", *volumes], env={"PYTHONPATH": str(ROOT)})
    if expected(lay) == CONTROL_PLANE:
        crds = apply_crds(lay)
        wait_for("Volcano CRDs established", lambda: crds_established(lay, crds), 60)
        for name in VOLCANO:
            start_process(lay, name, cmds[name], supervised=True)
    else:
        say(f"warning: Volcano not built ({', '.join(binaries_missing(lay, VOLCANO)) or 'no CRDs'}); "
            "gang scheduling is unavailable")

    kwok = load_proc(lay, "kwok")
    kwok_count = sum(n.name not in real for n in plan.kwok_nodes)
    wait_for(f"{kwok_count} kwok nodes Ready", lambda: nodes_ready(lay, plan, real), timeout, kwok)
    kcm = load_proc(lay, "kube-controller-manager")
    wait_for("the default service account", lambda: default_service_account(lay), timeout, kcm)
    for name in expected(lay):
        proc = load_proc(lay, name)
        if proc is None or not proc.alive():
            log = proc.log if proc else "?"
            raise ClusterError(f"{name} is not running; log {log}:\n{log_tail(log)}")
    if real_nodes:
        nodehost.up(lay, real_nodes_for(plan))
        from tools.localcluster import apiproxy

        apiproxy.start(lay, ports, APISERVER_IP)
        from tools.localcluster import prometheus_operator
        from tools.localcluster.realnodes import policy_node

        cfg = load_stack_config(ROOT, stack)
        if cfg is not None:
            prometheus_operator.start(lay, dict(cfg.observability.monitor_labels), cfg.monitoring_namespace,
                                      policy_node(real_nodes_for(plan)), cfg.priorities.system.name)
    say(f"up in {time.monotonic() - started:.1f}s: {kwok_count} kwok nodes from {plan.source}, "
        f"kubeconfig {lay.kubeconfig}")
    return plan


def down(lay: Layout, keep_data: bool = False, quiet: bool = False) -> None:
    from tools.localcluster import nodehost

    restored = nodehost.down_recorded(lay)
    if restored and not quiet:
        say(f"host restored: {', '.join(restored)}")
    procs = {p.name: p for p in recorded(lay)}
    order = [n for n in procs if n not in CONTROL_PLANE] + [n for n in reversed(CONTROL_PLANE) if n in procs]
    for name in order:
        stop_process(lay, procs[name])
        if not quiet:
            say(f"stopped {name}")
    (lay.run / "ports.yaml").unlink(missing_ok=True)
    if not keep_data:
        import shutil

        for data in (lay.etcd_data, lay.volumes):
            if data.exists():
                shutil.rmtree(data)


def status(lay: Layout, out: Any = sys.stdout) -> bool:
    procs = {p.name: p for p in recorded(lay)}
    names = list(CONTROL_PLANE) + sorted(n for n in procs if n not in CONTROL_PLANE)
    healthy = True
    for name in names:
        proc = procs.get(name)
        state = f"running (pid {proc.pid})" if proc and proc.alive() else "stopped"
        healthy = healthy and (state != "stopped" or name not in expected(lay))
        print(f"{name:26} {state}", file=out)
    if not is_up(lay):
        print("control plane: down", file=out)
        return False
    from kubernetes import client

    api: Any = client.CoreV1Api(api_client(lay))
    print(f"control plane: up, kubeconfig {lay.kubeconfig}", file=out)
    for node in api.list_node().items:
        conds = {c.type: c.status for c in (node.status.conditions or [])}
        gpus = (node.status.allocatable or {}).get("nvidia.com/gpu", "0")
        taints = ",".join(f"{t.key}={t.value or ''}:{t.effect}" for t in (node.spec.taints or [])) or "-"
        ready = "Ready" if conds.get("Ready") == "True" else "NotReady"
        print(f"  {node.metadata.name:24} {ready:9} gpus={gpus:3} taints={taints}", file=out)
    return healthy
