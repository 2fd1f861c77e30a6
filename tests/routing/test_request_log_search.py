"""The request log as an investigation tool (API): find a request by its id, filter by API key (its id
or prefix, never the key), the names of the deployment, model version and key beside their ids, and
field errors that say what was wrong."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from rest_framework.test import APIClient

from console.models import Tenant
from console.services import issue_api_key
from models_registry.models import Model, ModelVersion
from nodes.choices import Engine
from nodes.models import Deployment, Host
from routing.models import RequestLog

pytestmark = pytest.mark.django_db

URL = "/api/request-log/"


def _deployment() -> Deployment:
    host = Host.objects.create(name="h1", address="127.0.0.1")
    version = ModelVersion.objects.create(
        model=Model.objects.create(name="Llama-3.1-8B-Instruct"),
        revision="awq",
        source_kind="directory",
        source_path="/srv/models/llama-awq",
    )
    return Deployment.objects.create(
        name="llama-awq-0", model_version=version, engine=Engine.SIM, host=host, gpu_indices=[0], port=18001
    )


def _row(**values: Any) -> dict[str, Any]:
    return {"status": 200, "alias": "llama", "created_at": timezone.now(), **values}


def test_a_request_is_found_by_its_id_with_names_and_milliseconds(viewer_client: APIClient) -> None:
    deployment = _deployment()
    acme = Tenant.objects.create(name="acme")
    key = issue_api_key(tenant=acme, name="batch jobs").api_key
    at = dt.datetime(2025, 3, 4, 5, 6, 7, 891000, tzinfo=dt.UTC)
    RequestLog.objects.bulk_create(
        [
            RequestLog(**_row(request_id=f"{n:032x}", created_at=at - dt.timedelta(seconds=n)))
            for n in range(1, 40)
        ]
        + [
            RequestLog(
                **_row(
                    request_id="5f3c2a9e0b1d4c6e8f7a0000000000aa",
                    created_at=at,
                    tenant_id=acme.pk,
                    tenant_name="acme",
                    key_prefix=key.prefix,
                    deployment_id=deployment.pk,
                    model_version_id=deployment.model_version_id,
                )
            )
        ]
    )
    body = viewer_client.get(URL, {"request_id": " 5f3c2a9e0b1d4c6e8f7a0000000000aa "}).json()
    [row] = body["results"]
    assert row["request_id"] == "5f3c2a9e0b1d4c6e8f7a0000000000aa"
    assert row["created_at"] == "2025-03-04T05:06:07.891000Z"  # the millisecond, the zone (UTC)
    assert (row["deployment_id"], row["deployment_name"]) == (deployment.pk, "llama-awq-0")
    assert row["model_version_name"] == "Llama-3.1-8B-Instruct@awq"
    assert (row["key_id"], row["key_name"], row["key_prefix"]) == (key.pk, "batch jobs", key.prefix)
    # The same names on the row's own URL.
    one = viewer_client.get(f"{URL}{row['id']}/").json()
    assert one["deployment_name"] == "llama-awq-0" and one["key_name"] == "batch jobs"
    # An answer replayed from a cache stage carries "chatcmpl-<request id>": that finds it too.
    again = viewer_client.get(URL, {"request_id": "chatcmpl-5f3c2a9e0b1d4c6e8f7a0000000000aa"}).json()
    assert [r["id"] for r in again["results"]] == [row["id"]]
    assert viewer_client.get(URL, {"request_id": "0" * 32}).json()["results"] == []


def test_names_of_rows_that_are_gone_are_null(viewer_client: APIClient) -> None:
    gone = _row(deployment_id=999_999, model_version_id=999_998, key_prefix="ick_gone0000")
    RequestLog.objects.create(**gone)
    [row] = viewer_client.get(URL).json()["results"]
    assert (row["deployment_id"], row["deployment_name"]) == (999_999, None)
    assert (row["model_version_id"], row["model_version_name"]) == (999_998, None)
    assert (row["key_id"], row["key_name"]) == (None, None)


def test_filter_by_key_id_or_prefix(viewer_client: APIClient) -> None:
    acme, globex = Tenant.objects.create(name="acme"), Tenant.objects.create(name="globex")
    mine = issue_api_key(tenant=acme, name="mine").api_key
    other = issue_api_key(tenant=acme, name="other").api_key
    # Another tenant's key with the same visible prefix (prefixes are short): not this key's requests.
    twin = issue_api_key(tenant=globex, name="twin").api_key
    twin.prefix = mine.prefix
    twin.save(update_fields=["prefix"])
    RequestLog.objects.bulk_create(
        [RequestLog(**_row(tenant_id=acme.pk, key_prefix=mine.prefix)) for _ in range(3)]
        + [RequestLog(**_row(tenant_id=acme.pk, key_prefix=other.prefix)) for _ in range(2)]
        + [RequestLog(**_row(tenant_id=globex.pk, key_prefix=mine.prefix))]
    )
    rows = viewer_client.get(URL, {"key_id": mine.pk}).json()["results"]
    assert len(rows) == 3 and {(r["key_id"], r["key_name"]) for r in rows} == {(mine.pk, "mine")}
    assert len(viewer_client.get(URL, {"key_id": other.pk}).json()["results"]) == 2
    assert len(viewer_client.get(URL, {"key_prefix": mine.prefix}).json()["results"]) == 4


def test_bad_input_gets_field_errors(viewer_client: APIClient) -> None:
    acme = Tenant.objects.create(name="acme")
    raw_key = issue_api_key(tenant=acme, name="k").raw_key

    def errors(**query: Any) -> dict[str, list[str]]:
        response = viewer_client.get(URL, query)
        assert response.status_code == 400, response.content
        body: dict[str, list[str]] = response.json()
        return body

    assert "x-request-id" in errors(request_id="abc def")["request_id"][0]
    assert "x-request-id" in errors(request_id="a" * 80)["request_id"][0]
    not_a_number = "Must be the id of an API key (a whole number), as /api/keys/ lists it."
    assert errors(key_id="abc")["key_id"] == [not_a_number]
    assert errors(key_id=0)["key_id"] == ["Must be the id of an API key (1 or more)."]
    assert errors(key_id=123456)["key_id"] == ["No API key with id 123456; /api/keys/ lists them."]
    # A whole key pasted as a prefix is refused, and the answer does not repeat it.
    response = viewer_client.get(URL, {"key_prefix": raw_key})
    assert response.status_code == 400
    assert "never the whole key" in response.json()["key_prefix"][0]
    assert raw_key not in response.content.decode()
    # Several wrong fields: one error per field, in one answer.
    both = errors(request_id="no spaces allowed", key_id="x")
    assert set(both) == {"request_id", "key_id"}


def test_a_page_costs_the_same_queries_whatever_it_holds(viewer_client: APIClient) -> None:
    deployment = _deployment()
    acme = Tenant.objects.create(name="acme")
    key = issue_api_key(tenant=acme, name="k").api_key
    row = _row(
        tenant_id=acme.pk,
        key_prefix=key.prefix,
        deployment_id=deployment.pk,
        model_version_id=deployment.model_version_id,
    )
    RequestLog.objects.bulk_create([RequestLog(**row) for _ in range(5)])
    with CaptureQueriesContext(connection) as few:
        assert len(viewer_client.get(URL).json()["results"]) == 5
    RequestLog.objects.bulk_create([RequestLog(**row) for _ in range(40)])
    with CaptureQueriesContext(connection) as many:
        assert len(viewer_client.get(URL).json()["results"]) == 45
    assert len(many) == len(few)


def test_a_request_id_lookup_uses_its_index(viewer_client: APIClient) -> None:
    if connection.vendor != "postgresql":
        pytest.skip("the partitioned table and its plans are PostgreSQL's")
    RequestLog.objects.bulk_create([RequestLog(**_row(request_id=f"{n:032x}")) for n in range(200)])
    query = RequestLog.objects.filter(request_id=f"{7:032x}").order_by("-created_at", "-id")[:51]
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")  # a tiny test table would be scanned whole
        plan = query.explain()
    assert "reqlog_request_id" in plan
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*), bool_and(x.indisvalid) FROM pg_index x "
            "JOIN pg_class c ON c.oid = x.indexrelid WHERE c.relname = 'reqlog_request_id' "
            "OR c.relname LIKE 'routing_requestlog_%%_reqlog_request_id'"
        )
        count, valid = cursor.fetchone()
        cursor.execute(
            "SELECT count(*) FROM pg_inherits WHERE inhparent = 'routing_requestlog'::regclass",
        )
        partitions = cursor.fetchone()[0]
    assert valid and count == partitions + 1  # the parent's index and one per partition
