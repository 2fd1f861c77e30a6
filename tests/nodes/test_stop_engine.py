"""Stopping an engine: SIGTERM to its process group, SIGKILL when it ignores that past the timeout."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from nodes import process


def start(tmp_path: Path, code: str) -> int:
    record = process.start_engine(
        argv=[sys.executable, "-c", code],
        env={},
        directory=tmp_path / "engines",
        deployment_id=1,
        port=1,
        start_token="t",
        log_keep=2,
    )
    time.sleep(0.3)  # let it install its handlers
    return record.pid


def test_graceful_stop(tmp_path: Path) -> None:
    pid = start(tmp_path, "import time; time.sleep(60)")
    assert process.carries_token(pid, "t") and not process.carries_token(pid, "other")
    assert process.stop_engine(pid, timeout=5) is False
    assert not process.is_alive(pid)


def test_engine_that_ignores_sigterm_is_killed_after_the_timeout(tmp_path: Path) -> None:
    code = (
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "print('up', flush=True); time.sleep(60)"
    )
    pid = start(tmp_path, code)
    began = time.monotonic()
    assert process.stop_engine(pid, timeout=0.5) is True
    assert time.monotonic() - began >= 0.5
    assert not process.is_alive(pid)
    assert "up" in process.tail(tmp_path / "engines" / "deployment-1.log")


def test_children_of_the_engine_die_with_it(tmp_path: Path) -> None:
    # vLLM starts worker processes; they share the engine's session and process group.
    code = (
        "import subprocess, sys, time; "
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
        "print(child.pid, flush=True); time.sleep(60)"
    )
    pid = start(tmp_path, code)
    time.sleep(0.3)
    child = int(process.tail(tmp_path / "engines" / "deployment-1.log").split()[-1])
    assert process.is_alive(child)
    process.stop_engine(pid, timeout=5)
    deadline = time.monotonic() + 5
    while process.is_alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not process.is_alive(child)
