"""Rows older than the retention period are deleted; newer ones stay."""

from __future__ import annotations

import datetime as dt

import pytest
from django.utils import timezone

from routing.models import RequestLog
from routing.services import prune_request_log

pytestmark = pytest.mark.django_db


def test_prune_keeps_only_rows_inside_retention() -> None:
    now = timezone.now()
    RequestLog.objects.bulk_create(
        [RequestLog(created_at=now - dt.timedelta(days=d), status=200, alias="m") for d in (0, 1, 6, 8, 40)]
    )
    assert prune_request_log(7, batch=2) == 2
    ages = sorted((now - r.created_at).days for r in RequestLog.objects.all())
    assert ages == [0, 1, 6]
