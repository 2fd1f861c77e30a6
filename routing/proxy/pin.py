"""A request that names the model version it wants: the `x-inferchain-version` header (a model version id).

Why a header and not a model name: the alias stays the `model` field, so the key's alias scopes, the
tenant's limits, the policy's timeouts and the request log apply exactly as for any request of that alias;
the header only narrows the endpoints to the ready deployments of that version served under the alias.
It is what the console's playground sends to put two versions of one alias side by side, and what a client
uses to reproduce an answer of a version it saw in the request log.

Honoured only when the alias has a ready deployment of that version (its active version, a pool's pinned
one, a rollout's candidate or any other staged one): it never reaches a version the alias does not serve,
and never falls back to another version. A pinned request skips the canary draw (it chose its version) and
is never held for a sleeping engine (only the version's awake engines are candidates).
"""

from __future__ import annotations

from routing.proxy.config import Endpoint, Pool, RoutingSnapshot
from routing.proxy.errors import ProxyError, bad_request, unavailable
from routing.proxy.pipeline.context import Scope, header

HEADER = b"x-inferchain-version"
PARAM = HEADER.decode()


def requested_version(scope: Scope) -> int | None:
    """The version id the request pins, None without the header; 400 when it is no positive integer."""
    raw = header(scope, HEADER)
    if raw is None:
        return None
    value = raw.strip()
    if not value.isdigit() or int(value) <= 0:
        raise bad_request(
            f"'{PARAM}' must be a model version id (a positive integer), not {value[:40]!r}.",
            param=PARAM,
            code="invalid_version",
        )
    return int(value)


def version_endpoints(snap: RoutingSnapshot, alias: str, version: int) -> list[Endpoint]:
    """The ready endpoints of `version` served as `alias`; 400 when there is none."""
    mine = [
        ep for ep in snap.endpoints.values() if ep.served_model_name == alias and ep.version_id == version
    ]
    if not mine:
        served = sorted(
            {
                f"{snap.version_labels.get(v, 'version')} (id {v})"
                for ep in snap.endpoints.values()
                if ep.served_model_name == alias and (v := ep.version_id) is not None
            }
        )
        which = f" It serves {', '.join(served)}." if served else ""
        raise bad_request(
            f"The model '{alias}' has no ready deployment of version id {version}.{which} "
            f"Name one of those in '{PARAM}', or leave the header out to let routing choose.",
            param=PARAM,
            code="version_not_served",
        )
    return mine


def pool_for(snap: RoutingSnapshot, picked: Pool, alias: str, version: int) -> Pool:
    """The pool whose settings (timeouts, retries, scorer) a pinned request uses: the one routing picked
    when it serves that version, else a pool of the alias that serves it, else the alias's own pool
    (which holds the other versions as staged)."""
    if picked.version_id == version:
        return picked
    for pool in snap.pools.values():
        if pool.alias == alias and pool.version_id == version and pool.endpoints:
            return pool
    return snap.pools.get(alias, picked)


def no_candidate(alias: str, version: int, label: str) -> ProxyError:
    """503 when the version has ready engines but none can take this request now."""
    return unavailable(
        f"No ready engine of version {label} (id {version}) can take this request for '{alias}' right now "
        f"(all failing, or too short for it); retry shortly, or leave out '{PARAM}'.",
        code="no_healthy_endpoint",
    )
