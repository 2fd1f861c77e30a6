"""The proxies' latency predictors as the console sees them: each proxy process publishes its report to
Redis (routing/proxy/app.py, every PREDICTIONS_PUBLISH_S); this reads every process's, merges them per
engine (routing.proxy.predict.merge_reports) and groups the engines by the pools that route to them,
for the routing page's "Predicted vs observed" panel."""

from __future__ import annotations

from typing import Any

import orjson

from core.redis_client import get_redis
from core.redis_client import key as rkey
from nodes.choices import DeploymentState
from nodes.models import Deployment
from routing.models import RoutePool
from routing.proxy.predict import merge_reports


def published_reports() -> list[list[dict[str, Any]]]:
    """Every live proxy process's report (a stopped one's expires after PREDICTIONS_TTL_S)."""
    r = get_redis()
    names = list(r.scan_iter(rkey("predict", "*"), count=500))
    if not names:
        return []
    out = []
    for raw in r.mget(names):
        if raw:
            try:
                out.append(orjson.loads(raw))
            except orjson.JSONDecodeError:
                continue
    return out


def predictions_by_pool() -> list[dict[str, Any]]:
    """Per pool (its ready deployments, as the proxy's snapshot picks them by alias and role), each
    engine's merged predictions; engines no pool names are listed under their alias's implicit pool."""
    merged = merge_reports(published_reports())
    deployments = list(
        Deployment.objects.filter(state=DeploymentState.READY).values_list(
            "pk", "name", "served_model_name", "role"
        )
    )
    pools: list[dict[str, Any]] = []
    named: set[str] = set()
    for pool in RoutePool.objects.order_by("name"):
        named.add(pool.alias)
        members = [d for d in deployments if d[2] == pool.alias and (not pool.role or d[3] == pool.role)]
        pools.append(_pool(pool.name, pool.alias, pool.scorer, members, merged))
    for alias in sorted({d[2] for d in deployments} - named):
        members = [d for d in deployments if d[2] == alias]
        pools.append(_pool(alias, alias, "least_outstanding", members, merged))
    return pools


def _pool(
    name: str,
    alias: str,
    scorer: str,
    members: list[tuple[int, str, str, str]],
    merged: dict[str, dict[str, Any]],
) -> dict[str, Any]:
    engines = []
    for pk, dep_name, _alias, _role in members:
        row = merged.get(str(pk))
        engines.append(
            {
                "deployment_id": pk,
                "deployment": dep_name,
                "samples": int(row.get("samples") or 0) if row else 0,
                "warm": bool(row.get("warm")) if row else False,
                "ttft_predicted_s": row.get("ttft_predicted_s") if row else None,
                "ttft_observed_s": row.get("ttft_observed_s") if row else None,
                "tpot_predicted_s": row.get("tpot_predicted_s") if row else None,
                "tpot_observed_s": row.get("tpot_observed_s") if row else None,
                "ttft_mape_pct": row.get("ttft_mape_pct") if row else None,
                "tpot_mape_pct": row.get("tpot_mape_pct") if row else None,
                "peak_tokens_per_s": row.get("peak_tokens_per_s") if row else None,
            }
        )
    return {"pool": name, "alias": alias, "scorer": scorer, "engines": engines}
