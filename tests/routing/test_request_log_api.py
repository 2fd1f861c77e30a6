"""The request-log explorer API: filters, keyset pages, usage per hour, traffic split."""

from __future__ import annotations

import datetime as dt

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from routing.models import RequestLog

pytestmark = pytest.mark.django_db


def _rows() -> None:
    now = timezone.now()
    RequestLog.objects.bulk_create(
        [
            RequestLog(
                created_at=now - dt.timedelta(minutes=i),
                tenant_id=1 if i % 2 else 2,
                alias="llama" if i % 3 else "qwen",
                status=200 if i % 5 else 502,
                deployment_id=i % 2,
                route_pool="fast",
                prompt_tokens=10,
                completion_tokens=5,
            )
            for i in range(30)
        ]
    )


def test_filters_and_keyset_pages(viewer_client: APIClient) -> None:
    _rows()
    query: dict[str, str | int] = {"tenant_id": 1, "alias": "llama", "page_size": 3}
    first = viewer_client.get("/api/request-log/", query).json()
    expected = RequestLog.objects.filter(tenant_id=1, alias="llama").count()
    assert len(first["results"]) == 3
    seen = [r["id"] for r in first["results"]]
    nxt = first["next"]
    while nxt:
        page = viewer_client.get(nxt).json()
        seen += [r["id"] for r in page["results"]]
        nxt = page["next"]
    assert len(seen) == len(set(seen)) == expected
    errors = viewer_client.get("/api/request-log/", {"status_min": 500}).json()["results"]
    assert errors and all(r["status"] == 502 for r in errors)
    since = (timezone.now() - dt.timedelta(minutes=5, seconds=30)).isoformat()
    recent = viewer_client.get("/api/request-log/", {"since": since}).json()["results"]
    assert len(recent) == 6


def test_usage_and_traffic(viewer_client: APIClient) -> None:
    _rows()
    usage = viewer_client.get("/api/routing/usage/", {"tenant_id": 2}).json()
    assert sum(b["requests"] for b in usage) == 15
    assert sum(b["prompt_tokens"] for b in usage) == 150
    split = viewer_client.get("/api/routing/traffic/", {"minutes": 60}).json()
    assert split["minutes"] == 60
    assert sum(s["requests"] for s in split["routed"]) == 30
    assert split["refused"] == []
    assert viewer_client.get("/api/routing/usage/", {"hours": "x"}).status_code == 400


def test_requests_refused_before_routing_are_counted_apart(viewer_client: APIClient) -> None:
    _rows()
    now = timezone.now()
    RequestLog.objects.bulk_create(
        [
            RequestLog(created_at=now, status=429, error_type="rate_limit_exceeded", route_pool="")
            for _ in range(4)
        ]
        + [RequestLog(created_at=now, status=400, error_type="context_length_exceeded", route_pool="")]
    )
    split = viewer_client.get("/api/routing/traffic/", {"minutes": 60}).json()
    # Routed traffic is what the pools served; refusals never reached one and are not part of its split.
    assert {row["route_pool"] for row in split["routed"]} == {"fast"}
    assert sum(row["requests"] for row in split["routed"]) == 30
    assert split["refused"] == [
        {"status": 429, "error_type": "rate_limit_exceeded", "requests": 4},
        {"status": 400, "error_type": "context_length_exceeded", "requests": 1},
    ]
