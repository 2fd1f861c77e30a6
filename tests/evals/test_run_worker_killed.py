"""A real Celery worker killed with SIGKILL in the middle of a run; a second worker resumes it.

The worker processes use this test's database (committed rows: transactional test) and Redis. Nobody sends
the task again: it was acknowledged late, so the broker redelivers it to the second worker once the
visibility timeout (short here) passes. The dead worker's run lock is still in Redis until it lapses;
the redelivered task finds it held, retries after LOCK_SECONDS and then runs only the cases without a
sample: it runs again once, and no sample is written twice.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from django.conf import settings
from django.db import connection

from models_registry.evaluation.models import EvalRun, RunState
from models_registry.tasks import run_evaluation
from tests.evals.run_helpers import MODEL, answer_suite, make_run
from vllm_sim.testing import REPO_ROOT, SimHandle, start_sim

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.slow,
    pytest.mark.usefixtures("redis_clean"),
]


VISIBILITY_TIMEOUT_S = 3


@pytest.fixture
def slow_sim() -> Iterator[SimHandle]:
    """Real-time decoding, so a run of 30 cases at concurrency 2 lasts several seconds."""
    handle = start_sim(MODEL, "--max-model-len", "4096", time_scale=1.0)
    yield handle
    handle.stop()


def start_worker(log: Path) -> subprocess.Popen[bytes]:
    db = settings.DATABASES["default"]
    env = {
        **os.environ,
        "DATABASE_URL": f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}",
        "PYTHONPATH": str(REPO_ROOT),
        # The same broker keys and run locks as this test process.
        "REDIS_KEY_PREFIX": settings.REDIS_KEY_PREFIX,
        "CELERY_VISIBILITY_TIMEOUT_S": str(VISIBILITY_TIMEOUT_S),
    }
    cmd = [sys.executable, "-m", "celery", "-A", "core", "worker", "-Q", "control", "--pool", "solo"]
    cmd += ["--without-heartbeat", "--without-mingle", "--without-gossip", "-l", "info"]
    return subprocess.Popen(cmd, cwd=REPO_ROOT, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT)


def wait_for(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def test_sigkilled_worker_then_resume(slow_sim: SimHandle, tmp_path: Path) -> None:
    version = answer_suite(slow_sim, 30)
    run = make_run(version, slow_sim, slow_sim, concurrency=2)
    first = start_worker(tmp_path / "w1.log")
    try:
        run_evaluation.apply_async(args=(run.pk,), queue="control")
        wait_for(lambda: run.samples.count() >= 4, 60, "the first samples")
        first.send_signal(signal.SIGKILL)
        first.wait(10)
    finally:
        if first.poll() is None:
            first.kill()
    connection.close()
    kept = set(run.samples.values_list("case_id", flat=True))
    kept_rows = set(run.samples.values_list("pk", flat=True))
    run.refresh_from_db()
    assert run.state == RunState.RUNNING and 4 <= len(kept) < 30

    # kombu's Redis transport looks for overdue unacknowledged messages when a worker starts and then only
    # every 10th check of 10 s (unacked_restore_interval x unacked_restore_throttle): start the second
    # worker once the task's visibility timeout has passed, as a replacement worker would come up.
    time.sleep(VISIBILITY_TIMEOUT_S + 1)
    second = start_worker(tmp_path / "w2.log")
    try:
        wait_for(
            lambda: EvalRun.objects.get(pk=run.pk).state == RunState.COMPLETED,
            90,
            "the resumed run to finish",
        )
    finally:
        second.terminate()
        second.wait(10)
    run.refresh_from_db()
    case_ids = list(run.samples.values_list("case_id", flat=True))
    assert len(case_ids) == len(set(case_ids)) == 30 == run.done_count
    assert kept <= set(case_ids) and run.attempts == 2 and run.error_count == 0
    # The samples stored before the kill were kept as they were, not written again.
    assert kept_rows <= set(run.samples.values_list("pk", flat=True))
    assert run.summary["exact_match_rate"] == 1.0
