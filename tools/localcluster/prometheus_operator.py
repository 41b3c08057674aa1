"""prometheus-operator for the real nodes' pods, as a production cluster runs it beside the stack.

With real nodes the stack's exporters and agents run for real, so the stack's ServiceMonitors, PodMonitors and
PrometheusRules are consumed as production consumes them: prometheus-operator (the pinned release, built from its Go
module by build.sh, in an image ``make images`` packs) runs as a Deployment in the stack's monitoring namespace on the
real system node, and a ``Prometheus`` resource there selects the stack's monitors and rules by the stack's
``monitorLabels`` in every namespace. The operator generates the scrape configuration and the rule files, and runs
Prometheus (the pinned module's build, ``spec.version`` saying which) as a StatefulSet with its config reloader,
behind its governing Service ``prometheus-operated``: the stack's default ``prometheusUrl``. So the health guard
reaches it through cluster DNS, a Service and the stack's NetworkPolicies, and the stack's alert rules are evaluated.

Least privilege: the operator watches Prometheus resources, and manages what they need (StatefulSets, Secrets,
ConfigMaps, the Service), in the monitoring namespace only (a Role there); cluster-wide it reads the monitors, rules
and namespaces it selects, and writes events about them. Prometheus reads what its service discovery needs. No rule
has a wildcard. Every pod passes the ``restricted`` Pod Security level the stack gives that namespace.

Both run at the stack's system priority (``priorities.system``), as the agents that read them do: a pod of a lower
class on a full system node is what the scheduler preempts to place a platform pod. At the pod's default priority,
Prometheus was preempted by the descheduler's CronJob pod every minute (the local system node has two cores), came
back with an empty TSDB, and the health guard, seeing every query fail or every series stale, never let a node's
probation run out: the "new guard leader cannot resolve Prometheus" of earlier rounds, a headless Service with no
ready pod answering NXDOMAIN.

The monitoring namespace and the priority class are the stack's (``pulumi up`` creates them), so ``up`` starts a
process that waits for both, applies these objects once and exits (its log says what it did). kwok's pods have
no real address: their targets are down, as an unreachable target is in production.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from components.pins import PROMETHEUS_OPERATOR
from tools.image_local import PROMETHEUS_CONFIG_RELOADER_IMAGE, PROMETHEUS_IMAGE, PROMETHEUS_OPERATOR_IMAGE

PORT = 9090
#: The Prometheus resource; the operator names its StatefulSet ``prometheus-<NAME>`` and its pods after it.
NAME = "local"
#: The governing Service prometheus-operator makes for every Prometheus, which the stack's prometheusUrl names.
SERVICE = "prometheus-operated"
OPERATOR = "prometheus-operator"
#: Prometheus's own ServiceAccount (service discovery).
PROMETHEUS_ACCOUNT = "prometheus"
#: The Prometheus the image holds (its tag), as the operator wants it in ``spec.version``: it generates only the
#: arguments and configuration that version understands. The release the operator is built on and defaults to.
PROMETHEUS_VERSION = PROMETHEUS_IMAGE.rsplit(":", 1)[1]
#: The CRDs only the operator needs (build.sh copies them from the pinned module); the three the stack declares
#: (ServiceMonitor, PodMonitor, PrometheusRule) are installed in every local cluster.
CRD_DIR = "prometheus-operator"
GROUP = "monitoring.coreos.com"
OPERATOR_LABELS = {"app.kubernetes.io/name": OPERATOR, "app.kubernetes.io/component": "controller"}
USER = 65534


def _rule(groups: Sequence[str], resources: Sequence[str], verbs: Sequence[str]) -> dict[str, Any]:
    return {"apiGroups": list(groups), "resources": list(resources), "verbs": list(verbs)}


READ = ("get", "list", "watch")
MANAGE = ("get", "list", "watch", "create", "update", "delete")


def operator_cluster_rules() -> list[dict[str, Any]]:
    """What the operator does in every namespace: read the monitors and rules a Prometheus selects and the namespaces
    its namespace selectors match, and report on them in events (a rejected monitor's event goes to its namespace;
    the operator checks this grant cluster-wide at start and emits no event at all without it). No StorageClass
    read: it only validates a storage spec, and this Prometheus has none (the operator warns once)."""
    return [
        _rule([GROUP], ["servicemonitors", "podmonitors", "probes", "prometheusrules"], READ),
        _rule([""], ["namespaces"], READ),
        _rule([""], ["events"], ("create", "patch")),
    ]


def operator_namespace_rules() -> list[dict[str, Any]]:
    """What the operator does in the monitoring namespace, where the Prometheus resource lives (its
    ``--prometheus-instance-namespaces``)."""
    return [
        _rule([GROUP], ["prometheuses"], READ),
        # The status is written by server-side apply (patch); the operator's start-up check asks for update.
        _rule([GROUP], ["prometheuses/status"], ("update", "patch")),
        _rule(["apps"], ["statefulsets"], MANAGE),
        # The generated configuration (Secrets) and rule files (ConfigMaps).
        _rule([""], ["configmaps", "secrets"], MANAGE),
        # The governing Service.
        _rule([""], ["services"], ("get", "create", "update", "delete")),
        # Its status reporter counts the StatefulSet's pods.
        _rule([""], ["pods"], ("list",)),
    ]


def prometheus_cluster_rules() -> list[dict[str, Any]]:
    """What Prometheus's service discovery reads: Endpoints and the Services and pods behind them (ServiceMonitors:
    the operator's default ``serviceDiscoveryRole``, Endpoints), pods (PodMonitors)."""
    return [
        _rule([""], ["services", "endpoints", "pods"], READ),
    ]


def _pod_security() -> dict[str, Any]:
    return {"runAsNonRoot": True, "runAsUser": USER, "runAsGroup": USER, "fsGroup": USER,
            "seccompProfile": {"type": "RuntimeDefault"}}


def _container_security() -> dict[str, Any]:
    return {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True, "capabilities": {"drop": ["ALL"]}}


def _selector(labels: Mapping[str, str]) -> dict[str, Any]:
    """A label selector: the stack's ``monitorLabels``; none selects every object (``{}``)."""
    return {"matchLabels": dict(labels)} if labels else {}


def prometheus_resource(namespace: str, node: str, selector: Mapping[str, str], priority_class: str,
                        evaluation_interval: str = "5s") -> dict[str, Any]:
    """The Prometheus resource: the stack's monitors and rules (by ``selector``) in every namespace, on ``node``, with
    the local image and the version it holds; restricted Pod Security (the operator's containers drop everything and
    run read-only; the pod's context comes from here)."""
    return {
        "apiVersion": f"{GROUP}/v1", "kind": "Prometheus",
        "metadata": {"name": NAME, "namespace": namespace},
        "spec": {
            "version": PROMETHEUS_VERSION, "image": PROMETHEUS_IMAGE, "imagePullPolicy": "Never", "replicas": 1,
            "serviceAccountName": PROMETHEUS_ACCOUNT,
            "serviceMonitorSelector": _selector(selector), "serviceMonitorNamespaceSelector": {},
            "podMonitorSelector": _selector(selector), "podMonitorNamespaceSelector": {},
            "ruleSelector": _selector(selector), "ruleNamespaceSelector": {},
            "evaluationInterval": evaluation_interval, "retention": "1d",
            "nodeSelector": {"kubernetes.io/hostname": node}, "priorityClassName": priority_class,
            "securityContext": _pod_security(),
            "resources": {"requests": {"cpu": "100m", "memory": "256Mi"}, "limits": {"memory": "1Gi"}},
        },
    }


def operator_deployment(namespace: str, node: str, priority_class: str) -> dict[str, Any]:
    args = [f"--prometheus-config-reloader={PROMETHEUS_CONFIG_RELOADER_IMAGE}",
            # Prometheus resources, and what the operator makes for them, only in the monitoring namespace (its Role);
            # the monitors and rules they select anywhere.
            f"--prometheus-instance-namespaces={namespace}",
            "--log-level=info"]
    return {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": OPERATOR, "namespace": namespace, "labels": OPERATOR_LABELS},
        "spec": {"replicas": 1, "selector": {"matchLabels": OPERATOR_LABELS}, "template": {
            "metadata": {"labels": OPERATOR_LABELS},
            "spec": {
                "serviceAccountName": OPERATOR, "nodeSelector": {"kubernetes.io/hostname": node},
                "priorityClassName": priority_class,
                "securityContext": _pod_security(),
                "containers": [{
                    "name": OPERATOR, "image": PROMETHEUS_OPERATOR_IMAGE, "imagePullPolicy": "Never", "args": args,
                    "ports": [{"name": "http", "containerPort": 8080}],
                    "readinessProbe": {"httpGet": {"path": "/healthz", "port": "http"}, "periodSeconds": 5},
                    "resources": {"requests": {"cpu": "50m", "memory": "64Mi"}, "limits": {"memory": "256Mi"}},
                    "securityContext": _container_security(),
                }],
            }}},
    }


def manifests(namespace: str, node: str, selector: Mapping[str, str], priority_class: str) -> list[dict[str, Any]]:
    """Everything in dependency order (pure): the operator's identity and grants, its Deployment, Prometheus's
    identity and grants, the Prometheus resource."""
    cluster_role = f"localcluster:{OPERATOR}"
    prom_role = f"localcluster:{PROMETHEUS_ACCOUNT}"

    def account(name: str) -> dict[str, Any]:
        return {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name, "namespace": namespace}}

    def binding(kind: str, name: str, role_kind: str, role: str, subject: str) -> dict[str, Any]:
        meta: dict[str, Any] = {"name": name} if kind == "ClusterRoleBinding" else {"name": name,
                                                                                   "namespace": namespace}
        return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": kind, "metadata": meta,
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": role_kind, "name": role},
                "subjects": [{"kind": "ServiceAccount", "name": subject, "namespace": namespace}]}

    rbac = "rbac.authorization.k8s.io/v1"
    return [
        account(OPERATOR),
        {"apiVersion": rbac, "kind": "ClusterRole", "metadata": {"name": cluster_role},
         "rules": operator_cluster_rules()},
        binding("ClusterRoleBinding", cluster_role, "ClusterRole", cluster_role, OPERATOR),
        {"apiVersion": rbac, "kind": "Role", "metadata": {"name": OPERATOR, "namespace": namespace},
         "rules": operator_namespace_rules()},
        binding("RoleBinding", OPERATOR, "Role", OPERATOR, OPERATOR),
        operator_deployment(namespace, node, priority_class),
        account(PROMETHEUS_ACCOUNT),
        {"apiVersion": rbac, "kind": "ClusterRole", "metadata": {"name": prom_role},
         "rules": prometheus_cluster_rules()},
        binding("ClusterRoleBinding", prom_role, "ClusterRole", prom_role, PROMETHEUS_ACCOUNT),
        prometheus_resource(namespace, node, selector, priority_class),
    ]


def crd_files(crd_dir: Path) -> list[Path]:
    return sorted((crd_dir / CRD_DIR).glob("*.yaml"))


def apply_crds(lay: Any) -> list[str]:
    """Create the operator's own CRDs (Prometheus, Probe); their names, for ``crds_established``."""
    from kubernetes import client

    ext = client.ApiextensionsV1Api(_api(lay.kubeconfig))
    names: list[str] = []
    for path in crd_files(lay.crd):
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


def _api(kubeconfig: str | Path) -> Any:
    from kubernetes import config as kube_config

    return kube_config.new_client_from_config(config_file=str(kubeconfig))  # type: ignore[no-untyped-call]


def _apply(api: Any, doc: dict[str, Any]) -> None:
    """Create ``doc``; one that is there already stays as it is."""
    from kubernetes import client, utils

    try:
        if doc["apiVersion"].startswith(f"{GROUP}/"):
            client.CustomObjectsApi(api).create_namespaced_custom_object(
                GROUP, doc["apiVersion"].split("/", 1)[1], doc["metadata"]["namespace"], "prometheuses", doc)
        else:
            utils.create_from_dict(api, doc)  # type: ignore[no-untyped-call]
    except client.ApiException as err:
        if err.status != 409:
            raise
    except utils.FailToCreateError as err:
        if not all(isinstance(e, client.ApiException) and e.status == 409 for e in err.api_exceptions):
            raise


def start(lay: Any, selector: Mapping[str, str], namespace: str, node: str, priority_class: str) -> None:
    """The operator's CRDs now; the process that installs the operator and the Prometheus resource once the stack has
    made the monitoring namespace, as a process ``down`` stops."""
    from tools.localcluster import processes

    names = apply_crds(lay)
    if not names:
        raise processes.ClusterError(f"no prometheus-operator CRDs in {lay.crd / CRD_DIR}; run `make localcluster`")
    processes.wait_for("prometheus-operator CRDs established", lambda: processes.crds_established(lay, names), 60)
    processes.start_process(lay, "prometheus-install", [
        sys.executable, "-m", "tools.localcluster.prometheus_operator", f"--kubeconfig={lay.kubeconfig}",
        f"--namespace={namespace}", f"--node={node}", f"--priority-class={priority_class}",
        "--selector=" + ",".join(f"{k}={v}" for k, v in sorted(selector.items()))],
        env={"PYTHONPATH": str(processes.ROOT)})
    processes.say(f"prometheus-operator {PROMETHEUS_OPERATOR.version} and Prometheus {PROMETHEUS_VERSION} on {node} "
                f"once {namespace} exists: {SERVICE}.{namespace}:{PORT}")


def _found(read: Callable[[], Any]) -> bool:
    """Whether ``read`` finds its object (404: not yet); any other error is raised for the caller's retry."""
    from kubernetes import client

    try:
        read()
    except client.ApiException as err:
        if err.status == 404:
            return False
        raise
    return True


def _exists(api: Any, namespace: str) -> bool:
    from kubernetes import client

    return _found(lambda: client.CoreV1Api(api).read_namespace(namespace))


def _class_exists(api: Any, name: str) -> bool:
    from kubernetes import client

    return _found(lambda: client.SchedulingV1Api(api).read_priority_class(name))


def _ready(api: Any, namespace: str, kind: str, name: str) -> bool:
    from kubernetes import client

    apps = client.AppsV1Api(api)
    read = apps.read_namespaced_deployment_status if kind == "Deployment" else apps.read_namespaced_stateful_set_status
    try:
        obj = read(name, namespace)
    except client.ApiException as err:
        if err.status == 404:
            return False
        raise
    return bool(obj.status and (obj.status.ready_replicas or 0) >= 1)


def install(api: Any, namespace: str, node: str, selector: Mapping[str, str], priority_class: str,
            timeout: float = 1800.0, poll: float = 1.0) -> None:
    """Wait for the namespace and the priority class, create every object, wait until the operator and the
    Prometheus it made are Ready."""
    deadline = time.monotonic() + timeout

    def until(what: str, check: Any) -> None:
        while True:
            try:
                if check():
                    print(f"prometheus-install: {what}", flush=True)
                    return
            except Exception as err:  # the API server restarting, a transient error: the next poll says
                print(f"prometheus-install: waiting for {what}: {err!r}", file=sys.stderr, flush=True)
            if time.monotonic() > deadline:
                raise TimeoutError(f"{what}: not within {timeout:.0f}s")
            time.sleep(poll)

    until(f"namespace {namespace} exists", lambda: _exists(api, namespace))
    # A pod naming a class that does not exist yet is refused at admission.
    until(f"priority class {priority_class} exists", lambda: _class_exists(api, priority_class))
    for doc in manifests(namespace, node, selector, priority_class):
        _apply(api, doc)
        print(f"prometheus-install: {doc['kind']} {doc['metadata']['name']}", flush=True)
    until(f"{OPERATOR} Ready", lambda: _ready(api, namespace, "Deployment", OPERATOR))
    until(f"prometheus-{NAME} Ready (the operator's StatefulSet)",
          lambda: _ready(api, namespace, "StatefulSet", f"prometheus-{NAME}"))


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="localcluster-prometheus-install", description=__doc__.splitlines()[0])
    p.add_argument("--kubeconfig", required=True)
    p.add_argument("--namespace", required=True, help="the stack's monitoring namespace")
    p.add_argument("--node", required=True, help="the real node the operator and Prometheus run on")
    p.add_argument("--selector", default="", help="the stack's monitorLabels, k=v[,k=v]")
    p.add_argument("--priority-class", required=True, help="the stack's system priority class")
    args = p.parse_args(argv)
    selector = dict(kv.split("=", 1) for kv in args.selector.split(",") if kv)
    try:
        install(_api(args.kubeconfig), args.namespace, args.node, selector, args.priority_class)
    except Exception as err:
        print(f"prometheus-install: {err!r}", file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
