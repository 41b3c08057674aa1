"""What goes wrong before a command can do anything: an API server that does not answer, a broken kubeconfig, a
broken job spec, flags in kubectl's places. Each failure is ONE line on stderr (``error: ...``) naming what is
wrong and where (the server, the file and line or byte, the key), exit code 1, no traceback, nothing applied.

The commands run in-process through click (the real kubeconfig loader and the real kubernetes client, against a
closed port, a TLS server, a silent socket or the HTTP fake of tests/test_cli_commands.py), and once through a
fresh interpreter as ``gpucluster`` and as ``kubectl gpucluster``.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import re
import socket
import ssl
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from http import HTTPStatus
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner, Result
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kubernetes.client import rest
from kubernetes.client.exceptions import ApiException
from urllib3 import exceptions as urllib3_errors

from agents.serving_cert import self_signed, write
from gpucluster_cli import cli
from gpucluster_cli.kube import CliError, Cluster, explain, unreachable
from gpucluster_cli.spec import JobSpec, SpecError, load_spec, parse_spec
from tests import test_cli_commands
from tests.test_cli_commands import JOBS, NS, SPEC, Fake, serve

ROOT = Path(__file__).resolve().parents[1]
KUBECTL = cli.KUBECTL_PROG
HINT = "give --kubeconfig, set $KUBECONFIG, or get one from the cluster admins"


def invoke(*args: str, env: dict[str, str | None] | None = None, prog: str = cli.PROG) -> Result:
    """The CLI in-process; $KUBECONFIG is unset unless a test sets it (the runner's own must not leak in)."""
    return CliRunner().invoke(cli.main, list(args), prog_name=prog,
                              env={"COLUMNS": "200", "KUBECONFIG": None, "GPUCLUSTER_NAMESPACE": None, **(env or {})})


def error_line(result: Result) -> str:
    """The one ``error:`` line a failed command prints, after checking it failed cleanly."""
    assert result.exit_code == 1, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert "Traceback" not in result.output and result.stdout == ""
    [line] = result.stderr.splitlines()
    assert line.startswith("error: "), line
    return line.removeprefix("error: ")


def closed_port() -> int:
    """A local port nothing listens on (bound for a moment to get it, then closed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


def kubeconfig(path: Path, server: str, **cluster: Any) -> Path:
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": server, **cluster}}],
        "users": [{"name": "alice", "user": {"token": "t"}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "alice"}}],
    }))
    return path


@pytest.fixture
def spec_file(tmp_path: Path) -> Path:
    path = tmp_path / "job.yaml"
    path.write_text(SPEC)
    return path


@pytest.fixture
def fake_api(tmp_path: Path) -> Iterator[tuple[Fake, Path]]:
    """The HTTP fake API server and a kubeconfig that names it (the CLI's real kubeconfig loader reads it)."""
    state = Fake()
    with serve(state) as url:
        yield state, kubeconfig(tmp_path / "kubeconfig", url)


# -- 1. an API server that does not answer ------------------------------------------------------------------

COMMANDS = [["list"], ["status", "ft-llama"], ["logs", "ft-llama"], ["cancel", "ft-llama"], ["submit", "{spec}"],
            ["submit", "{spec}", "--dry-run"], ["submit", "{spec}", "--dry-run=client"]]


@pytest.mark.parametrize("prog", [cli.PROG, KUBECTL])
@pytest.mark.parametrize("command", COMMANDS, ids=[" ".join(c) for c in COMMANDS])
def test_a_refused_connection_is_one_line_naming_the_server(tmp_path: Path, spec_file: Path, command: list[str],
                                                           prog: str) -> None:
    server = f"https://127.0.0.1:{closed_port()}"
    config = kubeconfig(tmp_path / "config", server, **{"insecure-skip-tls-verify": True})
    args = [a.replace("{spec}", str(spec_file)) for a in command]
    result = invoke("--kubeconfig", str(config), "train", *args, prog=prog)
    assert error_line(result) == f"cannot reach the Kubernetes API at {server}: connection refused"


@pytest.mark.parametrize("entry", ["main", "kubectl_plugin"])
def test_a_refused_connection_through_a_fresh_interpreter(tmp_path: Path, entry: str) -> None:
    """The console scripts' own entry points (``gpucluster``, ``kubectl-gpucluster``): stderr is the one line."""
    server = f"https://127.0.0.1:{closed_port()}"
    code = f"from gpucluster_cli.cli import {entry}; {entry}()"
    out = subprocess.run([sys.executable, "-c", code, "train", "list"], cwd=ROOT, capture_output=True, text=True,
                         timeout=60, env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "COLUMNS": "200",
                                          "KUBECONFIG": str(kubeconfig(tmp_path / "config", server))})
    assert (out.returncode, out.stdout) == (1, "")
    assert out.stderr == f"error: cannot reach the Kubernetes API at {server}: connection refused\n"


@contextlib.contextmanager
def listening(handle: Callable[[socket.socket], None]) -> Iterator[int]:
    """A local server that does ``handle`` with each connection (in a thread); yields its port."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    stop = threading.Event()

    def loop() -> None:
        while not stop.is_set():
            with contextlib.suppress(OSError):
                conn, _ = server.accept()
                handle(conn)

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        yield server.getsockname()[1]
    finally:
        stop.set()
        with contextlib.suppress(OSError):
            socket.create_connection(server.getsockname(), timeout=1).close()
        server.close()
        thread.join(timeout=5)


def _tls_server(tmp: Path) -> Callable[[socket.socket], None]:
    """Answers TLS with a self-signed certificate the client has no CA for."""
    cert, key = write(tmp, self_signed("api", ["127.0.0.1"], dt.datetime.now(dt.UTC)))
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)

    def handle(conn: socket.socket) -> None:
        with contextlib.suppress(OSError), ctx.wrap_socket(conn, server_side=True):
            pass

    return handle


def _plain_http(conn: socket.socket) -> None:
    """Answers a TLS hello with plain HTTP (an https:// URL pointing at an http:// port)."""
    with conn:
        conn.recv(4096)
        conn.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")


@pytest.mark.parametrize(("scheme", "server", "why"), [
    ("https", _tls_server, r"TLS failed: self[- ]signed certificate"),
    ("https", lambda tmp: _plain_http, r"TLS failed: .+"),
    ("http", lambda tmp: lambda conn: conn.close(), r"the connection broke \(.+\)"),
], ids=["self-signed-certificate", "tls-to-plain-http", "closed-without-answer"])
def test_tls_and_broken_connections_are_one_line_naming_the_server(
        tmp_path: Path, scheme: str, server: Callable[[Path], Callable[[socket.socket], None]], why: str) -> None:
    with listening(server(tmp_path)) as port:
        url = f"{scheme}://127.0.0.1:{port}"
        result = invoke("--kubeconfig", str(kubeconfig(tmp_path / "config", url)), "train", "list")
    message = error_line(result)
    assert re.fullmatch(rf"cannot reach the Kubernetes API at {re.escape(url)}: {why}", message), message


def test_a_silent_server_times_out_in_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A server that takes the connection and never answers. The CLI sets no timeout of its own (kubectl's
    --request-timeout is 0 too); 0.2 s here stands in for the client's timeout, so the test does not hang."""
    real = rest.RESTClientObject.request

    def with_timeout(self: Any, *args: Any, _request_timeout: Any = None, **kwargs: Any) -> Any:
        return real(self, *args, _request_timeout=_request_timeout or 0.2, **kwargs)

    monkeypatch.setattr(rest.RESTClientObject, "request", with_timeout)
    held: list[socket.socket] = []
    with listening(held.append) as port:
        url = f"http://127.0.0.1:{port}"
        result = invoke("--kubeconfig", str(kubeconfig(tmp_path / "config", url)), "train", "list")
    for conn in held:
        conn.close()
    assert error_line(result) == f"cannot reach the Kubernetes API at {url}: timed out"


def _caused(exc: BaseException, cause: BaseException) -> BaseException:
    exc.__cause__ = cause
    return exc


@pytest.mark.parametrize(("exc", "why"), [
    (urllib3_errors.NameResolutionError("api.example", None, socket.gaierror(-2, "Name or service not known")),  # type: ignore[arg-type]
     "its host name does not resolve"),
    (_caused(urllib3_errors.NewConnectionError(None, "Failed to establish a new connection"),  # type: ignore[arg-type]
             OSError(113, "No route to host")), "no route to host"),
    (urllib3_errors.ConnectTimeoutError(None, "Connection to api timed out. (connect timeout=30)"), "timed out"),
    (urllib3_errors.ReadTimeoutError(None, "/api", "Read timed out."), "timed out"),  # type: ignore[arg-type]
    (urllib3_errors.SSLError(ssl.SSLError(1, "[SSL: UNSUPPORTED_PROTOCOL] unsupported protocol")),
     "TLS failed: [SSL: UNSUPPORTED_PROTOCOL] unsupported protocol"),
    (urllib3_errors.ProtocolError("Connection aborted.", ConnectionResetError(104, "Connection reset by peer")),
     "the connection broke (Connection reset by peer)"),
], ids=["dns", "no-route", "connect-timeout", "read-timeout", "tls", "reset"])
def test_each_wire_failure_has_its_words(exc: urllib3_errors.HTTPError, why: str) -> None:
    """Bare and wrapped as the client raises them (MaxRetryError after the retries)."""
    host = "https://api.example:6443"
    for raised in (exc, urllib3_errors.MaxRetryError(None, "/api", exc)):  # type: ignore[arg-type]
        message = str(unreachable(raised, host))
        assert message == f"cannot reach the Kubernetes API at {host}: {why}" and "\n" not in message


# -- 1b. the API answers with an error status ---------------------------------------------------------------

def _answering(code: int, method: str, path_part: str, message: str = "nope") -> Callable[..., tuple[int, Any]]:
    real = test_cli_commands.handle

    def handle(fake: Fake, m: str, path: str, *rest: Any) -> tuple[int, Any]:
        if m == method and path_part in path:
            return test_cli_commands._status(code, message)
        return real(fake, m, path, *rest)
    return handle


def _http(code: int) -> str:
    return f"HTTP {code} {HTTPStatus(code).phrase}"


@pytest.mark.parametrize(("code", "method", "path", "args", "expected"), [
    (401, "GET", "/configmaps/", ["list"], "reading the cluster settings: the cluster did not accept your "
     "credentials; log in again or check your kubeconfig context ({http})"),
    (403, "GET", JOBS, ["list"], "listing training jobs: no permission (nope); ask the cluster admins for the "
     f"researcher role in namespace '{NS}' ({{http}})"),
    (404, "GET", JOBS, ["list"], "listing training jobs: the API answered {http}: nope"),
    (500, "GET", f"{JOBS}/", ["status", "ft-llama"], "reading job ft-llama: the API answered {http}: nope"),
    (422, "PATCH", f"{JOBS}/", ["submit", "{spec}"], "applying Job ft-llama: refused by the cluster: nope ({http})"),
    (409, "PATCH", f"{JOBS}/", ["submit", "{spec}"], "applying Job ft-llama: conflict: nope; another tool manages "
     "these fields (cancel the job first, or choose another name) ({http})"),
    (503, "DELETE", f"{JOBS}/", ["cancel", "ft-llama"], "cancelling job ft-llama: the API answered {http}: nope"),
], ids=["401-settings", "403-list", "404-list", "500-status", "422-submit", "409-submit", "503-cancel"])
def test_an_api_error_is_one_line_naming_the_status_and_the_request(
        fake_api: tuple[Fake, Path], spec_file: Path, monkeypatch: pytest.MonkeyPatch, code: int, method: str,
        path: str, args: list[str], expected: str) -> None:
    fake, config = fake_api
    fake.jobs["ft-llama"] = {"metadata": {"name": "ft-llama"}, "spec": {}, "status": {}}
    monkeypatch.setattr(test_cli_commands, "handle", _answering(code, method, path))
    result = invoke("--kubeconfig", str(config), "train", *[a.replace("{spec}", str(spec_file)) for a in args])
    assert error_line(result) == expected.replace("{http}", _http(code))


def test_a_multi_line_api_message_is_shown_on_one_line(fake_api: tuple[Fake, Path],
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    _, config = fake_api
    monkeypatch.setattr(test_cli_commands, "handle", _answering(500, "GET", JOBS, "webhook said:\n  no\n\tway"))
    result = invoke("--kubeconfig", str(config), "train", "list")
    assert error_line(result) == f"listing training jobs: the API answered {_http(500)}: webhook said: no way"


def test_a_request_that_got_no_answer_at_all_is_one_line() -> None:
    """The client's own ApiException (status 0), as it raises for a TLS failure when retries are off."""
    exc = ApiException(status=0, reason="SSLError\n[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed")
    assert str(explain(exc, "listing training jobs", NS)) == (
        "listing training jobs: no answer from the API: SSLError [SSL: CERTIFICATE_VERIFY_FAILED] certificate "
        "verify failed")


# -- 2, 3. the kubeconfig -----------------------------------------------------------------------------------

GOOD = (b"apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        b"clusters: [{name: c, cluster: {server: 'https://127.0.0.1:1'}}]\nusers: [{name: u, user: {token: t}}]\n"
        b"contexts: [{name: c, context: {cluster: c, user: u}}]\n")

#: (id, files written under the test's directory, arguments, environment, the message; {tmp} is that directory)
KUBECONFIG_CASES: list[tuple[str, dict[str, bytes], list[str], dict[str, str], str]] = [
    ("missing-flag", {}, ["--kubeconfig", "{tmp}/nope"], {},
     f"cannot load your kubeconfig: {{tmp}}/nope does not exist (from --kubeconfig); {HINT}"),
    ("missing-env", {}, [], {"KUBECONFIG": "{tmp}/a:{tmp}/b"},
     f"cannot load your kubeconfig: none of {{tmp}}/a, {{tmp}}/b exists (from $KUBECONFIG); {HINT}"),
    ("missing-default", {}, [], {"HOME": "{tmp}"},
     f"cannot load your kubeconfig: {{tmp}}/.kube/config does not exist (from the default location); {HINT}"),
    ("not-yaml", {"config": b"apiVersion: v1\nkind: Config\ncurrent-context: a: b\n"}, ["--kubeconfig", "{tmp}/config"],
     {}, "cannot load your kubeconfig: {tmp}/config: line 3, column 19: not valid YAML: mapping values are not "
         "allowed here"),
    ("not-yaml-default", {".kube/config": b"clusters: [\n"}, [], {"HOME": "{tmp}"},
     "cannot load your kubeconfig: {tmp}/.kube/config: line 2, column 1: not valid YAML: expected the node content, "
     "but found '<stream end>'"),
    ("second-of-env-broken", {"good": GOOD, "bad": b"users:\n\t- x\n"}, [], {"KUBECONFIG": "{tmp}/good:{tmp}/bad"},
     "cannot load your kubeconfig: {tmp}/bad: line 2, column 1: not valid YAML: found character '\\t' that cannot "
     "start any token"),
    ("not-utf8", {"config": b"apiVersion: v1\nkind: \xff\n"}, ["--kubeconfig", "{tmp}/config"], {},
     "cannot load your kubeconfig: {tmp}/config: is not UTF-8 text (invalid start byte at byte 21)"),
    ("a-list", {"config": b"- a\n"}, ["--kubeconfig", "{tmp}/config"], {},
     "cannot load your kubeconfig: {tmp}/config: must be a mapping (clusters, contexts, users)"),
    ("empty", {"config": b""}, ["--kubeconfig", "{tmp}/config"], {},
     "cannot load your kubeconfig: {tmp}/config: is empty"),
    ("unknown-context", {"config": GOOD}, ["--kubeconfig", "{tmp}/config", "--context", "nope"], {},
     "cannot load your kubeconfig {tmp}/config context 'nope': Invalid kube-config file. Expected object with name "
     "nope in {tmp}/config/contexts list"),
    ("no-server", {"config": GOOD.replace(b"server: 'https://127.0.0.1:1'", b"insecure-skip-tls-verify: true")},
     ["--kubeconfig", "{tmp}/config"], {},
     "cannot load your kubeconfig {tmp}/config: the context's cluster has no server URL"),
    ("wrong-shape", {"config": b"apiVersion: v1\nclusters: 5\ncurrent-context: c\n"
                               b"contexts: [{name: c, context: {cluster: c, user: u}}]\n"},
     ["--kubeconfig", "{tmp}/config"], {},
     "cannot load your kubeconfig {tmp}/config: not a valid kubeconfig (TypeError: 'int' object is not iterable)"),
    ("missing-ca-file", {"config": GOOD.replace(b"server:", b"certificate-authority: /nope/ca.crt, server:")},
     ["--kubeconfig", "{tmp}/config"], {},
     "cannot load your kubeconfig {tmp}/config: File does not exist: /nope/ca.crt"),
]


@pytest.mark.parametrize(("files", "args", "env", "expected"), [c[1:] for c in KUBECONFIG_CASES],
                         ids=[c[0] for c in KUBECONFIG_CASES])
@pytest.mark.parametrize("where", ["before", "after"])
def test_a_broken_or_missing_kubeconfig_is_one_line_naming_the_file(
        tmp_path: Path, files: dict[str, bytes], args: list[str], env: dict[str, str], expected: str,
        where: str) -> None:
    for name, data in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(data)
    flags = [a.replace("{tmp}", str(tmp_path)) for a in args]
    line = [*flags, "train", "list"] if where == "before" else ["train", "list", *flags]
    result = invoke(*line, env={"HOME": str(tmp_path),
                                **{k: v.replace("{tmp}", str(tmp_path)) for k, v in env.items()}})
    assert error_line(result) == expected.replace("{tmp}", str(tmp_path))


# -- 4, 5, 6. the job spec ----------------------------------------------------------------------------------

def _at(data: bytes, offset: int, insert: bytes) -> bytes:
    return data[:offset] + insert + data[offset:]


SPEC_BYTES = SPEC.encode()
#: (id, the spec file's bytes, the message after "<file>: ")
SPEC_CASES: list[tuple[str, bytes, str]] = [
    ("duplicate-key", SPEC_BYTES + b"gpus: 8\n",
     "line 7, column 1: not valid YAML: duplicate key 'gpus' (first on line 4)"),
    ("duplicate-nested-key", SPEC_BYTES.replace(b"{nodes: 2,", b"{nodes: 2, nodes: 3,"),
     "line 4, column 18: not valid YAML: duplicate key 'nodes' (first on line 4)"),
    ("duplicate-markup-key", b"'[/bold]': 1\n'[/bold]': 2\n",
     "line 2, column 1: not valid YAML: duplicate key '[/bold]' (first on line 1)"),
    ("not-utf8", _at(SPEC_BYTES, 20, b"\xff"), "is not UTF-8 text (invalid start byte at byte 20)"),
    ("truncated-utf8", SPEC_BYTES + b"team: \xc3",
     f"is not UTF-8 text (unexpected end of data at byte {len(SPEC_BYTES) + 6})"),
    ("utf16", SPEC.encode("utf-16"), "is not UTF-8 text (invalid start byte at byte 0)"),
    ("syntax", SPEC_BYTES.replace(b"[python, -m, train]", b"[python, -m, train"),
     "line 4, column 5: not valid YAML: expected ',' or ']', but got ':'"),
    ("indentation", SPEC_BYTES.replace(b"\nteam", b"\n   team"),
     "line 6, column 8: not valid YAML: mapping values are not allowed here"),
    ("control-character", _at(SPEC_BYTES, 6, b"\x07"),
     "line 1, column 7: not valid YAML: control character #x07 is not allowed"),
    ("no-such-date", SPEC_BYTES + b"note: 2024-02-30\n", "not valid YAML: day is out of range for month"),
    ("nested-too-deeply", b"name: " + b"[" * 5000, "not valid YAML: nested too deeply"),
]


@pytest.mark.parametrize(("data", "expected"), [c[1:] for c in SPEC_CASES], ids=[c[0] for c in SPEC_CASES])
def test_a_broken_spec_is_one_line_naming_the_file_and_nothing_is_sent(
        fake_api: tuple[Fake, Path], tmp_path: Path, data: bytes, expected: str) -> None:
    fake, config = fake_api
    spec = tmp_path / "job.yaml"
    spec.write_bytes(data)
    result = invoke("--kubeconfig", str(config), "train", "submit", str(spec))
    assert error_line(result) == f"{spec}: {expected}"
    assert fake.requests == [] and fake.jobs == {} and fake.monitors == {}


@pytest.mark.parametrize(("make", "why"), [(lambda p: None, "No such file or directory"),
                                            (lambda p: p.mkdir(), "Is a directory")], ids=["missing", "directory"])
def test_an_unreadable_spec_is_one_line_naming_it(fake_api: tuple[Fake, Path], tmp_path: Path,
                                                  make: Callable[[Path], None], why: str) -> None:
    fake, config = fake_api
    spec = tmp_path / "job.yaml"
    make(spec)
    result = invoke("--kubeconfig", str(config), "train", "submit", str(spec))
    assert error_line(result) == f"{spec}: cannot read the job spec: {why}"
    assert fake.requests == []


def test_the_spec_and_the_stack_file_refuse_a_duplicate_key_alike(tmp_path: Path) -> None:
    """One rule in one place: the stack loader's (components/config/loading.py) words the spec's refusal."""
    from components.config.loading import ConfigError, read_stack_file

    text = "config:\n  gpu-cluster:a: 1\n  gpu-cluster:a: 2\n"
    stack = tmp_path / "Pulumi.x.yaml"
    stack.write_text(text)
    with pytest.raises(ConfigError) as stack_err:
        read_stack_file(stack)
    with pytest.raises(SpecError) as spec_err:
        parse_spec(text, "job.yaml")
    said = "line 3, column 3: not valid YAML: duplicate key 'gpu-cluster:a' (first on line 2)"
    assert said in str(stack_err.value) and str(spec_err.value) == f"job.yaml: {said}"


# -- 7. flags anywhere --------------------------------------------------------------------------------------

@pytest.fixture
def asked(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str | None, str, str | None]]:
    """The (context, namespace, kubeconfig) each command built its cluster with; the cluster is never reached."""
    seen: list[tuple[str | None, str, str | None]] = []

    def factory(context: str | None, namespace: str, kubeconfig: str | None = None) -> Cluster:
        seen.append((context, namespace, kubeconfig))
        raise CliError("stop here")
    monkeypatch.setattr(cli, "cluster_factory", factory)
    return seen


@pytest.mark.parametrize(("line", "want"), [
    ("-n a train list", (None, "a", None)),
    ("train -n a list", (None, "a", None)),
    ("train list -n a", (None, "a", None)),
    ("train --namespace=a --context x --kubeconfig k list", ("x", "a", "k")),
    ("--context x train --kubeconfig k list --namespace a", ("x", "a", "k")),
    ("--kubeconfig k train list --context x -n a", ("x", "a", "k")),
    ("-n a train -n b list -n c", (None, "c", None)),  # the last one wins, as in kubectl
    ("-n a train -n b list", (None, "b", None)),
    ("-n a train --context x list", ("x", "a", None)),  # a level without -n keeps the earlier one
    ("train list", (None, "training", None)),
], ids=lambda v: v if isinstance(v, str) else "")
@pytest.mark.parametrize("command", ["list", "status x", "logs x", "cancel x"])
def test_connection_flags_go_before_between_or_after(asked: list[tuple[str | None, str, str | None]], line: str,
                                                     want: tuple[str | None, str, str | None], command: str) -> None:
    result = invoke(*line.replace("list", command).split())
    assert error_line(result) == "stop here"
    assert asked == [want]


def test_flags_between_the_group_and_submit(asked: list[tuple[str | None, str, str | None]],
                                            spec_file: Path) -> None:
    result = invoke("train", "-n", "research", "--context", "lab", "submit", str(spec_file), "--dry-run")
    assert error_line(result) == "stop here" and asked == [("lab", "research", None)]


def test_the_group_lists_the_connection_flags() -> None:
    out = invoke("train", "--help").stdout
    assert all(flag in out for flag in ("--namespace", "--context", "--kubeconfig"))


# -- properties ---------------------------------------------------------------------------------------------

YAMLISH = st.text(st.sampled_from(list("ab:-?[]{},#&*!|>'\"%@`~ \n\t\r\x07\x00\x85é\u2028\ufeff019.")),
                  max_size=80)


def _a_spec_or_its_error(load: Callable[[], JobSpec], source: str) -> None:
    try:
        load()
    except SpecError as exc:
        lines = str(exc).splitlines()
        assert lines and all(line.startswith(f"{source}: ") for line in lines), str(exc)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.one_of(st.binary(max_size=200), YAMLISH.map(lambda t: t.encode("utf-8", "surrogatepass")),
                 st.builds(_at, st.just(SPEC_BYTES), st.integers(0, len(SPEC_BYTES)), st.binary(max_size=4))))
def test_any_bytes_load_as_a_spec_or_a_spec_error_naming_the_file(tmp_path: Path, data: bytes) -> None:
    path = tmp_path / "any.yaml"
    path.write_bytes(data)
    _a_spec_or_its_error(lambda: load_spec(path), str(path))


@settings(max_examples=400, deadline=None)
@given(st.one_of(st.text(max_size=120), YAMLISH,
                 st.builds(lambda i, s: SPEC[:i] + s + SPEC[i:], st.integers(0, len(SPEC)), YAMLISH)))
def test_any_yaml_text_parses_as_a_spec_or_a_spec_error_naming_the_file(text: str) -> None:
    _a_spec_or_its_error(lambda: parse_spec(text, "any.yaml"), "any.yaml")


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(["name", "image", "command", "gpus", "team", "x", "[/b]", "a b"]), min_size=1,
                max_size=6, unique=True), st.data())
def test_a_repeated_key_is_refused_naming_it_and_both_lines(keys: list[str], data: st.DataObject) -> None:
    first = data.draw(st.integers(0, len(keys) - 1))
    again = data.draw(st.integers(first + 1, len(keys)))
    lines = [f"'{k}': 1" for k in keys]
    lines.insert(again, lines[first])
    with pytest.raises(SpecError) as err:
        parse_spec("\n".join(lines) + "\n", "dup.yaml")
    assert str(err.value) == (f"dup.yaml: line {again + 1}, column 1: not valid YAML: duplicate key "
                              f"'{keys[first]}' (first on line {first + 1})")


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.one_of(st.binary(max_size=120), YAMLISH.map(str.encode)))
def test_any_spec_file_through_the_cli_fails_cleanly_before_the_cluster(
        asked: list[tuple[str | None, str, str | None]], tmp_path: Path, data: bytes) -> None:
    """Whatever the file holds: exit 1, error lines only (the spec's problems, or the stand-in cluster's stop)."""
    path = tmp_path / "any.yaml"
    path.write_bytes(data)
    result = invoke("train", "submit", str(path))
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit), repr(result.exception)
    lines = result.stderr.splitlines()
    assert lines[0] in ("error: stop here",) or lines[0].startswith(f"error: {path}: "), result.stderr
    assert all(line.startswith(f"{path}: ") for line in lines[1:]), result.stderr
