"""A starting proxy runs the request log's partition upkeep on its writer thread, before its first batch."""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable

from django.db import connection

from routing.services import partition_name, request_log_partitions

from .conftest import Proc


def test_proxy_start_creates_the_days_partitions(start_proxy: Callable[..., Proc]) -> None:
    today = dt.datetime.now(dt.UTC).date()
    names = [partition_name(today + dt.timedelta(days=n)) for n in range(2)]
    with connection.cursor() as cursor:
        for name in names:
            cursor.execute(f'DROP TABLE IF EXISTS "{name}"')
    assert not {p.name for p in request_log_partitions()} & set(names)
    start_proxy()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and not set(names) <= {p.name for p in request_log_partitions()}:
        time.sleep(0.2)
    assert set(names) <= {p.name for p in request_log_partitions()}
