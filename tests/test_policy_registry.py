"""The rule registry: ``@rule`` / ``@stack_rule`` put each rule in RULES by level and area, and refuse rules
that would make the pack ambiguous (a reused name, a check of both kinds, a rule outside an area module)."""

from __future__ import annotations

import pytest

from policies.rules import ADVISORY, MANDATORY, RULES, Resource, Rule, RuleContext
from policies.rules.core import AREAS, register


def _check(res: Resource, ctx: RuleContext) -> list[str]:
    return []


def _module(rule: Rule) -> str:
    return str((rule.check or rule.stack_check).__module__)


def test_rules_list_mandatory_before_advisory_and_areas_in_order() -> None:
    levels = [r.mandatory for r in RULES]
    assert levels == sorted(levels, reverse=True)
    for mandatory in (True, False):
        areas = [AREAS.index(_module(r).rsplit(".", 1)[-1]) for r in RULES if r.mandatory is mandatory]
        assert areas == sorted(areas)
    assert {_module(r) for r in RULES} == {f"policies.rules.{area}" for area in AREAS}


def test_a_reused_name_is_refused_and_leaves_the_rules_alone() -> None:
    before = list(RULES)
    with pytest.raises(ValueError, match="'images-pinned' is registered twice"):
        register(Rule("images-pinned", "again", MANDATORY, "why", check=_check), "policies.rules.security")
    assert before == RULES


def test_a_rule_outside_an_area_module_is_refused() -> None:
    with pytest.raises(ValueError, match=r"defined in tests\.elsewhere, not in one of the areas"):
        register(Rule("new-rule", "d", ADVISORY, "why", check=_check), "tests.elsewhere")
    assert "new-rule" not in {r.name for r in RULES}


def test_a_rule_needs_exactly_one_check() -> None:
    with pytest.raises(ValueError, match="exactly one of a resource check and a stack check"):
        register(Rule("no-check", "d", ADVISORY, "why"), "policies.rules.security")
