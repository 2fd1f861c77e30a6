"""The per-deployment engine key: derived (never stored), rotated with each launch, required by the engine."""

from __future__ import annotations

import hashlib
import hmac
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.db import connection

from nodes.agent import runtime
from nodes.lifecycle import engine_api_key
from nodes.probes import http_get
from tests.nodes.conftest import READY, supervisor_for, tick_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def test_key_is_the_documented_hmac(make_deployment: Any) -> None:
    deployment = make_deployment(start_token="tok-1")
    expected = hmac.new(
        settings.API_KEY_HMAC_SECRET.encode(), f"engine:{deployment.pk}:tok-1".encode(), hashlib.sha256
    ).hexdigest()
    assert engine_api_key(deployment) == expected
    deployment.start_token = "tok-2"
    assert engine_api_key(deployment) != expected


def test_engine_requires_the_key_and_the_database_never_holds_it(host: Any, make_deployment: Any) -> None:
    deployment = make_deployment()
    supervisor = supervisor_for(host)
    supervisor.start()
    runtime.launch(deployment.pk)
    deployment = tick_until(supervisor, deployment, READY)
    key = engine_api_key(deployment)

    assert http_get("127.0.0.1", deployment.port, "/v1/models", timeout=2).status == 401
    assert http_get("127.0.0.1", deployment.port, "/v1/models", timeout=2, api_key="guess").status == 401
    assert http_get("127.0.0.1", deployment.port, "/v1/models", timeout=2, api_key=key).status == 200

    # Paths vLLM's own --api-key leaves open need the key too (nodes/engines/guard.py).
    assert http_get("127.0.0.1", deployment.port, "/metrics", timeout=2).status == 401
    assert http_get("127.0.0.1", deployment.port, "/metrics", timeout=2, api_key=key).status == 200

    # Not on the command line (`ps` shows it to every user of the host), nor in the launch record.
    assert key.encode() not in Path(f"/proc/{deployment.pid}/cmdline").read_bytes()
    assert key not in deployment.launch_argv and "--api-key" not in deployment.launch_argv
    launch = deployment.events.filter(launch__isnull=False).latest("at").launch
    assert launch is not None and key not in repr(launch)
    assert launch["env"]["VLLM_API_KEY"] == "[redacted]"
    with connection.cursor() as cursor:
        for table in ("nodes_deployment", "nodes_deploymentevent", "console_auditevent"):
            cursor.execute(f"SELECT * FROM {table}")
            assert key not in repr(cursor.fetchall()), table
    supervisor.close()
