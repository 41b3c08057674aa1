"""Node names and ranges (``gpu-b-[001-128]``), spelled once and standard library only.

The stack validates a pool's ranges with this grammar and the node-pool agent matches nodes by it, so a range
the stack accepts is exactly the set of nodes the agent labels.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

NODE_RANGE = re.compile(r"^(?P<prefix>[a-z0-9.-]*)\[(?P<lo>\d+)-(?P<hi>\d+)\](?P<suffix>[a-z0-9.-]*)$")
#: The largest node range one pattern may expand to: Kubernetes supports 5,000 nodes per cluster, so a larger
#: range is a typo that would otherwise label that many nodes (or hang the render).
MAX_NODES_PER_RANGE = 5000


def expand_node_names(patterns: Iterable[str]) -> list[str]:
    """Expand ``gpu-[001-004]``-style ranges (zero padding kept) into node names."""
    names: list[str] = []
    for pattern in patterns:
        match = NODE_RANGE.match(pattern)
        if not match:
            names.append(pattern)
            continue
        lo_text, hi_text = match["lo"], match["hi"]
        lo, hi = int(lo_text), int(hi_text)
        if lo > hi:
            raise ValueError(f"range '{pattern}' runs backwards ({lo} > {hi})")
        if hi - lo + 1 > MAX_NODES_PER_RANGE:
            raise ValueError(f"range '{pattern}' would create {hi - lo + 1} nodes; at most {MAX_NODES_PER_RANGE} "
                             "(the most nodes Kubernetes supports in one cluster)")
        width = len(lo_text) if lo_text.startswith("0") else 0
        names.extend(f"{match['prefix']}{i:0{width}d}{match['suffix']}" for i in range(lo, hi + 1))
    return names
