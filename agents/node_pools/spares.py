"""Warm spares: which nodes of a pool stay out of training so a gang that loses a node finds another at once.

A spare carries ``<prefix>/spare=true:NoSchedule``. Training does not tolerate it; inference does (a spare's GPUs
are idle GPUs), and yields it as it yields any GPU a gang needs: training's class preempts inference's. The pool
declares how many it keeps (``spareNodes``); every node the health guard holds (quarantined, ``<prefix>/gpu-health``)
uses one up, so a quarantine releases a spare at once and the gang's replacement pod binds without waiting for a
repair; once the guard releases the repaired node, the pool is one short again and an idle node, most often that
one (its pods were evicted), becomes the spare.

Pure: the pool's nodes as the agent sees them in, the names that should carry the taint out. Stable: a node that is
a spare stays one while the pool needs that many, so nothing flips on an unrelated event. Which spare goes first,
and which node becomes one, follows the fabric: a spare is released first in a leaf that lost a node (the
replacement then lands in its gang's leaf), and a new one is taken in the leaf with the fewest, so each leaf keeps
some.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class SpareView:
    """One node of the pool, as far as spares go."""

    name: str
    #: The leaf switch it hangs off (its ``<prefix>/leaf`` label), if the pool has a fabric.
    leaf: str | None = None
    #: The guard holds it (``<prefix>/gpu-health``): it neither serves nor can be a spare.
    quarantined: bool = False
    #: Fenced with its leaf's switch (``<prefix>/switch-fault``): it cannot be a spare meanwhile.
    fenced: bool = False
    #: Carries the spare taint now.
    spare: bool = False
    #: A training pod runs on it: it is not idle, so it is never taken as a spare.
    training: bool = False
    #: The burst handover reserved it for training that waits (``<prefix>/reserved``): an empty node, but the gang's,
    #: so it is not taken as a spare meanwhile (training does not tolerate the spare taint).
    reserved: bool = False


def target(spare_nodes: int, nodes: Iterable[SpareView]) -> int:
    """How many spares the pool keeps now: its ``spareNodes`` less the nodes the guard holds (each used one up)."""
    return max(0, spare_nodes - sum(1 for n in nodes if n.quarantined))


def choose_spares(nodes: Sequence[SpareView], spare_nodes: int) -> frozenset[str]:
    """The names that should carry the spare taint: the current spares that still can be one, fewer if the pool
    needs fewer (released first where a leaf lost a node), more if it needs more (idle nodes only, in the leaf
    with the fewest spares first)."""
    want = target(spare_nodes, nodes)
    usable = [n for n in nodes if not n.quarantined and not n.fenced]
    lost = Counter(n.leaf for n in nodes if n.quarantined)
    # Keep those in the leaves that lost the fewest nodes (then by name): the others are released first where a
    # leaf lost the most, so the replacement lands there.
    keep = sorted((n for n in usable if n.spare), key=lambda n: (lost.get(n.leaf, 0), n.name))[:want]
    chosen = {n.name for n in keep}
    per_leaf = Counter(n.leaf for n in keep)
    candidates = [n for n in usable if not n.spare and not n.training and not n.reserved]
    while len(chosen) < want and candidates:
        # The leaf with the fewest spares first, then one that lost no node, then by name.
        pick = min(candidates, key=lambda n: (per_leaf.get(n.leaf, 0), lost.get(n.leaf, 0), n.name))
        candidates.remove(pick)
        chosen.add(pick.name)
        per_leaf[pick.leaf] += 1
    return frozenset(chosen)
