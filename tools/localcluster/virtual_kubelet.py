"""The stack's external providers as real virtual-kubelets: local processes with the provider's own RBAC.

For every provider of the stack, once its Deployment exists (the stack creates it only after the
ServiceAccount and every grant, see ``SystemAgent.deploy``) and the API server authorises what the binary
does first (SubjectAccessReview), the Deployment's container runs as a local process
(``plan.virtual_kubelet_process``): the pinned upstream virtual-kubelet with its ``mock`` provider, the
stack's flags and taint variables, the stack's capacity ConfigMap translated for the mock, and a
kubeconfig holding a token of the provider's ServiceAccount (TokenRequest), never the admin certificate.
It registers its node itself; the stack's ``NodePatch`` labels it afterwards. Their pods stay kwok fakes
on the system node and do nothing.

The stack's ``NodePatch`` is a server-side apply, which would create a missing node with labels only (no
provider taint); :func:`running_during` therefore starts each virtual kubelet while ``pulumi up`` runs, as
soon as its grants exist, and checks afterwards that every node was registered with its provider taint.
"""

from __future__ import annotations

import contextlib
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from agents import serving_cert
from tools.localcluster import control
from tools.localcluster.plan import (
    VIRTUAL_KUBELET,
    Layout,
    VirtualKubeletFiles,
    check_mock_provider_config,
    load_stack_config,
    required_grants,
    serving_cert_process,
    virtual_kubelet_process,
)
from tools.localcluster.rbac_usage import Grant, grants_from_rules

#: How long the token of a local virtual kubelet lasts; ``make down && make up`` (or a restart) mints a new one.
TOKEN_SECONDS = 24 * 3600
NODE_LEASE_NAMESPACE = "kube-node-lease"


@dataclass(frozen=True)
class Target:
    """One provider of the stack: where its Deployment and ServiceAccount are and the node it registers."""

    provider: str
    node: str
    namespace: str
    app: str
    workload_namespaces: tuple[str, ...]

    @property
    def process(self) -> str:
        return f"{VIRTUAL_KUBELET}-{self.provider}"

    @property
    def user(self) -> str:
        return f"system:serviceaccount:{self.namespace}:{self.app}"


def targets(cfg: Any) -> list[Target]:
    """Every provider of a validated ``ClusterConfig``."""
    from components.providers import ExternalGpuProviderArgs, app_name

    out = []
    for p in cfg.providers:
        args = ExternalGpuProviderArgs.from_config(cfg, p)
        out.append(Target(p.name, p.node_name, args.placement.namespace, app_name(p), args.workload_namespaces))
    return out


def stack_targets(stack: str) -> list[Target]:
    cfg = load_stack_config(control.ROOT, stack)
    return targets(cfg) if cfg is not None else []


def _apis(lay: Layout) -> tuple[Any, Any, Any]:
    from kubernetes import client

    api = control.api_client(lay)
    return client.CoreV1Api(api), client.AppsV1Api(api), api


def _deployment(lay: Layout, t: Target) -> dict[str, Any] | None:
    from kubernetes.client import ApiException

    _, apps, api = _apis(lay)
    try:
        dep = apps.read_namespaced_deployment(t.app, t.namespace)
    except ApiException as err:
        if err.status == 404:
            return None
        raise
    out: dict[str, Any] = api.sanitize_for_serialization(dep)
    return out


def grants_in_place(lay: Layout, t: Target) -> bool:
    """Whether the API server already authorises what the virtual kubelet does first (its RBAC exists)."""
    from kubernetes import client

    authz: Any = client.AuthorizationV1Api(control.api_client(lay))
    groups = ["system:serviceaccounts", f"system:serviceaccounts:{t.namespace}", "system:authenticated"]
    for attrs in required_grants(t.workload_namespaces, t.node):
        review = authz.create_subject_access_review({
            "apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
            "spec": {"user": t.user, "groups": groups, "resourceAttributes": attrs}})
        if not review.status.allowed:
            return False
    return True


def _capacity(lay: Layout, dep: dict[str, Any], container: dict[str, Any]) -> str:
    """The capacity file the container's ``--provider-config`` names, from the ConfigMap mounted there."""
    path = next((a.split("=", 1)[1] for a in container.get("args") or () if a.startswith("--provider-config=")), None)
    if path is None:
        raise control.ClusterError(f"{dep['metadata']['name']}: no --provider-config in the container's args")
    mount = next((m for m in container.get("volumeMounts") or () if m.get("mountPath") == path), None)
    volumes = {v["name"]: v for v in dep["spec"]["template"]["spec"].get("volumes") or ()}
    source = (volumes.get(mount["name"]) or {}).get("configMap") if mount else None
    if not mount or not source or not mount.get("subPath"):
        raise control.ClusterError(f"{dep['metadata']['name']}: {path} is not a ConfigMap key mounted with subPath")
    core, _, _ = _apis(lay)
    cm = core.read_namespaced_config_map(source["name"], dep["metadata"]["namespace"])
    value = (cm.data or {}).get(mount["subPath"])
    if value is None:
        raise control.ClusterError(f"ConfigMap {source['name']} has no key {mount['subPath']}")
    return str(value)


def _token(lay: Layout, t: Target, account: str) -> str:
    core, _, _ = _apis(lay)
    review = core.create_namespaced_service_account_token(account, t.namespace, {
        "apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
        "spec": {"expirationSeconds": TOKEN_SECONDS}})
    return str(review.status.token)


def _kubeconfig(server: str, ca: Path, token: str, user: str) -> str:
    return yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "localcluster", "cluster": {"server": server, "certificate-authority": str(ca)}}],
        "users": [{"name": user, "user": {"token": token}}],
        "contexts": [{"name": "provider", "context": {"cluster": "localcluster", "user": user}}],
        "current-context": "provider",
    }, sort_keys=False)


def launch(lay: Layout, t: Target, dep: dict[str, Any]) -> control.Proc:
    """Run the Deployment's container as ``virtual-kubelet-<provider>`` with a token of its ServiceAccount."""
    ports = control.load_ports(lay)
    if ports is None:
        raise control.ClusterError("the control plane is not up (no run/ports.yaml)")
    if not (lay.bin / VIRTUAL_KUBELET).exists():
        raise control.ClusterError(f"{VIRTUAL_KUBELET} is not built in {lay.bin}; run `make localcluster`")
    pod = dep["spec"]["template"]["spec"]
    container = pod["containers"][0]
    account = pod.get("serviceAccountName") or "default"
    home = lay.virtual_kubelet(t.provider)
    home.mkdir(parents=True, exist_ok=True)
    home.chmod(0o700)
    serving = home / "serving"
    files = VirtualKubeletFiles(home / "kubeconfig", home / "provider.json", serving / serving_cert.CERT_FILE,
                                serving / serving_cert.KEY_FILE, lay.pki / "ca.crt")
    try:
        config = check_mock_provider_config(_capacity(lay, dep, container), f"{t.app} capacity file")
        extra = control.free_ports(["kubelet", "metrics"])
        argv, env = virtual_kubelet_process(lay.bin, container, f"{t.app}-local", t.namespace, files,
                                            extra["kubelet"], extra["metrics"])
        make_cert = serving_cert_process(pod.get("initContainers") or (), t.namespace, serving)
    except ValueError as err:
        raise control.ClusterError(str(err)) from None
    # What the pod's init container does at each start: a new key pair, in a directory only we can read.
    serving.mkdir(mode=0o700, exist_ok=True)
    made = subprocess.run(make_cert, cwd=control.ROOT, capture_output=True, text=True, check=False)
    if made.returncode != 0:
        raise control.ClusterError(f"{t.app}: the serving-cert init container failed: {made.stderr.strip()}")
    files.provider_config.write_text(config)
    files.kubeconfig.write_text(_kubeconfig(f"https://127.0.0.1:{ports['apiserver']}", files.ca_cert,
                                            _token(lay, t, account), t.user))
    files.kubeconfig.chmod(0o600)
    return control.start_process(lay, t.process, argv, env=env)


def start_ready(lay: Layout, ts: list[Target]) -> list[str]:
    """Start every virtual kubelet whose Deployment and grants exist and that is not running; their names."""
    started = []
    for t in ts:
        proc = control.load_proc(lay, t.process)
        if proc is not None and proc.alive():
            continue
        dep = _deployment(lay, t)
        if dep is None or not grants_in_place(lay, t):
            continue
        launch(lay, t, dep)
        started.append(t.process)
    return started


def _provider_taint(dep: dict[str, Any]) -> tuple[str, str]:
    env = {e["name"]: e.get("value") for e in dep["spec"]["template"]["spec"]["containers"][0].get("env") or ()}
    return str(env.get("VKUBELET_TAINT_KEY")), str(env.get("VKUBELET_TAINT_VALUE"))


def check_registered(lay: Layout, ts: list[Target], timeout: float = 60.0) -> None:
    """Every provider's node Ready. A node without its provider taint was created before its virtual kubelet
    registered it (the stack's NodePatch creates a missing node, and a virtual kubelet taints only a node it
    creates): said here, and restored by the burst controller (``provider_taints``) once it runs."""
    from kubernetes.client import ApiException

    core, _, _ = _apis(lay)
    for t in ts:
        dep = _deployment(lay, t)
        if dep is None:
            raise control.ClusterError(f"the stack deployed no {t.app} in {t.namespace}: nothing to run for {t.node}")
        key, value = _provider_taint(dep)

        def ready(t: Target = t) -> bool:
            try:
                node = core.read_node(t.node)
            except ApiException as err:
                if err.status == 404:
                    return False
                raise
            return any(c.type == "Ready" and c.status == "True" for c in node.status.conditions or [])

        control.wait_for(f"{t.node} registered and Ready", ready, timeout, control.load_proc(lay, t.process))
        if (key, value) not in {(x.key, x.value) for x in core.read_node(t.node).spec.taints or []}:
            print(f"virtual-kubelet: {t.node} was created before its virtual kubelet registered it and lacks "
                  f"{key}={value}; the burst controller adds it when it starts")


@contextlib.contextmanager
def running_during(lay: Layout, stack: str, poll: float = 0.25) -> Iterator[None]:
    """Start the stack's virtual kubelets while the body (``pulumi up``) runs, as soon as each can start.

    On a normal exit every provider's node must be registered (``check_registered``); when the body fails,
    what could start is started and the error is the body's.
    """
    ts = stack_targets(stack)
    stop = threading.Event()
    errors: list[BaseException] = []

    def loop() -> None:
        while not stop.is_set():
            try:
                start_ready(lay, ts)
            except control.ClusterError as err:
                errors.append(err)
                return
            except Exception:  # the API may not serve the stack's objects yet; try again
                pass
            stop.wait(poll)

    thread = threading.Thread(target=loop, name="virtual-kubelets", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(10)
    if errors:
        raise errors[0]
    start_ready(lay, ts)
    check_registered(lay, ts)


def restart(lay: Layout, t: Target, timeout: float = 60.0) -> float:
    """Stop the provider's virtual kubelet and start it again (a new token); seconds until it renewed its
    node lease again, which it does only once registered and ready."""
    from kubernetes import client

    proc = control.load_proc(lay, t.process)
    if proc is None:
        raise control.ClusterError(f"{t.process} is not running")
    started = time.monotonic()
    control.stop_process(lay, proc)
    dep = _deployment(lay, t)
    if dep is None:
        raise control.ClusterError(f"{t.app} is gone from {t.namespace}")
    after = time.time()
    new = launch(lay, t, dep)
    leases: Any = client.CoordinationV1Api(control.api_client(lay))

    def renewed() -> bool:
        lease = leases.read_namespaced_lease(t.node, NODE_LEASE_NAMESPACE)
        return bool(lease.spec.renew_time and lease.spec.renew_time.timestamp() > after)

    control.wait_for(f"{t.node}'s lease renewed after the restart", renewed, timeout, new)
    return time.monotonic() - started


def granted(lay: Layout, t: Target) -> list[Grant]:
    """Every grant of the cluster bound directly to the provider's ServiceAccount (live objects)."""
    from kubernetes import client

    rbac: Any = client.RbacAuthorizationV1Api(control.api_client(lay))

    def bound(binding: Any) -> bool:
        return any(s.kind == "ServiceAccount" and s.name == t.app and s.namespace == t.namespace
                   for s in binding.subjects or [])

    def rules(kind: str, name: str, namespace: str | None) -> list[dict[str, Any]]:
        role = (rbac.read_cluster_role(name) if kind == "ClusterRole"
                else rbac.read_namespaced_role(name, namespace))
        out: list[dict[str, Any]] = control.api_client(lay).sanitize_for_serialization(role).get("rules") or []
        return out

    out: list[Grant] = []
    for cb in rbac.list_cluster_role_binding().items:
        if bound(cb):
            name = cb.role_ref.name
            out += grants_from_rules(f"ClusterRole {name}", None, rules("ClusterRole", name, None))
    for rb in rbac.list_role_binding_for_all_namespaces().items:
        if bound(rb):
            ns = rb.metadata.namespace
            out += grants_from_rules(f"{rb.role_ref.kind} {rb.role_ref.name} in {ns}", ns,
                                     rules(rb.role_ref.kind, rb.role_ref.name, ns))
    return out
