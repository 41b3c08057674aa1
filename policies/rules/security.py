"""Security rules: pinned images, restricted pods, privileges only where allow-listed, least-privilege RBAC and
credentials only from Pulumi secrets."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from components.naming import INFERENCE, TRAINING
from policies.rules.core import MANDATORY, Resource, RuleContext, as_map, as_seq, rule
from policies.rules.pods import PodTemplate, is_volcano_job, pod_templates

#: How the mock runtime (and resources.json) shows a secret value.
SECRET_PLACEHOLDER = "[secret]"


_DIGEST = re.compile(r"@sha256:[0-9a-f]{64}$")


def image_problem(image: str) -> str | None:
    if not image:
        return "has no image"
    if _DIGEST.search(image):
        return None
    last = image.rsplit("/", 1)[-1]
    if ":" not in last:
        return f"image '{image}' has no tag or digest"
    if last.endswith(":latest"):
        return f"image '{image}' uses the 'latest' tag"
    return None


@rule(
    "images-pinned",
    "Every container image is pinned by tag or digest, never 'latest'; charts pin a version.",
    MANDATORY,
    "an unpinned image changes the cluster without a diff",
)
def check_images_pinned(res: Resource, ctx: RuleContext) -> list[str]:
    out = []
    for pod in pod_templates(res):
        for where, container in pod.containers():
            problem = image_problem(str(container.get("image") or ""))
            if problem:
                out.append(f"{where}: {problem}; pin a version tag or digest (components/images.py)")
    if res.type.startswith("kubernetes:helm.sh/") and not res.props.get("version"):
        out.append("Helm chart without a version; pin version= so a chart release cannot change the cluster")
    return out


def _is_workload_pod(pod: PodTemplate, ctx: RuleContext) -> bool:
    return pod.labels.get(ctx.keys.workload) in (TRAINING, INFERENCE)


def _adds_sys_admin(container: Mapping[str, Any]) -> bool:
    caps = as_map(as_map(container.get("securityContext")).get("capabilities"))
    return "SYS_ADMIN" in as_seq(caps.get("add"))


@rule(
    "pod-security-restricted",
    "Our own pods run non-root, with a read-only root filesystem and no "
         "privilege escalation (allow-listed components keep only their named exception).",
    MANDATORY,
    "platform agents run on every GPU node; a compromise there reaches every job",
)
def check_pod_security(res: Resource, ctx: RuleContext) -> list[str]:
    out = []
    for pod in pod_templates(res):
        if _is_workload_pod(pod, ctx) or is_volcano_job(res):
            continue  # users' training/inference images; governed by namespace Pod Security admission
        allowed = pod.app_name in ctx.allow_list
        pod_ctx = as_map(pod.spec.get("securityContext"))
        for where, container in pod.containers():
            sc = as_map(container.get("securityContext"))
            non_root = sc.get("runAsNonRoot", pod_ctx.get("runAsNonRoot"))
            if non_root is not True and not allowed:
                out.append(f"{where}: runAsNonRoot is not true; use components.security.pod_security_context() "
                           "and container_security_context()")
            if sc.get("readOnlyRootFilesystem") is not True:
                out.append(f"{where}: readOnlyRootFilesystem is not true; set it and mount an emptyDir where the "
                           "process must write")
            if sc.get("allowPrivilegeEscalation") is not False and not (allowed and _adds_sys_admin(container)):
                out.append(f"{where}: allowPrivilegeEscalation is not false; set allowPrivilegeEscalation: false")
    return out


@rule(
    "privileges-allow-listed",
    "Capabilities and hostPath only for components on "
         "components.security.PRIVILEGE_ALLOW_LIST (by app.kubernetes.io/name); hostPath read-only; never "
         "privileged or host namespaces.",
    MANDATORY,
    "privileges are exceptions, named and reviewed",
)
def check_privileges(res: Resource, ctx: RuleContext) -> list[str]:
    out = []
    for pod in pod_templates(res):
        allowed = pod.app_name in ctx.allow_list
        how = (f"add '{pod.app_name or '<app.kubernetes.io/name>'}' to components.security.PRIVILEGE_ALLOW_LIST "
               "with the reason, or drop the privilege")
        for flag in ("hostNetwork", "hostPID", "hostIPC"):
            if pod.spec.get(flag) is True:
                out.append(f"{pod.where}: {flag} is true; no component of this platform needs it — remove it")
        host_paths = {
            str(as_map(v).get("name")): str(as_map(as_map(v).get("hostPath")).get("path"))
            for v in as_seq(pod.spec.get("volumes"))
            if as_map(v).get("hostPath") is not None
        }
        if host_paths and not allowed:
            out.append(f"{pod.where}: hostPath volumes {sorted(host_paths.values())} in a component that is not "
                       f"allow-listed; {how}")
        for where, container in pod.containers():
            sc = as_map(container.get("securityContext"))
            if sc.get("privileged") is True:
                out.append(f"{where}: privileged: true; grant the single capability needed instead "
                           "(e.g. SYS_ADMIN for DCGM profiling) and remove privileged")
            added = [str(c) for c in as_seq(as_map(sc.get("capabilities")).get("add"))]
            if added and not allowed:
                out.append(f"{where}: adds capabilities {added} in a component that is not allow-listed; {how}")
            for mount in (as_map(m) for m in as_seq(container.get("volumeMounts"))):
                name = str(mount.get("name"))
                if name in host_paths and mount.get("readOnly") is not True:
                    out.append(f"{where}: hostPath {host_paths[name]} is mounted read-write; set readOnly: true "
                               "on the volumeMount")
    return out


@rule(
    "rbac-least-privilege",
    "RBAC rules list no wildcard verbs, resources or apiGroups; nothing binds "
         "cluster-admin.",
    MANDATORY,
    "a wildcard grants tomorrow's resources too",
)
def check_rbac(res: Resource, ctx: RuleContext) -> list[str]:
    out = []
    if res.kind in ("Role", "ClusterRole") and res.group == "rbac.authorization.k8s.io":
        for index, entry in enumerate(as_map(r) for r in as_seq(res.props.get("rules"))):
            for fld in ("verbs", "resources", "apiGroups", "nonResourceURLs"):
                if "*" in as_seq(entry.get(fld)):
                    out.append(f"rules[{index}].{fld} contains '*'; list the exact {fld} the component uses "
                               "(least privilege)")
    if res.kind in ("RoleBinding", "ClusterRoleBinding"):
        ref = as_map(res.props.get("roleRef"))
        if ref.get("name") == "cluster-admin":
            out.append("binds cluster-admin; bind a ClusterRole that lists only the verbs and resources needed")
    return out


_CREDENTIAL_ENV = re.compile(r"(^|_)(PASSWORD|PASSWD|TOKEN|API_KEY|APIKEY|SECRET|SECRET_KEY|ACCESS_KEY|CREDENTIALS?)$")


_CREDENTIAL_PROP = {"kubeconfig", "password", "token", "apiKey", "clientSecret", "secretKey", "accessKey"}


def _leaks(value: Any, ctx: RuleContext) -> bool:
    if not isinstance(value, str) or value == "" or value == SECRET_PLACEHOLDER:
        return False
    if ctx.secrets_marked:
        return True
    return value in ctx.plain_config_values


@rule(
    "no-plain-credentials",
    "Credentials come from Pulumi secrets: Secret data and provider credentials are "
         "secret values, and env credentials use secretKeyRef.",
    MANDATORY,
    "plain credentials land in state files and PR diffs",
)
def check_plain_credentials(res: Resource, ctx: RuleContext) -> list[str]:
    out = []
    fix = "read it with components.stack.secret_value() from a key set by `pulumi config set --secret`"
    if res.kind == "Secret" and res.api_version == "v1":
        for fld in ("data", "stringData"):
            for key, value in as_map(res.props.get(fld)).items():
                if _leaks(value, ctx):
                    out.append(f"{fld}.{key} is a plain value; {fix}")
    if res.type.startswith("pulumi:providers:"):
        for key, value in res.props.items():
            if key in _CREDENTIAL_PROP and _leaks(value, ctx):
                out.append(f"provider input '{key}' is a plain value; {fix}")
    for pod in pod_templates(res):
        for where, container in pod.containers():
            for env in (as_map(e) for e in as_seq(container.get("env"))):
                name, value = str(env.get("name", "")), env.get("value")
                if _CREDENTIAL_ENV.search(name) and isinstance(value, str) and value and not value.startswith("/"):
                    out.append(f"{where}.env[{name}] holds a credential literally; use valueFrom.secretKeyRef to a "
                               "Secret whose data comes from secret config")
    return out
