"""A researcher's day end to end on the local control plane (``make e2e``): the CLI as a team member.

A private local cluster gets the local stack through the real engine, with one team (``nlp``: group
``research-nlp``, a guarantee and a quota of 16 GPUs) and the stack's own training jobs off. The burst
controller runs as a local process (it lifts the handover gate). Then, as ``alice`` — a client certificate in
the team's group, no admin — with the ``gpucluster`` console script and her own kubeconfig:

* ``train submit`` a 2-node job: the gang runs whole in the team's queue; ``status``, ``list`` and ``logs``
  (kwok pods keep no logs: what the CLI says then) work;
* a second 2-node job is over the team's quota while the first runs: it waits in the queue with no pods, and
  starts once ``train cancel`` removed the first;
* a Volcano Job with the default scheduler is refused by the admission policy with its message, and so is a
  GPU pod (created by the admin: researchers may not create pods at all);
* with ``admission.mutating: v1beta1`` (the local API server enables the beta), a Volcano Job without the
  priority class and the handover gate is admitted with both added;
* a job of hers for the other team's queue (``vision``) or the training queue is refused by the team-queue
  policy, naming the queue, and so are a change to and ``train cancel`` of the other team's job; the admin's
  job is not held to a team's queue;
* she can read no Secret, and can neither read nor change nodes.

Timings are printed and written to .state/localcluster/e2e-researcher.json.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.cli_venv import install_cli
from tests.polling import wait
from tools.engine_runner import engine_available
from tools.localcluster import control, pki, stackup
from tools.localcluster.plan import Layout, load_stack_config, stack_config_values
from tools.localcluster.realcluster import BUILT, linked_state

ROOT = Path(__file__).resolve().parents[1]
RESULTS = BUILT / "e2e-researcher.json"
GPUCLUSTER = ROOT / ".venv" / "bin" / "gpucluster"
USER, GROUP, TEAM = "alice", "research-nlp", "nlp"
#: A second team alice is not in: its queue is not hers to use.
OTHER_GROUP, OTHER_TEAM = "research-vision", "vision"
TEAM_GPUS = 16
MEASURED: dict[str, Any] = {}


def _prerequisites() -> str | None:
    missing = control.binaries_missing(Layout(BUILT)) + control.binaries_missing(Layout(BUILT), control.VOLCANO)
    if missing:
        return f"local control plane not built ({', '.join(missing)}); run `make localcluster`"
    if not engine_available():
        return "the Pulumi engine is not built (.state/engine); run `make engine`"
    if not GPUCLUSTER.exists():
        return "the gpucluster console script is not installed; run `make venv`"
    return None


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Layout, Path]]:
    """The local cluster with the stack and one team; yields the layout and alice's kubeconfig."""
    reason = _prerequisites()
    if reason:
        pytest.skip(reason)
    lay = linked_state(tmp_path_factory.mktemp("e2e-researcher"))
    backend = tmp_path_factory.mktemp("e2e-researcher-backend")
    raw = stack_config_values(ROOT / "Pulumi.local.yaml")
    training = dict(raw.get("training") or {})
    training["jobs"] = [{**job, "enabled": False} for job in training.get("jobs", [])]
    scheduling = {**dict(raw.get("scheduling") or {}), "teams": [
        {"name": TEAM, "group": GROUP, "guaranteeGpus": TEAM_GPUS, "capabilityGpus": TEAM_GPUS},
        {"name": OTHER_TEAM, "group": OTHER_GROUP, "guaranteeGpus": 8, "capabilityGpus": TEAM_GPUS}]}
    try:
        started = time.monotonic()
        control.up(lay, timeout=300)
        stackup.pulumi_up(lay, "local", backend_url=f"file://{backend}",
                          extra={"gpu-cluster:training": training, "gpu-cluster:scheduling": scheduling,
                                 "gpu-cluster:admission": {"mutating": "v1beta1"}})
        MEASURED["stack_up_s"] = round(time.monotonic() - started, 1)
        notes = stackup.start_agents(lay, "local")
        assert not [n for n in notes if n.startswith("burst-controller")], notes
        ports = control.load_ports(lay)
        assert ports is not None
        cert, key = pki.user_certificate(lay.pki, USER, [GROUP])
        kubeconfig = lay.state / f"{USER}.kubeconfig"
        kubeconfig.write_text(pki.user_kubeconfig_text(f"https://127.0.0.1:{ports['apiserver']}", lay.pki, USER,
                                                       cert, key))
        kubeconfig.chmod(0o600)
        yield lay, kubeconfig
    finally:
        control.down(lay, quiet=True)
        RESULTS.parent.mkdir(parents=True, exist_ok=True)
        RESULTS.write_text(json.dumps(MEASURED, indent=1, sort_keys=True) + "\n")
        print(f"\nresearcher e2e: {json.dumps(MEASURED, sort_keys=True)}")


def cli(kubeconfig: Path, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "KUBECONFIG": str(kubeconfig), "NO_COLOR": "1", "COLUMNS": "200"}
    return subprocess.run([str(GPUCLUSTER), *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=60)


def spec(path: Path, name: str, team: str = TEAM) -> Path:
    path.write_text(f"name: {name}\nimage: registry.gpucluster.io/training/smoke:1.0.0\ncommand: [python, train.py]\n"
                    f"gpus: {{nodes: 2, gpusPerNode: 8}}\ncheckpointInterval: 100\nteam: {team}\n")
    return path


class Api:
    """Reads as the admin, and the same calls as alice."""

    def __init__(self, lay: Layout, kubeconfig: Path) -> None:
        from kubernetes import client, config

        self.admin = control.api_client(lay)
        self.alice = config.new_client_from_config(config_file=str(kubeconfig))  # type: ignore[no-untyped-call]
        self.core: Any = client.CoreV1Api(self.admin)
        self.custom: Any = client.CustomObjectsApi(self.admin)
        self.cfg = load_stack_config(ROOT, "local")

    def pods(self, job: str) -> list[Any]:
        items: list[Any] = self.core.list_namespaced_pod(
            "training", label_selector=f"volcano.sh/job-name={job}").items
        return [p for p in items if p.metadata.deletion_timestamp is None]

    def running(self, job: str) -> int:
        return sum(1 for p in self.pods(job) if p.status.phase == "Running")

    def podgroup(self, job: str) -> dict[str, Any] | None:
        groups = self.custom.list_namespaced_custom_object("scheduling.volcano.sh", "v1beta1", "training",
                                                           "podgroups")["items"]
        return next((g for g in groups if any(o.get("name") == job for o in g["metadata"].get("ownerReferences", []))),
                    None)

    def job_phase(self, job: str) -> str | None:
        try:
            obj = self.custom.get_namespaced_custom_object("batch.volcano.sh", "v1alpha1", "training", "jobs", job)
        except Exception:
            return None
        return str(obj.get("status", {}).get("state", {}).get("phase") or "")


def test_the_stack_declares_the_guardrails_and_the_team(cluster: tuple[Layout, Path]) -> None:
    """The API server serves admissionregistration.k8s.io/v1 and the local stack deployed every policy."""
    from kubernetes import client

    lay, _ = cluster
    api = control.api_client(lay)
    apis: Any = client.ApisApi(api)
    groups = {g.name: [v.version for v in g.versions] for g in apis.get_api_versions().groups}
    assert "v1" in groups["admissionregistration.k8s.io"]
    admission: Any = client.AdmissionregistrationV1Api(api)
    policies = {p.metadata.name for p in admission.list_validating_admission_policy().items}
    assert {"gpucluster-training-pods", "gpucluster-training-volcano-jobs", "gpucluster-burst-toleration",
            "gpucluster-node-burst-taint"} <= policies
    custom: Any = client.CustomObjectsApi(api)
    queue = custom.get_cluster_custom_object("scheduling.volcano.sh", "v1beta1", "queues",
                                                                   f"team-{TEAM}")
    assert queue["spec"]["deserved"] == {"nvidia.com/gpu": TEAM_GPUS}
    assert queue["spec"]["capability"] == {"nvidia.com/gpu": TEAM_GPUS}
    rbac: Any = client.RbacAuthorizationV1Api(api)
    binding = rbac.read_namespaced_role_binding(f"gpucluster-researcher-{TEAM}",
                                                                             "training")
    assert [(s.kind, s.name) for s in binding.subjects] == [("Group", GROUP)]


def test_submit_watch_queue_and_cancel(cluster: tuple[Layout, Path], tmp_path: Path) -> None:
    lay, kubeconfig = cluster
    api = Api(lay, kubeconfig)

    # Submit: the gang runs whole, in the team's queue, only on on-prem nodes.
    started = time.monotonic()
    out = cli(kubeconfig, "train", "submit", str(spec(tmp_path / "a.yaml", "nlp-a")))
    assert out.returncode == 0, out.stderr
    assert "submitted nlp-a: 2 × 8 GPUs in pool local-gpu, queue team-nlp" in out.stdout
    wait("both workers of nlp-a running", lambda: api.running("nlp-a") == 2, 240)
    MEASURED["first_gang_running_s"] = round(time.monotonic() - started, 1)
    group = api.podgroup("nlp-a")
    assert group is not None and group["spec"]["queue"] == f"team-{TEAM}", group
    onprem = {n.metadata.name for n in api.core.list_node(label_selector="gpucluster.io/location=onprem").items}
    assert {p.spec.node_name for p in api.pods("nlp-a")} <= onprem

    status = cli(kubeconfig, "train", "status", "nlp-a")
    assert status.returncode == 0, status.stderr
    assert "gang Running  queue team-nlp  workers running 2/2" in status.stdout, status.stdout
    listed = cli(kubeconfig, "train", "list")
    assert listed.returncode == 0 and "nlp-a" in listed.stdout and "team-nlp" in listed.stdout, listed.stdout

    # kwok runs no containers: there is no log, and the CLI says so in one line (exit 1), not a traceback.
    logs = cli(kubeconfig, "train", "logs", "nlp-a", "--rank", "1")
    MEASURED["logs_on_kwok"] = (logs.returncode, logs.stderr.strip())
    assert logs.returncode == 1 and "Traceback" not in logs.stderr, logs.stderr
    assert "no logs for pod nlp-a-worker-1" in logs.stderr and "did not answer" in logs.stderr, logs.stderr

    # Over the quota: a second 16-GPU gang waits in the team's queue, with no pods, while the first runs.
    assert cli(kubeconfig, "train", "submit", str(spec(tmp_path / "b.yaml", "nlp-b"))).returncode == 0
    submitted_b = time.monotonic()
    time.sleep(20)
    assert api.pods("nlp-b") == [] or api.running("nlp-b") == 0
    assert api.running("nlp-a") == 2
    group_b = api.podgroup("nlp-b")
    assert group_b is not None and group_b.get("status", {}).get("phase") in ("Pending", None), group_b
    waiting = cli(kubeconfig, "train", "status", "nlp-b")
    assert waiting.returncode == 0 and "workers running 0/2" in waiting.stdout, waiting.stdout

    # Cancel the first: it goes, and the waiting gang starts.
    cancelled = cli(kubeconfig, "train", "cancel", "nlp-a")
    assert cancelled.returncode == 0 and "cancelled nlp-a" in cancelled.stdout, cancelled.stderr
    cancel_at = time.monotonic()
    wait("nlp-a gone", lambda: api.job_phase("nlp-a") is None, 60)
    wait("both workers of nlp-b running after nlp-a was cancelled", lambda: api.running("nlp-b") == 2, 240)
    MEASURED["second_gang_waited_s"] = round(cancel_at - submitted_b, 1)
    MEASURED["second_gang_started_after_cancel_s"] = round(time.monotonic() - cancel_at, 1)
    again = cli(kubeconfig, "train", "cancel", "nlp-a")
    assert again.returncode == 1 and "no training job 'nlp-a'" in again.stderr, again.stderr
    assert cli(kubeconfig, "train", "cancel", "nlp-b").returncode == 0


def test_the_cli_installed_alone_dry_runs_against_the_api_server(cluster: tuple[Layout, Path], tmp_path: Path,
                                                                  tmp_path_factory: pytest.TempPathFactory) -> None:
    """The CLI's own distribution in a clean venv (no Pulumi): a server dry run as alice is admitted by the real
    API server (schema, RBAC, the admission policies) and creates nothing; the kubectl plugin prints the names."""
    lay, kubeconfig = cluster
    api = Api(lay, kubeconfig)
    started = time.monotonic()
    venv = install_cli(tmp_path_factory.mktemp("cli-venv"))
    MEASURED["clean_venv_install_s"] = round(time.monotonic() - started, 1)
    job = spec(tmp_path / "dry.yaml", "nlp-dry")
    env = {"KUBECONFIG": str(kubeconfig)}
    dry = venv.run("gpucluster", "train", "submit", str(job), "--dry-run", env=env)
    assert dry.returncode == 0, dry.stderr
    assert "would submit nlp-dry: 2 × 8 GPUs in pool local-gpu, queue team-nlp" in dry.stdout, dry.stdout
    named = venv.run("kubectl-gpucluster", "train", "submit", str(job), "--dry-run=server", "-o", "name", env=env)
    assert named.returncode == 0, named.stderr
    assert named.stdout == "job.batch.volcano.sh/nlp-dry\npodmonitor.monitoring.coreos.com/nlp-dry\n", named.stdout
    # The other team's queue is refused by the admission policy on the dry run too, with its message.
    refused = venv.run("gpucluster", "train", "submit", str(spec(tmp_path / "other.yaml", "nlp-x", OTHER_TEAM)),
                       "--dry-run", env=env)
    assert refused.returncode == 1 and "Traceback" not in refused.stderr, refused.stderr
    assert "gpucluster-team-queues" in refused.stderr and "(queue: team-vision)" in refused.stderr, refused.stderr
    assert api.job_phase("nlp-dry") is None and api.job_phase("nlp-x") is None


def test_the_guardrails_refuse_the_default_scheduler(cluster: tuple[Layout, Path]) -> None:
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    from components.cluster_settings import cluster_settings
    from components.config import Team
    from gpucluster_cli.render import volcano_job
    from gpucluster_cli.spec import parse_spec, resolve

    lay, kubeconfig = cluster
    api = Api(lay, kubeconfig)
    cfg = api.cfg
    assert cfg is not None
    team = Team(name=TEAM, group=GROUP, guarantee_gpus=TEAM_GPUS, capability_gpus=TEAM_GPUS)
    settings = cluster_settings(cfg.model_copy(update={"scheduling": cfg.scheduling.model_copy(
        update={"teams": [team]})}))
    job = resolve(parse_spec(spec(Path(lay.state) / "bad.yaml", "nlp-bad").read_text(), "bad.yaml"), settings,
                  "bad.yaml")
    body = volcano_job(settings, job, TEAM)
    body["spec"]["schedulerName"] = "default-scheduler"
    body["spec"]["tasks"][0]["template"]["spec"]["schedulerName"] = "default-scheduler"
    with pytest.raises(ApiException) as refused:
        client.CustomObjectsApi(api.alice).create_namespaced_custom_object(
            "batch.volcano.sh", "v1alpha1", "training", "jobs", body)
    message = json.loads(str(refused.value.body))["message"]
    MEASURED["volcano_job_refusal"] = (refused.value.status, message)
    assert "gpucluster-training-volcano-jobs" in message
    assert "a GPU pod must go through the gang scheduler volcano" in message
    assert "set schedulerName: volcano" in message

    # A bare GPU pod with the default scheduler (as the admin: researchers may not create pods).
    template = volcano_job(settings, job, TEAM)["spec"]["tasks"][0]["template"]
    pod: Any = {"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": "gpu-default-scheduler", "namespace": "training"},
                "spec": {**template["spec"], "schedulerName": "default-scheduler"}}
    with pytest.raises(ApiException) as refused_pod:
        api.core.create_namespaced_pod("training", pod)
    message = json.loads(str(refused_pod.value.body))["message"]
    MEASURED["pod_refusal"] = (refused_pod.value.status, message)
    assert "gpucluster-training-pods" in message and "set schedulerName: volcano" in message
    with pytest.raises(ApiException) as forbidden:
        client.CoreV1Api(api.alice).create_namespaced_pod("training", pod)
    assert forbidden.value.status == 403


def test_a_researcher_may_use_only_her_teams_queues(cluster: tuple[Layout, Path], tmp_path: Path) -> None:
    """The researcher Role lets every team create and delete Jobs in the training namespace; the team-queue
    policy keeps alice (nlp) off the vision team's queue, its jobs and the platform's training queue, naming
    the queue."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    lay, kubeconfig = cluster
    api = Api(lay, kubeconfig)
    out = cli(kubeconfig, "train", "submit", str(spec(tmp_path / "v.yaml", "nlp-in-vision", OTHER_TEAM)))
    MEASURED["other_team_queue_refusal"] = (out.returncode, out.stderr.strip())
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr
    assert "refused by the cluster's training guardrails" in out.stderr, out.stderr
    assert "gpucluster-team-queues" in out.stderr and "(queue: team-vision)" in out.stderr, out.stderr
    assert api.job_phase("nlp-in-vision") is None

    body = {"apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job",
            "metadata": {"name": "nlp-on-training", "namespace": "training"},
            "spec": {"queue": "training", "minAvailable": 1, "schedulerName": "volcano",
                     "tasks": [{"name": "cpu", "replicas": 1, "template": {"spec": {
                         "restartPolicy": "Never",
                         "containers": [{"name": "c", "image": "registry.gpucluster.io/tools/busybox:1.37"}]}}}]}}
    with pytest.raises(ApiException) as refused:
        client.CustomObjectsApi(api.alice).create_namespaced_custom_object(
            "batch.volcano.sh", "v1alpha1", "training", "jobs", body, dry_run="All")
    message = json.loads(str(refused.value.body))["message"]
    assert "(queue: training)" in message and "your team's queue" in message, message
    # The admin (in no team's group) is not held to a team's queue.
    admin: Any = client.CustomObjectsApi(api.admin)
    admin.create_namespaced_custom_object("batch.volcano.sh", "v1alpha1", "training", "jobs", body, dry_run="All")

    # Another team's job: alice can neither change it nor cancel it.
    vision = {**body, "metadata": {"name": "vision-job", "namespace": "training"},
              "spec": {**body["spec"], "queue": f"team-{OTHER_TEAM}"}}
    admin.create_namespaced_custom_object("batch.volcano.sh", "v1alpha1", "training", "jobs", vision)
    try:
        with pytest.raises(ApiException) as changed:
            client.CustomObjectsApi(api.alice).patch_namespaced_custom_object(
                "batch.volcano.sh", "v1alpha1", "training", "jobs", "vision-job",
                {"metadata": {"labels": {"touched-by": USER}}})
        assert "(queue: team-vision)" in json.loads(str(changed.value.body))["message"]
        with pytest.raises(ApiException) as taken:  # nor take it into her own team's queue
            client.CustomObjectsApi(api.alice).patch_namespaced_custom_object(
                "batch.volcano.sh", "v1alpha1", "training", "jobs", "vision-job",
                {"spec": {"queue": f"team-{TEAM}"}}, dry_run="All")
        assert "(queue: team-vision)" in json.loads(str(taken.value.body))["message"]
        cancel = cli(kubeconfig, "train", "cancel", "vision-job")
        MEASURED["other_team_cancel_refusal"] = (cancel.returncode, cancel.stderr.strip())
        assert cancel.returncode == 1 and "refused by the cluster's training guardrails" in cancel.stderr, cancel.stderr
        assert "(queue: team-vision)" in cancel.stderr, cancel.stderr
        assert api.job_phase("vision-job") is not None, "the other team's job was deleted"
    finally:
        admin.delete_namespaced_custom_object("batch.volcano.sh", "v1alpha1", "training", "jobs", "vision-job")


def test_the_researcher_reads_no_secrets_and_touches_no_nodes(cluster: tuple[Layout, Path]) -> None:
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    lay, kubeconfig = cluster
    api = Api(lay, kubeconfig)
    alice = client.CoreV1Api(api.alice)
    assert api.cfg is not None
    node = api.cfg.pools[0].node_names[0]
    calls: dict[str, Callable[[], Any]] = {
        "list secrets in training": lambda: alice.list_namespaced_secret("training"),
        "get a secret in training": lambda: alice.read_namespaced_secret("anything", "training"),
        "list secrets everywhere": lambda: alice.list_secret_for_all_namespaces(),
        "list nodes": lambda: alice.list_node(),
        "get a node": lambda: alice.read_node(node),
        "label a node": lambda: alice.patch_node(node, {"metadata": {"labels": {"x": "y"}}}),
        "list pods in inference": lambda: alice.list_namespaced_pod("inference"),
    }
    statuses = {}
    for what, call in calls.items():
        with pytest.raises(ApiException) as denied:
            call()
        statuses[what] = denied.value.status
    assert set(statuses.values()) == {403}, statuses
    # What she may do: read the settings and the pods of her namespace.
    alice.read_namespaced_config_map("gpucluster-settings", "training")
    alice.list_namespaced_pod("training")


def test_the_mutating_policy_adds_the_class_and_the_gate(cluster: tuple[Layout, Path]) -> None:
    """admission.mutating: v1beta1 on 1.35 (feature gate on): a Job missing both gets both, then passes."""
    from kubernetes import client

    from components.cluster_settings import cluster_settings
    from components.config import Team
    from gpucluster_cli.render import volcano_job
    from gpucluster_cli.spec import parse_spec, resolve

    lay, kubeconfig = cluster
    api = Api(lay, kubeconfig)
    assert api.cfg is not None
    admission: Any = client.AdmissionregistrationV1beta1Api(api.admin)
    assert [p.metadata.name for p in admission.list_mutating_admission_policy().items] == [
        "gpucluster-training-defaults"]
    team = Team(name=TEAM, group=GROUP, guarantee_gpus=TEAM_GPUS, capability_gpus=TEAM_GPUS)
    settings = cluster_settings(api.cfg.model_copy(update={"scheduling": api.cfg.scheduling.model_copy(
        update={"teams": [team]})}))
    job = resolve(parse_spec(spec(Path(lay.state) / "bare.yaml", "nlp-bare").read_text(), "bare.yaml"), settings,
                  "bare.yaml")
    body = volcano_job(settings, job, TEAM)
    template = body["spec"]["tasks"][0]["template"]["spec"]
    del body["spec"]["priorityClassName"], template["priorityClassName"], template["schedulingGates"]
    custom: Any = client.CustomObjectsApi(api.alice)
    admitted = custom.create_namespaced_custom_object("batch.volcano.sh", "v1alpha1", "training", "jobs", body,
                                                      dry_run="All")
    assert admitted["spec"]["priorityClassName"] == "gpu-training"
    assert admitted["spec"]["tasks"][0]["template"]["spec"]["schedulingGates"] == [{"name": "gpucluster.io/handover"}]
    MEASURED["mutating_policy"] = "v1beta1: priorityClassName and the handover gate added to a bare Volcano Job"
