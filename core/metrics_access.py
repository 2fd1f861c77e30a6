"""Who may read the Prometheus expositions (`/metrics` of the console, `/metrics` and `/v1/metrics` of the
proxy): they carry per-tenant request counts and budgets, which no tenant should read of another.

With METRICS_TOKEN set, a scrape must send `Authorization: Bearer <METRICS_TOKEN>` (Prometheus:
`authorization: {credentials: ...}`); a tenant's API key is refused like any other wrong token. Unset,
they stay open for the zero-setup demo, and the port must stay on the monitoring network
(docs/security.md).
"""

from __future__ import annotations

import hmac

from django.conf import settings

REFUSAL = "This exposition needs the metrics token: send 'Authorization: Bearer <METRICS_TOKEN>'."


def metrics_allowed(authorization: str | None) -> bool:
    token: str = settings.METRICS_TOKEN
    if not token:
        return True
    if not authorization:
        return False
    scheme, _, value = authorization.partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(value.strip().encode(), token.encode())
