"""Names at the longest the config accepts still render objects the API server takes: every object name and
label value of the local stack with each name at its limit is valid (so the limit is checked at config time,
not found at apply time)."""

from __future__ import annotations

import re
from typing import Any

from tests.conftest import StackRunner

K = "gpu-cluster:"
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
#: Kinds whose names are also DNS labels (host names, Service DNS records).
LABEL_NAMED = {"Service", "Namespace", "Pod"}
#: Kinds whose names are path segments (``gpu-cluster:vk-…`` is fine): no '/' or '%', not '.' or '..'.
SEGMENT_NAMED = {"Role", "ClusterRole", "RoleBinding", "ClusterRoleBinding"}


def _valid_name(kind: str, name: str) -> bool:
    if kind in SEGMENT_NAMED:
        return len(name) <= 253 and not set(name) & {"/", "%"} and name not in (".", "..")
    return len(name) <= (63 if kind in LABEL_NAMED else 253) and bool(SUBDOMAIN.match(name))


def _longest(config: dict[str, Any]) -> None:
    config[f"{K}providers"][0]["name"] = "p" * 60
    config[f"{K}inference"]["services"][0]["name"] = "s" * 47
    job = config[f"{K}training"]["jobs"][0]
    job["name"] = "j" * 47
    config[f"{K}pools"][0]["name"] = job["pool"] = "g" * 63
    config[f"{K}checkpoint"]["filesystems"][0]["name"] = job["checkpoint"]["filesystem"] = "f" * 63
    config[f"{K}systemPool"]["name"] = "y" * 63
    config[f"{K}burst"]["taintValue"] = "t" * 63


def test_longest_names_render_valid_objects(run_stack: StackRunner) -> None:
    result = run_stack("local", _longest)
    bad = []
    for resource in result.resources:
        if not resource.custom or not resource.kind:
            continue
        meta = resource.metadata
        name = str(meta.get("name", ""))
        if name and not _valid_name(resource.kind, name):
            bad.append(f"{resource.kind} name {name!r}")
        for key, value in (meta.get("labels") or {}).items():
            if not isinstance(value, str) or len(value) > 63 or not LABEL_VALUE.match(value):
                bad.append(f"{resource.kind} {name}: label {key}={value!r}")
    assert result.resources and not bad, bad[:10]
