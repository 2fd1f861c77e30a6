"""List endpoints cost the same number of queries for 2 rows as for 8: no N+1."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from rest_framework.test import APIClient

from models_registry.models import ModelAlias
from tests.registry.conftest import make_model_dir
from tests.registry.factories import make_awq, make_model, register_dir

pytestmark = pytest.mark.django_db

URLS = ["/api/model-versions/", "/api/model-aliases/", "/api/models/", "/api/model-versions/lineage/"]


def add_family(root: Path, index: int, awq: Any) -> None:
    model = make_model(f"family-{index}")
    full = register_dir(make_model_dir(root, f"f{index}"), model=model, revision="fp16")
    child = register_dir(
        make_model_dir(root, f"q{index}"), model=model, revision="awq", parent=full, quantization=awq
    )
    ModelAlias.objects.create(name=f"alias-{index}", active_version=child)


def query_counts(client: APIClient) -> dict[str, int]:
    counts = {}
    for url in URLS:
        with CaptureQueriesContext(connection) as queries:
            assert client.get(url).status_code == 200
        counts[url] = len(queries)
    return counts


def test_list_queries_do_not_grow_with_rows(admin_client: APIClient, model_root: Path) -> None:
    awq = make_awq()
    add_family(model_root, 0, awq)
    small = query_counts(admin_client)
    for index in range(1, 4):
        add_family(model_root, index, awq)
    assert query_counts(admin_client) == small
