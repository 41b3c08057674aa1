"""Reads InfiniBand/RoCE port state and counters from a sysfs tree, one scrape at a time.

Nothing is cached between calls: every scrape walks ``<root>/class/infiniband`` again, so an HCA that
appears, disappears or changes firmware is seen on the next scrape. The reader never raises on bad
input. A host under stress is exactly when the exporter must keep answering, so every problem becomes
an entry in :class:`ScrapeErrors` and the affected series is skipped while the rest of the scrape goes on.
Everything it returns can be exported as is: names are valid UTF-8, numbers are finite floats' worth
(counters are the kernel's u64), so one hostile file cannot make the exposition fail or go invalid.

The walk uses ``os.scandir`` and raw ``os.open``/``os.read`` rather than ``pathlib`` and buffered files:
a full mlx5 port has ~60 files and a GPU node has 8-10 HCAs, so per-file overhead dominates scrape time.
"""

from __future__ import annotations

import errno
import math
import os
import stat
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

_T = TypeVar("_T")

# Error reasons, the values of the ``reason`` label of ``infiniband_exporter_scrape_errors_total``.
REASON_MISSING = "missing"
"""A file every port must have (state, phys_state, rate) is absent while its device still exists."""
REASON_UNREADABLE = "unreadable"
"""The file exists but reading it failed (permissions, EIO, EINVAL from a driver)."""
REASON_GARBAGE = "garbage"
"""The file was read but its content is not what the kernel ABI documents."""
REASON_VANISHED = "device_vanished"
"""The device or port directory disappeared between listing it and reading it (hot unplug, driver reload)."""
REASON_WRAPPED = "counter_wrapped"
"""A counter went backwards since the previous scrape (wrap or reset); recorded by the collector."""
REASON_UNSUPPORTED = "unsupported"
"""The kernel wrote its "N/A" marker: the port's PMA cannot supply this value. Not a fault of the host,
but counted so that a missing series is explained; alerts leave this reason out."""
REASON_COLLISION = "name_collision"
"""Two hw_counter files sanitise to the same metric name (``out-of-sequence`` and ``out_of_sequence``);
one is exported under the name, the others are counted here. Recorded by the collector."""

REASONS: tuple[str, ...] = (
    REASON_MISSING,
    REASON_UNREADABLE,
    REASON_GARBAGE,
    REASON_UNSUPPORTED,
    REASON_VANISHED,
    REASON_WRAPPED,
    REASON_COLLISION,
)

# mlx5 publishes ``lifespan`` among its hw_counters: it is the refresh period of the other counters in
# milliseconds, a setting and not an event count, so exporting it as a counter would be a lie.
_NOT_COUNTERS = frozenset({"lifespan"})

# Values the kernel writes when a port's PMA cannot supply a counter ("N/A (no PMA)"); they mean
# "unsupported here", not "broken", so such series are skipped without counting an error.
_UNSUPPORTED_PREFIX = b"N/A"

_MAX_READ = 4096
"""Sysfs attributes are at most one page; a read that returns more is not a sysfs attribute."""

U64_MAX = 2**64 - 1
"""Counters in sysfs are the kernel's u64; a larger number did not come from the kernel."""

MAX_ENTRIES = 1024
"""Files read from one counters directory per scrape. An mlx5 port has about 60 hw_counters; a directory
with thousands would make every scrape slow and every Prometheus series count explode, so beyond this
the directory counts as garbage once and only its first entries (by name) are read."""

_MAX_STATE_ID = 255
"""PortState and PortPhysicalState are 4-bit fields in the IB PortInfo; a byte is generous."""


class ScrapeErrors:
    """Error counts of one scrape, by reason."""

    __slots__ = ("counts",)

    def __init__(self) -> None:
        self.counts: dict[str, int] = dict.fromkeys(REASONS, 0)

    def add(self, reason: str) -> None:
        self.counts[reason] += 1

    def total(self) -> int:
        return sum(self.counts.values())


@dataclass(frozen=True)
class PortReading:
    """One port as read in one scrape. ``None`` means the value could not be read this time."""

    device: str
    port: str
    state_id: int | None
    phys_state_id: int | None
    rate_bytes_per_second: float | None
    link_layer: str | None
    counters: dict[str, int] = field(default_factory=dict)
    hw_counters: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class DeviceReading:
    """One HCA as read in one scrape. Info attributes are ``""`` when the driver does not publish them."""

    name: str
    board_id: str
    firmware_version: str
    hca_type: str
    ports: tuple[PortReading, ...]


class _Vanished(Exception):
    """The device being read disappeared; the caller drops the whole device from this scrape."""


class Garbage(ValueError):
    """A file's content does not match the documented format."""


class Unsupported(ValueError):
    """The kernel's "N/A" marker: this port cannot supply the value."""


def _check_size(raw: bytes) -> bytes:
    if len(raw) > _MAX_READ:
        raise Garbage(f"more than {_MAX_READ} bytes")
    return raw


def _valid_name(name: str) -> bool:
    """Whether a directory entry's name is valid UTF-8 (``os.scandir`` escapes other bytes as surrogates,
    which cannot be encoded into the UTF-8 exposition)."""
    if name.isascii():
        return True
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def parse_id_state(raw: bytes) -> int:
    """Parse ``state``/``phys_state`` content, ``"4: ACTIVE"`` → 4.

    The numeric part is what the IB spec defines; the name after the colon varies between kernels.
    """
    if raw.startswith(_UNSUPPORTED_PREFIX):
        raise Unsupported(raw[:40].decode("ascii", "replace"))
    head, sep, _ = raw.partition(b":")
    if not sep:
        raise Garbage(f"no 'ID: NAME' in {raw!r}")
    try:
        value = int(head.strip())
    except ValueError as exc:
        raise Garbage(f"bad state id in {raw!r}") from exc
    if not 0 <= value <= _MAX_STATE_ID:
        raise Garbage(f"state id out of range in {raw[:40]!r}")
    return value


def parse_rate(raw: bytes) -> float:
    """Parse ``rate`` content, ``"200 Gb/sec (4X HDR)"`` → 25e9 bytes per second.

    The kernel reports the signalling rate in decimal gigabits; dividing by 8 gives bytes so that the
    value can be compared directly with the byte counters' rate.
    """
    if raw.startswith(_UNSUPPORTED_PREFIX):
        raise Unsupported(raw[:40].decode("ascii", "replace"))
    parts = raw.split()
    if len(parts) < 2 or parts[1] != b"Gb/sec":
        raise Garbage(f"no '<n> Gb/sec' in {raw!r}")
    try:
        gbits = float(parts[0])
    except ValueError as exc:
        raise Garbage(f"bad rate in {raw[:40]!r}") from exc
    rate = gbits * 1e9 / 8
    if not (gbits >= 0 and math.isfinite(rate)):  # NaN fails every comparison; inf and 1e400 fail isfinite
        raise Garbage(f"bad rate in {raw[:40]!r}")
    return rate


def parse_counter(raw: bytes) -> int:
    """Parse a counter file: a decimal u64. The kernel's "N/A" marker raises :class:`Unsupported`."""
    text = raw.strip()
    if text.startswith(_UNSUPPORTED_PREFIX):
        raise Unsupported(text[:40].decode("ascii", "replace"))
    # isdigit on bytes is ASCII-only: it rejects signs, blanks, hex, exponents, NUL bytes and empty files;
    # the length test keeps int() from parsing a page of digits that could never be a u64.
    if not text.isdigit() or len(text) > 20:
        raise Garbage(f"not a counter: {raw[:40]!r}")
    value = int(text)
    if value > U64_MAX:
        raise Garbage(f"counter beyond u64: {raw[:40]!r}")
    return value


def _read(path: str) -> bytes:
    # O_NONBLOCK: a FIFO or device node planted in the tree must not hang the scrape. One byte more than
    # a page, so that an oversized file is told apart from a page-long one.
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    try:
        return os.read(fd, _MAX_READ + 1)
    finally:
        os.close(fd)


class SysfsReader:
    """Walks ``<sysfs_root>/class/infiniband`` on each :meth:`scan` call."""

    def __init__(self, sysfs_root: str) -> None:
        self.class_dir = os.path.join(sysfs_root, "class", "infiniband")

    def scan(self, errors: ScrapeErrors) -> list[DeviceReading]:
        """Read every device; problems are added to ``errors`` and never raised.

        A host without InfiniBand has no ``class/infiniband`` directory: that is zero devices, not an
        error, so the same DaemonSet can run on every GPU pool.
        """
        try:
            names = sorted(entry.name for entry in os.scandir(self.class_dir))
        except FileNotFoundError:
            return []
        except OSError:
            errors.add(REASON_UNREADABLE)
            return []
        devices: list[DeviceReading] = []
        for name in names:
            device_dir = self.class_dir + "/" + name
            if not _valid_name(name):
                errors.add(REASON_GARBAGE)  # a name that cannot be a label value: skip, never guess
                continue
            reason = _not_a_directory(device_dir)
            if reason is not None:
                errors.add(reason)
                continue
            try:
                devices.append(self._device(name, device_dir, errors))
            except _Vanished:
                errors.add(REASON_VANISHED)
        return devices

    def _device(self, name: str, device_dir: str, errors: ScrapeErrors) -> DeviceReading:
        board_id = self._info(device_dir, "board_id", errors)
        firmware = self._info(device_dir, "fw_ver", errors)
        hca_type = self._info(device_dir, "hca_type", errors)
        ports_dir = device_dir + "/ports"
        try:
            port_names = sorted(entry.name for entry in os.scandir(ports_dir))
        except FileNotFoundError as exc:
            if not os.path.isdir(device_dir):
                raise _Vanished(device_dir) from exc
            port_names = []  # a device without ports (e.g. a half-initialised driver) exports its info only
        except OSError:
            errors.add(REASON_UNREADABLE)
            port_names = []
        ports: list[PortReading] = []
        for port in port_names:
            if not _valid_name(port):
                errors.add(REASON_GARBAGE)
                continue
            ports.append(self._port(name, port, device_dir, ports_dir + "/" + port, errors))
        return DeviceReading(name, board_id, firmware, hca_type, tuple(ports))

    def _info(self, device_dir: str, attr: str, errors: ScrapeErrors) -> str:
        try:
            raw = _read(device_dir + "/" + attr)
        except FileNotFoundError as exc:
            if not os.path.isdir(device_dir):
                raise _Vanished(device_dir) from exc
            return ""  # optional: not every driver publishes board_id/hca_type
        except OSError:
            errors.add(REASON_UNREADABLE)
            return ""
        try:
            return _check_size(raw).decode("utf-8").strip()
        except (UnicodeDecodeError, Garbage):
            errors.add(REASON_GARBAGE)
            return ""

    def _port(self, device: str, port: str, device_dir: str, port_dir: str, errors: ScrapeErrors) -> PortReading:
        state = self._attr(device_dir, port_dir, "state", parse_id_state, errors)
        phys = self._attr(device_dir, port_dir, "phys_state", parse_id_state, errors)
        rate = self._attr(device_dir, port_dir, "rate", parse_rate, errors)
        link_layer = self._attr(device_dir, port_dir, "link_layer", _parse_link_layer, errors)
        counters = self._counters(device_dir, port_dir + "/counters", errors)
        hw_counters = self._counters(device_dir, port_dir + "/hw_counters", errors)
        return PortReading(device, port, state, phys, rate, link_layer, counters, hw_counters)

    def _attr(
        self,
        device_dir: str,
        port_dir: str,
        attr: str,
        parse: Callable[[bytes], _T],
        errors: ScrapeErrors,
    ) -> _T | None:
        try:
            raw = _read(port_dir + "/" + attr)
        except FileNotFoundError as exc:
            if not os.path.isdir(device_dir):
                raise _Vanished(device_dir) from exc
            errors.add(REASON_VANISHED if not os.path.isdir(port_dir) else REASON_MISSING)
            return None
        except OSError:
            errors.add(REASON_UNREADABLE)
            return None
        try:
            return parse(_check_size(raw))
        except Unsupported:
            errors.add(REASON_UNSUPPORTED)
            return None
        except Garbage:
            errors.add(REASON_GARBAGE)
            return None

    def _counters(self, device_dir: str, counters_dir: str, errors: ScrapeErrors) -> dict[str, int]:
        """``{file name: value}`` for each readable counter of one directory.

        A missing directory is normal (``hw_counters`` exists only on mlx5-class drivers), so it returns
        nothing and counts nothing unless the whole device has gone. This loop runs ~500 times per scrape
        on a full node, hence the fast path for the common ``"<digits>\\n"`` content.
        """
        values: dict[str, int] = {}
        try:
            names = os.listdir(counters_dir)
            if len(names) > MAX_ENTRIES:
                errors.add(REASON_GARBAGE)
                names = sorted(names)[:MAX_ENTRIES]
        except FileNotFoundError as exc:
            if not os.path.isdir(device_dir):
                raise _Vanished(device_dir) from exc
            return values
        except OSError:
            errors.add(REASON_UNREADABLE)
            return values
        prefix = counters_dir + "/"
        for name in names:
            if name in _NOT_COUNTERS:
                continue
            if not name.isascii() and not _valid_name(name):  # isascii inline: this loop is the hot one
                errors.add(REASON_GARBAGE)
                continue
            try:
                raw = _read(prefix + name)
            except FileNotFoundError as exc:
                if not os.path.isdir(device_dir):
                    raise _Vanished(device_dir) from exc
                errors.add(REASON_VANISHED)
                continue
            except IsADirectoryError:
                continue  # not a counter (some drivers nest per-queue directories here)
            except OSError as exc:
                # EINVAL is what several drivers return for a counter of a port that is down.
                errors.add(REASON_UNREADABLE if exc.errno != errno.ENOENT else REASON_VANISHED)
                continue
            if raw[-1:] == b"\n" and len(raw) <= 20 and raw[:-1].isdigit():
                values[name] = int(raw)  # at most 19 digits: always a u64
                continue
            try:
                values[name] = parse_counter(_check_size(raw))
            except Unsupported:
                errors.add(REASON_UNSUPPORTED)
            except Garbage:
                errors.add(REASON_GARBAGE)
        return values


def _not_a_directory(path: str) -> str | None:
    """``None`` when ``path`` is a directory (through links), else the error reason for the entry: a
    dangling link is a device that vanished, a link loop is unreadable, a plain file is garbage."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return REASON_VANISHED
    except OSError:
        return REASON_UNREADABLE
    return None if stat.S_ISDIR(mode) else REASON_GARBAGE


def _parse_link_layer(raw: bytes) -> str:
    """``InfiniBand`` or ``Ethernet`` (RoCE); anything else non-empty is kept as the driver wrote it."""
    try:
        text = raw.decode("ascii").strip()
    except UnicodeDecodeError as exc:
        raise Garbage(f"bad link layer {raw[:40]!r}") from exc
    if not text or not text.replace("_", "").isalnum():
        raise Garbage(f"bad link layer {raw[:40]!r}")
    return text
