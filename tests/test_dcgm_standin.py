"""The dcgm-exporter stand-in of the real GPU nodes: every field of the stack's counters CSV for every fake GPU,
faults injected through a file, and a bad fault file ignored (the exporter keeps serving)."""

from __future__ import annotations

import json
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from components import dcgm_counters, images
from tools import images as tool
from tools.image_local import agent_plan
from tools.localcluster.dcgm_standin import DCGM_VALUES, Gpu, dcgm_exposition, read_faults
from tools.localcluster.realnodes import IMAGES_BY_KIND, REAL_GPUS_PER_NODE

CSV = dcgm_counters.render()


def _series(text: str) -> dict[tuple[str, str], str]:
    """(field, gpu) -> value of every sample line."""
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, rest = line.split("{", 1)
            labels, value = rest.rsplit("} ", 1)
            gpu = next(p.split("=")[1].strip('"') for p in labels.split(",") if p.startswith("gpu="))
            out[(name, gpu)] = value
    return out


def test_every_field_of_the_stacks_csv_is_served_for_every_gpu_of_the_node() -> None:
    text = dcgm_exposition("real-gpu-01", (Gpu(0), Gpu(1)), CSV)
    fields = [c.field for c in dcgm_counters.parse(CSV)]
    series = _series(text)
    for field in fields:
        if field == "DCGM_EXP_XID_ERRORS_COUNT":
            continue  # series only for an XID seen
        for gpu in ("0", "1"):
            assert series[(field, gpu)] == str(DCGM_VALUES[field])
    assert 'Hostname="real-gpu-01"' in text and 'UUID="GPU-real-gpu-01-0001"' in text
    assert not any(name == "DCGM_EXP_XID_ERRORS_COUNT" for name, _ in series)


def test_an_injected_fault_replaces_one_gpus_reading_and_an_xid_gets_its_series() -> None:
    series = _series(dcgm_exposition("n", (Gpu(0), Gpu(1)), CSV,
                                     {1: {"DCGM_FI_DEV_GPU_TEMP": 91.0, "xid": 79.0}}))
    assert series[("DCGM_FI_DEV_GPU_TEMP", "1")] == "91.0"
    assert series[("DCGM_FI_DEV_GPU_TEMP", "0")] == str(DCGM_VALUES["DCGM_FI_DEV_GPU_TEMP"])
    assert series[("DCGM_EXP_XID_ERRORS_COUNT", "1")] == "1"


def test_the_fault_file_is_read_when_present(tmp_path: Path) -> None:
    path = tmp_path / "faults.json"
    assert read_faults(path) == {}
    path.write_text(json.dumps({"0": {"DCGM_FI_DEV_GPU_TEMP": 88}}))
    assert read_faults(path) == {0: {"DCGM_FI_DEV_GPU_TEMP": 88.0}}


@settings(max_examples=200, deadline=None)
@given(st.one_of(st.binary(max_size=64).map(lambda b: b.decode("latin-1")),
                 st.recursive(st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=5)),
                              lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                      st.dictionaries(st.text(max_size=3), inner, max_size=3)),
                              max_leaves=6).map(json.dumps)))
def test_any_fault_file_is_readings_or_nothing_never_a_crash(tmp_path_factory, text: str) -> None:
    path = tmp_path_factory.mktemp("faults") / "f.json"
    path.write_text(text)
    faults = read_faults(path)
    assert all(isinstance(g, int) and all(isinstance(v, float) for v in f.values()) for g, f in faults.items())


def test_the_stand_in_image_takes_the_stacks_dcgm_reference_and_the_real_nodes_gpu_count() -> None:
    (standin,) = tool.standins()
    assert standin.ref == images.DCGM_EXPORTER and standin.name in IMAGES_BY_KIND["gpu"]
    build = next(s.argv for s in agent_plan(Path("/s"), standin.name, standin.dockerfile, "0.1.0", ref=standin.ref,
                                            build_args=standin.build_args) if "bud" in s.argv)
    assert build[build.index("-t") + 1] == images.DCGM_EXPORTER
    assert f"GPUS={REAL_GPUS_PER_NODE}" in build
    assert tool.base_images(standin.dockerfile.read_text())[0].startswith("python:3.11.11-slim-bookworm@sha256:")
