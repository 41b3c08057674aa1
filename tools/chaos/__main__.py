"""``python -m tools.chaos --duration 2h``: bring up the local cluster with real nodes, ``pulumi up`` the local stack
with every agent in its pods, soak it under faults, check its history, write the report, take it all down."""

from __future__ import annotations

import argparse
import re
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from tools.chaos.soak import say, write_report

ROOT = Path(__file__).resolve().parents[2]
REPORT = ROOT / ".state" / "chaos" / "report.json"


def keep_logs(core: Any, namespace: str, out: Path) -> list[Path]:
    """The agents' logs (each container of each pod in their namespace, and its previous instance's where it
    restarted), kept beside the report: the cluster and its state folder go with the run, and a fault the report
    shows the guard did not answer is judged from them. Best effort: a log that cannot be read is skipped."""
    from kubernetes.client import ApiException

    out.mkdir(parents=True, exist_ok=True)
    kept: list[Path] = []
    for pod in core.list_namespaced_pod(namespace).items:
        for container in pod.spec.containers:
            for previous in (False, True):
                try:
                    text = core.read_namespaced_pod_log(pod.metadata.name, namespace, container=container.name,
                                                        previous=previous)
                except ApiException:
                    continue
                path = out / f"{pod.metadata.name}.{container.name}{'.previous' if previous else ''}.log"
                path.write_text(text)
                kept.append(path)
    return kept
#: The researchers' CLI, installed in the project's venv.
GPUCLUSTER = ROOT / ".venv" / "bin" / "gpucluster"
_UNITS = {"s": 1, "m": 60, "h": 3600}


def seconds(text: str) -> float:
    """``90``, ``90s``, ``10m``, ``2h`` as seconds."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smh]?)\s*", text)
    if match is None or float(match[1]) <= 0:
        raise argparse.ArgumentTypeError(f"not a duration: {text!r} (use e.g. 150s, 10m, 2h)")
    return float(match[1]) * _UNITS[match[2] or "s"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="make chaos", description=__doc__)
    parser.add_argument("--duration", type=seconds, default=seconds("10m"), help="how long the soak lasts (2h)")
    parser.add_argument("--every", type=seconds, default=30.0, help="one fault every this long (30s)")
    parser.add_argument("--seed", type=int, default=1, help="the draw of faults and targets")
    parser.add_argument("--report", type=Path, default=REPORT, help=f"where the report goes ({REPORT})")
    parser.add_argument("--no-training", action="store_true",
                        help="run no training gang (by default a researcher submits one with the CLI first)")
    args = parser.parse_args(argv)

    from tools.chaos.soak import Soak
    from tools.localcluster import control, nodehost, stackup
    from tools.localcluster.plan import Layout, load_plan, load_stack_config
    from tools.localcluster.realcluster import private_state, why_not
    from tools.localcluster.realnodes import IMAGES_BY_KIND, real_nodes_for

    with nodehost.host_lock():
        reason = why_not((*IMAGES_BY_KIND["system"], *IMAGES_BY_KIND["gpu"]))
        if reason:
            print(f"make chaos: cannot run here: {reason}", file=sys.stderr)
            return 2
        state = private_state("gpucl-chaos")
        lay = Layout(state)
        backend = Path(tempfile.mkdtemp(prefix="chaos-backend-"))
        try:
            control.up(lay, timeout=300, real_nodes=True)
            stackup.pulumi_up(lay, "local", backend_url=f"file://{backend}", in_pods=True)
            cfg = load_stack_config(ROOT, "local", real_nodes=True)
            kubelets = tuple(n.name for n in real_nodes_for(load_plan(ROOT, "local", real_nodes=True)))
            soak = Soak(lay, cfg, args.seed, args.duration, args.every, kubelets,
                        training=None if args.no_training else GPUCLUSTER)
            report = soak.run()
            if soak.gang is not None:
                soak.gang.cancel()
            keep_logs(soak.core, soak.cfg.system_namespace, args.report.parent / "logs")
            write_report(report, args.report)
            say(f"report: {args.report}")
            say(f"violations: {report['violations']}")
            return 1 if any(report["violations"].values()) else 0
        finally:
            control.down(lay, quiet=True)
            shutil.rmtree(state, ignore_errors=True)
            shutil.rmtree(backend, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
