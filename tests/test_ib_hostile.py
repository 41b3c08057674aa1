"""The InfiniBand exporter on hostile sysfs trees: the corpus (tests/corpus/ib_sysfs) and random trees.

Whatever the tree holds, a scrape must produce an exposition that prometheus_client's parser and
``promtool check metrics`` accept, with no series twice and only finite values, and every file that
is not exported must be accounted for in ``infiniband_exporter_scrape_errors_total``.
"""

from __future__ import annotations

import math
import os
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from agents.ib_exporter import sysfs
from agents.ib_exporter.collector import InfiniBandCollector
from agents.ib_exporter.exposition import render
from tests.corpus.ib_sysfs.cases import CASES, SENTINEL, Case, SeriesKey, build
from tests.corpus.survey import exposition_problem

ERRORS = "infiniband_exporter_scrape_errors_total"
PROMTOOL = shutil.which("promtool")


def scrape_text(root: str) -> bytes:
    return render(InfiniBandCollector(root).collect())


def series(text: bytes) -> dict[SeriesKey, float]:
    out: dict[SeriesKey, float] = {}
    for family in text_string_to_metric_families(text.decode("utf-8")):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def errors_of(s: dict[SeriesKey, float]) -> dict[str, int]:
    return {dict(labels)["reason"]: int(v) for (name, labels), v in s.items() if name == ERRORS and v}


def test_promtool_is_installed() -> None:
    assert PROMTOOL, "promtool is missing: run `make observability-tools`"


def test_corpus_is_not_trivial() -> None:
    assert len(CASES) >= 40
    assert len({case.name for case in CASES}) == len(CASES)
    # Every reason a bad input can produce is exercised by some case.
    produced = {reason for case in CASES for reason in case.errors}
    assert produced == set(sysfs.REASONS) - {sysfs.REASON_WRAPPED, sysfs.REASON_MISSING}


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.name)
def test_corpus_case(case: Case, tmp_path: Path) -> None:
    build(tmp_path, case)
    text = scrape_text(str(tmp_path))
    assert exposition_problem(text) is None
    s = series(text)
    assert errors_of(s) == case.errors, case.why
    assert s[("infiniband_exporter_devices", ())] == case.devices
    if SENTINEL not in case.absent:
        assert s[SENTINEL] == 4.0, "a bad file elsewhere cost a healthy series"
    for key, value in case.present.items():
        assert s[key] == value, key
    for key in case.absent:
        assert key not in s, key


# ---------------------------------------------------------------------------------------- random trees

NAME_BYTES = st.binary(min_size=1, max_size=12).filter(lambda b: b"/" not in b and b"\x00" not in b
                                                       and b not in (b".", b".."))
READABLE_NAMES = st.sampled_from([b"mlx5_0", b"mlx5_1", b"mlx4_0", b"ib\xff", b"caf\xc3\xa9", b'q"\\', b"a\nb"])
HW_NAMES = st.one_of(
    st.sampled_from([b"out_of_sequence", b"out-of-sequence", b"x", b"x_total", b"X", b"Rx.Bytes", b"rx_bytes",
                     b"lifespan", b"np_cnp_sent", b"\xff\xfe", b"d\xc3\xa9bit", b"tx_ms"]),
    NAME_BYTES,
)
CONTENT = st.one_of(
    st.integers(0, 2**64 - 1).map(lambda n: b"%d\n" % n),
    st.integers(2**64, 10**400).map(lambda n: b"%d\n" % n),
    st.sampled_from([b"N/A (no PMA)\n", b"inf\n", b"NaN\n", b"-1\n", b"", b"0x10\n", b"1e3\n", b"\xff\n",
                     b"9" * 5000, b"4: ACTIVE\n", b"1: DOWN\n", b"400 Gb/sec (4X NDR)\n", b"inf Gb/sec\n",
                     b"1e400 Gb/sec\n", b"nan Gb/sec\n", b"InfiniBand\n", b"Ethernet\n", b"N/A\n",
                     b"99999999999999999999999: X\n"]),
    st.binary(max_size=40),
)
PORT_FILES = st.dictionaries(st.sampled_from([b"state", b"phys_state", b"rate", b"link_layer"]), CONTENT)
COUNTER_FILES = st.dictionaries(
    st.one_of(st.sampled_from([b"port_rcv_data", b"port_xmit_data", b"symbol_error", b"link_downed"]), NAME_BYTES),
    CONTENT,
    max_size=6,
)
PORT = st.tuples(st.one_of(st.sampled_from([b"1", b"2"]), NAME_BYTES), PORT_FILES, COUNTER_FILES,
                 st.dictionaries(HW_NAMES, CONTENT, max_size=8))
DEVICE = st.tuples(
    st.one_of(READABLE_NAMES, NAME_BYTES),
    st.dictionaries(st.sampled_from([b"board_id", b"fw_ver", b"hca_type"]), CONTENT),
    st.lists(PORT, max_size=2),
)
TREE = st.lists(DEVICE, max_size=3)

Tree = list[tuple[bytes, dict[bytes, bytes], list[tuple[bytes, dict[bytes, bytes], dict[bytes, bytes],
                                                     dict[bytes, bytes]]]]]


def write_random_tree(root: str, tree: Tree) -> None:
    class_dir = os.path.join(os.fsencode(root), b"class", b"infiniband")
    os.makedirs(class_dir)

    def put(directory: bytes, files: dict[bytes, bytes]) -> None:
        os.makedirs(directory, exist_ok=True)
        for name, content in files.items():
            with open(os.path.join(directory, name), "wb") as handle:
                handle.write(content)

    for device, info, ports in tree:
        device_dir = os.path.join(class_dir, device)
        put(device_dir, info)
        for port, attrs, counters, hw in ports:
            port_dir = os.path.join(device_dir, b"ports", port)
            put(port_dir, attrs)
            put(os.path.join(port_dir, b"counters"), counters)
            put(os.path.join(port_dir, b"hw_counters"), hw)


RANDOM = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@RANDOM
@given(TREE)
def test_any_tree_yields_a_valid_exposition(tree: Tree) -> None:
    with tempfile.TemporaryDirectory(prefix="ib-random-") as root:
        write_random_tree(root, tree)
        collector = InfiniBandCollector(root)
        first = scrape_text(root)
        second = render(collector.collect())
    # Parsed by prometheus_client and by promtool, no series twice (Prometheus drops such scrapes).
    assert exposition_problem(first) is None
    s = series(first)
    assert all(math.isfinite(v) for v in s.values())
    # Deterministic: a second collector on the same tree exports the same series.
    duration = ("infiniband_exporter_scrape_duration_seconds", ())
    again = series(second)
    assert {k for k in s if k != duration} == {k for k in again if k != duration}


HW_ONLY = st.dictionaries(HW_NAMES, CONTENT, max_size=12)


@RANDOM
@given(HW_ONLY)
def test_every_hw_counter_file_is_exported_or_counted(hw: dict[bytes, bytes]) -> None:
    # Only hw_counters are hostile here, so every error belongs to one of them.
    with tempfile.TemporaryDirectory(prefix="ib-hw-") as root:
        write_random_tree(root, [(b"mlx5_0", {}, [(b"1", {b"state": b"4: ACTIVE\n", b"phys_state": b"5: LinkUp\n",
                                                         b"rate": b"400 Gb/sec\n", b"link_layer": b"Ethernet\n"},
                                                  {b"symbol_error": b"4\n"}, hw)])])
        s = series(scrape_text(root))
    exported = [name for (name, _) in s if name.startswith("infiniband_hw_")]
    files = [name for name in hw if name != b"lifespan"]
    assert len(exported) + sum(errors_of(s).values()) == len(files)
    assert s[("infiniband_symbol_error_total", (("device", "mlx5_0"), ("port", "1")))] == 4.0
