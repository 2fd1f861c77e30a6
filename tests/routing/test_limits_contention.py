"""Limits under contention: four proxy processes, hundreds of concurrent clients.

- RPM: a tenant's clients hammer all four proxies; the admitted count never exceeds the limit and
  reaches at least 99% of it (the limiter is exact, so it is the limit itself).
- TPM accounting: another tenant's counted tokens (the limiter's per-minute sum in Redis, after each
  request is trued up to its usage) are within 1% of what the engines report in their own metrics.

`make test` runs a short variant; `make soak` sets LIMITS_CONTENTION_SECONDS=55 (the window is 60 s:
within it nothing ages out, so every admitted request is still counted at the end).
"""

from __future__ import annotations

import os
import re
import time
import urllib.request
from collections.abc import Callable

import pytest
from django.conf import settings

from core.redis_client import get_redis
from core.redis_client import key as rkey
from routing.proxy.limits import tenant_scope
from tests.routing.conftest import Proc, make_tenant_key
from tests.routing.fleet import start_member
from tests.routing.load import Client, Load, summary

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.slow,
    pytest.mark.usefixtures("redis_clean"),
]
SECONDS = float(os.environ.get("LIMITS_CONTENTION_SECONDS", "10"))
PROXIES = 4
RPM_CLIENTS = 200
TPM_CLIENTS = 60
CHAT = {
    "model": "llama",
    "messages": [{"role": "user", "content": "hello there"}],
    "max_tokens": 12,
    "ignore_eos": True,
}


def _engine_tokens(port: int) -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    found = re.findall(r"^vllm:(?:prompt|generation)_tokens_total(?:\{[^}]*\})? (\S+)$", text, re.MULTILINE)
    return sum(float(v) for v in found)


def test_limits_hold_under_contention(start_proxy: Callable[..., Proc]) -> None:
    assert SECONDS < 58, "beyond the 60 s window early requests age out and the totals stop adding up"
    # A floor of 20 admitted requests per second is far below what four proxies serve, so the limit is
    # reached well before the end and the rest of the run is contention on a full window.
    rpm_limit = int(20 * SECONDS)
    sims = [start_member("llama", time_scale=50.0) for _ in range(2)]
    try:
        # Both tenants' tokens are counted (a TPM limit that never binds), so their sum is every token the
        # engines served in this test.
        rpm_tenant = make_tenant_key("rpm", requests_per_minute=rpm_limit, tokens_per_minute=1_000_000_000)
        tpm_tenant = make_tenant_key("tpm", tokens_per_minute=1_000_000_000)
        proxies = [start_proxy() for _ in range(PROXIES)]
        clients = [
            Client("rpm", p.url + "/v1/chat/completions", rpm_tenant.raw_key, CHAT, RPM_CLIENTS // PROXIES)
            for p in proxies
        ] + [
            Client(
                "tpm",
                p.url + "/v1/chat/completions",
                tpm_tenant.raw_key,
                {**CHAT, "stream": i % 2 == 1},
                TPM_CLIENTS // PROXIES,
            )
            for i, p in enumerate(proxies)
        ]
        engines_before = sum(_engine_tokens(m.deployment.port) for m in sims)
        with Load(clients, timeout=30, pause=0.1) as load:
            time.sleep(SECONDS)
        time.sleep(0.5)  # the last true-ups leave with the last answers; let them land
        engine_tokens = sum(_engine_tokens(m.deployment.port) for m in sims) - engines_before
        rpm_samples = [s for s in load.samples if s.label == "rpm"]
        tpm_samples = [s for s in load.samples if s.label == "tpm"]
        admitted = sum(1 for s in rpm_samples if s.status == 200)
        redis = get_redis()
        counted = sum(
            int(redis.get(rkey("rl", tenant_scope(t.tenant.pk), "tpm_sum")) or 0)
            for t in (rpm_tenant, tpm_tenant)
        )
        tpm_ok = sum(1 for s in tpm_samples if s.status == 200 and not s.stream_error)
        off = abs(counted - engine_tokens) / max(1.0, engine_tokens)
        print(
            f"\nlimits under contention ({PROXIES} proxies, {RPM_CLIENTS}+{TPM_CLIENTS} clients, "
            f"{SECONDS:.0f} s): RPM limit {rpm_limit}: admitted {admitted}, "
            f"refused {summary(s for s in rpm_samples if s.status != 200)}; TPM tenant: {tpm_ok} answered "
            f"({summary(tpm_samples)}); tokens counted by the limiter {counted} vs "
            f"{engine_tokens:.0f} reported by the engines ({off:.3%} apart)"
        )
        assert admitted <= rpm_limit
        assert admitted >= 0.99 * rpm_limit
        assert all(s.status == 429 for s in rpm_samples if s.status != 200), summary(rpm_samples)
        assert all(s.status == 200 and not s.stream_error for s in tpm_samples), summary(tpm_samples)
        assert off <= 0.01
        assert settings.REDIS_KEY_PREFIX  # the counters read above are this run's
    finally:
        for member in sims:
            member.sim.stop()
