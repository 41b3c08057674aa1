"""Security rules: pinned images, restricted pods, privileges only where allow-listed, least-privilege RBAC and
credentials only from Pulumi secrets."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from components.naming import INFERENCE, TRAINING
from policies.rules.allow_lists import PrivilegedAgent, RbacException, capability
from policies.rules.core import MANDATORY, Resource, RuleContext, as_map, as_seq, rule, strings
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
    # A chart's inputs (make policy); the engine hands the pack a chart component's outputs, where its rendered
    # objects are judged one by one instead.
    if res.type.startswith("kubernetes:helm.sh/") and res.props.get("chart") and not res.props.get("version"):
        out.append("Helm chart without a version; pin version= so a chart release cannot change the cluster")
    return out


def _is_workload_pod(res: Resource, pod: PodTemplate, ctx: RuleContext) -> bool:
    """A user's training or inference pod: labelled so *and* in a workload namespace (a label alone is free)."""
    return pod.labels.get(ctx.keys.workload) in (TRAINING, INFERENCE) and res.namespace in ctx.workload_namespaces


def _added_capabilities(container: Mapping[str, Any]) -> list[str]:
    caps = as_map(as_map(container.get("securityContext")).get("capabilities"))
    return [capability(str(c)) for c in as_seq(caps.get("add"))]


def service_account(pod: PodTemplate) -> str:
    return str(pod.spec.get("serviceAccountName") or pod.spec.get("serviceAccount") or "default")


def privileged_agent(res: Resource, pod: PodTemplate, ctx: RuleContext) -> PrivilegedAgent | None:
    """The allow-list entry of this pod's identity (namespace and service account), if any; labels play no part."""
    namespace, account = res.namespace or "default", service_account(pod)
    return next((a for a in ctx.privileged if a.namespace == namespace and a.service_account == account), None)


def _identity(res: Resource, pod: PodTemplate) -> str:
    return f"namespace '{res.namespace or 'default'}', service account '{service_account(pod)}'"


@rule(
    "pod-security-restricted",
    "Every pod the stack declares but training gangs (the stack's inference services included) runs non-root, "
         "with a read-only root filesystem and no privilege escalation (an allow-listed agent, by namespace and "
         "service account, keeps only its named exception: root where listed).",
    MANDATORY,
    "platform agents run on every GPU node and inference servers face the network; a compromise there reaches "
         "every job",
)
def check_pod_security(res: Resource, ctx: RuleContext) -> list[str]:
    out = []
    for pod in pod_templates(res):
        training = pod.labels.get(ctx.keys.workload) == TRAINING and _is_workload_pod(res, pod, ctx)
        if training or (is_volcano_job(res) and res.namespace in ctx.workload_namespaces):
            # Training images are the researchers' own (often root, writing caches under $HOME); the training
            # namespace's Pod Security admission governs them. An inference service is declared here, with the
            # stack's own security context, so it is held to the rule like any pod of ours.
            continue
        agent = privileged_agent(res, pod, ctx)
        root_allowed = agent is not None and agent.run_as_root
        pod_ctx = as_map(pod.spec.get("securityContext"))
        for where, container in pod.containers():
            sc = as_map(container.get("securityContext"))
            non_root = sc.get("runAsNonRoot", pod_ctx.get("runAsNonRoot"))
            if non_root is not True and not root_allowed:
                out.append(f"{where}: runAsNonRoot is not true; use components.security.pod_security_context() "
                           "and container_security_context()")
            if sc.get("readOnlyRootFilesystem") is not True:
                out.append(f"{where}: readOnlyRootFilesystem is not true; set it and mount an emptyDir where the "
                           "process must write")
            escalation_allowed = agent is not None and bool(set(_added_capabilities(container)) & agent.capabilities)
            if sc.get("allowPrivilegeEscalation") is not False and not escalation_allowed:
                out.append(f"{where}: allowPrivilegeEscalation is not false; set allowPrivilegeEscalation: false")
    return out


def _host_path(path: Any) -> str:
    text = str(path or "")
    return text.rstrip("/") or "/"


@rule(
    "privileges-allow-listed",
    "Capabilities and hostPath volumes only for the pod identities (namespace and service account, never a "
         "label) in policies/rules/allow_lists.py, and only the exact capabilities and read-only host paths listed "
         "for each; never privileged or host namespaces.",
    MANDATORY,
    "privileges are exceptions, named and reviewed; a label costs nothing to copy",
)
def check_privileges(res: Resource, ctx: RuleContext) -> list[str]:
    out = []
    for pod in pod_templates(res):
        agent = privileged_agent(res, pod, ctx)
        who = _identity(res, pod)
        if agent is None:
            how = (f"no agent with {who} is allow-listed; add a PrivilegedAgent to policies/rules/allow_lists.py "
                   "with the reason, or drop the privilege")
        else:
            how = (f"{agent.name} ({who}) is allow-listed for capabilities {sorted(agent.capabilities)} and "
                   f"read-only host paths {sorted(agent.host_paths)} only ({agent.reason})")
        for flag in ("hostNetwork", "hostPID", "hostIPC"):
            if pod.spec.get(flag) is True:
                out.append(f"{pod.where}: {flag} is true; no component of this platform needs it — remove it")
        host_paths = {
            str(as_map(v).get("name")): _host_path(as_map(as_map(v).get("hostPath")).get("path"))
            for v in as_seq(pod.spec.get("volumes"))
            if as_map(v).get("hostPath") is not None
        }
        allowed_paths = agent.host_paths if agent is not None else frozenset()
        refused = sorted(p for p in set(host_paths.values()) if p not in allowed_paths)
        if refused:
            out.append(f"{pod.where}: hostPath volumes {refused} are not allow-listed; {how}")
        for where, container in pod.containers():
            sc = as_map(container.get("securityContext"))
            if sc.get("privileged") is True:
                out.append(f"{where}: privileged: true; grant the single capability needed instead "
                           "(e.g. SYS_ADMIN for DCGM profiling) and remove privileged")
            allowed_caps = agent.capabilities if agent is not None else frozenset()
            extra = [c for c in _added_capabilities(container) if c not in allowed_caps]
            if extra:
                out.append(f"{where}: adds capabilities {extra} that are not allow-listed; {how}")
            for mount in (as_map(m) for m in as_seq(container.get("volumeMounts"))):
                name = str(mount.get("name"))
                if name in host_paths and mount.get("readOnly") is not True:
                    out.append(f"{where}: hostPath {host_paths[name]} is mounted read-write; set readOnly: true "
                               "on the volumeMount")
    return out


RBAC_GROUP = "rbac.authorization.k8s.io"
#: Built-in ClusterRoles that grant (nearly) everything in their scope, Secrets and RoleBindings included.
BROAD_ROLES = ("cluster-admin", "admin", "edit")
#: Verbs that let the holder gain permissions it was not given.
ESCALATION_VERBS = {
    "bind": "binds roles the holder does not hold itself",
    "escalate": "lets the holder grant itself any permission",
    "impersonate": "lets the holder act as any user, group or service account",
}
_EXCEPTIONS_FILE = "policies/rules/allow_lists.py"


def rbac_exception(res: Resource, ctx: RuleContext) -> RbacException | None:
    namespace = res.namespace if res.kind in ("Role", "RoleBinding") else ""
    return next((e for e in ctx.rbac_exceptions
                 if (e.kind, e.name, e.namespace) == (res.kind, res.object_name, namespace)), None)


def _rbac_rules(res: Resource) -> list[tuple[int, Mapping[str, Any]]]:
    if res.kind not in ("Role", "ClusterRole") or res.group != RBAC_GROUP:
        return []
    return [(i, as_map(r)) for i, r in enumerate(as_seq(res.props.get("rules")))]


def _unexcepted(resources: list[str], verbs: list[str], exception: RbacException | None) -> list[str]:
    """The verbs of ``verbs`` the exception does not grant on every one of ``resources``."""
    granted = exception.grants if exception is not None else frozenset()
    return [v for v in verbs if not all((r, v) in granted for r in resources)]


@rule(
    "rbac-least-privilege",
    "RBAC rules list no wildcard verbs, resources or apiGroups; nothing binds "
         "cluster-admin, admin or edit unless policies/rules/allow_lists.py excepts that binding with a reason.",
    MANDATORY,
    "a wildcard grants tomorrow's resources too; admin and edit include every Secret and RoleBinding",
)
def check_rbac(res: Resource, ctx: RuleContext) -> list[str]:
    out = []
    for index, entry in _rbac_rules(res):
        for fld in ("verbs", "resources", "apiGroups", "nonResourceURLs"):
            if "*" in as_seq(entry.get(fld)):
                out.append(f"rules[{index}].{fld} contains '*'; list the exact {fld} the component uses "
                           "(least privilege)")
    if res.kind in ("RoleBinding", "ClusterRoleBinding"):
        ref = as_map(res.props.get("roleRef"))
        name = ref.get("name")
        exception = rbac_exception(res, ctx)
        if ref.get("kind", "ClusterRole") == "ClusterRole" and name in BROAD_ROLES and not (
                exception is not None and name in exception.role_refs):
            if name == "cluster-admin":
                out.append("binds cluster-admin; bind a ClusterRole that lists only the verbs and resources needed")
            else:
                out.append(f"binds the built-in ClusterRole '{name}' (every namespaced resource, Secrets and "
                           "RoleBindings included); bind a role that lists only the verbs and resources needed, or "
                           f"except this binding with its reason in {_EXCEPTIONS_FILE}")
    return out


@rule(
    "rbac-no-escalation",
    "No role grants bind, escalate or impersonate, and no ClusterRole creates serviceaccounts/token (a token for "
         "any service account), unless policies/rules/allow_lists.py excepts that grant with a reason.",
    MANDATORY,
    "each of these turns a narrow grant into any grant: the holder binds, writes or borrows permissions it was "
    "never given",
)
def check_rbac_escalation(res: Resource, ctx: RuleContext) -> list[str]:
    out = []
    exception = rbac_exception(res, ctx)
    fix = f"remove the grant, or except it with its reason in {_EXCEPTIONS_FILE}"
    for index, entry in _rbac_rules(res):
        resources = [str(r) for r in as_seq(entry.get("resources"))]
        verbs = [str(v) for v in as_seq(entry.get("verbs"))]
        for verb in _unexcepted(resources, [v for v in verbs if v in ESCALATION_VERBS], exception):
            out.append(f"rules[{index}] grants '{verb}' on {resources}, which {ESCALATION_VERBS[verb]}; {fix}")
        if res.kind == "ClusterRole" and "serviceaccounts/token" in resources and "create" in verbs and _unexcepted(
                ["serviceaccounts/token"], ["create"], exception):
            out.append(f"rules[{index}] grants 'create' on serviceaccounts/token cluster-wide: a token for any "
                       f"service account in any namespace; use a Role in the namespace whose accounts it needs "
                       f"(with resourceNames), or except it with its reason in {_EXCEPTIONS_FILE}")
    return out


@rule(
    "rbac-cluster-secrets",
    "No ClusterRole grants access to Secrets (every Secret of every namespace) unless policies/rules/allow_lists.py "
         "excepts exactly those verbs for that role with a reason.",
    MANDATORY,
    "a cluster-wide Secret read holds every credential of the cluster, service-account tokens included",
)
def check_rbac_cluster_secrets(res: Resource, ctx: RuleContext) -> list[str]:
    if res.kind != "ClusterRole":
        return []
    out = []
    exception = rbac_exception(res, ctx)
    for index, entry in _rbac_rules(res):
        groups = [str(g) for g in as_seq(entry.get("apiGroups"))]
        if "secrets" not in as_seq(entry.get("resources")) or not ({"", "*"} & set(groups)):
            continue
        verbs = _unexcepted(["secrets"], [str(v) for v in as_seq(entry.get("verbs"))], exception)
        if verbs:
            allowed = sorted(v for r, v in exception.grants if r == "secrets") if exception is not None else []
            excepted = f" (excepted: {allowed})" if allowed else ""
            out.append(f"rules[{index}] grants {verbs} on secrets cluster-wide{excepted}; "
                       "use a Role in the namespace that holds the Secret, with resourceNames, or except the verbs "
                       f"with their reason in {_EXCEPTIONS_FILE}")
    return out


#: Verbs that change a pod (or act on it through a subresource: evict, bind, exec, status…).
POD_WRITE_VERBS = ("create", "update", "patch", "delete", "deletecollection")


def _pod_resources(entry: Mapping[str, Any]) -> list[str]:
    """The pod resources and subresources (``pods``, ``pods/eviction``…, or ``*``) a rule of the core group names."""
    if not ({"", "*"} & {str(g) for g in as_seq(entry.get("apiGroups"))}):
        return []
    return [str(r) for r in as_seq(entry.get("resources")) if str(r) in ("pods", "*") or str(r).startswith("pods/")]


@rule(
    "rbac-cluster-pod-writes",
    "No ClusterRole writes pods (create, update, patch, delete, deletecollection on pods or a pods/ subresource such "
         "as pods/eviction) cluster-wide unless policies/rules/allow_lists.py excepts exactly those grants for that "
         "role with a reason; controllers read cluster-wide and write with a Role in each namespace where they act.",
    MANDATORY,
    "a cluster-wide pod write lets one controller's bug or stolen token evict or rewrite every workload of the "
    "cluster, system pods included",
)
def check_rbac_cluster_pod_writes(res: Resource, ctx: RuleContext) -> list[str]:
    if res.kind != "ClusterRole":
        return []
    out = []
    exception = rbac_exception(res, ctx)
    for index, entry in _rbac_rules(res):
        resources = _pod_resources(entry)
        verbs = [str(v) for v in as_seq(entry.get("verbs")) if str(v) in (*POD_WRITE_VERBS, "*")]
        for resource in resources:
            refused = _unexcepted([resource], verbs, exception)
            if refused:
                out.append(f"rules[{index}] grants {refused} on {resource} cluster-wide; keep list/watch here and "
                           f"write with a Role in each namespace where the controller acts (training, inference), or "
                           f"except the grant with its reason in {_EXCEPTIONS_FILE}")
    return out


_CREDENTIAL_ENV = re.compile(r"(^|_)(PASSWORD|PASSWD|TOKEN|API_KEY|APIKEY|SECRET|SECRET_KEY|ACCESS_KEY|CREDENTIALS?)$")


_CREDENTIAL_PROP = {"kubeconfig", "password", "token", "apiKey", "clientSecret", "secretKey", "accessKey"}


def _leaks(value: Any, ctx: RuleContext) -> bool:
    if not isinstance(value, str) or value == "" or value == SECRET_PLACEHOLDER:
        return False
    if ctx.secrets_marked:
        return True
    return value in ctx.plain_config_values


#: ``scheme://user:password@host``; a password that is only a ``$(VAR)`` / ``${VAR}`` reference is not literal.
_URL_PASSWORD = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*)://(?P<user>[^\s/:@]*):(?P<password>[^\s/@]+)@")
_VARIABLE = re.compile(r"^\$(\([A-Za-z_][A-Za-z0-9_]*\)|\{[A-Za-z_][A-Za-z0-9_]*\})$")


def url_passwords(text: str) -> list[str]:
    """Each URL in ``text`` that embeds a literal password, shown without it (``amqps://worker:…@``)."""
    return [f"{m['scheme']}://{m['user']}:…@" for m in _URL_PASSWORD.finditer(text)
            if not _VARIABLE.match(m["password"])]


@rule(
    "no-plain-credentials",
    "Credentials come from Pulumi secrets: Secret data and provider credentials are "
         "secret values, env credentials use secretKeyRef, and no URL in a container's env, args or command or "
         "in a ConfigMap embeds a password (scheme://user:password@host).",
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
            for path, text in strings({k: container.get(k) for k in ("env", "args", "command")}):
                for url in url_passwords(text):
                    out.append(f"{where}.{path}: the URL {url} embeds a password; keep the URL in a Secret from "
                               "secret config and read it with valueFrom.secretKeyRef, or write the password as "
                               "$(VAR) from a secretKeyRef variable")
    if res.kind == "ConfigMap":
        for path, text in strings(res.props.get("data")):
            for url in url_passwords(text):
                out.append(f"data.{path}: the URL {url} embeds a password; a ConfigMap is plain text in the state "
                           "and the cluster — move the URL to a Secret from secret config")
    return out
