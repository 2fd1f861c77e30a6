"""A private redis-server for tests that stop and restart Redis (never the shared one on 6379)."""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PrivateRedis:
    """redis-server on a free loopback port, no persistence; stop() and start() keep the port.

    `abrupt` stops it with SIGKILL, as a crash or an OOM kill would (clients see no goodbye); otherwise
    with SIGTERM, as a restart by an operator or a service manager does.
    """

    def __init__(self, abrupt: bool = False) -> None:
        self.abrupt = abrupt
        self.port = _free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="private-redis-"))
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 10.0) -> None:
        argv = [
            "redis-server",
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
        ]
        log = (self.dir / "redis.log").open("ab")
        self.proc = subprocess.Popen([*argv, "--dir", str(self.dir)], stdout=log, stderr=subprocess.STDOUT)
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                redis.Redis(port=self.port, socket_connect_timeout=0.2).ping()
                return
            except redis.RedisError:
                time.sleep(0.02)
        raise RuntimeError(f"redis-server on {self.port} did not start")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            if self.abrupt:
                self.proc.kill()
            else:
                self.proc.terminate()
            self.proc.wait(10)
        self.proc = None

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)

    def restart(self) -> None:
        self.stop()
        self.start()


@pytest.fixture
def private_redis() -> Iterator[PrivateRedis]:
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed")
    server = PrivateRedis()
    server.start()
    try:
        yield server
    finally:
        server.close()
