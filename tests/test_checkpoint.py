"""Checkpoint storage on the mock runtime: every backend's objects, and nothing that can be deleted."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pulumi
import pytest

from components import mockrt
from components.checkpoint import FIO_BLOCK_SIZE, weekly_schedule
from components.mockrt import RunResult
from tests.conftest import StackRunner
from tests.test_schema_validation import validate_all
from tools.render import write

NS = "training"
ALL_BACKENDS: list[dict[str, Any]] = [
    {"name": "nfs-ckpt", "backend": "nfs", "server": "nfs.local", "share": "/exports/checkpoints", "capacityGi": 1024,
     "writeGbps": 2, "mountOptions": ["nfsvers=4.1", "hard"]},
    {"name": "fsx", "backend": "lustre", "subnetId": "subnet-0abc1234",
     "securityGroupIds": ["sg-0abc1234", "sg-0def5678"], "perUnitStorageThroughput": 1000, "capacityGi": 48000,
     "writeGbps": 40, "mountOptions": ["flock"],
     "extraParameters": {"dataCompressionType": "LZ4"}},
    {"name": "weka", "backend": "weka", "filesystemName": "checkpoints", "apiSecretName": "weka-api",
     "capacityGi": 4096, "writeGbps": 60, "mountOptions": ["readcache"]},
    {"name": "vast", "backend": "vast", "vipPool": "vip1", "rootExport": "/k8s", "viewPolicy": "k8s-ckpt",
     "capacityGi": 4096, "writeGbps": 40},
    {"name": "gpfs", "backend": "static", "driver": "spectrumscale.csi.ibm.com", "volumeHandle": "0;2;7118;fs1;ckpt",
     "volumeAttributes": {"volBackendFs": "fs1"}, "capacityGi": 8192, "writeGbps": 80, "mountOptions": ["noatime"]},
]


@pytest.fixture(scope="module")
def every_backend() -> RunResult:
    config, secrets = mockrt.stack_config("local")
    config["gpu-cluster:checkpoint"] = {"filesystems": ALL_BACKENDS}
    return mockrt.run_program("local", config, secrets)


@pytest.fixture(scope="module")
def resources_json(every_backend: RunResult, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """What `make render` writes: the protect/retainOnDelete proof is read from this file."""
    out = tmp_path_factory.mktemp("render")
    write(every_backend, out)
    data = json.loads((out / "resources.json").read_text())
    assert isinstance(data, dict)
    return data


def rendered(data: dict[str, Any], kind: str, name: str) -> dict[str, Any]:
    found = [r for r in data["resources"] if r["inputs"].get("kind") == kind
             and r["inputs"].get("metadata", {}).get("name") == name]
    assert len(found) == 1, f"{kind} {name}: {len(found)} found"
    resource: dict[str, Any] = found[0]
    return resource


EXPECTED_CLASSES = {
    "nfs-ckpt": ("nfs.csi.k8s.io", {"server": "nfs.local", "share": "/exports/checkpoints", "onDelete": "retain"},
                 ["nfsvers=4.1", "hard"]),
    "fsx": ("fsx.csi.aws.com", {"subnetId": "subnet-0abc1234", "securityGroupIds": "sg-0abc1234,sg-0def5678",
                                "deploymentType": "PERSISTENT_2", "perUnitStorageThroughput": "1000",
                                "dataCompressionType": "LZ4"}, ["flock"]),
    "weka": ("csi.weka.io", {
        "volumeType": "dir/v1", "filesystemName": "checkpoints", "capacityEnforcement": "HARD",
        **{f"csi.storage.k8s.io/{stage}-secret-{part}": value
           for stage in ("provisioner", "controller-publish", "controller-expand", "node-stage", "node-publish")
           for part, value in (("name", "weka-api"), ("namespace", "csi-wekafs"))},
    }, ["readcache"]),
    "vast": ("csi.vastdata.com", {"vip_pool_name": "vip1", "root_export": "/k8s", "view_policy": "k8s-ckpt",
                                  "lb_strategy": "roundrobin"}, None),
}


@pytest.mark.parametrize("name", sorted(EXPECTED_CLASSES))
def test_storage_class_per_dynamic_backend(every_backend: RunResult, name: str) -> None:
    provisioner, parameters, mount_options = EXPECTED_CLASSES[name]
    sc = every_backend.one("StorageClass", f"checkpoints-{name}").inputs
    assert sc["provisioner"] == provisioner
    assert sc["parameters"] == parameters
    assert sc["reclaimPolicy"] == "Retain"
    assert sc["volumeBindingMode"] == "Immediate"
    assert sc.get("mountOptions") == mount_options


@pytest.mark.parametrize("fs", ALL_BACKENDS, ids=[f["name"] for f in ALL_BACKENDS])
def test_claim_per_backend_is_rwx_and_protected(every_backend: RunResult, resources_json: dict[str, Any],
                                                fs: dict[str, Any]) -> None:
    name = f"checkpoints-{fs['name']}"
    claim = every_backend.one("PersistentVolumeClaim", name)
    assert claim.metadata["namespace"] == NS
    assert claim.inputs["spec"]["accessModes"] == ["ReadWriteMany"]
    assert claim.inputs["spec"]["resources"] == {"requests": {"storage": f"{fs['capacityGi']}Gi"}}
    options = rendered(resources_json, "PersistentVolumeClaim", name)["options"]
    assert options["protect"] is True and options["retainOnDelete"] is True


def test_static_volume_is_pre_bound_retained_and_protected(every_backend: RunResult,
                                                           resources_json: dict[str, Any]) -> None:
    pv = every_backend.one("PersistentVolume", "checkpoints-gpfs").inputs["spec"]
    assert pv == {
        "capacity": {"storage": "8192Gi"}, "accessModes": ["ReadWriteMany"], "persistentVolumeReclaimPolicy": "Retain",
        "storageClassName": "", "volumeMode": "Filesystem", "claimRef": {"namespace": NS, "name": "checkpoints-gpfs"},
        "csi": {"driver": "spectrumscale.csi.ibm.com", "volumeHandle": "0;2;7118;fs1;ckpt",
                "volumeAttributes": {"volBackendFs": "fs1"}},
        "mountOptions": ["noatime"],
    }
    claim = every_backend.one("PersistentVolumeClaim", "checkpoints-gpfs").inputs["spec"]
    assert claim["storageClassName"] == "" and claim["volumeName"] == "checkpoints-gpfs"
    options = rendered(resources_json, "PersistentVolume", "checkpoints-gpfs")["options"]
    assert options["protect"] is True and options["retainOnDelete"] is True
    assert not every_backend.by_kind("StorageClass") or all(
        r.metadata["name"] != "checkpoints-gpfs" for r in every_backend.by_kind("StorageClass"))


def test_only_data_holding_objects_are_protected(resources_json: dict[str, Any]) -> None:
    protected = sorted((r["inputs"]["kind"], r["inputs"]["metadata"]["name"]) for r in resources_json["resources"]
                       if r["options"]["protect"])
    assert protected == sorted(
        [("PersistentVolumeClaim", f"checkpoints-{f['name']}") for f in ALL_BACKENDS]
        + [("PersistentVolume", "checkpoints-gpfs")])


def ours(result: RunResult) -> RunResult:
    """Only this component's objects (other components are validated by their own tests)."""
    return RunResult(result.stack, [r for r in result.resources if "CheckpointStorage" in r.urn], {})


def test_every_backend_validates_strictly(every_backend: RunResult) -> None:
    assert len(ours(every_backend).resources) == 4 + 1 + 5 + 1  # classes, volume, claims, component
    assert validate_all(ours(every_backend), "1.34") == []


def test_training_template_mounts_the_claim(local: RunResult) -> None:
    [job] = [r for r in local.by_kind("Job") if r.metadata.get("name") == "smoke-gang"]
    pod = job.inputs["spec"]["tasks"][0]["template"]["spec"]
    [trainer] = pod["containers"]
    assert {"name": "checkpoints", "mountPath": "/checkpoints", "subPath": "smoke-gang"} in trainer["volumeMounts"]
    assert {"name": "checkpoints", "persistentVolumeClaim": {"claimName": "checkpoints-nfs-ckpt"}} in pod["volumes"]
    env = {e["name"]: e.get("value") for e in trainer["env"]}
    assert env["CHECKPOINT_DIR"] == "/checkpoints"
    assert env["CHECKPOINT_INTERVAL_STEPS"] == "500" and env["CHECKPOINT_KEEP_LAST"] == "3"


def test_training_waits_for_the_claims(local: RunResult) -> None:
    # The engine expands a dependency on a component into its children: the claim itself.
    [gang] = [r for r in local.resources if r.type == "gpu-cluster:training:GangTrainingJob"]
    claim = local.one("PersistentVolumeClaim", "checkpoints-nfs-ckpt")
    assert claim.urn in gang.depends_on


def test_a_rename_keeps_the_objects_and_aliases_the_old_names(run_stack: StackRunner) -> None:
    def rename(cfg: dict[str, Any]) -> None:
        fs = cfg["gpu-cluster:checkpoint"]["filesystems"][0]
        fs.update(name="nfs-main", renamedFrom=["nfs-ckpt"])
        cfg["gpu-cluster:training"]["jobs"][0]["checkpoint"]["filesystem"] = "nfs-main"

    result = run_stack("local", rename)
    claim = result.one("PersistentVolumeClaim", "checkpoints-nfs-ckpt")
    assert claim.name == "nfs-main-claim"
    assert claim.aliases == ["nfs-ckpt-claim"]
    assert claim.protect and claim.retain_on_delete
    assert result.one("StorageClass", "checkpoints-nfs-ckpt").aliases == ["nfs-ckpt-class"]
    [job] = [r for r in result.by_kind("Job") if r.metadata.get("name") == "smoke-gang"]
    volumes = job.inputs["spec"]["tasks"][0]["template"]["spec"]["volumes"]
    assert {"name": "checkpoints", "persistentVolumeClaim": {"claimName": "checkpoints-nfs-ckpt"}} in volumes


def test_prod_runs_the_check_weekly_at_a_drawn_time(prod: RunResult) -> None:
    cron = prod.one("CronJob", "checkpoint-check-weka-ckpt")
    minute, hour, dom, month, weekday = cron.inputs["spec"]["schedule"].split()
    assert 0 <= int(minute) <= 59 and 0 <= int(hour) <= 23 and 0 <= int(weekday) <= 6
    assert (dom, month) == ("*", "*")
    pod = cron.inputs["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False
    assert "annotations" not in cron.metadata or not any(
        k.startswith("checkov.io/") for k in cron.metadata["annotations"])
    draws = prod.by_type("random:index/randomInteger:RandomInteger")
    assert {d.inputs["max"] for d in draws} == {59, 23, 6}


def test_prod_throughput_check_job(run_stack: Any) -> None:
    def one_shot(c: dict[str, Any]) -> None:
        c["gpu-cluster:checkpoint"]["throughputCheck"]["weekly"] = False

    prod = run_stack("prod", one_shot)
    job = prod.one("Job", "checkpoint-check-weka-ckpt")
    assert job.metadata["namespace"] == NS
    assert job.metadata["annotations"] == {"pulumi.com/skipAwait": "true"}
    spec = job.inputs["spec"]
    assert (spec["completionMode"], spec["completions"], spec["parallelism"], spec["backoffLimit"]) == (
        "Indexed", 32, 32, 0)
    pod = spec["template"]["spec"]
    [fio] = pod["containers"]
    assert fio["image"] == "registry.gpucluster.io/platform/checkpoint-check:0.1.0"
    assert fio["resources"]["limits"]["nvidia.com/gpu"] == "8"
    assert {"name": "checkpoints", "mountPath": "/work", "subPath": ".throughput-check"} in fio["volumeMounts"]
    assert {"name": "checkpoints", "persistentVolumeClaim": {"claimName": "checkpoints-weka-ckpt"}} in pod["volumes"]
    script = fio["command"][2]
    for flag in ("--rw=write", f"--bs={FIO_BLOCK_SIZE}", "--direct=1", "--end_fsync=1", "--numjobs=8", "--size=16g",
                 "--unlink=1", "--output-format=json"):
        assert flag in script
    assert 'until [ "$(ls /work/"$RUN_ID"/ready | wc -l)" -ge 32 ]' in script
    assert ("checkpoint-reduce /work/\"$RUN_ID\"/results --expect 32 --budget-gbps 33.333 --wait-seconds 3600"
            in script)
    anti = pod["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert anti[0]["topologyKey"] == "kubernetes.io/hostname"
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert fio["securityContext"]["readOnlyRootFilesystem"] is True
    # fio never calls the Kubernetes API: no token in the pod.
    assert pod["automountServiceAccountToken"] is False


@pytest.mark.parametrize(("fio_status", "reduce_status", "verdict"), [(1, 0, 2), (3, 0, 2), (0, 1, 1), (0, 0, 0)])
def test_a_failed_fio_is_invalid_input_not_below_budget(run_stack: Any, tmp_path: Path, fio_status: int,
                                                        reduce_status: int, verdict: int) -> None:
    """The rendered script under sh, with stand-ins for fio and the reducer: fio failing exits 2, never 1."""
    def one_shot(c: dict[str, Any]) -> None:
        c["gpu-cluster:checkpoint"]["throughputCheck"]["weekly"] = False

    [container] = run_stack("prod", one_shot).one("Job", "checkpoint-check-weka-ckpt").inputs["spec"]["template"][
        "spec"]["containers"]
    shell, flag, script = container["command"]
    work = tmp_path / "work"
    (work / "r1" / "ready").mkdir(parents=True)
    for index in range(32):  # every peer already at the barrier
        (work / "r1" / "ready" / str(index)).touch()
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake_fio = bin_dir / "fio"
    fake_fio.write_text('#!/bin/sh\nfor a; do case "$a" in --output=*) echo {} > "${a#--output=}";; esac; done\n'
                        f"exit {fio_status}\n")
    fake_reduce = bin_dir / "checkpoint-reduce"
    fake_reduce.write_text(f"#!/bin/sh\nexit {reduce_status}\n")
    for fake in (fake_fio, fake_reduce):
        fake.chmod(0o755)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "RUN_ID": "r1", "JOB_COMPLETION_INDEX": "0"}
    proc = subprocess.run([shell, flag, script.replace("/work/", f"{work}/")], env=env, capture_output=True,
                          text=True, timeout=60, check=False)
    assert proc.returncode == verdict, proc.stderr
    if fio_status:
        assert "fio failed" in proc.stderr


def seed_value(inputs: dict[str, Any]) -> int:
    """A deterministic stand-in for the provider's draw: the seed's character sum within [min, max]."""
    low, high = int(inputs["min"]), int(inputs["max"])
    return low + sum(map(ord, str(inputs["seed"]))) % (high - low + 1)


class RandomResults(mockrt.RecordingMocks):
    """Mocks that also give pulumi_random integers a value: the seed's hash, within [min, max]."""

    def new_resource(self, args: pulumi.runtime.MockResourceArgs) -> tuple[str | None, dict[Any, Any]]:
        rid, state = super().new_resource(args)
        if args.typ == "random:index/randomInteger:RandomInteger":
            state["result"] = seed_value(args.inputs)
        return rid, state


def test_weekly_check_draws_a_stable_time(run_stack: StackRunner, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(mockrt, "RecordingMocks", RandomResults)

    def weekly(cfg: dict[str, Any]) -> None:
        cfg["gpu-cluster:checkpoint"]["throughputCheck"] = {"enabled": True, "filesystem": "nfs-ckpt", "nodes": 4,
                                                             "weekly": True}

    result = run_stack("local", weekly)
    draws = {r.name: r for r in result.by_type("random:index/randomInteger:RandomInteger")}
    assert sorted(draws) == [f"checkpoint-check-nfs-ckpt-{u}" for u in ("hour", "minute", "weekday")]
    minute, hour, day = (draws[f"checkpoint-check-nfs-ckpt-{u}"] for u in ("minute", "hour", "weekday"))
    assert (minute.inputs["max"], hour.inputs["max"], day.inputs["max"]) == (59, 23, 6)
    assert minute.inputs["keepers"] == {"stack": "local", "filesystem": "checkpoints-nfs-ckpt"}
    cron = result.one("CronJob", "checkpoint-check-nfs-ckpt").inputs["spec"]
    expected = weekly_schedule(*(seed_value(d.inputs) for d in (minute, hour, day)))
    assert cron["schedule"] == expected and re.fullmatch(r"\d+ \d+ \* \* [0-6]", expected)
    assert cron["concurrencyPolicy"] == "Forbid" and cron["timeZone"] == "Etc/UTC"
    assert cron["jobTemplate"]["spec"]["completions"] == 4
    assert validate_all(ours(result), "1.34") == []


@pytest.mark.parametrize(("minute", "hour", "day"), [(60, 0, 0), (0, 24, 0), (0, 0, 7), (-1, 0, 0)])
def test_weekly_schedule_refuses_impossible_times(minute: int, hour: int, day: int) -> None:
    with pytest.raises(ValueError, match="no such time"):
        weekly_schedule(minute, hour, day)


def test_the_check_is_opt_in(local: RunResult) -> None:
    names = [r.metadata.get("name", "") for r in [*local.by_kind("Job"), *local.by_kind("CronJob")]]
    assert not [n for n in names if n.startswith("checkpoint-check")]


def test_prod_objects_validate_strictly(prod: RunResult) -> None:
    assert validate_all(ours(prod), "1.34") == []
