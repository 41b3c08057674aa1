"""Checkpoint config errors: each backend's missing or wrong parameters, with the message users see."""

from __future__ import annotations

from typing import Any

import pytest

from components.config import ConfigError, parse_config

STACK_FILE = "Pulumi.test.yaml"
LUSTRE = {"name": "fsx", "backend": "lustre", "subnetId": "subnet-0abc1234", "securityGroupIds": ["sg-0abc1234"],
          "deploymentType": "PERSISTENT_2", "perUnitStorageThroughput": 1000, "capacityGi": 48000, "writeGbps": 40}
WEKA = {"name": "weka", "backend": "weka", "filesystemName": "checkpoints", "apiSecretName": "weka-api",
        "writeGbps": 60}


def missing(key: str, backend: str) -> str:
    return f"checkpoint.filesystems[0].{key}: required key is missing (backend '{backend}' needs it)"


def raw(filesystems: list[dict[str, Any]], **checkpoint: Any) -> dict[str, Any]:
    return {
        "pools": [{"name": "gpu", "nodes": ["gpu-[01-04]"]}],
        "systemPool": {"nodes": ["cpu-01"]},
        "checkpoint": {"filesystems": filesystems, **checkpoint},
    }


def error_of(filesystems: list[dict[str, Any]], **checkpoint: Any) -> str:
    with pytest.raises(ConfigError) as caught:
        parse_config(raw(filesystems, **checkpoint), STACK_FILE)
    text = str(caught.value)
    assert text.startswith(f"invalid stack configuration in {STACK_FILE}:")
    return text


def test_valid_backends_parse() -> None:
    cfg = parse_config(raw([
        {"name": "nfs", "backend": "nfs", "server": "nfs.example", "share": "/exports/ckpt", "writeGbps": 2},
        LUSTRE, WEKA,
        {"name": "vast", "backend": "vast", "vipPool": "vip1", "rootExport": "/k8s", "viewPolicy": "default",
         "writeGbps": 40},
        {"name": "gpfs", "backend": "static", "driver": "spectrumscale.csi.ibm.com", "volumeHandle": "0;2;123",
         "writeGbps": 80},
    ]), STACK_FILE)
    assert [f.driver_name for f in cfg.checkpoint.filesystems] == [
        "nfs.csi.k8s.io", "fsx.csi.aws.com", "csi.weka.io", "csi.vastdata.com", "spectrumscale.csi.ibm.com"]


@pytest.mark.parametrize(
    ("filesystem", "expected"),
    [
        ({**WEKA, "filesystemName": None}, missing("filesystemName", "weka")),
        ({**WEKA, "apiSecretName": None}, missing("apiSecretName", "weka")),
        ({**WEKA, "server": "nfs.example"}, "checkpoint.filesystems[0].server: applies only to backend 'nfs', "
                                            "not 'weka' (got \"nfs.example\")"),
        ({**WEKA, "capacityEnforcement": "STRICT"},
         "checkpoint.filesystems[0].capacityEnforcement: Input should be 'HARD' or 'SOFT'"),
        ({"name": "n", "backend": "nfs", "server": "nfs.example", "writeGbps": 1},
         missing("share", "nfs")),
        ({"name": "n", "backend": "nfs", "writeGbps": 1},
         missing("server", "nfs")),
        ({"name": "n", "backend": "nfs", "server": "nfs.example", "share": "exports", "writeGbps": 1},
         "checkpoint.filesystems[0].share: must be an absolute export path such as '/exports/checkpoints' "
         "(got \"exports\")"),
        ({**LUSTRE, "subnetId": None}, missing("subnetId", "lustre")),
        ({**LUSTRE, "securityGroupIds": []}, "checkpoint.filesystems[0].securityGroupIds: List should have at least 1 "
                                             "item"),
        ({**LUSTRE, "subnetId": "subnet-a,subnet-b"}, "subnetId must be one subnet id like 'subnet-0abc1234' "
                                                      "(got 'subnet-a,subnet-b'); FSx for Lustre takes exactly one"),
        ({**LUSTRE, "securityGroupIds": ["default"]}, "securityGroupIds must be ids like 'sg-0abc1234' "
                                                      "(got ['default'])"),
        ({**LUSTRE, "deploymentType": "SCRATCH_2"}, "deploymentType 'SCRATCH_2' does not replicate data; "
                                                    "checkpoints need one of ['PERSISTENT_1', 'PERSISTENT_2']"),
        ({**LUSTRE, "deploymentType": "PERSISTENT_3"}, "deploymentType must be one of ['PERSISTENT_1', "
                                                       "'PERSISTENT_2'] (got 'PERSISTENT_3')"),
        ({**LUSTRE, "perUnitStorageThroughput": 200}, "perUnitStorageThroughput for PERSISTENT_2 must be one of "
                                                      "[125, 250, 500, 1000] MB/s/TiB (got 200)"),
        ({**LUSTRE, "perUnitStorageThroughput": None}, missing("perUnitStorageThroughput", "lustre")),
        ({**LUSTRE, "capacityGi": 5000}, "capacityGi for FSx for Lustre must be 1200 or a multiple of 2400 "
                                         "(got 5000)"),
        ({**LUSTRE, "writeGbps": 50}, "writeGbps (50) exceeds what FSx provisions for capacityGi × "
                                      "perUnitStorageThroughput (46.9 GB/s)"),
        ({**LUSTRE, "extraParameters": {"fileSystemId": "fs-1"}},
         "extraParameters ['fileSystemId'] are not FSx CSI StorageClass parameters"),
        ({"name": "v", "backend": "vast", "vipPool": "vip1", "rootExport": "/k8s", "writeGbps": 1},
         missing("viewPolicy", "vast")),
        ({"name": "v", "backend": "vast", "vipPool": "vip1", "rootExport": "k8s", "viewPolicy": "p", "writeGbps": 1},
         "checkpoint.filesystems[0].rootExport: must be an absolute path such as '/k8s' (got \"k8s\")"),
        ({"name": "v", "backend": "vast", "vipPool": "vip1", "rootExport": "/k8s", "viewPolicy": "p",
          "lbStrategy": "leastconn", "writeGbps": 1},
         "checkpoint.filesystems[0].lbStrategy: Input should be 'roundrobin' or 'random'"),
        ({"name": "s", "backend": "static", "driver": "csi.example.com", "writeGbps": 1},
         missing("volumeHandle", "static")),
        ({"name": "s", "backend": "static", "driver": "Not A Driver", "volumeHandle": "h", "writeGbps": 1},
         "checkpoint.filesystems[0].driver: must be a CSI driver name such as 'spectrumscale.csi.ibm.com' "
         "(got \"Not A Driver\")"),
        ({"name": "s", "backend": "static", "driver": "csi.example.com", "volumeHandle": "h", "writeGbps": 1,
          "extraParameters": {"a": "b"}},
         "extraParameters apply to StorageClasses; a static volume takes volumeAttributes"),
        ({**WEKA, "volumeHandle": "h"}, "checkpoint.filesystems[0].volumeHandle: applies only to backend "
                                        "'static', not 'weka'"),
        ({**WEKA, "writeGbps": 0}, "checkpoint.filesystems[0].writeGbps: Input should be greater than 0"),
        ({**WEKA, "backend": "gpfs"}, "checkpoint.filesystems[0].backend: Input should be 'nfs', 'lustre', "
                                      "'weka', 'vast' or 'static'"),
        ({k: v for k, v in WEKA.items() if k != "backend"},
         "checkpoint.filesystems[0].backend: required key is missing; input should be 'nfs', 'lustre', 'weka', "
         "'vast' or 'static'"),
        ({**WEKA, "lbStrategy": "random"}, "checkpoint.filesystems[0].lbStrategy: applies only to backend 'vast', "
                                           "not 'weka'"),
        ({**WEKA, "sever": "nfs.example"}, "checkpoint.filesystems[0].sever: unknown key; check the spelling against "
                                           "the configuration reference in docs/configuration.md"),
        ({**WEKA, "renamedFrom": ["weka"]}, "renamedFrom must list earlier names, not the current name 'weka'"),
    ],
)
def test_backend_errors(filesystem: dict[str, Any], expected: str) -> None:
    filesystem = {k: v for k, v in filesystem.items() if v is not None}
    assert expected in error_of([filesystem])


def test_strict_budget_fails_with_the_write_gbps_key() -> None:
    text = error_of([{**WEKA, "writeGbps": 20}], strict=True)
    assert ("checkpoint.filesystems[0].writeGbps: filesystem 'weka' cannot meet the checkpoint budget: declares "
            "20 GB/s but 1 TB in 30 s needs 33.3 GB/s; one checkpoint would take 50 s (got 20.0)") in text


def test_non_strict_budget_only_warns() -> None:
    assert parse_config(raw([{**WEKA, "writeGbps": 20}]), STACK_FILE).checkpoint.strict is False


def test_strict_too_few_writers_names_the_budget_writers() -> None:
    text = error_of([WEKA], strict=True, budget={"sizeTb": 2, "seconds": 20, "writers": 1})
    assert "checkpoint.budget.writers: filesystem 'weka' cannot meet the checkpoint budget: 1 writers need " \
           "100.0 GB/s each, more than one 50 GB/s client link; add writers (got 1)" in text


def test_check_must_fit_its_pool() -> None:
    text = error_of([WEKA], throughputCheck={"enabled": True, "filesystem": "weka", "nodes": 8})
    assert "checkpoint.throughputCheck.nodes: pool 'gpu' has only 4 nodes (got 8)" in text
    text = error_of([WEKA], throughputCheck={"enabled": True, "filesystem": "weka", "pool": "h200"})
    assert "checkpoint.throughputCheck.pool: unknown pool; expected one of ['gpu'] (got \"h200\")" in text


def test_check_needs_a_declared_filesystem() -> None:
    text = error_of([WEKA], throughputCheck={"enabled": True, "filesystem": "nfs", "nodes": 2})
    assert "checkpoint.throughputCheck.filesystem: must name a declared filesystem; expected one of ['weka']" in text


def test_a_rename_cannot_steal_another_claim() -> None:
    text = error_of([WEKA, {**WEKA, "name": "weka2", "renamedFrom": ["weka"]}])
    assert "checkpoint.filesystems[1].renamedFrom: two filesystems would own the claim 'checkpoints-weka'" in text
