"""Admins set the model store in the API: one active at a time, locations checked per kind, audited."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from core.models import AuditEvent
from models_registry.models import ModelStore

pytestmark = pytest.mark.django_db
URL = "/api/model-stores/"


def test_create_each_kind_and_switch_the_active_one(admin_client: APIClient) -> None:
    nfs = admin_client.post(
        URL,
        {"name": "nfs", "kind": "directory", "location": "/mnt/models/", "is_active": True},
        format="json",
    )
    assert nfs.status_code == 201, nfs.json()
    assert nfs.json()["location"] == "/mnt/models"
    web = admin_client.post(
        URL, {"name": "web", "kind": "http", "location": "http://10.0.0.5:8080/store"}, format="json"
    )
    bucket = admin_client.post(
        URL,
        {
            "name": "minio",
            "kind": "s3",
            "location": "models-bucket/prod",
            "endpoint_url": "http://minio.internal:9000",
        },
        format="json",
    )
    assert web.status_code == 201 and bucket.status_code == 201

    switched = admin_client.patch(f"{URL}{web.json()['id']}/", {"is_active": True}, format="json")

    assert switched.status_code == 200, switched.json()
    assert list(ModelStore.objects.filter(is_active=True).values_list("name", flat=True)) == ["web"]
    assert AuditEvent.objects.filter(object_type__endswith="modelstore").count() == 4


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"kind": "directory", "location": "models/relative"}, "location"),
        ({"kind": "http", "location": "ftp://host/store"}, "location"),
        ({"kind": "http", "location": "http:///no-host"}, "location"),
        ({"kind": "s3", "location": "Bad_Bucket"}, "location"),
        ({"kind": "s3", "location": "bucket", "endpoint_url": "minio:9000"}, "endpoint_url"),
        ({"kind": "http", "location": "http://h/store", "region": "eu-west-1"}, "region"),
        ({"kind": "nfs", "location": "/mnt"}, "kind"),
        ({"kind": "directory", "location": "/mnt", "secret_key": "x"}, "secret_key"),
    ],
)
def test_bad_store_is_a_field_error_and_nothing_is_written(
    admin_client: APIClient, body: dict[str, str], field: str
) -> None:
    resp = admin_client.post(URL, {"name": "bad", **body}, format="json")

    assert resp.status_code == 400
    assert field in resp.json()
    assert not ModelStore.objects.exists()


def test_viewer_reads_stores_but_cannot_change_them(
    admin_client: APIClient, viewer_client: APIClient
) -> None:
    admin_client.post(URL, {"name": "nfs", "kind": "directory", "location": "/mnt/models"}, format="json")

    assert viewer_client.get(URL).json()["results"][0]["name"] == "nfs"
    refused = viewer_client.post(URL, {"name": "x", "kind": "directory", "location": "/x"}, format="json")
    assert refused.status_code == 403
