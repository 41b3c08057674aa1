# ruff: noqa: E501  (one case per line reads as a table)
"""Broken stack files: each case mutates Pulumi.prod.yaml or Pulumi.local.yaml (or replaces its text) and names
the fragments the loader's message must contain (the key path, and for file-level errors the line)."""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[3]
K = "gpu-cluster:"

Doc = dict[str, Any]


@dataclass(frozen=True)
class Case:
    """One broken stack file: ``edit`` changes the parsed document, or ``text`` rewrites the file's text."""

    id: str
    stack: str
    expect: tuple[str, ...]
    edit: Callable[[Doc], None] | None = None
    text: Callable[[str], str] | None = None
    notes: str = field(default="")

    def render(self) -> str:
        original = (ROOT / f"Pulumi.{self.stack}.yaml").read_text()
        if self.text is not None:
            return self.text(original)
        doc = copy.deepcopy(yaml.safe_load(original))
        assert self.edit is not None
        self.edit(doc["config"])
        return yaml.safe_dump(doc, sort_keys=False)


def at(path: str, value: Any) -> Callable[[Doc], None]:
    """Set ``path`` (``burst.openHoldSeconds``, ``pools[0].nodes``) under the project's keys; the first part is
    the top-level key, created as a mapping when absent."""

    def edit(config: Doc) -> None:
        parts: list[str | int] = []
        for piece in path.replace("]", "").split("."):
            name, *indexes = piece.split("[")
            parts.append(name)
            parts += [int(i) for i in indexes]
        top, *rest = parts
        key = f"{K}{top}"
        if not rest:
            config[key] = value
            return
        node = config.setdefault(key, {})
        for part in rest[:-1]:
            node = node[part] if isinstance(part, int) else node.setdefault(part, {})
        node[rest[-1]] = value

    return edit


def secret(key: str) -> Callable[[Doc], None]:
    def edit(config: Doc) -> None:
        config[f"{K}{key}"] = {"secure": "v1:c2VjcmV0:placeholder"}

    return edit


def replace(old: str, new: str) -> Callable[[str], str]:
    def edit(text: str) -> str:
        assert old in text, old
        return text.replace(old, new, 1)

    return edit


def const(text: str) -> Callable[[str], str]:
    return lambda _original: text


L, P = "local", "prod"
SVC = "inference.services[0]"
JOB = "training.jobs[0]"
CREDS_URL = "amqp://worker:hunter2@queue.local:5672/jobs"

CASES: list[Case] = [
    # The file itself.
    Case("yaml-unclosed-flow", L, ("line 7",), text=replace('nodes: ["gpu-local-[01-04]"]', 'nodes: ["gpu-local-[01-04]"')),
    Case("yaml-bad-indent", L, ("line",), text=replace("      gpusPerNode: 8", "     gpusPerNode: 8")),
    Case("yaml-tab", L, ("line",), text=replace("      gpuModel:", "\tgpuModel:")),
    Case("yaml-unclosed-quote", L, ("line",), text=replace('"1.35"', '"1.35')),
    Case("file-is-list", L, ("must be a mapping",), text=const("- config\n- pools\n")),
    Case("file-is-scalar", L, ("must be a mapping",), text=const("just some text\n")),
    Case("config-is-list", L, ("config", "must be a mapping"), text=const("config:\n  - gpu-cluster:pools\n")),
    Case("config-is-scalar", L, ("config", "must be a mapping"), text=const("config: 3\n")),
    Case("empty-file", L, ("pools", "required key is missing"), text=const("")),
    Case("duplicate-top-key", L, ("gpu-cluster:burst", "duplicate key", "line"),
         text=lambda t: t + "  gpu-cluster:burst:\n    openHoldSeconds: 5\n"),
    Case("duplicate-nested-key", L, ("gpusPerNode", "duplicate key", "line 9", "first on line 8"),
         text=replace("      gpusPerNode: 8\n", "      gpusPerNode: 8\n      gpusPerNode: 4\n")),
    Case("non-string-key", L, ("config", "key"), text=lambda t: t + "  7: seven\n"),
    # A misspelled namespace would be passed by the engine and read by nothing: the setting would not apply.
    Case("misspelled-namespace", L, ("gpu-clustr:burst", "unknown config namespace 'gpu-clustr'",
                                     "did you mean 'gpu-cluster:burst'"),
         text=lambda t: t + "  gpu-clustr:burst:\n    openBelowFreeGpus: 2\n"),
    Case("misspelled-namespace-and-key", P, ("gpu-clustr:burts", "did you mean 'gpu-cluster:burst'"),
         text=lambda t: t + "  gpu-clustr:burts: {}\n"),
    Case("foreign-provider-namespace", L, ("aws:region", "unknown config namespace 'aws'",
                                           "a key under 'gpu-cluster:'"),
         text=lambda t: t + "  aws:region: us-east-1\n"),
    Case("secure-not-a-string", L, ("localCloudToken", "secure"),
         text=replace("secure: v1:bG9jYWw=:placeholder", "secure: [1, 2]")),
    # Cron, quantities, paths.
    Case("cron-minute-61", L, ("descheduler.schedule",), edit=at("descheduler.schedule", "61 * * * *")),
    Case("cron-words", L, ("descheduler.schedule",), edit=at("descheduler.schedule", "a b c d e")),
    Case("cron-step-zero", P, ("descheduler.schedule",), edit=at("descheduler.schedule", "*/0 * * * *")),
    Case("cron-month-13", P, ("descheduler.schedule",), edit=at("descheduler.schedule", "0 0 1 13 *")),
    Case("cpu-word", L, (f"{SVC}.cpu",), edit=at(f"{SVC}.cpu", "one")),
    Case("memory-gb-space", L, (f"{SVC}.memory",), edit=at(f"{SVC}.memory", "2 GB")),
    Case("memory-bad-suffix", P, (f"{JOB}.memoryPerWorker",), edit=at(f"{JOB}.memoryPerWorker", "16GB")),
    Case("cpu-negative", L, (f"{JOB}.cpuPerWorker",), edit=at(f"{JOB}.cpuPerWorker", "-4")),
    Case("cpu-zero", L, (f"{SVC}.cpu",), edit=at(f"{SVC}.cpu", "0")),
    Case("mount-relative", P, (f"{JOB}.checkpoint.mountPath",), edit=at(f"{JOB}.checkpoint.mountPath", "checkpoints")),
    Case("mount-dotdot", L, (f"{JOB}.checkpoint.mountPath",), edit=at(f"{JOB}.checkpoint.mountPath", "/ckpt/../etc")),
    Case("mount-root", L, (f"{JOB}.checkpoint.mountPath",), edit=at(f"{JOB}.checkpoint.mountPath", "/")),
    Case("kubelet-root-relative", L, ("kubeletRootDir", "absolute path"), edit=at("kubeletRootDir", "var/lib/kubelet")),
    Case("kubelet-root-dotdot", P, ("kubeletRootDir", "'..'"), edit=at("kubeletRootDir", "/var/lib/../kubelet")),
    # Labels, names, namespaces, extended resources.
    Case("label-key-space", L, ("observability.monitorLabels",), edit=at("observability.monitorLabels", {"bad key": "x"})),
    Case("label-value-bang", L, ("observability.monitorLabels",),
         edit=at("observability.monitorLabels", {"release": "not ok!"})),
    Case("label-value-64", P, ("observability.monitorLabels",), edit=at("observability.monitorLabels", {"release": "r" * 64})),
    Case("label-key-prefix-bad", P, ("observability.monitorLabels",),
         edit=at("observability.monitorLabels", {"Example.COM/release": "a"})),
    Case("gpu-model-space", L, ("pools[0].gpuModel",), edit=at("pools[0].gpuModel", "H100 SXM5")),
    Case("provider-gpu-model-long", P, ("providers[0].gpuModel",), edit=at("providers[0].gpuModel", "H" * 70)),
    Case("service-name-digit", L, (f"{SVC}.name",), edit=at(f"{SVC}.name", "9sdxl")),
    Case("service-name-long", L, (f"{SVC}.name",), edit=at(f"{SVC}.name", "s" * 60)),
    Case("job-name-long", L, (f"{JOB}.name",), edit=at(f"{JOB}.name", "j" * 63)),
    Case("ns-kube-system", L, ("trainingNamespace",), edit=at("trainingNamespace", "kube-system")),
    Case("ns-default", P, ("inferenceNamespace",), edit=at("inferenceNamespace", "default")),
    Case("ns-kube-public", L, ("monitoringNamespace",), edit=at("monitoringNamespace", "kube-public")),
    Case("ns-training-is-inference", P, ("inferenceNamespace", "trainingNamespace"),
         edit=at("inferenceNamespace", "training")),
    Case("ns-system-is-training", L, ("trainingNamespace", "systemNamespace"), edit=at("trainingNamespace", "gpu-system")),
    Case("ns-uppercase", L, ("systemNamespace",), edit=at("systemNamespace", "GPU-System")),
    # The telemetry namespace is the one privileged namespace: never shared with controllers or workloads.
    Case("ns-telemetry-is-system", P, ("telemetryNamespace", "systemNamespace"),
         edit=at("telemetryNamespace", "gpu-system")),
    Case("ns-telemetry-is-inference", L, ("telemetryNamespace", "inferenceNamespace"),
         edit=at("telemetryNamespace", "inference")),
    Case("ns-telemetry-is-monitoring", P, ("telemetryNamespace",), edit=at("telemetryNamespace", "monitoring")),
    Case("ns-telemetry-kube-system", L, ("telemetryNamespace",), edit=at("telemetryNamespace", "kube-system")),
    Case("gpu-resource-no-domain", L, ("gpuResource",), edit=at("gpuResource", "gpu")),
    Case("gpu-resource-k8s-domain", P, ("gpuResource",), edit=at("gpuResource", "kubernetes.io/gpu")),
    Case("gpu-resource-bad-name", L, ("gpuResource",), edit=at("gpuResource", "nvidia.com/GPU!")),
    # Cross-checks.
    Case("provider-node-is-system-node", L, ("providers[0].nodeName",), edit=at("providers[0].nodeName", "cpu-local-01")),
    Case("provider-node-is-system-node-prod", P, ("providers[1].nodeName",), edit=at("providers[1].nodeName", "cpu-sys-07")),
    Case("provider-node-is-gpu-node", P, ("providers[0].nodeName",), edit=at("providers[0].nodeName", "gpu-a-001")),
    Case("replica-fits-no-pool", L, (f"{SVC}.gpusPerReplica",), edit=at(f"{SVC}.gpusPerReplica", 16)),
    Case("replica-fits-no-pool-prod", P, ("inference.services[1].gpusPerReplica",),
         edit=at("inference.services[1].gpusPerReplica", 12)),
    Case("thermal-10c", L, ("observability.thermalThresholdCelsius",), edit=at("observability.thermalThresholdCelsius", 10)),
    Case("thermal-above-limit", P, ("observability.thermalThresholdCelsius",),
         edit=at("observability.thermalThresholdCelsius", 95)),
    Case("critical-xids-gone", L, ("observability", "criticalXids is gone", "observability.health.fatalXids"),
         edit=at("observability.criticalXids", [79])),
    Case("degraded-xids-empty", L, ("observability.health.degradedXids", "is empty", "xid-degraded: off"),
         edit=at("observability.health.degradedXids", [])),
    Case("fatal-xids-empty", P, ("observability.health.fatalXids", "is empty", "GpuCriticalXid"),
         edit=at("observability.health.fatalXids", [])),
    Case("node-range-millions", L, ("pools[0].nodes",), edit=at("pools[0].nodes", ["gpu-[0000001-9999999]"])),
    Case("node-range-system-millions", P, ("systemPool.nodes",), edit=at("systemPool.nodes", ["cpu-[1-5000000]"])),
    Case("node-range-backwards", L, ("pools[0].nodes",), edit=at("pools[0].nodes", ["gpu-[09-01]"])),
    Case("hold-seconds-huge", L, ("burst.closeHoldSeconds",), edit=at("burst.closeHoldSeconds", 10**9)),
    Case("min-pod-age-huge", P, ("descheduler.minPodAgeSeconds",), edit=at("descheduler.minPodAgeSeconds", 10**12)),
    Case("nccl-heartbeat-huge", P, ("training.nccl.heartbeatTimeoutSeconds",),
         edit=at("training.nccl.heartbeatTimeoutSeconds", 10**10)),
    Case("flap-window-huge", L, ("observability.health.flapWindowSeconds",),
         edit=at("observability.health.flapWindowSeconds", 10**10)),
    Case("int32-max-replicas", L, (f"{SVC}.maxReplicas",), edit=at(f"{SVC}.maxReplicas", 2**31)),
    Case("int64-capacity", P, ("checkpoint.filesystems[0].capacityGi",),
         edit=at("checkpoint.filesystems[0].capacityGi", 2**70)),
    Case("int64-deadline", P, ("checkpoint.throughputCheck.deadlineSeconds",),
         edit=at("checkpoint.throughputCheck.deadlineSeconds", 2**64)),
    Case("bool-gpus-per-node", L, ("pools[0].gpusPerNode",), edit=at("pools[0].gpusPerNode", True)),
    Case("bool-provider-gpus", L, ("providers[0].gpus",), edit=at("providers[0].gpus", True)),
    Case("bool-min-replicas", P, ("inference.services[2].minReplicas",), edit=at("inference.services[2].minReplicas", True)),
    Case("bool-workers", L, (f"{JOB}.workers",), edit=at(f"{JOB}.workers", True)),
    Case("infinite-budget", L, ("checkpoint.budget.sizeTb",), edit=at("checkpoint.budget.sizeTb", float("inf"))),
    # Secrets and credentials.
    Case("secret-burst", L, ("burst", "secret"), edit=secret("burst")),
    Case("secret-pools", P, ("pools", "secret"), edit=secret("pools")),
    Case("secret-version", L, ("kubernetesVersion", "secret"), edit=secret("kubernetesVersion")),
    Case("url-creds-queue", L, (f"{SVC}.traffic.queueUrl", "queueCredentialsSecret"),
         edit=at(f"{SVC}.traffic.queueUrl", CREDS_URL)),
    Case("url-creds-prometheus", P, ("observability.prometheusUrl", "--secret"),
         edit=at("observability.prometheusUrl", "http://admin:pw@prometheus.monitoring.svc:9090")),
    Case("url-creds-adapter", L, ("inference.adapter.prometheusUrl", "--secret"),
         edit=at("inference.adapter.prometheusUrl", "https://u:p@prom:9090")),
    Case("queue-url-no-scheme", L, (f"{SVC}.traffic.queueUrl",), edit=at(f"{SVC}.traffic.queueUrl", "queue.local:5672")),
    Case("queue-url-unknown-scheme-no-port", L, (f"{SVC}.traffic.queueUrl",),
         edit=at(f"{SVC}.traffic.queueUrl", "stomp://queue.local/jobs")),
    # Late errors inside components.
    Case("extra-parameters-override", L, ("checkpoint.filesystems[0]", "extraParameters ['server']"),
         edit=at("checkpoint.filesystems[0].extraParameters", {"server": "evil.example"})),
    Case("weka-extra-parameters-override", P, ("checkpoint.filesystems[0]", "extraParameters ['filesystemName']"),
         edit=at("checkpoint.filesystems[0].extraParameters", {"filesystemName": "other"})),
    # Already refused before this corpus (kept so they stay refused).
    Case("unknown-key", L, ("burst.openBelowFreeGpu", "unknown key"), edit=at("burst.openBelowFreeGpu", 3)),
    Case("wrong-type", L, ("pools[0].gpusPerNode",), edit=at("pools[0].gpusPerNode", "eight")),
    Case("latest-image", P, ("inference.services[0].image",), edit=at(f"{SVC}.image", "sdxl:latest")),
    Case("unknown-pool", P, (f"{JOB}.pool",), edit=at(f"{JOB}.pool", "a100-z")),
    Case("empty-nodes", L, ("systemPool.nodes",), edit=at("systemPool.nodes", [])),
    Case("kube-batch-new-k8s", L, ("scheduling.engine",), edit=at("scheduling.engine", "kube-batch")),
    Case("provider-kind-unknown", P, ("providers[1].kind",), edit=at("providers[1].kind", "karmada")),
    Case("filesystem-backend-missing", L, ("checkpoint.filesystems[0].backend",),
         edit=lambda c: c[f"{K}checkpoint"]["filesystems"][0].pop("backend")),
]

CASES += [
    Case("provider-name-long", L, ("providers[0].name",), edit=at("providers[0].name", "p" * 62)),
]

CASES += [
    Case("forecast-on-in-flight", P, ("inference.services[1].scaling", "forecast applies to metric 'queue-depth'"),
         edit=at("inference.services[1].scaling.forecast", {"horizonSeconds": 180})),
    Case("forecast-off-grid", P, ("inference.services[0].scaling.forecast", "multiple of the rule's 15 s evaluation interval", "got 100"),
         edit=at(f"{SVC}.scaling.forecast", {"horizonSeconds": 100})),
    Case("forecast-season-within-horizon", P, ("inference.services[0].scaling.forecast", "seasonSeconds (180) must exceed horizonSeconds (180)"),
         edit=at(f"{SVC}.scaling.forecast", {"horizonSeconds": 180, "seasonSeconds": 180})),
    Case("forecast-horizon-string", P, ("inference.services[0].scaling.forecast.horizonSeconds",),
         edit=at(f"{SVC}.scaling.forecast", {"horizonSeconds": "3m"})),
]

# Acceptance findings: each was accepted, or refused late or without naming what is wrong.
CASES += [
    Case("signal-class-misspelt", L, ("observability.health.signalClasses", "unknown signal(s) gpu-temprature",
                                      "did you mean 'gpu-temperature'", "the signals are ecc-correctable-storm"),
         edit=at("observability.health.signalClasses", {"gpu-temprature": "fatal"})),
    Case("liqo-pod-cidr-prefix-33", P, ("providers[1].localPodCidr", "prefix length /33 is beyond /32", '"10.64.0.0/33"'),
         edit=at("providers[1].localPodCidr", "10.64.0.0/33")),
    Case("provider-node-name-twice", L, ("providers[1].nodeName", "provider 'backup-cloud' (providers[1])",
                                         "provider 'local-cloud' (providers[0])", "'vk-local-cloud'"),
         edit=at("providers[1].nodeName", "vk-local-cloud")),
    Case("warm-pool-beyond-providers", P, ("burst.warmPoolShare", "up to 512 GPUs", "the 384 GPUs of the providers"),
         edit=at("burst.warmPoolShare", 1.0)),
    Case("liqo-extra-args-noexecute", P, ("providers[1].extraArgs", "provider 'dr-cluster'",
                                          "'--node-taints=virtual-node.liqo.io/not-allowed=true:NoExecute'"),
         edit=at("providers[1].extraArgs", ["--node-taints=virtual-node.liqo.io/not-allowed=true:NoExecute"])),
]

# A pool's fabric topology (components/config/topology.py): every node under one leaf, the tiers nested, switch
# names valid and unique.
TOPO = "pools[0].topology"


def _local_fabric(leaves: list[dict[str, Any]] | None = None, spines: list[dict[str, Any]] | None = None,
                  **more: Any) -> dict[str, Any]:
    return {"leaves": leaves or [{"name": "leaf-l1", "nodes": ["gpu-local-[01-02]"]},
                                 {"name": "leaf-l2", "nodes": ["gpu-local-[03-04]"]}],
            "spines": spines if spines is not None else [{"name": "spine-l1", "leaves": ["leaf-l1", "leaf-l2"]}],
            **more}


def _prod_fabric(pool: str = "a") -> dict[str, Any]:
    return {"leaves": [{"name": f"leaf-{pool}1", "nodes": [f"gpu-{pool}-[001-064]"]},
                       {"name": f"leaf-{pool}2", "nodes": [f"gpu-{pool}-[065-128]"]}],
            "spines": [{"name": f"spine-{pool}1", "leaves": [f"leaf-{pool}1", f"leaf-{pool}2"]}]}


def _both_prod_pools(config: Doc) -> None:
    config[f"{K}pools"][0]["topology"] = _prod_fabric("a")
    config[f"{K}pools"][1]["topology"] = _prod_fabric("a")  # the second pool reuses the first pool's switch names


CASES += [
    Case("topology-node-in-two-leaves", P, (f"{TOPO}.leaves[1].nodes", "nodes already under a leaf",
                                            "gpu-a-060 (leaf 'leaf-a1')"),
         edit=at(TOPO, _prod_fabric() | {"leaves": [{"name": "leaf-a1", "nodes": ["gpu-a-[001-064]"]},
                                                    {"name": "leaf-a2", "nodes": ["gpu-a-[060-128]"]}]})),
    Case("topology-node-not-in-pool", P, (f"{TOPO}.leaves[1].nodes", "not nodes of pool 'h100-a': gpu-b-001"),
         edit=at(TOPO, _prod_fabric() | {"leaves": [{"name": "leaf-a1", "nodes": ["gpu-a-[001-064]"]},
                                                    {"name": "leaf-a2", "nodes": ["gpu-a-[065-128]", "gpu-b-001"]}]})),
    Case("topology-node-under-no-leaf", L, (f"{TOPO}.leaves", "1 node(s) of pool 'local-gpu' hang off no leaf",
                                            "gpu-local-04"),
         edit=at(TOPO, _local_fabric([{"name": "leaf-l1", "nodes": ["gpu-local-[01-02]"]},
                                      {"name": "leaf-l2", "nodes": ["gpu-local-03"]}]))),
    Case("topology-leaf-in-two-spines", L, (f"{TOPO}.spines[1].leaves", "leaf 'leaf-l2' is already under spine 'spine-l1'"),
         edit=at(TOPO, _local_fabric(spines=[{"name": "spine-l1", "leaves": ["leaf-l1", "leaf-l2"]},
                                             {"name": "spine-l2", "leaves": ["leaf-l2"]}]))),
    Case("topology-leaf-under-no-spine", L, (f"{TOPO}.spines", "leaves under no spine: leaf-l2"),
         edit=at(TOPO, _local_fabric(spines=[{"name": "spine-l1", "leaves": ["leaf-l1"]}]))),
    Case("topology-spine-names-unknown-leaf", L, (f"{TOPO}.spines[0].leaves", "no leaf 'leaf-x'"),
         edit=at(TOPO, _local_fabric(spines=[{"name": "spine-l1", "leaves": ["leaf-l1", "leaf-l2", "leaf-x"]}]))),
    Case("topology-no-spines", L, (f"{TOPO}.spines",), edit=at(TOPO, _local_fabric(spines=[]))),
    Case("topology-leaf-name-not-dns", L, (f"{TOPO}.leaves[0].name", "DNS-1123 label"),
         edit=at(TOPO, _local_fabric([{"name": "Leaf_01", "nodes": ["gpu-local-[01-02]"]},
                                      {"name": "leaf-l2", "nodes": ["gpu-local-[03-04]"]}]))),
    Case("topology-leaf-range-backwards", L, (f"{TOPO}.leaves[1].nodes", "runs backwards"),
         edit=at(TOPO, _local_fabric([{"name": "leaf-l1", "nodes": ["gpu-local-[01-02]"]},
                                      {"name": "leaf-l2", "nodes": ["gpu-local-[04-03]"]}]))),
    Case("topology-switch-names-twice-in-stack", P, ("pools[1].topology.leaves[0].name", "switch name already used by",
                                                     "unique across the stack"),
         edit=_both_prod_pools),
    Case("topology-label-leaf-without-count", L, (f"{TOPO}.leaves[1].nodeCount", "is required with leafLabel"),
         edit=at(TOPO, _local_fabric([{"name": "leaf-l1", "nodeCount": 2}, {"name": "leaf-l2"}],
                                     leafLabel="example.com/ib-leaf"))),
    Case("topology-label-counts-miss-nodes", L, (f"{TOPO}.leaves", "nodeCount add up to 3", "has 4 nodes"),
         edit=at(TOPO, _local_fabric([{"name": "leaf-l1", "nodeCount": 2}, {"name": "leaf-l2", "nodeCount": 1}],
                                     leafLabel="example.com/ib-leaf"))),
    Case("topology-count-without-label", L, (f"{TOPO}.leaves[0].nodeCount", "applies only with topology.leafLabel"),
         edit=at(TOPO, _local_fabric([{"name": "leaf-l1", "nodes": ["gpu-local-[01-02]"], "nodeCount": 2},
                                      {"name": "leaf-l2", "nodes": ["gpu-local-[03-04]"]}]))),
    Case("topology-mode-unknown", L, ("scheduling.topologyMode",), edit=at("scheduling.topologyMode", "strict")),
]
