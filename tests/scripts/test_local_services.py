"""scripts/local_services.py (make run, make test, .ci/run): a local Redis is started where none answers;
a server on another machine, or one that already answers, is left alone."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import redis
from django.conf import settings

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "local_services.py"
STARTERS = ("redis-server", "apt-get", "pg_createcluster", "pg_ctlcluster", "initdb", "pg_ctl")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def run_script(*args: str, path: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PATH": path or os.environ["PATH"]}
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=60, env=env
    )


def fake_starters(tmp_path: Path) -> tuple[str, Path]:
    """A PATH whose server starters and apt-get only leave a mark: any mark means something was started."""
    bin_dir, marks = tmp_path / "bin", tmp_path / "marks"
    bin_dir.mkdir()
    marks.mkdir()
    for name in STARTERS:
        fake = bin_dir / name
        fake.write_text(f"#!/bin/sh\ntouch {marks / name}\n")
        fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    return f"{bin_dir}:{os.environ['PATH']}", marks


@pytest.mark.skipif(shutil.which("redis-server") is None, reason="redis-server is not installed")
def test_starts_redis_on_a_free_loopback_port(tmp_path: Path) -> None:
    port = free_port()
    url = f"redis://127.0.0.1:{port}/0"
    client = redis.Redis.from_url(url, socket_connect_timeout=2)
    try:
        result = run_script("--redis", url, "--state-dir", str(tmp_path))
        assert result.returncode == 0, result.stdout + result.stderr
        assert f"Started Redis on 127.0.0.1:{port}" in result.stdout
        assert client.ping() is True
        again = run_script("--redis", url, "--state-dir", str(tmp_path))
        assert again.returncode == 0 and f"Redis answers at 127.0.0.1:{port}" in again.stdout
    finally:
        with contextlib.suppress(redis.exceptions.ConnectionError):
            client.shutdown(nosave=True)


def test_a_server_on_another_machine_is_left_alone(tmp_path: Path) -> None:
    path, marks = fake_starters(tmp_path)
    state = tmp_path / "state"
    result = run_script(
        "--redis",
        "redis://redis.example.invalid:6379/0",
        "--postgres",
        "postgres://app@db.example.invalid:5432/app",
        "--state-dir",
        str(state),
        path=path,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Redis at redis.example.invalid:6379 is not on this machine: starting nothing." in result.stdout
    assert "PostgreSQL at db.example.invalid:5432 is not on this machine: starting nothing." in result.stdout
    assert list(marks.iterdir()) == []
    assert not state.exists()


def test_a_local_server_that_answers_is_left_alone(tmp_path: Path) -> None:
    path, marks = fake_starters(tmp_path)
    result = run_script("--redis", settings.REDIS_URL, "--state-dir", str(tmp_path / "state"), path=path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Redis answers at" in result.stdout
    assert list(marks.iterdir()) == []
