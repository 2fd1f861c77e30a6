"""A cut link drops packets for the far host: nothing answers, not even something beyond the default route."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Callable

import pytest

from tests.netns import RemoteHost, remote_hosts  # noqa: F401 - fixture

pytestmark = pytest.mark.slow

# Port 25000: below the ephemeral range, where this sandbox's network answered HTTP 404 for any address
# when the cut link's packets went out the default route.
PORT = 25000


def connects(address: str, port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(2.0)
        try:
            sock.connect((address, port))
        except OSError:
            return False
    return True


def test_a_cut_link_answers_nothing_and_a_restored_one_answers_again(
    remote_hosts: Callable[[int], list[RemoteHost]],  # noqa: F811
) -> None:
    (remote,) = remote_hosts(1)
    # A bare listener (http.server looks its address up in DNS at bind, which hangs with no network).
    listen = f"import socket, time; s = socket.create_server(({remote.address!r}, {PORT})); time.sleep(60)"
    server = remote.popen(
        [sys.executable, "-c", listen],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    for _ in range(100):
        if connects(remote.address, PORT):
            break
        time.sleep(0.1)
    assert connects(remote.address, PORT)
    remote.cut()
    assert not connects(remote.address, PORT)
    remote.restore()
    assert connects(remote.address, PORT)
    server.terminate()
