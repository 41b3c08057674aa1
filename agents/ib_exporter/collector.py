"""Prometheus collector that turns one sysfs scan into metric families.

Names follow Prometheus node_exporter's infiniband collector without its ``node_`` prefix, so that a
dashboard or rule written for ``node_infiniband_port_data_received_bytes_total`` ports over by dropping
the prefix. Series node_exporter does not have (the mlx5 ``hw_counters``, the link layer, the exporter's
own health) use the same ``infiniband_`` style.
"""

from __future__ import annotations

import functools
import re
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample

from agents.ib_exporter.sysfs import (
    REASON_COLLISION,
    REASON_WRAPPED,
    REASONS,
    DeviceReading,
    ScrapeErrors,
    SysfsReader,
)

NAMESPACE = "infiniband"
PORT_LABELS = ("device", "port")


@dataclass(frozen=True)
class CounterSpec:
    """How one file of ``ports/<p>/counters`` becomes a metric."""

    metric: str
    """Name without the ``_total`` suffix, which prometheus_client appends for counters."""
    help: str
    scale: int = 1


# ``port_xmit_data``/``port_rcv_data`` count 4-byte words (the IB PortCounters unit), hence scale 4.
COUNTERS: dict[str, CounterSpec] = {
    "excessive_buffer_overrun_errors": CounterSpec(
        "infiniband_excessive_buffer_overrun_errors",
        "Times consecutive flow-control update periods each had at least one receive buffer overrun.",
    ),
    "link_downed": CounterSpec(
        "infiniband_link_downed", "Times the link failed to recover from an error state and went down."
    ),
    "link_error_recovery": CounterSpec(
        "infiniband_link_error_recovery", "Times the link successfully recovered from an error state."
    ),
    "local_link_integrity_errors": CounterSpec(
        "infiniband_local_link_integrity_errors",
        "Times the count of local physical errors exceeded the LocalPhyErrors threshold.",
    ),
    "multicast_rcv_packets": CounterSpec(
        "infiniband_multicast_packets_received", "Multicast packets received, including errors."
    ),
    "multicast_xmit_packets": CounterSpec(
        "infiniband_multicast_packets_transmitted", "Multicast packets transmitted, including errors."
    ),
    "port_rcv_constraint_errors": CounterSpec(
        "infiniband_port_constraint_errors_received",
        "Received packets discarded by partition/raw constraints.",
    ),
    "port_xmit_constraint_errors": CounterSpec(
        "infiniband_port_constraint_errors_transmitted",
        "Packets not transmitted because of partition/raw constraints.",
    ),
    "port_rcv_data": CounterSpec(
        "infiniband_port_data_received_bytes", "Data bytes received on all VLs (port_rcv_data words x 4).", 4
    ),
    "port_xmit_data": CounterSpec(
        "infiniband_port_data_transmitted_bytes",
        "Data bytes transmitted on all VLs (port_xmit_data words x 4).",
        4,
    ),
    "port_rcv_discards": CounterSpec(
        "infiniband_port_discards_received",
        "Inbound packets discarded because the port was down or congested.",
    ),
    "port_xmit_discards": CounterSpec(
        "infiniband_port_discards_transmitted",
        "Outbound packets discarded because the port was down or congested.",
    ),
    "port_rcv_errors": CounterSpec(
        "infiniband_port_errors_received", "Packets containing an error received on this port."
    ),
    "port_rcv_packets": CounterSpec(
        "infiniband_port_packets_received", "Packets received on all VLs, including errors."
    ),
    "port_xmit_packets": CounterSpec(
        "infiniband_port_packets_transmitted", "Packets transmitted on all VLs, including errors."
    ),
    "port_rcv_remote_physical_errors": CounterSpec(
        "infiniband_port_receive_remote_physical_errors",
        "Packets received marked with the End-of-Bad-Packet delimiter.",
    ),
    "port_rcv_switch_relay_errors": CounterSpec(
        "infiniband_port_receive_switch_relay_errors", "Packets the switch could not forward."
    ),
    "port_xmit_wait": CounterSpec(
        "infiniband_port_transmit_wait",
        "Ticks during which the port had data queued but sent nothing: fabric congestion.",
    ),
    "symbol_error": CounterSpec("infiniband_symbol_error", "Minor link errors detected on one or more physical lanes."),
    "unicast_rcv_packets": CounterSpec(
        "infiniband_unicast_packets_received", "Unicast packets received, including errors."
    ),
    "unicast_xmit_packets": CounterSpec(
        "infiniband_unicast_packets_transmitted", "Unicast packets transmitted, including errors."
    ),
    "VL15_dropped": CounterSpec(
        "infiniband_vl15_dropped", "Incoming VL15 (subnet management) packets dropped for lack of resources."
    ),
}

# Help for the mlx5 hw_counters the alert rules and dashboard rely on; any other hw_counter present on
# the host is exported too, with a generic help text, because the set differs between firmware versions.
HW_COUNTER_HELP: dict[str, str] = {
    "out_of_sequence": "Out-of-sequence packets received (RoCE/IB transport), a precursor of NCCL timeouts.",
    "packet_seq_err": "NAK sequence errors received: the responder saw a packet sequence gap.",
    "local_ack_timeout_err": "Local ACK timeouts on the sender: a peer or path stopped answering.",
    "rnr_nak_retry_err": "Receiver-not-ready NAK retries exhausted: the receiver had no posted buffers.",
    "out_of_buffer": "Packets dropped because no receive WQE was posted.",
    "np_cnp_sent": "Congestion notification packets sent by this port as notification point (RoCE ECN).",
    "rp_cnp_handled": "Congestion notification packets handled by this port as reaction point (RoCE ECN).",
    "np_ecn_marked_roce_packets": "RoCE packets received with an ECN mark: congestion on the path.",
    "implied_nak_seq_err": "Implied NAK sequence errors (an ACK with a higher PSN than expected).",
    "duplicate_request": "Duplicate requests received (the sender retransmitted).",
    "req_cqe_error": "Requester completions with error.",
    "resp_cqe_error": "Responder completions with error.",
}

_INVALID_NAME_CHARS = re.compile(r"[^a-zA-Z0-9_]")


@functools.lru_cache(maxsize=4096)
def hw_counter_stem(name: str) -> str:
    """The sanitised part of an hw_counter's metric name: ``Out-Of-Sequence_total`` → ``out_of_sequence``.

    Cached because it runs for every hw_counter sample of every scrape; bounded because file names come
    from the host."""
    return _INVALID_NAME_CHARS.sub("_", name).lower().removesuffix("_total")


def hw_counter_metric(name: str) -> str:
    """Metric name (without ``_total``) for an mlx5 hw_counter file name."""
    return f"{NAMESPACE}_hw_{hw_counter_stem(name)}"


def resolve_hw_names(files: Mapping[str, int]) -> tuple[dict[str, int], int]:
    """``{stem: value}`` for one port's hw_counters, and how many files lost a name collision.

    Sanitising is not injective (``out-of-sequence``/``out_of_sequence``, ``x``/``x_total``, ``Rx``/``rx``),
    and two samples with one name and one label set make Prometheus reject the scrape. The winner is
    deterministic whatever order the directory lists in: the file whose name already is the stem, else
    the smallest name.
    """
    chosen: dict[str, str] = {}
    lost = 0
    for name in files:
        stem = hw_counter_stem(name)
        held = chosen.get(stem)
        if held is None:
            chosen[stem] = name
            continue
        lost += 1
        if held != stem and (name == stem or name < held):
            chosen[stem] = name
    return {stem: files[name] for stem, name in chosen.items()}, lost


class InfiniBandCollector(Collector):
    """Custom collector: every ``collect()`` is one fresh sysfs scan.

    It keeps two pieces of state across scrapes, both for honesty rather than speed: the cumulative
    error counts (a counter must never go backwards) and each counter's last raw value, to notice a
    counter that went backwards (wrapped or reset by a driver reload). Such a series is left out of that
    one scrape and counted under ``reason="counter_wrapped"``; the next scrape exports it from its new
    base, which Prometheus' ``rate()`` treats as an ordinary counter reset.
    """

    def __init__(self, sysfs_root: str) -> None:
        self.reader = SysfsReader(sysfs_root)
        self._lock = threading.Lock()
        self._error_totals: dict[str, int] = dict.fromkeys(REASONS, 0)
        self._last: dict[tuple[str, str, str, str], int] = {}
        self._scrapes = 0

    def collect(self) -> Iterable[Metric]:
        # prometheus_client serves scrapes from several threads; the wrap memory must not interleave.
        with self._lock:
            return self._collect_locked()

    def describe(self) -> Iterable[Metric]:
        """Nothing to pre-describe: the set of series depends on the hardware present at scrape time."""
        return []

    def _collect_locked(self) -> list[Metric]:
        started = time.perf_counter()
        errors = ScrapeErrors()
        devices = self.reader.scan(errors)
        families = self._families(devices, errors)
        for reason, count in errors.counts.items():
            self._error_totals[reason] += count
        self._scrapes += 1

        scrape_errors = CounterMetricFamily(
            f"{NAMESPACE}_exporter_scrape_errors",
            "Series skipped because a sysfs file was missing, unreadable, garbage, unsupported (the kernel's "
            "N/A), vanished, wrapped or lost a name collision.",
            labels=("reason",),
        )
        for reason in REASONS:
            scrape_errors.add_metric((reason,), float(self._error_totals[reason]))
        scrapes = CounterMetricFamily(f"{NAMESPACE}_exporter_scrapes", "Scrapes served since start.")
        scrapes.add_metric((), float(self._scrapes))
        device_count = GaugeMetricFamily(
            f"{NAMESPACE}_exporter_devices", "InfiniBand/RoCE devices found in sysfs at the last scrape."
        )
        device_count.add_metric((), float(len(devices)))
        duration = GaugeMetricFamily(
            f"{NAMESPACE}_exporter_scrape_duration_seconds", "Seconds the last sysfs scan took."
        )
        duration.add_metric((), time.perf_counter() - started)
        return [*families, scrape_errors, scrapes, device_count, duration]

    def _families(self, devices: list[DeviceReading], errors: ScrapeErrors) -> list[Metric]:
        info = InfoMetricFamily(
            NAMESPACE,
            "Non-numeric data from /sys/class/infiniband/<device>, value is always 1.",
            labels=("device",),
        )
        port_info = InfoMetricFamily(
            f"{NAMESPACE}_port", "Link layer of the port: InfiniBand or Ethernet (RoCE).", labels=PORT_LABELS
        )
        state = GaugeMetricFamily(
            f"{NAMESPACE}_state_id",
            "Logical port state (1: down, 2: init, 3: armed, 4: active, 5: active defer).",
            labels=PORT_LABELS,
        )
        phys = GaugeMetricFamily(
            f"{NAMESPACE}_physical_state_id",
            "Physical port state (1: sleep, 2: polling, 3: disabled, 4: training, 5: link up, "
            "6: link error recovery, 7: phy test).",
            labels=PORT_LABELS,
        )
        rate = GaugeMetricFamily(
            f"{NAMESPACE}_rate_bytes_per_second",
            "Port signalling rate in bytes per second.",
            labels=PORT_LABELS,
        )
        counters: dict[str, CounterMetricFamily] = {}
        hw: dict[str, CounterMetricFamily] = {}
        # The wrap memory is rebuilt from this scrape only: counters of a device that is gone are
        # forgotten, so a hot-swapped HCA does not look wrapped on return and memory stays bounded.
        previous = self._last
        current: dict[tuple[str, str, str, str], int] = {}
        wrapped = 0
        collisions = 0

        for device in devices:
            info.add_metric(
                (device.name,),
                {
                    "board_id": device.board_id,
                    "firmware_version": device.firmware_version,
                    "hca_type": device.hca_type,
                },
            )
            for port in device.ports:
                labels = (port.device, port.port)
                # One label dict shared by the ~50 counter samples of the port; samples are appended
                # directly because add_metric would build the same dict once per sample.
                label_map = {"device": port.device, "port": port.port}
                if port.link_layer is not None:
                    port_info.add_metric(labels, {"link_layer": port.link_layer})
                if port.state_id is not None:
                    state.add_metric(labels, float(port.state_id))
                if port.phys_state_id is not None:
                    phys.add_metric(labels, float(port.phys_state_id))
                if port.rate_bytes_per_second is not None:
                    rate.add_metric(labels, port.rate_bytes_per_second)
                for file_name, raw in port.counters.items():
                    spec = COUNTERS.get(file_name)
                    if spec is None:
                        continue  # vendor extras outside the IB PortCounters set are not part of our contract
                    key = ("c", port.device, port.port, file_name)
                    current[key] = raw
                    last = previous.get(key)
                    if last is not None and raw < last:
                        wrapped += 1
                        continue
                    family = counters.get(file_name)
                    if family is None:
                        family = counters[file_name] = CounterMetricFamily(spec.metric, spec.help, labels=PORT_LABELS)
                    family.samples.append(Sample(spec.metric + "_total", label_map, float(raw * spec.scale)))
                hw_values, lost = resolve_hw_names(port.hw_counters)
                collisions += lost
                for stem, raw in hw_values.items():
                    key = ("h", port.device, port.port, stem)
                    current[key] = raw
                    last = previous.get(key)
                    if last is not None and raw < last:
                        wrapped += 1
                        continue
                    family = hw.get(stem)
                    if family is None:
                        # Help from the stem, not the file name: one text per family whichever file won,
                        # and no host-chosen characters in a HELP line.
                        help_text = HW_COUNTER_HELP.get(stem, f"mlx5 hw_counter {stem}.")
                        family = hw[stem] = CounterMetricFamily(f"{NAMESPACE}_hw_{stem}", help_text, labels=PORT_LABELS)
                    family.samples.append(Sample(family.name + "_total", label_map, float(raw)))

        self._last = current
        errors.counts[REASON_WRAPPED] += wrapped
        errors.counts[REASON_COLLISION] += collisions

        ordered_counters = [counters[name] for name in sorted(counters)]
        ordered_hw = [hw[name] for name in sorted(hw)]
        return [info, port_info, state, phys, rate, *ordered_counters, *ordered_hw]
