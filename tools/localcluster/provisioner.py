"""Stand-in for CSI external-provisioners: binds every pending claim to a PV of its class's driver.

A production cluster runs one provisioner per CSI driver (WEKA, VAST, NFS…); the local cluster has
none, so claims would stay Pending and pods that mount them would never schedule. This loop creates,
for each Pending claim of a StorageClass, a PV with that class's driver, reclaim policy and mount
options, pre-bound to the claim; the PV controller then binds them as it would a provisioned volume.
Nothing is mounted anywhere: kwok pods never start containers.
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
        except Exception as err:  # keep going through API restarts; the error is in the log
            print(f"provisioner: {err!r}", file=sys.stderr, flush=True)
        time.sleep(args.interval)


if __name__ == "__main__":
    sys.exit(main())
