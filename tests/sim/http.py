"""A tiny raw-HTTP helper for the simulator tests (stdlib only, loopback)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any


def call(
    url: str,
    body: object | None = None,
    *,
    method: str | None = None,
    headers: dict[str, str] | None = None,
    raw: bytes | None = None,
    timeout: float = 30.0,
) -> tuple[int, dict[str, str], bytes]:
    """(status, headers, body bytes) of one request; error statuses are returned, not raised."""
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    hdrs = {"Content-Type": "application/json", **(headers or {})}
    req = urllib.request.Request(url, data=data, headers=hdrs, method=method or ("POST" if data else "GET"))
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


def call_json(url: str, body: object | None = None, **kwargs: Any) -> tuple[int, Any]:
    status, _, data = call(url, body, **kwargs)
    return status, json.loads(data) if data else None
