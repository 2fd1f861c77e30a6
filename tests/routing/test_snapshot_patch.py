"""A deployment's change patches the proxy's routing snapshot: only its alias is rebuilt, and the result
is what a full reload would have built (routing/proxy/config.py, RoutingSource and patch_deployments).

Each step below changes the database as the fleet does (state transitions, a new engine, a deleted one,
a renamed served name, a host's new address, an engine kind that changes the counting rule) and checks
the patched snapshot against a fresh full load, field by field, and that the snapshot it replaced was
left as it was (requests in flight keep reading it).
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Callable
from collections.abc import Set as AbstractSet
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from django.db import connection

from models_registry.models import ModelAlias, ModelVersion
from nodes.models import Deployment, Host
from routing.models import Rollout, RoutePool, ShadowConfig
from routing.proxy import app as proxy_app
from routing.proxy.config import (
    Pool,
    RoutingSnapshot,
    build_routing_snapshot,
    load_deployments,
    load_routing_snapshot,
    load_routing_source,
    patch_deployments,
)
from tests.routing.fleet import ensure_alias
from tests.routing.rollouts import new_version

pytestmark = pytest.mark.django_db


def _ids(endpoints: list[Any]) -> list[str]:
    return [ep.id for ep in endpoints]


def _pool(pool: Pool) -> dict[str, Any]:
    canary = pool.canary
    return {
        "alias": pool.alias,
        "endpoints": _ids(pool.endpoints),
        "version": pool.version_id,
        "label": pool.version_label,
        "staged": {v: _ids(eps) for v, eps in pool.staged.items()},
        "sleeping": _ids(pool.sleeping),
        "canary": None if canary is None else (canary.rollout_id, canary.share, _ids(canary.endpoints)),
    }


def describe(snap: RoutingSnapshot) -> dict[str, Any]:
    """Everything routing reads from a snapshot, in comparable form (endpoint URLs included)."""
    return {
        "pools": {name: _pool(pool) for name, pool in snap.pools.items()},
        "policies": sorted(snap.policies),
        "models": {a: (m.version_id, m.sim_tokens, m.tokenizer_path) for a, m in snap.models.items()},
        "aliases": snap.aliases,
        "endpoints": {
            k: (ep.base_url, ep.served_model_name, ep.version_id) for k, ep in snap.endpoints.items()
        },
        "no_embeddings": snap.no_embeddings,
        "shadows": {a: (s.percent, _ids(s.endpoints)) for a, s in snap.shadows.items()},
    }


def test_each_change_patches_to_what_a_full_load_builds() -> None:
    # Aliases are created before the first load: a new one is a "model_alias" change, a full reload.
    alpha, beta, gamma = ensure_alias("alpha"), ensure_alias("beta"), ensure_alias("gamma")
    v1 = alpha.active_version
    v2 = new_version(alpha, "v2")
    h1 = Host.objects.create(name="patch-h1", address="10.0.0.1")
    h2 = Host.objects.create(name="patch-h2", address="10.0.0.2")
    ports = iter(range(9100, 9200))

    def deploy(
        alias: ModelAlias, host: Host, state: str, version: ModelVersion = v1, **kw: Any
    ) -> Deployment:
        port = next(ports)
        return Deployment.objects.create(
            name=f"{alias.name}-{port}",
            model_version=version,
            host=host,
            port=port,
            served_model_name=alias.name,
            state=state,
            start_token=secrets.token_hex(8),
            **{"engine": "vllm", **kw},
        )

    a1 = deploy(alpha, h1, "ready")
    a2 = deploy(alpha, h2, "starting")
    a3 = deploy(alpha, h2, "ready", role="decode")
    b1 = deploy(beta, h1, "ready")
    b2 = deploy(beta, h2, "sleeping")
    deploy(beta, h1, "ready", version=v2)
    RoutePool.objects.create(name="alpha-decode", alias="alpha", role="decode")
    RoutePool.objects.create(name="beta-v2", alias="beta", model_version=v2)
    Rollout.objects.create(alias=alpha, baseline_version=v1, candidate_version=v2, share=25.0)
    ShadowConfig.objects.create(alias=beta, candidate_version=v2, percent=10.0)

    src = load_routing_source()
    snap = build_routing_snapshot(src)
    assert describe(snap) == describe(load_routing_snapshot())

    def step(
        change: Callable[[], Any], ids: AbstractSet[int] = frozenset(), hosts: AbstractSet[str] = frozenset()
    ) -> set[str]:
        """Apply `change`, patch for it; the aliases whose pools were rebuilt."""
        nonlocal snap
        change()
        before = describe(snap)
        patched = patch_deployments(src, snap, *load_deployments(set(ids), set(hosts)))
        assert describe(snap) == before, "the replaced snapshot was changed in place"
        assert describe(patched) == describe(load_routing_snapshot())
        rebuilt = {p.alias for n, p in patched.pools.items() if snap.pools.get(n) is not p}
        rebuilt |= {p.alias for n, p in snap.pools.items() if n not in patched.pools}
        snap = patched
        return rebuilt

    def update(dep: Deployment, **fields: Any) -> Callable[[], Any]:
        return lambda: Deployment.objects.filter(pk=dep.pk).update(**fields)

    assert step(update(a1, state="degraded"), {a1.pk}) == {"alpha"}
    assert step(update(a2, state="ready"), {a2.pk}) == {"alpha"}
    assert step(update(b1, state="sleeping"), {b1.pk}) == {"beta"}
    assert step(update(b2, state="ready"), {b2.pk}) == {"beta"}
    # A ready engine of the rollout's candidate: the canary's endpoints.
    a4 = deploy(alpha, h1, "starting", version=v2)
    assert step(update(a4, state="ready"), {a4.pk}) == {"alpha"}
    assert snap.pools["alpha"].canary is not None and _ids(snap.pools["alpha"].canary.endpoints) == [
        str(a4.pk)
    ]
    # Moved to the other served name: both aliases.
    assert step(update(a3, served_model_name="beta"), {a3.pk}) == {"alpha", "beta"}
    # Deleted.
    assert step(lambda: Deployment.objects.filter(pk=a2.pk).delete(), {a2.pk}) == {"alpha"}
    # A host's new address reaches the URLs of every deployment on it (only beta's are left on it).
    assert step(lambda: Host.objects.filter(pk=h2.pk).update(address="10.0.0.9"), hosts={h2.name}) == {"beta"}
    assert all(
        "10.0.0.9" in ep.base_url for ep in snap.endpoints.values() if ep.base_url.endswith(str(b2.port))
    )
    # A new alias served only by simulated engines: counted with the simulator's rule, no embeddings.
    g1 = deploy(gamma, h1, "ready", engine="sim")
    assert step(lambda: None, {g1.pk}) == {"gamma"}
    assert snap.models["gamma"].sim_tokens and "gamma" in snap.no_embeddings
    assert step(update(g1, state="stopped"), {g1.pk}) == {"gamma"}
    assert "gamma" not in snap.aliases and "gamma" not in snap.pools


@pytest.mark.django_db(transaction=True)
def test_the_proxy_patches_on_a_deployments_message_and_reloads_on_others() -> None:
    alias = ensure_alias("delta")
    host = Host.objects.create(name="patch-h3", address="127.0.0.1")
    dep = Deployment.objects.create(
        name="delta-1",
        model_version=alias.active_version,
        host=host,
        port=9301,
        served_model_name="delta",
        state="starting",
        start_token=secrets.token_hex(8),
    )
    proxy = proxy_app.build_proxy_app()
    proxy.db = ThreadPoolExecutor(max_workers=1)  # one database connection, closed at the end

    async def run() -> tuple[list[str], int, int, int]:
        await proxy.reload_snapshot()
        reloads = proxy.reloads
        assert proxy.snapshot.pools.get("delta") is None
        await proxy._in_db(lambda: Deployment.objects.filter(pk=dep.pk).update(state="ready"))
        # Messages as nodes.lifecycle.transition and the host services publish them.
        proxy.handle_config_message(b'{"kind": "deployment", "id": %d, "state": "ready"}' % dep.pk)
        proxy.handle_config_message(b'{"kind": "host", "name": "patch-h3", "state": "ready"}')
        for _ in range(100):
            await asyncio.sleep(0.02)
            if proxy.patches:
                break
        ready = _ids(proxy.snapshot.pools["delta"].endpoints)
        patched_reloads = proxy.reloads - reloads
        proxy.handle_config_message(b'{"kind": "route_pool", "id": 1}')
        for _ in range(100):
            await asyncio.sleep(0.02)
            if proxy.reloads > reloads:
                break
        return ready, proxy.patches, patched_reloads, proxy.reloads - reloads

    ready, patches, patched_reloads, reloads = asyncio.run(run())
    assert ready == [str(dep.pk)]
    assert (patches, patched_reloads) == (1, 0)  # both messages in one patch, no full reload
    assert reloads == 1
    proxy.db.submit(lambda: connection.close()).result()  # the loader thread's own connection
    proxy.db.shutdown(wait=True)
