"""Hostile sysfs trees for the InfiniBand exporter, each with the outcome it must produce.

Every case starts from one healthy HCA (``mlx5_0``, port 1, ``symbol_error`` 4, ``out_of_sequence`` 11)
and lays its hostile entries over ``<root>/class/infiniband``. Paths are bytes so that a case can plant
names that are not UTF-8. The expected outcome is the error count by reason for one scrape plus the
series that must (or must not) be exported; the healthy sentinel series must survive every case, which
is what "one bad file never costs the scrape" means in practice. Add a case here when a new kind of
bad input is found; tests/test_ib_corpus.py runs them all.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from fakes.ib_sysfs import FakeHca, FakePort, write_tree


@dataclass(frozen=True)
class Link:
    """A symbolic link to ``target`` (relative targets resolve from the link's directory)."""

    target: bytes


@dataclass(frozen=True)
class Special:
    """Anything that is not a plain file: ``"fifo"``, ``"dir"`` or ``"remove"`` (delete the base entry)."""

    kind: str


Entry = bytes | Link | Special
SeriesKey = tuple[str, tuple[tuple[str, str], ...]]

PORT = b"mlx5_0/ports/1/"


def port_series(name: str, device: str = "mlx5_0", port: str = "1") -> SeriesKey:
    return (name, (("device", device), ("port", port)))


SENTINEL = port_series("infiniband_symbol_error_total")
"""The healthy series every case must keep: a bad file elsewhere never costs it."""


@dataclass(frozen=True)
class Case:
    name: str
    why: str
    entries: dict[bytes, Entry]
    errors: dict[str, int] = field(default_factory=dict)
    """Errors of one scrape by reason; reasons not named must be zero."""
    present: dict[SeriesKey, float] = field(default_factory=dict)
    absent: tuple[SeriesKey, ...] = ()
    devices: int = 1


def build(root: Path, case: Case) -> Path:
    """Write the healthy base tree under ``root`` and lay the case's entries over it."""
    write_tree(
        str(root),
        [FakeHca("mlx5_0", [FakePort(counters={"symbol_error": "4"}, hw_counters={"out_of_sequence": "11"})])],
    )
    class_dir = os.fsencode(root / "class" / "infiniband")
    for rel, entry in case.entries.items():
        path = os.path.join(class_dir, rel) if rel else class_dir
        os.makedirs(os.path.dirname(path), exist_ok=True)
        if os.path.lexists(path):
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path)
            else:
                os.unlink(path)
        if isinstance(entry, bytes):
            with open(path, "wb") as handle:
                handle.write(entry)
        elif isinstance(entry, Link):
            os.symlink(entry.target, path)
        elif entry.kind == "fifo":
            os.mkfifo(path)
        elif entry.kind == "dir":
            os.makedirs(path)
        elif entry.kind != "remove":
            raise ValueError(f"{case.name}: unknown entry kind {entry.kind!r}")
    return root


HW = "infiniband_hw_"
TOO_BIG = b"9" * 400 + b"\n"  # parses as an int, overflows a float

CASES: tuple[Case, ...] = (
    # ------------------------------------------------------------------ numbers
    Case("counter_beyond_float_range", "a 400-digit counter overflows float()",
         {PORT + b"counters/port_rcv_errors": TOO_BIG}, {"garbage": 1},
         absent=(port_series("infiniband_port_errors_received_total"),)),
    Case("counter_beyond_u64", "sysfs counters are u64: 2^64 cannot come from the kernel",
         {PORT + b"counters/port_rcv_errors": b"18446744073709551616\n"}, {"garbage": 1},
         absent=(port_series("infiniband_port_errors_received_total"),)),
    Case("counter_u64_max", "the largest u64 is a legitimate value",
         {PORT + b"counters/port_rcv_errors": b"18446744073709551615\n"},
         present={port_series("infiniband_port_errors_received_total"): 18446744073709551615.0}),
    Case("counter_file_larger_than_a_page", "a huge file of digits: truncated reads must not pass as a value",
         {PORT + b"counters/port_rcv_errors": b"1" * 100_000 + b"\n"}, {"garbage": 1}),
    Case("hw_counter_beyond_float_range", "the same overflow among hw_counters",
         {PORT + b"hw_counters/packet_seq_err": TOO_BIG}, {"garbage": 1},
         absent=(port_series(HW + "packet_seq_err_total"),)),
    Case("data_counter_beyond_float_after_scale", "port_xmit_data is multiplied by four",
         {PORT + b"counters/port_xmit_data": b"9" * 308 + b"\n"}, {"garbage": 1}),
    Case("state_id_beyond_float_range", "a 400-digit state id",
         {PORT + b"state": b"9" * 400 + b": ACTIVE\n"}, {"garbage": 1},
         absent=(port_series("infiniband_state_id"),)),
    Case("rate_infinite", "'inf' parses as a float", {PORT + b"rate": b"inf Gb/sec (4X)\n"}, {"garbage": 1},
         absent=(port_series("infiniband_rate_bytes_per_second"),)),
    Case("rate_beyond_float_range", "1e400 is inf", {PORT + b"rate": b"1e400 Gb/sec (4X)\n"}, {"garbage": 1}),
    Case("rate_overflows_when_scaled", "1e308 Gb/s times 1e9/8 is inf", {PORT + b"rate": b"1e308 Gb/sec\n"},
         {"garbage": 1}),
    Case("rate_nan", "NaN is not a rate", {PORT + b"rate": b"NaN Gb/sec\n"}, {"garbage": 1}),
    Case("counter_inf_text", "inf is not a counter", {PORT + b"counters/port_rcv_errors": b"inf\n"},
         {"garbage": 1}),
    Case("counter_nan_text", "NaN is not a counter", {PORT + b"hw_counters/packet_seq_err": b"NaN\n"},
         {"garbage": 1}),
    Case("counter_float_exponent", "1e3 is not a decimal integer", {PORT + b"counters/port_rcv_errors": b"1e3\n"},
         {"garbage": 1}),
    Case("counter_unicode_digits", "Arabic-Indic digits are digits to str.isdigit, not to the kernel",
         {PORT + b"counters/port_rcv_errors": "١٢٣\n".encode()}, {"garbage": 1}),
    # ------------------------------------------------------------------ the kernel's N/A
    Case("counter_not_available", "the kernel's 'N/A (no PMA)' is unsupported, not garbage",
         {PORT + b"counters/port_xmit_wait": b"N/A (no PMA)\n"}, {"unsupported": 1},
         absent=(port_series("infiniband_port_transmit_wait_total"),)),
    Case("hw_counter_not_available", "N/A among hw_counters",
         {PORT + b"hw_counters/packet_seq_err": b"N/A (no PMA)\n"}, {"unsupported": 1}),
    Case("rate_not_available", "N/A where the rate should be", {PORT + b"rate": b"N/A\n"}, {"unsupported": 1}),
    # ------------------------------------------------------------------ names
    Case("device_name_not_utf8", "a device directory whose name is not UTF-8 cannot be a label value",
         {b"mlx5_\xff/ports/1/state": b"4: ACTIVE\n", b"mlx5_\xff/ports/1/counters/symbol_error": b"1\n"},
         {"garbage": 1}),
    Case("port_name_not_utf8", "a port directory whose name is not UTF-8",
         {PORT[:-2] + b"\xfe/state": b"4: ACTIVE\n"}, {"garbage": 1}),
    Case("counter_name_not_utf8", "a counters file whose name is not UTF-8",
         {PORT + b"counters/port_\xff": b"1\n"}, {"garbage": 1}),
    Case("hw_counter_name_not_utf8", "an hw_counters file whose name is not UTF-8",
         {PORT + b"hw_counters/out_\xff": b"1\n"}, {"garbage": 1}),
    Case("hw_counter_name_non_ascii", "a UTF-8 but non-ASCII name sanitises deterministically",
         {PORT + b"hw_counters/d\xc3\xa9bit": b"5\n"},
         present={port_series(HW + "d_bit_total"): 5.0}),
    Case("hw_counter_names_collide_dash", "out-of-sequence and out_of_sequence sanitise alike: the exact name wins",
         {PORT + b"hw_counters/out-of-sequence": b"99\n"}, {"name_collision": 1},
         present={port_series(HW + "out_of_sequence_total"): 11.0}),
    Case("hw_counter_names_collide_total", "x_total loses its suffix and collides with x",
         {PORT + b"hw_counters/x": b"1\n", PORT + b"hw_counters/x_total": b"2\n"}, {"name_collision": 1},
         present={port_series(HW + "x_total"): 1.0}),
    Case("hw_counter_names_collide_case", "Rx and rx lower-case alike",
         {PORT + b"hw_counters/Rx": b"1\n", PORT + b"hw_counters/rx": b"2\n"}, {"name_collision": 1},
         present={port_series(HW + "rx_total"): 2.0}),
    Case("hw_counter_names_collide_no_exact", "neither a-b nor a.b is exact: the smaller name wins",
         {PORT + b"hw_counters/a.b": b"1\n", PORT + b"hw_counters/a-b": b"2\n"}, {"name_collision": 1},
         present={port_series(HW + "a_b_total"): 2.0}),
    Case("hw_counter_total_alone", "x_total without x is just x",
         {PORT + b"hw_counters/y_total": b"3\n"}, present={port_series(HW + "y_total"): 3.0}),
    Case("hw_counter_name_with_newline", "a newline in a file name ends up in HELP text",
         {PORT + b"hw_counters/a\nb": b"3\n"}, present={port_series(HW + "a_b_total"): 3.0}),
    Case("info_with_control_characters", "quotes, backslashes, NUL and CR in a label value",
         {b"mlx5_0/board_id": b'MT"\\\x00\r\n'}),
    Case("info_not_utf8", "a board id that is not UTF-8", {b"mlx5_0/fw_ver": b"\xff\xfe\n"}, {"garbage": 1}),
    Case("info_larger_than_a_page", "a 100 kB board id is not a board id",
         {b"mlx5_0/board_id": b"A" * 100_000}, {"garbage": 1}),
    # ------------------------------------------------------------------ file system shapes
    Case("counter_symlink_loop", "a link to itself fails with ELOOP",
         {PORT + b"counters/port_rcv_errors": Link(b"port_rcv_errors")}, {"unreadable": 1}),
    Case("device_symlink_loop", "a device entry that links to itself is one unreadable device",
         {b"mlx5_9": Link(b"mlx5_9")}, {"unreadable": 1}),
    Case("device_dangling_symlink", "a device link whose target is gone (hot unplug)",
         {b"mlx5_9": Link(b"../../devices/gone")}, {"device_vanished": 1}),
    Case("counters_dir_symlink_loop", "the counters directory links to itself",
         {PORT + b"hw_counters": Link(b"hw_counters")}, {"unreadable": 1},
         absent=(port_series(HW + "out_of_sequence_total"),)),
    Case("counter_fifo", "a FIFO must not block the scrape (it reads empty)",
         {PORT + b"counters/port_rcv_errors": Special("fifo")}, {"garbage": 1}),
    Case("state_is_a_directory", "EISDIR where a file should be", {PORT + b"state": Special("dir")},
         {"unreadable": 1}),
    Case("ports_is_a_file", "a file where the ports directory should be",
         {b"mlx5_9/ports": b"1\n"}, {"unreadable": 1}, devices=2),
    Case("device_is_a_file", "a plain file among the devices", {b"mlx5_9": b"hello\n"}, {"garbage": 1}),
    Case("class_dir_is_a_file", "class/infiniband itself is a file: zero devices, one error",
         {b"": b"not a directory\n"}, {"unreadable": 1}, absent=(SENTINEL,), devices=0),
    Case("counter_link_to_dev_zero", "a counter that reads as a page of NUL bytes",
         {PORT + b"counters/port_rcv_errors": Link(b"/dev/zero")}, {"garbage": 1}),
    Case("empty_state", "an empty state file", {PORT + b"state": b""}, {"garbage": 1}),
    Case("hw_counters_by_the_thousand", "3000 hw_counters: read the first 1024 by name, count the directory once",
         {PORT + b"hw_counters/c%04d" % i: b"1\n" for i in range(3000)}, {"garbage": 1},
         present={port_series(HW + "c1023_total"): 1.0}, absent=(port_series(HW + "c1024_total"),
                                                                 port_series(HW + "out_of_sequence_total"))),
)
