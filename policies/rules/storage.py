"""Checkpoint storage rules: checkpoints are the only copy of weeks of training, so nothing deletes them."""

from __future__ import annotations

from components.config.sizing import termination_grace_seconds
from policies.rules.core import MANDATORY, Resource, RuleContext, as_map, as_seq, quantity, rule
from policies.rules.pods import is_volcano_job, pod_templates


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


def _checkpoint_claim(spec: dict[str, object] | object, ctx: RuleContext) -> str | None:
    for volume in as_seq(as_map(spec).get("volumes")):
        claim = as_map(as_map(volume).get("persistentVolumeClaim")).get("claimName")
        if isinstance(claim, str) and claim in ctx.checkpoint_write_gbps:
            return claim
    return None


@rule(
    "training-grace-holds-a-checkpoint",
    "A training pod that mounts a checkpoint filesystem gets a terminationGracePeriodSeconds that holds one "
    "emergency checkpoint (every rank's shard at its share of the filesystem's write throughput, with margin).",
    MANDATORY,
    "on SIGTERM (an eviction, a reclaim, a preemption) the runtime checkpoints and exits; Kubernetes' 30 s "
    "default kills a large model's checkpoint halfway, and the job loses up to two intervals instead of none",
)
def check_training_grace(res: Resource, ctx: RuleContext) -> list[str]:
    if not (is_volcano_job(res) or (res.kind == "Job" and res.api_version == "batch/v1")):
        return []
    spec = as_map(res.props.get("spec"))
    tasks = as_seq(spec.get("tasks")) if is_volcano_job(res) else [{"replicas": spec.get("parallelism", 1)}]
    templates = pod_templates(res)
    ranks = 0
    for task, template in zip(tasks, templates, strict=False):
        gpus = sum(quantity(as_map(as_map(c).get("resources")).get("limits", {}).get(ctx.gpu_resource)) or 0
                   for _, c in template.containers())
        ranks += int(quantity(as_map(task).get("replicas")) or 1) * max(1, int(gpus))
    out = []
    for template in templates:
        claim = _checkpoint_claim(template.spec, ctx)
        if claim is None:
            continue
        need = termination_grace_seconds(ctx.checkpoint_size_tb, max(ranks, 1), ctx.checkpoint_write_gbps[claim],
                                         ctx.client_link_gbps)
        grace = quantity(template.spec.get("terminationGracePeriodSeconds"))
        have = 30.0 if grace is None else grace
        if have < need:
            out.append(f"{template.where}.terminationGracePeriodSeconds is {have:g}; one emergency checkpoint of "
                       f"{ctx.checkpoint_size_tb:g} TB from {ranks} ranks to {claim} "
                       f"({ctx.checkpoint_write_gbps[claim]:g} GB/s) needs {need} s: set it to at least {need}")
    return out
