"""Real nodes: the plan each kubelet, containerd and CNI network gets, the host checks, and the host hygiene."""

from __future__ import annotations

import dataclasses
import ipaddress
import json
import os
import shutil
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agents.health_guard.decide import pool_allowance
from tools.localcluster import apiproxy, hostcheck, nodehost, processes
from tools.localcluster.plan import (
    Layout,
    component_commands,
    default_plan,
    load_plan,
    load_stack_config,
    stack_config_values,
)
from tools.localcluster.realnodes import (
    APISERVER_IP,
    COREDNS_RULES,
    NODE_IP,
    REAL_GPU_MODEL,
    REAL_GPU_NODES,
    REAL_GPU_NODES_PER_HOUR,
    REAL_GPU_POOL,
    REAL_GPUS_PER_NODE,
    REAL_NODE_TAINT,
    RealNode,
    addresses,
    cni_conflist,
    containerd_config,
    coredns_command,
    corefile,
    device_plugin_command,
    from_record,
    kube_proxy_config,
    kubelet_command,
    kubelet_config,
    node_paths,
    node_ready_condition,
    policy_node,
    real_nodes,
    real_nodes_for,
    stack_overrides,
    to_record,
)

ROOT = Path(__file__).resolve().parents[1]
STATE = ROOT / ".state" / "localcluster"
NODES = real_nodes_for(default_plan())
#: The local stack with real nodes: its system node and the real GPU pool's nodes, as the stack declares them.
LOCAL = real_nodes_for(load_plan(ROOT, "local", real_nodes=True))


def test_the_stacks_system_node_becomes_real_and_a_gpu_node_joins_in_a_pool_of_its_own() -> None:
    system, gpu = NODES
    plan_system = default_plan().by_kind("system")[0]
    # The stack's own system node, registered by a real kubelet in kwok's place: its pods run for real.
    assert (system.name, system.kind, system.labels["gpucluster.io/pool"]) == (plan_system.name, "system", "system")
    assert system.taints == ()
    assert (gpu.kind, gpu.gpus, gpu.labels["gpucluster.io/pool"]) == ("gpu", 8, REAL_GPU_POOL)
    # Only pods that ask for a real kubelet land on the extra GPU node.
    assert REAL_NODE_TAINT in gpu.taints
    # The kubelet refuses kubernetes.io labels on its command line; the node-pool agent sets those.
    assert not any("kubernetes.io" in k for n in NODES for k in n.labels)
    assert policy_node(NODES) == plan_system.name
    # Without a system node in the plan, the system node is an extra one, tainted too.
    extra = real_nodes("system", "g")[0]
    assert (extra.name, extra.taints) == ("real-system-01", (REAL_NODE_TAINT,))
    with pytest.raises(ValueError, match="at least one fake GPU, got 0"):
        real_nodes("system", "g", gpus=0)


def test_with_real_nodes_the_stack_declares_their_pool_and_they_register_as_it_says() -> None:
    values = stack_config_values(ROOT / "Pulumi.local.yaml")
    changed = stack_overrides(values)
    # The stack's own pools first and untouched, the real GPU nodes' pool after them.
    assert changed["pools"][:-1] == values["pools"]
    assert changed["pools"][-1] == {"name": REAL_GPU_POOL, "nodes": list(REAL_GPU_NODES), "gpuModel": REAL_GPU_MODEL,
                                    "gpusPerNode": REAL_GPUS_PER_NODE, "spareNodes": 1}
    # Inference that could use any pool stays on the stack's own: its image cannot be pulled on a real node.
    assert [s["pool"] for s in changed["inference"]["services"]] == ["local-gpu"]
    # The pods resolve through CoreDNS on the host: the stack's DNS egress rule admits it.
    assert changed["dnsCidrs"] == ["10.255.255.1/32"]
    # The guard may take two distinct nodes of three out in an hour (one at a time): a degraded one, then a fatal one.
    health = changed["observability"]["health"]
    assert health == {**values["observability"]["health"], "maxPoolPercentPerHour": 67}
    assert pool_allowance(health["maxPoolPercentPerHour"], len(REAL_GPU_NODES)) == REAL_GPU_NODES_PER_HOUR
    assert pool_allowance(health["maxPoolPercentQuarantined"], len(REAL_GPU_NODES)) == 1
    assert set(changed) == {"pools", "inference", "dnsCidrs", "observability"}  # nothing else of the stack changes
    cfg = load_stack_config(ROOT, "local", real_nodes=True)
    assert [p.name for p in cfg.pools] == ["local-gpu", REAL_GPU_POOL]
    assert cfg.observability.health.max_pool_percent_per_hour == 67
    system, *gpus = LOCAL
    assert system.name == "cpu-local-01" and system.taints == ()
    assert [n.name for n in gpus] == list(REAL_GPU_NODES) and len(gpus) >= 2  # a gang of two spans two kubelets
    for node in gpus:
        assert node.gpus == REAL_GPUS_PER_NODE
        # The stack's pool taint keeps other pods off, as on every node of a tainted pool; ours is not needed.
        assert node.taints == ({"key": "gpucluster.io/pool", "value": REAL_GPU_POOL, "effect": "NoSchedule"},)
        assert node.labels["gpucluster.io/pool"] == REAL_GPU_POOL and node.labels["gpucluster.io/real-node"] == "true"
        assert not any("kubernetes.io" in k for k in node.labels)
    # The kwok nodes are the stack's own; the real ones are left to their kubelets.
    plan = load_plan(ROOT, "local", real_nodes=True)
    assert {n.name for n in plan.by_kind("gpu") if n.pool == REAL_GPU_POOL} == set(REAL_GPU_NODES)


@pytest.mark.parametrize(("values", "message"), [
    ({"pools": []}, "pools: the stack declares no GPU pool"),
    ({"pools": [{"name": REAL_GPU_POOL, "nodes": ["n1"]}]}, f"already has a pool named '{REAL_GPU_POOL}'"),
])
def test_real_node_overrides_refuse_a_stack_they_cannot_join(values: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        stack_overrides(values)


def test_an_inference_service_pinned_to_a_pool_keeps_it() -> None:
    values = {"pools": [{"name": "a"}, {"name": "b"}],
              "inference": {"services": [{"name": "x", "pool": "b"}, {"name": "y"}]}}
    assert [s["pool"] for s in stack_overrides(values)["inference"]["services"]] == ["b", "a"]


@pytest.mark.parametrize(("health", "expected"), [
    (None, {"maxPoolPercentPerHour": 67, "maxNodesPerHour": 2}),
    ({"maxPoolPercentPerHour": 10, "maxNodesPerHour": 1, "probationSeconds": 5},
     {"maxPoolPercentPerHour": 67, "maxNodesPerHour": 2, "probationSeconds": 5}),
    # Higher rails are the stack's: raised, never lowered.
    ({"maxPoolPercentPerHour": 80, "maxNodesPerHour": 6}, {"maxPoolPercentPerHour": 80, "maxNodesPerHour": 6}),
    # A value that is not a number is left for the stack's validation to name.
    *[({"maxPoolPercentPerHour": "lots", "maxNodesPerHour": True},) * 2],
])
def test_the_guards_hourly_rails_let_two_real_gpu_nodes_out_in_an_hour(health: dict[str, Any] | None,
                                                                      expected: dict[str, Any]) -> None:
    values: dict[str, Any] = {"pools": [{"name": "a"}], "observability": {"healthGuard": True}}
    if health is not None:
        values["observability"]["health"] = health
    out = stack_overrides(values)["observability"]
    assert out == {"healthGuard": True, "health": expected}
    assert values["observability"].get("health") == health  # the input is not changed


@pytest.mark.parametrize("observability", [["not", "a", "section"], {"health": "off"}])
def test_an_observability_value_that_is_not_a_section_is_left_to_validation(observability: Any) -> None:
    assert "observability" not in stack_overrides({"pools": [{"name": "a"}], "observability": observability})


@pytest.mark.parametrize("nodes", [NODES, LOCAL], ids=["default", "local-stack"])
def test_nodes_share_nothing_they_would_fight_over(nodes: tuple[RealNode, ...]) -> None:
    """Kubelets on one host: their ports, cgroup roots, bridges, pod subnets and sockets all differ; the address is
    the host's, one for all, so one policy engine polices every node's pods (``policy_node``)."""
    for attr in ("pod_cidr", "bridge", "kubelet_port", "healthz_port", "cgroup_root", "network"):
        values = [getattr(n, attr) for n in nodes]
        assert len(set(values)) == len(values), attr
    subnets = [ipaddress.ip_network(n.pod_cidr) for n in nodes]
    kwok = ipaddress.ip_network("10.244.0.0/16")  # kwok's fake pod addresses (plan.component_commands)
    assert not any(s.overlaps(kwok) for s in subnets)
    assert not any(a.overlaps(b) for i, a in enumerate(subnets) for b in subnets[i + 1:])
    assert all(len(n.bridge) <= 15 for n in nodes)  # the kernel's interface-name limit
    assert {n.ip for n in nodes} == {NODE_IP}
    assert addresses(nodes) == [APISERVER_IP, NODE_IP]


def test_every_unix_socket_fits_the_kernels_108_byte_limit_under_the_default_state() -> None:
    for node in NODES:
        paths = node_paths(STATE, node)
        for sock in (paths.containerd_socket, Path(str(paths.containerd_socket) + ".ttrpc"),
                     paths.plugins_registry / "fakegpu.sock"):
            assert len(str(sock).encode()) < 108, sock


def test_containerd_config_is_valid_toml_with_what_this_host_needs() -> None:
    node = NODES[0]
    paths = node_paths(STATE, node)
    conf = tomllib.loads(containerd_config(node, paths))
    assert conf["version"] == 2
    assert conf["grpc"]["address"] == str(paths.containerd_socket)
    assert conf["root"].startswith(str(paths.base)) and conf["state"].startswith(str(paths.base))
    cri = conf["plugins"]["io.containerd.grpc.v1.cri"]
    assert cri["restrict_oom_score_adj"] is True  # this host refuses a negative oom_score_adj
    assert cri["sandbox_image"] == "docker.io/local/pause:3.10"
    assert cri["cni"]["conf_dir"] == str(paths.cni_conf_dir)
    runtimes = cri["containerd"]["runtimes"]
    assert set(runtimes) == {"runc", "nvidia"}  # the stack's training pods name RuntimeClass nvidia
    assert all(r["options"]["SystemdCgroup"] is False for r in runtimes.values())


def test_cni_network_is_the_nodes_own_bridge_without_masquerade() -> None:
    node = NODES[1]
    paths = node_paths(STATE, node)
    conf = cni_conflist(node, paths)
    bridge = conf["plugins"][0]
    assert (conf["name"], bridge["bridge"], bridge["ipMasq"]) == (node.network, node.bridge, False)
    assert bridge["ipam"]["ranges"] == [[{"subnet": node.pod_cidr, "gateway": node.gateway}]]
    assert bridge["ipam"]["dataDir"].startswith(str(paths.base))


def test_kubelet_config_locks_the_kubelet_api_and_runs_on_cgroup_v1() -> None:
    node = NODES[0]
    paths = node_paths(STATE, node)
    conf = kubelet_config(node, paths, Path("/ca.crt"), Path("/s.crt"), Path("/s.key"))
    assert conf["failCgroupV1"] is False and conf["cgroupDriver"] == "cgroupfs"
    assert conf["cgroupRoot"] == f"/gpucluster/{node.name}"
    assert conf["authentication"]["anonymous"] == {"enabled": False}
    assert conf["authentication"]["webhook"] == {"enabled": True}
    assert conf["authorization"] == {"mode": "Webhook"}
    assert conf["readOnlyPort"] == 0
    assert conf["registerWithTaints"] == []
    # Everything the kubelet writes stays under the node's state folder.
    assert conf["podLogsDir"].startswith(str(paths.base)) and conf["volumePluginDir"].startswith(str(paths.base))
    argv = kubelet_command(Path("/bin"), node, paths)
    assert f"--node-ip={node.ip}" in argv and f"--hostname-override={node.name}" in argv
    labels = next(a for a in argv if a.startswith("--node-labels="))
    assert "gpucluster.io/pool=system" in labels


def test_pods_get_the_hosts_coredns_for_the_cluster_domain_and_nothing_else() -> None:
    node = NODES[0]
    conf = kubelet_config(node, node_paths(STATE, node), Path("/ca.crt"), Path("/s.crt"), Path("/s.key"))
    assert conf["clusterDNS"] == [APISERVER_IP] and conf["clusterDomain"] == "cluster.local"
    text = corefile(Path("/s/nodes/coredns.kubeconfig"))
    assert text.startswith("cluster.local:53 in-addr.arpa:53 {")
    assert f"bind {APISERVER_IP}" in text and "kubeconfig /s/nodes/coredns.kubeconfig" in text
    # No upstream (nothing to forward to from here) and no pod records: only Services.
    assert "forward" not in text and "pods disabled" in text
    assert text.count("{") == text.count("}") == 2
    assert coredns_command(Path("/b"), Path("/s/Corefile")) == ["/b/coredns", "-conf", "/s/Corefile"]
    # Read-only, named resources: no wildcard, no write.
    for rule in COREDNS_RULES:
        assert "*" not in rule["resources"] and set(rule["verbs"]) <= {"list", "watch"}, rule


def test_device_plugin_reports_the_nodes_gpus_and_reads_its_unhealthy_file() -> None:
    node = NODES[1]
    paths = node_paths(STATE, node)
    argv = device_plugin_command(Path("/bin"), node, paths)
    assert "--count=8" in argv and "--resource=nvidia.com/gpu" in argv
    assert f"--registry-dir={paths.plugins_registry}" in argv and f"--unhealthy-file={paths.unhealthy_gpus}" in argv


def test_kube_proxy_leaves_conntrack_alone_and_serves_loopback_only() -> None:
    conf = kube_proxy_config(Path("/kp.kubeconfig"))
    assert conf["mode"] == "iptables" and conf["conntrack"]["maxPerCore"] == 0
    assert conf["bindAddress"] == "127.0.0.1" and conf["metricsBindAddress"].startswith("127.0.0.1:")


def test_api_server_is_reachable_from_pods_only_with_real_nodes() -> None:
    ports = {name: 1000 + i for i, name in enumerate(
        ("etcd", "etcd_peer", "apiserver", "kwok", "vc_scheduler_metrics", "vc_scheduler_healthz",
         "vc_controller_metrics", "vc_controller_healthz", "descheduler"))}
    lay = Layout(Path("/s"))
    kwok_only = component_commands(lay, ports)["kube-apiserver"]
    assert "--bind-address=127.0.0.1" in kwok_only and "--endpoint-reconciler-type=none" in kwok_only
    real = component_commands(lay, ports, APISERVER_IP)["kube-apiserver"]
    # With real nodes the pods reach it through the proxy, which the kubernetes Service's endpoints name: the API
    # server must not write them back to itself.
    assert f"--advertise-address={APISERVER_IP}" in real and "--endpoint-reconciler-type=none" in real
    assert "--bind-address=0.0.0.0" in real
    proxy = apiproxy.command(lay, {**ports, "apiproxy_control": 7}, APISERVER_IP)
    assert f"--listen={APISERVER_IP}:443" in proxy and "--control=127.0.0.1:7" in proxy
    assert f"--upstream=https://127.0.0.1:{ports['apiserver']}" in proxy
    endpoints, endpoint_slice = apiproxy.kubernetes_endpoints(APISERVER_IP)
    assert endpoints["subsets"] == [{"addresses": [{"ip": APISERVER_IP}],
                                     "ports": [{"name": "https", "port": 443, "protocol": "TCP"}]}]
    assert endpoint_slice["endpoints"][0]["addresses"] == [APISERVER_IP]
    assert endpoint_slice["metadata"]["labels"]["kubernetes.io/service-name"] == "kubernetes"
    # 443 is a port the stack's NetworkPolicies let controllers reach the API server on.
    from components.network_policy import API_SERVER_PORTS

    assert apiproxy.PORT in API_SERVER_PORTS
    for argv in (kwok_only, real):
        assert "--authorization-mode=Node,RBAC" in argv
        assert "--enable-admission-plugins=NodeRestriction" in argv


def test_the_record_of_started_nodes_round_trips() -> None:
    assert from_record(json.loads(json.dumps(to_record(NODES)))) == NODES


@pytest.mark.parametrize(("status", "ready"), [
    ({"conditions": [{"type": "Ready", "status": "True"}]}, True),
    ({"conditions": [{"type": "MemoryPressure", "status": "False"}, {"type": "Ready", "status": "False"}]}, False),
    ({"conditions": None}, False),
    ({}, False),
])
def test_node_ready_reads_the_kubelets_ready_condition(status: dict[str, Any], ready: bool) -> None:
    assert node_ready_condition(status) is ready


# --------------------------------------------------------------------------- host checks


def _readings(**over: Any) -> hostcheck.HostReadings:
    base: dict[str, Any] = {
        "euid": 0, "filesystems": frozenset({"overlay", "ext4"}),
        "cgroup_controllers": frozenset(hostcheck.CGROUP_CONTROLLERS), "cgroup_v2": False,
        "commands": dict.fromkeys(hostcheck.COMMANDS, True),
        "cni_plugins": dict.fromkeys(hostcheck.CNI_PLUGINS, True),
        "binaries": {"kubelet": True, "pause": True},
    }
    base.update(over)
    return hostcheck.HostReadings(**base)


@pytest.mark.parametrize(("over", "message"), [
    ({"euid": 1000}, "root: running as uid 1000; needs root"),
    ({"filesystems": frozenset({"ext4"})}, "overlayfs: not in /proc/filesystems; needs the overlay filesystem"),
    ({"cgroup_controllers": frozenset({"cpu", "memory"})},
     "cgroups: cpuacct, cpuset, pids, devices, freezer missing from the mounted cgroup v1 hierarchies"),
    ({"cgroup_controllers": frozenset({"cpu"}), "cgroup_v2": True}, "missing from the cgroup v2 root's"),
    ({"commands": {**dict.fromkeys(hostcheck.COMMANDS, True), "containerd": False}},
     "containerd: not on PATH; needs the container runtime (Debian package containerd)"),
    ({"cni_plugins": {"bridge": True}}, "CNI plugins: host-local, portmap, loopback missing from /usr/lib/cni"),
    ({"binaries": {"kubelet": False, "pause": True}}, "binaries: kubelet not built in .state/localcluster/bin"),
    ({"other_real_nodes": True}, "real nodes: another local cluster's real nodes run on this host"),
    ({"other_real_nodes": True, "other_owner": "/tmp/gpucl-e2e-7"},
     "needs `localcluster --state /tmp/gpucl-e2e-7 down` first"),
])
def test_each_failed_host_check_is_one_line_naming_what_and_why(over: dict[str, Any], message: str) -> None:
    found = hostcheck.problems(_readings(**over))
    assert len(found) == 1 and message in found[0], found


@pytest.mark.parametrize(("owner", "alive", "reclaim"), [
    ("/tmp/gpucl-e2e-7", False, True),  # a killed session's nodes: reclaimed
    ("/tmp/gpucl-e2e-7", True, False),  # another cluster still running: never touched
    ("/s", False, False),  # our own record: our own up and down handle it
    (None, False, False),  # no record: nothing known to reclaim
    ("", False, False),
])
def test_only_a_dead_sessions_real_nodes_are_reclaimed(owner: str | None, alive: bool, reclaim: bool) -> None:
    assert hostcheck.stale_owner(owner, "/s", alive) is reclaim


def test_the_next_up_reclaims_the_host_from_a_killed_sessions_state(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The owner record names a state folder whose recorded processes are gone: its own ``down`` runs and the record
    goes; with a live process in that folder, nothing happens."""
    owner_file, other = tmp_path / "owner", tmp_path / "killed"
    monkeypatch.setattr(nodehost, "HOST_OWNER", owner_file)
    downs: list[Path] = []

    def down_recorded(lay: Layout) -> list[str]:
        downs.append(lay.state)
        return ["iptables rules"]

    monkeypatch.setattr(nodehost, "down_recorded", down_recorded)
    (other / "run").mkdir(parents=True)
    dead = processes.Proc("kubelet-real-gpu-01", pid=2**22 - 1, argv=["kubelet"], log="k.log", start_ticks=1)
    (other / "run" / "kubelet-real-gpu-01.json").write_text(json.dumps(dataclasses.asdict(dead)))
    owner_file.write_text(str(other))
    assert nodehost.reclaim_stale_owner(Layout(tmp_path / "mine")) == [
        f"reclaimed the host from {other}, whose processes are gone", "iptables rules"]
    assert downs == [other] and not owner_file.exists()
    me = processes.Proc("kubelet-real-gpu-01", pid=os.getpid(), argv=["python"], log="k.log",
                        start_ticks=processes.start_ticks(os.getpid()))
    (other / "run" / "kubelet-real-gpu-01.json").write_text(json.dumps(dataclasses.asdict(me)))
    owner_file.write_text(str(other))
    assert nodehost.reclaim_stale_owner(Layout(tmp_path / "mine")) == []
    assert downs == [other] and owner_file.exists()


def test_a_host_that_has_everything_passes() -> None:
    assert hostcheck.problems(_readings()) == []


def test_proc_cgroups_lists_only_enabled_controllers() -> None:
    text = "#subsys_name\thierarchy\tnum_cgroups\tenabled\ncpu\t1\t5\t1\nrdma\t0\t1\t0\nmemory\t4\t9\t1\n"
    assert hostcheck.parse_cgroup_controllers(text) == {"cpu", "memory"}
    assert hostcheck.parse_filesystems("nodev\tsysfs\n\text4\nnodev\toverlay\n") == {"sysfs", "ext4", "overlay"}


@given(st.text())
def test_host_readings_parsers_never_fail_on_any_text(text: str) -> None:
    assert isinstance(hostcheck.parse_cgroup_controllers(text), frozenset)
    assert isinstance(hostcheck.parse_filesystems(text), frozenset)
    assert isinstance(hostcheck.strip_counters(text.replace(":", "")), list)


_VALUES = st.text(alphabet="0123456789 \t", min_size=1, max_size=8)


@given(st.dictionaries(st.sampled_from(hostcheck.SYSCTLS), _VALUES),
       st.dictionaries(st.sampled_from(hostcheck.SYSCTLS), _VALUES))
def test_sysctl_restores_write_back_exactly_what_changed(before: dict[str, str], now: dict[str, str]) -> None:
    restores = hostcheck.sysctl_restores(before, now)
    for name, value in restores.items():
        assert value == before[name] and " ".join(now[name].split()) != " ".join(value.split())
    # After writing them back, nothing is left to restore.
    assert hostcheck.sysctl_restores(before, {**now, **restores}) == {}


def test_rules_added_ignores_counters_and_names_new_chains_and_rules() -> None:
    before = "# Generated\n*filter\n:INPUT ACCEPT [10:200]\n-A INPUT -i lo -j ACCEPT\nCOMMIT\n"
    after = ("*filter\n:INPUT ACCEPT [99:9999]\n:KUBE-FIREWALL - [0:0]\n-A INPUT -i lo -j ACCEPT\n"
             "-A INPUT -j KUBE-FIREWALL\nCOMMIT\n")
    assert hostcheck.rules_added(before, after) == [":KUBE-FIREWALL -", "-A INPUT -j KUBE-FIREWALL"]
    assert hostcheck.rules_added(after, after) == []
    # A table that did not exist before is emptied by the restore.
    assert hostcheck.restore_input("", after) == "*filter\nCOMMIT\n"
    assert hostcheck.restore_input(before, after) == before


# --------------------------------------------------------------------------- host hygiene on this host


def _root_with_iptables() -> None:
    if os.geteuid() != 0 or not shutil.which("iptables-save"):
        pytest.skip("the hygiene restore changes this host: needs root and iptables")


def test_restore_puts_sysctls_and_iptables_back_as_the_snapshot_found_them(tmp_path: Path) -> None:
    """What the kubelet and the bridge CNI do to a host (a sysctl, a chain and a rule), undone by ``restore``."""
    _root_with_iptables()
    from tools.localcluster import nodehost

    lay = Layout(tmp_path)
    panic = Path(hostcheck.sysctl_path("kernel.panic"))
    try:
        panic.write_text(panic.read_text())
    except OSError as err:
        pytest.skip(f"sysctls are read-only here: {err}")
    # Read under the lock: a real-node cluster going down meanwhile restores the host's own sysctls.
    with nodehost.host_lock():
        before_sysctls = nodehost.read_sysctls()
        before_rules = hostcheck.strip_counters(nodehost.iptables_dump("iptables"))
        _snapshot_change_restore(lay, panic, before_sysctls, before_rules, tmp_path)


def _snapshot_change_restore(lay: Layout, panic: Path, before_sysctls: dict[str, str], before_rules: list[str],
                             tmp_path: Path) -> None:
    from tools.localcluster import nodehost

    nodehost.snapshot(lay)
    try:
        panic.write_text(str(int(before_sysctls["kernel.panic"]) + 7))
        subprocess.run(["iptables", "-N", "GPUCLUSTER-HYGIENE-TEST"], check=True)
        subprocess.run(["iptables", "-A", "INPUT", "-s", "192.0.2.123/32", "-j", "GPUCLUSTER-HYGIENE-TEST"],
                       check=True)
        assert nodehost.read_sysctls() != before_sysctls
        changed = nodehost.restore(lay)
    finally:
        if (tmp_path / "host-before.json").exists():
            nodehost.restore(lay)
    assert "kernel.panic=" + before_sysctls["kernel.panic"] in changed and "iptables rules" in changed
    assert nodehost.read_sysctls() == before_sysctls
    assert hostcheck.strip_counters(nodehost.iptables_dump("iptables")) == before_rules
    assert not (tmp_path / "host-before.json").exists()


@pytest.mark.parametrize("command", ["fake-gpu-plugin", "apiproxy"])
def test_our_go_commands_own_tests_pass(command: str) -> None:
    """The device plugin's own tests (device names, health, allocation) and the API server proxy's (each fault,
    a watch streaming through), once the module is in the Go cache."""
    if not (STATE / "bin" / command).exists() or not shutil.which("go"):
        pytest.skip("the local cluster's Go build has not run here (make localcluster)")
    proc = subprocess.run(["go", "-C", str(ROOT / "tools" / "localcluster"), "test", f"./cmd/{command}/"],
                          capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_render_with_real_nodes_writes_the_stack_as_make_up_real_nodes_deploys_it(tmp_path: Path) -> None:
    from tools import render

    assert render.main(["--stack", "local", "--real-nodes", "--out", str(tmp_path)]) == 0
    manifests = tmp_path / "manifests"
    dns = (manifests / "networkpolicy-gpu-system-allow-dns.yaml").read_text()
    assert f"{APISERVER_IP}/32" in dns  # the host's CoreDNS is admitted
    pools = [p for p in manifests.glob("*.yaml") if REAL_GPU_POOL in p.read_text()]
    assert pools, "the real GPU pool is not in the rendered stack"


def test_a_killed_sessions_private_state_is_swept_and_a_live_one_kept(tmp_path: Path) -> None:
    from tools.localcluster.realcluster import sweep_stale

    exited = subprocess.run(["sh", "-c", "echo $$"], capture_output=True, text=True, check=True)
    dead = int(exited.stdout)
    killed, mine, odd = tmp_path / f"gpucl-e2e-{dead}", tmp_path / f"gpucl-e2e-{os.getpid()}", tmp_path / "gpucl-e2e-x"
    running = tmp_path / f"gpucl-pods-{dead}"
    for folder in (killed, mine, odd, running / "run"):
        (folder / "etcd").mkdir(parents=True)
    # A process the folder recorded still runs (its starter died, the cluster did not): kept.
    me = processes.Proc("etcd", pid=os.getpid(), argv=["etcd"], log="e.log",
                        start_ticks=processes.start_ticks(os.getpid()))
    (running / "run" / "etcd.json").write_text(json.dumps(dataclasses.asdict(me)))
    assert sweep_stale(tmp_path, "gpucl-e2e") == [killed]
    assert sweep_stale(tmp_path, "gpucl-pods") == []
    assert not killed.exists() and mine.exists() and odd.exists() and running.exists()
