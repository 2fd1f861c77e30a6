"""Ports for the servers and engines the suite starts, from a range no one else on the machine picks.

A port read back from `bind(("127.0.0.1", 0))` comes from the kernel's ephemeral range, where every
process's `bind(0)` and outgoing connection take theirs too. An engine restarts on its deployment's
port; while it is down, any of them can take that port, and the relaunch is refused ("port ... is
already in use"). That is the likely end of the Ray test that lost its deployment to FAILED under two
xdist workers: a restarted Ray node binds a dozen ports with bind(0) while the engine is away.

So ports come from between Ray's default worker ports (10002-19999, which `ray start` refuses to
share) and the ephemeral range, split into one block per xdist worker, handed out in turn and checked
free before use.
"""

from __future__ import annotations

import itertools
import os
import socket
from pathlib import Path

RAY_WORKER_PORTS_END = 19999


def ephemeral_low() -> int:
    """The first port of the kernel's ephemeral range (32768 unless the machine changed it)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def worker_block(worker: str, workers: int, low: int, high: int) -> range:
    """This xdist worker's share of [low, high]: "gw1" of 2 gets the second half."""
    index = int(worker.removeprefix("gw")) if worker.startswith("gw") else 0
    count = max(1, workers)
    size = (high - low + 1) // count
    start = low + (index % count) * size
    return range(start, start + size)


def _is_free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("0.0.0.0", port))
        except OSError:
            return False
    return True


_BLOCK = worker_block(
    os.environ.get("PYTEST_XDIST_WORKER", ""),
    int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")),
    RAY_WORKER_PORTS_END + 1,
    ephemeral_low() - 1,
)
# Start where the pid says, so two runs in a row (or a subprocess) do not walk the same ports first.
_NEXT = itertools.cycle([*_BLOCK[os.getpid() % len(_BLOCK) :], *_BLOCK[: os.getpid() % len(_BLOCK)]])


def free_port() -> int:
    """A port free now, outside the ephemeral range and Ray's worker ports, not handed out recently."""
    for _ in range(len(_BLOCK)):
        port = next(_NEXT)
        if _is_free(port):
            return port
    raise RuntimeError(f"no free port in {_BLOCK.start}-{_BLOCK.stop - 1}")
