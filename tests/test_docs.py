"""The documentation as a house: the README stays a front door, every page is reachable from it, every link
lands, and no hand-written page copies a figure that `make bench` produces (those go stale in silence)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from components.mockrt import ROOT

README = ROOT / "README.md"
DOCS = ROOT / "docs"
# Pages written by a command, checked for staleness by their own tests.
GENERATED = {"configuration.md", "policies.md"}
_LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")
# What a benchmark figure looks like: a thousands-separated count or a percentage with decimals; a cluster
# size ("4,096 GPUs") is a scenario, not a result.
_FIGURE = re.compile(r"\b\d{1,3}(?:,\d{3})+\b(?! (?:on-prem )?GPUs)|\b\d+\.\d+ ?%")


def _figures(text: str) -> set[str]:
    """The figures in ``text``, spelled alike ("99.9 %" and "99.9%" are one figure)."""
    return {token.replace(" ", "") for token in _FIGURE.findall(text)}


def pages() -> list[Path]:
    return sorted(DOCS.glob("*.md"))


def test_the_readme_is_a_front_door() -> None:
    size = len(README.read_bytes())
    assert size <= 12 * 1024, f"README.md is {size:,} bytes; move the topic to a page under docs/ and link it"


def test_every_page_is_reachable_from_the_readme() -> None:
    linked = {Path(target).name for target in _LINK.findall(README.read_text(encoding="utf-8"))
              if target.startswith("docs/")}
    unlinked = [page.name for page in pages() if page.name not in linked and page.suffix == ".md"]
    assert not unlinked, f"docs pages the README does not link: {unlinked}"


@pytest.mark.parametrize("doc", [README, ROOT / "CONTRIBUTING.md", *pages()], ids=lambda p: p.name)
def test_every_relative_link_lands(doc: Path) -> None:
    broken = [target for target in _LINK.findall(doc.read_text(encoding="utf-8"))
              if "://" not in target and not target.startswith("mailto:")
              and not (doc.parent / target).exists()]
    assert not broken, f"{doc.relative_to(ROOT)} links to missing files: {broken}"


@pytest.mark.parametrize("doc", [README, *(p for p in pages() if p.name not in GENERATED)], ids=lambda p: p.name)
def test_no_page_copies_a_benchmark_figure(doc: Path) -> None:
    report = (ROOT / "bench" / "report.md").read_text(encoding="utf-8")
    produced = _figures(report)
    copied = sorted(_figures(doc.read_text(encoding="utf-8")) & produced)
    assert not copied, (f"{doc.relative_to(ROOT)} copies figures that `make bench` writes to bench/report.md: "
                        f"{copied}; link to the report instead")
