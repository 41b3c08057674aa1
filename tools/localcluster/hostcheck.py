"""What a host needs for real nodes, and what they change on it (pure, tested by tables).

:func:`problems` turns readings of the host into one line per failed check, naming what is missing and what
it is needed for. :data:`SYSCTLS` are the kernel settings the kubelet, kube-proxy and the bridge CNI change;
:func:`sysctl_restores` says which to write back so the host ends as it began.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

#: Settings the real nodes change (the kubelet: panic, panic_on_oops, overcommit; the bridge CNI: forwarding;
#: kube-proxy: conntrack and localnet routing). Snapshotted before the first start, written back by ``down``.
SYSCTLS = (
    "kernel.panic",
    "kernel.panic_on_oops",
    "vm.overcommit_memory",
    "net.ipv4.ip_forward",
    "net.ipv4.conf.all.route_localnet",
    "net.bridge.bridge-nf-call-iptables",
    "net.bridge.bridge-nf-call-ip6tables",
    "net.netfilter.nf_conntrack_max",
    "net.netfilter.nf_conntrack_tcp_timeout_established",
    "net.netfilter.nf_conntrack_tcp_timeout_close_wait",
)

#: Commands a real node runs, and what for.
COMMANDS = {
    "containerd": "the container runtime (Debian package containerd)",
    "ctr": "image import into containerd (Debian package containerd)",
    "runc": "the OCI runtime (Debian package runc)",
    "iptables": "the kubelet's and kube-proxy's rules (Debian package iptables)",
    "iptables-save": "the host-hygiene snapshot (Debian package iptables)",
    "iptables-restore": "the host-hygiene restore (Debian package iptables)",
    "ip": "addresses on lo and network namespaces (Debian package iproute2)",
}
#: CNI plugins the node's network uses (Debian package containernetworking-plugins).
CNI_PLUGINS = ("bridge", "host-local", "portmap", "loopback")
#: cgroup v1 controllers the kubelet's cgroupfs driver needs (cgroup v2 needs them enabled in the root).
CGROUP_CONTROLLERS = ("cpu", "cpuacct", "cpuset", "memory", "pids", "devices", "freezer")


@dataclass(frozen=True)
class HostReadings:
    """What :func:`problems` judges; :func:`tools.localcluster.nodehost.read_host` fills it on a real host."""

    euid: int
    filesystems: frozenset[str]
    cgroup_controllers: frozenset[str]
    cgroup_v2: bool
    commands: Mapping[str, bool]
    cni_plugins: Mapping[str, bool]
    binaries: Mapping[str, bool]
    #: Real nodes of another state folder run here (they own the addresses, ports and bridges).
    other_real_nodes: bool = False
    #: That state folder, where the host's owner record names one.
    other_owner: str = ""


def stale_owner(owner: str | None, own: str, owner_alive: bool) -> bool:
    """Whether the real nodes holding the host were left behind: another state folder's, none of whose processes
    runs (the session that started them was killed before its ``down``). Their leftovers (addresses, bridges,
    network namespaces, mounts, iptables rules) would refuse every later cluster, so the next ``up`` reclaims them
    with that folder's own ``down``; a live owner is never touched."""
    return bool(owner) and owner != own and not owner_alive


def problems(r: HostReadings) -> list[str]:
    """One line per failed check: ``<check>: <what is wrong>; needs <what>``. Empty when the host can run them."""
    out: list[str] = []
    if r.other_real_nodes:
        down = f"`localcluster --state {r.other_owner} down`" if r.other_owner else "its `localcluster down`"
        out.append(f"real nodes: another local cluster's real nodes run on this host; needs {down} "
                   "first (one set per host: they own fixed addresses, ports and bridges)")
    if r.euid != 0:
        out.append(f"root: running as uid {r.euid}; needs root (the kubelet mounts volumes and creates cgroups)")
    if "overlay" not in r.filesystems:
        out.append("overlayfs: not in /proc/filesystems; needs the overlay filesystem (containerd's snapshotter)")
    missing_cg = [c for c in CGROUP_CONTROLLERS if c not in r.cgroup_controllers]
    if missing_cg:
        kind = "cgroup v2 root's cgroup.controllers" if r.cgroup_v2 else "mounted cgroup v1 hierarchies"
        out.append(f"cgroups: {', '.join(missing_cg)} missing from the {kind}; needs every one of "
                   f"{', '.join(CGROUP_CONTROLLERS)} (the kubelet's QoS cgroups and pod limits)")
    for cmd, why in COMMANDS.items():
        if not r.commands.get(cmd):
            out.append(f"{cmd}: not on PATH; needs {why}")
    missing_cni = [p for p in CNI_PLUGINS if not r.cni_plugins.get(p)]
    if missing_cni:
        out.append(f"CNI plugins: {', '.join(missing_cni)} missing from /usr/lib/cni; needs the Debian package "
                   "containernetworking-plugins")
    missing_bin = sorted(b for b, ok in r.binaries.items() if not ok)
    if missing_bin:
        out.append(f"binaries: {', '.join(missing_bin)} not built in .state/localcluster/bin; needs "
                   "`make localcluster`")
    return out


def parse_cgroup_controllers(proc_cgroups: str) -> frozenset[str]:
    """The enabled controllers of ``/proc/cgroups`` (``#subsys_name hierarchy num_cgroups enabled``)."""
    out: set[str] = set()
    for line in proc_cgroups.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        fields = line.split()
        if len(fields) >= 4 and fields[3] == "1":
            out.add(fields[0])
    return frozenset(out)


def parse_filesystems(text: str) -> frozenset[str]:
    """Filesystem names of ``/proc/filesystems`` (``nodev\\toverlay`` or ``\\text4``)."""
    return frozenset(line.split()[-1] for line in text.splitlines() if line.split())


def sysctl_restores(before: Mapping[str, str], now: Mapping[str, str]) -> dict[str, str]:
    """The settings to write back: those snapshotted before whose value differs now (whitespace-normalised).

    A setting the host lacks now (or lacked before) is skipped: there is nothing to restore it to or into.
    """
    def norm(v: str) -> str:
        return " ".join(v.split())

    return {k: v for k, v in before.items() if k in now and norm(now[k]) != norm(v)}


def sysctl_path(name: str) -> str:
    return "/proc/sys/" + name.replace(".", "/")


def strip_counters(iptables_save: str) -> list[str]:
    """An ``iptables-save`` dump as comparable lines: no comments, no packet counters, no COMMIT noise order."""
    out: list[str] = []
    for line in iptables_save.splitlines():
        if not line or line.startswith("#"):
            continue
        if line.startswith(":"):
            name, policy = line[1:].split()[:2]
            out.append(f":{name} {policy}")
        else:
            out.append(line)
    return out


def rules_added(before: str, after: str) -> list[str]:
    """The rule and chain lines of ``after`` not in ``before`` (both ``iptables-save`` dumps)."""
    seen = set(strip_counters(before))
    return [line for line in strip_counters(after) if line not in seen and line != "COMMIT"
            and not line.startswith("*")]


def tables(iptables_save: str) -> list[str]:
    """The tables an ``iptables-save`` dump holds (its ``*<table>`` lines)."""
    return [line[1:].strip() for line in iptables_save.splitlines() if line.startswith("*")]


def restore_input(before: str, now: str) -> str:
    """What ``iptables-restore`` needs to bring ``now`` back to ``before``: the old dump, plus an empty table for
    each table that exists only now (restoring a table flushes it and drops its chains)."""
    extra = [t for t in tables(now) if t not in tables(before)]
    return before + "".join(f"*{t}\nCOMMIT\n" for t in extra)
