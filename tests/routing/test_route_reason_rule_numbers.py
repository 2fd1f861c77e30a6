"""A route reason numbers a policy's rules from 1, as the Routing page lists them: "rule 1" is the first
rule in the policy, not the second."""

from __future__ import annotations

from routing.proxy.app import Proxy, RequestContext
from routing.proxy.config import Endpoint, KeyInfo, Limits, Policy, Pool, RoutingSnapshot, Rule


def _pool(name: str) -> Pool:
    endpoint = Endpoint(
        id=f"{name}0",
        deployment_id=None,
        base_url=f"http://127.0.0.1:1/{name}",
        api_key="",
        served_model_name="m",
        max_model_len=8192,
        block_size=16,
    )
    return Pool(name=name, alias="m", endpoints=[endpoint])


def _reason(task: str | None) -> str:
    rules = (Rule(pool="long", tasks=frozenset({"summarize"})), Rule(pool="fast", max_prompt_tokens=6000))
    policy = Policy(name="p", alias="m", rules=rules, default_pool="long", fallback_pool=None)
    proxy = Proxy()
    proxy.snapshot = RoutingSnapshot(
        pools={"fast": _pool("fast"), "long": _pool("long")}, policies={"m": policy}, aliases=("m",)
    )
    key = KeyInfo(1, "k", "h", 1, "t", True, False, frozenset(), None, False, Limits(), Limits())
    ctx = RequestContext(request_id="r", kind="chat", started=0.0, key=key, prompt_tokens=300)
    headers = [(b"x-task", task.encode())] if task else []
    scope = {"type": "http", "headers": headers}
    return proxy._route(ctx, scope, policy, "m", 300, 128)[1]


def test_the_first_rule_is_rule_1_and_the_second_rule_2() -> None:
    assert _reason("summarize") == "policy p rule 1"
    assert _reason(None) == "policy p rule 2"
