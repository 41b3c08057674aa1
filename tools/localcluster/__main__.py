"""``localcluster up|down|status|env``: the local control plane on 127.0.0.1 (see tools/localcluster)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from tools.localcluster import control
from tools.localcluster.plan import Layout


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="localcluster", description=__doc__)
    parser.add_argument("--state", type=Path, default=Path(os.environ.get("LOCALCLUSTER_STATE", control.DEFAULT_STATE)),
                        help="state folder (binaries, pki, logs, kubeconfig); default .state/localcluster")
    sub = parser.add_subparsers(dest="cmd", required=True)
    p_up = sub.add_parser("up", help="start the control plane and create the fake nodes")
    p_up.add_argument("--stack", default="local", help="stack whose nodes to fake (Pulumi.<stack>.yaml)")
    p_up.add_argument("--timeout", type=float, default=240.0)
    p_up.add_argument("--real-nodes", action="store_true",
                      help="also start real kubelets on containerd (a system node and a GPU node, see realnodes.py)")
    p_down = sub.add_parser("down", help="stop every recorded process and drop the etcd data")
    p_down.add_argument("--keep-data", action="store_true", help="keep etcd data for the next up")
    sub.add_parser("status", help="components, nodes, GPUs and taints; exit 1 when down")
    sub.add_parser("kubeconfig", help="print the kubeconfig path")
    args = parser.parse_args(argv)
    lay = Layout(args.state.resolve())
    try:
        if args.cmd == "up":
            control.up(lay, stack=args.stack, timeout=args.timeout, real_nodes=args.real_nodes)
            control.status(lay)
        elif args.cmd == "down":
            control.down(lay, keep_data=args.keep_data)
        elif args.cmd == "status":
            return 0 if control.status(lay) else 1
        elif args.cmd == "kubeconfig":
            print(lay.kubeconfig)
    except control.ClusterError as err:
        print(f"localcluster: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
