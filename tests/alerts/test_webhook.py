"""The webhook: a real HTTP server on loopback receives exactly one message per state change (firing,
resolved), Slack's {"text": ...} JSON, including a retry after a failed delivery with backoff; a still
firing alert and re-runs of the evaluator or the delivery send nothing more."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from alerts.choices import DeliveryStatus, Metric, Transition
from alerts.models import AlertNotification, AlertRule
from alerts.notify import backoff_seconds, deliver_due
from alerts.services import ensure_default_rules, evaluate
from alerts.tasks import evaluate_alerts_task
from core.celery import app
from nodes.choices import DeploymentState
from nodes.models import Deployment, Host
from tests.alerts.conftest import T0, heartbeat, publish_engine

pytestmark = pytest.mark.django_db


class Receiver:
    """What the server got, and the statuses it answers with (then 200)."""

    def __init__(self, statuses: list[int]) -> None:
        self.statuses = statuses
        self.received: list[tuple[int, dict[str, Any], str]] = []


@pytest.fixture
def receiver(settings: Any, redis_clean: None) -> Iterator[Receiver]:
    state = Receiver([])

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            status = state.statuses.pop(0) if state.statuses else 200
            state.received.append((status, json.loads(body), self.headers["Content-Type"]))
            self.send_response(status)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    settings.ALERT_WEBHOOK_URL = f"http://127.0.0.1:{server.server_address[1]}/hooks/T000/B000/secret"
    settings.ALERT_WEBHOOK_BACKOFF_SECONDS = 5.0
    settings.ALERT_WEBHOOK_TIMEOUT_SECONDS = 2.0
    yield state
    server.shutdown()
    server.server_close()


def tick(host: Host, t: float) -> None:
    """What beat does each interval: evaluate, then deliver what is due."""
    heartbeat(host, t)
    evaluate(now=t)
    deliver_due(now=t)


def test_one_message_per_state_change_with_a_retry(
    receiver: Receiver, alert_host: Host, make_engine: Any
) -> None:
    engine: Deployment = make_engine(state=DeploymentState.CRASHED)
    receiver.statuses = [500]  # the first delivery fails

    tick(alert_host, T0)  # pending: nothing sent
    assert receiver.received == []
    tick(alert_host, T0 + 121)  # firing: sent, answered 500
    assert [r[0] for r in receiver.received] == [500]
    owed = AlertNotification.objects.get(transition=Transition.FIRING)
    assert owed.status == DeliveryStatus.PENDING and owed.attempts == 1
    assert owed.last_error == "the webhook answered 500"  # never the URL: it carries a token

    # Within the backoff: not tried again, however often beat runs.
    tick(alert_host, T0 + 122)
    deliver_due(now=T0 + 123)
    assert len(receiver.received) == 1
    # After it: retried and delivered.
    tick(alert_host, T0 + 121 + backoff_seconds(1))
    assert [r[0] for r in receiver.received] == [500, 200]

    # Still firing, many ticks later and delivery re-run: nothing more.
    for t in (T0 + 140, T0 + 155, T0 + 170):
        tick(alert_host, t)
    deliver_due(now=T0 + 10_000)
    assert len(receiver.received) == 2

    # Recovered: one resolved message.
    Deployment.objects.filter(pk=engine.pk).update(state=DeploymentState.READY)
    publish_engine(engine)
    tick(alert_host, T0 + 200)
    tick(alert_host, T0 + 215)
    deliver_due(now=T0 + 20_000)

    statuses = [r[0] for r in receiver.received]
    texts = [r[1]["text"] for r in receiver.received]
    assert statuses == [500, 200, 200]
    assert all(set(r[1]) == {"text"} and r[2] == "application/json" for r in receiver.received)
    assert texts[0] == texts[1]
    assert texts[1].startswith("[FIRING] [critical] InferchainEngineDown: Engine eng-0 on alert-node is down")
    assert texts[2].startswith("[RESOLVED] InferchainEngineDown: Engine eng-0 on alert-node is down")
    rows = AlertNotification.objects.order_by("id")
    assert [(r.transition, r.status, r.attempts) for r in rows] == [
        (Transition.FIRING, DeliveryStatus.SENT, 2),
        (Transition.RESOLVED, DeliveryStatus.SENT, 1),
    ]


def test_gives_up_after_max_attempts_with_doubling_backoff(
    receiver: Receiver, settings: Any, alert_host: Host, make_engine: Any
) -> None:
    settings.ALERT_WEBHOOK_MAX_ATTEMPTS = 3
    settings.ALERT_WEBHOOK_BACKOFF_MAX_SECONDS = 8.0
    assert [backoff_seconds(n) for n in (1, 2, 3, 4)] == [5.0, 8.0, 8.0, 8.0]
    receiver.statuses = [503, 503, 503, 503]
    make_engine(state=DeploymentState.FAILED)
    evaluate(now=T0)
    heartbeat(alert_host, T0 + 121)
    evaluate(now=T0 + 121)
    t = T0 + 121
    for _ in range(5):
        deliver_due(now=t)
        t += 60
    row = AlertNotification.objects.get()
    assert row.status == DeliveryStatus.FAILED and row.attempts == 3
    assert len(receiver.received) == 3


def test_a_refused_connection_is_retried(
    settings: Any, redis_clean: None, alert_host: Host, make_engine: Any
) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    settings.ALERT_WEBHOOK_URL = f"http://127.0.0.1:{port}/hook"  # nothing listens
    make_engine(state=DeploymentState.FAILED)
    evaluate(now=T0)
    heartbeat(alert_host, T0 + 121)
    evaluate(now=T0 + 121)
    result = deliver_due(now=T0 + 121)
    assert result.failed_attempts == 1 and result.sent == 0
    row = AlertNotification.objects.get()
    assert row.status == DeliveryStatus.PENDING and "could not be reached" in row.last_error
    assert str(port) not in row.last_error


def test_the_beat_task_evaluates_then_delivers(
    receiver: Receiver, alert_host: Host, make_engine: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The delivery task the beat task queues runs here, at once, instead of on a worker.
    monkeypatch.setitem(app.conf, "task_always_eager", True)
    ensure_default_rules()
    AlertRule.objects.filter(metric=Metric.ENGINE_DOWN, deployment=None, pool=None).update(for_seconds=0)
    make_engine(state=DeploymentState.FAILED)
    heartbeat(alert_host, time.time())  # the task runs on the real clock
    assert len(evaluate_alerts_task()["fired"]) == 1
    again = evaluate_alerts_task()
    assert again["fired"] == [] and again["notifications"] == []
    assert [r[1]["text"].split(":")[0] for r in receiver.received] == [
        "[FIRING] [critical] InferchainEngineDown"
    ]
