"""An engine killed under its agent fires InferchainEngineDown in the console: a real simulator engine is
launched and supervised by the agent's own code, killed with SIGKILL, the beat evaluator runs, and the
Alerts page lists it (pending, then firing once an admin sets the rule's for-duration to 0 in the rule
editor), the header badge counts it (pushed live), and the admin acknowledges it."""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from django.db import connections
from django.utils import timezone
from playwright.sync_api import expect

from alerts.choices import AlertState, Metric
from alerts.models import Alert, AlertRule
from alerts.services import evaluate
from console.models import User
from core.models import AuditEvent
from nodes import process
from nodes.agent import runtime
from nodes.choices import DeploymentState, Engine
from nodes.models import Deployment, Host
from tests.conftest import PASSWORD
from tests.e2e.harness import login, screenshot
from tests.nodes.conftest import (
    READY,
    free_port,
    in_state,
    make_host,
    register_llama,
    supervisor_for,
    tick_until,
)

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.usefixtures("redis_clean")]


def off_loop(work: Callable[[], Any], timeout: float = 120.0) -> Any:
    """ORM writes that push live events run outside Playwright's event loop, as an agent's or beat's would."""
    out: list[Any] = []
    failures: list[BaseException] = []

    def run() -> None:
        try:
            out.append(work())
        except BaseException as exc:
            failures.append(exc)
        finally:
            connections.close_all()

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(timeout)
    assert not thread.is_alive(), "timed out"
    assert not failures, failures
    return out[0] if out else None


def test_killed_engine_fires_an_alert_in_the_console(
    browser_page: Any, admin_user: User, settings: Any, tmp_path: Path
) -> None:
    settings.ENGINE_LOG_DIR = tmp_path / "engines"
    settings.MODEL_ROOTS = [tmp_path / "models"]
    (tmp_path / "models").mkdir()
    settings.NODE_STARTUP_TIMEOUT_SECONDS = 60.0
    # The crashed engine stays down for the test: its restart is an hour away.
    settings.NODE_RESTART_BACKOFF_SECONDS = 3600.0
    settings.NODE_RESTART_BACKOFF_MAX_SECONDS = 3600.0
    settings.ALERT_WEBHOOK_URL = ""

    def launch_then_kill() -> Deployment:
        host = make_host("alert-node")
        version = register_llama(tmp_path / "models", host.name)
        deployment = Deployment.objects.create(
            name="chat-1",
            model_version=version,
            engine=Engine.SIM,
            host=host,
            gpu_indices=[0],
            gpu_memory_utilization=0.45,
            max_model_len=4096,
            max_num_seqs=16,
            port=free_port(),
            served_model_name="llama-3.1-8b",
            extra_args=["--sim-time-scale", "50"],
        )
        supervisor = supervisor_for(host)
        supervisor.start()
        try:
            assert runtime.launch(deployment.pk) == "started"
            deployment = tick_until(supervisor, deployment, READY, timeout=60)
            supervisor.tick()  # its live record, as the agent publishes it
            assert deployment.pid and process.is_alive(deployment.pid)
            os.killpg(deployment.pid, signal.SIGKILL)
            return tick_until(supervisor, deployment, in_state(DeploymentState.CRASHED), timeout=30)
        finally:
            supervisor.close()

    deployment = off_loop(launch_then_kill)
    assert deployment.state == DeploymentState.CRASHED

    def beat_evaluates() -> dict[str, Any]:
        # The host's agent is alive (only its engine was killed): its heartbeat is current.
        Host.objects.filter(pk=deployment.host_id).update(last_heartbeat=timezone.now())
        return evaluate().as_dict()

    page = browser_page
    login(page, admin_user.username, PASSWORD)
    badge = page.get_by_test_id("alerts-badge")
    expect(badge).to_have_attribute("data-count", "0")

    # Beat's evaluator: the engine is down, pending its rule's 2 minutes.
    first = off_loop(beat_evaluates)
    assert len(first["pending"]) == 1 and first["fired"] == []
    page.get_by_role("link", name="Alerts", exact=True).click()
    pending = page.get_by_test_id("alerts-pending-table")
    expect(pending).to_contain_text("Engine chat-1 on alert-node is down (crashed)")
    expect(pending).to_contain_text("2m")
    expect(page.get_by_test_id("alerts-firing-table")).to_contain_text("Nothing fires.")

    # The admin makes the rule fire at once, in the rule editor; the edit is audited.
    page.get_by_test_id("alerts-tab-rules").click()
    page.get_by_test_id("alert-rules-table").get_by_role("row").filter(
        has_text="InferchainEngineDown"
    ).click()
    dialog = page.get_by_test_id("rule-dialog")
    dialog.get_by_label("For (seconds)").fill("-1")
    dialog.get_by_test_id("rule-save").click()
    expect(dialog).to_contain_text("Ensure this value is greater than or equal to 0.")
    screenshot(page, "alerts-rule-editor", full_page=False)
    dialog.get_by_label("For (seconds)").fill("0")
    dialog.get_by_test_id("rule-save").click()
    expect(dialog).to_be_hidden()
    rule = AlertRule.objects.get(metric=Metric.ENGINE_DOWN, deployment=None, pool=None)
    assert rule.for_seconds == 0
    assert AuditEvent.objects.filter(object_type="alerts.alertrule", object_id=str(rule.pk)).count() == 1

    # Next evaluation: firing. The badge learns it from the live push (its poll is 30 s away).
    second = off_loop(beat_evaluates)
    assert len(second["fired"]) == 1
    expect(badge).to_have_attribute("data-count", "1", timeout=10_000)
    expect(badge).to_have_class("alerts-badge alerts-badge-firing")
    page.get_by_test_id("alerts-tab-firing").click()
    firing = page.get_by_test_id("alerts-firing-table")
    expect(firing).to_contain_text("InferchainEngineDown")
    expect(firing).to_contain_text("Engine chat-1 on alert-node is down (crashed)")
    expect(firing).to_contain_text("critical")
    expect(page.get_by_test_id("alerts-tab-firing")).to_have_text("Firing (1)")
    alert = Alert.objects.get(metric=Metric.ENGINE_DOWN, state=AlertState.FIRING)
    assert alert.labels["deployment"] == "chat-1"
    path = screenshot(page, "alerts-firing")

    # Acknowledged: who and when, in the row and in the history.
    page.get_by_test_id(f"acknowledge-{alert.pk}").click()
    expect(page.get_by_test_id("acknowledged-by")).to_contain_text(admin_user.username)
    page.get_by_test_id("alerts-tab-history").click()
    history = page.get_by_test_id("alerts-history-table")
    expect(history).to_contain_text("acknowledged")
    expect(history).to_contain_text(admin_user.username)
    assert path.exists()
    # Still firing on the next evaluation: no twin.
    assert off_loop(beat_evaluates)["fired"] == []
    assert Alert.objects.filter(metric=Metric.ENGINE_DOWN).count() == 1
