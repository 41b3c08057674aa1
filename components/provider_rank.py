"""Which provider a burst fills first: the cheapest one per GPU-hour.

The scheduler knows nothing of prices, so placement alone used to decide which virtual node took an external
replica, and the simulator's prod month put 92 % of the external GPU·h on the dearer of two providers. The
ranking goes into each inference pod as preferred node-affinity terms on the provider label: a provider's
weight falls with its price rank (distinct prices, cheapest first: 100, then evenly down to at least 1).
Providers without `pricePerGpuHour` get no term, so they rank last; with fewer than two distinct prices
there is nothing to rank and no term is added.

Volcano's nodeorder plugin adds the weights of the matching terms (times `nodeaffinity.weight`, not
normalised across nodes), so on-prem keeps its lead with a second on-prem term as heavy as the best
provider's: an on-prem node still outscores every virtual node by 100, as it did before any ranking.

A scale-down removes the dearest external replicas first: the burst controller gives replicas on a provider
a pod-deletion-cost below the stack's `externalDeletionCost` by the provider's distance from the best weight.

Pure: the components render it and the simulator fills and empties virtual nodes in the same order.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

#: The API's bound for one preferred scheduling term's weight.
MAX_WEIGHT = 100
#: The pod-deletion-cost annotation is an int32.
INT32_MIN = -(2**31)


class PricedProvider(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def price_per_gpu_hour(self) -> float | None: ...


def provider_weights(providers: Sequence[PricedProvider]) -> dict[str, int]:
    """Provider name -> preferred-affinity weight (only priced providers, only when prices differ)."""
    levels = sorted({p.price_per_gpu_hour for p in providers if p.price_per_gpu_hour is not None})
    if len(levels) < 2:
        return {}
    n = len(levels)
    weight = {price: max(1, round(MAX_WEIGHT * (n - rank) / n)) for rank, price in enumerate(levels)}
    return {p.name: weight[p.price_per_gpu_hour] for p in providers if p.price_per_gpu_hour is not None}


def fill_order(providers: Sequence[PricedProvider]) -> list[int]:
    """Indexes of `providers` in the order a burst fills them: heaviest weight first, then as configured."""
    weights = provider_weights(providers)
    return sorted(range(len(providers)), key=lambda i: -weights.get(providers[i].name, 0))


def deletion_costs(providers: Sequence[PricedProvider], external_cost: int) -> dict[str, int]:
    """Provider name -> pod-deletion-cost of its external replicas: `external_cost` for the cheapest, lower by
    the weight it lacks for the others (unpriced ones lowest); empty when nothing is ranked."""
    weights = provider_weights(providers)
    if not weights:
        return {}
    return {p.name: max(INT32_MIN, external_cost - (MAX_WEIGHT - weights.get(p.name, 0))) for p in providers}
