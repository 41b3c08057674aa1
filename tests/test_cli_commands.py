"""The CLI's commands against an HTTP-level fake of the API server, through the real kubernetes client.

The fake checks what the real API server insists on for server-side apply (the apply-patch content type and
a field manager) and records every request, so the tests assert the objects applied and the output shown.
"""

from __future__ import annotations

import contextlib
import json
import re
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlparse

import pytest
import yaml
from click.testing import CliRunner, Result
from kubernetes import client

from components.cluster_settings import SETTINGS_CONFIGMAP, SETTINGS_KEY, cluster_settings, settings_json
from components.config import ClusterConfig, Team, TrainingJob
from components.mockrt import RunResult
from gpucluster_cli import cli
from gpucluster_cli.kube import Cluster
from tools.localcluster.plan import load_stack_config

ROOT = Path(__file__).resolve().parents[1]
NS = "training"
JOBS = f"/apis/batch.volcano.sh/v1alpha1/namespaces/{NS}/jobs"
MONITORS = f"/apis/monitoring.coreos.com/v1/namespaces/{NS}/podmonitors"
PODS = f"/api/v1/namespaces/{NS}/pods"

SPEC = """name: ft-llama
image: registry.local/training/trainer:1.2.0
command: [python, -m, train]
gpus: {nodes: 2, gpusPerNode: 8}
checkpointInterval: 200
team: nlp
"""


def _settings_cm() -> dict[str, Any]:
    cfg = load_stack_config(ROOT, "local")
    assert isinstance(cfg, ClusterConfig)
    teams = [Team(name="nlp", guarantee_gpus=16, capability_gpus=24)]
    cfg = cfg.model_copy(update={"scheduling": cfg.scheduling.model_copy(update={"teams": teams})})
    return {"metadata": {"name": SETTINGS_CONFIGMAP, "namespace": NS},
            "data": {SETTINGS_KEY: settings_json(cluster_settings(cfg))}}


class Fake:
    def __init__(self) -> None:
        self.configmaps: dict[str, dict[str, Any]] = {SETTINGS_CONFIGMAP: _settings_cm()}
        self.jobs: dict[str, dict[str, Any]] = {}
        self.monitors: dict[str, dict[str, Any]] = {}
        self.pods: list[dict[str, Any]] = []
        self.logs: dict[str, str] = {}
        self.metrics: dict[str, str] = {}
        self.forbid: list[tuple[str, str]] = []
        #: Pods whose log request fails with this status (the API server could not reach the kubelet).
        self.log_failures: dict[str, int] = {}
        self.requests: list[dict[str, Any]] = []

    def pod(self, name: str, node: str | None, phase: str, restarts: int = 0, job: str = "ft-llama") -> None:
        self.pods.append({"metadata": {"name": name, "namespace": NS, "labels": {"gpucluster.io/job": job}},
                          "spec": {"nodeName": node} if node else {},
                          "status": {"phase": phase, "containerStatuses": [{"name": "trainer",
                                                                            "restartCount": restarts}]}})


def _status(code: int, message: str) -> tuple[int, Any]:
    return code, {"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": message, "code": code}


def handle(fake: Fake, method: str, path: str, query: dict[str, list[str]], headers: Any,
           body: Any) -> tuple[int, Any]:
    fake.requests.append({"method": method, "path": path, "query": query,
                          "content_type": headers.get("Content-Type"), "body": body})
    for m, pattern in fake.forbid:
        if m == method and re.search(pattern, path):
            return _status(403, f'{path} is forbidden: User "alice" cannot {method.lower()} here')
    if m := re.fullmatch(rf"/api/v1/namespaces/{NS}/configmaps/([^/]+)", path):
        cm = fake.configmaps.get(m.group(1))
        return (200, cm) if cm else _status(404, "not found")
    if m := re.fullmatch(rf"({JOBS}|{MONITORS})/([^/]+)", path):
        store = fake.jobs if m.group(1) == JOBS else fake.monitors
        name = m.group(2)
        if method == "PATCH":
            if headers.get("Content-Type") != "application/apply-patch+yaml":
                return _status(415, "expected server-side apply")
            if not query.get("fieldManager"):
                return _status(400, "fieldManager is required for apply patch")
            obj = {**body, "status": {"state": {"phase": "Pending"}}}
            if query.get("dryRun") != ["All"]:
                store[name] = obj
            return 200, obj
        if name not in store:
            return _status(404, f"{name} not found")
        if method == "DELETE":
            return 200, store.pop(name)
        return 200, store[name]
    if path == JOBS:
        return 200, {"items": list(fake.jobs.values())}
    if path == PODS:
        key, _, value = query.get("labelSelector", [""])[0].partition("=")
        return 200, {"items": [p for p in fake.pods if p["metadata"]["labels"].get(key) == value]}
    if (m := re.fullmatch(rf"{PODS}/([^/:]+)/log", path)) and m.group(1) in fake.log_failures:
        return _status(fake.log_failures[m.group(1)], 'Get "https://127.0.0.1:10250/containerLogs/training/'
                       f'{m.group(1)}/trainer": dial tcp 127.0.0.1:10250: connect: connection refused')
    if m := re.fullmatch(rf"{PODS}/([^/:]+)/log", path):
        if m.group(1) not in fake.logs:
            return _status(400, f'container "trainer" in pod "{m.group(1)}" is waiting to start')
        return 200, fake.logs[m.group(1)]
    if m := re.fullmatch(rf"{PODS}/([^/:]+):(\d+)/proxy/metrics", path):
        return (200, fake.metrics[m.group(1)]) if m.group(1) in fake.metrics else _status(503, "no endpoints")
    return _status(404, f"no route {method} {path}")


@contextlib.contextmanager
def serve(fake: Fake) -> Iterator[str]:
    class Handler(BaseHTTPRequestHandler):
        def _do(self) -> None:
            url = urlparse(self.path)
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            body = json.loads(raw) if raw else None
            code, payload = handle(fake, self.command, unquote(url.path), parse_qs(url.query), self.headers, body)
            data = payload.encode() if isinstance(payload, str) else json.dumps(payload).encode()
            self.send_response(code)
            self.send_header("Content-Type", "text/plain" if isinstance(payload, str) else "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_PATCH = do_DELETE = _do

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[Fake]:
    state = Fake()
    with serve(state) as url:
        def factory(context: str | None, namespace: str, kubeconfig: str | None = None) -> Cluster:
            return Cluster(client.ApiClient(client.Configuration(host=url)), namespace)
        monkeypatch.setattr(cli, "cluster_factory", factory)
        yield state


def run(*args: str) -> Result:
    return CliRunner().invoke(cli.main, list(args), env={"COLUMNS": "200"})


@pytest.fixture
def spec_file(tmp_path: Path) -> Path:
    path = tmp_path / "job.yaml"
    path.write_text(SPEC)
    return path


def test_submit_applies_the_templated_job_by_server_side_apply(fake: Fake, spec_file: Path) -> None:
    result = run("train", "submit", str(spec_file))
    assert result.exit_code == 0, result.output
    assert "submitted ft-llama: 2 × 8 GPUs in pool local-gpu, queue team-nlp" in result.output
    job = fake.jobs["ft-llama"]
    assert job["kind"] == "Job" and job["metadata"]["namespace"] == NS
    assert job["metadata"]["labels"]["gpucluster.io/team"] == "nlp"
    spec = job["spec"]
    assert (spec["schedulerName"], spec["minAvailable"], spec["priorityClassName"]) == ("volcano", 2, "gpu-training")
    pod = spec["tasks"][0]["template"]["spec"]
    assert pod["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "8"
    env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
    assert env["CHECKPOINT_INTERVAL_STEPS"] == "200"
    applies = [r for r in fake.requests if r["method"] == "PATCH"]
    assert {r["query"]["fieldManager"][0] for r in applies} == {"gpucluster-cli"}
    assert "force" not in applies[0]["query"]
    assert "ft-llama" in fake.monitors


def test_submit_says_when_a_job_cannot_restart_in_place(fake: Fake, spec_file: Path) -> None:
    """The cluster restarts gangs in place; a job that cannot (no checkpoint filesystem to meet on and resume from:
    a cluster without checkpoint claims) is told what a crash then costs, before it happens. One that can is told
    nothing."""
    from gpucluster_cli.views import restart_line

    result = run("train", "submit", str(spec_file), "--dry-run")
    assert result.exit_code == 0 and "restarts:" not in result.output, result.output
    cfg = load_stack_config(ROOT, "local")
    assert isinstance(cfg, ClusterConfig)
    settings = cluster_settings(cfg)
    bare = TrainingJob(name="j", image="r/i:1", command=["python", "-m", "train"], pool="local-gpu",
                       workers=1, gpus_per_worker=8)
    assert restart_line(settings, bare) == ("restarts: the whole gang, pod by pod, at every crash (the spec has no "
                                            "checkpoint filesystem: it cannot restart in place, and starts again "
                                            "from step 0)")
    both = bare.model_copy(update={"command": []})
    assert "no command and no checkpoint filesystem" in str(restart_line(settings, both))
    off = settings.model_copy(update={"restart_in_place": None})
    assert restart_line(off, bare) is None  # a cluster that does not restart in place has nothing to say


def test_dry_run_creates_nothing(fake: Fake, spec_file: Path) -> None:
    result = run("train", "submit", str(spec_file), "--dry-run")
    assert result.exit_code == 0, result.output
    assert "would submit ft-llama" in result.output
    assert fake.jobs == {}
    assert all(r["query"].get("dryRun") == ["All"] for r in fake.requests if r["method"] == "PATCH")


def test_no_permission_names_the_role_to_ask_for(fake: Fake, spec_file: Path) -> None:
    fake.forbid.append(("PATCH", "/jobs/"))
    result = run("train", "submit", str(spec_file))
    assert result.exit_code == 1
    assert "applying Job ft-llama: no permission" in result.output
    assert "ask the cluster admins for the researcher role in namespace 'training'" in result.output


def test_spec_errors_are_shown_before_anything_is_applied(fake: Fake, tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(SPEC.replace("gpus: {nodes: 2, gpusPerNode: 8}", "gpus: 64"))
    result = run("train", "submit", str(bad))
    assert result.exit_code == 1
    assert f"{bad}: gpus: 8 nodes is larger than pool 'local-gpu'" in result.output
    assert not [r for r in fake.requests if r["method"] == "PATCH"]


def test_missing_settings_say_the_stack_is_not_there(fake: Fake, spec_file: Path) -> None:
    fake.configmaps.clear()
    result = run("train", "submit", str(spec_file))
    assert result.exit_code == 1
    assert "does not publish its training settings" in result.output


def test_list_shows_phase_queue_team(fake: Fake, spec_file: Path) -> None:
    assert run("train", "list").output.strip() == "no training jobs in namespace training"
    run("train", "submit", str(spec_file))
    out = run("train", "list").output
    assert re.search(r"^ft-llama\s+Pending\s+team-nlp\s+nlp\s+0/2\s+gpucluster-cli$", out, re.M), out
    assert "│" not in out  # piped: plain columns, as kubectl prints them


def test_status_shows_gang_pods_per_node_restarts_and_checkpoint(fake: Fake, spec_file: Path) -> None:
    run("train", "submit", str(spec_file))
    fake.jobs["ft-llama"]["status"] = {"state": {"phase": "Running"}, "retryCount": 2, "running": 2}
    fake.pod("ft-llama-worker-0", "gpu-local-01", "Running", restarts=1)
    fake.pod("ft-llama-worker-1", "gpu-local-02", "Running")
    fake.pod("other-worker-0", "gpu-local-03", "Running", job="other")
    fake.metrics["ft-llama-worker-0"] = ('# TYPE gpucluster_checkpoint_last_step gauge\n'
                                         'gpucluster_checkpoint_last_step{rank="0"} 1400.0\n')
    out = run("train", "status", "ft-llama").output
    assert "ft-llama  gang Running  queue team-nlp  workers running 2/2" in out
    assert "restarts: gang 2, containers 1" in out
    assert "last checkpoint step: 1400" in out
    assert re.search(r"^gpu-local-01\s+ft-llama-worker-0 \(Running\)", out, re.M), out
    assert "other-worker-0" not in out
    proxied = [r["path"] for r in fake.requests if r["path"].endswith("/proxy/metrics")]
    assert proxied == [f"{PODS}/ft-llama-worker-0:9318/proxy/metrics"]


def test_status_of_a_waiting_gang(fake: Fake, spec_file: Path) -> None:
    run("train", "submit", str(spec_file))
    out = run("train", "status", "ft-llama").output
    assert "last checkpoint step: unknown" in out
    assert "no pods yet: the gang waits in its queue until all of its workers fit" in out


def test_status_of_an_unknown_job(fake: Fake) -> None:
    result = run("train", "status", "nope")
    assert result.exit_code == 1
    assert "no training job 'nope' in namespace 'training'" in result.output


def test_logs_by_rank(fake: Fake, spec_file: Path) -> None:
    run("train", "submit", str(spec_file))
    fake.logs["ft-llama-worker-1"] = "step 10 loss 2.1\nstep 20 loss 1.9\n"
    result = run("train", "logs", "ft-llama", "--rank", "1")
    assert result.exit_code == 0
    assert result.output == "step 10 loss 2.1\nstep 20 loss 1.9\n"
    [req] = [r for r in fake.requests if r["path"].endswith("/log")]
    assert req["query"]["container"] == ["trainer"]


def test_logs_follow_streams(fake: Fake, spec_file: Path) -> None:
    run("train", "submit", str(spec_file))
    fake.logs["ft-llama-worker-0"] = "line\n" * 2000
    result = run("train", "logs", "ft-llama", "--follow")
    assert result.output == "line\n" * 2000
    [req] = [r for r in fake.requests if r["path"].endswith("/log")]
    assert req["query"]["follow"] == ["true"]


def test_logs_of_a_pod_without_logs_say_why(fake: Fake, spec_file: Path) -> None:
    run("train", "submit", str(spec_file))
    result = run("train", "logs", "ft-llama")
    assert result.exit_code == 1
    assert "no logs for pod ft-llama-worker-0" in result.output
    assert "has not started, or its node keeps no logs" in result.output


def test_logs_of_a_pod_whose_kubelet_does_not_answer_say_so(fake: Fake, spec_file: Path) -> None:
    """What the local cluster's kwok nodes (and any node without a reachable kubelet) give: a 500."""
    run("train", "submit", str(spec_file))
    fake.log_failures["ft-llama-worker-1"] = 500
    result = run("train", "logs", "ft-llama", "--rank", "1")
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert "no logs for pod ft-llama-worker-1: its node's kubelet did not answer the API server" in result.output


def test_cancel_deletes_job_and_monitor(fake: Fake, spec_file: Path) -> None:
    run("train", "submit", str(spec_file))
    result = run("train", "cancel", "ft-llama")
    assert result.exit_code == 0
    assert "cancelled ft-llama; its checkpoints stay" in result.output
    assert fake.jobs == {} and fake.monitors == {}
    [delete] = [r for r in fake.requests if r["method"] == "DELETE" and "/jobs/" in r["path"]]
    assert delete["query"]["propagationPolicy"] == ["Background"]
    again = run("train", "cancel", "ft-llama")
    assert again.exit_code == 1 and "no training job 'ft-llama'" in again.output


def _attributes(req: dict[str, Any]) -> tuple[str, str, str, str | None]:
    """(apiGroup, resource, verb, name) of a request, as the API server's authorizer sees it."""
    parts = req["path"].strip("/").split("/")
    group = "" if parts[0] == "api" else parts[1]
    rest = parts[parts.index("namespaces") + 2:]
    resource, name = rest[0], (rest[1].split(":")[0] if len(rest) > 1 else None)
    if len(rest) > 2:
        resource = f"{resource}/{rest[2]}"
    verb = {"GET": "get" if name else "list", "PATCH": "patch", "DELETE": "delete"}[req["method"]]
    return group, resource, verb, name


def _allows(rules: list[dict[str, Any]], group: str, resource: str, verb: str, name: str | None) -> bool:
    return any(group in r["apiGroups"] and resource in r["resources"] and verb in r["verbs"]
               and (not r.get("resourceNames") or name in r["resourceNames"]) for r in rules)


def test_the_researcher_role_covers_every_call_and_no_more(fake: Fake, spec_file: Path, local: RunResult) -> None:
    """Every request the commands make is allowed by the stack's researcher Role (SSA create needs create too)."""
    role = local.one("Role", "gpucluster-researcher").inputs
    assert role["metadata"]["namespace"] == NS
    rules = role["rules"]
    fake.logs["ft-llama-worker-0"] = "x\n"
    fake.pod("ft-llama-worker-0", "gpu-local-01", "Running")
    fake.metrics["ft-llama-worker-0"] = ""
    for args in (["submit", str(spec_file)], ["list"], ["status", "ft-llama"], ["logs", "ft-llama"],
                 ["cancel", "ft-llama"]):
        assert run("train", *args).exit_code == 0
    seen = {_attributes(r) for r in fake.requests}
    assert {(g, res, v) for g, res, v, _ in seen} >= {("batch.volcano.sh", "jobs", "patch"), ("", "pods/log", "get"),
                                                      ("", "pods/proxy", "get"), ("", "configmaps", "get")}
    for attrs in seen:
        assert _allows(rules, *attrs), attrs
    for group, resource, _verb, name in seen:
        if _verb == "patch":
            assert _allows(rules, group, resource, "create", name)
    flat = [(g, res, v) for r in rules for g in r["apiGroups"] for res in r["resources"] for v in r["verbs"]]
    assert not [f for f in flat if "*" in f or f[1] in ("secrets", "nodes") or f[2] in ("bind", "escalate")]


@pytest.mark.parametrize("code", [422, 403])
def test_a_guardrail_refusal_is_shown_as_such(fake: Fake, spec_file: Path, monkeypatch: pytest.MonkeyPatch,
                                              code: int) -> None:
    message = ("jobs.batch.volcano.sh \"ft-llama\" is forbidden: ValidatingAdmissionPolicy "
               "'gpucluster-training-volcano-jobs' with binding 'gpucluster-training-volcano-jobs' denied request: "
               "a GPU training pod must set schedulerName: volcano")
    real = handle

    def refusing(f: Fake, method: str, path: str, *rest: Any) -> tuple[int, Any]:
        if method == "PATCH" and "/jobs/" in path:
            return _status(code, message)
        return real(f, method, path, *rest)

    monkeypatch.setattr(sys.modules[__name__], "handle", refusing)
    result = run("train", "submit", str(spec_file))
    assert result.exit_code == 1
    assert "refused by the cluster's training guardrails: " + message in result.output
    assert "no permission" not in result.output


@pytest.mark.parametrize("where", ["before", "after"])
def test_connection_flags_go_before_or_after_the_command_as_in_kubectl(fake: Fake, spec_file: Path,
                                                                      where: str) -> None:
    run("train", "submit", str(spec_file))
    flags = ["-n", "research"]
    args = [*flags, "train", "list"] if where == "before" else ["train", "list", *flags]
    result = run(*args)
    # The fake publishes settings in `training` only: the error shows the flag took effect in both places.
    assert result.exit_code == 1 and "no ConfigMap research/gpucluster-settings" in result.output, result.output


def test_list_as_json_and_yaml_gives_the_objects(fake: Fake, spec_file: Path) -> None:
    run("train", "submit", str(spec_file))
    as_json = json.loads(run("train", "list", "-o", "json").output)
    assert as_json["kind"] == "List" and [j["metadata"]["name"] for j in as_json["items"]] == ["ft-llama"]
    assert yaml.safe_load(run("train", "list", "-o", "yaml").output) == as_json
    wide = run("train", "list", "-o", "wide").output
    assert re.search(r"^NAME\s+PHASE\s+QUEUE\s+TEAM\s+RUNNING\s+MANAGED BY\s+RESTARTS\s+CREATED$", wide, re.M), wide
    bad = run("train", "list", "-o", "xml")
    assert bad.exit_code == 2 and "'xml' is not one of 'json', 'yaml', 'wide'" in bad.output


def test_status_as_json_gives_the_job_and_its_pods(fake: Fake, spec_file: Path) -> None:
    run("train", "submit", str(spec_file))
    fake.pod("ft-llama-worker-0", "gpu-local-01", "Running")
    items = json.loads(run("train", "status", "ft-llama", "-o", "json").output)["items"]
    assert items[0].get("kind") == "Job"
    assert [i["metadata"]["name"] for i in items] == ["ft-llama", "ft-llama-worker-0"]


def test_logs_tail_previous_and_since_reach_the_api(fake: Fake, spec_file: Path) -> None:
    run("train", "submit", str(spec_file))
    fake.logs["ft-llama-worker-0"] = "a\nb\n"
    result = run("train", "logs", "ft-llama", "--tail", "5", "--previous", "--since", "1h30m")
    assert result.exit_code == 0, result.output
    [req] = [r for r in fake.requests if r["path"].endswith("/log")]
    assert (req["query"]["tailLines"], req["query"]["previous"], req["query"]["sinceSeconds"]) == (
        ["5"], ["true"], ["5400"])


@pytest.mark.parametrize("since", ["5x", "m5", "", "0s", "-5m", "1h 30m"])
def test_a_bad_since_is_a_usage_error_naming_the_value(fake: Fake, spec_file: Path, since: str) -> None:
    result = run("train", "logs", "ft-llama", "--since", since)
    assert result.exit_code == 2 and "Invalid value for '--since'" in result.output, result.output
    assert repr(since) in result.output


def test_version() -> None:
    result = run("--version")
    assert result.exit_code == 0 and result.output.startswith("gpucluster, version ")
