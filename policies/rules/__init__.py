"""The policy rules: the cluster's operating lessons as checks over registered resources.

Each rule is a pure function over a :class:`Resource` (type, props, urn, name, options) or over the
whole stack, plus a :class:`RuleContext` built from the stack config (tiers, scheduler, thresholds,
label prefix), registered by ``@rule`` / ``@stack_rule`` (:mod:`policies.rules.core`) next to its check.
The rules live by area, one module each:

* :mod:`~policies.rules.scheduling` — GPU pods, gangs, training's rank and place;
* :mod:`~policies.rules.burst` — taints, inference autoscaling and PDBs, the descheduler's gradual return;
* :mod:`~policies.rules.storage` — checkpoint volumes and classes;
* :mod:`~policies.rules.observability` — thermal alerts and DCGM counters;
* :mod:`~policies.rules.security` — images, pod security, privileges, RBAC, credentials.

The same functions run in two places:

* ``make policy`` / ``tools.policy`` over the mock runtime's registrations (``resources.json`` data);
* the CrossGuard pack (``policies/__main__.py``) under ``pulumi preview --policy-pack policies``,
  through :func:`~policies.rules.pack.build_policies`, which wraps them as ``ResourceValidationPolicy`` /
  ``StackValidationPolicy``.

Mandatory rules encode invariants whose violation breaks the design (a training gang that cannot
preempt, a NoExecute taint that kills production inference, a checkpoint volume one ``pulumi destroy``
away from deletion). Advisory rules are recommendations whose right answer depends on the workload.
:data:`RULES` lists the mandatory rules first, then the advisory ones, each by area in the order above.
Nothing here may import the pack's ``__main__`` (starting a pack blocks forever).
"""

from __future__ import annotations

# The area modules register their rules on import (core.AREAS, not this line, orders them in RULES).
from policies.rules import burst, observability, scheduling, security, storage
from policies.rules.core import (
    ADVISORY,
    MANDATORY,
    RULES,
    Options,
    Resource,
    Rule,
    RuleContext,
    Violation,
    evaluate,
    rule,
    stack_rule,
)
from policies.rules.observability import REQUIRED_DCGM_COUNTERS
from policies.rules.pack import PACK_NAME, build_policies, engine_context, plain, resource_from_args
from policies.rules.pods import NAME_LABEL, PodTemplate, pod_templates
from policies.rules.security import SECRET_PLACEHOLDER

__all__ = [
    "ADVISORY",
    "MANDATORY",
    "NAME_LABEL",
    "PACK_NAME",
    "REQUIRED_DCGM_COUNTERS",
    "RULES",
    "SECRET_PLACEHOLDER",
    "Options",
    "PodTemplate",
    "Resource",
    "Rule",
    "RuleContext",
    "Violation",
    "build_policies",
    "burst",
    "engine_context",
    "evaluate",
    "observability",
    "plain",
    "pod_templates",
    "resource_from_args",
    "rule",
    "scheduling",
    "security",
    "stack_rule",
    "storage",
]
