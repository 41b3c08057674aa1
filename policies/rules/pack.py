"""The rules as a CrossGuard pack under the real engine: policies wrapping the checks, and the engine's context.

Two facts of the real engine shape this (pulumi_policy 1.21):

* the analyzer protocol carries ``protect`` but not ``retainOnDelete``; the engine path therefore leaves
  ``Options.retain_on_delete`` as ``None`` (unknown) and only ``make policy`` judges it;
* secret property values reach the pack already unwrapped, so there the credentials rule compares
  values with the stack file's plain config instead of looking for the secret marker.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import yaml
from pulumi_policy import (
    Policy,
    PolicyResource,
    ReportViolation,
    ResourceValidationArgs,
    ResourceValidationPolicy,
    StackValidationArgs,
    StackValidationPolicy,
)

from policies.rules.core import RULES, Options, Resource, Rule, RuleContext, strings

PACK_NAME = "gpu-cluster-policies"


def plain(value: Any) -> Any:
    """Copy engine proxies into plain dicts/lists; an unknown (preview) value becomes None."""
    from pulumi_policy.proxy import UnknownValueError

    if isinstance(value, Mapping):
        out: dict[str, Any] = {}
        for key in list(value.keys()):
            try:
                out[str(key)] = plain(value[key])
            except UnknownValueError:
                out[str(key)] = None
        return out
    if isinstance(value, Sequence) and not isinstance(value, str | bytes):
        items: list[Any] = []
        for index in range(len(value)):
            try:
                items.append(plain(value[index]))
            except UnknownValueError:
                items.append(None)
        return items
    return value


def resource_from_args(args: ResourceValidationArgs | PolicyResource) -> Resource:
    """The engine's view of a resource as a :class:`Resource` (retainOnDelete unknown there)."""
    return Resource(
        type=args.resource_type,
        props=plain(args.props),
        urn=args.urn,
        name=args.name,
        options=Options(
            protect=bool(args.opts.protect), retain_on_delete=getattr(args.opts, "retain_on_delete", None)
        ),
    )


def _resource_validate(rule: Rule, context: Callable[[], RuleContext]) -> Callable[..., None]:
    check = rule.check
    assert check is not None

    def validate(args: ResourceValidationArgs, report: ReportViolation) -> None:
        for message in check(resource_from_args(args), context()):
            report(message, None)

    return validate


def _stack_validate(rule: Rule, context: Callable[[], RuleContext]) -> Callable[..., None]:
    check = rule.stack_check
    assert check is not None

    def validate(args: StackValidationArgs, report: ReportViolation) -> None:
        resources = [resource_from_args(r) for r in args.resources]
        for res, message in check(resources, context()):
            report(message, res.urn or None)

    return validate


def build_policies(context: Callable[[], RuleContext], rules: Sequence[Rule] = RULES) -> list[Policy]:
    """The rules as CrossGuard policies; ``context`` is called per validation (cached by the caller)."""
    policies: list[Policy] = []
    for rule in rules:
        description = f"{rule.description} ({rule.level.value}: {rule.why_level})"
        if rule.check is not None:
            policies.append(ResourceValidationPolicy(
                name=rule.name, description=description, enforcement_level=rule.level,
                validate=_resource_validate(rule, context),
            ))
        else:
            policies.append(StackValidationPolicy(
                name=rule.name, description=description, enforcement_level=rule.level,
                validate=_stack_validate(rule, context),
            ))
    return policies


def _parsed(value: Any) -> Any:
    """A config value as the engine passes it (JSON/YAML text for structures), parsed where possible."""
    if not isinstance(value, str):
        return value
    try:
        return yaml.safe_load(value)
    except yaml.YAMLError:
        return value


def engine_context() -> RuleContext:
    """The context inside the real engine: stack config from ``PULUMI_CONFIG``, plain keys from the stack file.

    The engine hands the pack every config value (secrets decrypted) but not which keys are secret;
    the stack file ``Pulumi.<stack>.yaml`` (``secure:`` entries) says which are.
    """
    import os
    from pathlib import Path

    import pulumi

    from components.config import PROJECT, ConfigError, parse_config, raw_from_pulumi_config
    from components.config.loading import read_stack_file

    values = dict(pulumi.runtime.get_config_env() or {})
    stack = os.environ.get("PULUMI_STACK", "")
    stack_file = Path(__file__).resolve().parents[2] / f"Pulumi.{stack}.yaml"  # the repository root
    plain_keys: set[str] = set(values)
    if stack_file.exists():
        try:
            config, secrets = read_stack_file(stack_file, PROJECT)  # the loader's reading: one for every reader
        except ConfigError:
            return RuleContext.defaults()  # the program refuses the same file with its line
        plain_keys = set(config) - secrets
    plain_values = {v for k, v in values.items() if k in plain_keys}
    plain_text = {s for _, s in strings([_parsed(v) for v in plain_values])}
    raw = raw_from_pulumi_config({k: v for k, v in values.items() if k in plain_keys}, PROJECT)
    try:
        cfg = parse_config(raw, stack_file.name)
    except ConfigError:
        return RuleContext.defaults()
    return RuleContext.from_config(cfg, secrets_marked=False, plain_config_values=plain_text)
