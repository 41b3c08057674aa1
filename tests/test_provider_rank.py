"""The provider ranking a burst fills by: cheapest first, unpriced last, nothing to rank without two prices."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import given
from hypothesis import strategies as st

from components.provider_rank import INT32_MIN, MAX_WEIGHT, deletion_costs, fill_order, provider_weights


@dataclass(frozen=True)
class P:
    name: str
    price_per_gpu_hour: float | None


@pytest.mark.parametrize(("providers", "weights"), [
    ([P("a", 2.99), P("b", 1.50)], {"a": 50, "b": 100}),
    ([P("a", 3.0), P("b", 2.0), P("c", 1.0)], {"a": 33, "b": 67, "c": 100}),
    ([P("a", 0.0), P("b", 1.0)], {"a": 100, "b": 50}),  # a free provider (own capacity) comes first
    ([P("a", 2.0), P("b", 2.0), P("c", 1.0)], {"a": 50, "b": 50, "c": 100}),  # equal prices, equal weights
    ([P("a", 2.0), P("b", None), P("c", 1.0)], {"a": 50, "c": 100}),  # unpriced: no term, ranks last
    ([P("a", 2.0), P("b", 2.0)], {}),  # one price: nothing to rank
    ([P("a", 2.0), P("b", None)], {}),
    ([P("a", None)], {}),
    ([], {}),
])
def test_weights(providers: list[P], weights: dict[str, int]) -> None:
    assert provider_weights(providers) == weights


def test_fill_order_cheapest_first_then_unpriced_in_config_order() -> None:
    providers = [P("dear", 2.99), P("unpriced", None), P("cheap", 1.50), P("also-dear", 2.99)]
    assert [providers[i].name for i in fill_order(providers)] == ["cheap", "dear", "also-dear", "unpriced"]
    # Nothing to rank: the configured order stands.
    same = [P("x", 1.0), P("y", 1.0), P("z", None)]
    assert fill_order(same) == [0, 1, 2]


prices = st.one_of(st.none(), st.floats(min_value=0, max_value=1e6, allow_nan=False, allow_infinity=False))


@given(st.lists(prices, max_size=12))
def test_weights_fall_with_price_within_the_api_bounds(price_list: list[float | None]) -> None:
    providers = [P(f"p{i}", price) for i, price in enumerate(price_list)]
    weights = provider_weights(providers)
    priced = [p for p in providers if p.price_per_gpu_hour is not None]
    if len({p.price_per_gpu_hour for p in priced}) < 2:
        assert weights == {}
        return
    assert set(weights) == {p.name for p in priced}
    assert all(1 <= w <= MAX_WEIGHT for w in weights.values())
    assert max(weights.values()) == MAX_WEIGHT
    for a in priced:
        for b in priced:
            assert a.price_per_gpu_hour is not None and b.price_per_gpu_hour is not None
            if a.price_per_gpu_hour < b.price_per_gpu_hour:
                assert weights[a.name] > weights[b.name]
            elif a.price_per_gpu_hour == b.price_per_gpu_hour:
                assert weights[a.name] == weights[b.name]
    order = fill_order(providers)
    assert sorted(order) == list(range(len(providers)))
    ranked = [weights.get(providers[i].name, 0) for i in order]
    assert ranked == sorted(ranked, reverse=True)


def test_deletion_costs_put_the_dearest_first_in_a_scale_down() -> None:
    providers = [P("dear", 2.99), P("cheap", 1.50), P("unpriced", None)]
    assert deletion_costs(providers, -100) == {"dear": -150, "cheap": -100, "unpriced": -200}
    assert deletion_costs([P("a", 1.0), P("b", 1.0)], -100) == {}  # nothing ranked: one cost for all
    low = INT32_MIN + 10  # clamped to the annotation's int32
    assert deletion_costs(providers, low) == {"dear": INT32_MIN, "cheap": low, "unpriced": INT32_MIN}
