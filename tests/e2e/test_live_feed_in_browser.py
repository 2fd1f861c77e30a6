"""In the browser, the live feed connects over /ws/live/ with the session and delivers pushed events."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from playwright.sync_api import expect

from console.models import User
from core.live import push_live_event
from tests.conftest import PASSWORD
from tests.e2e.harness import LiveConsole, login

pytestmark = pytest.mark.e2e

LISTEN = """(group) => new Promise((resolve, reject) => {
    const socket = new WebSocket(`ws://${location.host}/ws/live/`);
    window.__liveEvents = [];
    socket.onmessage = (m) => {
        const event = JSON.parse(m.data);
        if (event.type === 'subscribed') resolve(true); else window.__liveEvents.push(event);
    };
    socket.onopen = () => socket.send(JSON.stringify({subscribe: group}));
    socket.onclose = (c) => reject(new Error(`closed ${c.code}`));
})"""


def push_from_another_thread(group: str, event: dict[str, Any]) -> None:
    # Playwright's sync API keeps an event loop in this thread, where async_to_sync refuses to run.
    worker = threading.Thread(target=push_live_event, args=(group, event))
    worker.start()
    worker.join(timeout=10)


def test_live_feed_connects_and_delivers_events(
    live_console: LiveConsole, browser_page: Any, viewer_user: User, redis_clean: None
) -> None:
    page = browser_page
    login(page, viewer_user.username, PASSWORD)
    # The layout's own feed (useLive) is connected: the top bar says so.
    expect(page.get_by_test_id("live-indicator")).to_have_attribute("data-connected", "true")

    assert page.evaluate(LISTEN, "live.host.e2e-host") is True
    event = {"type": "host.telemetry", "host": "e2e-host", "gpu_util": 0.5}
    push_from_another_thread("live.host.e2e-host", event)
    page.wait_for_function("() => window.__liveEvents.length > 0", timeout=10_000)
    assert page.evaluate("() => window.__liveEvents") == [event]

    # Signed out, the handshake is refused: the socket never opens.
    page.get_by_role("button", name="Sign out").click()
    page.wait_for_url("**/login")
    outcome = page.evaluate(
        """() => new Promise((resolve) => {
            let opened = false;
            const socket = new WebSocket(`ws://${location.host}/ws/live/`);
            socket.onopen = () => { opened = true; };
            socket.onclose = () => resolve({opened});
        })"""
    )
    assert outcome == {"opened": False}
