"""Gang scheduling: one batch scheduler for every GPU pod on on-prem nodes.

Decision (see docs/scheduling.md): training *and* inference pods on GPU nodes are placed by
the same gang scheduler (Volcano by default). A batch scheduler cannot preempt pods that the
default scheduler placed, and two schedulers on the same nodes double-book GPUs; with a single
scheduler the capacity view is one, and a pending training gang gets GPUs through Volcano's
``reclaim`` action: the training queue takes GPUs back from the reclaimable inference queue. Queue
shares come from the ``capacity`` plugin with explicit ``deserved`` amounts, not from ``proportion``'s
weights: a training queue deserves every on-prem GPU of its pool(s) and the inference queue deserves
nothing, so every inference pod is always a reclaim victim and a gang that wants the whole pool can
get it (with ``proportion`` a queue reclaims only up to its weighted share, so such a gang never
starts). ``preempt`` (higher PriorityClass wins) only picks victims inside the preemptor's own queue.
Inference pods are annotated preemptable, training pods are not. With more than one pool, training
gets one queue per pool (capability and deserved = the pool's GPUs) so that Volcano's enqueue gate,
which admits a gang only while its queue has room, never lets a gang waiting for one pool keep gangs
for another, idle pool out. A pool with a fabric topology adds a HyperNode per switch (components/fabric.py) and
the ``network-topology-aware`` plugin, which places each gang's ``networkTopology`` (docs/scheduling.md).

Volcano's own controllers come from the Helm chart inside its pinned Go module (components/charts.py;
values built and tested here); the queues
and the scheduler configuration we depend on are first-class objects or chart values, so tests and
policies see them. kube-batch v0.5 remains as a legacy engine for clusters up to 1.24.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any, cast

import pulumi
import pulumi_kubernetes as k8s
import yaml

from agents.defaults import DEFAULT_GPU_RESOURCE, DEFAULT_LABEL_PREFIX
from components import charts, images
from components.config import ClusterConfig, GpuPool, Queue, Scheduling, SchedulingEngine
from components.fabric import HYPERNODE_API, HYPERNODE_KIND, hypernodes, topology_plugin
from components.naming import common_labels, selector_labels
from components.security import (
    API_CLIENT,
    EPHEMERAL_LIMIT,
    EPHEMERAL_REQUEST,
    RUN_AS_USER,
    checkov_skips,
    container_security_context,
    pod_security_context,
    resources,
)

VOLCANO_NAMESPACE = "volcano-system"
KUBE_BATCH_NAMESPACE = "kube-batch"

#: enqueue admits a gang only when its minResources fit; allocate places whole gangs; preempt and
#: reclaim make room for training by evicting inference; backfill fills the gaps with small pods.
VOLCANO_ACTIONS = ["enqueue", "allocate", "preempt", "reclaim", "backfill"]


@dataclass(frozen=True)
class GangSchedulerArgs:
    scheduling: Scheduling
    gpu_resource: str
    system_priority_class: str
    system_pool_selector: dict[str, str]
    #: GPUs per on-prem pool, in stack order (sizes the per-pool training queues).
    pool_gpus: dict[str, int] = field(default_factory=dict)
    #: The pools with a fabric topology (their switches become HyperNodes); empty: every pool is flat.
    topology_pools: list[GpuPool] = field(default_factory=list)
    label_prefix: str = DEFAULT_LABEL_PREFIX

    @classmethod
    def from_config(cls, cfg: ClusterConfig, system_priority_class: str) -> GangSchedulerArgs:
        return cls(
            scheduling=cfg.scheduling,
            gpu_resource=cfg.gpu_resource,
            system_priority_class=system_priority_class,
            system_pool_selector=cfg.system_pool_selector,
            pool_gpus={p.name: p.gpu_count for p in cfg.pools},
            topology_pools=[p for p in cfg.pools if p.topology is not None],
            label_prefix=cfg.label_prefix,
        )

    def queues(self) -> list[Queue]:
        """Every queue to create: the training queue(s), then the inference queue.

        With per-pool training queues each pool gets ``<trainingQueue.name>-<pool>``, not reclaimable, with
        the training queue's weight and a capability of that pool's GPUs (capped by
        ``trainingQueue.gpuCapability`` when set). The capability is what makes Volcano's enqueue gate per
        pool: a gang waiting for a busy pool only holds room in its own pool's queue.

        Deserved GPUs (Volcano ``capacity`` plugin): a training queue deserves every GPU of the pool(s) it
        serves, unless ``gpuDeserved`` says otherwise, so it may reclaim all of them from inference; the
        inference queue deserves none by default, which makes each of its pods an immediate reclaim victim.
        """
        sched = self.scheduling
        base = sched.training_queue
        names = sched.training_queue_names(self.pool_gpus)
        if not sched.queue_per_pool(len(self.pool_gpus)):
            deserved = sum(self.pool_gpus.values()) if base.gpu_deserved is None else base.gpu_deserved
            return [base.model_copy(update={"gpu_deserved": deserved}), sched.inference_queue, *self.team_queues()]
        training = [
            base.model_copy(update={
                "name": names[pool],
                "gpu_capability": gpus if base.gpu_capability is None else min(gpus, base.gpu_capability),
                "gpu_deserved": gpus if base.gpu_deserved is None else min(gpus, base.gpu_deserved),
            })
            for pool, gpus in self.pool_gpus.items()
        ]
        return [*training, sched.inference_queue, *self.team_queues()]

    def team_queues(self) -> list[Queue]:
        """One queue per team, a sibling of the training and inference queues (not their child).

        Deserved = the team's guarantee: below it the team reclaims from inference and from teams above
        theirs, and its own pods are no reclaim victims; capability = its quota (every on-prem GPU when
        unset). Volcano v1.14 could nest these under the training queue (``spec.parent`` with the capacity
        plugin's ``enableHierarchy``), but hierarchy is one switch for the whole scheduler: only leaf queues
        then take jobs, so the training queue would stop taking the stack's own gangs, and with per-pool
        training queues a team would need a child under each. Siblings give the same guarantee and quota.
        """
        total = sum(self.pool_gpus.values())
        return [
            Queue(name=team.queue, weight=1, reclaimable=team.reclaimable,
                  gpu_capability=team.capability_gpus or total, gpu_deserved=team.guarantee_gpus)
            for team in self.scheduling.teams
        ]


KUBE_BATCH_CONF = {
    "actions": "allocate, backfill, preempt",
    "tiers": [
        {"plugins": [{"name": "priority"}, {"name": "gang"}]},
        {"plugins": [{"name": "drf"}, {"name": "predicates"}, {"name": "proportion"}, {"name": "nodeorder"}]},
    ],
}


def volcano_scheduler_conf(gpu_resource: str = DEFAULT_GPU_RESOURCE, topology: bool = False) -> dict[str, Any]:
    """The scheduler configuration: gang first, priority orders jobs, queues share by explicit deserved GPUs.

    ``capacity`` (not ``proportion``): reclaim between queues follows each queue's ``deserved`` amount, so
    the training queue, which deserves every on-prem GPU, can take all of them back from inference. The
    two plugins must not be enabled together (both answer the same queue questions). With ``topology`` (some
    pool has a fabric topology) the ``network-topology-aware`` plugin joins the node-ordering tier: it holds a gang
    with a ``networkTopology`` to its HyperNode tier and packs HyperNodes by ``gpu_resource``.

    Node scoring stays Volcano's default (``nodeorder`` spreads, ``binpack`` packs CPU and memory). Packing GPUs
    instead (``binpack.resources`` on the GPU, ``nodeorder``'s ``leastrequested`` and ``podtopologyspread`` off)
    cut the scheduler's time on the scale shapes, but on the local cluster Volcano then never reclaimed the
    inference replicas a whole-pool gang needed (docs/scale.md); it waits for that to be understood.
    """
    ordering: list[dict[str, Any]] = [
        {"name": "drf"},
        {"name": "predicates"},
        {"name": "capacity"},
        {"name": "nodeorder"},
        {"name": "binpack"},
    ]
    if topology:
        ordering.append(topology_plugin(gpu_resource))
    return {
        "actions": ", ".join(VOLCANO_ACTIONS),
        "tiers": [
            {"plugins": [{"name": "priority"}, {"name": "gang"}, {"name": "conformance"}]},
            {"plugins": ordering},
        ],
    }


#: The chart's scheduler Deployment and container (installer/helm/chart/volcano/templates/scheduler.yaml).
SCHEDULER_DEPLOYMENT = "volcano-scheduler"


def with_scheduler_args(props: dict[str, Any], extra: list[str]) -> dict[str, Any] | None:
    """The chart's scheduler Deployment with ``extra`` flags on its container, or None for any other object: the
    chart has no value for flags such as ``--percentage-nodes-to-find``."""
    if (props.get("kind") != "Deployment"
            or (props.get("metadata") or {}).get("name") != SCHEDULER_DEPLOYMENT):
        return None
    out = copy.deepcopy(props)
    for container in out["spec"]["template"]["spec"]["containers"]:
        if container.get("name") == SCHEDULER_DEPLOYMENT:
            args = [a for a in container.get("args") or [] if a.split("=")[0] not in {e.split("=")[0] for e in extra}]
            container["args"] = [*args, *extra]
    return out


def scheduler_args_transform(extra: list[str]) -> pulumi.ResourceTransform:
    """A Pulumi transform applying :func:`with_scheduler_args` to the chart's objects."""

    def transform(args: pulumi.ResourceTransformArgs) -> pulumi.ResourceTransformResult | None:
        props = with_scheduler_args(dict(args.props), extra)
        return None if props is None else pulumi.ResourceTransformResult(props=props, opts=args.opts)

    return transform


def _chart_resources(cpu: str, memory: str) -> dict[str, Any]:
    """components.security.resources() as plain chart values."""
    return {
        "requests": {"cpu": cpu, "memory": memory, "ephemeral-storage": EPHEMERAL_REQUEST},
        "limits": {"memory": memory, "ephemeral-storage": EPHEMERAL_LIMIT},
    }


def volcano_values(args: GangSchedulerArgs) -> dict[str, Any]:
    """Chart values for the pinned Volcano release (keys of its chart's values.yaml; tests/test_charts.py checks).

    Every Volcano pod runs on the system pool (``default_ns``), as the restricted profile our own pods follow:
    non-root, read-only root filesystem, every capability dropped (the chart's default adds DAC_OVERRIDE,
    which nothing here needs: configuration and certificates are mounted world-readable).
    The admission webhook is off: its TLS certificate comes from a Helm pre-install hook Job, and
    ``helm.v4.Chart`` runs no hooks, so the webhook would never start while its ``failurePolicy: Fail``
    configurations refused every Volcano Job, Queue and PodGroup; the end-to-end test runs Volcano's
    scheduler and controllers without it too. The chart's ValidatingAdmissionPolicies (``vap_enable``) stay
    off as well: offline, the Kubernetes provider (4.25) cannot tell whether that kind is namespaced and the
    preview fails. Training jobs are still validated in the API server by our own policies (TrainingGuardrails).
    """
    return {
        "basic": {"image_tag_version": images.VOLCANO_VERSION, "image_pull_policy": "IfNotPresent"},
        "custom": {
            "scheduler_config_override": yaml.safe_dump(
                volcano_scheduler_conf(args.gpu_resource, topology=bool(args.topology_pools)), sort_keys=False),
            "scheduler_schedule_period": f"{args.scheduling.schedule_period_seconds}s",
            "admission_enable": False,
            "default_ns": args.system_pool_selector,
            "default_sc": {
                "runAsNonRoot": True, "runAsUser": RUN_AS_USER, "runAsGroup": RUN_AS_USER,
                "seccompProfile": {"type": "RuntimeDefault"},
            },
            "default_csc": {
                "runAsNonRoot": True, "runAsUser": RUN_AS_USER, "allowPrivilegeEscalation": False,
                "readOnlyRootFilesystem": True, "privileged": False,
                "capabilities": {"add": [], "drop": ["ALL"]},
            },
            "controller_kube_api_qps": args.scheduling.controller_client.qps,
            "controller_kube_api_burst": args.scheduling.controller_client.burst,
            "scheduler_resources": _chart_resources("500m", "1Gi"),
            "controller_resources": _chart_resources("200m", "512Mi"),
        },
    }


def queue_spec(queue: Queue, gpu_resource: str) -> dict[str, Any]:
    spec: dict[str, Any] = {"weight": queue.weight, "reclaimable": queue.reclaimable}
    if queue.gpu_capability is not None:
        spec["capability"] = {gpu_resource: queue.gpu_capability}
    if queue.gpu_deserved is not None:
        spec["deserved"] = {gpu_resource: queue.gpu_deserved}
    return spec


class GangScheduler(pulumi.ComponentResource):
    """The batch scheduler every on-prem GPU pod goes through, and its queues."""

    scheduler_name: pulumi.Output[str]
    training_queue: pulumi.Output[str]
    training_queues: pulumi.Output[dict[str, str]]
    inference_queue: pulumi.Output[str]

    def __init__(self, name: str, args: GangSchedulerArgs, opts: pulumi.ResourceOptions | None = None) -> None:
        super().__init__("gpu-cluster:scheduling:GangScheduler", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        sched = args.scheduling
        self.queues: dict[str, k8s.apiextensions.CustomResource] = {}
        self.hypernodes: dict[str, k8s.apiextensions.CustomResource] = {}
        if sched.engine is SchedulingEngine.VOLCANO:
            ready: list[pulumi.Resource] = []
            if sched.install:
                ns = k8s.core.v1.Namespace(
                    "volcano-namespace",
                    metadata=k8s.meta.v1.ObjectMetaArgs(
                        name=VOLCANO_NAMESPACE,
                        labels={"pod-security.kubernetes.io/enforce": "baseline",
                                **common_labels("volcano", "gang-scheduler")},
                    ),
                    opts=child,
                )
                # The chart of the pinned Volcano module, from the Go module cache: no chart repository,
                # so a preview renders (and the policy pack sees) every object Volcano brings.
                pct = sched.percentage_of_nodes_to_find
                self.chart = k8s.helm.v4.Chart(
                    "volcano",
                    chart=charts.chart_path(charts.VOLCANO),
                    version=charts.VOLCANO.chart_version,
                    namespace=VOLCANO_NAMESPACE,
                    values=volcano_values(args),
                    opts=pulumi.ResourceOptions(
                        parent=self, depends_on=[ns],
                        transforms=[] if pct is None else [scheduler_args_transform(
                            [f"--percentage-nodes-to-find={pct}"])]),
                )
                ready = [self.chart]
            for queue in args.queues():
                self.queues[queue.name] = k8s.apiextensions.CustomResource(
                    f"queue-{queue.name}",
                    api_version="scheduling.volcano.sh/v1beta1",
                    kind="Queue",
                    metadata=k8s.meta.v1.ObjectMetaArgs(name=queue.name, labels=common_labels(queue.name, "queue")),
                    spec=queue_spec(queue, args.gpu_resource),
                    opts=pulumi.ResourceOptions(parent=self, depends_on=ready),
                )
            self.hypernodes = self._hypernodes(args, ready)
        else:
            self._kube_batch(args, child)
        self.scheduler_name = pulumi.Output.from_input(sched.scheduler_name)
        self.training_queue = pulumi.Output.from_input(sched.training_queue.name)
        self.training_queues = pulumi.Output.from_input(sched.training_queue_names(args.pool_gpus))
        self.inference_queue = pulumi.Output.from_input(sched.inference_queue.name)
        self.register_outputs(
            {
                "scheduler_name": self.scheduler_name,
                "training_queue": self.training_queue,
                "training_queues": self.training_queues,
                "inference_queue": self.inference_queue,
            }
        )

    def _hypernodes(self, args: GangSchedulerArgs, ready: list[pulumi.Resource]
                    ) -> dict[str, k8s.apiextensions.CustomResource]:
        """One HyperNode per switch of every pool with a topology (the chart installs their CRD); a spine after
        its leaves, so Volcano never sees a member that does not exist yet."""
        made: dict[str, k8s.apiextensions.CustomResource] = {}
        for manifest in hypernodes(args.topology_pools, args.label_prefix):
            name = manifest["metadata"]["name"]
            members = [m["selector"]["exactMatch"]["name"] for m in manifest["spec"]["members"]
                       if m["type"] == HYPERNODE_KIND]
            made[name] = k8s.apiextensions.CustomResource(
                f"hypernode-{name}", api_version=HYPERNODE_API, kind=HYPERNODE_KIND,
                metadata=k8s.meta.v1.ObjectMetaArgs(**manifest["metadata"]), spec=manifest["spec"],
                opts=pulumi.ResourceOptions(parent=self, depends_on=[*ready, *(made[m] for m in members)]),
            )
        return made

    def _kube_batch(self, args: GangSchedulerArgs, child: pulumi.ResourceOptions) -> None:
        """Legacy kube-batch v0.5: CRDs as apiextensions.k8s.io/v1, RBAC, config and Deployment."""
        labels = common_labels("kube-batch", "gang-scheduler", "v0.5")
        ns = k8s.core.v1.Namespace(
            "kube-batch-namespace",
            metadata=k8s.meta.v1.ObjectMetaArgs(name=KUBE_BATCH_NAMESPACE, labels=labels),
            opts=child,
        )
        crds = [
            _kube_batch_crd("podgroups", "PodGroup", "Namespaced", child, {
                "minMember": {"type": "integer", "minimum": 1},
                "queue": {"type": "string"},
                "priorityClassName": {"type": "string"},
            }),
            _kube_batch_crd("queues", "Queue", "Cluster", child, {"weight": {"type": "integer", "minimum": 1}}),
        ]
        sa = k8s.core.v1.ServiceAccount(
            "kube-batch-sa",
            metadata=k8s.meta.v1.ObjectMetaArgs(name="kube-batch", namespace=KUBE_BATCH_NAMESPACE, labels=labels),
            automount_service_account_token=True,
            opts=pulumi.ResourceOptions(parent=self, depends_on=[ns]),
        )
        role = k8s.rbac.v1.ClusterRole(
            "kube-batch-role",
            metadata=k8s.meta.v1.ObjectMetaArgs(name="kube-batch", labels=labels),
            rules=_kube_batch_rules(),
            opts=child,
        )
        k8s.rbac.v1.ClusterRoleBinding(
            "kube-batch-binding",
            metadata=k8s.meta.v1.ObjectMetaArgs(name="kube-batch", labels=labels),
            role_ref=k8s.rbac.v1.RoleRefArgs(
                api_group="rbac.authorization.k8s.io", kind="ClusterRole", name="kube-batch"
            ),
            subjects=[
                k8s.rbac.v1.SubjectArgs(kind="ServiceAccount", name="kube-batch", namespace=KUBE_BATCH_NAMESPACE)
            ],
            opts=pulumi.ResourceOptions(parent=self, depends_on=[role, sa]),
        )
        conf = k8s.core.v1.ConfigMap(
            "kube-batch-conf",
            metadata=k8s.meta.v1.ObjectMetaArgs(
                name="kube-batch-conf", namespace=KUBE_BATCH_NAMESPACE, labels=labels
            ),
            data={"kube-batch.conf": yaml.safe_dump(KUBE_BATCH_CONF, sort_keys=False)},
            opts=pulumi.ResourceOptions(parent=self, depends_on=[ns]),
        )
        k8s.apps.v1.Deployment(
            "kube-batch",
            metadata=k8s.meta.v1.ObjectMetaArgs(
                name="kube-batch", namespace=KUBE_BATCH_NAMESPACE, labels=labels,
                annotations=checkov_skips({
                    "CKV_K8S_38": API_CLIENT,
                    "CKV_K8S_8": "legacy kube-batch v0.5 has no documented health endpoint to probe",
                    "CKV_K8S_9": "legacy kube-batch v0.5 has no documented readiness endpoint and serves no Service",
                }),
            ),
            spec=k8s.apps.v1.DeploymentSpecArgs(
                replicas=1,
                selector=k8s.meta.v1.LabelSelectorArgs(match_labels=selector_labels(labels)),
                template=k8s.core.v1.PodTemplateSpecArgs(
                    metadata=k8s.meta.v1.ObjectMetaArgs(labels=labels),
                    spec=k8s.core.v1.PodSpecArgs(
                        service_account_name="kube-batch",
                        priority_class_name=args.system_priority_class,
                        node_selector=args.system_pool_selector,
                        security_context=pod_security_context(),
                        containers=[k8s.core.v1.ContainerArgs(
                            name="kube-batch",
                            image=images.KUBE_BATCH,
                            args=["--logtostderr", "--scheduler-conf=/etc/kube-batch/kube-batch.conf",
                                  "--default-queue=" + args.scheduling.inference_queue.name, "-v=3"],
                            resources=resources("500m", "512Mi"),
                            security_context=container_security_context(),
                            volume_mounts=[
                                k8s.core.v1.VolumeMountArgs(name="conf", mount_path="/etc/kube-batch", read_only=True)
                            ],
                        )],
                        volumes=[k8s.core.v1.VolumeArgs(
                            name="conf", config_map=k8s.core.v1.ConfigMapVolumeSourceArgs(name="kube-batch-conf")
                        )],
                    ),
                ),
            ),
            opts=pulumi.ResourceOptions(parent=self, depends_on=[conf, *crds]),
        )
        for queue in args.queues():
            self.queues[queue.name] = k8s.apiextensions.CustomResource(
                f"queue-{queue.name}",
                api_version="scheduling.incubator.k8s.io/v1alpha1",
                kind="Queue",
                metadata=k8s.meta.v1.ObjectMetaArgs(name=queue.name, labels=common_labels(queue.name, "queue")),
                spec={"weight": queue.weight},
                opts=pulumi.ResourceOptions(parent=self, depends_on=crds),
            )


def _kube_batch_crd(
    plural: str, kind: str, scope: str, opts: pulumi.ResourceOptions, spec_props: dict[str, Any]
) -> k8s.apiextensions.v1.CustomResourceDefinition:
    group = "scheduling.incubator.k8s.io"
    schema = {
        "type": "object",
        "properties": {
            "spec": {"type": "object", "properties": spec_props},
            "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
        },
    }
    return k8s.apiextensions.v1.CustomResourceDefinition(
        f"crd-{plural}",
        metadata=k8s.meta.v1.ObjectMetaArgs(name=f"{plural}.{group}", labels=common_labels("kube-batch", "crd")),
        spec=k8s.apiextensions.v1.CustomResourceDefinitionSpecArgs(
            group=group,
            scope=scope,
            names=k8s.apiextensions.v1.CustomResourceDefinitionNamesArgs(
                plural=plural, singular=kind.lower(), kind=kind, list_kind=f"{kind}List"
            ),
            versions=[k8s.apiextensions.v1.CustomResourceDefinitionVersionArgs(
                name="v1alpha1", served=True, storage=True,
                schema=k8s.apiextensions.v1.CustomResourceValidationArgs(open_apiv3_schema=cast(Any, schema)),
                subresources=k8s.apiextensions.v1.CustomResourceSubresourcesArgs(status={}),
            )],
        ),
        opts=opts,
    )


def _kube_batch_rules() -> list[k8s.rbac.v1.PolicyRuleArgs]:
    rule = k8s.rbac.v1.PolicyRuleArgs
    return [
        rule(api_groups=[""], resources=["pods"], verbs=["get", "list", "watch", "delete"]),
        rule(api_groups=[""], resources=["pods/binding"], verbs=["create"]),
        rule(api_groups=[""], resources=["pods/status"], verbs=["update", "patch"]),
        rule(api_groups=[""], resources=["nodes", "namespaces", "persistentvolumes", "persistentvolumeclaims"],
             verbs=["get", "list", "watch"]),
        rule(api_groups=[""], resources=["events"], verbs=["create", "patch"]),
        rule(api_groups=["storage.k8s.io"], resources=["storageclasses"], verbs=["get", "list", "watch"]),
        rule(api_groups=["policy"], resources=["poddisruptionbudgets"], verbs=["get", "list", "watch"]),
        rule(api_groups=["scheduling.k8s.io"], resources=["priorityclasses"], verbs=["get", "list", "watch"]),
        rule(api_groups=["scheduling.incubator.k8s.io"], resources=["podgroups", "queues"],
             verbs=["get", "list", "watch", "update", "patch"]),
        rule(api_groups=["scheduling.incubator.k8s.io"], resources=["podgroups/status"], verbs=["update", "patch"]),
    ]
