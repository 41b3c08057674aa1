"""The pin table: what a stack deploys is the release the local control plane builds (and the e2e runs)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from components import charts, images, pins
from components.mockrt import RunResult

ROOT = Path(__file__).resolve().parent.parent


def test_every_go_mod_requires_the_pinned_release() -> None:
    # The e2e runs what tools/localcluster/build.sh builds from these go.mod files.
    assert pins.drift() == []
    proven = [p for p in pins.PINS if p.go_mod]
    assert {p.name for p in proven} >= {"volcano", "descheduler"}
    for pin in pins.PINS:
        assert bool(pin.go_module) != bool(pin.unproven), f"{pin.name}: a Go module the local cluster runs, or why not"


def test_drift_names_the_pin_the_file_and_both_versions(tmp_path: Path) -> None:
    gomod = tmp_path / "tools" / "localcluster" / "volcano" / "go.mod"
    gomod.parent.mkdir(parents=True)
    gomod.write_text("module x\n\ngo 1.26.0\n\nrequire (\n\tvolcano.sh/volcano v1.15.0\n)\n")
    (problem,) = pins.drift((pins.VOLCANO,), root=tmp_path)
    assert problem == (
        "volcano: components/pins.py pins v1.14.1 but tools/localcluster/volcano/go.mod requires "
        "volcano.sh/volcano v1.15.0; change both together"
    )
    gomod.write_text("module x\n")
    assert pins.drift((pins.VOLCANO,), root=tmp_path) == [
        "volcano: components/pins.py pins v1.14.1 but tools/localcluster/volcano/go.mod requires "
        "volcano.sh/volcano (nothing); change both together"
    ]
    gomod.unlink()
    assert pins.drift((pins.VOLCANO,), root=tmp_path) == ["volcano: tools/localcluster/volcano/go.mod does not exist"]


def test_go_mod_requires_reads_both_forms_and_ignores_comments() -> None:
    text = (
        "module m\n\ngo 1.26.0\n\nrequire a.io/x v1.2.3\n"
        "require (\n\tb.io/y v0.1.0 // indirect\n\t// c.io/z v9.9.9\n)\n"
        "replace d.io/w => ../w\n"
    )
    assert pins.go_mod_requires(text) == {"a.io/x": "v1.2.3", "b.io/y": "v0.1.0"}


_path = st.from_regex(r"[a-z]{1,8}\.(io|sh|com)/[a-z][a-z0-9-]{0,10}", fullmatch=True)
_version = st.from_regex(r"v[0-9]{1,2}\.[0-9]{1,2}\.[0-9]{1,2}", fullmatch=True)


@given(st.dictionaries(_path, _version, max_size=6), st.booleans())
def test_go_mod_requires_round_trip(requires: dict[str, str], block: bool) -> None:
    if block:
        body = "require (\n" + "".join(f"\t{m} {v} // indirect\n" for m, v in requires.items()) + ")\n"
    else:
        body = "".join(f"require {m} {v}\n" for m, v in requires.items())
    assert pins.go_mod_requires(f"module m\n\ngo 1.26.0\n\n{body}") == requires


def test_stack_deploys_the_pinned_releases(prod: RunResult) -> None:
    (chart,) = prod.by_type("kubernetes:helm.sh/v4:Chart")
    assert chart.inputs["chart"] == charts.VOLCANO.reference == f"volcano.sh/volcano@{pins.VOLCANO.version}/" + \
        "installer/helm/chart/volcano"
    assert chart.inputs["values"]["basic"]["image_tag_version"] == pins.VOLCANO.version
    (desch,) = [c for r in prod.by_kind("CronJob") for c in r.inputs["spec"]["jobTemplate"]["spec"]["template"]
                ["spec"]["containers"] if "descheduler" in c["image"]]
    assert desch["image"].endswith(":" + pins.DESCHEDULER.version)
    assert images.DESCHEDULER.endswith(":v0.36.0")


def test_a_drifted_pin_fails_the_local_build_check(tmp_path: Path) -> None:
    # `python3 -m components.pins check` runs before the local control plane build, with no virtualenv.
    ok = subprocess.run([sys.executable, "-m", "components.pins", "check"], cwd=ROOT, capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    ref = subprocess.run([sys.executable, "-m", "components.pins", "ref", "volcano"], cwd=ROOT, capture_output=True,
                         text=True)
    assert ref.stdout.strip() == "volcano.sh/volcano@v1.14.1"
    bad = subprocess.run([sys.executable, "-m", "components.pins", "ref", "dcgm-exporter"], cwd=ROOT,
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "pin 'dcgm-exporter' has no Go module" in bad.stderr


def test_by_name_lists_the_known_pins() -> None:
    with pytest.raises(KeyError, match="no pin named 'volcan'; known: volcano, descheduler"):
        pins.by_name("volcan")



def test_the_local_build_checks_the_table_and_fetches_by_it() -> None:
    # A pin with a Go module but no go.mod is fetched by name from the table; the build checks the rest first.
    script = (ROOT / "tools" / "localcluster" / "build.sh").read_text()
    assert '-m components.pins check)' in script
    for pin in pins.PINS:
        if pin.go_module and not pin.go_mod:
            assert f"-m components.pins ref {pin.name})" in script, f"build.sh does not fetch {pin.name} by its pin"
