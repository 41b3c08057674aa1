"""Reading the stack configuration from the Pulumi runtime and refusing a bad one before any resource."""

from __future__ import annotations

import warnings
from typing import Any

import pulumi
from pulumi.runtime import config as runtime_config

from components.config import (
    PROJECT,
    ClusterConfig,
    ConfigError,
    Problem,
    parse_config,
    raw_from_pulumi_config,
)
from components.config.loading import credential_refs, foreign_keys, secret_schema_problems


class StackConfigError(ConfigError, pulumi.RunError):
    """A :class:`ConfigError` the Pulumi engine shows as a message alone (a ``RunError``: no traceback)."""

    @classmethod
    def of(cls, error: ConfigError) -> StackConfigError:
        return cls(error.stack_file, error.problems)


def engine_config() -> tuple[dict[str, Any], set[str]]:
    """Every ``project:key`` value the engine (or the mock runtime) gave this program, and the secret keys."""
    values: dict[str, Any] = dict(runtime_config.get_config_env() or {})
    values.update(runtime_config.CONFIG.get())
    secrets = set(runtime_config.get_config_secret_keys_env())
    secrets |= set(runtime_config._SECRET_KEYS.get())
    return values, secrets


def stack_file(stack: str | None = None) -> str:
    return f"Pulumi.{stack or pulumi.get_stack()}.yaml"


def load_stack_config() -> ClusterConfig:
    """Validate the whole stack config; on any problem stop with one message and register nothing."""
    try:
        return _load_stack_config()
    except ConfigError as error:
        raise StackConfigError.of(error) from None


def _load_stack_config() -> ClusterConfig:
    values, secret_keys = engine_config()
    project = pulumi.get_project() or PROJECT
    if foreign := foreign_keys(values, project):
        raise ConfigError(stack_file(), foreign)
    raw = raw_from_pulumi_config(values, project)
    secret_names = {k.split(":", 1)[1] for k in secret_keys if k.startswith(f"{project}:")}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", FutureWarning)
        cfg = validate_config(raw, secret_names, set(raw), stack_file())
    for warning in caught:  # renamed keys: shown in the engine's diagnostics, where a user reads them
        pulumi.log.warn(f"{stack_file()}: {warning.message}")
    return cfg


def validate_config(raw: dict[str, Any], secret_names: set[str], present: set[str], filename: str) -> ClusterConfig:
    """The stack's rules on ``raw`` (keys without the project prefix): schema, cross-field checks, credentials.

    ``secret_names`` are the keys set as secrets and ``present`` every key set; ``filename`` names the
    source in the error. The component package validates its args here too, so both give the same errors.
    """
    if schema_secrets := secret_schema_problems(secret_names):
        raise ConfigError(filename, schema_secrets)
    # Keys named as credentials are checked by check_secrets (secret or not), never as schema keys.
    credential_keys = secret_names | set(credential_refs(raw))
    plain = {k: v for k, v in raw.items() if k not in credential_keys}
    cfg = parse_config(plain, filename)
    problems = check_secrets(cfg, present, secret_names)
    if problems:
        raise ConfigError(filename, problems)
    return cfg


def check_secrets(cfg: ClusterConfig, present: set[str], secret_names: set[str]) -> list[Problem]:
    """Credentials must exist and be Pulumi secrets: plain text would land in state and PR diffs."""
    problems = []
    refs = [(f"providers[{i}].credentialsSecret", p.credentials_secret) for i, p in enumerate(cfg.providers)]
    refs += [
        (f"inference.services[{i}].traffic.queueCredentialsSecret", s.traffic.queue_credentials_secret)
        for i, s in enumerate(cfg.inference.services)
        if s.traffic.queue_credentials_secret
    ]
    for path, key in refs:
        assert key is not None
        if key not in present:
            problems.append(Problem(path, f"names config key '{key}', which is not set; run "
                                          f"`pulumi config set --secret {key} <value>`", key))
        elif key not in secret_names:
            problems.append(Problem(path, f"config key '{key}' holds credentials in plain text; set it with "
                                          f"`pulumi config set --secret {key} <value>`", key))
    return problems


def secret_value(key: str) -> pulumi.Output[str]:
    """A credential from secret config, kept secret in state and outputs."""
    return pulumi.Config(PROJECT).require_secret(key)

