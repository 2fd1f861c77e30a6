"""Helpers for e2e tests of the live pages: an hour of stored samples, ORM writes off Playwright's loop."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from django.db import connections

from core.redis_client import get_redis
from nodes import history

HOUR = 3600
# One stored sample every 30 s over the last hour (the oldest 59 min 50 s old): 120 points per series.
STEP = 30


def seed_hour(host_name: str, gpu_index: int, deployment_id: int | None = None) -> int:
    """An hour of samples of one GPU (and a deployment), stored as the agent would; returns the count."""
    r = get_redis()
    now_ms = int(time.time() * 1000)
    count = 0
    for age in range(HOUR - 10, 0, -STEP):
        ms = now_ms - age * 1000
        ts = ms / 1000
        gpu = {"ts": ts, "utilization_pct": 55.0, "memory_used_bytes": 70 * 1024**3, "temperature_c": 61.0}
        gpu |= {"power_watts": 410.0}
        r.xadd(
            history.gpu_series_key(host_name, gpu_index),
            history.encode(gpu, history.GPU_FIELDS),
            id=f"{ms}-0",
        )
        if deployment_id is not None:
            tps = 200.0 + 100.0 * ((age // STEP) % 4)
            engine = {"ts": ts, "tokens_per_s": tps, "kv_cache_usage_perc": 0.3, "num_requests_running": 4.0}
            engine |= {"num_requests_waiting": 1.0, "ttft_p50_s": 0.08, "itl_p50_s": 0.012}
            key = history.engine_series_key(deployment_id)
            r.xadd(key, history.encode(engine, history.ENGINE_FIELDS), id=f"{ms}-0")
        count += 1
    return count


def in_thread(work: Callable[[], Any]) -> None:
    """ORM writes that push live events, run outside Playwright's event loop (as an agent's would be)."""
    failures: list[BaseException] = []

    def run() -> None:
        try:
            work()
        except BaseException as exc:
            failures.append(exc)
        finally:
            connections.close_all()

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(30)
    assert not failures, failures
