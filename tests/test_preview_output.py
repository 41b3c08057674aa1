"""``make preview``'s reading of the engine's output: the change summary, the policy verdicts and the
diagnostics come first and exact, the per-object diff goes to a file."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tools import preview
from tools.preview_output import PROTECTED_MARK, read

SAMPLE = f"""note: offline engine run with config changed: kubernetes:renderYamlToDirectory='/x'
Previewing update (prod):
+ pulumi:pulumi:Stack: (create)
    [urn=urn:pulumi:prod::gpu-cluster::pulumi:pulumi:Stack::gpu-cluster-prod]
    + gpu-cluster:index:UnifiedGpuCluster: (create)
        + kubernetes:core/v1:Namespace: (create)
            apiVersion: "v1"
            kind      : "Namespace"
            metadata  : {{
                name  : "gpu-system"
            }}
        ~ kubernetes:apps/v1:Deployment: (update)
          - spec: {{
          }}
        +- kubernetes:core/v1:PersistentVolumeClaim: (replace) {PROTECTED_MARK}
        - kubernetes:core/v1:ConfigMap: (delete)
    --outputs:--
    onpremGpus     : 2048
warning: rendered YAML will contain a secret value in plaintext
Policy Violations:
    [mandatory]  gpu-cluster-policies v0.1.0  checkpoint-protected (kubernetes:core/v1:PersistentVolumeClaim: ckpt)
    - [mandatory]  checkpoint-protected  (kubernetes:core/v1:PersistentVolumeClaim: ckpt)
      a checkpoint claim must be protected and retained on delete
    - [advisory]  inference-topology  (kubernetes:apps/v1:Deployment: sdxl)
      spread replicas over zones

Resources:
    + 2 to create
    ~ 1 to update
    +-1 to replace
    - 1 to delete
    5 changes

Diagnostics:
  pulumi:pulumi:Stack (gpu-cluster-prod):
    error: preview failed
"""


def test_the_sample_reads_as_a_reviewer_needs_it() -> None:
    report = read(SAMPLE)
    assert report.changes == Counter({
        ("create", "pulumi:pulumi:Stack"): 1, ("create", "gpu-cluster:index:UnifiedGpuCluster"): 1,
        ("create", "kubernetes:core/v1:Namespace"): 1, ("update", "kubernetes:apps/v1:Deployment"): 1,
        ("replace", "kubernetes:core/v1:PersistentVolumeClaim"): 1, ("delete", "kubernetes:core/v1:ConfigMap"): 1,
    })
    assert report.protected == Counter({"replace": 1})
    # What is lost comes first.
    assert report.operations() == ["delete", "replace", "update", "create"]
    assert report.verdicts == Counter({"mandatory": 1, "advisory": 1})
    assert report.blocks["Resources"] == ["Resources:", "    + 2 to create", "    ~ 1 to update", "    +-1 to replace",
                                          "    - 1 to delete", "    5 changes"]
    assert report.blocks["Diagnostics"][-1] == "    error: preview failed"
    assert report.blocks["Policy Violations"][3] == "      a checkpoint claim must be protected and retained on delete"
    assert report.lines == len(SAMPLE.splitlines())


def test_an_empty_or_foreign_output_reads_as_nothing() -> None:
    for text in ("", "\n\n", "error: no stack named 'prod' found\n", "Resources:\n"):
        report = read(text)
        assert not report.changes and not report.verdicts


_TYPES = st.from_regex(r"[a-z][a-z0-9-]{0,8}:[a-z0-9./]{0,12}:[A-Z][A-Za-z0-9]{0,12}", fullmatch=True)
_OPS = st.sampled_from(["create", "update", "delete", "replace", "same", "read", "create-replacement"])
_SYMBOL = {"create": "+ ", "update": "~ ", "delete": "- ", "replace": "+-", "same": "", "read": "> ",
           "create-replacement": "++"}
# Body lines of a diff: indented property lines, none of which ends in "(op)".
_BODY = st.from_regex(r" {4,12}[a-zA-Z0-9_.:\"{}\[\] -]{0,40}[a-zA-Z0-9\"{}\[\]]", fullmatch=True)


@given(st.lists(st.tuples(st.integers(0, 6), _OPS, _TYPES, st.booleans(), st.lists(_BODY, max_size=3)),
                max_size=30))
def test_every_header_is_counted_once_whatever_the_body(
    resources: list[tuple[int, str, str, bool, list[str]]],
) -> None:
    lines, expected, locked = ["Previewing update (s):"], Counter[tuple[str, str]](), Counter[str]()
    for depth, op, rtype, protected, body in resources:
        mark = f" {PROTECTED_MARK}" if protected else ""
        lines.append(f"{'    ' * depth}{_SYMBOL[op]} {rtype}: ({op}){mark}")
        lines.extend(body)
        expected[(op, rtype)] += 1
        locked[op] += protected
    lines += ["Resources:", f"    {len(resources)} changes", ""]
    report = read("\n".join(lines))
    assert report.changes == expected
    assert report.protected == +locked
    assert report.blocks["Resources"] == ["Resources:", f"    {len(resources)} changes"]


@given(st.text(max_size=400))
def test_any_text_reads_without_error(text: str) -> None:
    report = read(text)
    assert sum(report.changes.values()) <= report.lines


def _fake_engine(lines: list[str], rc: int = 0) -> Callable[..., int]:
    def streamed_preview(stack: str, sink: Callable[[str], None], **_: object) -> int:
        for line in lines:
            sink(line)
        return rc

    return streamed_preview


@pytest.mark.parametrize("echo", [False, True])
def test_the_summary_comes_first_and_the_diff_goes_to_a_file(
    echo: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    import tools.engine_runner as runner
    from tools.engine_select import EngineChoice

    monkeypatch.setattr(runner, "engine_available", lambda: True)
    monkeypatch.setattr(runner, "streamed_preview", _fake_engine(SAMPLE.splitlines(), rc=255))
    monkeypatch.setattr(preview, "select_engine", lambda: EngineChoice(kind="built", reason="test"))
    diff = tmp_path / "prod.diff"
    argv = ["--stack", "local", "--diff-file", str(diff)] + (["--diff"] if echo else [])
    assert preview.main(argv) == 255
    out = capsys.readouterr().out
    assert diff.read_text() == SAMPLE
    body_line = '            kind      : "Namespace"'
    assert (body_line in out) is echo, "the per-object diff reaches the terminal only when asked"
    # Live: the engine's warnings as they come; then the change table, the verdicts, the declarations.
    live, summary = out.split("What the engine would change (6 resources)")
    # The provider's render-mode warning (one per Secret, about an `up`) is said once, as what it means here.
    assert "warning: rendered YAML will contain a secret value in plaintext" not in live
    assert "preview: 1 Secret(s) in the stack; the offline engine previews in the provider's render mode" in live
    assert "This preview wrote none" in live
    order = [summary.index(s) for s in ("policy pack: 1 advisory, 1 mandatory",
                                        "checkpoint-protected  (kubernetes:core/v1:PersistentVolumeClaim: ckpt)",
                                        "error: preview failed", "What the stack declares", "full diff: ")]
    assert order == sorted(order), out
    assert f"({len(SAMPLE.splitlines())} lines; `make preview DIFF=1` prints it here)" in out
    assert "Resources registered" not in out, "the engine's counts replace the mock runtime's"


def test_a_preview_with_no_policy_pack_run_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    import tools.engine_runner as runner
    from tools.engine_select import EngineChoice

    monkeypatch.setattr(runner, "engine_available", lambda: True)
    monkeypatch.setattr(runner, "streamed_preview", _fake_engine(["+ pulumi:pulumi:Stack: (create)"]))
    monkeypatch.setattr(preview, "select_engine", lambda: EngineChoice(kind="built", reason="test"))
    assert preview.main(["--stack", "local", "--diff-file", str(tmp_path / "d")]) == 0
    assert "policy pack: the engine reported no policy pack run" in capsys.readouterr().out
