"""Our pods, for real: the stack's own objects on real kubelets (containerd + runc), not kwok.

The local cluster starts with its real nodes (tools/localcluster/realnodes.py): a system node and a GPU node
whose GPUs come from our device plugin. The stack's rendered health-guard objects (namespace with its Pod
Security level, ServiceAccount, RBAC, settings, the Deployment with its probes and securityContext) are applied
as rendered; only the image is the one ``make images`` built here, and the pods are pinned to the real system
node. Then the host is asked what the kubelet really did: the container's user, capabilities, seccomp, no new
privileges, read-only root and the mounted token; the guard reaches the API server through the ``kubernetes``
Service (it takes its Lease); the standby takes over when the leader's pod is deleted; a frozen guard is
restarted by the kubelet's liveness probe. A GPU pod gets the devices the plugin granted.

Figures go to ``.state/localcluster/e2e-realnodes.json`` for ``bench_e2e``.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.polling import wait
from tests.realnode_support import (
    BUILT,
    container_pid,
    delete_the_leader,
    lease_holder,
    private_state,
    prometheus_get,
    ready_pods,
    why_not,
)
from tools.image_local import LOCAL_REGISTRY
from tools.localcluster import control, hostcheck, nodehost
from tools.localcluster.plan import Layout, load_plan
from tools.localcluster.realnodes import REAL_NODE_TAINT, real_nodes_for

ROOT = Path(__file__).resolve().parents[1]
IMAGES = nodehost.IMAGES_DIR
FIGURES = BUILT / "e2e-realnodes.json"
NS = "gpu-system"
#: The stack's system node (its kubelet registers it in kwok's place) and the real GPU nodes (their pool's).
REAL_NODES = real_nodes_for(load_plan(ROOT, "local", real_nodes=True))
SYSTEM_NODE, GPU_NODE = REAL_NODES[0].name, REAL_NODES[1].name
GUARD, BURST = "health-guard", "burst-controller"
#: What the agents need before their own objects: namespaces (with their Pod Security levels), priorities and
#: every NetworkPolicy the stack declares, so the agents start under default-deny as in production.
FOUNDATION = ("namespace-*.yaml", "priorityclass-*.yaml", "networkpolicy-*.yaml")
#: Each agent's rendered objects (tools.render's file names): identity, RBAC, settings, Service, ServiceMonitor (which
#: the local cluster's prometheus-operator consumes), Deployment.
AGENT_OBJECTS = ("serviceaccount-*-{app}.yaml", "clusterrole-*:{app}.yaml", "clusterrolebinding-*:{app}.yaml",
                 "role-*-{app}*.yaml", "rolebinding-*-{app}*.yaml", "configmap-*-{app}-settings.yaml",
                 "service-*-{app}-metrics.yaml", "servicemonitor-*-{app}.yaml", "deployment-*-{app}.yaml")
figures: dict[str, Any] = {}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Layout]:
    # The local cluster runs prometheus-operator and its Prometheus on the system node (their images too).
    with nodehost.host_lock():  # held before the host is judged: another holder's nodes are not "another cluster"
        reason = why_not(("pause", GUARD, "ib-exporter", "prometheus-server", "prometheus-operator",
                          "prometheus-config-reloader"))
        if reason:
            pytest.skip(reason)
        state = private_state("gpucl-e2e")
        lay = Layout(state)
        sysctls_before = nodehost.read_sysctls()
        rules_before = {c: hostcheck.strip_counters(nodehost.iptables_dump(c)) for c in nodehost.IPTABLES}
        try:
            started = time.monotonic()
            control.up(lay, timeout=300, real_nodes=True)
            figures["cluster_up_s"] = round(time.monotonic() - started, 1)
            yield lay
        finally:
            control.down(lay, quiet=True)
            figures["host_restored"] = {
                "sysctls": nodehost.read_sysctls() == sysctls_before,
                "iptables": {c: hostcheck.strip_counters(nodehost.iptables_dump(c)) == rules_before[c]
                             for c in nodehost.IPTABLES},
            }
            FIGURES.parent.mkdir(parents=True, exist_ok=True)
            FIGURES.write_text(json.dumps(figures, indent=2, sort_keys=True))
            shutil.rmtree(state, ignore_errors=True)
    # Host hygiene: what the kubelets, kube-proxy and the bridge CNI changed is back as it was.
    assert figures["host_restored"] == {"sysctls": True, "iptables": dict.fromkeys(nodehost.IPTABLES, True)}


def _core(lay: Layout) -> Any:
    from kubernetes import client

    return client.CoreV1Api(control.api_client(lay))


def _rendered(tmp: Path) -> Path:
    out = tmp / "render"
    # As `make up REAL_NODES=1` deploys it: its DNS egress admits CoreDNS on the host.
    subprocess.run([sys.executable, "-m", "tools.render", "--stack", "local", "--real-nodes", "--out", str(out)],
                   cwd=ROOT, check=True, capture_output=True, timeout=300)
    return out / "manifests"


def _on_real_node(pod_spec: dict[str, Any], node: str) -> None:
    """What a stack running its agents on these nodes would add: the real-node toleration, and the node."""
    pod_spec.setdefault("tolerations", []).append({**REAL_NODE_TAINT, "operator": "Equal"})
    pod_spec.setdefault("nodeSelector", {})["kubernetes.io/hostname"] = node


def _local_image(image: str) -> str:
    name_tag = image.split("@", 1)[0].rsplit("/", 1)[-1]
    return f"{LOCAL_REGISTRY}/{name_tag}"


def _apply(lay: Layout, doc: dict[str, Any]) -> None:
    from kubernetes import client, utils

    if doc["apiVersion"].startswith("monitoring.coreos.com/"):  # a custom resource (a ServiceMonitor)
        group, version = doc["apiVersion"].split("/")
        try:
            client.CustomObjectsApi(control.api_client(lay)).create_namespaced_custom_object(
                group, version, doc["metadata"]["namespace"], f"{doc['kind'].lower()}s", doc)
        except client.ApiException as err:
            if err.status != 409:
                raise
        return
    try:
        utils.create_from_dict(control.api_client(lay), doc)
    except utils.FailToCreateError as err:
        if not all(isinstance(e, client.ApiException) and e.status == 409 for e in err.api_exceptions):
            raise


@pytest.fixture(scope="module")
def manifests(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _rendered(tmp_path_factory.mktemp("render"))


def _deploy_agent(lay: Layout, manifests: Path, app: str) -> dict[str, Any]:
    """The agent's rendered objects, as rendered but for the image (``make images``) and the real node."""
    deployment: dict[str, Any] = {}
    settings: dict[str, Any] = {}
    for pattern in AGENT_OBJECTS:
        for path in sorted(manifests.glob(pattern.format(app=app))):
            doc = yaml.safe_load(path.read_text())
            if doc["kind"] == "ConfigMap":
                raw = next(iter(doc["data"].values()))
                settings = json.loads(raw) if raw.lstrip().startswith("{") else yaml.safe_load(raw)
            if doc["kind"] == "Deployment":
                doc = copy.deepcopy(doc)
                spec = doc["spec"]["template"]["spec"]
                _on_real_node(spec, SYSTEM_NODE)
                for c in spec["containers"]:
                    c["image"] = _local_image(c["image"])
                    c["imagePullPolicy"] = "Never"
                deployment = doc
            _apply(lay, doc)
    assert deployment, f"no rendered Deployment for {app}"
    return {"deployment": deployment, "settings": settings}


@pytest.fixture(scope="module")
def agents(cluster: Layout, manifests: Path) -> dict[str, dict[str, Any]]:
    for pattern in FOUNDATION:
        for path in sorted(manifests.glob(pattern)):
            _apply(cluster, yaml.safe_load(path.read_text()))
    deployed = {app: _deploy_agent(cluster, manifests, app) for app in (GUARD, BURST)}
    started = time.monotonic()
    for app, d in deployed.items():
        replicas = d["deployment"]["spec"]["replicas"]
        try:
            _wait(f"{replicas} {app} pods Ready on the real system node",
                  lambda a=app, n=replicas: len(ready_pods(cluster, NS, a)) == n, 240)  # type: ignore[misc]
        except AssertionError as timed_out:
            raise AssertionError(f"{timed_out}\n{_pod_logs(cluster, app)}") from None
    figures["agents_ready_s"] = round(time.monotonic() - started, 1)
    return deployed


def _pod_logs(lay: Layout, app: str) -> str:
    """The last lines each of ``app``'s containers wrote, this run and the one before: why a pod is not Ready."""
    from kubernetes.client import ApiException

    core = _core(lay)
    out = []
    for pod in core.list_namespaced_pod(NS, label_selector=f"app.kubernetes.io/name={app}").items:
        for previous in (True, False):
            try:
                text = core.read_namespaced_pod_log(pod.metadata.name, NS, previous=previous, tail_lines=30)
            except ApiException as exc:
                text = f"(no log: {exc.reason})"
            out.append(f"--- {pod.metadata.name} {'previous' if previous else 'current'}:\n{text}")
    return "\n".join(out)


@pytest.fixture(scope="module")
def guard(agents: dict[str, dict[str, Any]]) -> dict[str, Any]:
    return agents[GUARD]


def _wait(what: str, check: Any, timeout: float) -> float:
    """:func:`tests.polling.wait`, reading an API error (a Lease not made yet) as not yet."""
    from kubernetes.client import ApiException

    return wait(what, check, timeout, ignore=(ApiException,))


def _status_fields(pid: int) -> dict[str, str]:
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        fields[key] = value.strip()
    return fields


def test_real_kubelets_registered_their_nodes_with_the_plugins_gpus(cluster: Layout) -> None:
    core = _core(cluster)
    nodes = {n.metadata.name: n for n in core.list_node().items}
    for name in (n.name for n in REAL_NODES):
        info = nodes[name].status.node_info
        assert info.kubelet_version == "v1.35.3", info
        assert info.container_runtime_version.startswith("containerd://1.6"), info
    # The GPU nodes take only pods that tolerate their pool; the stack's system node takes the system pool's pods.
    for gpu in REAL_NODES[1:]:
        # The node controller's own (node.kubernetes.io/not-ready while a node settles) are not the registration's.
        taints = [(t.key, t.value, t.effect) for t in nodes[gpu.name].spec.taints or []
                  if not t.key.startswith("node.kubernetes.io/")]
        assert [(t["key"], t["value"], t["effect"]) for t in gpu.taints] == taints, taints
        assert nodes[gpu.name].status.allocatable["nvidia.com/gpu"] == str(gpu.gpus)
        assert "type" not in (nodes[gpu.name].metadata.labels or {})  # kwok's nodes carry type=kwok
    assert not any(t.key == REAL_NODE_TAINT["key"] for t in nodes[SYSTEM_NODE].spec.taints or [])
    assert "type" not in (nodes[SYSTEM_NODE].metadata.labels or {})
    # No GPU to offer. A kubelet restarted while the GPU kubelets of the same host run reads their device manager's
    # checkpoint (a fixed host path) and lists the resource at 0; what must never happen is a GPU the system node
    # would take (``up`` and ``down`` drop the checkpoint, so a fresh node lists nothing).
    assert (nodes[SYSTEM_NODE].status.allocatable or {}).get("nvidia.com/gpu", "0") == "0"
    figures["real_nodes"] = [n.name for n in REAL_NODES]


@pytest.mark.parametrize("app", [GUARD, BURST])
def test_the_rendered_agents_run_as_their_security_context_says(cluster: Layout, agents: dict[str, Any],
                                                                app: str) -> None:
    """The kubelet applied runAsNonRoot/65532, no capabilities, RuntimeDefault seccomp, no new privileges, a
    read-only root filesystem and the projected ServiceAccount token: read from the process itself."""
    pods = ready_pods(cluster, NS, app)
    assert {p.spec.node_name for p in pods} == {SYSTEM_NODE}
    figures.setdefault("agent_pods_running", []).extend(sorted(p.metadata.name for p in pods))
    for pod in pods:
        cid = pod.status.container_statuses[0].container_id
        pid = container_pid(cluster, SYSTEM_NODE, cid)
        status = _status_fields(pid)
        assert status["Uid"].split()[:2] == ["65532", "65532"], status["Uid"]
        assert status["Gid"].split()[0] == "65532"
        assert int(status["CapEff"], 16) == 0 and int(status["CapBnd"], 16) == 0
        assert status["NoNewPrivs"] == "1"
        assert status["Seccomp"] == "2"  # filter mode: the runtime's default profile
        root = next(line for line in Path(f"/proc/{pid}/mountinfo").read_text().splitlines()
                    if line.split()[4] == "/")
        assert "ro" in root.split()[5].split(","), root
        # The kubelet's projected token, where the container sees /var/run/secrets (a link to /run in Debian).
        mounts = [line.split()[4] for line in Path(f"/proc/{pid}/mountinfo").read_text().splitlines()]
        token_dir = next(m for m in mounts if m.endswith("/secrets/kubernetes.io/serviceaccount"))
        token = Path(f"/proc/{pid}/root{token_dir}/token")
        assert token.read_text().count(".") == 2  # a JWT


@pytest.mark.parametrize("app", [GUARD, BURST])
def test_each_agent_reaches_the_api_server_and_holds_its_lease(cluster: Layout, agents: dict[str, Any],
                                                               app: str) -> None:
    """In a real pod, through the ``kubernetes`` Service (kube-proxy) with its own token and RBAC."""
    names = {p.metadata.name for p in ready_pods(cluster, NS, app)}
    lease = agents[app]["settings"]["lease_name"]
    _wait(f"one {app} pod holding the Lease {lease}", lambda: lease_holder(cluster, NS, lease) in names, 90)


@pytest.mark.parametrize("app", [GUARD, BURST])
def test_the_standby_takes_over_when_the_leader_pod_is_deleted(cluster: Layout, agents: dict[str, Any],
                                                               app: str) -> None:
    assert len(ready_pods(cluster, NS, app)) == 2, "a leader and one standby"
    _, _, failover = delete_the_leader(cluster, NS, app, agents[app]["settings"])
    figures.setdefault("leader_failover_s", {})[app] = failover


def test_a_frozen_guard_is_restarted_by_the_kubelets_liveness_probe(cluster: Layout, guard: dict[str, Any]) -> None:
    probe = guard["deployment"]["spec"]["template"]["spec"]["containers"][0]["livenessProbe"]
    budget = probe.get("periodSeconds", 10) * probe.get("failureThreshold", 3) + probe.get("timeoutSeconds", 1)
    _wait("two guards Ready again", lambda: len(ready_pods(cluster, NS, GUARD)) == 2, 180)
    pod = ready_pods(cluster, NS, GUARD)[0]
    before = pod.status.container_statuses[0].restart_count
    pid = container_pid(cluster, SYSTEM_NODE, pod.status.container_statuses[0].container_id)
    started = time.monotonic()
    os.kill(pid, signal.SIGSTOP)

    def restarted() -> bool:
        p = _core(cluster).read_namespaced_pod(pod.metadata.name, NS)
        return bool(p.status.container_statuses[0].restart_count > before)

    _wait(f"the kubelet restarting the frozen guard (probe budget {budget}s)", restarted, budget + 60)
    figures["liveness_restart_s"] = round(time.monotonic() - started, 1)
    figures["liveness_budget_s"] = budget
    assert figures["liveness_restart_s"] <= budget + probe.get("periodSeconds", 10) + 15


def _restricted(container: dict[str, Any]) -> dict[str, Any]:
    """A container that passes the ``restricted`` Pod Security level."""
    return {**container, "securityContext": {
        "runAsNonRoot": True, "runAsUser": 65532, "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]}, "seccompProfile": {"type": "RuntimeDefault"}}}


def test_the_operators_prometheus_scrapes_every_agent_pod_through_the_stacks_policies(
        cluster: Layout, agents: dict[str, Any]) -> None:
    """The agents' ServiceMonitors as the stack renders them, consumed by the local cluster's prometheus-operator: the
    Prometheus it runs in the monitoring namespace scrapes every Ready agent pod, under the stack's default-deny, with
    the configuration the operator generated (its jobs are named after the monitors)."""
    from kubernetes.client import ApiException

    if "kube-router" not in {p.name for p in control.recorded(cluster) if p.alive()}:
        pytest.skip("kube-router not built here: the NetworkPolicies are not enforced")

    def scraped() -> dict[str, list[str]]:
        active = prometheus_get(cluster, "monitoring", "/api/v1/targets", state="active")["activeTargets"]
        out: dict[str, list[str]] = {}
        for app in (GUARD, BURST):
            want = {p.status.pod_ip for p in ready_pods(cluster, NS, app)}
            up = {t["labels"]["instance"].rsplit(":", 1)[0] for t in active
                  if t["scrapePool"] == f"serviceMonitor/{NS}/{app}/0" and t["health"] == "up"}
            if not want or not want <= up:
                return {}
            out[app] = sorted(want)
        return out

    started = time.monotonic()
    wait("the operator's Prometheus scraping every agent pod", scraped, 300, ignore=(OSError, ApiException))
    figures["prometheus_scrapes_agents_s"] = round(time.monotonic() - started, 1)


#: How long a client keeps trying: the policy engine learns a new pod's address from its watch, so a pod's first
#: connections may come before its rules exist (as in production, for a freshly started Prometheus).
FLOW_WINDOW_S = 20
#: How long a client waits before its first try. kube-router is no CNI: until its next sync (about a second here) a
#: new pod has no chains, and its egress is not policed at all (measured: a default-deny pod connected at 0.0 s).
FLOW_SETTLE_S = 5
_CONNECT = ("import socket,sys,time\n"
            "host,port,window,settle=sys.argv[1],int(sys.argv[2]),float(sys.argv[3]),float(sys.argv[4])\n"
            "time.sleep(settle); start=time.monotonic()\n"
            "while time.monotonic()-start<window:\n"
            " try:\n  socket.create_connection((host,port),2).close(); print(round(time.monotonic()-start,1)); "
            "sys.exit(0)\n"
            " except OSError:\n  time.sleep(1)\n"
            "sys.exit(3)\n")
_LISTEN = ("import socket\ns=socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
           "s.bind(('0.0.0.0', 8080)); s.listen(64)\nwhile True: s.accept()[0].close()\n")
#: The real nodes' images a flow pod may use (tools/localcluster/realnodes.IMAGES_BY_KIND): both have python3.
_NODE_IMAGE = {SYSTEM_NODE: GUARD, GPU_NODE: "ib-exporter"}


def _client_pod(name: str, ns: str, labels: dict[str, str], command: list[str], restart: str = "Never",
                node: str = SYSTEM_NODE, ports: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """A pod of ours on a real node (every real node's pods are policed), passing the ``restricted`` level."""
    (real,) = [n for n in REAL_NODES if n.name == node]
    tolerations = [{**t, "operator": "Equal"} for t in (*real.taints, REAL_NODE_TAINT)]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": ns, "labels": labels},
            "spec": {"restartPolicy": restart, "automountServiceAccountToken": False, "tolerations": tolerations,
                     "nodeSelector": {"kubernetes.io/hostname": node},
                     "containers": [_restricted({
                         "name": "main", "image": f"{LOCAL_REGISTRY}/{_NODE_IMAGE[node]}:0.1.0",
                         "imagePullPolicy": "Never", "command": command, "ports": ports or [],
                         "resources": {"limits": {"cpu": "100m", "memory": "64Mi"}}})]}}


def _flows(lay: Layout, flows: list[tuple[str, str, dict[str, str], str, int, str]]) -> dict[str, float | None]:
    """Each flow's client started at once on its node; the seconds to its first connection, or None when none got
    through."""
    core = _core(lay)
    for name, ns, labels, host, port, node in flows:
        _apply(lay, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
        core.create_namespaced_pod(ns, _client_pod(name, ns, labels, ["python3", "-c", _CONNECT, host, str(port),
                                                                      str(FLOW_WINDOW_S), str(FLOW_SETTLE_S)],
                                                   node=node))
    out: dict[str, float | None] = {}
    for name, ns, *_ in flows:
        _wait(f"flow {name} to finish", lambda n=name, s=ns: core.read_namespaced_pod(n, s).status.phase in (
            "Succeeded", "Failed"), FLOW_WINDOW_S + FLOW_SETTLE_S + 90)  # type: ignore[misc]
        ok = core.read_namespaced_pod(name, ns).status.phase == "Succeeded"
        out[name] = float(core.read_namespaced_pod_log(name, ns).strip()) if ok else None
    return out


def test_network_policies_allow_what_they_promise_and_block_the_rest(cluster: Layout,
                                                                     agents: dict[str, Any]) -> None:
    """The stack's policies on kube-router's firewall: each flow expected and observed, both ways.

    The controllers reaching the API server under default-deny is what the Lease tests above show. Egress is
    judged against a listener pod in a namespace without policies: the API server runs on this very host, and
    traffic from a pod to its own node is not what an egress policy governs.
    """
    if "kube-router" not in {p.name for p in control.recorded(cluster) if p.alive()}:
        pytest.skip("kube-router not built here: the NetworkPolicies are not enforced")
    core = _core(cluster)
    core.create_namespaced_pod("default", _client_pod("listener", "default", {"app": "listener"},
                                                      ["python3", "-c", _LISTEN], restart="Always"))
    # An exporter's stand-in on the GPU node: a listener on a port named as the exporters' scrape port.
    _apply(cluster, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "gpu-telemetry"}})
    core.create_namespaced_pod("gpu-telemetry", _client_pod(
        "exporter-listener", "gpu-telemetry", {"app.kubernetes.io/name": "ib-exporter", "flow": "listener"},
        ["python3", "-c", _LISTEN], restart="Always", node=GPU_NODE,
        ports=[{"name": "metrics", "containerPort": 8080}]))
    _wait("the listener pod running", lambda: core.read_namespaced_pod("listener", "default").status.pod_ip, 60)
    _wait("the GPU node's listener pod running",
          lambda: core.read_namespaced_pod("exporter-listener", "gpu-telemetry").status.pod_ip, 60)
    listener = core.read_namespaced_pod("listener", "default").status.pod_ip
    exporter = core.read_namespaced_pod("exporter-listener", "gpu-telemetry").status.pod_ip
    guard_ip = ready_pods(cluster, NS, GUARD)[0].status.pod_ip
    burst_ip = ready_pods(cluster, NS, BURST)[0].status.pod_ip
    prometheus = {"app.kubernetes.io/name": "prometheus"}
    outsider = {"app": "curious"}
    inference = {"gpucluster.io/service": "sdxl-turbo"}
    exporter_labels = {"app.kubernetes.io/name": "ib-exporter"}
    sys_, gpu = SYSTEM_NODE, GPU_NODE
    flows = [  # name, namespace, labels, target, port, client's node, expected to connect
        ("monitoring-to-guard-metrics", "monitoring", prometheus, guard_ip, 9316, sys_, True),
        ("monitoring-to-burst-metrics", "monitoring", prometheus, burst_ip, 9102, sys_, True),
        ("outsider-to-guard-metrics", "default", outsider, guard_ip, 9316, sys_, False),
        ("outsider-to-burst-metrics", "default", outsider, burst_ip, 9102, sys_, False),
        ("inference-to-guard-metrics", "inference", inference, guard_ip, 9316, sys_, False),
        ("inference-to-burst-metrics", "inference", inference, burst_ip, 9102, sys_, False),
        ("exporter-egress", "gpu-telemetry", exporter_labels, listener, 8080, sys_, False),
        ("unnamed-system-pod-egress", NS, {"app.kubernetes.io/name": "stray"}, listener, 8080, sys_, False),
        ("outsider-egress", "default", outsider | {"flow": "egress"}, listener, 8080, sys_, True),
        # The GPU node's pods are policed too: its exporter is scraped from monitoring only and has no egress;
        # an inference replica there cannot reach the agents' metrics; an unpoliced pod there still gets out.
        ("monitoring-to-gpu-node-exporter", "monitoring", prometheus, exporter, 8080, sys_, True),
        ("outsider-to-gpu-node-exporter", "default", outsider, exporter, 8080, sys_, False),
        ("gpu-node-exporter-egress", "gpu-telemetry", exporter_labels, listener, 8080, gpu, False),
        ("gpu-node-inference-to-guard-metrics", "inference", inference, guard_ip, 9316, gpu, False),
        ("gpu-node-outsider-egress", "default", outsider | {"flow": "egress"}, listener, 8080, gpu, True),
    ]
    observed = _flows(cluster, [f[:6] for f in flows])
    table = [{"flow": name, "expected": "allowed" if want else "denied",
              "observed": "denied" if observed[name] is None else f"allowed after {observed[name]}s"}
             for name, *_, want in flows]
    figures["netpol_flows_allowed"] = [row for row in table if row["expected"] == "allowed"]
    figures["netpol_flows_denied"] = [row for row in table if row["expected"] == "denied"]
    wrong = [row for row, (*_, want) in zip(table, flows, strict=True) if (observed[row["flow"]] is not None) != want]
    assert wrong == []


# The first try waits out kube-router's sync of a new pod (FLOW_SETTLE_S), as the flows do: resolving at once would
# slip through before the pod's chains exist and prove nothing.
_RESOLVE = ("import socket,sys,time\n"
            "time.sleep(float(sys.argv[1])); del sys.argv[1]\n"
            "deadline=time.monotonic()+30\n"
            "while True:\n"
            " try:\n  print(' '.join(socket.gethostbyname(n) for n in sys.argv[1:])); sys.exit(0)\n"
            " except OSError as e:\n"
            "  if time.monotonic()>deadline: print(e); sys.exit(3)\n"
            "  time.sleep(1)\n")


def test_cluster_dns_resolves_services_for_the_agents(cluster: Layout, agents: dict[str, Any]) -> None:
    """A pod labelled as the burst controller, under the stack's policies, resolves the API server's Service by its
    full name and an agent's Service by the short name its namespace's search path completes (CoreDNS on the host)."""
    if "coredns" not in {p.name for p in control.recorded(cluster) if p.alive()}:
        pytest.skip("coredns not built here: cluster names do not resolve in pods")
    core = _core(cluster)
    want = [core.read_namespaced_service("kubernetes", "default").spec.cluster_ip,
            core.read_namespaced_service(f"{GUARD}-metrics", NS).spec.cluster_ip]
    pod = _client_pod("dns-client", NS, {"app.kubernetes.io/name": BURST},
                      ["python3", "-c", _RESOLVE, str(FLOW_SETTLE_S), "kubernetes.default.svc.cluster.local",
                       f"{GUARD}-metrics"])
    started = time.monotonic()
    core.create_namespaced_pod(NS, pod)
    _wait("the DNS client to finish", lambda: core.read_namespaced_pod("dns-client", NS).status.phase in (
        "Succeeded", "Failed"), 90)
    log = core.read_namespaced_pod_log("dns-client", NS).strip()
    figures["dns_resolved_s"] = round(time.monotonic() - started, 1)
    assert core.read_namespaced_pod("dns-client", NS).status.phase == "Succeeded", log
    assert log.split() == want, log


def test_a_gpu_pod_gets_the_devices_the_plugin_granted(cluster: Layout) -> None:
    core = _core(cluster)
    ns = "real-gpu-test"
    _apply(cluster, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    pod = {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "gpu-env", "namespace": ns},
        "spec": {
            "restartPolicy": "Never",
            "tolerations": [{**t, "operator": "Equal"} for t in REAL_NODES[1].taints],
            "nodeSelector": {"kubernetes.io/hostname": GPU_NODE},
            "containers": [_restricted({
                "name": "env", "image": f"{LOCAL_REGISTRY}/ib-exporter:0.1.0", "imagePullPolicy": "Never",
                "command": ["python3", "-c", "import os; print(os.environ['NVIDIA_VISIBLE_DEVICES'])"],
                "resources": {"limits": {"nvidia.com/gpu": "2", "cpu": "100m", "memory": "64Mi"}},
            })],
        },
    }
    core.create_namespaced_pod(ns, pod)
    _wait("the GPU pod to finish", lambda: core.read_namespaced_pod("gpu-env", ns).status.phase == "Succeeded",
          120)
    devices = core.read_namespaced_pod_log("gpu-env", ns).strip().split(",")
    assert len(devices) == 2 and all(d.startswith(f"{GPU_NODE}-gpu-") for d in devices), devices
