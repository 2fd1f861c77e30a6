"""The shadow-pair review API: reads for every signed-in role, marks for evaluators and admins (audited),
each filter and order, and a bad mark refused by field."""

from __future__ import annotations

import datetime as dt

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from core.models import AuditEvent
from routing.models import ShadowPair
from tests.routing.rollouts import Canary, canary, new_version, shadow_pair

pytestmark = pytest.mark.django_db


@pytest.fixture
def c() -> Canary:
    return canary()


@pytest.fixture
def pairs(c: Canary) -> dict[str, ShadowPair]:
    """Four pairs, oldest first: same answer, a different one, a failed candidate, another alias's."""
    t0 = timezone.now() - dt.timedelta(minutes=10)
    return {
        "same": shadow_pair(c.alias, c.v1, c.v2, "Paris is the capital.", "Paris is the capital.", at=t0),
        "differs": shadow_pair(
            c.alias,
            c.v1,
            c.v2,
            "Paris is the capital.",
            "Lyon is the capital.",
            at=t0 + dt.timedelta(seconds=1),
        ),
        "failed": shadow_pair(
            c.alias, c.v1, c.v2, "Paris.", "", error="HTTP 500", at=t0 + dt.timedelta(seconds=2)
        ),
        "other": shadow_pair(
            c.alias, c.v1, c.v2, "a", "b", alias_name="llama-other", at=t0 + dt.timedelta(seconds=3)
        ),
    }


def ids(response: object) -> list[int]:
    data = response.json()  # type: ignore[attr-defined]
    return [p["id"] for p in data["results"]]


# -- reads ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("who", ["admin_client", "evaluator_client", "viewer_client"])
def test_every_role_reads_a_paginated_list_and_a_pair(
    c: Canary, pairs: dict[str, ShadowPair], who: str, request: pytest.FixtureRequest
) -> None:
    client: APIClient = request.getfixturevalue(who)
    listed = client.get("/api/shadow-pairs/", {"alias": c.alias.name, "limit": "2"})
    assert listed.status_code == 200
    body = listed.json()
    assert body["count"] == 3 and len(body["results"]) == 2 and body["next"]  # paginated, newest first
    assert ids(listed) == [pairs["failed"].pk, pairs["differs"].pk]
    one = client.get(f"/api/shadow-pairs/{pairs['differs'].pk}/")
    assert one.status_code == 200
    pair = one.json()
    assert pair["messages"] == [{"role": "user", "content": "Say something."}] and pair["prompt"] is None
    assert pair["primary_version_label"] == str(c.v1) and pair["candidate_version_label"] == str(c.v2)
    assert pair["exact_match"] is False and pair["first_divergence"] == 0 and 0 < pair["chrf"] < 100
    assert pair["mark"] == "" and pair["marked_by_name"] == "" and pair["marked_at"] is None


def test_anonymous_is_refused(pairs: dict[str, ShadowPair], anon_client: APIClient) -> None:
    pk = pairs["differs"].pk
    assert anon_client.get("/api/shadow-pairs/").status_code == 401
    assert anon_client.get(f"/api/shadow-pairs/{pk}/").status_code == 401
    assert (
        anon_client.post(f"/api/shadow-pairs/{pk}/mark/", {"mark": "same"}, format="json").status_code == 401
    )
    assert ShadowPair.objects.get(pk=pk).mark == ""


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ({"differs": "true"}, ["differs"]),
        ({"differs": "false"}, ["same"]),
        ({"failed": "true"}, ["failed"]),
        ({"failed": "false"}, ["differs", "same"]),
        ({"ordering": "chrf"}, ["differs", "same", "failed"]),  # lowest chrF first, unscored last
        ({"ordering": "created_at"}, ["same", "differs", "failed"]),
    ],
)
def test_filters_and_orders(
    c: Canary,
    pairs: dict[str, ShadowPair],
    viewer_client: APIClient,
    query: dict[str, str],
    expected: list[str],
) -> None:
    got = ids(viewer_client.get("/api/shadow-pairs/", {"alias": c.alias.name, **query}))
    assert got == [pairs[name].pk for name in expected]


def test_filter_by_candidate_version_and_by_mark(
    c: Canary, pairs: dict[str, ShadowPair], evaluator_client: APIClient
) -> None:
    v3 = new_version(c.alias, "v3")
    third = shadow_pair(c.alias, c.v1, v3, "x", "y")
    got = ids(evaluator_client.get("/api/shadow-pairs/", {"candidate_version": v3.pk}))
    assert got == [third.pk]
    evaluator_client.post(
        f"/api/shadow-pairs/{pairs['differs'].pk}/mark/", {"mark": "regression"}, format="json"
    )
    q = {"alias": c.alias.name}
    assert ids(evaluator_client.get("/api/shadow-pairs/", {**q, "marked": "regression"})) == [
        pairs["differs"].pk
    ]
    assert ids(evaluator_client.get("/api/shadow-pairs/", {**q, "marked": "any"})) == [pairs["differs"].pk]
    assert ids(evaluator_client.get("/api/shadow-pairs/", {**q, "marked": "same"})) == []
    assert pairs["differs"].pk not in ids(evaluator_client.get("/api/shadow-pairs/", {**q, "marked": "none"}))
    bad = evaluator_client.get("/api/shadow-pairs/", {"marked": "great", "differs": "maybe"})
    assert bad.status_code == 400 and {"marked", "differs"} <= set(bad.json())


# -- marks ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("who", ["admin_client", "evaluator_client"])
def test_evaluators_and_admins_mark_and_clear_audited(
    pairs: dict[str, ShadowPair], who: str, request: pytest.FixtureRequest
) -> None:
    client: APIClient = request.getfixturevalue(who)
    user = request.getfixturevalue(who.replace("_client", "_user"))
    pair = pairs["differs"]
    url = f"/api/shadow-pairs/{pair.pk}/mark/"
    first = client.post(url, {"mark": "acceptable", "comment": "same city, other words"}, format="json")
    assert first.status_code == 200
    assert first.json()["mark"] == "acceptable" and first.json()["marked_by_name"] == user.username
    again = client.post(url, {"mark": "regression", "comment": "wrong city"}, format="json")
    assert again.status_code == 200 and again.json()["comment"] == "wrong city"
    pair.refresh_from_db()
    assert (pair.mark, pair.marked_by_id) == ("regression", user.pk) and pair.marked_at is not None
    cleared = client.delete(url)
    assert cleared.status_code == 200 and cleared.json()["mark"] == ""
    pair.refresh_from_db()
    assert (pair.mark, pair.comment, pair.marked_by_id, pair.marked_at) == ("", "", None, None)
    events = list(
        AuditEvent.objects.filter(object_type="routing.shadowpair", object_id=str(pair.pk)).order_by("id")
    )
    assert [e.action for e in events] == ["create", "update", "delete"]
    assert all(e.actor_name == user.username for e in events)
    before, after = events[1].before or {}, events[1].after or {}
    assert before["mark"] == "acceptable" and after["mark"] == "regression"
    assert after["alias"] == pair.alias
    assert "primary_output" not in after  # the tenant's text stays in the pair, not in the audit log


def test_failed_pair_can_be_marked(pairs: dict[str, ShadowPair], evaluator_client: APIClient) -> None:
    url = f"/api/shadow-pairs/{pairs['failed'].pk}/mark/"
    assert evaluator_client.post(url, {"mark": "regression"}, format="json").status_code == 200


def test_viewer_cannot_mark(pairs: dict[str, ShadowPair], viewer_client: APIClient) -> None:
    pair = pairs["differs"]
    url = f"/api/shadow-pairs/{pair.pk}/mark/"
    assert viewer_client.post(url, {"mark": "same"}, format="json").status_code == 403
    assert viewer_client.delete(url).status_code == 403
    pair.refresh_from_db()
    assert pair.mark == ""
    assert not AuditEvent.objects.filter(object_type="routing.shadowpair").exists()


def test_pairs_are_read_only_apart_from_marks(pairs: dict[str, ShadowPair], admin_client: APIClient) -> None:
    pk = pairs["differs"].pk
    assert admin_client.post("/api/shadow-pairs/", {}, format="json").status_code == 405
    assert admin_client.patch(f"/api/shadow-pairs/{pk}/", {"mark": "same"}, format="json").status_code == 405
    assert admin_client.delete(f"/api/shadow-pairs/{pk}/").status_code == 405


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"mark": "great"}, "mark"),
        ({}, "mark"),
        ({"mark": "same", "comment": "x" * 5001}, "comment"),
        ({"mark": "same", "marked_by": 1}, "marked_by"),
    ],
)
def test_bad_mark_is_a_field_error(
    pairs: dict[str, ShadowPair], evaluator_client: APIClient, body: dict[str, object], field: str
) -> None:
    pair = pairs["differs"]
    response = evaluator_client.post(f"/api/shadow-pairs/{pair.pk}/mark/", body, format="json")
    assert response.status_code == 400 and field in response.json()
    pair.refresh_from_db()
    assert pair.mark == ""
    assert not AuditEvent.objects.filter(object_type="routing.shadowpair").exists()


def test_unknown_pair_is_404(evaluator_client: APIClient) -> None:
    assert (
        evaluator_client.post("/api/shadow-pairs/999999/mark/", {"mark": "same"}, format="json").status_code
        == 404
    )
