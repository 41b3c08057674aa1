"""Stand-in for CSI external-provisioners: binds every pending claim to a PV of its class's driver.

A production cluster runs one provisioner per CSI driver (WEKA, VAST, NFS…); the local cluster has
none, so claims would stay Pending and pods that mount them would never schedule. This loop creates,
for each Pending claim of a StorageClass, a PV with that class's driver, reclaim policy and mount
options, pre-bound to the claim; the PV controller then binds them as it would a provisioned volume.
Nothing is mounted anywhere: kwok pods never start containers.

It also stands in for the CSI node plugins: on a real node the driver's node DaemonSet registers the
driver in the node's CSINode object. The gang scheduler counts a pod's CSI volumes as a
``attachable-volumes-csi-<driver>`` resource that only nodes with that CSINode entry offer, so without
it a pod mounting the checkpoint claim never fits anywhere (reclaim rejects every victim set as
"not enough resources"). Every node except virtual-kubelet ones gets a CSINode listing the drivers of
all StorageClasses.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any


def pv_for(claim: Any, sc: Any) -> dict[str, Any]:
    """The PersistentVolume a CSI provisioner would create for ``claim`` (pure)."""
    size = (claim.spec.resources.requests or {}).get("storage", "1Gi")
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {
            "name": f"pvc-{claim.metadata.uid}",
            "annotations": {"pv.kubernetes.io/provisioned-by": sc.provisioner},
        },
        "spec": {
            "capacity": {"storage": size},
            "accessModes": list(claim.spec.access_modes or ["ReadWriteOnce"]),
            "persistentVolumeReclaimPolicy": sc.reclaim_policy or "Delete",
            "storageClassName": sc.metadata.name,
            "mountOptions": list(sc.mount_options or []),
            "volumeMode": claim.spec.volume_mode or "Filesystem",
            "csi": {"driver": sc.provisioner, "volumeHandle": f"local-{claim.metadata.uid}",
                    "volumeAttributes": dict(sc.parameters or {})},
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


def register_drivers(core: Any, storage: Any) -> int:
    """Give every non-virtual node a CSINode with every StorageClass's driver; returns how many changed."""
    drivers = sorted({sc.provisioner for sc in storage.list_storage_class().items})
    if not drivers:
        return 0
    have = {c.metadata.name: sorted(d.name for d in (c.spec.drivers or []))
            for c in storage.list_csi_node().items}
    changed = 0
    for node in core.list_node().items:
        name = node.metadata.name
        if (node.metadata.labels or {}).get("type") == "virtual-kubelet" or have.get(name) == drivers:
            continue
        if name in have:
            storage.delete_csi_node(name)
        storage.create_csi_node(csinode_for(name, drivers))
        changed += 1
    return changed


def reconcile(core: Any, storage: Any) -> int:
    classes = {sc.metadata.name: sc for sc in storage.list_storage_class().items}
    existing = {pv.metadata.name for pv in core.list_persistent_volume().items}
    made = 0
    for claim in core.list_persistent_volume_claim_for_all_namespaces().items:
        sc = classes.get(claim.spec.storage_class_name or "")
        if claim.status.phase != "Pending" or claim.spec.volume_name or sc is None:
            continue
        if f"pvc-{claim.metadata.uid}" in existing:
            continue
        core.create_persistent_volume(pv_for(claim, sc))
        made += 1
    return made


def main(argv: list[str] | None = None) -> int:
    from kubernetes import client, config

    p = argparse.ArgumentParser(prog="localcluster-provisioner", description=__doc__)
    p.add_argument("--kubeconfig", required=True)
    p.add_argument("--interval", type=float, default=2.0)
    args = p.parse_args(argv)
    api = config.new_client_from_config(config_file=args.kubeconfig)  # type: ignore[no-untyped-call]
    core, storage = client.CoreV1Api(api), client.StorageV1Api(api)
    while True:
        try:
            made = reconcile(core, storage)
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
