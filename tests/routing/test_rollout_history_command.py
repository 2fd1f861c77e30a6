"""`manage.py rollout_history ID`: the decision history as text (and JSON), with the gate numbers."""

from __future__ import annotations

import datetime as dt
import json
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from routing.rollouts import services
from tests.routing.rollouts import canary, log_requests

pytestmark = pytest.mark.django_db


def test_history_lists_each_decision_with_its_numbers(redis_clean: None, admin_user: object) -> None:
    c = canary()
    rollout = services.start_rollout(
        c.alias,
        c.v2,
        [10, 100],
        actor=admin_user,
        gates={"max_error_rate_delta": 0.02},
        min_step_seconds=0,
        min_step_requests=5,
    )
    at = rollout.step_started_at + dt.timedelta(milliseconds=5)
    log_requests(c.alias, c.v1, 40, latency_ms=100, at=at)
    log_requests(c.alias, c.v2, 8, latency_ms=120, at=at)
    services.evaluate(rollout, timezone.now() + dt.timedelta(seconds=1))

    out = StringIO()
    call_command("rollout_history", str(rollout.pk), stdout=out)
    text = out.getvalue()
    assert f"Rollout {rollout.pk}: llama-canary  llama-3.1-8b@main -> llama-3.1-8b@v2" in text
    assert "plan 10% -> 100%" in text and "gates max_error_rate_delta 0.02" in text
    assert "now promoted at 100%" in text
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if "START" in line)
    assert "0% -> 10%" in lines[start] and "by alice-admin" in lines[start]
    promote = next(i for i, line in enumerate(lines) if "PROMOTE" in line)
    assert promote > start and "10% -> 100%" in lines[promote] and "by gate task" in lines[promote]
    assert "candidate 8 req, 0.00% err, p95 120 ms" in text
    assert "baseline 40 req, 0.00% err, p95 100 ms" in text
    assert "gate max_error_rate_delta: 0 vs 0.02 -> pass" in text

    raw = StringIO()
    call_command("rollout_history", str(rollout.pk), "--json", stdout=raw)
    dumped = json.loads(raw.getvalue())
    assert [d["action"] for d in dumped["decisions"]] == ["start", "promote"]
    assert dumped["decisions"][1]["numbers"]["candidate"]["requests"] == 8


def test_unknown_rollout_is_an_error(db: None) -> None:
    with pytest.raises(CommandError, match="No rollout with id 999"):
        call_command("rollout_history", "999")
