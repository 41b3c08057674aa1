"""ib-exporter side by side with Debian's node_exporter 1.5 (infiniband collector only) on one fake tree.

node_exporter is the reference for names and units: every series it exports must exist in ours under
its name minus ``node_`` and carry exactly the same value. The binary comes from `make observability-tools`.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from bench.bench_ib import fetch, ib_exporter, node_exporter
from fakes.ib_sysfs import (
    MLX5_HW_COUNTER_FILES,
    PORT_COUNTER_FILES,
    FakeHca,
    FakePort,
    numbered,
    write_tree,
)

Key = tuple[str, tuple[tuple[str, str], ...]]


def series(text: str, prefix: str) -> dict[Key, float]:
    out: dict[Key, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.startswith(prefix):
                out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def peer_series(text: str) -> dict[Key, float]:
    return {(name.removeprefix("node_"), labels): v for (name, labels), v in series(text, "node_infiniband_").items()}


def without(names: tuple[str, ...], *dropped: str) -> list[str]:
    return [n for n in names if n not in dropped]


@pytest.fixture
def shared_tree(tmp_path: Path) -> Path:
    """Several HCAs: NDR IB with full hw_counters, a down HDR port, a dual-port RoCE NIC without
    hw_counters, an SDR port with a fractional rate, a port whose PMA lacks port_xmit_wait and one
    that answers "N/A" for link_downed. Values are distinct per file and large (2^40-ish) so that the
    x4 word conversion and float formatting are exercised."""
    big = 1 << 40
    write_tree(
        str(tmp_path),
        [
            FakeHca(
                "mlx5_0",
                [
                    FakePort(
                        counters=numbered(PORT_COUNTER_FILES, big, 1_000_003),
                        hw_counters=numbered(MLX5_HW_COUNTER_FILES, 7, 11),
                    )
                ],
            ),
            FakeHca(
                "mlx5_1",
                [
                    FakePort(
                        state="1: DOWN",
                        phys_state="2: Polling",
                        rate="200 Gb/sec (4X HDR)",
                        counters=numbered(PORT_COUNTER_FILES, 0, 1),
                        hw_counters=numbered(MLX5_HW_COUNTER_FILES, 0, 0),
                    )
                ],
                hca_type="MT4123",
                fw_ver="20.39.1002",
            ),
            FakeHca(
                "mlx5_2",
                [
                    FakePort(
                        1,
                        rate="100 Gb/sec (4X EDR)",
                        link_layer="Ethernet",
                        counters=numbered(PORT_COUNTER_FILES, 5000, 13),
                    ),
                    FakePort(
                        2,
                        state="4: ACTIVE",
                        phys_state="5: LinkUp",
                        rate="25 Gb/sec (1X EDR)",
                        link_layer="Ethernet",
                        counters=numbered(without(PORT_COUNTER_FILES, "port_xmit_wait"), 9000, 17),
                    ),
                ],
                board_id="MT_0000000010",
                hca_type="MT4119",
                fw_ver="16.35.2000",
            ),
            FakeHca(
                "mlx4_0",
                [
                    FakePort(
                        rate="2.5 Gb/sec (1X SDR)",
                        counters={
                            **numbered(PORT_COUNTER_FILES, 123_456_789, 101),
                            "link_downed": "N/A (no PMA)",
                        },
                    )
                ],
                board_id="MT_1090120019",
                hca_type="MT26428",
                fw_ver="2.9.1000",
            ),
        ],
    )
    return tmp_path


def test_every_node_exporter_series_exists_in_ours_with_the_same_value(shared_tree: Path) -> None:
    with ib_exporter(str(shared_tree)) as ours_url, node_exporter(str(shared_tree)) as peer_url:
        ours = series(fetch(ours_url), "infiniband_")
        peer_text = fetch(peer_url)
    peer = peer_series(peer_text)
    # 5 ports x (state, phys, rate) + 4 info + 22 counters on 4 ports and 20 on two special ones:
    # mlx5_2 port 2 lacks port_xmit_wait, mlx4_0 reports link_downed as N/A.
    assert len(peer) == 5 * 3 + 4 + 22 * 3 + 21 * 2
    assert peer.keys() - ours.keys() == set()
    mismatched = {key: (peer[key], ours[key]) for key in peer if peer[key] != ours[key]}
    assert mismatched == {}
    # Spot checks that the comparison is about real numbers, not two empty outputs agreeing.
    assert peer[("infiniband_port_data_received_bytes_total", (("device", "mlx5_0"), ("port", "1")))] == float(
        ((1 << 40) + 7 * 1_000_003) * 4
    )
    assert peer[("infiniband_rate_bytes_per_second", (("device", "mlx4_0"), ("port", "1")))] == 312_500_000.0
    assert ("infiniband_link_downed_total", (("device", "mlx4_0"), ("port", "1"))) not in ours


def test_series_only_we_export(shared_tree: Path) -> None:
    """What node_exporter 1.5 cannot tell: mlx5 hw_counters and the link layer (IB or RoCE)."""
    with ib_exporter(str(shared_tree)) as ours_url, node_exporter(str(shared_tree)) as peer_url:
        ours = series(fetch(ours_url), "infiniband_")
        peer = peer_series(fetch(peer_url))
    extra = {name for (name, _) in ours.keys() - peer.keys()}
    hw = {name for name in extra if name.startswith("infiniband_hw_")}
    assert len(hw) == len(MLX5_HW_COUNTER_FILES) - 1  # all but lifespan
    assert extra - hw == {
        "infiniband_port_info",
        "infiniband_exporter_scrape_errors_total",
        "infiniband_exporter_scrapes_total",
        "infiniband_exporter_devices",
        "infiniband_exporter_scrape_duration_seconds",
    }
    # mlx4_0's "N/A" link_downed is the only file not exported: counted as unsupported, not garbage.
    errors = {dict(labels)["reason"]: v for (name, labels), v in ours.items()
              if name == "infiniband_exporter_scrape_errors_total" and v}
    assert errors == {"unsupported": 1.0}


def test_one_garbage_file_blinds_node_exporter_but_not_us(shared_tree: Path) -> None:
    """node_exporter 1.5 fails its whole infiniband collector on one unparsable counter; we skip that one
    series, count it, and keep reporting every other port."""
    with ib_exporter(str(shared_tree)) as ours_url:
        clean = series(fetch(ours_url), "infiniband_")
    (shared_tree / "class/infiniband/mlx5_1/ports/1/counters/symbol_error").write_text("garbage\n")
    with ib_exporter(str(shared_tree)) as ours_url, node_exporter(str(shared_tree)) as peer_url:
        ours = series(fetch(ours_url), "infiniband_")
        peer_text = fetch(peer_url)
    assert peer_series(peer_text) == {}
    assert 'node_scrape_collector_success{collector="infiniband"} 0' in peer_text
    broken = ("infiniband_symbol_error_total", (("device", "mlx5_1"), ("port", "1")))
    assert broken in clean
    assert broken not in ours
    assert ours[("infiniband_exporter_scrape_errors_total", (("reason", "garbage"),))] == 1.0
    volatile = ("infiniband_exporter_scrape_duration_seconds", ())
    untouched = {k: v for k, v in clean.items() if k not in (broken, volatile)}
    untouched.pop(("infiniband_exporter_scrape_errors_total", (("reason", "garbage"),)))
    assert {k: ours[k] for k in untouched} == untouched
