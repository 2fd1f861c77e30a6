"""The beat tasks of the history run the rollup code by their registered names: a tick writes the live
records' points, aggregation turns settled 10 s points into 1 min ones, pruning drops what is too old."""

from __future__ import annotations

import datetime as dt
import time

import pytest

from core.celery import app
from routing.models import MetricRollup
from routing.rollups.services import named_gauges
from tests.routing.history_helpers import GIB, make_fleet, publish_gpu, put_point

pytestmark = pytest.mark.django_db


def test_tasks_by_name(redis_clean: None) -> None:
    app.loader.import_default_modules()  # as the worker does: registers every app's tasks
    make_fleet(gpus=1)
    publish_gpu("hist-a", 0, utilization_pct=40.0, memory_used_bytes=10 * GIB, temperature_c=50.0)
    assert app.tasks["routing.rollup_history"].apply().get() == 1
    point = MetricRollup.objects.get(resolution_s=10, kind="gpu", subject="hist-a")
    assert named_gauges("gpu", point.values["0"])["utilization_pct"] == 40.0

    # A 10 s point of a minute that settled five minutes ago (the tick's own minute has not), and one
    # older than a day.
    minute = (int(time.time()) // 60 - 5) * 60
    put_point(10, "gpu", "hist-a:0", minute, [1])
    old = dt.datetime.fromtimestamp(time.time() - 2 * 86400, dt.UTC)
    put_point(10, "gpu", "hist-a:0", old.timestamp(), [1])
    assert app.tasks["routing.aggregate_history"].apply().get() == {"60": 1}
    assert MetricRollup.objects.filter(
        resolution_s=60, bucket=dt.datetime.fromtimestamp(minute, dt.UTC)
    ).exists()
    # A minute point of the hour before last (settled): the hours' task writes its 1 h point.
    hour = (int(time.time()) // 3600 - 2) * 3600
    put_point(60, "gpu", "hist-a:0", hour, "1,40")
    assert app.tasks["routing.aggregate_history_hours"].apply().get() == {"3600": 1}
    assert MetricRollup.objects.filter(
        resolution_s=3600, bucket=dt.datetime.fromtimestamp(hour, dt.UTC)
    ).exists()
    pruned = app.tasks["routing.prune_history"].apply().get()
    # The day-old point sits in the default partition (none is made that far back): deleted as a row.
    assert pruned["partitioned"] and pruned["deleted_rows"] == {"10": 1, "60": 0, "3600": 0}
    assert not MetricRollup.objects.filter(bucket=old).exists()
