"""The local agents act as their own ServiceAccounts, so a local run proves the RBAC the stack grants them.

``make up`` and ``make e2e`` run the burst controller, the health guard and the descheduler as local
processes. Each gets a kubeconfig holding a token of the ServiceAccount the stack deployed for it
(TokenRequest, minted with the admin certificate), never the admin certificate itself: a call its Roles
do not allow is refused by the API server exactly as in a cluster, and the scenario that needed it fails.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from tools.localcluster import control
from tools.localcluster.plan import Layout

#: How long an agent's token lasts; ``make down && make up`` mints new ones.
TOKEN_SECONDS = 24 * 3600


def kubeconfig_text(server: str, ca: Path, user: str, token: str) -> str:
    """A kubeconfig that authenticates with ``token`` only (no client certificate)."""
    return yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "localcluster", "cluster": {"server": server, "certificate-authority": str(ca)}}],
        "users": [{"name": user, "user": {"token": token}}],
        "contexts": [{"name": user, "context": {"cluster": "localcluster", "user": user}}],
        "current-context": user,
    }, sort_keys=False)


def agent_kubeconfig(lay: Layout, namespace: str, account: str) -> Path | None:
    """``<state>/<account>.kubeconfig`` with a fresh token of ServiceAccount ``namespace/account``; None when the
    stack did not deploy that account (the caller says so and does not start the agent)."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    api: Any = client.CoreV1Api(control.api_client(lay))
    try:
        review = api.create_namespaced_service_account_token(account, namespace, {
            "apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
            "spec": {"expirationSeconds": TOKEN_SECONDS}})
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise
    ports = control.load_ports(lay) or {}
    if "apiserver" not in ports:
        raise control.ClusterError("the control plane's ports are unknown; run `make up` first")
    path = lay.state / f"{account}.kubeconfig"
    path.write_text(kubeconfig_text(f"https://127.0.0.1:{ports['apiserver']}", lay.pki / "ca.crt",
                                    f"system:serviceaccount:{namespace}:{account}", str(review.status.token)))
    path.chmod(0o600)
    return path
