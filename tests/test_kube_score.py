"""kube-score, a second scanner beside checkov, over the rendered built-in objects of every stack.

kube-score is built from its Go module into .state/bin by `make policy-tools` (mk/policy.mk pins the version).
The checks ignored for every object are the flags in mk/policy.mk (KUBE_SCORE_FLAGS), each with its reason in
the comment above it; an object's own ignores are its ``kube-score/ignore`` annotation, listed here with the
reason. What kube-score still reports is listed in OWNED_ELSEWHERE with the component that owns the fix, and
the test fails once one is fixed, to drop its entry.
"""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path

import pytest
import yaml

from components.mockrt import ROOT, RunResult
from components.security import KUBE_SCORE_IGNORE
from tools.policy import write_for_checkov

KUBE_SCORE = ROOT / ".state" / "bin" / "kube-score"
MAKEFILE = ROOT / "mk" / "policy.mk"

#: Per-object ignores of the rendered stacks: (kind, name) -> the checks it silences (reasons beside the code).
OBJECT_IGNORES = {
    ("DaemonSet", "dcgm-exporter"): {"container-security-context-user-group-id", "pod-probes-identical"},
    ("NetworkPolicy", "gateway-to-services"): {"networkpolicy-targets-pod"},
    ("NetworkPolicy", "allow-all"): {"networkpolicy-targets-pod"},
}
#: Critical findings whose fix belongs to another component: (stack, object, message start).
OWNED_ELSEWHERE: dict[str, set[tuple[str, str]]] = {"prod": set(), "local": set()}
CRITICAL = re.compile(r"^\[CRITICAL\] (?P<object>[^:]+): (?P<message>.*)$")


def flags() -> list[str]:
    """KUBE_SCORE_FLAGS from mk/policy.mk, so the test and `make kube-score` ignore the same checks."""
    text = MAKEFILE.read_text()
    match = re.search(r"^KUBE_SCORE_FLAGS := (.*)$", text, re.MULTILINE)
    assert match, "KUBE_SCORE_FLAGS missing from mk/policy.mk"
    return shlex.split(match.group(1))


def test_every_global_ignore_has_its_reason() -> None:
    comments = [line for line in MAKEFILE.read_text().splitlines() if line.startswith("# ")]
    found = flags()
    items = [f"{flag} {found[i + 1]}" if flag == "--ignore-test" else flag
             for i, flag in enumerate(found) if i == 0 or found[i - 1] != "--ignore-test"]
    assert items == ["--ignore-container-cpu-limit", "--ignore-test container-image-pull-policy"]
    for item in items:
        reason = next((line.split(":", 1)[1] for line in comments if line.startswith(f"# {item}:")), "")
        assert len(reason.strip()) > 20, f"{item} needs its reason in a comment in mk/policy.mk"


def run(directory: Path) -> list[tuple[str, str]]:
    if not KUBE_SCORE.exists():
        pytest.fail(f"{KUBE_SCORE.relative_to(ROOT)} is missing: run `make policy-tools`")
    proc = subprocess.run([str(KUBE_SCORE), "score", *flags(), "-o", "ci", *sorted(map(str, directory.glob("*.yaml")))],
                          capture_output=True, text=True, check=False, timeout=300)
    assert proc.returncode in (0, 1), proc.stderr
    return [(m["object"], m["message"]) for line in proc.stdout.splitlines() if (m := CRITICAL.match(line))]


@pytest.mark.parametrize("stack", ["prod", "local"])
def test_kube_score_finds_nothing_critical_beyond_the_listed(stack: str, request: pytest.FixtureRequest,
                                                             tmp_path: Path) -> None:
    result: RunResult = request.getfixturevalue(stack)
    assert write_for_checkov(result, tmp_path) > 0
    found = run(tmp_path)
    assert set(found) == OWNED_ELSEWHERE[stack], found


@pytest.mark.parametrize("stack", ["prod", "local"])
def test_object_ignores_are_the_listed_ones(stack: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    result: RunResult = request.getfixturevalue(stack)
    write_for_checkov(result, tmp_path)
    ignores = {}
    for path in tmp_path.glob("*.yaml"):
        manifest = yaml.safe_load(path.read_text())
        value = (manifest["metadata"].get("annotations") or {}).get(KUBE_SCORE_IGNORE)
        if value:
            ignores[(manifest["kind"], manifest["metadata"]["name"])] = set(value.split(","))
    # The local stack has no gateway service.
    expected = {k: v for k, v in OBJECT_IGNORES.items() if stack == "prod" or k[1] != "gateway-to-services"}
    assert ignores == expected


def test_an_ignore_is_per_object(tmp_path: Path, prod: RunResult) -> None:
    """Without its annotation the DaemonSet is reported again: the ignore silences that object only."""
    write_for_checkov(prod, tmp_path)
    dcgm = next(p for p in tmp_path.glob("*.yaml") if yaml.safe_load(p.read_text())["metadata"]["name"]
                == "dcgm-exporter" and yaml.safe_load(p.read_text())["kind"] == "DaemonSet")
    manifest = yaml.safe_load(dcgm.read_text())
    del manifest["metadata"]["annotations"][KUBE_SCORE_IGNORE]
    dcgm.write_text(yaml.safe_dump(manifest))
    messages = {message for obj, message in run(tmp_path) if obj.startswith("dcgm-exporter/")}
    assert "Container has the same readiness and liveness probe" in messages
