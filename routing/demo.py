"""Demo routing for `make run`: the demo fleet's long-context and high-throughput engines as two pools.

Short prompts go to the high-throughput pool (least outstanding); long prompts, `x-task: summarize`
and anything the fast pool cannot take go to the long-context pool (best fit on free KV cache).
"""

from __future__ import annotations

from routing.choices import Scorer
from routing.models import RoutePolicy, RoutePool

DEMO_ALIAS = "llama-3.1-8b"  # nodes.demo.SERVED_NAME


def seed_demo_routing() -> list[str]:
    """Create the demo pools and policy if absent (idempotent); returns lines for the seed output."""
    fast, _ = RoutePool.objects.get_or_create(
        name="llama-fast",
        defaults={
            "alias": DEMO_ALIAS,
            "role": "high-throughput",
            "scorer": Scorer.LEAST_OUTSTANDING,
            "first_byte_timeout_s": 30.0,
        },
    )
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
                {"match": {"max_prompt_tokens": 6000}, "pool": fast.name},
            ],
            "default_pool": long,
            "fallback_pool": long,
        },
    )
    return [f"routing: {DEMO_ALIAS} -> {fast.name} (prompts up to 6000 tokens), else {long.name}"]
