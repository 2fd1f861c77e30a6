"""The control plane's Celery app with two more tasks, for tests/test_worker_stop.py's real worker.

`celery -A tests.celery_stop_app worker` loads core.celery's app (so its signal receivers) and this task.
"""

from __future__ import annotations

import gc
import time
from pathlib import Path

from core.celery import app

__all__ = ["app", "frozen_count", "slow_write"]


@app.task(name="tests.slow_write")
def slow_write(directory: str, seconds: float) -> None:
    """Mark the start, take `seconds`, mark the end: a task a stop can catch in the middle."""
    Path(directory, "started").touch()
    time.sleep(seconds)
    Path(directory, "done").touch()


@app.task(name="tests.frozen_count")
def frozen_count(directory: str) -> None:
    """Write how many objects the pool child's collector holds in its permanent generation."""
    Path(directory, "frozen").write_text(str(gc.get_freeze_count()))
