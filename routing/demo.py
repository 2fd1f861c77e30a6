"""Demo routing for `make run`: the demo fleet's long-context and high-throughput engines as two pools,
the demo tenants' quotas that let both pools work, and the key of the demo's background traffic.

Short prompts go to the high-throughput pool (least outstanding), spilling onto the long-context pool
while it has headroom and the fast pool is busier; long prompts, `x-task: summarize` and anything the
fast pool cannot take go to the long-context pool (best fit on free KV cache).

The fast engines run the AWQ quantization, a version other than the alias's active one (fp16), so
the fast pool names that version (`RoutePool.model_version`): a pool that names none serves only the
active version's deployments.
"""

from __future__ import annotations

from pathlib import Path

from django.db import transaction

from console.models import ApiKey, Quota, Tenant
from console.services import issue_api_key, revoke_api_key
from core.env import write_secret_file
from core.redis_client import publish_config_change
from models_registry.models import ModelAlias, ModelVersion
from nodes.demo import DEMO_ENGINES, demo_traffic_key_file
from nodes.models import Deployment
from routing.choices import Scorer
from routing.models import RoutePolicy, RoutePool

DEMO_ALIAS = "llama-3.1-8b"  # nodes.demo.SERVED_NAME
FAST_POOL_MAX_PROMPT_TOKENS = 6000
# Short prompts overflow onto the long-context pool while it has headroom (routing.proxy.spill): at most
# this many requests in flight on a long-context engine and half its KV cache, so long prompts always
# find room there; measured in docs/benchmarks.md (heterogeneous chain).
DEMO_SPILL: dict[str, int | float] = {"max_inflight": 6, "max_kv_used": 0.5, "min_home_inflight": 1}
# The longest context of the demo fleet (llama-long's engine): a demo key may send prompts up to it.
LONG_CONTEXT = max(e.max_model_len for e in DEMO_ENGINES)

# The "demo" tenant's quota (the key `make run` prints). Generous enough that a few clients in a tight
# loop (8 clients answered in ~0.25 s each send ~1,900 requests a minute) do not run into it within
# the minute, and shaped by the pools: any prompt the long pool can hold passes the input cap, and a
# prompt at the fast pool's limit plus the largest output still fits the fast engines' context.
DEMO_TENANT_QUOTA: dict[str, int | None] = {
    "requests_per_minute": 6000,
    "tokens_per_minute": 4_000_000,
    "max_concurrent_requests": 64,
    "daily_token_budget": 200_000_000,
    "max_input_tokens": LONG_CONTEXT,
    "max_output_tokens": 2048,
}
# What earlier seeds gave the demo tenant; a quota still exactly at these is brought up to date.
OLD_DEMO_TENANT_QUOTAS: tuple[dict[str, int | None], ...] = (
    {
        "requests_per_minute": 600,
        "tokens_per_minute": 200_000,
        "max_concurrent_requests": 32,
        "daily_token_budget": 5_000_000,
        "max_input_tokens": 8192,
        "max_output_tokens": 2048,
    },
)

# The demo's background traffic (manage.py demo_traffic, inferchain/demo_traffic.py) has a tenant of its
# own, so the request log, the routing page and the usage charts show it apart from a newcomer's own calls.
DEMO_TRAFFIC_TENANT = "demo-traffic"
DEMO_TRAFFIC_KEY_NAME = "demo traffic (agents)"
DEMO_TRAFFIC_QUOTA: dict[str, int | None] = {
    "requests_per_minute": 600,
    "tokens_per_minute": 2_000_000,
    "max_concurrent_requests": 32,
    "daily_token_budget": None,
    "max_input_tokens": LONG_CONTEXT,
    "max_output_tokens": 1024,
}


def _fast_version() -> ModelVersion | None:
    """The version the demo's high-throughput engines run when it is not the alias's active one."""
    alias = ModelAlias.objects.filter(name=DEMO_ALIAS).first()
    versions = set(
        Deployment.objects.filter(served_model_name=DEMO_ALIAS, role="high-throughput").values_list(
            "model_version_id", flat=True
        )
    )
    if alias is None or len(versions) != 1 or alias.active_version_id in versions:
        return None
    return ModelVersion.objects.get(pk=versions.pop())


def seed_demo_routing() -> list[str]:
    """Create the demo pools and policy if absent (idempotent); returns lines for the seed output."""
    fast_version = _fast_version()
    fast, created = RoutePool.objects.get_or_create(
        name="llama-fast",
        defaults={
            "alias": DEMO_ALIAS,
            "role": "high-throughput",
            "model_version": fast_version,
            "scorer": Scorer.LEAST_OUTSTANDING,
            "first_byte_timeout_s": 30.0,
        },
    )
    if not created and fast.model_version_id is None and fast_version is not None:
        # Seeded before pools named versions: without it the fast pool would serve nothing.
        fast.model_version = fast_version
        fast.save(update_fields=["model_version", "updated_at"])
        publish_config_change("route_pool", id=fast.pk)
    long, _ = RoutePool.objects.get_or_create(
        name="llama-long",
        defaults={"alias": DEMO_ALIAS, "role": "long-context", "scorer": Scorer.BEST_FIT},
    )
    RoutePolicy.objects.get_or_create(
        alias=DEMO_ALIAS,
        defaults={
            "name": "llama by prompt length",
            "rules": [
                {"match": {"task": ["summarize"]}, "pool": long.name},
                {
                    "match": {"max_prompt_tokens": FAST_POOL_MAX_PROMPT_TOKENS},
                    "pool": fast.name,
                    "spill": {"pool": long.name, **DEMO_SPILL},
                },
            ],
            "default_pool": long,
            "fallback_pool": long,
        },
    )
    return [
        f"routing: {DEMO_ALIAS} -> {fast.name} (prompts up to {FAST_POOL_MAX_PROMPT_TOKENS} tokens, "
        f"spilling onto {long.name} while it has headroom), else {long.name}"
    ]


def seed_demo_quota(tenant: Tenant) -> Quota:
    """The demo tenant's quota: created with DEMO_TENANT_QUOTA, or updated from an earlier seed's values.

    A quota an admin changed is left alone.
    """
    quota, created = Quota.objects.get_or_create(tenant=tenant, defaults=DEMO_TENANT_QUOTA)
    if not created and quota.limits() in OLD_DEMO_TENANT_QUOTAS:
        for name, value in DEMO_TENANT_QUOTA.items():
            setattr(quota, name, value)
        quota.save()
        publish_config_change("quota", tenant_id=tenant.pk)
    return quota


def seed_demo_traffic(key_file: Path | None = None) -> list[str]:
    """The demo-traffic tenant, its quota and a fresh key, for `manage.py demo_traffic` in `key_file`.

    The raw key goes nowhere else: the previous demo-traffic keys are revoked, and the file (mode 0600,
    replaced atomically) is written once the transaction commits, so it never names a key that does
    not exist.
    """
    path = key_file or demo_traffic_key_file()
    with transaction.atomic():
        tenant, _ = Tenant.objects.get_or_create(
            name=DEMO_TRAFFIC_TENANT,
            defaults={"description": "Background requests of the demo (manage.py demo_traffic)."},
        )
        Quota.objects.get_or_create(tenant=tenant, defaults=DEMO_TRAFFIC_QUOTA)
        for old in ApiKey.objects.filter(tenant=tenant, name=DEMO_TRAFFIC_KEY_NAME, revoked_at__isnull=True):
            revoke_api_key(old, actor=None)
        issued = issue_api_key(tenant=tenant, name=DEMO_TRAFFIC_KEY_NAME, scopes=[DEMO_ALIAS])
        raw_key = issued.raw_key
        transaction.on_commit(lambda: write_secret_file(path, raw_key))
    prefix = issued.api_key.prefix
    return [f"demo traffic: tenant '{DEMO_TRAFFIC_TENANT}', key {prefix}… in {path} (mode 0600)"]
