"""Fuzz every `/api/` operation from its OpenAPI schema (schemathesis), as an admin and as a viewer:
no answer is a 5xx, and none carries a stack trace.

The schema is drf-spectacular's, generated in-process from the code under test (the same one
`manage.py spectacular` writes to frontend/openapi.yaml). Requests go through Django's WSGI handler in
this test's transaction (so everything the fuzzer creates is rolled back), with a few examples per
operation and role: the whole file runs in about a minute (`FUZZ_EXAMPLES` raises the count).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from django.core.handlers.wsgi import WSGIHandler
from django.core.signals import request_finished, request_started
from django.db import close_old_connections
from drf_spectacular.generators import SchemaGenerator
from hypothesis import HealthCheck, Phase, settings
from rest_framework.authtoken.models import Token
from schemathesis.config import SchemathesisConfig

from console.models import User

EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "4"))
STACK_TRACE = re.compile(r"Traceback \(most recent call last\)|File \"/[^\"]+\.py\", line \d+")


def _schema() -> Any:
    document = SchemaGenerator().get_schema(request=None, public=True)
    # The fuzzing phase only, positive and negative data: the coverage phase alone sends dozens of
    # requests per operation, which would put this file far over its time budget.
    config = SchemathesisConfig.from_dict(
        {
            "phases": {"coverage": {"enabled": False}, "stateful": {"enabled": False}},
            "generation": {"max-examples": EXAMPLES, "mode": "all"},
        }
    )
    schema = schemathesis.openapi.from_dict(document, config=config)
    schema.app = WSGIHandler()
    return schema


schema = _schema()
# Bounded: a handful of examples per operation, no shrinking (a failure is reported as found), and no
# wall-clock deadline (the machine is shared; speed is not what this checks).
FUZZ_SETTINGS = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,
    database=None,
    phases=[Phase.explicit, Phase.generate],
    suppress_health_check=list(HealthCheck),
)


@pytest.fixture
def in_transaction(db: None, redis_clean: None) -> Iterator[None]:
    """Let the WSGI handler share this test's database transaction, as Django's test client does:
    its end-of-request hook would otherwise close the connection mid-transaction."""
    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    try:
        yield
    finally:
        request_started.connect(close_old_connections)
        request_finished.connect(close_old_connections)


def _check(response: Any, case: Any) -> None:
    text, where = response.text, f"{case.method} {case.formatted_path}"
    assert response.status_code < 500, f"{where}: {response.status_code} {text[:500]}"
    assert not STACK_TRACE.search(text), f"{where}: stack trace in {text[:500]}"


SENT: dict[str, int] = {"admin": 0, "viewer": 0}


@pytest.fixture(scope="module", autouse=True)
def report_sent() -> Iterator[None]:
    yield
    # The figure the closing note quotes; pytest shows it with -s or in the captured output.
    print(f"api fuzz: {SENT['admin']} requests as admin, {SENT['viewer']} as viewer")


def _fuzz(case: Any, role: str) -> None:
    SENT[role] += 1
    user, _ = User.objects.get_or_create(username=f"fuzz-{role}", defaults={"role": role})
    token = Token.objects.get_or_create(user=user)[0].key
    response = case.call(headers={"Authorization": f"Token {token}"})
    _check(response, case)


@pytest.mark.usefixtures("in_transaction")
@schema.parametrize()
@FUZZ_SETTINGS
def test_fuzz_as_admin(case: Any) -> None:
    _fuzz(case, "admin")


@pytest.mark.usefixtures("in_transaction")
@schema.parametrize()
@FUZZ_SETTINGS
def test_fuzz_as_viewer(case: Any) -> None:
    _fuzz(case, "viewer")
