"""HTTP probes of an engine: liveness, readiness and a metrics scrape, each with a short timeout."""

from __future__ import annotations

import http.client
import json
from dataclasses import dataclass
from typing import Any


@dataclass
class HttpResult:
    status: int  # 0 when no answer came (refused, timed out)
    body: bytes
    error: str = ""

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300


def http_get(
    host: str, port: int, path: str, *, timeout: float, api_key: str | None = None, method: str = "GET"
) -> HttpResult:
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        conn.request(method, path, headers=headers)
        response = conn.getresponse()
        return HttpResult(response.status, response.read())
    except (OSError, http.client.HTTPException) as exc:
        return HttpResult(0, b"", f"{type(exc).__name__}: {exc}")
    finally:
        conn.close()


def lists_model(result: HttpResult, served_model_name: str) -> bool:
    """Whether a /v1/models answer lists `served_model_name`."""
    if not result.ok:
        return False
    try:
        data: Any = json.loads(result.body)
        return any(item.get("id") == served_model_name for item in data.get("data", []))
    except (ValueError, AttributeError, TypeError):
        return False


def get_json(host: str, port: int, path: str, *, timeout: float, api_key: str | None = None) -> Any:
    result = http_get(host, port, path, timeout=timeout, api_key=api_key)
    if not result.ok:
        return None
    try:
        return json.loads(result.body)
    except ValueError:
        return None
