"""Checkpoint storage rules: checkpoints are the only copy of weeks of training, so nothing deletes them."""

from __future__ import annotations

from policies.rules.core import MANDATORY, Resource, RuleContext, as_map, as_seq, rule


def is_checkpoint(res: Resource, ctx: RuleContext) -> bool:
    """A checkpoint class, volume or claim: by the stack's checkpoint StorageClasses and volumes (what a claim
    binds to, which renaming or relabelling it does not change), and still by a "checkpoint" name or label."""
    if res.kind not in ("PersistentVolumeClaim", "PersistentVolume", "StorageClass"):
        return False
    spec = as_map(res.props.get("spec"))
    if res.kind == "StorageClass" and res.object_name in ctx.checkpoint_classes:
        return True
    if res.kind == "PersistentVolume" and res.object_name in ctx.checkpoint_volumes:
        return True
    if spec.get("storageClassName") in ctx.checkpoint_classes:
        return True
    if res.kind == "PersistentVolumeClaim" and spec.get("volumeName") in ctx.checkpoint_volumes:
        return True
    return "checkpoint" in res.object_name or any("checkpoint" in str(v) for v in res.labels.values())


@rule(
    "checkpoint-storage-retained",
    "Checkpoint claims and volumes (recognised by their StorageClass or volume, not their name) are "
         "ReadWriteMany, Retain, protected and "
         "retainOnDelete; checkpoint StorageClasses reclaim with Retain (retainOnDelete is judged by `make "
         "policy`; the engine does not report it).",
    MANDATORY,
    "checkpoints are the only copy of weeks of training",
)
def check_checkpoint_storage(res: Resource, ctx: RuleContext) -> list[str]:
    if not is_checkpoint(res, ctx):
        return []
    out = []
    spec = as_map(res.props.get("spec"))
    claim_or_volume = res.kind in ("PersistentVolumeClaim", "PersistentVolume")
    if claim_or_volume and as_seq(spec.get("accessModes")) != ["ReadWriteMany"]:
        out.append(f"accessModes is {as_seq(spec.get('accessModes'))}; every worker of a gang writes its shard, so "
                   "set accessModes: [ReadWriteMany] on a shared-filesystem backend")
    if res.kind == "PersistentVolume" and spec.get("persistentVolumeReclaimPolicy") != "Retain":
        out.append(f"persistentVolumeReclaimPolicy is {spec.get('persistentVolumeReclaimPolicy')!r}; set "
                   "persistentVolumeReclaimPolicy: Retain so deleting the claim keeps the checkpoints")
    if res.kind == "StorageClass" and res.props.get("reclaimPolicy") != "Retain":
        out.append(f"reclaimPolicy is {res.props.get('reclaimPolicy')!r}; set reclaimPolicy: Retain so volumes it "
                   "provisions outlive their claims")
    if res.kind == "StorageClass":
        # Deleting a class never deletes volumes, and its parameters are immutable (a change replaces
        # it): protect would only block legitimate changes. Retain is what its volumes inherit.
        return out
    if not res.options.protect:
        out.append("not protected; register it with ResourceOptions(protect=True) so no infrastructure change "
                   "can delete checkpoints")
    if res.options.retain_on_delete is False:
        out.append("retainOnDelete is off; register it with ResourceOptions(retain_on_delete=True) so removing it "
                   "from the program leaves the object in the cluster")
    return out
