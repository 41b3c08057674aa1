"""Real nodes on this host: start and stop containerd, kubelets, the fake GPU plugin and kube-proxy (the I/O).

``up`` checks the host (one line per failed check), snapshots what the nodes will change (sysctls and the
iptables rules, in ``host-before.json``, once), adds the addresses on ``lo``, writes each node's configuration
and credentials, starts its containerd, imports the images in ``.state/images/oci``, starts its kubelet and,
on a GPU node, the device plugin; then one kube-proxy. ``down`` stops them, kills what is left in the nodes'
cgroups and the shims of their containerd, unmounts what they mounted, removes the pod network namespaces,
bridges, CNI state, cgroups and addresses, and writes the snapshot back.

Every process is recorded like the control plane's (tools/localcluster/control.py), so ``localcluster down``
stops them too.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import yaml

from tools import image_local
from tools.localcluster import hostcheck, pki, processes
from tools.localcluster.plan import Layout
from tools.localcluster.realnodes import (
    APISERVER_IP,
    COREDNS_RULES,
    COREDNS_USER,
    IMAGES_BY_KIND,
    RealNode,
    addresses,
    cni_conflist,
    containerd_command,
    containerd_config,
    coredns_command,
    corefile,
    device_plugin_command,
    from_record,
    kube_proxy_config,
    kube_router_command,
    kubelet_command,
    kubelet_config,
    node_paths,
    node_ready_condition,
    policy_node,
    to_record,
)

NODE_BINARIES = ("kubelet", "kube-proxy", "fake-gpu-plugin", "pause", "apiproxy")
CGROUP_ROOT = Path("/sys/fs/cgroup")
NETNS_DIR = Path("/run/netns")
CNI_CACHE = Path("/var/lib/cni/results")
POD_LOG_LINKS = Path("/var/log/containers")
IPTABLES = ("iptables", "ip6tables")
#: The kubelet's pod-resources directory at its default root, which the stack's dcgm-exporter DaemonSet mounts
#: (components.observability POD_RESOURCES_DIR): each real kubelet has its own under its root dir, and one hostPath
#: cannot name both, so ``up`` makes this one (empty) for the pods that mount it; the stand-in exporter reads nothing
#: there.
POD_RESOURCES = Path("/var/lib/kubelet/pod-resources")
#: Host paths the kubelet, containerd's shims and CNI create whatever their configuration says (the device manager's
#: socket dir, shim sockets, the CNI result cache, pod log links, network namespaces), and the one ``up`` makes:
#: removed by ``down`` when they did not exist before ``up``.
HOST_PATHS = (Path("/var/lib/kubelet"), POD_RESOURCES, Path("/run/containerd"), Path("/var/lib/cni"), POD_LOG_LINKS,
              NETNS_DIR)
IPTABLES_TABLES = ("filter", "nat", "mangle", "raw")
#: The kubelet's device manager keeps its checkpoint beside its socket, a fixed host path whatever ``--root-dir``
#: says: every kubelet of the host reads it at start and takes its resources as its own (capacity, zero healthy), so
#: the system node would list the GPU nodes' ``nvidia.com/gpu`` (at 0). Dropped before the nodes start and after
#: they stop, so one set's devices never reach the next.
DEVICE_MANAGER_CHECKPOINT = Path("/var/lib/kubelet/device-plugins/kubelet_internal_checkpoint")


#: Where ``make images`` leaves OCI archives for the nodes to import.
IMAGES_DIR = image_local.STATE / "oci"


def _snapshot_file(lay: Layout) -> Path:
    return lay.state / "host-before.json"


# --------------------------------------------------------------------------- host checks


def read_host(lay: Layout) -> hostcheck.HostReadings:
    v2 = (CGROUP_ROOT / "cgroup.controllers").exists()
    if v2:
        controllers = frozenset((CGROUP_ROOT / "cgroup.controllers").read_text().split()) | {"cpuacct", "freezer",
                                                                                             "devices"}
    else:
        mounted = {p.name for p in CGROUP_ROOT.iterdir()} if CGROUP_ROOT.exists() else set()
        enabled = hostcheck.parse_cgroup_controllers(Path("/proc/cgroups").read_text())
        controllers = frozenset(c for c in enabled if c in mounted)
    return hostcheck.HostReadings(
        euid=os.geteuid(),
        filesystems=hostcheck.parse_filesystems(Path("/proc/filesystems").read_text()),
        cgroup_controllers=controllers,
        cgroup_v2=v2,
        commands={c: shutil.which(c) is not None for c in hostcheck.COMMANDS},
        cni_plugins={p: os.access(f"/usr/lib/cni/{p}", os.X_OK) for p in hostcheck.CNI_PLUGINS},
        binaries={b: os.access(lay.bin / b, os.X_OK) for b in NODE_BINARIES},
        other_real_nodes=f" {APISERVER_IP}/32 " in _ip("-o", "addr", "show", "dev", "lo").stdout
        and not _nodes_file(lay).exists(),
        other_owner=str(host_owner() or ""),
    )


def check_host(lay: Layout) -> None:
    found = hostcheck.problems(read_host(lay))
    if found:
        raise processes.ClusterError("real nodes cannot run on this host: " + "; ".join(found))


# --------------------------------------------------------------------------- host hygiene


def read_sysctls() -> dict[str, str]:
    out: dict[str, str] = {}
    for name in hostcheck.SYSCTLS:
        with contextlib.suppress(OSError):
            out[name] = Path(hostcheck.sysctl_path(name)).read_text().strip()
    return out


def iptables_dump(cmd: str) -> str:
    proc = subprocess.run([f"{cmd}-save"], capture_output=True, text=True, check=False)
    return proc.stdout if proc.returncode == 0 else ""


def snapshot(lay: Layout) -> dict[str, Any]:
    """The host as the nodes found it; written once, so a crashed run's ``down`` still restores the original."""
    path = _snapshot_file(lay)
    if path.exists():
        data: dict[str, Any] = json.loads(path.read_text())
        return data
    data = {"sysctls": read_sysctls(), "iptables": {cmd: iptables_dump(cmd) for cmd in IPTABLES},
            "netns": sorted(p.name for p in NETNS_DIR.iterdir()) if NETNS_DIR.exists() else [],
            "absent": [str(p) for p in HOST_PATHS if not p.exists()], "ipsets": ipsets()}
    lay.state.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2))
    return data


def restore(lay: Layout) -> list[str]:
    """Write the snapshot back: sysctls that differ, and each iptables table as it was. Returns what changed."""
    path = _snapshot_file(lay)
    if not path.exists():
        return []
    data = json.loads(path.read_text())
    changed: list[str] = []
    for name, value in hostcheck.sysctl_restores(data["sysctls"], read_sysctls()).items():
        try:
            Path(hostcheck.sysctl_path(name)).write_text(value + "\n")
            changed.append(f"{name}={value}")
        except OSError as err:
            changed.append(f"{name}: could not restore to {value} ({err})")
    for absent in data.get("absent", []):
        made = Path(absent)
        if made.exists() and not mounts_under([made]):
            shutil.rmtree(made, ignore_errors=True)
            changed.append(f"removed {made}")
    for cmd, dump in data["iptables"].items():
        now = iptables_dump(cmd)
        if hostcheck.rules_added(dump, now):
            proc = subprocess.run([f"{cmd}-restore"], input=hostcheck.restore_input(dump, now), capture_output=True,
                                  text=True, check=False)
            failed = "" if proc.returncode == 0 else f": restore failed: {proc.stderr.strip()}"
            changed.append(f"{cmd} rules{failed}")
    # After the rules: a set an iptables rule still names cannot be destroyed.
    for name in sorted(set(ipsets()) - set(data.get("ipsets", []))):
        subprocess.run(["ipset", "destroy", name], capture_output=True, check=False)
        changed.append(f"ipset {name} destroyed")
    path.unlink()
    return changed


def ipsets() -> list[str]:
    """The host's ipset names (kube-router keeps a set per policy and namespace)."""
    if not shutil.which("ipset"):
        return []
    proc = subprocess.run(["ipset", "list", "-n"], capture_output=True, text=True, check=False)
    return sorted(proc.stdout.split()) if proc.returncode == 0 else []


def _ip(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=False)


def add_addresses(nodes: Sequence[RealNode]) -> None:
    have = _ip("-o", "addr", "show", "dev", "lo").stdout
    for addr in addresses(nodes):
        if f" {addr}/32 " not in have:
            proc = _ip("addr", "add", f"{addr}/32", "dev", "lo")
            if proc.returncode != 0:
                raise processes.ClusterError(f"ip addr add {addr}/32 dev lo: {proc.stderr.strip()}")


def remove_addresses(nodes: Sequence[RealNode]) -> None:
    for addr in addresses(nodes):
        _ip("addr", "del", f"{addr}/32", "dev", "lo")


# --------------------------------------------------------------------------- cgroups


def _hierarchies() -> list[Path]:
    if (CGROUP_ROOT / "cgroup.controllers").exists():
        return [CGROUP_ROOT]
    return [p for p in CGROUP_ROOT.iterdir() if p.is_dir() and not p.is_symlink()] if CGROUP_ROOT.exists() else []


def make_cgroup_root(node: RealNode) -> None:
    """The node's cgroup root in every hierarchy (the kubelet refuses a root that does not exist); cpuset
    children need cpus and mems before a task can join."""
    for h in _hierarchies():
        path = h / node.cgroup_root.lstrip("/")
        path.mkdir(parents=True, exist_ok=True)
        if h.name == "cpuset":
            for part in (path.parent, path):
                for f in ("cpuset.cpus", "cpuset.mems"):
                    if not (part / f).read_text().strip():
                        (part / f).write_text((part.parent / f).read_text())


def cgroup_pids(node: RealNode) -> set[int]:
    pids: set[int] = set()
    for h in _hierarchies():
        root = h / node.cgroup_root.lstrip("/")
        if not root.exists():
            continue
        for procs in root.rglob("cgroup.procs"):
            with contextlib.suppress(OSError, ValueError):
                pids |= {int(p) for p in procs.read_text().split()}
    return pids


def remove_cgroups(node: RealNode) -> None:
    for h in _hierarchies():
        top = h / "gpucluster"
        root = top / node.name
        if root.exists():
            for d in sorted((p for p in root.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True):
                with contextlib.suppress(OSError):
                    d.rmdir()
            with contextlib.suppress(OSError):
                root.rmdir()
        with contextlib.suppress(OSError):
            top.rmdir()


# --------------------------------------------------------------------------- processes and mounts


def shim_pids(socket: Path) -> set[int]:
    """containerd shims serving our containerd (they daemonize, so they are nobody's children)."""
    out: set[int] = set()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            argv = proc.joinpath("cmdline").read_bytes().split(b"\0")
            if argv and argv[0].endswith(b"containerd-shim-runc-v2") and str(socket).encode() in argv:
                out.add(int(proc.name))
    return out


def _kill(pids: set[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


def mounts_under(prefixes: Sequence[Path]) -> list[str]:
    """Mount points under any of ``prefixes``, deepest first (from /proc/self/mountinfo)."""
    found: list[str] = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4].encode().decode("unicode_escape")
        if any(point == str(p) or point.startswith(str(p) + "/") for p in prefixes):
            found.append(point)
    return sorted(set(found), key=lambda p: p.count("/"), reverse=True)


def unmount(points: Sequence[str]) -> None:
    for point in points:
        subprocess.run(["umount", "-l", point], capture_output=True, check=False)


# --------------------------------------------------------------------------- up / down


def _write(path: Path, text: str, mode: int = 0o644) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(mode)


def _ctr(socket: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ctr", "--address", str(socket), "-n", "k8s.io", *args], capture_output=True,
                          text=True, timeout=timeout, check=False)


def import_images(socket: Path, directory: Path, names: Sequence[str]) -> list[str]:
    """``ctr image import`` of the archives ``make images`` left in ``directory`` for ``names`` (those built)."""
    imported: list[str] = []
    for tar in (directory / f"{n}.tar" for n in names):
        if not tar.exists():
            continue
        proc = _ctr(socket, "image", "import", "--all-platforms", str(tar))
        if proc.returncode != 0:
            raise processes.ClusterError(f"ctr image import {tar}: {proc.stderr.strip() or proc.stdout.strip()}")
        imported.append(tar.stem)
    return imported


def _api_server_url(lay: Layout) -> str:
    ports = processes.load_ports(lay)
    if ports is None:
        raise processes.ClusterError("the control plane is not up (no run/ports.yaml); run `localcluster up`")
    return f"https://{APISERVER_IP}:{ports['apiserver']}"


def start_node(lay: Layout, node: RealNode) -> None:
    paths = node_paths(lay.state, node)
    for d in (paths.containerd_root, paths.containerd_state, paths.cni_conf_dir, paths.cni_data_dir,
              paths.kubelet_root, paths.plugins_registry, paths.base / "pki", paths.pod_logs):
        d.mkdir(parents=True, exist_ok=True)
    _write(paths.containerd_config, containerd_config(node, paths))
    _write(paths.cni_conf_dir / "10-gpucluster.conflist", json.dumps(cni_conflist(node, paths), indent=2))
    cert, key, serving, serving_key = pki.node_certificates(lay.pki, node.name, node.ip)
    config = kubelet_config(node, paths, lay.pki / "ca.crt", serving, serving_key)
    _write(paths.kubelet_config, yaml.safe_dump(config, sort_keys=False))
    _write(paths.kubeconfig, pki.user_kubeconfig_text(_api_server_url(lay), lay.pki, f"system:node:{node.name}",
                                                      cert, key), 0o600)
    make_cgroup_root(node)

    containerd = processes.start_process(lay, f"containerd-{node.name}", containerd_command(paths))
    processes.wait_for(f"containerd of {node.name}", lambda: _ctr(paths.containerd_socket, "version",
                                                                 timeout=5).returncode == 0, 60, containerd)
    started = time.monotonic()
    imported = import_images(paths.containerd_socket, IMAGES_DIR, IMAGES_BY_KIND[node.kind])
    processes.say(f"{node.name}: imported {len(imported)} images in {time.monotonic() - started:.1f}s")
    processes.start_process(lay, f"kubelet-{node.name}", kubelet_command(lay.bin, node, paths))
    if node.gpus:
        processes.start_process(lay, f"fake-gpu-plugin-{node.name}", device_plugin_command(lay.bin, node, paths))


def start_kube_proxy(lay: Layout, node: str) -> None:
    cert, key = pki.user_certificate(lay.pki, "system:kube-proxy", [])
    kubeconfig = lay.state / "nodes" / "kube-proxy.kubeconfig"
    _write(kubeconfig, pki.user_kubeconfig_text(_api_server_url(lay), lay.pki, "system:kube-proxy", cert, key),
           0o600)
    config = lay.state / "nodes" / "kube-proxy.yaml"
    _write(config, yaml.safe_dump(kube_proxy_config(kubeconfig), sort_keys=False))
    processes.start_process(lay, "kube-proxy", [str(lay.bin / "kube-proxy"), f"--config={config}",
                                              f"--hostname-override={node}", "--v=1"])


def start_kube_router(lay: Layout, node: str) -> bool:
    """The NetworkPolicy engine for the system node's pods, when built (False: policies are not enforced)."""
    if not os.access(lay.bin / "kube-router", os.X_OK):
        processes.say("warning: kube-router not built; NetworkPolicies are not enforced")
        return False
    processes.start_process(lay, "kube-router", kube_router_command(lay.bin, lay.kubeconfig, node))
    return True


def start_coredns(lay: Layout) -> bool:
    """Cluster DNS for the real nodes' pods, when built (False: names do not resolve in pods). It reads Services
    as a user of its own, allowed exactly :data:`COREDNS_RULES`."""
    if not os.access(lay.bin / "coredns", os.X_OK):
        processes.say("warning: coredns not built; cluster names do not resolve in the real nodes' pods")
        return False
    from kubernetes import client

    rbac = client.RbacAuthorizationV1Api(processes.api_client(lay))
    name = "gpucluster-local:coredns"
    role: Any = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": name},
                 "rules": [dict(r) for r in COREDNS_RULES]}
    binding: Any = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                    "metadata": {"name": name},
                    "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
                    "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": COREDNS_USER}]}
    for create, body in ((rbac.create_cluster_role, role), (rbac.create_cluster_role_binding, binding)):
        try:
            create(body)
        except client.ApiException as err:
            if err.status != 409:
                raise
    cert, key = pki.user_certificate(lay.pki, COREDNS_USER, [])
    kubeconfig = lay.state / "nodes" / "coredns.kubeconfig"
    _write(kubeconfig, pki.user_kubeconfig_text(_api_server_url(lay), lay.pki, COREDNS_USER, cert, key), 0o600)
    config = lay.state / "nodes" / "Corefile"
    _write(config, corefile(kubeconfig), 0o644)
    processes.start_process(lay, "coredns", coredns_command(lay.bin, config))
    return True


def node_ready(lay: Layout, node: RealNode) -> bool:
    from kubernetes import client

    api: Any = client.CoreV1Api(processes.api_client(lay))
    obj = api.read_node(node.name)
    if not node_ready_condition(api.api_client.sanitize_for_serialization(obj.status)):
        return False
    return not node.gpus or str((obj.status.allocatable or {}).get("nvidia.com/gpu")) == str(node.gpus)


#: One set of real nodes per host: they own fixed addresses, ports, bridges and the host's iptables.
HOST_LOCK = Path("/run/gpucluster-realnodes.lock")


@contextlib.contextmanager
def host_lock() -> Iterator[None]:
    """Held while real nodes run (or anything snapshots and restores the host): a second holder waits."""
    import fcntl

    with HOST_LOCK.open("w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


#: The state folder whose real nodes hold the host: written by ``up``, removed by ``down``; in /run, so a reboot,
#: which clears what the nodes left, clears it too.
HOST_OWNER = Path("/run/gpucluster-realnodes.owner")


def host_owner() -> Path | None:
    return Path(HOST_OWNER.read_text().strip()) if HOST_OWNER.exists() else None


def reclaim_stale_owner(lay: Layout) -> list[str]:
    """``down`` of the real nodes a killed session left on the host (:func:`hostcheck.stale_owner`); what it did."""
    owner = host_owner()
    if owner is None:
        return []
    other = Layout(owner)
    alive = any(p.alive() for p in processes.recorded(other))
    if not hostcheck.stale_owner(str(owner), str(lay.state), alive):
        return []
    restored = down_recorded(other) if owner.exists() else []
    HOST_OWNER.unlink(missing_ok=True)
    return [f"reclaimed the host from {owner}, whose processes are gone", *restored]


def _nodes_file(lay: Layout) -> Path:
    return lay.state / "real-nodes.json"  # not in run/: that holds one record per process


def up(lay: Layout, nodes: Sequence[RealNode], timeout: float = 180.0) -> None:
    reclaimed = reclaim_stale_owner(lay)
    if reclaimed:
        processes.say("; ".join(reclaimed))
    check_host(lay)
    HOST_OWNER.write_text(str(lay.state))
    snapshot(lay)
    DEVICE_MANAGER_CHECKPOINT.unlink(missing_ok=True)
    lay.run.mkdir(parents=True, exist_ok=True)
    _nodes_file(lay).write_text(json.dumps(to_record(nodes)))
    POD_RESOURCES.mkdir(parents=True, exist_ok=True)
    add_addresses(nodes)
    started = time.monotonic()
    for node in nodes:
        start_node(lay, node)
    start_kube_proxy(lay, policy_node(nodes))
    start_kube_router(lay, policy_node(nodes))
    start_coredns(lay)
    for node in nodes:
        kubelet = processes.load_proc(lay, f"kubelet-{node.name}")
        what = f"real node {node.name} Ready" + (f" with {node.gpus} GPUs" if node.gpus else "")
        processes.wait_for(what, lambda n=node: node_ready(lay, n), timeout, kubelet)  # type: ignore[misc]
    processes.say(f"real nodes Ready in {time.monotonic() - started:.1f}s: {', '.join(n.name for n in nodes)}")


def down(lay: Layout, nodes: Sequence[RealNode]) -> list[str]:
    """Stop the real nodes and put the host back as it was; returns what was restored (for the log)."""
    names = ["kube-router", "kube-proxy"] + [f"{p}-{n.name}" for n in nodes for p in ("fake-gpu-plugin", "kubelet")]
    for name in names:
        proc = processes.load_proc(lay, name)
        if proc is not None:
            processes.stop_process(lay, proc)
    for node in nodes:
        paths = node_paths(lay.state, node)
        _kill(cgroup_pids(node) | shim_pids(paths.containerd_socket))
        proc = processes.load_proc(lay, f"containerd-{node.name}")
        if proc is not None:
            processes.stop_process(lay, proc)
    time.sleep(0.5)
    DEVICE_MANAGER_CHECKPOINT.unlink(missing_ok=True)
    bases = [node_paths(lay.state, n).base for n in nodes]
    unmount(mounts_under(bases))
    snap = _snapshot_file(lay)
    before = set(json.loads(snap.read_text()).get("netns", [])) if snap.exists() else set()
    if NETNS_DIR.exists():
        for ns in NETNS_DIR.iterdir():
            if ns.name.startswith("cni-") and ns.name not in before:
                unmount([str(ns)])
                with contextlib.suppress(OSError):
                    ns.unlink()
    for node in nodes:
        _ip("link", "del", node.bridge)
        remove_cgroups(node)
        if CNI_CACHE.exists():
            for entry in CNI_CACHE.glob(f"{node.network}-*"):
                entry.unlink(missing_ok=True)
    if POD_LOG_LINKS.exists():
        for link in POD_LOG_LINKS.iterdir():
            with contextlib.suppress(OSError):
                if link.is_symlink() and any(str(os.readlink(link)).startswith(str(b)) for b in bases):
                    link.unlink()
    remove_addresses(nodes)
    _nodes_file(lay).unlink(missing_ok=True)
    if host_owner() == lay.state:
        HOST_OWNER.unlink(missing_ok=True)
    return restore(lay)


def recorded_nodes(lay: Layout) -> tuple[RealNode, ...]:
    """The real nodes ``up`` started (none when it started none)."""
    path = _nodes_file(lay)
    return from_record(json.loads(path.read_text())) if path.exists() else ()


def down_recorded(lay: Layout) -> list[str]:
    """``down`` of the real nodes ``up`` recorded (none: nothing to do, the host is untouched)."""
    path = _nodes_file(lay)
    if not path.exists():
        return restore(lay)
    return down(lay, from_record(json.loads(path.read_text())))
