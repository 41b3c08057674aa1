"""The training template, the runtime and the alert rules agree, in both directions.

- every environment variable the template sets is read by the runtime (or by PyTorch's NCCL watchdog and
  NCCL, a short documented list), and nothing it reads from the template is missing;
- every metric the training and checkpoint alerts watch, other than the DCGM, kube-state-metrics and
  InfiniBand exporters' own, is produced by the runtime under exactly that name;
- the job's PodMonitor scrapes the port the runtime listens on and adds the ``job_name`` the rules group by.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from components.alert_rules import build_rule_spec
from components.config import ClusterConfig, SchedulingEngine
from components.mockrt import RunResult
from components.observability import alert_thresholds
from components.training_job import TrainingJobArgs, pod_monitor_spec, volcano_job_spec, worker_pod_template
from tools.localcluster.plan import load_stack_config
from training_runtime import TrainingRuntime
from training_runtime.settings import FRAMEWORK_ENV, Settings

ROOT = Path(__file__).resolve().parents[1]
JOB = "smoke-gang"
#: What Volcano adds to worker pod 3 of 4 (pytorch plugin: RANK = index + 1 for a task that is also the
#: master; env plugin: the task index) and stamps as annotations.
VOLCANO_ENV = {"MASTER_ADDR": f"{JOB}-worker-0.{JOB}", "MASTER_PORT": "23456", "WORLD_SIZE": "4", "RANK": "4",
               "VC_TASK_INDEX": "3", "VK_TASK_INDEX": "3"}
ANNOTATIONS = {"volcano.sh/job-retry-count": "2", "scheduling.k8s.io/group-name": f"{JOB}-6f1c2a9e-77aa"}
OTHER_PRODUCERS = ("DCGM_", "kube_", "infiniband_")


def _cfg(stack: str = "local") -> ClusterConfig:
    cfg = load_stack_config(ROOT, stack)
    assert isinstance(cfg, ClusterConfig)
    return cfg


class RecordingEnv(dict[str, str]):
    """An environment that remembers which names were looked up."""

    def __init__(self, values: Mapping[str, str]) -> None:
        super().__init__(values)
        self.read: set[str] = set()

    def get(self, key: str, default: Any = None) -> Any:
        self.read.add(key)
        return super().get(key, default)

    def __getitem__(self, key: str) -> str:
        self.read.add(key)
        return super().__getitem__(key)


def _args(cfg: ClusterConfig | None = None) -> TrainingJobArgs:
    cfg = cfg or _cfg()
    return TrainingJobArgs.from_config(cfg, next(j for j in cfg.training.jobs if j.name == JOB))


def _container(args: TrainingJobArgs | None = None) -> dict[str, Any]:
    spec = volcano_job_spec(args or _args())
    containers: list[dict[str, Any]] = spec["tasks"][0]["template"]["spec"]["containers"]
    return containers[0]


def _resolved_env(container: dict[str, Any]) -> dict[str, str]:
    env: dict[str, str] = {}
    for entry in container["env"]:
        if "value" in entry:
            env[entry["name"]] = entry["value"]
        else:
            path = entry["valueFrom"]["fieldRef"]["fieldPath"]
            key = re.fullmatch(r"metadata\.annotations\['(.+)'\]", path)
            assert key, f"{entry['name']}: unexpected fieldPath {path}"
            env[entry["name"]] = ANNOTATIONS[key.group(1)]
    return env


def test_every_variable_the_template_sets_has_a_reader() -> None:
    env = _resolved_env(_container())
    recorder = RecordingEnv({**VOLCANO_ENV, **env})
    settings = Settings.from_env(recorder)
    unread = set(env) - recorder.read - FRAMEWORK_ENV
    assert not unread, f"the template sets variables nothing reads: {sorted(unread)}"
    assert "NCCL_TIMEOUT_SECONDS" not in env and "TORCH_NCCL_BLOCKING_WAIT" not in env
    # And the values arrive as the stack declared them.
    cfg = _cfg()
    job = next(j for j in cfg.training.jobs if j.name == JOB)
    assert settings.dist.rank == 3 and settings.dist.world_size == 4 and settings.dist.attempt == 2
    assert settings.dist.run_id == ANNOTATIONS["scheduling.k8s.io/group-name"]
    assert settings.collective_timeout_seconds == cfg.training.nccl.collective_timeout_seconds
    assert settings.heartbeat_metric == cfg.observability.step_heartbeat_metric
    assert settings.checkpoint is not None and job.checkpoint is not None
    assert settings.checkpoint.directory == Path(job.checkpoint.mount_path)
    assert settings.checkpoint.interval_steps == job.checkpoint.interval_steps
    assert settings.checkpoint.keep_last == job.checkpoint.keep_last
    assert settings.metrics_port == _container()["ports"][0]["containerPort"] == cfg.training.metrics_port


def test_time_based_interval_reaches_the_runtime() -> None:
    args = _args()
    assert args.job.checkpoint is not None
    timed = replace(args, job=args.job.model_copy(
        update={"checkpoint": args.job.checkpoint.model_copy(update={"interval_seconds": 900})}))
    settings = Settings.from_env({**VOLCANO_ENV, **_resolved_env(_container(timed))})
    assert settings.checkpoint is not None and settings.checkpoint.interval_seconds == 900
    assert "CHECKPOINT_INTERVAL_SECONDS" not in _resolved_env(_container(args))


def test_kube_batch_jobs_get_no_volcano_only_variables() -> None:
    args = replace(_args(), engine=SchedulingEngine.KUBE_BATCH)
    names = {e["name"] for e in worker_pod_template(args)["spec"]["containers"][0]["env"]}
    assert not names & {"TRAINING_RANK_SOURCE", "TRAINING_ATTEMPT", "TRAINING_RUN_ID"}
    assert {"TRAINING_METRICS_PORT", "TRAINING_COLLECTIVE_TIMEOUT_SECONDS", "CHECKPOINT_DIR"} <= names


def _metric_names(expr: str) -> Iterator[str]:
    """Metric names in a PromQL expression: identifiers outside strings, matchers, ranges and label lists."""
    expr = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    expr = re.sub(r"\{[^}]*\}|\[[^\]]*\]", " ", expr)
    expr = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", expr)
    expr = re.sub(r"\boffset\s+[0-9a-z]+", " ", expr)
    for match in re.finditer(r"(?<![0-9.])([a-zA-Z_:][a-zA-Z0-9_:]*)(\s*\()?", expr):
        if match.group(2) is None and match.group(1) not in ("and", "or", "unless", "bool"):
            yield match.group(1)


def test_metric_name_parser_on_a_known_expression() -> None:
    expr = ('changes(hb[15m]) == 0 and hb offset 15m or (max by (namespace, pod) (x{pod!=""}) < 1e-2) '
            '* on (namespace) group_left () kube_pod_labels{label_a="training"}')
    assert sorted(set(_metric_names(expr))) == ["hb", "kube_pod_labels", "x"]


def test_every_metric_the_training_alerts_watch_is_produced(tmp_path: Path) -> None:
    cfg = _cfg()
    spec = build_rule_spec(alert_thresholds(cfg))
    groups = {g["name"]: g["rules"] for g in spec["groups"]}
    watched = {name for group in ("gpucluster.training", "gpucluster.checkpoint") for rule in groups[group]
               for name in _metric_names(rule["expr"]) if not name.startswith(OTHER_PRODUCERS)}
    assert cfg.observability.step_heartbeat_metric in watched and "gpucluster_checkpoint_duration_seconds" in watched

    env = {**_resolved_env(_container()), "CHECKPOINT_DIR": str(tmp_path), "TRAINING_METRICS_PORT": "0",
           "WORLD_SIZE": "1", "TRAINING_RANK_SOURCE": "RANK", "CHECKPOINT_INTERVAL_STEPS": "1",
           "CHECKPOINT_LOCAL_CACHE": str(tmp_path / "shm")}  # the template's is the pod's /dev/shm, not the host's
    rt = TrainingRuntime.from_env(env)
    rt.resume()
    rt.step_done(1)
    rt.maybe_checkpoint(1, lambda: {"w": b"1"})
    rt.close()
    missing = watched - rt.metrics.exposed_names()
    assert not missing, f"alerts watch metrics the runtime does not produce: {sorted(missing)}"


def test_pod_monitor_scrapes_the_runtime_port_and_names_the_job() -> None:
    cfg = _cfg()
    args = _args(cfg)
    template = volcano_job_spec(args)["tasks"][0]["template"]
    container = template["spec"]["containers"][0]
    spec = pod_monitor_spec(args)
    assert spec["namespaceSelector"] == {"matchNames": [cfg.training_namespace]}
    assert spec["selector"]["matchLabels"].items() <= template["metadata"]["labels"].items()
    endpoint = spec["podMetricsEndpoints"][0]
    port = next(p for p in container["ports"] if p["name"] == endpoint["port"])
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert str(port["containerPort"]) == env["TRAINING_METRICS_PORT"]
    assert endpoint["path"] == "/metrics" and endpoint["interval"] == f"{cfg.observability.scrape_interval_seconds}s"
    (relabel,) = endpoint["relabelings"]
    assert relabel["targetLabel"] == "job_name"
    pod_label = {re.sub(r"[^a-zA-Z0-9_]", "_", k): v for k, v in template["metadata"]["labels"].items()}
    assert pod_label[relabel["sourceLabels"][0].removeprefix("__meta_kubernetes_pod_label_")] == JOB


def test_the_stack_declares_the_pod_monitor_next_to_its_job(local: RunResult) -> None:
    cfg = _cfg()
    job = local.one("Job", JOB).inputs
    monitor = local.one("PodMonitor", JOB).inputs
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["metadata"]["namespace"] == job["metadata"]["namespace"] == cfg.training_namespace
    assert monitor["metadata"]["labels"].items() >= cfg.observability.monitor_labels.items()
    assert monitor["spec"] == pod_monitor_spec(_args(cfg))
    schema = json.loads((ROOT / "tests" / "crd_schemas" / "monitoring.coreos.com_v1_PodMonitor.json").read_text())
    jsonschema.validate(monitor, schema)


@pytest.mark.parametrize("stack", ["prod"])
def test_the_prod_example_job_starts_torchrun_on_its_node_rank(stack: str) -> None:
    cfg = _cfg(stack)
    command = " ".join(cfg.training.jobs[0].command)
    # torchrun inside each pod: node rank and rendezvous from Volcano's plugins, expanded by the kubelet.
    assert "--node-rank=$(VC_TASK_INDEX)" in command and "--master-addr=$(MASTER_ADDR)" in command


def test_the_worker_runs_its_command_under_the_supervisor_with_the_stacks_bounds() -> None:
    from components.config import RestartInPlace
    from components.training_spec import SUPERVISOR_COMMAND

    args = _args()
    job = args.job
    assert job.command and job.checkpoint is not None and args.restart_in_place is not None
    container = _container(args)
    assert container["command"] == [*SUPERVISOR_COMMAND, *job.command]
    env = _resolved_env(container)
    assert env["TRAINING_RESTARTS_BEFORE_REPLACE"] == str(args.restart_in_place.restarts_before_replace)
    assert env["TRAINING_REPLACE_TIMEOUT_SECONDS"] == str(args.restart_in_place.replace_timeout_seconds)
    assert Settings.from_env({**VOLCANO_ENV, **env}).in_place.restarts_before_replace == 3
    # Off in the stack, or a job without its own command or a checkpoint: the command runs as given.
    for changed in (replace(args, restart_in_place=None),
                    TrainingJobArgs.from_config(_off(), job),
                    TrainingJobArgs.from_config(_cfg(), job.model_copy(update={"command": []})),
                    TrainingJobArgs.from_config(_cfg(), job.model_copy(update={"checkpoint": None}))):
        plain = _container(changed)
        assert plain.get("command") == (job.command if changed.job.command else None)
        assert "TRAINING_RESTARTS_BEFORE_REPLACE" not in {e["name"] for e in plain["env"]}
        # Without the supervisor nobody would wait for a replaced pod: an eviction restarts the gang.
        policies = {p["event"]: p["action"] for p in volcano_job_spec(changed)["policies"]}
        assert policies == {"PodFailed": "RestartJob", "PodEvicted": "RestartJob", "TaskCompleted": "CompleteJob"}
    policies = {p["event"]: p["action"] for p in volcano_job_spec(args)["policies"]}
    assert policies == {"PodFailed": "RestartJob", "PodEvicted": "RestartPod", "TaskCompleted": "CompleteJob"}
    assert RestartInPlace().enabled


def test_the_local_shard_copy_lives_in_the_pods_memory_only_where_the_gang_restarts_in_place() -> None:
    from components.training_spec import LOCAL_CACHE_PATH

    args = _args()
    container = _container(args)
    env = _resolved_env(container)
    assert env["CHECKPOINT_LOCAL_CACHE"] == LOCAL_CACHE_PATH and LOCAL_CACHE_PATH.startswith("/dev/shm/")
    # Under the memory-backed emptyDir the pod keeps across a worker's restart.
    shm = next(m for m in container["volumeMounts"] if m["mountPath"] == "/dev/shm")
    volumes = volcano_job_spec(args)["tasks"][0]["template"]["spec"]["volumes"]
    assert next(v for v in volumes if v["name"] == shm["name"])["emptyDir"] == {"medium": "Memory"}
    ck = Settings.from_env({**VOLCANO_ENV, **env}).checkpoint
    assert ck is not None and ck.local_cache == Path(LOCAL_CACHE_PATH)
    # Every restart starts new pods where the gang does not restart in place: a copy there would be empty.
    assert "CHECKPOINT_LOCAL_CACHE" not in _resolved_env(_container(replace(args, restart_in_place=None)))


def _off() -> ClusterConfig:
    cfg = _cfg()
    return cfg.model_copy(update={"training": cfg.training.model_copy(update={
        "restart_in_place": cfg.training.restart_in_place.model_copy(update={"enabled": False})})})
