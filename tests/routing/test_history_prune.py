"""Pruning drops each resolution's points past its own retention (24 h of 10 s, 7 days of 1 min, 90 days
of 1 h by default), and only those."""

from __future__ import annotations

import datetime as dt
import time

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from routing.models import MetricRollup
from routing.rollups import services

pytestmark = pytest.mark.django_db


def test_prune_by_age_per_resolution(settings: object) -> None:
    now = time.time()
    ages = {10: 86400.0, 60: 7 * 86400.0, 3600: 90 * 86400.0}
    for resolution, keep in ages.items():
        for label, age in (("old", keep + 60), ("kept", keep - 60)):
            MetricRollup.objects.create(
                resolution_s=resolution,
                kind="gpu",
                subject=f"{label}:{resolution}",
                bucket=dt.datetime.fromtimestamp(now - age, dt.UTC),
                values=[1],
            )
    with CaptureQueriesContext(connection) as ctx:
        deleted = services.prune(now)
    assert deleted == {10: 1, 60: 1, 3600: 1}
    assert sum(q["sql"].startswith("DELETE") for q in ctx.captured_queries) == 3
    assert sorted(MetricRollup.objects.values_list("subject", flat=True)) == [
        "kept:10",
        "kept:3600",
        "kept:60",
    ]


def test_retention_follows_settings(settings: object) -> None:
    settings.HISTORY_KEEP_10S_HOURS = 1.0  # type: ignore[attr-defined]
    now = time.time()
    MetricRollup.objects.create(
        resolution_s=10,
        kind="gpu",
        subject="h:0",
        bucket=dt.datetime.fromtimestamp(now - 2 * 3600, dt.UTC),
        values={},
    )
    assert services.prune(now)[10] == 1
