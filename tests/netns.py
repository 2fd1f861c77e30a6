"""Linux network namespaces for tests that need a network rather than loopback.

A `RemoteHost` is a namespace of its own joined to the test's namespace by a veth pair, with addresses
from 10.213.0.0/16 (private; chosen by the test, one /30 per host, from the test process's pid so two
suites on one machine do not collide). Processes started with `host.popen(...)` run inside it and
reach the test's side at `host.gateway`; the test reaches them at `host.address`. `cut()` takes the
link down (packets are dropped, nothing answers: what a pulled cable or a partitioned switch does),
`restore()` brings it back. While it is down, packets for the host are dropped on this side too (a
blackhole route), never sent out the machine's default route. Everything the fixture made is removed
at teardown, processes first.

Needs CAP_NET_ADMIN (root in the sandbox here and in CI). Where it is missing the fixture skips with
the reason `ip` gave, so the rest of the suite still runs; `NETNS_REQUIRED=1` makes that a failure.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import signal
import subprocess
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest

_counter = itertools.count(1)
BLACKHOLE_METRIC = "4242"


def _ip(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=10)


def netns_unavailable() -> str | None:
    """None when this process may make namespaces and veth pairs, else why not."""
    name = f"icprobe{os.getpid()}"
    made = _ip("netns", "add", name)
    if made.returncode != 0:
        return f"`ip netns add` failed: {made.stderr.strip() or made.returncode}"
    _ip("netns", "del", name)
    return None


@dataclass
class RemoteHost:
    """One namespace with a veth link to the test's namespace."""

    name: str
    outer_if: str
    address: str
    gateway: str
    subnet: str
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def run(self, *cmd: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["ip", "netns", "exec", self.name, *cmd], capture_output=True, text=True, timeout=10
        )

    def popen(self, cmd: Sequence[str], **kwargs: Any) -> subprocess.Popen[bytes]:
        """Start `cmd` inside the namespace (`ip netns exec` execs it: the pid is the command's)."""
        proc = subprocess.Popen(["ip", "netns", "exec", self.name, *cmd], **kwargs)
        self.procs.append(proc)
        return proc

    def cut(self) -> None:
        _check(_ip("link", "set", self.outer_if, "down"))

    def restore(self) -> None:
        _check(_ip("link", "set", self.outer_if, "up"))

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        _ip("link", "del", self.outer_if)  # takes its peer with it
        _ip("route", "del", "blackhole", self.subnet, "metric", BLACKHOLE_METRIC)
        _ip("netns", "del", self.name)


def _check(done: subprocess.CompletedProcess[str]) -> None:
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, done.args))}: {done.stderr.strip()}")


def make_remote_host() -> RemoteHost:
    """A new namespace linked to this one by a veth pair, both ends up, with a /30 of its own."""
    n = next(_counter)
    pid = os.getpid()
    tag = f"{pid % 100000}x{n}"  # interface names are at most 15 bytes
    subnet = (pid * 7 + n) % 16000  # one /30 of 10.213.0.0/16 per host
    third, fourth = divmod(subnet * 4, 256)
    gateway, address = f"10.213.{third}.{fourth + 1}", f"10.213.{third}.{fourth + 2}"
    host = RemoteHost(
        name=f"ic{tag}",
        outer_if=f"ico{tag}",
        address=address,
        gateway=gateway,
        subnet=f"10.213.{third}.{fourth}/30",
    )
    inner_if = f"ici{tag}"
    try:
        _check(_ip("netns", "add", host.name))
        _check(_ip("link", "add", host.outer_if, "type", "veth", "peer", "name", inner_if))
        _check(_ip("link", "set", inner_if, "netns", host.name))
        _check(_ip("addr", "add", f"{gateway}/30", "dev", host.outer_if))
        # With the link down its connected route goes, and packets for the host would follow the
        # default route off the machine; something out there may answer (this sandbox's network
        # answers HTTP 404 on ports below 32768), which no pulled cable does. This route, behind the
        # connected one while the link is up, drops them instead.
        _check(_ip("route", "add", "blackhole", host.subnet, "metric", BLACKHOLE_METRIC))
        _check(_ip("link", "set", host.outer_if, "up"))
        for args in (
            ("addr", "add", f"{address}/30", "dev", inner_if),
            ("link", "set", inner_if, "up"),
            ("link", "set", "lo", "up"),
            ("route", "add", "default", "via", gateway),
        ):
            _check(_ip("-n", host.name, *args))
    except BaseException:
        host.close()
        raise
    return host


@pytest.fixture
def remote_hosts() -> Iterator[Any]:
    """`remote_hosts(n)` makes n namespaced hosts; all are removed at teardown."""
    why = netns_unavailable()
    if why is not None:
        if os.environ.get("NETNS_REQUIRED") == "1":
            pytest.fail(f"network namespaces are required (NETNS_REQUIRED=1) but {why}")
        pytest.skip(f"network namespaces unavailable here: {why}")
    made: list[RemoteHost] = []

    def make(n: int = 1) -> list[RemoteHost]:
        hosts = [make_remote_host() for _ in range(n)]
        made.extend(hosts)
        return hosts

    try:
        yield make
    finally:
        for host in made:
            host.close()
