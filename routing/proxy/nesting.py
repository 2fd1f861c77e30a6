"""Refuse request bodies nested deeper than the proxy can pass on.

orjson reads JSON nested up to 1024 levels but writes at most 254 (its recursion limit), and the proxy
re-serializes every body for the engine: a body between the two limits parsed, then failed as a 500.
Such a body is now a 400. The bracket count is a C-speed scan; only a body with enough brackets to be
that deep pays for the exact check (one serialization).
"""

from __future__ import annotations

from typing import Any

import orjson

from routing.proxy.errors import ProxyError, bad_request

# orjson's write limit (yyjson's recursion limit in orjson): deeper values raise JSONEncodeError.
MAX_DEPTH = 254


def check_nesting(raw: bytes, body: Any) -> None:
    """Raise a 400 ProxyError when `body` (parsed from `raw`) cannot be written back as JSON."""
    if raw.count(b"[") + raw.count(b"{") <= MAX_DEPTH:
        return
    try:
        orjson.dumps(body)
    except orjson.JSONEncodeError:
        raise too_deep() from None


def too_deep() -> ProxyError:
    return bad_request(
        f"The JSON body is nested more than {MAX_DEPTH} levels deep; flatten it.", code="json_too_deep"
    )
