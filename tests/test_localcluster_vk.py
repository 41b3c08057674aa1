"""The local cluster's real virtual-kubelet (pure parts): the stack's provider Deployment as a local process,
its capacity file in the mock provider's format, the audit policy and the RBAC usage analysis."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509
from hypothesis import given
from hypothesis import strategies as st

from components.mockrt import RunResult
from tools.localcluster.plan import (
    PORT_NAMES,
    Layout,
    VirtualKubeletFiles,
    audit_policy,
    check_mock_provider_config,
    component_commands,
    default_plan,
    load_plan,
    load_stack_config,
    required_grants,
    serving_cert_process,
    virtual_kubelet_process,
)
from tools.localcluster.rbac_usage import Grant, Request, grants_from_rules, matches, parse_audit, usage

FILES = VirtualKubeletFiles(Path("/s/vk/kubeconfig"), Path("/s/vk/provider.json"), Path("/s/vk/serving/tls.crt"),
                            Path("/s/vk/serving/tls.key"), Path("/s/pki/ca.crt"))


def _deployed(local: RunResult, name: str = "vk-local-cloud") -> tuple[dict[str, Any], dict[str, Any]]:
    (cm,) = [c for c in local.by_kind("ConfigMap") if c.metadata["name"] == f"{name}-config"]
    return _pod(local, name)["containers"][0], cm.inputs["data"]


def _pod(local: RunResult, name: str = "vk-local-cloud") -> dict[str, Any]:
    (dep,) = [d for d in local.by_kind("Deployment") if d.metadata["name"] == name]
    pod: dict[str, Any] = dep.inputs["spec"]["template"]["spec"]
    return pod


def test_the_local_stack_provider_runs_as_the_upstream_binary_with_its_own_token(local: RunResult) -> None:
    container, _ = _deployed(local)
    argv, env = virtual_kubelet_process(Path("/b"), container, "vk-local-cloud-local", "gpu-system", FILES, 31000,
                                        31001)
    assert argv[0] == "/b/virtual-kubelet"
    # The stack's own flags stay; what names the pod's paths or addresses is the local process's.
    assert "--nodename=vk-local-cloud" in argv and "--provider=mock" in argv and "--os=linux" in argv
    assert argv[-3:] == ["--provider-config=/s/vk/provider.json", "--metrics-addr=127.0.0.1:31001",
                         "--kubeconfig=/s/vk/kubeconfig"]
    assert not any(a.startswith("--metrics-addr=:") or "/etc/virtual-kubelet" in a for a in argv)
    # The taint override the stack sets reaches the binary unchanged: NoSchedule, the provider's name.
    assert (env["VKUBELET_TAINT_KEY"], env["VKUBELET_TAINT_VALUE"], env["VKUBELET_TAINT_EFFECT"]) == (
        "virtual-kubelet.io/provider", "local-cloud", "NoSchedule")
    # $(POD_IP) is expanded from the downward-API value a local process has.
    assert env["VKUBELET_POD_IP"] == "127.0.0.1" and env["POD_NAMESPACE"] == "gpu-system"
    # Its own kubeconfig even if the caller's environment names the admin one; the mock reads no credentials.
    assert env["KUBECONFIG"] == "/s/vk/kubeconfig" and "PROVIDER_CREDENTIALS_FILE" not in env
    assert env["KUBELET_PORT"] == "31000"
    # The kubelet API's key pair is the one the stack's init container makes (run locally), and the cluster CA
    # the stack names for its callers is the local cluster's.
    assert (env["APISERVER_CERT_LOCATION"], env["APISERVER_KEY_LOCATION"], env["APISERVER_CA_CERT_LOCATION"]) == (
        "/s/vk/serving/tls.crt", "/s/vk/serving/tls.key", "/s/pki/ca.crt")


def test_a_stack_without_a_serving_key_pair_is_refused(local: RunResult) -> None:
    container, _ = _deployed(local)
    bare = {**container, "env": [e for e in container["env"] if e["name"] != "APISERVER_KEY_LOCATION"]}
    with pytest.raises(ValueError, match=r"'virtual-kubelet' in gpu-system: APISERVER_KEY_LOCATION not set: "
                                         r"virtual-kubelet exits at start without the key pair"):
        virtual_kubelet_process(Path("/b"), bare, "p", "gpu-system", FILES, 1, 2)
    # No client CA named: none locally either (the binary then serves without client authentication).
    no_ca = {**container, "env": [e for e in container["env"] if e["name"] != "APISERVER_CA_CERT_LOCATION"]}
    _, env = virtual_kubelet_process(Path("/b"), no_ca, "p", "gpu-system", FILES, 1, 2)
    assert "APISERVER_CA_CERT_LOCATION" not in env


def test_the_init_container_makes_the_key_pair_locally(local: RunResult, tmp_path: Path) -> None:
    argv = serving_cert_process(_pod(local)["initContainers"], "gpu-system", tmp_path)
    assert argv[1:] == ["-m", "agents.serving_cert", "--name=vk-local-cloud", "--ip=127.0.0.1",
                        f"--dir={tmp_path}"]
    subprocess.run(argv, cwd=Path(__file__).resolve().parents[1], check=True, capture_output=True)
    cert = x509.load_pem_x509_certificate((tmp_path / "tls.crt").read_bytes())
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert (san.get_values_for_type(x509.DNSName), [str(a) for a in san.get_values_for_type(x509.IPAddress)]) == (
        ["vk-local-cloud"], ["127.0.0.1"])


def test_init_containers_the_harness_cannot_run_are_refused(local: RunResult, tmp_path: Path) -> None:
    (init,) = _pod(local)["initContainers"]
    with pytest.raises(ValueError, match=r"init container 'setup' in ns: runs \['sh'\], which the local harness"):
        serving_cert_process([init, {"name": "setup", "command": ["sh"]}], "ns", tmp_path)
    with pytest.raises(ValueError, match=r"no 'serving-cert' init container in ns"):
        serving_cert_process([], "ns", tmp_path)
    secret = {**init, "env": [{"name": "POD_IP", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}]}
    with pytest.raises(ValueError, match=r"env POD_IP comes from .*secretKeyRef.*cannot reproduce"):
        serving_cert_process([secret], "ns", tmp_path)


def test_a_provider_the_binary_does_not_carry_is_refused_by_name(local: RunResult) -> None:
    container, _ = _deployed(local)
    other = {**container, "args": [a if not a.startswith("--provider=") else "--provider=lambda"
                                   for a in container["args"]]}
    with pytest.raises(ValueError, match=r"carries only the 'mock' provider, the stack asks for \['lambda'\]"):
        virtual_kubelet_process(Path("/b"), other, "p", "gpu-system", FILES, 1, 2)
    secret_env = {**container, "env": [{"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}]}
    with pytest.raises(ValueError, match=r"env TOKEN comes from .*secretKeyRef.*cannot reproduce"):
        virtual_kubelet_process(Path("/b"), secret_env, "p", "gpu-system", FILES, 1, 2)


def test_the_stack_writes_the_mock_format_with_every_resource(local: RunResult) -> None:
    _, data = _deployed(local)
    config = json.loads(check_mock_provider_config(data["provider.json"], "vk-local-cloud-config"))
    (virtual,) = [n for n in load_plan(Path(__file__).resolve().parents[1]).by_kind("virtual")
                  if n.name == "vk-local-cloud"]
    assert config == {"vk-local-cloud": {
        "cpu": str(virtual.cpu), "memory": f"{virtual.memory_gi}Gi", "pods": str(virtual.pods),
        # GPUs and ephemeral storage are not fields of the mock: under `others`, or the node would lack them.
        "others": {"nvidia.com/gpu": str(virtual.gpus), "ephemeral-storage": f"{virtual.ephemeral_storage_gi}Gi"}}}


@pytest.mark.parametrize(("text", "message"), [
    ("{", "cfg: not JSON"),
    ("[]", "cfg: expected an object of node name -> resources, got list"),
    ('{"n": [1]}', "cfg: node 'n': expected resource -> quantity, got list"),
    ('{"n": {"cpu": [1]}}', "cfg: node 'n': expected resource -> quantity"),
    ('{"n": {"cpu": "1", "others": []}}', "cfg: node 'n': expected resource -> quantity"),
    # The generic node-cli file: the mock would drop the GPUs and register a node that refuses GPU pods.
    ('{"n": {"cpu": "1", "nvidia.com/gpu": "8"}}', "cfg: node 'n': the mock provider reads nvidia.com/gpu only under"),
])
def test_a_capacity_file_the_mock_cannot_read_is_refused_naming_it(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        check_mock_provider_config(text, "cfg")


def test_kwok_fakes_every_node_but_the_virtual_ones() -> None:
    plan = default_plan()
    assert [n.kind for n in plan.kwok_nodes] == ["gpu"] * 4 + ["system"]
    assert plan.by_kind("virtual")


def test_the_api_server_audits_service_accounts_only(tmp_path: Path) -> None:
    lay = Layout(tmp_path)
    argv = component_commands(lay, dict.fromkeys(PORT_NAMES, 1))["kube-apiserver"]
    assert f"--audit-policy-file={lay.audit_policy}" in argv and f"--audit-log-path={lay.audit_log}" in argv
    policy = audit_policy()
    assert policy["rules"] == [{"level": "Metadata", "userGroups": ["system:serviceaccounts"]}, {"level": "None"}]
    yaml.safe_dump(policy)  # what control.up writes


def test_the_api_server_calls_kubelets_with_its_own_client_certificate(tmp_path: Path) -> None:
    """Logs and exec reach a virtual kubelet as kubeadm's kubelet client user, checked there by RBAC."""
    lay = Layout(tmp_path)
    argv = component_commands(lay, dict.fromkeys(PORT_NAMES, 1))["kube-apiserver"]
    assert f"--kubelet-client-certificate={lay.pki / 'kubelet-client.crt'}" in argv
    assert f"--kubelet-client-key={lay.pki / 'kubelet-client.key'}" in argv


def test_the_grants_checked_before_start_cover_node_lease_pods_and_status() -> None:
    checks = required_grants(("inference",), "vk-a")
    assert {(c["verb"], c["resource"], c.get("namespace", "")) for c in checks} == {
        ("create", "nodes", ""), ("get", "leases", "kube-node-lease"), ("watch", "pods", ""),
        ("update", "pods", "inference")}


# --------------------------------------------------------------------------- RBAC usage from the audit log

SA = "system:serviceaccount:gpu-system:vk-a"


def event(verb: str, resource: str, *, ns: str = "", name: str = "", group: str = "", sub: str = "",
          decision: str = "allow", audit_id: str = "", user: str = SA, code: int = 200) -> dict[str, Any]:
    ref = {"resource": resource, "namespace": ns, "name": name, "apiGroup": group}
    if sub:
        ref["subresource"] = sub
    return {"kind": "Event", "auditID": audit_id or f"{verb}-{resource}-{sub}-{ns}-{name}", "stage": "ResponseComplete",
            "verb": verb, "user": {"username": user}, "objectRef": ref, "responseStatus": {"code": code},
            "annotations": {"authorization.k8s.io/decision": decision}}


def log(*events: dict[str, Any]) -> str:
    return "".join(json.dumps(e) + "\n" for e in events)


CLUSTER = grants_from_rules("ClusterRole vk", None, [
    {"apiGroups": [""], "resources": ["nodes"], "verbs": ["create"]},
    {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "watch"], "resourceNames": ["vk-a"]},
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "watch"]},
])
LEASE = grants_from_rules("Role vk in kube-node-lease", "kube-node-lease", [
    {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
    {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["get", "update"],
     "resourceNames": ["vk-a"]},
])


def test_usage_splits_grants_into_used_and_unused_and_lists_denials() -> None:
    requests = parse_audit(log(
        event("create", "nodes", name="vk-a"),
        event("get", "nodes", name="vk-a"),
        event("get", "nodes", name="vk-a", audit_id="second-get"),
        event("list", "pods"),
        event("update", "leases", ns="kube-node-lease", name="vk-a", group="coordination.k8s.io"),
        event("patch", "nodes", name="vk-a", sub="status", decision="forbid", code=403),
        event("get", "nodes", name="someone-else", user="system:serviceaccount:x:y"),
    ), "audit.log", user=SA)
    result = usage(CLUSTER + LEASE, requests)
    assert {g.describe(): n for g, n in result.used.items()} == {
        "create nodes cluster-wide (ClusterRole vk)": 1,
        "get nodes ['vk-a'] cluster-wide (ClusterRole vk)": 2,
        "list pods cluster-wide (ClusterRole vk)": 1,
        "update coordination.k8s.io/leases ['vk-a'] in kube-node-lease (Role vk in kube-node-lease)": 1,
    }
    assert sorted(g.describe() for g in result.unused) == [
        "create coordination.k8s.io/leases in kube-node-lease (Role vk in kube-node-lease)",
        "get coordination.k8s.io/leases ['vk-a'] in kube-node-lease (Role vk in kube-node-lease)",
        "watch nodes ['vk-a'] cluster-wide (ClusterRole vk)",
        "watch pods cluster-wide (ClusterRole vk)",
    ]
    assert result.report()["denied"] == ["patch nodes/status vk-a (HTTP 403)"]


def test_a_named_grant_never_matches_a_create_and_a_role_only_its_namespace() -> None:
    named = Grant("r", None, "", "secrets", "create", ("s",))
    assert not matches(named, Request(SA, "create", "", "secrets", "ns", "s", True))
    role = Grant("r", "kube-node-lease", "coordination.k8s.io", "leases", "get")
    assert not matches(role, Request(SA, "get", "coordination.k8s.io", "leases", "default", "vk-a", True))
    assert matches(role, Request(SA, "get", "coordination.k8s.io", "leases", "kube-node-lease", "vk-a", True))


def test_allowed_requests_no_grant_covers_are_listed_apart() -> None:
    discovery = {"kind": "Event", "auditID": "d", "verb": "get", "user": {"username": SA},
                 "requestURI": "/api?timeout=32s", "annotations": {"authorization.k8s.io/decision": "allow"},
                 "responseStatus": {"code": 200}}
    result = usage(CLUSTER, parse_audit(log(discovery), "a"))
    assert result.report()["outside"] == ["get nonresource:/api (HTTP 200)"]


def test_a_line_still_being_written_is_skipped_any_other_bad_line_is_named() -> None:
    whole = log(event("list", "pods"))
    assert len(parse_audit(whole + '{"kind": "Ev', "a")) == 1
    with pytest.raises(ValueError, match=r"^audit.log:2: not JSON"):
        parse_audit(whole + "{oops\n" + whole, "audit.log")
    with pytest.raises(ValueError, match=r"^audit.log:1: not an audit Event"):
        parse_audit('{"kind": "Status"}\n', "audit.log")


@given(st.text(max_size=300))
def test_any_text_parses_or_fails_naming_the_line(text: str) -> None:
    try:
        parse_audit(text, "audit.log")
    except ValueError as err:
        assert str(err).startswith("audit.log:")


@given(st.lists(st.sampled_from(["get", "list", "watch", "create", "update", "patch", "delete"]), max_size=20))
def test_every_grant_is_either_used_or_unused_never_both(verbs: list[str]) -> None:
    grants = CLUSTER + LEASE
    result = usage(grants, parse_audit(log(*(event(v, "pods", audit_id=str(i)) for i, v in enumerate(verbs))), "a"))
    assert set(result.used).isdisjoint(result.unused)
    assert set(result.used) | set(result.unused) == set(grants)
    assert sum(1 for v in verbs if v not in ("list", "watch")) == len(result.outside)


def test_each_provider_of_the_local_stack_runs_as_its_own_service_account() -> None:
    from tools.localcluster.virtual_kubelet import targets

    cfg = load_stack_config(Path(__file__).resolve().parents[1], "local")
    found = targets(cfg)
    assert [t.provider for t in found] == ["local-cloud", "backup-cloud"]
    for t in found:
        app = f"vk-{t.provider}"
        assert (t.node, t.namespace, t.app, t.workload_namespaces) == (
            app, cfg.system_namespace, app, (cfg.inference_namespace,))
        assert t.user == f"system:serviceaccount:{cfg.system_namespace}:{app}"
        assert t.process == f"virtual-kubelet-{t.provider}"
