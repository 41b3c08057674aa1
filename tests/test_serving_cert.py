"""The virtual kubelets' serving certificate: what the init container writes, and what it refuses."""

from __future__ import annotations

import datetime as dt
import ipaddress
import ssl
import stat
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.x509.oid import ExtendedKeyUsageOID
from hypothesis import given
from hypothesis import strategies as st

from agents.serving_cert import main, self_signed, write

NOW = dt.datetime(2026, 12, 2, 12, 0, tzinfo=dt.UTC)


def test_certificate_names_the_node_and_its_ip() -> None:
    made = self_signed("vk-lambda-east", ["10.4.7.12", "fd00::12"], NOW, days=30)
    cert = x509.load_pem_x509_certificate(made.cert_pem)
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == ["vk-lambda-east"]
    assert san.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("10.4.7.12"),
                                                       ipaddress.ip_address("fd00::12")]
    assert cert.subject.rfc4514_string() == "CN=vk-lambda-east" == cert.issuer.rfc4514_string()
    assert cert.not_valid_before_utc == NOW - dt.timedelta(minutes=5)
    assert cert.not_valid_after_utc == NOW + dt.timedelta(days=30)
    assert cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is False
    assert list(cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value) == [
        ExtendedKeyUsageOID.SERVER_AUTH]
    key = serialization.load_pem_private_key(made.key_pem, password=None)
    assert key.public_key().public_numbers() == cert.public_key().public_numbers()  # type: ignore[union-attr]


def test_written_pair_loads_as_a_tls_server_and_the_key_is_owner_only(tmp_path: Path) -> None:
    cert_path, key_path = write(tmp_path, self_signed("vk-a", ["127.0.0.1"], dt.datetime.now(dt.UTC)))
    assert (cert_path.name, key_path.name) == ("tls.crt", "tls.key")
    assert stat.S_IMODE(key_path.stat().st_mode) == 0o600
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert_path, key_path)  # what Go's tls.LoadX509KeyPair checks: a matching pair
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tls.crt", "tls.key"]  # no partial file left


def test_each_start_makes_a_new_key() -> None:
    first, second = (self_signed("vk-a", [], NOW) for _ in range(2))
    assert first.key_pem != second.key_pem


@pytest.mark.parametrize(("args", "message"), [
    (["--name", "vk-a", "--ip", "10.0.0.300"], "not an IP address: '10.0.0.300'"),
    (["--name", "", "--ip", "10.0.0.3"], "the node name is empty"),
    (["--name", "vk-a", "--days", "0"], "days must be at least 1, got 0"),
])
def test_cli_refuses_bad_arguments_naming_them(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                               args: list[str], message: str) -> None:
    assert main(["--dir", str(tmp_path), *args]) == 2
    assert message in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_cli_refuses_a_missing_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--dir", str(tmp_path / "absent"), "--name", "vk-a"]) == 2
    assert f"--dir {tmp_path / 'absent'} is not a directory" in capsys.readouterr().err


def test_cli_writes_the_pair(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--dir", str(tmp_path), "--name", "vk-a", "--ip", "10.1.2.3"]) == 0
    cert = x509.load_pem_x509_certificate((tmp_path / "tls.crt").read_bytes())
    assert cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(
        x509.IPAddress) == [ipaddress.ip_address("10.1.2.3")]
    assert "wrote" in capsys.readouterr().out


@given(st.text(max_size=40))
def test_any_ip_argument_is_accepted_as_an_address_or_refused_by_name(text: str) -> None:
    """The pod IP arrives through the environment: anything that is not an address is refused, naming it."""
    try:
        expected = ipaddress.ip_address(text)
    except ValueError:
        with pytest.raises(ValueError, match="not an IP address"):
            self_signed("vk-a", [text], NOW)
        return
    cert = x509.load_pem_x509_certificate(self_signed("vk-a", [text], NOW).cert_pem)
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.IPAddress) == [expected]
