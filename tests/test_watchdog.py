"""A hung test fails at its timeout with every thread's stack in its report, under pytest-xdist too."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

HUNG_TEST = """
import threading
import time

import pytest

lock = threading.Lock()


def waits_for_the_lock_forever() -> None:
    with lock:
        pass


@pytest.mark.timeout(3)
def test_hangs() -> None:
    lock.acquire()
    threading.Thread(target=waits_for_the_lock_forever, name="stuck-helper", daemon=True).start()
    time.sleep(30)


def test_passes() -> None:
    assert True
"""

CONFTEST = """
from pathlib import Path

from tests.watchdog import Watchdog


def pytest_configure(config):
    config.pluginmanager.register(Watchdog(Path(__file__).parent / "stacks"), "watchdog")
"""


def test_a_hung_test_reports_the_stack_of_every_thread_through_xdist(tmp_path: Path) -> None:
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_hung.py").write_text(HUNG_TEST)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("PYTEST_XDIST_WORKER", None)
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-n", "2", "-p", "no:cacheprovider", str(tmp_path)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    out = result.stdout + result.stderr
    assert result.returncode == 1, out
    assert "1 failed, 1 passed" in out, out
    assert "Timeout (>3.0s)" in out, out
    # The section the watchdog attached: both threads, the helper stuck in its `with lock`.
    assert "stacks of every thread, 1 s into the test" in out, out
    assert "in waits_for_the_lock_forever" in out, out
    assert "in test_hangs" in out, out
