"""A virtual kubelet's serving certificate, made at pod start into an in-memory volume.

node-cli's virtual kubelet serves the kubelet API (logs, exec, attach: what ``kubectl logs`` reaches through
the API server) only over TLS: it loads ``APISERVER_CERT_LOCATION``/``APISERVER_KEY_LOCATION`` and exits when
they are missing. Its node's address is its pod IP, known only once the pod runs, so the certificate is made
then, by an init container, for the node name and that IP; the key never leaves the pod (no Secret, no state).
Who may call the kubelet API is decided by the client CA (``APISERVER_CA_CERT_LOCATION``) and the API server's
SubjectAccessReview, not by this certificate; an API server that verifies kubelet certificates
(``--kubelet-certificate-authority``) needs a provider that requests a cluster-signed one (Liqo does).
"""

from __future__ import annotations

import argparse
import datetime as dt
import ipaddress
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

CERT_FILE = "tls.crt"
KEY_FILE = "tls.key"
#: Long enough to outlive any pod (a restarted pod makes a new one), short enough to bound a leaked key.
DEFAULT_DAYS = 365


@dataclass(frozen=True)
class ServingCert:
    cert_pem: bytes
    key_pem: bytes


def self_signed(name: str, ips: Sequence[str], now: dt.datetime, days: int = DEFAULT_DAYS) -> ServingCert:
    """An ECDSA P-256 serving certificate for ``name`` (CN and DNS name) and each of ``ips``.

    cryptography is imported here, not with the module: the stack reads this module's file names at every
    program start and makes no certificate.
    """
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    if not name:
        raise ValueError("the node name is empty")
    if days < 1:
        raise ValueError(f"days must be at least 1, got {days}")
    try:
        addresses = [ipaddress.ip_address(ip) for ip in ips]
    except ValueError as err:
        raise ValueError(f"not an IP address: {err}") from None
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    alt_names: list[x509.GeneralName] = [x509.DNSName(name), *(x509.IPAddress(a) for a in addresses)]
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))  # clock skew between this node and the API server
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.SubjectAlternativeName(alt_names), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=True, key_encipherment=False, content_commitment=False,
                                     data_encipherment=False, key_agreement=False, key_cert_sign=False,
                                     crl_sign=False, encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(key, hashes.SHA256())
    )
    key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    return ServingCert(cert.public_bytes(serialization.Encoding.PEM), key_pem)


def write(directory: Path, cert: ServingCert) -> tuple[Path, Path]:
    """Write ``tls.crt`` and ``tls.key`` (owner-only) into ``directory``, each whole or not at all."""
    out = []
    for filename, data, mode in ((KEY_FILE, cert.key_pem, 0o600), (CERT_FILE, cert.cert_pem, 0o644)):
        path = directory / filename
        partial = directory / f".{filename}.partial"
        fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(partial, path)
        out.append(path)
    return out[1], out[0]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="serving-cert", description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, required=True, help="where tls.crt and tls.key go (an emptyDir)")
    parser.add_argument("--name", required=True, help="the node name (CN and DNS name)")
    parser.add_argument("--ip", action="append", default=[], help="an IP address of the node (repeatable)")
    parser.add_argument("--days", type=int, default=DEFAULT_DAYS)
    args = parser.parse_args(argv)
    if not args.dir.is_dir():
        print(f"serving-cert: --dir {args.dir} is not a directory", file=sys.stderr)
        return 2
    try:
        cert = self_signed(args.name, args.ip, dt.datetime.now(dt.UTC), args.days)
    except ValueError as err:
        print(f"serving-cert: {err}", file=sys.stderr)
        return 2
    cert_path, key_path = write(args.dir, cert)
    print(f"serving-cert: wrote {cert_path} and {key_path} for {args.name} {' '.join(args.ip)}".rstrip())
    return 0


if __name__ == "__main__":
    sys.exit(main())
