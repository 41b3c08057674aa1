"""``make up`` / ``make down``: the local stack deployed for real on the local control plane.

Steps of ``up``: the control plane (``localcluster up``), the engine (``make engine`` if not built),
``tools/pulumi up --yes --stack local`` against the local kubeconfig (each provider's virtual-kubelet
starts during it, with a token of the provider's ServiceAccount: tools/localcluster/virtual_kubelet.py),
then the in-cluster agents as local processes — the burst controller, the health guard and the
descheduler — fed with the configuration the stack deployed (its ConfigMaps), and a status summary. On
kwok nodes the agents' own pods are simulated and do nothing, so these local processes are the ones that act.
With ``--real-nodes`` the system node is a real kubelet and every agent, the virtual kubelets included, runs as
the stack's own pods instead; no local process stands in.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from tools.engine_runner import EngineError
from tools.engine_select import ENGINE_BUILD_ESTIMATE, EngineSelectionError, select_engine
from tools.localcluster import control, virtual_kubelet
from tools.localcluster.plan import Layout, NodePlan, descheduler_command, load_plan, load_stack_config

ROOT = control.ROOT
PULUMI = ROOT / "tools" / "pulumi"
ENGINE_BIN = ROOT / ".state" / "engine" / "bin" / "pulumi"
VENV_BIN = ROOT / ".venv" / "bin"


def _run(argv: list[str], env: dict[str, str] | None = None, what: str = "") -> None:
    control.say(f"{what or ' '.join(argv)}")
    started = time.monotonic()
    proc = subprocess.run(argv, cwd=ROOT, env={**os.environ, **(env or {})}, check=False)
    if proc.returncode != 0:
        raise control.ClusterError(f"`{' '.join(argv)}` failed with exit code {proc.returncode}")
    control.say(f"  done in {time.monotonic() - started:.1f}s")


def ensure_engine() -> None:
    if ENGINE_BIN.exists():
        _run(["bash", "tools/engine/build.sh"], what="engine: checking the build (cached)")
        return
    _run(["bash", "tools/engine/build.sh"], what=f"engine: building from Go modules ({ENGINE_BUILD_ESTIMATE})")


def pulumi_up(lay: Layout, stack: str, backend_url: str | None = None,
              extra: Mapping[str, Any] | None = None, cli: Path | None = None, in_pods: bool = False) -> None:
    """``pulumi up --yes`` of ``stack`` against the local cluster, through the project's engine runner.

    The engine gets its own copy of the stack config (tools/engine_runner), so nothing is written back
    to the committed ``Pulumi.<stack>.yaml``; ``backend_url`` lets tests use a throw-away backend, and
    ``extra`` overrides config values in that copy only (full keys or dotted paths). ``cli`` is the
    user's own Pulumi CLI (their backend and login); None runs the project's build offline. With ``in_pods`` (a
    real system node) the providers' virtual kubelets are the stack's own pods, so none starts here, and the stack
    declares the real GPU nodes' pool (``realnodes.stack_overrides``, which the cluster's plan applied too).
    """
    from tools import engine_runner

    changed = dict(extra or {})
    if in_pods:
        changed = {**real_node_config(stack), **changed}
    config = engine_runner.config_for(stack, changed, backend_url, cli)
    env = {"KUBECONFIG": str(lay.kubeconfig), "NO_COLOR": "1"}
    if backend_url:
        env["PULUMI_BACKEND_URL"] = backend_url
    config_args = ["--config-file", str(config)] if config is not None else []
    # --refresh: the local cluster is recreated by every down/up, so the stack's record may be stale.
    # The providers' virtual kubelets start as soon as their grants exist, so that each registers its node
    # before the stack's NodePatch labels it.
    with contextlib.nullcontext() if in_pods else virtual_kubelet.running_during(lay, stack):
        _run([str(cli or PULUMI), "up", "--yes", "--skip-preview", "--refresh", "--stack", stack, *config_args,
              "--non-interactive"], env=env, what=f"pulumi up --yes --stack {stack} (against {lay.kubeconfig})")


def real_node_config(stack: str) -> dict[str, Any]:
    """The full config keys ``pulumi up`` of a cluster with real nodes overrides (``realnodes.stack_overrides``)."""
    from components.config.base import PROJECT
    from tools.localcluster.plan import stack_config_values
    from tools.localcluster.realnodes import stack_overrides

    return {f"{PROJECT}:{key}": value
            for key, value in stack_overrides(stack_config_values(ROOT / f"Pulumi.{stack}.yaml")).items()}


# --------------------------------------------------------------------------- agent configuration


def _configmaps(lay: Layout) -> list[Any]:
    from kubernetes import client

    api: Any = client.CoreV1Api(control.api_client(lay))
    items: list[Any] = api.list_config_map_for_all_namespaces().items
    return items


def deployed_descheduler_policy(lay: Layout) -> str | None:
    """The descheduler policy the stack deployed (a ConfigMap value of kind DeschedulerPolicy)."""
    for cm in _configmaps(lay):
        for value in (cm.data or {}).values():
            if "DeschedulerPolicy" in value and "descheduler/v1alpha2" in value:
                return str(value)
    return None


def deployed_burst_settings(lay: Layout) -> str | None:
    """The burst controller settings the stack deployed (the ConfigMap its Deployment mounts)."""
    for cm in _configmaps(lay):
        if "burst" in cm.metadata.name and cm.data:
            return str(next(iter(cm.data.values())))
    return None


def burst_settings_from_stack(stack: str) -> str:
    """Settings derived from the stack configuration when the stack deploys no ConfigMap for them."""
    cfg = load_stack_config(ROOT, stack)
    if cfg is None:
        raise control.ClusterError(f"Pulumi.{stack}.yaml not found; cannot derive burst controller settings")
    from components.burst_controller import BurstControllerArgs, settings_document

    return settings_document(BurstControllerArgs.from_config(cfg).settings)


def deployed_agent_settings(lay: Layout, app: str, parse: Callable[..., Any], document: Callable[[Any], str],
                            overrides: Mapping[str, Any] | None = None) -> str | None:
    """An agent's settings as the stack deployed them (its ``<app>-settings`` ConfigMap), with ``overrides``.

    The result is validated by the agent's own parser, so a bad override fails here, naming the key.
    """
    import json

    from components.system_agent import SETTINGS_KEY

    for cm in _configmaps(lay):
        if cm.metadata.name == f"{app}-settings" and SETTINGS_KEY in (cm.data or {}):
            raw = {**json.loads(cm.data[SETTINGS_KEY]), **(overrides or {})}
            return document(parse(raw, source=f"{cm.metadata.name} + overrides"))
    return None


def deployed_guard_settings(lay: Layout, overrides: Mapping[str, Any] | None = None) -> str | None:
    """The health guard's settings as the stack deployed them, with `overrides` (e.g. a local Prometheus)."""
    from agents.health_guard.contract import APP, parse_settings, settings_document

    return deployed_agent_settings(lay, APP, parse_settings, settings_document, overrides)


def deployed_pool_settings(lay: Layout) -> str | None:
    """The node-pool agent's settings as the stack deployed them."""
    from agents.node_pools.contract import APP, parse_settings, settings_document

    return deployed_agent_settings(lay, APP, parse_settings, settings_document)


def _console_script(name: str) -> str | None:
    path = VENV_BIN / name
    return str(path) if path.exists() else shutil.which(name)


#: With ``in_pods`` (a real system node) every agent runs as the stack's own pods (images from `make images`): the
#: burst controller, the health guard, the descheduler's CronJob and each provider's virtual-kubelet.
IN_POD = "runs as the stack's pods on the real system node"


def start_agents(lay: Layout, stack: str, guard_overrides: Mapping[str, Any] | None = None,
                 guard_metrics_port: int | None = None, in_pods: bool = False) -> list[str]:
    """Start the burst controller, health guard, node-pool agent and descheduler; what could not start and why.

    The guard reads its signals from the Prometheus its deployed settings name; `guard_overrides` points it
    elsewhere (the end-to-end test runs a Prometheus of its own) or shortens its holds, probation and limits;
    `guard_metrics_port` fixes its metrics port so that Prometheus can scrape it.

    Each agent acts as the ServiceAccount the stack deployed for it (a token in its own kubeconfig, see
    tools/localcluster/agent_identity.py), so what its RBAC does not allow fails here as in a cluster.
    """
    from tools.localcluster import agent_identity

    notes: list[str] = []
    ports = control.load_ports(lay) or {}
    extra = control.free_ports(["burst_metrics", "guard_metrics", "pools_metrics"])
    cfg = load_stack_config(ROOT, stack)
    if cfg is None:
        raise control.ClusterError(f"Pulumi.{stack}.yaml not found; cannot tell the agents' ServiceAccounts")
    system_namespace = cfg.system_namespace

    def identity(account: str) -> Path | None:
        kubeconfig = agent_identity.agent_kubeconfig(lay, system_namespace, account)
        if kubeconfig is None:
            notes.append(f"{account}: the stack deployed no ServiceAccount {system_namespace}/{account}; not started")
        return kubeconfig

    settings = deployed_burst_settings(lay) or burst_settings_from_stack(stack)
    burst_conf = lay.state / "burst-controller.yaml"
    burst_conf.write_text(settings)
    burst = _console_script("burst-controller")
    if in_pods:
        notes.append(f"burst-controller: {IN_POD}")
    elif not burst:
        notes.append("burst-controller: console script not installed (make venv)")
    elif kubeconfig := identity("burst-controller"):
        control.start_process(lay, "burst-controller", [
            burst, "--config", str(burst_conf), "--kubeconfig", str(kubeconfig),
            "--metrics-port", str(extra["burst_metrics"]), "--identity", "localcluster"])

    guard = _console_script("health-guard")
    guard_settings = None if in_pods else deployed_guard_settings(lay, guard_overrides)
    if in_pods:
        notes.append(f"health-guard: {IN_POD}")
    elif not (guard and guard_settings):
        notes.append("health-guard: console script not installed or no settings deployed; not started")
    elif kubeconfig := identity("health-guard"):
        guard_conf = lay.state / "health-guard.json"
        guard_conf.write_text(guard_settings)
        control.start_process(lay, "health-guard", [
            guard, "--config", str(guard_conf), "--kubeconfig", str(kubeconfig),
            "--metrics-port", str(guard_metrics_port or extra["guard_metrics"]), "--identity", "localcluster"])

    from agents.node_pools.contract import APP as POOLS_APP

    pools = _console_script(POOLS_APP)
    pools_settings = None if in_pods else deployed_pool_settings(lay)
    if in_pods:
        notes.append(f"{POOLS_APP}: {IN_POD}")
    elif not (pools and pools_settings):
        notes.append(f"{POOLS_APP}: console script not installed or no settings deployed; not started")
    elif kubeconfig := identity(POOLS_APP):
        pools_conf = lay.state / f"{POOLS_APP}.json"
        pools_conf.write_text(pools_settings)
        control.start_process(lay, POOLS_APP, [
            pools, "--config", str(pools_conf), "--kubeconfig", str(kubeconfig),
            "--metrics-port", str(extra["pools_metrics"]), "--identity", "localcluster"])

    policy = deployed_descheduler_policy(lay)
    if in_pods:
        notes.append(f"descheduler: {IN_POD}")
    elif not (policy and ports):
        notes.append("descheduler: the stack deployed no DeschedulerPolicy ConfigMap; not started")
    elif kubeconfig := identity("descheduler"):
        lay.descheduler_policy.write_text(policy)
        control.start_process(lay, "descheduler", descheduler_command(lay, ports, kubeconfig=kubeconfig))
    return notes


# --------------------------------------------------------------------------- summary


def summary(lay: Layout, plan: NodePlan) -> str:
    from kubernetes import client

    api: Any = client.CoreV1Api(control.api_client(lay))
    nodes = api.list_node().items
    pods = api.list_pod_for_all_namespaces().items
    lines = ["", "local cluster", f"  kubeconfig: {lay.kubeconfig}"]
    pool_key = f"{plan.label_prefix}/pool"
    loc_key = f"{plan.label_prefix}/location"
    per_pool: dict[str, list[Any]] = defaultdict(list)
    for node in nodes:
        labels = node.metadata.labels or {}
        per_pool[labels.get(pool_key) or labels.get(f"{plan.label_prefix}/provider") or "-"].append(node)
    used: dict[str, int] = defaultdict(int)
    for pod in pods:
        if pod.spec.node_name and pod.status.phase in ("Running", "Pending"):
            for c in pod.spec.containers:
                limits = (c.resources.limits or {}) if c.resources else {}
                used[pod.spec.node_name] += int(limits.get(plan.gpu_resource, 0))
    lines.append("  nodes and GPUs per pool:")
    for pool, members in sorted(per_pool.items()):
        total = sum(int((n.status.allocatable or {}).get(plan.gpu_resource, 0)) for n in members)
        busy = sum(used[n.metadata.name] for n in members)
        location = (members[0].metadata.labels or {}).get(loc_key, "-")
        lines.append(f"    {pool:16} {location:9} nodes={len(members):2} gpus={total:3} in use={busy}")
    lines.append("  taints:")
    for node in nodes:
        for t in node.spec.taints or []:
            lines.append(f"    {node.metadata.name:24} {t.key}={t.value or ''}:{t.effect}")
    location_of = {n.metadata.name: (n.metadata.labels or {}).get(loc_key, "-") for n in nodes}
    service_key = f"{plan.label_prefix}/service"
    per_service: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for pod in pods:
        labels = pod.metadata.labels or {}
        if service_key in labels or labels.get(f"{plan.label_prefix}/workload") == "inference":
            name = labels.get(service_key, pod.metadata.name)
            ready = any(c.type == "Ready" and c.status == "True" for c in (pod.status.conditions or []))
            where = location_of.get(pod.spec.node_name or "", "pending") if ready else "not-ready"
            per_service[name][where] += 1
    lines.append("  inference replicas (ready, by location):")
    if not per_service:
        lines.append("    none")
    for name, where in sorted(per_service.items()):
        lines.append(f"    {name:16} " + " ".join(f"{k}={v}" for k, v in sorted(where.items())))
    procs = [f"{p.name}({'up' if p.alive() else 'down'})" for p in control.recorded(lay)]
    lines.append("  processes: " + " ".join(procs))
    return "\n".join(lines)


def up(lay: Layout, stack: str, skip_pulumi: bool = False, real_nodes: bool = False) -> int:
    started = time.monotonic()
    # Chosen first: a bad ENGINE setting fails before the control plane starts.
    choice = None if skip_pulumi else select_engine()
    if choice is not None:
        control.say(choice.describe())
    plan = control.up(lay, stack=stack, real_nodes=real_nodes)
    failed: str | None = None
    if choice is not None:
        try:
            if choice.kind == "built":
                ensure_engine()
            pulumi_up(lay, stack, cli=choice.cli, in_pods=real_nodes)
        except (control.ClusterError, EngineError) as err:  # still start what can run and show where things stand
            failed = str(err)
    notes = start_agents(lay, stack, in_pods=real_nodes)
    if not failed:
        settle_handover(lay, plan)
    print(summary(lay, plan))
    print(f"  {choice.describe() if choice else 'engine: none (--skip-pulumi)'}")
    for note in notes:
        print(f"  note: {note}")
    if failed:
        print(f"  FAILED: {failed}")
    control.say(f"make up finished in {time.monotonic() - started:.1f}s")
    return 1 if failed else 0


def settle_handover(lay: Layout, plan: NodePlan, timeout: float = 120.0) -> None:
    """Wait (bounded) until no training pod waits at the handover gate, so the summary shows where things run.

    A stack that declares a gang starts it behind the gate while the burst controller was not yet running;
    the controller then brings up the standby, releases the gang, and inference moves to the virtual node.
    """
    from kubernetes import client

    api: Any = client.CoreV1Api(control.api_client(lay))
    gate = f"{plan.label_prefix}/handover"
    started = time.monotonic()
    gated: list[str] = []
    while time.monotonic() - started < timeout:
        gated = [p.metadata.name for p in api.list_pod_for_all_namespaces().items
                 if any(g.name == gate for g in (p.spec.scheduling_gates or []))]
        if not gated:
            if time.monotonic() - started > 1:
                control.say(f"handover settled in {time.monotonic() - started:.1f}s")
            return
        time.sleep(1)
    control.say(f"{len(gated)} training pods still wait at the handover gate after {timeout:.0f}s: {gated[:4]}")


def down(lay: Layout) -> int:
    control.down(lay)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="stackup", description=__doc__)
    parser.add_argument("cmd", choices=["up", "down", "summary"])
    parser.add_argument("--stack", default="local")
    parser.add_argument("--skip-pulumi", action="store_true", help="control plane and agents only")
    parser.add_argument("--state", type=Path, default=control.DEFAULT_STATE)
    parser.add_argument("--real-nodes", action="store_true",
                        help="the system node and a GPU node on real kubelets; the agents run in the stack's pods")
    args = parser.parse_args(argv)
    lay = Layout(args.state.resolve())
    try:
        if args.cmd == "up":
            return up(lay, args.stack, skip_pulumi=args.skip_pulumi, real_nodes=args.real_nodes)
        if args.cmd == "summary":
            print(summary(lay, load_plan(ROOT, args.stack)))
            return 0
        return down(lay)
    except control.ClusterError as err:
        print(f"localcluster: {err}", file=sys.stderr)
        return 1
    except EngineSelectionError as err:
        print(f"make up: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
