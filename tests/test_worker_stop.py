"""The worker as the Procfile runs it (prefork, two children) stops warm when its process group gets SIGTERM.

That is how honcho stops every Procfile process (`make stop`, Ctrl-C on `make run`): it signals the
process group it started. A task that is running finishes, and nothing is logged at ERROR. Before the
pool children left the group, one of them was killed in the middle of its task: `WorkerLostError` at
ERROR and the task redelivered (seen in a fresh-clone run of tests/test_idle_demo_logs.py).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
from django.conf import settings

from tests.celery_stop_app import frozen_count, slow_write

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("redis_clean")]

ROOT = Path(__file__).resolve().parent.parent
TASK_SECONDS = 3.0


def wait_for(predicate: Callable[[], bool], timeout: float, what: str, log: Path) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}:\n{log.read_text()[-3000:]}")


def start_worker(tmp_path: Path) -> tuple[subprocess.Popen[bytes], str, Path]:
    """A worker in a session of its own, as honcho starts it, on a queue of its own."""
    queue = f"stop-{uuid.uuid4().hex[:8]}"
    log = tmp_path / "worker.log"
    env = {**os.environ, "REDIS_KEY_PREFIX": settings.REDIS_KEY_PREFIX, "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "celery", "-A", "tests.celery_stop_app", "worker", "-Q", queue]
    cmd += ["--concurrency", "2", "--without-heartbeat", "--without-mingle", "--without-gossip", "-l", "info"]
    with log.open("wb") as out:
        worker = subprocess.Popen(
            cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    wait_for(lambda: "ready." in log.read_text(), 60, "the worker to be ready", log)
    return worker, queue, log


def children(pid: int) -> list[int]:
    found = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout.split()
    return [int(child) for child in found]


def alive(pids: list[int]) -> list[int]:
    return [pid for pid in pids if Path(f"/proc/{pid}").exists()]


def test_sigterm_to_the_group_lets_the_running_task_finish(tmp_path: Path) -> None:
    worker, queue, log = start_worker(tmp_path)
    try:
        pool = children(worker.pid)
        assert len(pool) == 2, pool
        slow_write.apply_async(args=(str(tmp_path), TASK_SECONDS), queue=queue)
        wait_for(lambda: (tmp_path / "started").exists(), 30, "the task to start", log)
        os.killpg(worker.pid, signal.SIGTERM)  # what honcho sends each process it started
        returncode = worker.wait(timeout=TASK_SECONDS + 20)
    finally:
        if worker.poll() is None:
            os.killpg(worker.pid, signal.SIGKILL)
            worker.wait()
    text = log.read_text()
    assert (tmp_path / "done").exists(), f"the running task was cut short:\n{text[-3000:]}"
    assert returncode == 0, text[-3000:]
    alarming = [line for line in text.splitlines() if "ERROR" in line or "WorkerLostError" in line]
    assert alarming == [], "\n".join(alarming)
    assert alive(pool) == []


def test_sigkill_to_the_group_leaves_no_pool_child_behind(tmp_path: Path) -> None:
    """honcho's last resort, 5 s after its SIGTERM: the children, outside the group, die with their parent."""
    worker, queue, log = start_worker(tmp_path)
    pool = children(worker.pid)
    assert len(pool) == 2, pool
    in_group = [child for child in pool if os.getpgid(child) == worker.pid]
    assert in_group == [], "pool children in the worker's process group"
    slow_write.apply_async(args=(str(tmp_path), TASK_SECONDS), queue=queue)
    wait_for(lambda: (tmp_path / "started").exists(), 30, "the task to start", log)
    os.killpg(worker.pid, signal.SIGKILL)
    worker.wait(timeout=10)
    wait_for(lambda: alive(pool) == [], 5, "the pool children to end", log)
    assert not (tmp_path / "done").exists()


def test_a_pool_child_starts_with_its_imports_frozen(tmp_path: Path) -> None:
    """core.celery.freeze_heap: the 200,000 objects of Django, Celery and the tasks' imports sit in the
    collector's permanent generation, so a full collection during a beat task does not walk them."""
    worker, queue, log = start_worker(tmp_path)
    try:
        frozen_count.apply_async(args=(str(tmp_path),), queue=queue)
        wait_for(lambda: (tmp_path / "frozen").exists(), 30, "the task to run", log)
    finally:
        os.killpg(worker.pid, signal.SIGTERM)
        worker.wait(timeout=20)
    assert int((tmp_path / "frozen").read_text()) > 50_000
