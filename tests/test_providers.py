"""External GPU providers: virtual-kubelet Deployments, credentials, RBAC, node labels and taints."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from components.config import parse_config
from components.mockrt import SECRET_PLACEHOLDER, RunResult, config_error, raw_from_stack
from components.providers import PRESETS, provider_taint
from tests.conftest import StackRunner

NS = "gpu-system"


def secret_marked(value: Any) -> bool:
    """The harness shows secret inputs as the placeholder (whole map, or per key)."""
    if value == SECRET_PLACEHOLDER:
        return True
    return isinstance(value, dict) and bool(value) and all(v == SECRET_PLACEHOLDER for v in value.values())


def rules(result: RunResult, kind: str, name: str) -> set[tuple[str, str, tuple[str, ...]]]:
    """A role's rules as (group, resource, verbs) triples, one per resource."""
    out = set()
    for rule in result.one(kind, name).inputs["rules"]:
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                out.add((group, resource, tuple(sorted(rule["verbs"]))))
    return out


def container(result: RunResult, name: str, namespace: str = NS) -> dict[str, Any]:
    found = [d for d in result.by_kind("Deployment") if d.metadata["name"] == name
             and d.metadata["namespace"] == namespace]
    assert len(found) == 1
    spec = found[0].inputs["spec"]
    assert spec["replicas"] == 1 and spec["strategy"] == {"type": "Recreate"}
    containers = spec["template"]["spec"]["containers"]
    assert len(containers) == 1
    first: dict[str, Any] = containers[0]
    return first


def env(c: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value", "<from>") for e in c["env"]}


def test_generic_virtual_kubelet_deployment(prod: RunResult) -> None:
    c = container(prod, "vk-lambda-east")
    assert c["image"] == "registry.gpucluster.io/providers/virtual-kubelet-lambda:0.4.1"
    assert "command" not in c
    assert c["args"] == [
        "--nodename=vk-lambda-east",
        "--provider=lambda",
        "--provider-config=/etc/virtual-kubelet/provider.json",
        "--os=linux",
        "--metrics-addr=:10255",
        "--enable-node-lease",
        "--startup-timeout=120s",
    ]
    e = env(c)
    assert (e["VKUBELET_TAINT_KEY"], e["VKUBELET_TAINT_VALUE"], e["VKUBELET_TAINT_EFFECT"]) == (
        "virtual-kubelet.io/provider", "lambda-east", "NoSchedule")
    assert e["PROVIDER_CREDENTIALS_FILE"] == "/etc/virtual-kubelet/credentials/kubeconfig"
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert c["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    # The kubelet API (logs, exec) serves TLS: node-cli exits without a key pair, and requires callers' client
    # certificates to chain to the cluster CA. The pair is made at pod start for the node name and pod IP.
    assert (e["APISERVER_CERT_LOCATION"], e["APISERVER_KEY_LOCATION"], e["APISERVER_CA_CERT_LOCATION"]) == (
        "/var/run/virtual-kubelet/serving/tls.crt", "/var/run/virtual-kubelet/serving/tls.key",
        "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt")
    pod = prod.one("Deployment", "vk-lambda-east").inputs["spec"]["template"]["spec"]
    (init,) = pod["initContainers"]
    assert init["image"].startswith("registry.gpucluster.io/platform/burst-controller:")
    assert (init["command"], init["args"]) == (["serving-cert"], [
        "--dir=/var/run/virtual-kubelet/serving", "--name=vk-lambda-east", "--ip=$(POD_IP)"])
    assert init["env"] == [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}]
    assert init["securityContext"]["readOnlyRootFilesystem"] is True
    volume = next(v for v in pod["volumes"] if v["name"] == "serving-cert")
    assert volume == {"name": "serving-cert", "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}}
    assert {"name": "serving-cert", "mountPath": "/var/run/virtual-kubelet/serving", "readOnly": True} in c[
        "volumeMounts"]
    # Token and probe exceptions are per Deployment, each with its reason (checkov reads the annotations).
    skipped = {v.split("=", 1)[0] for k, v in prod.one("Deployment", "vk-lambda-east").metadata["annotations"].items()
               if k.startswith("checkov.io/skip")}
    assert skipped == {"CKV_K8S_38", "CKV_K8S_8", "CKV_K8S_9"}


def test_capacity_comes_from_config(prod: RunResult) -> None:
    cm = prod.one("ConfigMap", "vk-lambda-east-config")
    assert json.loads(cm.inputs["data"]["provider.json"]) == {
        "vk-lambda-east": {"cpu": "512", "memory": "4096Gi", "pods": "500", "ephemeral-storage": "2048Gi",
                           "nvidia.com/gpu": "256"}
    }


def test_the_mock_provider_gets_its_own_format_with_the_gpus_under_others(local: RunResult) -> None:
    """virtual-kubelet's mock reads cpu, memory and pods by name and every other resource under ``others`` only:
    the generic file would register a node without GPUs."""
    cm = local.one("ConfigMap", "vk-local-cloud-config")
    assert json.loads(cm.inputs["data"]["provider.json"]) == {
        "vk-local-cloud": {"cpu": "512", "memory": "4096Gi", "pods": "500",
                           "others": {"ephemeral-storage": "2048Gi", "nvidia.com/gpu": "16"}}
    }


def test_credentials_only_in_a_secret_marked_secret(prod: RunResult, local: RunResult) -> None:
    for result, name in ((prod, "vk-lambda-east-credentials"), (prod, "vk-dr-cluster-credentials"),
                         (local, "vk-local-cloud-credentials"), (local, "vk-backup-cloud-credentials")):
        secret = result.one("Secret", name)
        assert secret_marked(secret.inputs["stringData"]), secret.inputs
        assert "data" not in secret.inputs


def test_secret_value_never_reaches_an_input(run_stack: StackRunner) -> None:
    tokens = {"gpu-cluster:localCloudToken": "tok-3f9a1c", "gpu-cluster:backupCloudToken": "tok-77e0b2"}
    result = run_stack("local", lambda cfg: cfg.update(tokens), secrets=set(tokens))
    for name in ("vk-local-cloud-credentials", "vk-backup-cloud-credentials"):
        assert secret_marked(result.one("Secret", name).inputs["stringData"])
    rendered = json.dumps([r.as_json() for r in result.resources])
    assert "tok-3f9a1c" not in rendered and "tok-77e0b2" not in rendered


def test_liqo_preset_overrides_noexecute(prod: RunResult) -> None:
    assert PRESETS["liqo"].upstream_effect == "NoExecute"
    c = container(prod, "vk-dr-cluster", namespace="liqo-tenant-dr-cluster-eu-west-4")
    assert c["image"] == "ghcr.io/liqotech/virtual-kubelet:v1.1.2"
    assert c["command"] == ["/usr/bin/virtual-kubelet"]
    assert c["args"] == [
        "--foreign-cluster-id=dr-cluster-eu-west-4",
        "--nodename=vk-dr-cluster",
        "--node-ip=$(POD_IP)",
        "--tenant-namespace=liqo-tenant-dr-cluster-eu-west-4",
        "--liqo-namespace=liqo",
        "--home-cluster-id=gpu-prod",
        "--local-podcidr=10.64.0.0/12",
        "--foreign-kubeconfig-secret-name=vk-dr-cluster-credentials",
        "--create-node=true",
        "--metrics-enabled=true",
        "--metrics-address=:10255",
        "--enable-apiserver-support=false",
    ]
    e = env(c)
    assert (e["VKUBELET_TAINT_KEY"], e["VKUBELET_TAINT_VALUE"], e["VKUBELET_TAINT_EFFECT"]) == (
        "virtual-node.liqo.io/not-allowed", "true", "NoSchedule")
    # Liqo requests its serving certificate through a CSR: no init container, no node-cli certificate variables.
    assert "initContainers" not in prod.one("Deployment", "vk-dr-cluster").inputs["spec"]["template"]["spec"]
    assert not {"APISERVER_CERT_LOCATION", "APISERVER_KEY_LOCATION"} & set(e)
    # Liqo learns capacity from its peering, not from a capacity file.
    with pytest.raises(LookupError):
        prod.one("ConfigMap", "vk-dr-cluster-config")


def test_no_taint_anywhere_is_noexecute(prod: RunResult) -> None:
    cfg = parse_config(raw_from_stack("prod"), "Pulumi.prod.yaml")
    assert {p.name: provider_taint(p)["effect"] for p in cfg.providers} == {
        "lambda-east": "NoSchedule", "dr-cluster": "NoSchedule"}
    # Admission policies name NoExecute to refuse it; every other object must not mention it at all.
    dumped = json.dumps([r.inputs for r in prod.resources if r.custom and "ValidatingAdmissionPolicy" not in r.type])
    assert "NoExecute" not in dumped


def named_rules(result: RunResult, kind: str, name: str,
                namespace: str | None = None) -> set[tuple[str, str, tuple[str, ...], tuple[str, ...]]]:
    """A role's rules as (group, resource, verbs, resourceNames), one per resource."""
    roles = [r for r in result.by_kind(kind) if r.metadata["name"] == name
             and (namespace is None or r.metadata.get("namespace") == namespace)]
    assert len(roles) == 1, (kind, name, namespace)
    out = set()
    for rule in roles[0].inputs["rules"]:
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                out.add((group, resource, tuple(sorted(rule["verbs"])), tuple(rule.get("resourceNames", ()))))
    return out


def role_namespaces(result: RunResult, name: str) -> set[str]:
    return {r.metadata["namespace"] for r in result.by_kind("Role") if r.metadata["name"] == name}


NODE = ("get", "list", "patch", "update", "watch")


def test_generic_rbac_is_exact(prod: RunResult) -> None:
    role = "gpu-cluster:vk-lambda-east"
    # Cluster scope: what the real virtual-kubelet does with its node (create it, read it, patch its status) and
    # node-cli's cluster-wide informers (watch, list as client-go's fallback); nothing it never used in make e2e.
    assert named_rules(prod, "ClusterRole", role) == {
        ("", "nodes", ("create",), ()),
        ("", "nodes", ("get",), ("vk-lambda-east",)),
        ("", "nodes/status", ("patch",), ("vk-lambda-east",)),
        ("", "pods", ("list", "watch"), ()),
        ("", "configmaps", ("list", "watch"), ()),
        ("", "secrets", ("list", "watch"), ()),
        ("", "services", ("list", "watch"), ()),
        # Its kubelet API authorizes the API server's logs and exec calls as a kubelet does; no tokenreviews.
        ("authorization.k8s.io", "subjectaccessreviews", ("create",), ()),
    }
    # Writes only where its pods run (inference), heartbeats by name; nothing in its own namespace.
    assert role_namespaces(prod, role) == {"inference", "kube-node-lease"}
    assert named_rules(prod, "Role", role, "inference") == {
        ("", "pods", ("delete",), ()),
        ("", "pods/status", ("update",), ()),
        ("", "events", ("create", "patch"), ()),
    }
    assert named_rules(prod, "Role", role, "kube-node-lease") == {
        ("coordination.k8s.io", "leases", ("create",), ()),
        ("coordination.k8s.io", "leases", ("get", "update"), ("vk-lambda-east",)),
    }
    binding = prod.one("ClusterRoleBinding", role)
    assert binding.inputs["subjects"] == [{"kind": "ServiceAccount", "name": "vk-lambda-east", "namespace": NS}]
    bindings = [b for b in prod.by_kind("RoleBinding") if b.metadata["name"] == role]
    assert {b.metadata["namespace"] for b in bindings} == {"inference", "kube-node-lease"}
    assert all(b.inputs["subjects"] == binding.inputs["subjects"] for b in bindings)


TENANT = "liqo-tenant-dr-cluster-eu-west-4"


def test_liqo_rbac_reduced_set(prod: RunResult) -> None:
    """No cluster-wide Secret access and no token minting; the serving-certificate Secret by name in its own
    namespace; reflection reads and pod writes only in the offloaded (inference) namespace."""
    role = "gpu-cluster:vk-dr-cluster"
    cluster = named_rules(prod, "ClusterRole", role)
    assert not any(r[1] in ("secrets", "serviceaccounts/token", "configmaps") for r in cluster)
    assert ("", "nodes", NODE, ("vk-dr-cluster",)) in cluster
    assert ("", "nodes", ("create",), ()) in cluster
    assert ("", "pods", ("get", "list", "watch"), ()) in cluster
    assert ("offloading.liqo.io", "virtualnodes", ("get", "list", "watch"), ()) in cluster
    writes = {r for r in cluster if set(r[2]) - {"get", "list", "watch"}}
    assert writes == {("", "nodes", ("create",), ()), ("", "nodes", NODE, ("vk-dr-cluster",)),
                      ("", "nodes/status", ("get", "patch", "update"), ("vk-dr-cluster",)),
                      ("certificates.k8s.io", "certificatesigningrequests", ("create", "get", "list", "watch"), ())}
    assert role_namespaces(prod, role) == {"inference", "kube-node-lease", TENANT}
    assert named_rules(prod, "Role", role, TENANT) == {
        ("", "secrets", ("create",), ()),
        ("", "secrets", ("get", "patch", "update"), ("vk-dr-cluster",)),
        ("", "secrets", ("get",), ("vk-dr-cluster-credentials",)),
    }
    offloaded = named_rules(prod, "Role", role, "inference")
    assert ("", "secrets", ("get", "list", "watch"), ()) in offloaded
    assert not any(r[1] == "serviceaccounts/token" for r in offloaded)
    assert not any(r[0] == "storage.k8s.io" or r[1] in ("persistentvolumes", "ingresses") for r in cluster | offloaded)
    args = container(prod, "vk-dr-cluster", namespace=TENANT)["args"]
    assert "--enable-apiserver-support=false" in args


def test_liqo_apiserver_support_mints_tokens_only_in_the_offloaded_namespace(run_stack: StackRunner) -> None:
    def edit(config: dict[str, Any]) -> None:
        providers = config["gpu-cluster:providers"]
        next(p for p in providers if p["kind"] == "liqo")["apiServerSupport"] = True

    result = run_stack("prod", edit)
    role = "gpu-cluster:vk-dr-cluster"
    assert not any(r[1] == "serviceaccounts/token" for r in named_rules(result, "ClusterRole", role))
    assert ("", "serviceaccounts/token", ("create",), ()) in named_rules(result, "Role", role, "inference")
    assert "--enable-apiserver-support=true" in container(result, "vk-dr-cluster", namespace=TENANT)["args"]


def test_no_wildcards_in_any_provider_role(prod: RunResult) -> None:
    for kind in ("ClusterRole", "Role"):
        for role in prod.by_kind(kind):
            if "vk-" not in role.metadata["name"]:
                continue
            for rule in role.inputs["rules"]:
                assert "*" not in rule["verbs"] + rule["resources"] + rule["apiGroups"], role.metadata


def test_virtual_node_labels_mark_it_external(prod: RunResult) -> None:
    patch = [r for r in prod.by_kind("Node") if r.metadata.get("name") == "vk-lambda-east"]
    assert len(patch) == 1 and patch[0].type == "kubernetes:core/v1:NodePatch"
    assert patch[0].metadata["labels"] == {
        "gpucluster.io/location": "external",
        "gpucluster.io/provider": "lambda-east",
        "gpucluster.io/gpu-model": "H100-SXM5-80GB",
        "type": "virtual-kubelet",
    }
    # The burst taint belongs to the burst controller: Pulumi never writes the node's taints.
    assert "spec" not in patch[0].inputs
    deployment = next(r for r in prod.by_kind("Deployment") if r.metadata["name"] == "vk-lambda-east")
    assert deployment.urn in patch[0].depends_on


def test_providers_run_on_the_system_pool_at_system_priority(prod: RunResult) -> None:
    deployment = next(r for r in prod.by_kind("Deployment") if r.metadata["name"] == "vk-lambda-east")
    pod = deployment.inputs["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"gpucluster.io/pool": "system"}
    assert pod["priorityClassName"] == "platform-critical"
    assert pod["serviceAccountName"] == "vk-lambda-east"


def test_admiralty_is_refused_with_the_reason() -> None:
    message = config_error(lambda raw: raw["providers"][1].update(kind="admiralty"))
    assert "Pulumi.prod.yaml" in message
    assert "providers[1]: kind 'admiralty' has no preset" in message
    assert "admiralty-<namespace>-<target>-<hash>" in message


def test_generic_provider_needs_image_and_provider_name() -> None:
    def edit(raw: dict[str, Any]) -> None:
        del raw["providers"][0]["image"]
        del raw["providers"][0]["vkProvider"]

    message = config_error(edit)
    assert "providers[0].image: required key is missing (kind 'virtual-kubelet' needs it)" in message
    assert "providers[0].vkProvider: required key is missing (kind 'virtual-kubelet' needs it)" in message


def test_liqo_needs_its_cluster_ids() -> None:
    message = config_error(lambda raw: raw["providers"][1].pop("homeClusterId"))
    assert "providers[1].homeClusterId: required key is missing (kind 'liqo' needs it)" in message


def test_unpinned_provider_image_is_refused() -> None:
    message = config_error(lambda raw: raw["providers"][0].update(image="example/vk:latest"))
    assert "providers[0].image: must not use the 'latest' tag" in message


def test_extra_args_must_be_flags() -> None:
    message = config_error(lambda raw: raw["providers"][0].update(extraArgs=["rm -rf"]))
    assert "providers[0].extraArgs: entry 'rm -rf' must be a --flag" in message


def test_a_key_of_another_kind_names_its_kind() -> None:
    message = config_error(lambda raw: raw["providers"][1].update(vkProvider="azure"))
    assert "providers[1].vkProvider: applies only to kind 'virtual-kubelet', not 'liqo' (got \"azure\")" in message


def test_the_kubelet_client_ca_can_be_another_than_the_cluster_ca(run_stack: StackRunner) -> None:
    """Where the API server's kubelet client certificate comes from another CA, the stack mounts it from a
    ConfigMap and node-cli requires callers' certificates of that CA instead."""
    def edit(cfg: dict[str, Any]) -> None:
        providers = copy.deepcopy(cfg["gpu-cluster:providers"])
        providers[0]["kubeletClientCaConfigMap"] = "kubelet-client-ca"
        cfg["gpu-cluster:providers"] = providers

    result = run_stack("prod", edit)
    c = container(result, "vk-lambda-east")
    assert env(c)["APISERVER_CA_CERT_LOCATION"] == "/etc/virtual-kubelet/kubelet-client-ca/ca.crt"
    assert {"name": "kubelet-client-ca", "mountPath": "/etc/virtual-kubelet/kubelet-client-ca",
            "readOnly": True} in c["volumeMounts"]
    pod = result.one("Deployment", "vk-lambda-east").inputs["spec"]["template"]["spec"]
    assert {"name": "kubelet-client-ca", "configMap": {"name": "kubelet-client-ca", "items": [
        {"key": "ca.crt", "path": "ca.crt"}]}} in pod["volumes"]
    message = config_error(lambda raw: raw["providers"][1].update(kubeletClientCaConfigMap="kubelet-client-ca"))
    assert "providers[1].kubeletClientCaConfigMap: applies only to kind 'virtual-kubelet', not 'liqo'" in message


def test_the_virtual_kubelets_requests_are_the_providers(prod: RunResult, local: RunResult) -> None:
    """Its own container's requests, apart from the capacity its node reports (`cpu`, `memoryGi`)."""
    res = container(prod, "vk-lambda-east")["resources"]
    assert (res["requests"]["cpu"], res["requests"]["memory"], res["limits"]["memory"]) == ("500m", "512Mi", "512Mi")
    assert container(local, "vk-local-cloud")["resources"]["requests"]["cpu"] == "100m"  # Pulumi.local.yaml
    message = config_error(lambda raw: raw["providers"][0].update(kubeletResources={"cpu": "-1", "memory": "1Gi"}))
    assert "providers[0].kubeletResources.cpu: must be a Kubernetes quantity" in message
