"""The operator's scrape jobs rebuilt from our monitors (tools.scrape_path): shape, order, refusals."""

from __future__ import annotations

import re
import subprocess
from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from components.mockrt import RunResult
from tests.promtool_support import PROMTOOL
from tools.scrape_path import (
    ScrapePathError,
    Target,
    meta_labels,
    prometheus_config,
    relabel_config,
    scrape_jobs,
    sd_label,
    selected_monitors,
)

LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
TARGET = Target(address="127.0.0.1:9400", namespace="gpu-telemetry", pod="dcgm-exporter-x", container="dcgm",
                node="gpu-a", port_name="metrics", pod_labels={"app.kubernetes.io/name": "dcgm-exporter"},
                service="dcgm-exporter-metrics", service_labels={"app.kubernetes.io/name": "dcgm-exporter"})


def service_monitor(**endpoint: Any) -> dict[str, Any]:
    return {"kind": "ServiceMonitor", "metadata": {"name": "dcgm-exporter", "namespace": "gpu-telemetry"},
            "spec": {"selector": {"matchLabels": {"app.kubernetes.io/name": "dcgm-exporter"}},
                     "endpoints": [{"port": "metrics", **endpoint}]}}


def test_a_service_monitor_becomes_the_operators_job_with_our_relabelings_last() -> None:
    drop = {"regex": "pod|namespace|container", "action": "labelDrop"}
    [job] = scrape_jobs(service_monitor(honorLabels=True, relabelings=[drop]), [TARGET])
    assert job["job_name"] == "serviceMonitor/gpu-telemetry/dcgm-exporter/0"
    assert job["honor_labels"] is True
    targets = [r.get("target_label") for r in job["relabel_configs"]]
    # The operator's target labels first, then ``endpoint``, then ours: ours can undo the operator's.
    assert targets[:1] == ["__tmp_prometheus_job_name"]
    assert targets.index("namespace") < targets.index("job") < targets.index("endpoint") < len(targets) - 1
    assert job["relabel_configs"][-1] == {"regex": "pod|namespace|container", "action": "labeldrop"}
    assert job["static_configs"] == [{"targets": ["127.0.0.1:9400"], "labels": meta_labels(TARGET, "endpoints")}]


def test_a_pod_monitor_job_is_named_by_namespace_and_monitor() -> None:
    monitor = {"kind": "PodMonitor", "metadata": {"name": "smoke-gang", "namespace": "training"},
               "spec": {"selector": {"matchLabels": {"job": "smoke-gang"}},
                        "podMetricsEndpoints": [{"port": "metrics", "metricRelabelings": [{"action": "Drop",
                                                                                           "regex": "x"}]}]}}
    pod = Target(address="127.0.0.1:1", namespace="training", pod="w-0", container="trainer", node="gpu-a",
                 port_name="metrics", pod_labels={"job": "smoke-gang"})
    [job] = scrape_jobs(monitor, [pod, TARGET])
    assert job["job_name"] == "podMonitor/training/smoke-gang/0"
    assert {"target_label": "job", "replacement": "training/smoke-gang"} in job["relabel_configs"]
    assert job["metric_relabel_configs"] == [{"action": "drop", "regex": "x"}]
    # Discovery is limited to the monitor's namespace: the telemetry pod is not even a candidate.
    assert [c["targets"] for c in job["static_configs"]] == [["127.0.0.1:1"]]


@pytest.mark.parametrize(("monitor", "message"), [
    ({"kind": "Service", "metadata": {"name": "a", "namespace": "n"}}, "Service n/a: not a ServiceMonitor"),
    ({**service_monitor(), "spec": {"selector": {}, "endpoints": [{"port": "m"}]}},
     "ServiceMonitor gpu-telemetry/dcgm-exporter: an empty selector would scrape every pod"),
    ({**service_monitor(), "spec": {"selector": {"matchExpressions": []}, "endpoints": []}},
     "only selector.matchLabels is modelled"),
    ({**service_monitor(), "spec": {"selector": {"matchLabels": {"a": "b"}}, "endpoints": [{"path": "/m"}]}},
     "ServiceMonitor gpu-telemetry/dcgm-exporter endpoints[0]: needs a named port"),
    (service_monitor(relabelings=[{"sourceLabels": ["a"], "target": "b"}]),
     "endpoints[0].relabelings[0]: unknown relabeling field(s) ['target']"),
])
def test_monitors_the_operator_would_refuse_are_named(monitor: dict[str, Any], message: str) -> None:
    with pytest.raises(ScrapePathError) as caught:
        scrape_jobs(monitor, [TARGET])
    assert message in str(caught.value)


def test_monitors_without_the_selector_labels_are_named_as_ignored() -> None:
    a = {**service_monitor(), "metadata": {"name": "a", "namespace": "n", "labels": {"release": "platform"}}}
    b = {**service_monitor(), "metadata": {"name": "b", "namespace": "n", "labels": {}}}
    picked, ignored = selected_monitors([a, b], {"release": "platform"})
    assert (picked, ignored) == ([a], ["ServiceMonitor n/b"])


@given(st.text(min_size=1, max_size=40))
def test_discovery_label_names_are_always_valid(key: str) -> None:
    assert LABEL_NAME.match(sd_label("__meta_kubernetes_pod_label_", key))


@given(st.dictionaries(st.sampled_from(["sourceLabels", "targetLabel", "regex", "action", "replacement",
                                        "separator", "modulus", "bogus"]),
                       st.one_of(st.text(max_size=5), st.lists(st.text(max_size=5), max_size=2)), max_size=4))
def test_relabel_translation_keeps_every_known_field_and_refuses_the_rest(rule: dict[str, Any]) -> None:
    if "bogus" in rule:
        with pytest.raises(ScrapePathError, match=r"unknown relabeling field\(s\) \['bogus'\]"):
            relabel_config(rule, "here")
        return
    out = relabel_config(rule, "here")
    assert len(out) == len(rule)
    if "action" in rule:
        assert out["action"] == str(rule["action"]).lower()


@pytest.mark.skipif(PROMTOOL is None, reason="Debian's prometheus package: make observability-tools")
def test_prometheus_accepts_the_scrape_config_of_every_monitor_of_both_stacks(
        prod: RunResult, local: RunResult, tmp_path: Any) -> None:
    for result in (prod, local):
        monitors = [r.inputs for r in (*result.by_kind("ServiceMonitor"), *result.by_kind("PodMonitor"))]
        assert monitors, result.stack
        jobs = [job for monitor in monitors for job in scrape_jobs(monitor, [TARGET])]
        path = tmp_path / f"{result.stack}.yml"
        path.write_text(yaml.safe_dump(prometheus_config(jobs, [])))
        check = subprocess.run([str(PROMTOOL), "check", "config", str(path)], capture_output=True, text=True)
        assert check.returncode == 0, check.stdout + check.stderr
