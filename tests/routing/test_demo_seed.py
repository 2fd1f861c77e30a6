"""The seeded demo quotas let both demo pools work, and the demo traffic gets a key of its own, handed
over in a file only this user can read."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest
from django.db import transaction

from console.models import ApiKey, Quota, Tenant
from console.services import find_api_key
from nodes.demo import DEMO_ENGINES
from routing.demo import (
    DEMO_ALIAS,
    DEMO_TENANT_QUOTA,
    DEMO_TRAFFIC_TENANT,
    FAST_POOL_MAX_PROMPT_TOKENS,
    OLD_DEMO_TENANT_QUOTAS,
    seed_demo_quota,
    seed_demo_traffic,
)

FAST = [e.max_model_len for e in DEMO_ENGINES if e.role == "high-throughput"]
LONG = [e.max_model_len for e in DEMO_ENGINES if e.role == "long-context"]


def test_the_demo_quota_fits_the_demo_pools() -> None:
    # Any prompt the long-context pool can hold gets past the key's input cap.
    assert DEMO_TENANT_QUOTA["max_input_tokens"] == max(LONG) == 65536
    # A prompt at the fast pool's limit plus the largest output the key allows still fits a fast engine
    # (else the injected output cap would push such prompts to the long pool).
    max_out = DEMO_TENANT_QUOTA["max_output_tokens"]
    assert max_out is not None and FAST_POOL_MAX_PROMPT_TOKENS + max_out <= min(FAST)
    # 8 clients in a loop, each answered in about a quarter second, send ~1,920 requests a minute: the
    # minute's budget must outlast them (600 ran out in 19 s).
    rpm = DEMO_TENANT_QUOTA["requests_per_minute"]
    assert rpm is not None and rpm >= 8 * 60 * 4
    concurrent = DEMO_TENANT_QUOTA["max_concurrent_requests"]
    assert concurrent is not None and concurrent >= 8


@pytest.mark.django_db
def test_an_earlier_seeds_quota_is_updated_and_an_admins_is_kept() -> None:
    old = Tenant.objects.create(name="demo")
    Quota.objects.create(tenant=old, **OLD_DEMO_TENANT_QUOTAS[0])
    assert seed_demo_quota(old).limits() == DEMO_TENANT_QUOTA
    edited = Tenant.objects.create(name="edited")
    Quota.objects.create(tenant=edited, **{**OLD_DEMO_TENANT_QUOTAS[0], "requests_per_minute": 5})
    assert seed_demo_quota(edited).requests_per_minute == 5
    fresh = Tenant.objects.create(name="fresh")
    assert seed_demo_quota(fresh).limits() == DEMO_TENANT_QUOTA


@pytest.mark.django_db(transaction=True)
def test_demo_traffic_key_is_its_own_private_and_rotated(tmp_path: Path) -> None:
    key_file = tmp_path / "var" / "demo-traffic.key"
    lines = seed_demo_traffic(key_file)
    first = key_file.read_text().strip()
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    found = find_api_key(first)
    assert found is not None and found.tenant.name == DEMO_TRAFFIC_TENANT and found.scopes == [DEMO_ALIAS]
    assert not any(first in line for line in lines)  # the seed's output names the prefix, never the key
    assert found.prefix in lines[0]

    seed_demo_traffic(key_file)
    second = key_file.read_text().strip()
    assert second != first and stat.S_IMODE(key_file.stat().st_mode) == 0o600
    active = ApiKey.objects.filter(tenant__name=DEMO_TRAFFIC_TENANT, revoked_at__isnull=True)
    assert [k.pk for k in active] == [find_api_key(second).pk]  # type: ignore[union-attr]
    assert list(tmp_path.joinpath("var").iterdir()) == [key_file]  # no partial file left behind


@pytest.mark.django_db(transaction=True)
def test_no_file_names_a_key_that_was_rolled_back(tmp_path: Path) -> None:
    key_file = tmp_path / "demo-traffic.key"
    with pytest.raises(RuntimeError), transaction.atomic():
        seed_demo_traffic(key_file)
        raise RuntimeError("the rest of the seed failed")
    assert not key_file.exists() and not ApiKey.objects.exists()
