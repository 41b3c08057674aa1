"""Stand-in for CSI external-provisioners: binds every pending claim to a PV of its class's driver.

A production cluster runs one provisioner per CSI driver (WEKA, VAST, NFS…); the local cluster has
none, so claims would stay Pending and pods that mount them would never schedule. This loop creates,
for each Pending claim of a StorageClass, a PV with that class's driver, reclaim policy and mount
options, pre-bound to the claim; the PV controller then binds them as it would a provisioned volume.
Nothing is mounted anywhere: kwok pods never start containers. With real nodes (``--hostpath-root``) the volume
is a directory of this host instead, which every real node mounts: one host is the whole cluster, so a host
directory is as shared as the filesystem it stands in for. The claim, its class, its reclaim policy and mount
options stay the stack's own; only the volume's source differs.

It also stands in for the CSI node plugins: on a real node the driver's node DaemonSet registers the
driver in the node's CSINode object. The gang scheduler counts a pod's CSI volumes as a
``attachable-volumes-csi-<driver>`` resource that only nodes with that CSINode entry offer, so without
it a pod mounting the checkpoint claim never fits anywhere (reclaim rejects every victim set as
"not enough resources"). Every node except virtual-kubelet ones gets a CSINode listing the drivers of
all StorageClasses.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any


def pv_for(claim: Any, sc: Any, hostpath_root: Path | None = None) -> dict[str, Any]:
    """The PersistentVolume a CSI provisioner would create for ``claim`` (pure); with ``hostpath_root``, a directory
    under it as the volume, for real nodes (mount options are dropped: a host directory takes none)."""
    size = (claim.spec.resources.requests or {}).get("storage", "1Gi")
    name = f"pvc-{claim.metadata.uid}"
    source: dict[str, Any] = {"csi": {"driver": sc.provisioner, "volumeHandle": f"local-{claim.metadata.uid}",
                                      "volumeAttributes": dict(sc.parameters or {})}}
    if hostpath_root is not None:
        source = {"hostPath": {"path": str(hostpath_root / name), "type": "Directory"}}
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {
            "name": name,
            "annotations": {"pv.kubernetes.io/provisioned-by": sc.provisioner},
        },
        "spec": {
            "capacity": {"storage": size},
            "accessModes": list(claim.spec.access_modes or ["ReadWriteOnce"]),
            "persistentVolumeReclaimPolicy": sc.reclaim_policy or "Delete",
            "storageClassName": sc.metadata.name,
            "mountOptions": [] if hostpath_root is not None else list(sc.mount_options or []),
            "volumeMode": claim.spec.volume_mode or "Filesystem",
            **source,
            "claimRef": {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                         "namespace": claim.metadata.namespace, "name": claim.metadata.name,
                         "uid": claim.metadata.uid},
        },
    }


def csinode_for(node: str, drivers: list[str]) -> dict[str, Any]:
    """The CSINode a node's CSI node plugins would register (pure); no attach limit, as for NFS."""
    return {
        "apiVersion": "storage.k8s.io/v1",
        "kind": "CSINode",
        "metadata": {"name": node},
        "spec": {"drivers": [{"name": d, "nodeID": node} for d in sorted(drivers)]},
    }


def _items(call: Any) -> list[dict[str, Any]]:
    """A list call's items as plain JSON, served from the API server's watch cache (``resourceVersion=0``).

    Every cycle lists every node and CSINode: at 2,060 nodes the client's typed models made that a fifth of a core
    of this process, and full reads from etcd for the API server; plain JSON from the cache costs a fraction.
    """
    response = call(resource_version="0", _preload_content=False)
    items: list[dict[str, Any]] = json.loads(response.data).get("items") or []
    return items


def register_drivers(core: Any, storage: Any) -> int:
    """Give every non-virtual node a CSINode with every StorageClass's driver; returns how many changed."""
    drivers = sorted({sc.provisioner for sc in storage.list_storage_class().items})
    if not drivers:
        return 0
    have = {c["metadata"]["name"]: sorted(d["name"] for d in (c.get("spec") or {}).get("drivers") or [])
            for c in _items(storage.list_csi_node)}
    changed = 0
    for node in _items(core.list_node):
        name = node["metadata"]["name"]
        if (node["metadata"].get("labels") or {}).get("type") == "virtual-kubelet" or have.get(name) == drivers:
            continue
        if name in have:
            storage.delete_csi_node(name)
        storage.create_csi_node(csinode_for(name, drivers))
        changed += 1
    return changed


def make_volume_dir(path: Path) -> None:
    """The host directory of a real-node volume: writable by every pod's user (a shared filesystem's export is not
    owned by one uid either; the job's own subdirectory is the kubelet's, from the mount's subPath)."""
    path.mkdir(parents=True, exist_ok=True)
    path.chmod(0o1777)


def reconcile(core: Any, storage: Any, hostpath_root: Path | None = None) -> int:
    classes = {sc.metadata.name: sc for sc in storage.list_storage_class().items}
    existing = {pv.metadata.name for pv in core.list_persistent_volume().items}
    made = 0
    for claim in core.list_persistent_volume_claim_for_all_namespaces().items:
        sc = classes.get(claim.spec.storage_class_name or "")
        if claim.status.phase != "Pending" or claim.spec.volume_name or sc is None:
            continue
        if f"pvc-{claim.metadata.uid}" in existing:
            continue
        pv = pv_for(claim, sc, hostpath_root)
        if hostpath_root is not None:
            make_volume_dir(Path(pv["spec"]["hostPath"]["path"]))
        core.create_persistent_volume(pv)
        made += 1
    return made


def main(argv: list[str] | None = None) -> int:
    from kubernetes import client, config

    p = argparse.ArgumentParser(prog="localcluster-provisioner", description=__doc__)
    p.add_argument("--kubeconfig", required=True)
    p.add_argument("--interval", type=float, default=2.0)
    p.add_argument("--hostpath-root", type=Path, help="real nodes: volumes are directories under this one")
    args = p.parse_args(argv)
    api = config.new_client_from_config(config_file=args.kubeconfig)  # type: ignore[no-untyped-call]
    core, storage = client.CoreV1Api(api), client.StorageV1Api(api)
    while True:
        try:
            made = reconcile(core, storage, args.hostpath_root)
            if made:
                print(f"provisioner: created {made} volume(s)", flush=True)
            registered = register_drivers(core, storage)
            if registered:
                print(f"provisioner: registered CSI drivers on {registered} node(s)", flush=True)
        except Exception as err:  # keep going through API restarts; the error is in the log
            print(f"provisioner: {err!r}", file=sys.stderr, flush=True)
        time.sleep(args.interval)


if __name__ == "__main__":
    sys.exit(main())
