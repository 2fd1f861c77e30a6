"""The fleet exposition served from its latest render (routing/fleet_metrics.py): never older than
FLEET_METRICS_MAX_AGE_SECONDS, refreshed after a record changes once the bound has passed, gzip'd for a
scraper that accepts it, and the metrics token checked before anything is read, rendered or served."""

from __future__ import annotations

import gzip
import time
from typing import Any

import orjson
import pytest
from django.test import Client
from prometheus_client.parser import text_string_to_metric_families

from core.celery import app
from core.redis_client import get_redis
from nodes.lifecycle import live_gpu_key
from nodes.models import Host
from routing import fleet_metrics
from tests.nodes.conftest import make_host

pytestmark = pytest.mark.django_db

TOKEN = "metrics-token-for-tests-0123456789"


@pytest.fixture
def gpu_host(redis_clean: None, settings: Any) -> Host:
    settings.FLEET_METRICS_MAX_AGE_SECONDS = 0.6
    host = make_host("expo-node")
    publish(host, temperature_c=60.0)
    return host


def publish(host: Host, **fields: Any) -> None:
    record = {"memory_used_bytes": 1, "memory_total_bytes": 2, **fields}
    get_redis().set(live_gpu_key(host.name, 0), orjson.dumps(record), ex=60)


def temperature(body: bytes) -> float:
    families = {f.name: f for f in text_string_to_metric_families(body.decode())}
    [sample] = families["inferchain_gpu_temperature_celsius"].samples
    return float(sample.value)


def read_at(body: bytes) -> float:
    families = {f.name: f for f in text_string_to_metric_families(body.decode())}
    [sample] = families["inferchain_exposition_read_timestamp_seconds"].samples
    return float(sample.value)


def test_served_from_the_render_until_the_bound_then_read_again(gpu_host: Host) -> None:
    client = Client()
    first = client.get("/metrics").content
    assert temperature(first) == 60.0
    publish(gpu_host, temperature_c=70.0)
    # Within the bound: the same render, so the same read time and the old number.
    again = client.get("/metrics").content
    assert again == first and temperature(again) == 60.0
    assert time.time() - read_at(again) <= 0.6
    time.sleep(0.65)
    fresh = client.get("/metrics").content
    assert temperature(fresh) == 70.0
    assert read_at(fresh) > read_at(first) and time.time() - read_at(fresh) <= 0.6


def test_refresh_ahead_stores_a_newer_render_for_every_process(gpu_host: Host) -> None:
    client = Client()
    client.get("/metrics")
    publish(gpu_host, temperature_c=75.0)
    stored = fleet_metrics.refresh_once()
    assert stored is not None
    # Any process's next scrape serves the stored render: the new number, before the old one expired.
    body = client.get("/metrics").content
    assert temperature(body) == 75.0 and read_at(body) == stored.read_at


def test_a_scrape_waits_for_the_render_in_flight_or_renders_itself(gpu_host: Host, monkeypatch: Any) -> None:
    # Another process holds the render lease and never stores: the scrape still answers, fresh.
    get_redis().set(fleet_metrics._lease_key(), "another-process", ex=30)
    monkeypatch.setattr(fleet_metrics, "WAIT_SECONDS", 0.2)
    assert fleet_metrics.refresh_once() is None
    began = time.monotonic()
    body = Client().get("/metrics").content
    assert temperature(body) == 60.0 and time.time() - read_at(body) <= 0.6
    assert 0.2 <= time.monotonic() - began < 3
    assert get_redis().get(fleet_metrics._lease_key()) == b"another-process"


def test_max_age_zero_renders_every_scrape(gpu_host: Host, settings: Any) -> None:
    settings.FLEET_METRICS_MAX_AGE_SECONDS = 0
    client = Client()
    assert temperature(client.get("/metrics").content) == 60.0
    publish(gpu_host, temperature_c=80.0)
    assert temperature(client.get("/metrics").content) == 80.0
    assert not get_redis().exists(fleet_metrics._body_key())


def test_gzip_when_accepted_with_prometheus_content_type(gpu_host: Host) -> None:
    client = Client()
    zipped = client.get("/metrics", HTTP_ACCEPT_ENCODING="gzip")
    assert zipped.status_code == 200
    assert zipped["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
    assert zipped["Content-Encoding"] == "gzip" and zipped["Vary"] == "Accept-Encoding"
    plain = client.get("/metrics", HTTP_ACCEPT_ENCODING="identity")
    assert not plain.has_header("Content-Encoding")
    assert gzip.decompress(zipped.content) == plain.content
    assert temperature(plain.content) == 60.0


@pytest.mark.parametrize(
    ("header", "expected"),
    [("gzip", True), ("br, gzip;q=0.5", True), ("*", True), ("gzip;q=0", False), ("", False), ("br", False)],
)
def test_accepts_gzip(header: str, expected: bool) -> None:
    assert fleet_metrics.accepts_gzip(header) is expected


def test_the_token_is_checked_before_anything_is_read_or_served(gpu_host: Host, settings: Any) -> None:
    settings.METRICS_TOKEN = TOKEN
    client = Client()
    for authorization in (None, "Bearer wrong", TOKEN):
        headers = {"Accept-Encoding": "gzip"} | ({"Authorization": authorization} if authorization else {})
        refused = client.get("/metrics", headers=headers)
        assert refused.status_code == 401 and b"inferchain_" not in refused.content
    # Nothing was rendered or stored for a refused scrape, and it did not count as a scrape.
    redis = get_redis()
    assert not redis.exists(fleet_metrics._body_key()) and not redis.exists(fleet_metrics._scraped_key())
    allowed = client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
    assert allowed.status_code == 200 and temperature(allowed.content) == 60.0
    # A stored render is no way around the token either.
    assert client.get("/metrics").status_code == 401


def test_refresh_ahead_starts_early_enough_and_not_too_often(monkeypatch: Any) -> None:
    monkeypatch.setattr(fleet_metrics, "_last_render_seconds", 0.3)
    assert fleet_metrics._next_due(None, 5.0) == 0.0
    assert fleet_metrics._next_due(100.0, 5.0) == pytest.approx(104.4)  # 2 x 0.3 s before the bound
    monkeypatch.setattr(fleet_metrics, "_last_render_seconds", 4.0)
    assert fleet_metrics._next_due(100.0, 5.0) == pytest.approx(102.5)  # at most every max_age / 2


def test_the_worker_renders_ahead_only_while_someone_scrapes_and_only_when_due(gpu_host: Host) -> None:
    app.loader.import_default_modules()  # as the worker does: registers every app's tasks
    # Nobody scraped: the beat task renders nothing (an idle control plane does no work for /metrics).
    assert fleet_metrics.refresh_if_due() is False
    assert not get_redis().exists(fleet_metrics._body_key())
    client = Client()
    first = client.get("/metrics").content  # a scrape: marks the window, renders (nothing stored yet)
    # Just rendered: not due before half the bound (0.3 s of 0.6).
    assert fleet_metrics.refresh_if_due() is False
    publish(gpu_host, temperature_c=80.0)
    time.sleep(0.35)
    # Through the task, as beat runs it in the worker: a newer render, stored before the old one expired.
    assert app.tasks["routing.refresh_fleet_metrics"].apply().get() is True
    body = client.get("/metrics").content
    assert temperature(body) == 80.0 and read_at(body) > read_at(first)
