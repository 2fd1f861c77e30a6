"""How old an engine's live KV sample may be before the scorers stop trusting it: 2.5 agent telemetry
periods by default, set when the proxy starts (PROXY_LIVE_STALE_SECONDS)."""

from __future__ import annotations

import time

import pytest
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from routing.proxy import health
from routing.proxy.app import apply_settings
from routing.proxy.health import EndpointState


def sample(age_s: float) -> EndpointState:
    state = EndpointState(endpoint_id="e1")
    state.update_live(time.time() - age_s, 0.25, 1000)
    return state


def test_default_is_two_and_a_half_telemetry_periods() -> None:
    assert pytest.approx(2.5 * settings.NODE_TELEMETRY_SECONDS) == settings.PROXY_LIVE_STALE_SECONDS


def test_a_sample_one_period_and_a_half_old_is_still_used(monkeypatch: pytest.MonkeyPatch) -> None:
    # The agent writes every NODE_TELEMETRY_SECONDS (1 s); with the sync and the proxy's poll a sample
    # is often past 1 s old when read. It still counts (750 free of 1,000 tokens at 25 % used) ...
    monkeypatch.setattr(health, "STALE_AFTER_S", 2.5)
    assert sample(1.5).kv_free_now(time.time()) == 750
    # ... and one that missed two syncs does not.
    assert sample(3.0).kv_free_now(time.time()) is None


def test_the_proxy_takes_the_setting_at_start(monkeypatch: pytest.MonkeyPatch) -> None:
    # Proxy.startup applies its settings first (apply_settings), before Redis or the database.
    monkeypatch.setattr(health, "STALE_AFTER_S", 2.5)
    monkeypatch.setattr(settings, "PROXY_LIVE_STALE_SECONDS", 4.0)
    apply_settings()
    assert health.STALE_AFTER_S == 4.0

    monkeypatch.setattr(settings, "PROXY_LIVE_STALE_SECONDS", -1.0)
    with pytest.raises(ImproperlyConfigured, match="PROXY_LIVE_STALE_SECONDS"):
        apply_settings()
