"""Entry point of the CrossGuard pack: builds the PolicyPack from the :mod:`policies.rules` package.

Constructing a ``PolicyPack`` starts its gRPC server and blocks forever, so nothing may import this
file; tests and ``make policy`` import :mod:`policies.rules` instead.
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path

# The engine starts the pack with the pack directory as working directory; the rules import the
# project's components package from the repository root.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pulumi_policy import EnforcementLevel, PolicyPack

from policies.rules import PACK_NAME, build_policies, engine_context

PolicyPack(
    name=PACK_NAME,
    enforcement_level=EnforcementLevel.MANDATORY,
    policies=build_policies(functools.cache(engine_context)),
)
