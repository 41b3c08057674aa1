"""Inference services: HPA-owned Deployments placed by the gang scheduler, wired for their traffic shape."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from components.mockrt import SECRET_PLACEHOLDER, RunResult, config_error

NS = "inference"
BURST_TAINT = "gpucluster.io/burst"


def pod_spec(result: RunResult, name: str) -> dict[str, Any]:
    spec: dict[str, Any] = result.one("Deployment", name).inputs["spec"]["template"]["spec"]
    return spec


def test_hpa_owns_replicas(prod: RunResult, local: RunResult) -> None:
    for result, names in ((prod, ["sdxl-turbo", "llama-70b-chat", "whisper-large"]), (local, ["sdxl-turbo"])):
        for name in names:
            deployment = result.one("Deployment", name)
            assert "replicas" not in deployment.inputs["spec"], name
            hpa = result.one("HorizontalPodAutoscaler", name)
            assert hpa.inputs["apiVersion"] == "autoscaling/v2"
            assert hpa.inputs["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment",
                                                            "name": name}


def test_placement_goes_through_volcano_at_inference_priority(prod: RunResult) -> None:
    template = prod.one("Deployment", "sdxl-turbo").inputs["spec"]["template"]
    assert template["metadata"]["annotations"] == {
        "scheduling.volcano.sh/queue-name": "inference", "volcano.sh/preemptable": "true"}
    assert template["metadata"]["labels"]["gpucluster.io/workload"] == "inference"
    spec = template["spec"]
    assert spec["schedulerName"] == "volcano"
    assert spec["priorityClassName"] == "gpu-inference"
    affinity = spec["affinity"]["nodeAffinity"]
    assert affinity["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"] == [
        {"matchExpressions": [{"key": "gpucluster.io/location", "operator": "In", "values": ["onprem", "external"]}]}]
    onprem = {"matchExpressions": [{"key": "gpucluster.io/location", "operator": "In", "values": ["onprem"]}]}
    # On-prem first (its lead over the best provider stays 100), then the cheaper provider: dr-cluster at
    # 1.50 USD per GPU-hour over lambda-east at 2.99.
    assert affinity["preferredDuringSchedulingIgnoredDuringExecution"] == [
        {"weight": 100, "preference": onprem},
        {"weight": 100, "preference": onprem},
        {"weight": 50, "preference": {"matchExpressions": [
            {"key": "gpucluster.io/provider", "operator": "In", "values": ["lambda-east"]}]}},
        {"weight": 100, "preference": {"matchExpressions": [
            {"key": "gpucluster.io/provider", "operator": "In", "values": ["dr-cluster"]}]}},
    ]


def node_affinity_score(affinity: dict[str, Any], labels: dict[str, str]) -> int:
    """What Volcano's nodeorder adds for a node: the weights of the preferred terms its labels match."""
    return sum(term["weight"] for term in affinity["preferredDuringSchedulingIgnoredDuringExecution"]
               if all(labels.get(e["key"]) in e["values"] for e in term["preference"]["matchExpressions"]))


def test_a_burst_fills_the_cheaper_provider_and_on_prem_keeps_its_lead(prod: RunResult, local: RunResult,
                                                                      run_stack: Any) -> None:
    onprem = {"gpucluster.io/location": "onprem", "gpucluster.io/pool": "h100-a"}
    cheap = {"gpucluster.io/location": "external", "gpucluster.io/provider": "dr-cluster"}
    dear = {"gpucluster.io/location": "external", "gpucluster.io/provider": "lambda-east"}
    for name in ("sdxl-turbo", "whisper-large"):
        main = pod_spec(prod, name)["affinity"]["nodeAffinity"]
        assert node_affinity_score(main, onprem) - node_affinity_score(main, cheap) == 100, name
        assert node_affinity_score(main, cheap) > node_affinity_score(main, dear), name
        standby = standby_for(prod, name).inputs["spec"]["template"]["spec"]["affinity"]["nodeAffinity"]
        assert node_affinity_score(standby, cheap) > node_affinity_score(standby, dear), name
    # The gateway service may burst to the routable provider only: nothing to rank, the plain on-prem term.
    gateway = pod_spec(prod, "llama-70b-chat")["affinity"]["nodeAffinity"]
    assert len(gateway["preferredDuringSchedulingIgnoredDuringExecution"]) == 1
    # The local stack ranks its two providers the same way, the main replicas and the standby.
    local_cheap = {"gpucluster.io/location": "external", "gpucluster.io/provider": "local-cloud"}
    local_dear = {"gpucluster.io/location": "external", "gpucluster.io/provider": "backup-cloud"}
    for affinity in (pod_spec(local, "sdxl-turbo")["affinity"]["nodeAffinity"],
                     standby_for(local, "sdxl-turbo").inputs["spec"]["template"]["spec"]["affinity"]["nodeAffinity"]):
        assert node_affinity_score(affinity, local_cheap) > node_affinity_score(affinity, local_dear)
    # One provider: no ranking, the standby has no preferred terms at all.
    single = run_stack("local", lambda cfg: cfg.update(
        {"gpu-cluster:providers": cfg["gpu-cluster:providers"][:1]}))
    assert len(pod_spec(single, "sdxl-turbo")["affinity"]["nodeAffinity"][
        "preferredDuringSchedulingIgnoredDuringExecution"]) == 1
    single_standby = standby_for(single, "sdxl-turbo").inputs["spec"]["template"]["spec"]["affinity"]["nodeAffinity"]
    assert "preferredDuringSchedulingIgnoredDuringExecution" not in single_standby


def test_queue_workers_tolerate_pools_and_every_provider_but_not_the_burst_taint(prod: RunResult) -> None:
    assert pod_spec(prod, "sdxl-turbo")["tolerations"] == [
        {"key": "gpucluster.io/pool", "operator": "Equal", "value": "h100-a", "effect": "NoSchedule"},
        {"key": "gpucluster.io/pool", "operator": "Equal", "value": "h200-b", "effect": "NoSchedule"},
        # The prod pools keep a warm spare each (sized from their GPUs): idle GPUs inference may use.
        {"key": "gpucluster.io/spare", "operator": "Exists", "effect": "NoSchedule"},
        {"key": "virtual-kubelet.io/provider", "operator": "Equal", "value": "lambda-east", "effect": "NoSchedule"},
        {"key": "virtual-node.liqo.io/not-allowed", "operator": "Equal", "value": "true", "effect": "NoSchedule"},
        {"key": "gpucluster.io/gpu-health", "operator": "Equal", "value": "degraded", "effect": "NoSchedule"},
    ]


def test_inference_can_be_kept_off_hot_nodes(run_stack: Any) -> None:
    result = run_stack("local", lambda c: c.update({"gpu-cluster:observability": {"inferenceToleratesThermal": False}}))
    spec = result.one("Deployment", "sdxl-turbo").inputs["spec"]["template"]["spec"]
    assert "gpucluster.io/gpu-health" not in [t["key"] for t in spec["tolerations"]]


def test_no_inference_pod_tolerates_the_burst_taint(prod: RunResult, local: RunResult) -> None:
    for result in (prod, local):
        for deployment in result.by_kind("Deployment"):
            if deployment.metadata.get("namespace") != NS or deployment.name.endswith("-standby"):
                continue  # a standby pinned to virtual nodes tolerates it by design (next tests)
            for toleration in deployment.inputs["spec"]["template"]["spec"].get("tolerations", []):
                assert toleration.get("key") not in (BURST_TAINT, None), toleration
                assert toleration["effect"] == "NoSchedule"


def test_gateway_service_bursts_only_where_pods_are_routable(prod: RunResult) -> None:
    keys = [t["key"] for t in pod_spec(prod, "llama-70b-chat")["tolerations"]]
    assert keys == ["gpucluster.io/pool", "gpucluster.io/pool", "gpucluster.io/spare",
                    "virtual-node.liqo.io/not-allowed", "gpucluster.io/gpu-health"]


def test_gpu_limits_equal_requests_and_readiness(prod: RunResult) -> None:
    c = pod_spec(prod, "llama-70b-chat")["containers"][0]
    assert c["resources"]["requests"]["nvidia.com/gpu"] == c["resources"]["limits"]["nvidia.com/gpu"] == "4"
    assert c["resources"]["requests"]["memory"] == c["resources"]["limits"]["memory"] == "256Gi"
    assert c["readinessProbe"]["httpGet"] == {"path": "/health", "port": "http"}
    assert c["ports"] == [{"name": "http", "containerPort": 8000}]


def test_servers_get_startup_on_the_readiness_path_and_liveness_apart(prod: RunResult) -> None:
    c = pod_spec(prod, "llama-70b-chat")["containers"][0]
    health = {"path": "/health", "port": "http"}
    # The default 1800 s load budget, in 10 s probes; liveness waits for it, then allows a minute of failures.
    assert c["startupProbe"] == {"httpGet": health, "periodSeconds": 10, "failureThreshold": 180}
    # Without a livenessPath, liveness is "the process accepts connections", never "can serve now": a loaded
    # replica that stops being ready leaves the Service but is not restarted for it.
    assert c["livenessProbe"] == {"tcpSocket": {"port": "http"}, "periodSeconds": 10, "timeoutSeconds": 5,
                                  "failureThreshold": 6}
    assert c["readinessProbe"] == {"httpGet": health, "periodSeconds": 5, "failureThreshold": 3}


def test_liveness_path_from_config(run_stack: Any) -> None:
    def edit(cfg: dict[str, Any]) -> None:
        cfg["gpu-cluster:inference"]["services"][0]["livenessPath"] = "/v2/health/live"
    c = pod_spec(run_stack("local", edit), "sdxl-turbo")["containers"][0]
    assert c["livenessProbe"]["httpGet"] == {"path": "/v2/health/live", "port": "http"}
    assert c["readinessProbe"]["httpGet"]["path"] != "/v2/health/live"


def test_servers_bound_their_ephemeral_storage(prod: RunResult) -> None:
    spec = pod_spec(prod, "llama-70b-chat")
    c = spec["containers"][0]
    assert (c["resources"]["requests"]["ephemeral-storage"], c["resources"]["limits"]["ephemeral-storage"]) == (
        "1Gi", "5Gi")
    assert spec["volumes"] == [{"name": "tmp", "emptyDir": {"sizeLimit": "4Gi"}}]


def test_startup_budget_comes_from_config(run_stack: Any) -> None:
    def edit(cfg: dict[str, Any]) -> None:
        cfg["gpu-cluster:inference"]["services"][0]["startupTimeoutSeconds"] = 605
    c = pod_spec(run_stack("local", edit), "sdxl-turbo")["containers"][0]
    assert c["startupProbe"]["failureThreshold"] == 61  # rounded up: never less time than asked


def test_startup_budget_is_bounded() -> None:
    message = config_error(lambda raw: raw["inference"]["services"][0].update(startupTimeoutSeconds=5), "local")
    assert "Pulumi.local.yaml" in message
    assert "inference.services[0].startupTimeoutSeconds" in message


def test_servers_mount_no_api_token(prod: RunResult, local: RunResult) -> None:
    for result in (prod, local):
        for d in result.by_kind("Deployment"):
            if d.metadata.get("namespace") == NS:
                assert d.inputs["spec"]["template"]["spec"]["automountServiceAccountToken"] is False, d.name


def test_queue_worker_gets_url_and_secret_credentials(prod: RunResult) -> None:
    c = pod_spec(prod, "sdxl-turbo")["containers"][0]
    assert c["env"] == [
        {"name": "QUEUE_URL", "value": "amqps://image-queue.gpucluster.io:5671/jobs"},
        {"name": "QUEUE_CREDENTIALS",
         "valueFrom": {"secretKeyRef": {"name": "sdxl-turbo-queue", "key": "credentials"}}},
    ]
    # Env from a secretKeyRef is the one checkov exception, on this Deployment only, with its reason.
    annotations = prod.one("Deployment", "sdxl-turbo").metadata["annotations"]
    assert annotations["checkov.io/skip1"].startswith("CKV_K8S_35=")
    string_data = prod.one("Secret", "sdxl-turbo-queue").inputs["stringData"]
    assert string_data == SECRET_PLACEHOLDER or string_data == {"credentials": SECRET_PLACEHOLDER}


def test_queue_without_credentials_gets_no_secret(local: RunResult) -> None:
    c = pod_spec(local, "sdxl-turbo")["containers"][0]
    assert c["env"] == [{"name": "QUEUE_URL", "value": "amqp://queue.local:5672/jobs"}]
    assert not [s for s in local.by_kind("Secret") if s.metadata.get("namespace") == NS]
    assert "annotations" not in local.one("Deployment", "sdxl-turbo").metadata


def test_gateway_route_points_at_the_all_locations_service(prod: RunResult) -> None:
    route = prod.one("HTTPRoute", "llama-70b-chat")
    assert route.inputs["spec"] == {
        "parentRefs": [{"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": "inference-gateway",
                        "namespace": NS}],
        "hostnames": ["chat.gpucluster.io"],
        "rules": [{"matches": [{"path": {"type": "PathPrefix", "value": "/"}}],
                   "backendRefs": [{"group": "", "kind": "Service", "name": "llama-70b-chat", "port": 8000}]}],
    }
    # The Service selects every replica of the service, on-prem, external and standby alike.
    selector = prod.one("Service", "llama-70b-chat").inputs["spec"]["selector"]
    for deployment in ("llama-70b-chat", "llama-70b-chat-standby"):
        labels = prod.one("Deployment", deployment).inputs["spec"]["template"]["metadata"]["labels"]
        assert all(labels.get(k) == v for k, v in selector.items()), deployment
    with pytest.raises(LookupError):
        prod.one("HTTPRoute", "sdxl-turbo")


def test_hpa_behaviour_is_explicit(prod: RunResult) -> None:
    spec = prod.one("HorizontalPodAutoscaler", "sdxl-turbo").inputs["spec"]
    assert (spec["minReplicas"], spec["maxReplicas"]) == (8, 256)
    assert spec["behavior"] == {
        "scaleUp": {"stabilizationWindowSeconds": 0, "selectPolicy": "Max", "policies": [
            {"type": "Percent", "value": 100, "periodSeconds": 15}, {"type": "Pods", "value": 4, "periodSeconds": 15}]},
        "scaleDown": {"stabilizationWindowSeconds": 300, "selectPolicy": "Min", "policies": [
            {"type": "Percent", "value": 10, "periodSeconds": 60}]},
    }


def test_metric_types_follow_config(prod: RunResult, local: RunResult) -> None:
    assert prod.one("HorizontalPodAutoscaler", "sdxl-turbo").inputs["spec"]["metrics"] == [{
        "type": "External",
        "external": {"metric": {"name": "inference_queue_depth",
                                "selector": {"matchLabels": {"service": "sdxl-turbo"}}},
                     "target": {"type": "AverageValue", "averageValue": "4"}},
    }]
    assert prod.one("HorizontalPodAutoscaler", "llama-70b-chat").inputs["spec"]["metrics"] == [{
        "type": "Pods",
        "pods": {"metric": {"name": "inference_requests_in_flight"},
                 "target": {"type": "AverageValue", "averageValue": "32"}},
    }]
    assert local.one("HorizontalPodAutoscaler", "sdxl-turbo").inputs["spec"]["metrics"] == [{
        "type": "Resource",
        "resource": {"name": "cpu", "target": {"type": "Utilization", "averageUtilization": 70}},
    }]


def test_pdb_limits_voluntary_disruption(prod: RunResult) -> None:
    spec = prod.one("PodDisruptionBudget", "whisper-large").inputs["spec"]
    assert spec["maxUnavailable"] == 1
    assert spec["unhealthyPodEvictionPolicy"] == "AlwaysAllow"


def test_adapter_apiservices_verify_tls_with_a_managed_ca(prod: RunResult) -> None:
    """No insecureSkipTLSVerify: cert-manager injects the CA of the stack's CA Issuer, which signs the adapter."""
    for group in ("custom.metrics.k8s.io", "external.metrics.k8s.io"):
        api = prod.one("APIService", f"v1beta1.{group}")
        assert "insecureSkipTLSVerify" not in api.inputs["spec"]
        assert api.metadata["annotations"] == {
            "cert-manager.io/inject-ca-from": "gpu-system/prometheus-adapter-serving"}
    serving = prod.one("Certificate", "prometheus-adapter-serving").inputs["spec"]
    assert serving["dnsNames"] == ["prometheus-adapter.gpu-system.svc",
                                   "prometheus-adapter.gpu-system.svc.cluster.local"]
    assert serving["issuerRef"] == {"name": "prometheus-adapter-ca", "kind": "Issuer", "group": "cert-manager.io"}
    ca_issuer = [i for i in prod.by_kind("Issuer") if i.metadata["name"] == "prometheus-adapter-ca"]
    assert ca_issuer[0].inputs["spec"] == {"ca": {"secretName": "prometheus-adapter-ca"}}
    assert prod.one("Certificate", "prometheus-adapter-ca").inputs["spec"]["isCA"] is True
    pod = prod.one("Deployment", "prometheus-adapter").inputs["spec"]["template"]["spec"]
    c = pod["containers"][0]
    assert "--tls-cert-file=/var/run/serving-cert/tls.crt" in c["args"] and not any(
        a.startswith("--cert-dir") for a in c["args"])
    volume = next(v for v in pod["volumes"] if v["name"] == "serving-cert")
    assert volume["secret"]["secretName"] == serving["secretName"] == "prometheus-adapter-serving-cert"


def test_adapter_serves_custom_and_external_metrics(prod: RunResult) -> None:
    for group in ("custom.metrics.k8s.io", "external.metrics.k8s.io"):
        spec = prod.one("APIService", f"v1beta1.{group}").inputs["spec"]
        assert spec["service"] == {"name": "prometheus-adapter", "namespace": "gpu-system", "port": 443}
    with pytest.raises(LookupError):
        prod.one("APIService", "v1beta1.metrics.k8s.io")
    rules = yaml.safe_load(prod.one("ConfigMap", "prometheus-adapter-config").inputs["data"]["config.yaml"])
    assert [r["seriesQuery"] for r in rules["rules"]] == ['inference_requests_in_flight{namespace!="",pod!=""}']
    assert rules["externalRules"] == [{
        "seriesQuery": 'inference_queue_depth{service!=""}',
        "resources": {"namespaced": False},
        "name": {"matches": "^inference_queue_depth$", "as": "inference_queue_depth"},
        "metricsQuery": "max(<<.Series>>{<<.LabelMatchers>>}) by (service)",
    }]
    c = prod.one("Deployment", "prometheus-adapter").inputs["spec"]["template"]["spec"]["containers"][0]
    assert c["image"] == "registry.k8s.io/prometheus-adapter/prometheus-adapter:v0.12.0"
    assert "--prometheus-url=http://prometheus-operated.monitoring.svc:9090/" in c["args"]
    assert c["livenessProbe"]["httpGet"] == {"path": "/livez", "port": "https", "scheme": "HTTPS"}
    assert c["livenessProbe"]["failureThreshold"] == 6
    adapter = prod.one("Deployment", "prometheus-adapter")
    anti = adapter.inputs["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"]
    assert anti["preferredDuringSchedulingIgnoredDuringExecution"][0]["podAffinityTerm"]["topologyKey"] == (
        "kubernetes.io/hostname")
    assert prod.one("PodDisruptionBudget", "prometheus-adapter").inputs["spec"] == {
        "maxUnavailable": 1, "unhealthyPodEvictionPolicy": "AlwaysAllow",
        "selector": {"matchLabels": adapter.inputs["spec"]["selector"]["matchLabels"]}}
    assert adapter.metadata["annotations"]["checkov.io/skip1"].startswith("CKV_K8S_38=")
    reader = prod.one("ClusterRole", "gpu-cluster:prometheus-adapter")
    assert reader.inputs["rules"] == [{"apiGroups": [""], "resources": ["nodes", "namespaces", "pods", "services"],
                                       "verbs": ["get", "list", "watch"]}]


def test_no_adapter_when_no_service_needs_one(local: RunResult) -> None:
    assert local.by_kind("APIService") == []


def test_gateway_needs_a_routable_provider() -> None:
    message = config_error(lambda raw: raw["providers"].pop(1))
    assert "Pulumi.prod.yaml" in message
    assert ("inference.services[1].traffic.shape: 'gateway' needs a provider whose pods the cluster can "
            "route to") in message


def test_pdb_cannot_allow_the_whole_service_down() -> None:
    message = config_error(lambda raw: raw["inference"]["services"][2].update(maxUnavailable=2))
    assert "inference.services[2]: maxUnavailable (2) must be below minReplicas (2)" in message


def test_utilization_target_is_a_percent() -> None:
    message = config_error(lambda raw: raw["inference"]["services"][0].update(scaling={"metric": "cpu", "target": 400}),
                     "local")
    assert "Pulumi.local.yaml" in message
    assert "inference.services[0].scaling: target for metric 'cpu' is a utilization percent (1-100), got 400" in message


def test_replica_must_fit_a_provider_node() -> None:
    message = config_error(lambda raw: raw["inference"]["services"][0].update(gpusPerReplica=512))
    assert "inference.services[0].gpusPerReplica: no provider offers that many GPUs on its virtual node" in message


def test_gateway_takes_no_queue() -> None:
    message = config_error(lambda raw: raw["inference"]["services"][1]["traffic"].update(queueUrl="amqp://q/x"))
    assert "inference.services[1].traffic: shape 'gateway' takes no queueUrl" in message


def test_queue_worker_needs_a_queue() -> None:
    message = config_error(lambda raw: raw["inference"]["services"][0]["traffic"].pop("queueUrl"))
    assert "inference.services[0].traffic: shape 'queue-worker' needs queueUrl" in message


# --------------------------------------------------------------------------- make-before-break standby

def standby_for(result: RunResult, name: str) -> Any:
    return result.one("Deployment", f"{name}-standby")


def test_standby_deployment_starts_at_zero_owned_by_the_controller(prod: RunResult, local: RunResult) -> None:
    for result, names in ((prod, ["sdxl-turbo", "llama-70b-chat", "whisper-large"]), (local, ["sdxl-turbo"])):
        for name in names:
            standby = standby_for(result, name)
            assert standby.inputs["spec"]["replicas"] == 0
            # Pulumi creates it at zero and never resets what the burst controller scaled it to.
            assert standby.ignore_changes == ["spec.replicas"]
            labels = standby.inputs["spec"]["template"]["metadata"]["labels"]
            assert labels["gpucluster.io/role"] == "standby"
            assert labels["gpucluster.io/service"] == name
            # Neither Deployment's selector matches the other's pods.
            main = result.one("Deployment", name)
            main_labels = main.inputs["spec"]["template"]["metadata"]["labels"]
            main_selector = main.inputs["spec"]["selector"]["matchLabels"]
            standby_selector = standby.inputs["spec"]["selector"]["matchLabels"]
            assert not all(labels.get(k) == v for k, v in main_selector.items())
            assert not all(main_labels.get(k) == v for k, v in standby_selector.items())
            assert "gpucluster.io/role" not in main_labels
            # The same server: image, resources, probes.
            main_c = main.inputs["spec"]["template"]["spec"]["containers"]
            assert standby.inputs["spec"]["template"]["spec"]["containers"] == main_c


def test_standby_runs_only_on_eligible_virtual_nodes_whatever_the_burst_mode(prod: RunResult) -> None:
    spec = standby_for(prod, "sdxl-turbo").inputs["spec"]["template"]["spec"]
    assert spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"] == [
        {"matchExpressions": [
            {"key": "gpucluster.io/location", "operator": "In", "values": ["external"]},
            {"key": "gpucluster.io/provider", "operator": "In", "values": ["lambda-east", "dr-cluster"]},
        ]}]
    burst = [t for t in spec["tolerations"] if t["key"] == BURST_TAINT]
    assert burst == [{"key": BURST_TAINT, "operator": "Exists", "effect": "NoSchedule"}]
    assert spec["schedulerName"] == "volcano" and spec["priorityClassName"] == "gpu-inference"


def test_service_and_pdb_count_standby_replicas(prod: RunResult) -> None:
    standby_labels = standby_for(prod, "sdxl-turbo").inputs["spec"]["template"]["metadata"]["labels"]
    main_labels = prod.one("Deployment", "sdxl-turbo").inputs["spec"]["template"]["metadata"]["labels"]
    service_selector = prod.one("Service", "sdxl-turbo").inputs["spec"]["selector"]
    pdb_selector = prod.one("PodDisruptionBudget", "sdxl-turbo").inputs["spec"]["selector"]["matchLabels"]
    for selector in (service_selector, pdb_selector):
        assert selector["gpucluster.io/service"] == "sdxl-turbo"
        for labels in (standby_labels, main_labels):
            assert all(labels.get(k) == v for k, v in selector.items()), (selector, labels)
    # ...and not another service's pods.
    other = prod.one("Deployment", "whisper-large").inputs["spec"]["template"]["metadata"]["labels"]
    assert not all(other.get(k) == v for k, v in service_selector.items())


def test_handover_off_renders_no_standby(run_stack: Any) -> None:
    result = run_stack("local", lambda c: c["gpu-cluster:burst"].update({"handover": {"enabled": False}}))
    assert [d.name for d in result.by_kind("Deployment") if d.name.endswith("-standby")] == []
