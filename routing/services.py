"""Domain logic of routing outside the hot path: request-log retention."""

from __future__ import annotations

import datetime as dt

from django.conf import settings
from django.utils import timezone

from routing.models import RequestLog

PRUNE_BATCH = 10_000


def prune_request_log(retention_days: int | None = None, *, batch: int = PRUNE_BATCH) -> int:
    """Delete request-log rows older than the retention period, in id batches; returns rows deleted.

    Batches keep each DELETE short so the proxy's inserts never queue behind one huge transaction.
    """
    days = settings.REQUEST_LOG_RETENTION_DAYS if retention_days is None else retention_days
    cutoff = timezone.now() - dt.timedelta(days=days)
    deleted = 0
    while True:
        ids = list(RequestLog.objects.filter(created_at__lt=cutoff).values_list("id", flat=True)[:batch])
        if not ids:
            return deleted
        deleted += RequestLog.objects.filter(id__in=ids)._raw_delete(RequestLog.objects.db)
