"""The local stand-in for CSI provisioners: the volume each pending claim of a class gets, CSI or, with real nodes,
a host directory every real node mounts."""

from __future__ import annotations

import stat
from pathlib import Path
from types import SimpleNamespace as NS
from typing import Any

from tools.localcluster.provisioner import pv_for, reconcile


def _claim(uid: str = "u1", phase: str = "Pending", volume: str | None = None) -> Any:
    return NS(metadata=NS(uid=uid, namespace="training", name="ckpt-nfs"),
              spec=NS(resources=NS(requests={"storage": "1Ti"}), access_modes=["ReadWriteMany"], volume_mode=None,
                      storage_class_name="ckpt", volume_name=volume),
              status=NS(phase=phase))


SC = NS(metadata=NS(name="ckpt"), provisioner="nfs.csi.k8s.io", reclaim_policy="Retain",
        mount_options=["nfsvers=4.1"], parameters={"server": "nfs.local"})


def test_a_claim_gets_a_volume_of_its_classs_driver_bound_to_it() -> None:
    pv = pv_for(_claim(), SC)
    spec = pv["spec"]
    assert spec["csi"] == {"driver": "nfs.csi.k8s.io", "volumeHandle": "local-u1",
                           "volumeAttributes": {"server": "nfs.local"}}
    assert (spec["persistentVolumeReclaimPolicy"], spec["storageClassName"]) == ("Retain", "ckpt")
    assert spec["mountOptions"] == ["nfsvers=4.1"] and spec["capacity"] == {"storage": "1Ti"}
    assert spec["claimRef"]["uid"] == "u1" and spec["accessModes"] == ["ReadWriteMany"]


def test_with_real_nodes_the_volume_is_a_host_directory_kept_like_the_class_says(tmp_path: Path) -> None:
    pv = pv_for(_claim(), SC, tmp_path)
    spec = pv["spec"]
    assert "csi" not in spec
    assert spec["hostPath"] == {"path": str(tmp_path / "pvc-u1"), "type": "Directory"}
    # Protected as the class says; a host directory takes no NFS mount options.
    assert spec["persistentVolumeReclaimPolicy"] == "Retain" and spec["mountOptions"] == []


class _Core:
    def __init__(self, claims: list[Any]) -> None:
        self.claims, self.made = claims, []  # type: list[Any], list[dict[str, Any]]

    def list_persistent_volume(self) -> Any:
        return NS(items=[NS(metadata=NS(name=pv["metadata"]["name"])) for pv in self.made])

    def list_persistent_volume_claim_for_all_namespaces(self) -> Any:
        return NS(items=self.claims)

    def create_persistent_volume(self, pv: dict[str, Any]) -> None:
        self.made.append(pv)


class _Storage:
    def list_storage_class(self) -> Any:
        return NS(items=[SC])


def test_reconcile_makes_each_pending_claims_directory_before_its_volume_and_only_once(tmp_path: Path) -> None:
    core = _Core([_claim("a"), _claim("b", phase="Bound", volume="pv-b"), _claim("c", volume="chosen")])
    assert reconcile(core, _Storage(), tmp_path) == 1
    made = tmp_path / "pvc-a"
    assert made.is_dir() and stat.S_IMODE(made.stat().st_mode) == 0o1777
    assert [pv["metadata"]["name"] for pv in core.made] == ["pvc-a"]
    assert reconcile(core, _Storage(), tmp_path) == 0  # the volume exists: nothing twice


class _Raw:
    """What a list call returns with ``_preload_content=False``: the body as bytes."""

    def __init__(self, items: list[dict[str, Any]]) -> None:
        import json

        self.data = json.dumps({"items": items}).encode()


def test_every_real_or_kwok_node_gets_a_csinode_with_every_driver_from_plain_json_lists() -> None:
    from tools.localcluster.provisioner import register_drivers

    calls: list[dict[str, Any]] = []
    nodes = [{"metadata": {"name": "gpu-1", "labels": {"type": "kwok"}}},
             {"metadata": {"name": "gpu-2"}},
             {"metadata": {"name": "vk-a", "labels": {"type": "virtual-kubelet"}}}]
    csinodes = [{"metadata": {"name": "gpu-1"}, "spec": {"drivers": [{"name": "nfs.csi.k8s.io"}]}},
                {"metadata": {"name": "gpu-2"}, "spec": {"drivers": [{"name": "other.csi"}]}}]

    class Core:
        def list_node(self, **kwargs: Any) -> _Raw:
            calls.append(kwargs)
            return _Raw(nodes)

    class Storage(_Storage):
        def __init__(self) -> None:
            self.deleted: list[str] = []
            self.created: list[dict[str, Any]] = []

        def list_csi_node(self, **kwargs: Any) -> _Raw:
            calls.append(kwargs)
            return _Raw(csinodes)

        def delete_csi_node(self, name: str) -> None:
            self.deleted.append(name)

        def create_csi_node(self, body: dict[str, Any]) -> None:
            self.created.append(body)

    storage = Storage()
    assert register_drivers(Core(), storage) == 1  # gpu-1 has it already; the virtual node never gets one
    assert storage.deleted == ["gpu-2"]
    assert [c["metadata"]["name"] for c in storage.created] == ["gpu-2"]
    assert storage.created[0]["spec"]["drivers"] == [{"name": "nfs.csi.k8s.io", "nodeID": "gpu-2"}]
    # Served from the watch cache, as plain JSON (no typed models for thousands of nodes).
    assert all(c == {"resource_version": "0", "_preload_content": False} for c in calls)
