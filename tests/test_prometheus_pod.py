"""The real pods' Prometheus: the scrape configuration the operator would generate from the stack's monitors, over
the pods that really run (kwok's fake addresses left out), and the pod it runs in."""

from __future__ import annotations

from typing import Any

from components.config import ClusterConfig
from tools.image_local import PROMETHEUS_IMAGE
from tools.localcluster import prometheus_pod
from tools.localcluster.plan import load_stack_config
from tools.localcluster.prometheus_pod import config, endpoint_targets, manifests, pod_targets


def _pod(name: str, ip: str, node: str = "real-gpu-01", ns: str = "gpu-telemetry", port: int = 9400) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": ns, "labels": {"app.kubernetes.io/name": "dcgm-exporter"}},
            "spec": {"nodeName": node, "containers": [{"name": "dcgm-exporter", "ports": [
                {"name": "metrics", "containerPort": port}, {"containerPort": 1}]}]},
            "status": {"podIP": ip, "phase": "Running"}}


SERVICE = {"metadata": {"name": "dcgm-exporter", "namespace": "gpu-telemetry",
                        "labels": {"app.kubernetes.io/name": "dcgm-exporter"}}}


def _endpoints(*ips: str) -> dict[str, Any]:
    return {"metadata": {"name": "dcgm-exporter", "namespace": "gpu-telemetry"},
            "subsets": [{"addresses": [{"ip": ip, "targetRef": {"kind": "Pod", "name": f"p{i}"}}
                                       for i, ip in enumerate(ips)],
                         "ports": [{"name": "metrics", "port": 9400}]}]}


MONITOR = {"kind": "ServiceMonitor", "metadata": {"name": "dcgm-exporter", "namespace": "gpu-telemetry",
                                                  "labels": {"release": "platform"}},
           "spec": {"selector": {"matchLabels": {"app.kubernetes.io/name": "dcgm-exporter"}},
                    "endpoints": [{"port": "metrics", "honorLabels": True}]}}


def test_only_real_pods_named_ports_are_targets() -> None:
    pods = [_pod("p0", "10.88.2.9"), _pod("p1", "10.244.0.3", "gpu-local-01")]
    (target,) = pod_targets(pods)
    assert (target.address, target.pod, target.node, target.port_name) == ("10.88.2.9:9400", "p0", "real-gpu-01",
                                                                           "metrics")


def test_a_service_monitor_scrapes_the_real_endpoints_of_its_service() -> None:
    pods = [_pod("p0", "10.88.2.9"), _pod("p1", "10.244.0.3", "gpu-local-01")]
    (target,) = endpoint_targets(pods, [SERVICE], [_endpoints("10.88.2.9", "10.244.0.3")])
    assert (target.address, target.service, target.container) == ("10.88.2.9:9400", "dcgm-exporter", "dcgm-exporter")
    conf = config([MONITOR], {"release": "platform"}, pods, [SERVICE], [_endpoints("10.88.2.9", "10.244.0.3")])
    (job,) = conf["scrape_configs"]
    assert job["job_name"] == "serviceMonitor/gpu-telemetry/dcgm-exporter/0" and job["honor_labels"] is True
    assert [c["targets"] for c in job["static_configs"]] == [["10.88.2.9:9400"]]
    assert conf["global"]["scrape_interval"] == "5s"


def test_a_monitor_the_selector_does_not_pick_is_not_scraped() -> None:
    pods = [_pod("p0", "10.88.2.9")]
    assert config([MONITOR], {"release": "other"}, pods, [SERVICE], [_endpoints("10.88.2.9")])["scrape_configs"] == []


def test_prometheus_runs_restricted_behind_the_service_the_stacks_guard_asks() -> None:
    cfg = load_stack_config(__import__("pathlib").Path(__file__).resolve().parents[1], "local")
    assert isinstance(cfg, ClusterConfig)
    configmap, deployment, service = manifests(cfg.monitoring_namespace, "cpu-local-01", "scrape_configs: []\n")
    # The stack's guard asks prometheus-operated in the monitoring namespace: this Service answers it.
    url = f"http://{service['metadata']['name']}.{cfg.monitoring_namespace}.svc:9090"
    assert url == cfg.observability.prometheus_url
    assert service["metadata"]["name"] == prometheus_pod.SERVICE and service["spec"]["ports"][0]["port"] == 9090
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["image"] == PROMETHEUS_IMAGE and "--web.enable-lifecycle" in container["args"]
    # Restricted Pod Security (the monitoring namespace enforces it).
    assert pod["securityContext"]["runAsNonRoot"]
    assert pod["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
    assert container["securityContext"] == {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                                            "capabilities": {"drop": ["ALL"]}}
    assert pod["nodeSelector"] == {"kubernetes.io/hostname": "cpu-local-01"}
    assert configmap["data"]["prometheus.yml"] == "scrape_configs: []\n"
