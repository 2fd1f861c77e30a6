"""What serves an alias (`/api/routing/serving/`): versions, engines ready of total and the live split
agree with the deployments and the request log's last 15 minutes, and the configured share is never
passed off as the live one."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from rest_framework.test import APIClient

from nodes.models import Deployment
from routing.demo import DEMO_ALIAS, seed_demo_routing
from routing.models import RequestLog, ShadowConfig
from routing.rollouts import services
from routing.serving import alias_serving
from tests.routing.fleet import ensure_alias
from tests.routing.rollouts import canary, log_requests, new_version, ready_deployment
from tests.routing.serving import AWQ_REQUESTS, FP16_REQUESTS, log_split, two_version_alias

pytestmark = pytest.mark.django_db


def by_version(answer: dict[str, Any]) -> dict[int, dict[str, Any]]:
    return {v["version_id"]: v for v in answer["versions"]}


def test_two_versions_on_three_engines_match_the_request_log(viewer_client: APIClient) -> None:
    tv = two_version_alias()
    log_split(tv)
    reply = viewer_client.get(f"/api/routing/serving/{tv.alias.name}/")
    assert reply.status_code == 200, reply.json()
    answer = reply.json()
    assert (answer["alias_name"], answer["window_minutes"]) == (tv.alias.name, 15)
    # Policy rules send requests to pools of two versions: no fixed configured share to report.
    assert answer["configured_mode"] == "rules"
    assert [(v["version_label"], v["role"]) for v in answer["versions"]] == [
        (str(tv.fp16), "active"),
        (str(tv.awq), "pinned"),
    ]
    fp16, awq = by_version(answer)[tv.fp16.pk], by_version(answer)[tv.awq.pk]
    assert (fp16["engines_ready"], fp16["engines_total"]) == (1, 1)
    assert (awq["engines_ready"], awq["engines_total"]) == (2, 2)
    assert (answer["engines_ready"], answer["engines_total"]) == (3, 3)
    # Only the window's answered rows count: not the hour-old ones, the refusals or the other alias's.
    assert (fp16["requests"], awq["requests"], answer["requests"]) == (36, 64, 100)
    recent = RequestLog.objects.filter(
        alias=tv.alias.name,
        model_version_id__isnull=False,
        created_at__gte=timezone.now() - dt.timedelta(minutes=15),
    )
    for version, row in ((tv.fp16, fp16), (tv.awq, awq)):
        expected = 100 * recent.filter(model_version_id=version.pk).count() / recent.count()
        assert row["live_share"] == pytest.approx(expected)
    assert awq["live_share"] == pytest.approx(100 * AWQ_REQUESTS / (AWQ_REQUESTS + FP16_REQUESTS))
    assert fp16["configured_share"] is None and awq["configured_share"] is None
    assert awq["routes"] == ["pool llama-serving-fast: rule 2 (prompts up to 6000 tokens)"]
    assert fp16["routes"] == [
        "pool llama-serving-long: rule 1 (task summarize), default, fallback when the chosen pool has no "
        "free endpoint, spill from llama-serving-fast while it has headroom"
    ]


def test_the_list_gives_the_same_answer_and_a_window_can_be_asked(viewer_client: APIClient) -> None:
    tv = two_version_alias()
    log_split(tv)
    listed = viewer_client.get("/api/routing/serving/")
    assert listed.status_code == 200
    [row] = [r for r in listed.json() if r["alias_name"] == tv.alias.name]
    one = viewer_client.get(f"/api/routing/serving/{tv.alias.name}/").json()
    for answer in (row, one):
        assert [(v["version_id"], v["requests"], v["engines_ready"]) for v in answer["versions"]] == [
            (tv.fp16.pk, 36, 1),
            (tv.awq.pk, 64, 2),
        ]
    # Two hours take in the hour-old rows too: 336 fp16 of 400.
    wide = viewer_client.get(f"/api/routing/serving/{tv.alias.name}/", {"minutes": 120}).json()
    assert wide["window_minutes"] == 120
    assert by_version(wide)[tv.fp16.pk]["live_share"] == pytest.approx(100 * 336 / 400)
    for bad in ("0", "1441", "x"):
        reply = viewer_client.get("/api/routing/serving/", {"minutes": bad})
        assert reply.status_code == 400 and "minutes" in reply.json()
    assert viewer_client.get("/api/routing/serving/no-such-alias/").status_code == 404


def test_a_canary_reports_its_configured_share_apart_from_the_live_one(viewer_client: APIClient) -> None:
    c = canary("llama-canary-serving")
    services.start_rollout(c.alias, c.v2, [10, 100], actor=None)
    # The candidate took 30 of 100 requests (a sticky draw over few tenants can do that).
    at = timezone.now() - dt.timedelta(minutes=1)
    log_requests(c.alias, c.v1, 70, at=at)
    log_requests(c.alias, c.v2, 30, at=at)
    answer = viewer_client.get(f"/api/routing/serving/{c.alias.name}/").json()
    assert (answer["configured_mode"], answer["rollout_share"]) == ("fixed", 10.0)
    v1, v2 = by_version(answer)[c.v1.pk], by_version(answer)[c.v2.pk]
    assert (v1["role"], v1["configured_share"], v1["live_share"]) == ("active", 90.0, 70.0)
    assert (v2["role"], v2["configured_share"], v2["live_share"]) == ("candidate", 10.0, 30.0)
    assert v2["routes"] == ["pool llama-canary-serving: canary 10% of the alias's pool"]


def test_no_traffic_is_no_live_share_and_an_unrouted_version_is_idle(viewer_client: APIClient) -> None:
    alias = ensure_alias("llama-quiet")
    v2 = new_version(alias, "v2")
    ready_deployment(alias, alias.active_version)
    ready_deployment(alias, v2)  # under the alias's name, but no pool or rollout sends it anything
    failing = ready_deployment(alias, alias.active_version)
    Deployment.objects.filter(pk=failing.pk).update(state="crashed")
    ShadowConfig.objects.create(alias=alias, candidate_version=v2, percent=5)
    answer = viewer_client.get("/api/routing/serving/llama-quiet/").json()
    assert (answer["configured_mode"], answer["requests"]) == ("fixed", 0)
    active, other = by_version(answer)[alias.active_version_id], by_version(answer)[v2.pk]
    assert (active["configured_share"], active["live_share"]) == (100.0, None)
    assert (active["engines_ready"], active["engines_total"]) == (1, 2)
    assert (other["role"], other["configured_share"], other["mirrored_percent"]) == ("shadow", 0.0, 5.0)
    assert (other["engines_ready"], other["engines_total"]) == (1, 1)


def test_a_version_that_served_in_the_window_and_no_longer_does_is_listed(viewer_client: APIClient) -> None:
    alias = ensure_alias("llama-moved")
    old = new_version(alias, "old")
    ready_deployment(alias, alias.active_version)
    log_requests(alias, old, 25, at=timezone.now() - dt.timedelta(minutes=3))
    log_requests(alias, alias.active_version, 75, at=timezone.now() - dt.timedelta(minutes=1))
    answer = viewer_client.get("/api/routing/serving/llama-moved/").json()
    gone = by_version(answer)[old.pk]
    assert (gone["role"], gone["engines_total"], gone["live_share"]) == ("retired", 0, 25.0)
    assert sum(v["live_share"] for v in answer["versions"]) == pytest.approx(100)


def test_the_list_costs_the_same_queries_for_one_alias_or_many() -> None:
    tv = two_version_alias("llama-q1")
    log_split(tv)
    with CaptureQueriesContext(connection) as one:
        alias_serving()
    for n in range(2, 5):
        log_split(two_version_alias(f"llama-q{n}"))
    with CaptureQueriesContext(connection) as many:
        answers = alias_serving()
    assert len(answers) >= 4
    assert len(many) == len(one)


def test_anonymous_reads_nothing(anon_client: APIClient) -> None:
    ensure_alias("llama-anon")
    assert anon_client.get("/api/routing/serving/").status_code == 401
    assert anon_client.get("/api/routing/serving/llama-anon/").status_code == 401


def test_the_demos_own_routing_reads_as_the_proxy_builds_it(
    viewer_client: APIClient, redis_clean: None
) -> None:
    # The demo's engines as `make run` seeds them (nodes.demo), then its pools and policy (routing.demo).
    alias = ensure_alias(DEMO_ALIAS)
    awq = new_version(alias, "demo-awq")
    long = ready_deployment(alias, alias.active_version)
    fast = [ready_deployment(alias, awq), ready_deployment(alias, awq)]
    Deployment.objects.filter(pk=long.pk).update(role="long-context")
    Deployment.objects.filter(pk__in=[d.pk for d in fast]).update(role="high-throughput")
    seed_demo_routing()
    at = timezone.now() - dt.timedelta(minutes=5)
    log_requests(alias, alias.active_version, 9, at=at)
    log_requests(alias, awq, 16, at=at)
    answer = viewer_client.get(f"/api/routing/serving/{DEMO_ALIAS}/").json()
    assert answer["configured_mode"] == "rules"
    assert [(v["role"], v["engines_ready"], v["live_share"]) for v in answer["versions"]] == [
        ("active", 1, 36.0),
        ("pinned", 2, 64.0),
    ]
    assert by_version(answer)[awq.pk]["routes"] == ["pool llama-fast: rule 2 (prompts up to 6000 tokens)"]
