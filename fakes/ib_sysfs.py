"""Writes fake ``/sys/class/infiniband`` trees for the exporter's tests and benchmark.

The layout mirrors what the kernel's ib_core and mlx5 drivers publish, including the device attributes
(``board_id``, ``fw_ver``, ``hca_type``) that node_exporter insists on, so the same tree can be served to
both exporters side by side. Values are strings so that a test can write deliberately broken content.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

# The IB PortCounters/PortCountersExtended files ib_core publishes under ports/<p>/counters.
PORT_COUNTER_FILES: tuple[str, ...] = (
    "excessive_buffer_overrun_errors",
    "link_downed",
    "link_error_recovery",
    "local_link_integrity_errors",
    "multicast_rcv_packets",
    "multicast_xmit_packets",
    "port_rcv_constraint_errors",
    "port_rcv_data",
    "port_rcv_discards",
    "port_rcv_errors",
    "port_rcv_packets",
    "port_rcv_remote_physical_errors",
    "port_rcv_switch_relay_errors",
    "port_xmit_constraint_errors",
    "port_xmit_data",
    "port_xmit_discards",
    "port_xmit_packets",
    "port_xmit_wait",
    "symbol_error",
    "unicast_rcv_packets",
    "unicast_xmit_packets",
    "VL15_dropped",
)

# A ConnectX-7 port's hw_counters as published by mlx5_ib (``lifespan`` is a setting, not a counter).
MLX5_HW_COUNTER_FILES: tuple[str, ...] = (
    "duplicate_request",
    "implied_nak_seq_err",
    "lifespan",
    "local_ack_timeout_err",
    "np_cnp_sent",
    "np_ecn_marked_roce_packets",
    "out_of_buffer",
    "out_of_sequence",
    "packet_seq_err",
    "req_cqe_error",
    "req_cqe_flush_error",
    "req_remote_access_errors",
    "req_remote_invalid_request",
    "req_rnr_retries_exceeded",
    "req_transport_retries_exceeded",
    "resp_cqe_error",
    "resp_cqe_flush_error",
    "resp_local_length_error",
    "resp_remote_access_errors",
    "rnr_nak_retry_err",
    "roce_adp_retrans",
    "roce_adp_retrans_to",
    "roce_slow_restart",
    "roce_slow_restart_cnps",
    "roce_slow_restart_trans",
    "rp_cnp_handled",
    "rp_cnp_ignored",
    "rx_atomic_requests",
    "rx_dct_connect",
    "rx_icrc_encapsulated",
    "rx_read_requests",
    "rx_write_requests",
)


@dataclass
class FakePort:
    """One port; ``counters``/``hw_counters`` of ``None`` leave the directory out entirely."""

    number: int = 1
    state: str | None = "4: ACTIVE"
    phys_state: str | None = "5: LinkUp"
    rate: str | None = "400 Gb/sec (4X NDR)"
    link_layer: str | None = "InfiniBand"
    counters: Mapping[str, str] | None = field(default_factory=dict)
    hw_counters: Mapping[str, str] | None = None


@dataclass
class FakeHca:
    """One device directory under ``class/infiniband``; ``None`` attributes are not written."""

    name: str
    ports: list[FakePort]
    board_id: str | None = "MT_0000000838"
    fw_ver: str | None = "28.39.1002"
    hca_type: str | None = "MT4129"


def _write(path: str, content: str) -> None:
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(content if content.endswith("\n") or not content else content + "\n")


def write_tree(sysfs_root: str, hcas: Iterable[FakeHca]) -> str:
    """Write the HCAs under ``<sysfs_root>/class/infiniband`` and return that directory."""
    class_dir = os.path.join(sysfs_root, "class", "infiniband")
    os.makedirs(class_dir, exist_ok=True)
    for hca in hcas:
        device_dir = os.path.join(class_dir, hca.name)
        os.makedirs(os.path.join(device_dir, "ports"), exist_ok=True)
        for attr, value in (("board_id", hca.board_id), ("fw_ver", hca.fw_ver), ("hca_type", hca.hca_type)):
            if value is not None:
                _write(os.path.join(device_dir, attr), value)
        for port in hca.ports:
            port_dir = os.path.join(device_dir, "ports", str(port.number))
            os.makedirs(port_dir, exist_ok=True)
            for attr, text in (
                ("state", port.state),
                ("phys_state", port.phys_state),
                ("rate", port.rate),
                ("link_layer", port.link_layer),
            ):
                if text is not None:
                    _write(os.path.join(port_dir, attr), text)
            for sub, values in (("counters", port.counters), ("hw_counters", port.hw_counters)):
                if values is None:
                    continue
                os.makedirs(os.path.join(port_dir, sub), exist_ok=True)
                for name, text in values.items():
                    _write(os.path.join(port_dir, sub, name), text)
    return class_dir


def numbered(names: Iterable[str], start: int, step: int = 1) -> dict[str, str]:
    """Give each file a distinct value (``start``, ``start+step``…) so a mix-up between two counters
    shows up as a wrong value instead of passing by coincidence."""
    return {name: str(start + i * step) for i, name in enumerate(names)}


def full_node(sysfs_root: str, hcas: int = 8) -> str:
    """A GPU node as the benchmark sees it: ``hcas`` NDR ports with every counter and hw_counter."""
    return write_tree(
        sysfs_root,
        [
            FakeHca(
                f"mlx5_{i}",
                [
                    FakePort(
                        counters=numbered(PORT_COUNTER_FILES, 1_000_000 * (i + 1), 7),
                        hw_counters=numbered(MLX5_HW_COUNTER_FILES, 10_000 * (i + 1), 3),
                    )
                ],
            )
            for i in range(hcas)
        ],
    )
