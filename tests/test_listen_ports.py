"""The local cluster's processes listen outside the kernel's ephemeral port range, so a process restarted after a
kill never finds its port taken as the source port of someone's outgoing connection (the chaos soak's etcd did)."""

from __future__ import annotations

import random
import socket
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tools.localcluster.processes import (
    DEFAULT_EPHEMERAL,
    LISTEN_FLOOR,
    ClusterError,
    ephemeral_range,
    free_ports,
    listen_candidates,
)


@pytest.mark.parametrize(("text", "expected"), [
    ("32768\t60999\n", (32768, 60999)),
    ("1024 65000", (1024, 65000)),
    ("", DEFAULT_EPHEMERAL),
    ("60999 32768", DEFAULT_EPHEMERAL),  # backwards
    ("0 70000", DEFAULT_EPHEMERAL),
    ("a b", DEFAULT_EPHEMERAL),
    ("32768", DEFAULT_EPHEMERAL),
])
def test_the_ephemeral_range_is_read_or_the_default(tmp_path: Path, text: str, expected: tuple[int, int]) -> None:
    path = tmp_path / "ip_local_port_range"
    path.write_text(text)
    assert ephemeral_range(path) == expected
    assert ephemeral_range(tmp_path / "absent") == DEFAULT_EPHEMERAL


@given(lo=st.integers(1, 65535), span=st.integers(0, 65535))
def test_candidates_never_overlap_a_range_that_leaves_room(lo: int, span: int) -> None:
    hi = min(65535, lo + span)
    pool = listen_candidates((lo, hi))
    assert len(pool) >= 1000 and pool.start >= 1024 and pool.stop <= 65536
    if lo - LISTEN_FLOOR >= 1000 or 65535 - max(hi, 1023) >= 1000:
        assert not set(pool) & set(range(lo, hi + 1))


def test_the_ports_given_are_distinct_free_and_below_the_default_range() -> None:
    ports = free_ports([f"p{i}" for i in range(12)], rng=random.Random(3))
    assert len(set(ports.values())) == 12
    assert all(LISTEN_FLOOR <= p < DEFAULT_EPHEMERAL[0] for p in ports.values()) or ephemeral_range() != \
        DEFAULT_EPHEMERAL
    lo, hi = ephemeral_range()
    assert not any(lo <= p <= hi for p in ports.values())
    for port in ports.values():  # free: each can be listened on
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))


def test_a_port_in_use_is_skipped_and_no_room_at_all_is_a_clear_error() -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        taken = held.getsockname()[1]
        held.listen()
        pool = range(taken, taken + 1)
        with pytest.raises(ClusterError, match=f"no free port for etcd in {taken}-{taken}"):
            free_ports(["etcd"], candidates=pool)
        two = free_ports(["a"], candidates=range(taken, taken + 2), rng=random.Random(1))
        assert two == {"a": taken + 1} or taken + 1 > 65535
