"""Helpers for tests of the agent channel: the fleet agent as a real process with no database
settings, reaching a live control plane through a TCP relay the test can cut and restore."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from nodes import process


class Relay:
    """A TCP relay from a local port to the control plane: `cut()` drops it, `restore()` brings it back."""

    def __init__(self, target_host: str, target_port: int, bind: str = "127.0.0.1") -> None:
        self.target = (target_host, target_port)
        self.listener = socket.socket()
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind((bind, 0))
        self.port = int(self.listener.getsockname()[1])
        self.up = threading.Event()
        self.up.set()
        self.closed = False
        self.open: set[socket.socket] = set()
        self.listener.listen(64)
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.closed:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            if not self.up.is_set():
                client.close()  # the control plane is "down": connection refused as good as
                continue
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            self.open.update((client, upstream))
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    def _pipe(self, source: socket.socket, sink: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while chunk := source.recv(65536):
                sink.sendall(chunk)
        for s in (source, sink):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            self.open.discard(s)

    def cut(self) -> None:
        self.up.clear()
        for s in list(self.open):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)

    def restore(self) -> None:
        self.up.set()

    def close(self) -> None:
        self.closed = True
        self.cut()
        self.listener.close()


def agent_env(token: str) -> dict[str, str]:
    """The agent's whole environment: no DATABASE_URL, no REDIS_URL, and a Django settings module that
    does not exist, so any use of Django (let alone its database) would fail."""
    keep = ("PATH", "HOME", "LANG", "TMPDIR")
    env = {name: os.environ[name] for name in keep if name in os.environ}
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[2])
    env["DJANGO_SETTINGS_MODULE"] = "no_such_settings_module_for_the_agent"
    env["INFERCHAIN_AGENT_TOKEN"] = token
    return env


def start_agent(host: str, url: str, token: str, engine_dir: Path, log: Path) -> subprocess.Popen[bytes]:
    out = log.open("ab")
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "nodes.agent",
            "--host",
            host,
            "--control-plane",
            url,
            "--engine-dir",
            str(engine_dir),
            "--simulated-gpus",
            "1",
        ],
        env=agent_env(token),
        stdout=out,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def kill(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)


def wait_for(predicate: Callable[[], bool], timeout: float, what: str, log: Path) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}; agent log:\n{process.tail(log, 60)}")


def stop_engines_under(directory: Path) -> None:
    """Kill every engine whose state file lies under `directory` (engines outlive their agent)."""
    for record_file in directory.rglob("deployment-*.json"):
        with contextlib.suppress(OSError, ValueError, TypeError):
            record = process.EngineRecord(**json.loads(record_file.read_text()))
            if process.is_alive(record.pid):
                os.killpg(record.pid, signal.SIGKILL)
