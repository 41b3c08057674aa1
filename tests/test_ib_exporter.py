"""InfiniBand exporter against fake sysfs trees written here: exact values, units and error accounting."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from agents.ib_exporter import sysfs
from agents.ib_exporter.cli import main, parse_listen_address
from agents.ib_exporter.collector import COUNTERS, InfiniBandCollector, hw_counter_metric, resolve_hw_names
from agents.ib_exporter.exposition import MetricsServer, ServerLimits, render
from fakes.ib_sysfs import (
    MLX5_HW_COUNTER_FILES,
    PORT_COUNTER_FILES,
    FakeHca,
    FakePort,
    numbered,
    write_tree,
)

Series = dict[tuple[str, tuple[tuple[str, str], ...]], float]

ERRORS = "infiniband_exporter_scrape_errors_total"


def parse(text: str) -> Series:
    out: Series = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def scrape(collector: InfiniBandCollector) -> Series:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    return parse(generate_latest(registry).decode())


def port(name: str, device: str, port_no: str = "1") -> tuple[str, tuple[tuple[str, str], ...]]:
    return (name, (("device", device), ("port", port_no)))


def errors_of(series: Series) -> dict[str, float]:
    return {labels[0][1]: value for (name, labels), value in series.items() if name == ERRORS}


NO_ERRORS = dict.fromkeys(sysfs.REASONS, 0.0)


@pytest.fixture
def mixed_tree(tmp_path: Path) -> Path:
    """Two IB HCAs with hw_counters, a dual-port RoCE HCA without them, and a down IB port."""
    write_tree(
        str(tmp_path),
        [
            FakeHca(
                "mlx5_0",
                [
                    FakePort(
                        counters={
                            "port_rcv_data": "1000",
                            "port_xmit_data": "2500",
                            "port_rcv_packets": "40",
                            "port_xmit_packets": "50",
                            "port_xmit_wait": "123456",
                            "symbol_error": "3",
                            "link_downed": "1",
                            "port_rcv_errors": "7",
                            "VL15_dropped": "2",
                        },
                        hw_counters={
                            "out_of_sequence": "11",
                            "local_ack_timeout_err": "5",
                            "np_cnp_sent": "900",
                            "lifespan": "12",
                        },
                    )
                ],
            ),
            FakeHca(
                "mlx5_1",
                [
                    FakePort(
                        state="1: DOWN",
                        phys_state="3: Disabled",
                        rate="10 Gb/sec (4X)",
                        counters={"port_rcv_data": "0", "link_downed": "4"},
                        hw_counters={"packet_seq_err": "8"},
                    )
                ],
            ),
            FakeHca(
                "mlx5_2",
                [
                    FakePort(
                        1,
                        rate="100 Gb/sec (4X EDR)",
                        link_layer="Ethernet",
                        counters={"port_xmit_data": "10"},
                    ),
                    FakePort(
                        2,
                        state="2: INIT",
                        phys_state="5: LinkUp",
                        rate="2.5 Gb/sec (1X SDR)",
                        link_layer="Ethernet",
                        counters={"port_xmit_data": "3"},
                    ),
                ],
                board_id="MT_0000000010",
                fw_ver="16.35.2000",
                hca_type="MT4119",
            ),
        ],
    )
    return tmp_path


def test_values_and_units(mixed_tree: Path) -> None:
    s = scrape(InfiniBandCollector(str(mixed_tree)))
    # Data counters are 4-byte words in sysfs: the exporter multiplies by four.
    assert s[port("infiniband_port_data_received_bytes_total", "mlx5_0")] == 4000.0
    assert s[port("infiniband_port_data_transmitted_bytes_total", "mlx5_0")] == 10000.0
    assert s[port("infiniband_port_packets_received_total", "mlx5_0")] == 40.0
    assert s[port("infiniband_port_packets_transmitted_total", "mlx5_0")] == 50.0
    assert s[port("infiniband_port_transmit_wait_total", "mlx5_0")] == 123456.0
    assert s[port("infiniband_symbol_error_total", "mlx5_0")] == 3.0
    assert s[port("infiniband_link_downed_total", "mlx5_0")] == 1.0
    assert s[port("infiniband_port_errors_received_total", "mlx5_0")] == 7.0
    assert s[port("infiniband_vl15_dropped_total", "mlx5_0")] == 2.0
    # Rate is reported in decimal Gb/s by the kernel; exported in bytes per second.
    assert s[port("infiniband_rate_bytes_per_second", "mlx5_0")] == 50e9
    assert s[port("infiniband_rate_bytes_per_second", "mlx5_1")] == 1.25e9
    assert s[port("infiniband_rate_bytes_per_second", "mlx5_2", "1")] == 12.5e9
    assert s[port("infiniband_rate_bytes_per_second", "mlx5_2", "2")] == 312.5e6
    assert s[port("infiniband_state_id", "mlx5_0")] == 4.0
    assert s[port("infiniband_physical_state_id", "mlx5_0")] == 5.0
    assert s[port("infiniband_state_id", "mlx5_1")] == 1.0
    assert s[port("infiniband_physical_state_id", "mlx5_1")] == 3.0
    assert s[port("infiniband_state_id", "mlx5_2", "2")] == 2.0
    assert s[port("infiniband_hw_out_of_sequence_total", "mlx5_0")] == 11.0
    assert s[port("infiniband_hw_local_ack_timeout_err_total", "mlx5_0")] == 5.0
    assert s[port("infiniband_hw_np_cnp_sent_total", "mlx5_0")] == 900.0
    assert s[port("infiniband_hw_packet_seq_err_total", "mlx5_1")] == 8.0
    assert s[port("infiniband_port_data_transmitted_bytes_total", "mlx5_2", "2")] == 12.0
    assert errors_of(s) == NO_ERRORS
    assert s[("infiniband_exporter_devices", ())] == 3.0
    assert s[("infiniband_exporter_scrapes_total", ())] == 1.0


def test_info_and_link_layer_labels(mixed_tree: Path) -> None:
    s = scrape(InfiniBandCollector(str(mixed_tree)))
    info = {labels: v for (name, labels), v in s.items() if name == "infiniband_info"}
    assert info == {
        (
            ("board_id", "MT_0000000838"),
            ("device", "mlx5_0"),
            ("firmware_version", "28.39.1002"),
            ("hca_type", "MT4129"),
        ): 1.0,
        (
            ("board_id", "MT_0000000838"),
            ("device", "mlx5_1"),
            ("firmware_version", "28.39.1002"),
            ("hca_type", "MT4129"),
        ): 1.0,
        (
            ("board_id", "MT_0000000010"),
            ("device", "mlx5_2"),
            ("firmware_version", "16.35.2000"),
            ("hca_type", "MT4119"),
        ): 1.0,
    }
    layers = {labels: v for (name, labels), v in s.items() if name == "infiniband_port_info"}
    assert layers == {
        (("device", "mlx5_0"), ("link_layer", "InfiniBand"), ("port", "1")): 1.0,
        (("device", "mlx5_1"), ("link_layer", "InfiniBand"), ("port", "1")): 1.0,
        (("device", "mlx5_2"), ("link_layer", "Ethernet"), ("port", "1")): 1.0,
        (("device", "mlx5_2"), ("link_layer", "Ethernet"), ("port", "2")): 1.0,
    }


def test_ports_without_hw_counters_export_none_and_lifespan_is_not_a_counter(mixed_tree: Path) -> None:
    s = scrape(InfiniBandCollector(str(mixed_tree)))
    hw_devices = {dict(labels)["device"] for (name, labels) in s if name.startswith("infiniband_hw_")}
    assert hw_devices == {"mlx5_0", "mlx5_1"}
    assert not [name for (name, _) in s if "lifespan" in name]


def test_every_standard_counter_and_hw_counter_has_a_series(tmp_path: Path) -> None:
    write_tree(
        str(tmp_path),
        [
            FakeHca(
                "mlx5_0",
                [
                    FakePort(
                        counters=numbered(PORT_COUNTER_FILES, 100),
                        hw_counters=numbered(MLX5_HW_COUNTER_FILES, 500),
                    )
                ],
            )
        ],
    )
    s = scrape(InfiniBandCollector(str(tmp_path)))
    for i, file_name in enumerate(PORT_COUNTER_FILES):
        spec = COUNTERS[file_name]
        assert s[port(spec.metric + "_total", "mlx5_0")] == float((100 + i) * spec.scale), file_name
    for i, file_name in enumerate(MLX5_HW_COUNTER_FILES):
        if file_name == "lifespan":
            continue
        assert s[port(hw_counter_metric(file_name) + "_total", "mlx5_0")] == float(500 + i), file_name
    assert len(COUNTERS) == len(PORT_COUNTER_FILES) == 22


def test_hw_counter_metric_names_are_sanitised() -> None:
    assert hw_counter_metric("out_of_sequence") == "infiniband_hw_out_of_sequence"
    assert hw_counter_metric("Rx-Bytes.v2") == "infiniband_hw_rx_bytes_v2"
    assert hw_counter_metric("tx_total") == "infiniband_hw_tx"


@pytest.mark.parametrize(
    ("files", "kept"),
    [
        ({"out-of-sequence": 1, "out_of_sequence": 2}, {"out_of_sequence": 2}),
        ({"out_of_sequence": 2, "out-of-sequence": 1}, {"out_of_sequence": 2}),
        ({"x_total": 1, "x": 2}, {"x": 2}),
        ({"a.b": 1, "a-b": 2, "A_B": 3}, {"a_b": 3}),  # no exact name: the smallest (upper case first)
        ({"solo_total": 5}, {"solo": 5}),
    ],
)
def test_colliding_hw_counter_names_resolve_the_same_way_in_any_listing_order(
    files: dict[str, int], kept: dict[str, int]
) -> None:
    for order in (list(files.items()), list(reversed(files.items()))):
        assert resolve_hw_names(dict(order)) == (kept, len(files) - 1)


def test_garbage_files_skip_only_their_series(tmp_path: Path) -> None:
    write_tree(
        str(tmp_path),
        [
            FakeHca(
                "mlx5_0",
                [
                    FakePort(
                        state="nonsense",
                        rate="fast",
                        link_layer="",
                        counters={
                            "port_rcv_data": "garbage",
                            "port_xmit_data": "-5",
                            "symbol_error": "0x10",
                            "link_downed": "",
                            "port_rcv_errors": "12",
                        },
                        hw_counters={"out_of_sequence": "1 2", "packet_seq_err": "9"},
                    )
                ],
            )
        ],
    )
    s = scrape(InfiniBandCollector(str(tmp_path)))
    # state, rate, link_layer, 4 counters, 1 hw counter
    assert errors_of(s) == {**NO_ERRORS, "garbage": 8.0}
    assert s[port("infiniband_port_errors_received_total", "mlx5_0")] == 12.0
    assert s[port("infiniband_hw_packet_seq_err_total", "mlx5_0")] == 9.0
    assert s[port("infiniband_physical_state_id", "mlx5_0")] == 5.0
    for gone in (
        "infiniband_state_id",
        "infiniband_rate_bytes_per_second",
        "infiniband_port_data_received_bytes_total",
        "infiniband_port_data_transmitted_bytes_total",
        "infiniband_symbol_error_total",
        "infiniband_link_downed_total",
        "infiniband_hw_out_of_sequence_total",
    ):
        assert port(gone, "mlx5_0") not in s, gone


def test_unsupported_counter_is_skipped_and_counted_apart_from_garbage(tmp_path: Path) -> None:
    write_tree(
        str(tmp_path),
        [
            FakeHca(
                "mlx5_0",
                [FakePort(counters={"port_xmit_wait": "N/A (no PMA)", "symbol_error": "1", "link_downed": "N/B"})],
            )
        ],
    )
    s = scrape(InfiniBandCollector(str(tmp_path)))
    assert port("infiniband_port_transmit_wait_total", "mlx5_0") not in s
    assert s[port("infiniband_symbol_error_total", "mlx5_0")] == 1.0
    # The kernel's N/A is the hardware saying "not here"; anything else unparsable is garbage.
    assert errors_of(s) == {**NO_ERRORS, "unsupported": 1.0, "garbage": 1.0}


def test_missing_files_and_directories(tmp_path: Path) -> None:
    write_tree(
        str(tmp_path),
        [
            FakeHca(
                "mlx5_0",
                [FakePort(state=None, rate=None, counters=None, hw_counters=None)],
                board_id=None,
                hca_type=None,
            ),
            FakeHca("mlx5_1", [FakePort(counters={"symbol_error": "4"})]),
        ],
    )
    s = scrape(InfiniBandCollector(str(tmp_path)))
    # state and rate are part of every port: their absence is counted. counters/hw_counters and the
    # device info attributes are optional and their absence is not an error.
    assert errors_of(s) == {**NO_ERRORS, "missing": 2.0}
    assert s[port("infiniband_physical_state_id", "mlx5_0")] == 5.0
    assert s[port("infiniband_symbol_error_total", "mlx5_1")] == 4.0
    assert (
        "infiniband_info",
        (("board_id", ""), ("device", "mlx5_0"), ("firmware_version", "28.39.1002"), ("hca_type", "")),
    ) in s


def test_no_infiniband_class_means_zero_devices(tmp_path: Path) -> None:
    s = scrape(InfiniBandCollector(str(tmp_path)))
    assert s[("infiniband_exporter_devices", ())] == 0.0
    assert errors_of(s) == NO_ERRORS
    assert not [name for (name, _) in s if not name.startswith("infiniband_exporter_")]


def test_unreadable_and_special_files_do_not_hang_or_crash(tmp_path: Path) -> None:
    write_tree(str(tmp_path), [FakeHca("mlx5_0", [FakePort(counters={"symbol_error": "4"})])])
    counters = tmp_path / "class/infiniband/mlx5_0/ports/1/counters"
    (counters / "port_rcv_errors").symlink_to(counters / "port_rcv_errors")  # ELOOP on open
    os.mkfifo(counters / "port_xmit_wait")  # would block a plain open()
    (counters / "link_downed").mkdir()  # not a file at all
    s = scrape(InfiniBandCollector(str(tmp_path)))
    # The loop is unreadable; the writer-less FIFO reads as empty, which is garbage; a directory is skipped.
    assert errors_of(s) == {**NO_ERRORS, "unreadable": 1.0, "garbage": 1.0}
    assert s[port("infiniband_symbol_error_total", "mlx5_0")] == 4.0


def test_device_removed_mid_scrape(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_tree(
        str(tmp_path),
        [
            FakeHca(name, [FakePort(counters={"symbol_error": "4"}, hw_counters={"out_of_sequence": "1"})])
            for name in ("mlx5_0", "mlx5_1", "mlx5_2")
        ],
    )
    victim = str(tmp_path / "class/infiniband/mlx5_1")
    real_read = sysfs._read

    def read_then_unplug(path: str) -> bytes:
        data = real_read(path)
        if path.endswith("mlx5_1/ports/1/counters/symbol_error"):
            shutil.rmtree(victim)  # the HCA goes away while its counters are being read
        return data

    monkeypatch.setattr(sysfs, "_read", read_then_unplug)
    s = scrape(InfiniBandCollector(str(tmp_path)))
    assert errors_of(s) == {**NO_ERRORS, "device_vanished": 1.0}
    devices = {dict(labels).get("device") for (name, labels) in s if name == "infiniband_symbol_error_total"}
    assert devices == {"mlx5_0", "mlx5_2"}
    assert s[("infiniband_exporter_devices", ())] == 2.0


def test_device_listed_then_gone_before_first_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_tree(str(tmp_path), [FakeHca(n, [FakePort()]) for n in ("mlx5_0", "mlx5_1")])
    victim = str(tmp_path / "class/infiniband/mlx5_1")
    real_read = sysfs._read

    def unplug_before(path: str) -> bytes:
        if path == victim + "/board_id":
            shutil.rmtree(victim)
        return real_read(path)

    monkeypatch.setattr(sysfs, "_read", unplug_before)
    s = scrape(InfiniBandCollector(str(tmp_path)))
    assert errors_of(s) == {**NO_ERRORS, "device_vanished": 1.0}
    assert s[("infiniband_exporter_devices", ())] == 1.0


def test_counter_that_wraps_is_skipped_once_then_rebased(tmp_path: Path) -> None:
    write_tree(
        str(tmp_path),
        [
            FakeHca(
                "mlx5_0",
                [FakePort(counters={"port_xmit_data": "4294967290", "symbol_error": "2"})],
            )
        ],
    )
    collector = InfiniBandCollector(str(tmp_path))
    first = scrape(collector)
    assert first[port("infiniband_port_data_transmitted_bytes_total", "mlx5_0")] == 4294967290.0 * 4
    (tmp_path / "class/infiniband/mlx5_0/ports/1/counters/port_xmit_data").write_text("5\n")
    second = scrape(collector)
    assert port("infiniband_port_data_transmitted_bytes_total", "mlx5_0") not in second
    assert second[port("infiniband_symbol_error_total", "mlx5_0")] == 2.0
    assert errors_of(second) == {**NO_ERRORS, "counter_wrapped": 1.0}
    (tmp_path / "class/infiniband/mlx5_0/ports/1/counters/port_xmit_data").write_text("9\n")
    third = scrape(collector)
    assert third[port("infiniband_port_data_transmitted_bytes_total", "mlx5_0")] == 36.0
    # The error total is cumulative: the wrap stays counted.
    assert errors_of(third) == {**NO_ERRORS, "counter_wrapped": 1.0}
    assert third[("infiniband_exporter_scrapes_total", ())] == 3.0


def test_replaced_hca_is_not_mistaken_for_a_wrap(tmp_path: Path) -> None:
    write_tree(str(tmp_path), [FakeHca("mlx5_0", [FakePort(counters={"symbol_error": "90"})])])
    collector = InfiniBandCollector(str(tmp_path))
    assert scrape(collector)[port("infiniband_symbol_error_total", "mlx5_0")] == 90.0
    shutil.rmtree(tmp_path / "class/infiniband/mlx5_0")
    assert scrape(collector)[("infiniband_exporter_devices", ())] == 0.0
    write_tree(str(tmp_path), [FakeHca("mlx5_0", [FakePort(counters={"symbol_error": "1"})])])
    s = scrape(collector)
    assert s[port("infiniband_symbol_error_total", "mlx5_0")] == 1.0
    assert errors_of(s) == NO_ERRORS


def test_parse_helpers() -> None:
    assert sysfs.parse_id_state(b"4: ACTIVE\n") == 4
    assert sysfs.parse_id_state(b"5: LinkUp\n") == 5
    assert sysfs.parse_rate(b"400 Gb/sec (4X NDR)\n") == 50e9
    assert sysfs.parse_rate(b"2.5 Gb/sec (1X SDR)\n") == 312.5e6
    assert sysfs.parse_counter(b"18446744073709551615\n") == 18446744073709551615
    for unsupported in (b"N/A (no PMA)\n", b"N/A\n"):
        with pytest.raises(sysfs.Unsupported):
            sysfs.parse_counter(unsupported)
    with pytest.raises(sysfs.Unsupported):
        sysfs.parse_rate(b"N/A\n")
    for bad in (b"ACTIVE", b"x: ACTIVE", b"-1: DOWN", b"256: X", b"9" * 400 + b": X"):
        with pytest.raises(sysfs.Garbage):
            sysfs.parse_id_state(bad)
    for bad in (b"", b"400", b"400 Mb/sec", b"nan Gb/sec", b"-1 Gb/sec", b"inf Gb/sec", b"1e400 Gb/sec",
                b"1e308 Gb/sec"):
        with pytest.raises(sysfs.Garbage):
            sysfs.parse_rate(bad)
    for bad in (b"", b"-1", b"+1", b"1.5", b"0x1", b"1\x00", b"inf", b"NaN", b"18446744073709551616",
                b"9" * 400):
        with pytest.raises(sysfs.Garbage):
            sysfs.parse_counter(bad)


def test_listen_address_parsing() -> None:
    assert parse_listen_address("0.0.0.0:9315") == ("0.0.0.0", 9315)
    assert parse_listen_address("[::]:9315") == ("::", 9315)
    assert parse_listen_address(":9000") == ("0.0.0.0", 9000)
    for bad in ("9315", "host:", "host:0", "host:70000", "host:port"):
        with pytest.raises(Exception, match="listen-address"):
            parse_listen_address(bad)


def test_once_prints_one_scrape(mixed_tree: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--sysfs-root", str(mixed_tree), "--once"]) == 0
    s = parse(capsys.readouterr().out)
    assert s[port("infiniband_port_data_received_bytes_total", "mlx5_0")] == 4000.0
    # Only our collector is registered: no process_/python_ series that would describe the container.
    assert {name.split("_")[0] for (name, _) in s} == {"infiniband"}


def test_console_script_once(mixed_tree: Path) -> None:
    script = Path(sys.executable).parent / "ib-exporter"
    out = subprocess.run(
        [str(script), "--sysfs-root", str(mixed_tree), "--once"], capture_output=True, text=True, check=True
    ).stdout
    assert 'infiniband_port_transmit_wait_total{device="mlx5_0",port="1"} 123456\n' in out


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_serves_http_and_stops_on_sigterm(mixed_tree: Path) -> None:
    listen = _free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "agents.ib_exporter.cli",
            "--sysfs-root",
            str(mixed_tree),
            "--listen-address",
            f"127.0.0.1:{listen}",
        ],
        stderr=subprocess.PIPE,
    )
    try:
        body = ""
        for _ in range(200):  # wait for the listener; the assertion below is on content, not on time
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{listen}/metrics") as response:
                    body = response.read().decode()
                break
            except OSError:
                time.sleep(0.05)
        assert parse(body)[port("infiniband_port_data_transmitted_bytes_total", "mlx5_2", "1")] == 40.0
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_fast_renderer_matches_prometheus_client_exposition(mixed_tree: Path) -> None:
    # A board id with a quote, a backslash and a newline exercises label-value escaping.
    (mixed_tree / "class/infiniband/mlx5_2/board_id").write_text('MT"1\\0\n2\n')
    ours = parse(render(InfiniBandCollector(str(mixed_tree)).collect()).decode())
    reference = scrape(InfiniBandCollector(str(mixed_tree)))
    duration = ("infiniband_exporter_scrape_duration_seconds", ())
    assert ours.pop(duration) >= 0.0
    assert reference.pop(duration) >= 0.0
    assert ours == reference
    assert (
        "infiniband_info",
        (
            ("board_id", 'MT"1\\0\n2'),
            ("device", "mlx5_2"),
            ("firmware_version", "16.35.2000"),
            ("hca_type", "MT4119"),
        ),
    ) in ours


# ------------------------------------------------------------------ the HTTP server's limits


def _get(address: tuple[str, int], request: bytes = b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n") -> bytes:
    with socket.create_connection(address, timeout=30) as sock:
        sock.sendall(request)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


@pytest.fixture
def small_server(mixed_tree: Path) -> Iterator[MetricsServer]:
    limits = ServerLimits(max_connections=16, idle_timeout_seconds=30.0)
    server = MetricsServer(InfiniBandCollector(str(mixed_tree)), "127.0.0.1", 0, limits).start()
    yield server
    server.shutdown()


def test_server_answers_metrics_health_and_refuses_the_rest(small_server: MetricsServer) -> None:
    metrics = _get(small_server.address)
    head, _, body = metrics.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 OK") and b"Connection: close" in head
    assert f"Content-Length: {len(body)}".encode() in head
    assert parse(body.decode())[port("infiniband_port_data_transmitted_bytes_total", "mlx5_2", "1")] == 40.0
    assert _get(small_server.address, b"GET /healthz HTTP/1.0\r\n\r\n").startswith(b"HTTP/1.1 200")
    assert _get(small_server.address, b"HEAD /metrics HTTP/1.1\r\n\r\n").endswith(b"\r\n\r\n")
    assert _get(small_server.address, b"GET /nope HTTP/1.1\r\n\r\n").startswith(b"HTTP/1.1 404")
    assert _get(small_server.address, b"POST /metrics HTTP/1.1\r\n\r\n").startswith(b"HTTP/1.1 405")
    assert _get(small_server.address, b"\x16\x03\x01 hello\r\n\r\n").startswith(b"HTTP/1.1 400")


def test_idle_sockets_are_bounded_and_do_not_lock_out_a_scrape(small_server: MetricsServer) -> None:
    threads_before = threading.active_count()
    idle = [socket.create_connection(small_server.address, timeout=30) for _ in range(200)]
    try:
        body = _get(small_server.address).partition(b"\r\n\r\n")[2]
        assert parse(body.decode())[port("infiniband_symbol_error_total", "mlx5_0")] == 3.0
        # The scrape above was answered after the server had seen every idle socket before it.
        assert small_server.open_connections() <= 16
        assert small_server.stats.evicted >= 200 - 16
        assert threading.active_count() == threads_before  # no thread per connection
        # An evicted socket is closed by the server: the client reads end of stream.
        assert idle[0].recv(1) == b""
    finally:
        for sock in idle:
            sock.close()


def test_idle_connection_is_closed_after_the_timeout(mixed_tree: Path) -> None:
    limits = ServerLimits(idle_timeout_seconds=0.2)
    server = MetricsServer(InfiniBandCollector(str(mixed_tree)), "127.0.0.1", 0, limits).start()
    try:
        with socket.create_connection(server.address, timeout=30) as sock:
            sock.sendall(b"GET /metrics HTTP/1.1\r\n")  # a request head that never ends
            assert sock.recv(1) == b""  # closed by the server, not by the 30 s client timeout
        assert server.stats.timed_out == 1
        assert server.stats.served == 0
    finally:
        server.shutdown()


def test_oversized_request_head_is_dropped(small_server: MetricsServer) -> None:
    with socket.create_connection(small_server.address, timeout=30) as sock:
        sock.sendall(b"GET /metrics HTTP/1.1\r\nX: " + b"a" * 20_000)
        received = b""
        with contextlib.suppress(ConnectionResetError):
            while chunk := sock.recv(65536):
                received += chunk
    assert received == b""
    assert small_server.stats.oversized == 1


def test_a_client_that_does_not_read_holds_no_one_up(tmp_path: Path) -> None:
    write_tree(
        str(tmp_path),
        [
            FakeHca(f"mlx5_{i}", [FakePort(counters=numbered(PORT_COUNTER_FILES, 10**15),
                                           hw_counters=numbered(MLX5_HW_COUNTER_FILES, 10**15))])
            for i in range(64)
        ],
    )
    limits = ServerLimits(max_pending_writes=2, send_timeout_seconds=30.0, send_buffer_bytes=4096)
    server = MetricsServer(InfiniBandCollector(str(tmp_path)), "127.0.0.1", 0, limits).start()
    stalled: list[socket.socket] = []
    try:
        for _ in range(4):  # more stalled readers than pending writes are kept for
            sock = socket.socket()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connect: a small window
            sock.connect(server.address)
            sock.sendall(b"GET /metrics HTTP/1.1\r\n\r\n")
            stalled.append(sock)
        body = _get(server.address).partition(b"\r\n\r\n")[2]
        assert parse(body.decode())[port("infiniband_symbol_error_total", "mlx5_63")] == float(10**15 + 18)
        # Each stalled response waited in memory, the oldest dropped beyond two; none held up the scrape,
        # which was a slow reader too (the 4 kB send buffer), read as it came.
        assert server.stats.slow_readers == 5
        assert server.stats.dropped_slow == 3
        assert server.stats.served == 1
    finally:
        for sock in stalled:
            sock.close()
        server.shutdown()
