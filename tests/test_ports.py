"""The suite's ports stay out of the kernel's ephemeral range and Ray's worker ports, one block per worker."""

from __future__ import annotations

import itertools
import socket

from tests import ports


def test_each_xdist_worker_gets_its_own_block_between_rays_ports_and_the_ephemeral_range() -> None:
    low, high = ports.RAY_WORKER_PORTS_END + 1, ports.ephemeral_low() - 1
    blocks = [ports.worker_block(f"gw{i}", 3, low, high) for i in range(3)]
    assert [b.start for b in blocks] == sorted(b.start for b in blocks)
    for first, second in itertools.pairwise(blocks):
        assert first.stop <= second.start
    assert blocks[0].start == 20000 and blocks[-1].stop - 1 <= high
    assert ports.worker_block("", 1, low, high) == range(low, high + 1)


def test_free_ports_are_bindable_outside_the_ephemeral_range_and_not_repeated() -> None:
    seen = [ports.free_port() for _ in range(50)]
    assert len(set(seen)) == 50
    for port in seen:
        assert ports.RAY_WORKER_PORTS_END < port < ports.ephemeral_low()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", seen[0]))
