"""Self-generated certificates and service-account keys for the local control plane (openssl CLI).

One CA signs the API server's serving certificate (SANs: 127.0.0.1, localhost, the first service IP and the
address pods reach it at, tools/localcluster/realnodes.APISERVER_IP),
the virtual kubelets' serving certificate (127.0.0.1) and an admin client certificate in
``system:masters`` that the kubeconfig, the controllers and the schedulers use. The service-account key
pair signs and verifies bound tokens. Nothing is regenerated while the files exist, so a kubeconfig stays
valid across ``down``/``up``.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

DAYS = "3650"


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, text=True)


def _key(cwd: Path, name: str) -> None:
    _openssl("genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048", "-out", name, cwd=cwd)


def _signed(cwd: Path, name: str, subject: str, ext: str) -> None:
    _key(cwd, f"{name}.key")
    _openssl("req", "-new", "-key", f"{name}.key", "-subj", subject, "-out", f"{name}.csr", cwd=cwd)
    (cwd / f"{name}.ext").write_text(ext)
    _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
             "-days", DAYS, "-sha256", "-extfile", f"{name}.ext", "-out", f"{name}.crt", cwd=cwd)
    (cwd / f"{name}.csr").unlink()
    (cwd / f"{name}.ext").unlink()


#: The user the API server presents to kubelets (kubeadm's name; bound to ``system:kubelet-api-admin``).
KUBELET_CLIENT_USER = "kube-apiserver-kubelet-client"


def ensure_pki(pki: Path) -> None:
    """Create ca, apiserver, admin, kubelet-client and sa key material under ``pki`` unless already there."""
    pki.mkdir(parents=True, exist_ok=True)
    pki.chmod(0o700)
    if not (pki / "ca.crt").exists():
        _key(pki, "ca.key")
        _openssl("req", "-x509", "-new", "-key", "ca.key", "-subj", "/CN=localcluster-ca", "-days", DAYS,
                 "-sha256", "-addext", "basicConstraints=critical,CA:TRUE",
                 "-addext", "keyUsage=critical,keyCertSign,cRLSign", "-out", "ca.crt", cwd=pki)
    if not (pki / "apiserver.crt").exists():
        _signed(pki, "apiserver", "/CN=kube-apiserver",
                "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\n"
                "extendedKeyUsage=serverAuth\n"
                "subjectAltName=IP:127.0.0.1,IP:10.96.0.1,IP:10.255.255.1,DNS:localhost,DNS:kubernetes,"
                "DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local\n")
    if not (pki / "admin.crt").exists():
        _signed(pki, "admin", "/O=system:masters/CN=localcluster-admin",
                "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\n"
                "extendedKeyUsage=clientAuth\n")
    if not (pki / "kubelet-client.crt").exists():
        # The API server's client certificate to kubelets (logs, exec), as kubeadm makes it: the virtual
        # kubelets verify it against the CA and ask RBAC (a SubjectAccessReview) what this user may do.
        _signed(pki, "kubelet-client", f"/CN={KUBELET_CLIENT_USER}",
                "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\n"
                "extendedKeyUsage=clientAuth\n")
    if not (pki / "sa.key").exists():
        _key(pki, "sa.key")
        _openssl("pkey", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=pki)
    for key in pki.glob("*.key"):
        key.chmod(0o600)


def user_certificate(pki: Path, user: str, groups: list[str]) -> tuple[Path, Path]:
    """A client certificate for ``user`` in ``groups`` (CN and O, as the API server reads them), signed by the CA.

    For acting as someone who is not an admin (a researcher in a team's group); reissued on every call.
    """
    if not user or "/" in user or any("/" in g for g in groups):
        raise ValueError(f"user {user!r} and groups {groups!r} must be non-empty and contain no '/'")
    subject = "".join(f"/O={g}" for g in groups) + f"/CN={user}"
    name = f"user-{user}"
    _signed(pki, name, subject, "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\n"
            "extendedKeyUsage=clientAuth\n")
    (pki / f"{name}.key").chmod(0o600)
    return pki / f"{name}.crt", pki / f"{name}.key"


def node_certificates(pki: Path, node: str, ip: str) -> tuple[Path, Path, Path, Path]:
    """A real node's kubelet credentials: its client certificate as ``system:node:<node>`` in ``system:nodes``
    (what the Node authorizer and NodeRestriction check) and its serving certificate for ``ip`` and ``node``.

    Returns (client cert, client key, serving cert, serving key); reissued on every call.
    """
    if not node or "/" in node:
        raise ValueError(f"node name {node!r} must be non-empty and contain no '/'")
    client, serving = f"node-{node}", f"node-{node}-serving"
    _signed(pki, client, f"/O=system:nodes/CN=system:node:{node}",
            "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\n"
            "extendedKeyUsage=clientAuth\n")
    _signed(pki, serving, f"/CN={node}",
            "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\n"
            f"extendedKeyUsage=serverAuth\nsubjectAltName=IP:{ip},DNS:{node}\n")
    for name in (client, serving):
        (pki / f"{name}.key").chmod(0o600)
    return pki / f"{client}.crt", pki / f"{client}.key", pki / f"{serving}.crt", pki / f"{serving}.key"


def user_kubeconfig_text(server: str, pki: Path, user: str, cert: Path, key: Path) -> str:
    """A kubeconfig that authenticates as ``user`` with its client certificate (context ``localcluster``)."""
    return f"""apiVersion: v1
kind: Config
clusters:
- name: localcluster
  cluster:
    server: {server}
    certificate-authority: {pki / 'ca.crt'}
users:
- name: {user}
  user:
    client-certificate: {cert}
    client-key: {key}
contexts:
- name: localcluster
  context:
    cluster: localcluster
    user: {user}
current-context: localcluster
"""


def kubeconfig_text(server: str, pki: Path) -> str:
    """A kubeconfig with the admin client certificate; paths are absolute so it works from anywhere."""
    return user_kubeconfig_text(server, pki, "localcluster-admin", pki / "admin.crt", pki / "admin.key")
